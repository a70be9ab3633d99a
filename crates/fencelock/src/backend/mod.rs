//! The backend: everything that talks to the store holding the locks.
//!
//! The lock engine (`acquire`, `lease`, `renew`, `notify`) and the resources
//! reach the store only through this module, and only through typed calls:
//!
//! | module | concern |
//! |---|---|
//! | `ops` | the operations as typed calls and replies (`Grant`, `Release`, `Extend`, `Leave`, `Inspect`, `FencedWrite`, and the batches `GrantMany`, `ReleaseMany`, `ExtendMany`): the one place where a script's arguments are encoded and its reply decoded |
//! | `wire` | the data kept in Redis: lock value, queue member, wake-up payload |
//! | `scripts` | the Lua scripts, one per operation (`scripts/*.lua`), grant, release and leave sharing `prelude.lua`; `grant_many.lua` and `release_many.lua` for batches |
//! | `coalesce` | the concurrent grants and releases of one client (of one Cluster slot) sent as one batch call while `IN_FLIGHT` others are in flight; a call with room goes alone at once |
//! | `target` | the one URL for every topology (`redis://`, `rediss://`, `unix://`, `redis+sentinel://`, `redis+cluster://`), parsed |
//! | `conn` | [`RedisConn`], the connection seam: one variant per kind of deployment (one server, Sentinel, Cluster), script calls by SHA with `NOSCRIPT` reload, error mapping |
//! | `sentinel` | the master found through Sentinel, followed across failovers |
//! | `tls` | the CA and client certificate of `rediss` URLs; what a failed handshake means |
//! | `pubsub` | [`PubSub`], the pub/sub connection behind wake-ups |
//! | `audit` | what the deployment reports about itself (`INFO` fields, the memory policy): the check at connect, and the deployment audit (`crate::audit`) |
//! | `errors` | server errors as typed errors that name the one key, command or setting in the way |
//! | `url` | URLs without their credentials |
//!
//! [`Backend`] is where a second kind of store plugs in: the engine runs
//! every Redis lock operation through [`Backend::run`], a script call. The
//! etcd backend (`etcd`, feature `etcd`) has its own grant and wait
//! (`etcd::acquire`, called by the engine for an etcd client), and the lease
//! state renews and releases through it (`EtcdConn::keep_alive`,
//! `EtcdConn::release`); what needs Redis itself (scripts, pub/sub, fenced
//! hashes) refuses an etcd client with an error that says so.

mod audit;
mod coalesce;
mod conn;
mod errors;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod ops;
mod pubsub;
mod scripts;
mod sentinel;
mod target;
pub(crate) mod tls;
pub(crate) mod url;
pub(crate) mod wire;

pub(crate) use audit::{info_field, memory_policy};
#[cfg(feature = "testing")]
pub use coalesce::BatchFault;
#[cfg(feature = "testing")]
pub(crate) use coalesce::IN_FLIGHT;
#[cfg(feature = "testing")]
#[cfg(feature = "testing")]
pub(crate) use conn::invocation;
pub(crate) use conn::{ConnSettings, Node, RedisConn, Topology};
pub(crate) use pubsub::{Event, PubSub};
pub use url::{redact, redact_url_in};

use crate::error::{Error, Result};
use ops::{Publish, ScriptCall};

/// The store that holds the locks.
// The etcd connection is one pointer; the Redis one is not boxed, to keep
// every Redis call free of an indirection (one backend per client, cloned
// per lease).
#[cfg_attr(feature = "etcd", allow(clippy::large_enum_variant))]
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// Redis: the operations are Lua scripts.
    Redis(RedisConn),
    /// etcd: leases, transactions and watches (feature `etcd`).
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdConn),
}

/// Whether `url` names an etcd cluster (`etcd://`, `etcds://`).
pub(crate) fn is_etcd_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("etcd://") || lower.starts_with("etcds://")
}

impl Backend {
    /// Connects to the store `url` names.
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        if is_etcd_url(url) {
            #[cfg(feature = "etcd")]
            return Ok(Backend::Etcd(etcd::EtcdConn::connect(url, settings).await?));
            #[cfg(not(feature = "etcd"))]
            return Err(Error::InvalidOption(format!(
                "{} is an etcd URL, but this build of fencelock has no etcd support: enable the `etcd` feature of the fencelock crate",
                redact(url)
            )));
        }
        Ok(Backend::Redis(RedisConn::connect(url, settings).await?))
    }

    /// Runs one Redis lock operation (the engine never sends one to etcd).
    pub(crate) async fn run<C: ScriptCall>(&self, call: &C) -> Result<C::Reply> {
        match self {
            Backend::Redis(conn) => conn.run(call).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Err(needs_redis("a Redis script")),
        }
    }

    /// One grant attempt (batched with the client's concurrent ones when it
    /// can be; see `coalesce`).
    pub(crate) async fn grant(&self, call: &ops::Grant<'_>) -> Result<ops::GrantReply> {
        match self {
            Backend::Redis(conn) => conn.grant(call).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Err(needs_redis("a Redis script")),
        }
    }

    /// One release (batched with the client's concurrent ones; see
    /// `coalesce`).
    pub(crate) async fn release(&self, call: &ops::Release<'_>) -> Result<ops::Checked> {
        match self {
            Backend::Redis(conn) => conn.release(call).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Err(needs_redis("a Redis script")),
        }
    }

    /// How this store publishes wake-ups.
    pub(crate) fn publish(&self) -> Publish {
        match self {
            Backend::Redis(conn) => conn.publish(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Publish::Publish,
        }
    }

    /// The URL, without its password.
    pub(crate) fn url(&self) -> &str {
        match self {
            Backend::Redis(conn) => conn.url(),
            #[cfg(feature = "etcd")]
            Backend::Etcd(conn) => conn.url(),
        }
    }

    /// Opens the connection that delivers wake-ups to `on_event`.
    pub(crate) async fn pubsub(
        &self,
        on_event: impl Fn(Event) + Send + Sync + 'static,
    ) -> Result<PubSub> {
        match self {
            Backend::Redis(conn) => PubSub::connect(conn, on_event).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Err(needs_redis("pub/sub wake-ups")),
        }
    }

    /// Runs one lock operation and waits until `replicas` replicas
    /// acknowledged its writes (for at most `timeout`); returns the reply
    /// and how many did.
    pub(crate) async fn run_replicated<C: ScriptCall>(
        &self,
        call: &C,
        replicas: u32,
        timeout: std::time::Duration,
    ) -> Result<(C::Reply, u32)> {
        match self {
            Backend::Redis(conn) => conn.run_replicated(call, replicas, timeout).await,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Err(needs_redis(
                "waiting for replicas (etcd commits every grant to a majority)",
            )),
        }
    }

    /// Which calls on `key` may run together in one script: keys with the
    /// same group share a Cluster slot (every key does on one server).
    pub(crate) fn batch_group(&self, key: &str) -> Option<redis::cluster_routing::Slot> {
        match self {
            Backend::Redis(conn) => conn.batch_group(key),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => None,
        }
    }

    /// Renews a batch of leases of one ttl (one [`Backend::batch_group`]):
    /// on Redis one compare-and-pexpire script call for all; on etcd one
    /// keep-alive per holder's lease, all sent at once. One code per lease,
    /// in order; an error fails the batch (each lease retries).
    pub(crate) async fn renew_many(
        &self,
        leases: &[&crate::state::Granted],
        ttl: std::time::Duration,
    ) -> Result<Vec<ops::Checked>> {
        match self {
            Backend::Redis(conn) => {
                let leases: Vec<(&str, &str)> = leases
                    .iter()
                    .map(|g| (g.lock.as_str(), g.value.as_str()))
                    .collect();
                conn.run(&ops::ExtendMany {
                    leases: &leases,
                    ttl,
                })
                .await?
                .per_lease(leases.len())
                .map_err(|e| Error::UnexpectedReply(e.to_string()))
            }
            #[cfg(feature = "etcd")]
            Backend::Etcd(conn) => {
                futures_util::future::join_all(leases.iter().map(|g| conn.keep_alive(g)))
                    .await
                    .into_iter()
                    .collect()
            }
        }
    }

    /// Whether the store is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            Backend::Redis(conn) => conn.topology() == Topology::Cluster,
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => false,
        }
    }

    /// The Redis connection, for what lives in Redis (fenced hashes, scans,
    /// the Redis audit).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] on etcd, naming what needs Redis.
    pub(crate) fn redis(&self) -> Result<&RedisConn> {
        match self {
            Backend::Redis(conn) => Ok(conn),
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => Err(needs_redis("this operation")),
        }
    }

    /// The etcd connection, if the store is etcd.
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd(&self) -> Option<&etcd::EtcdConn> {
        match self {
            Backend::Etcd(conn) => Some(conn),
            Backend::Redis(_) => None,
        }
    }
}

/// The error for `what`, which exists only on Redis, asked of an etcd client.
#[cfg(feature = "etcd")]
fn needs_redis(what: &str) -> Error {
    Error::InvalidOption(format!(
        "{what} needs Redis, but this client is connected to etcd (on etcd, use FencedKey for fenced state, and a separate Redis client for fenced hashes)"
    ))
}
