//! The backend: everything that talks to the store holding the locks.
//!
//! The lock engine (`acquire`, `lease`, `renew`, `notify`) and the resources
//! reach the store only through this module, and only through typed calls:
//!
//! | module | concern |
//! |---|---|
//! | `ops` | the operations as typed calls and replies (`Grant`, `Release`, `Extend`, `Leave`, `Inspect`, `FencedWrite`): the one place where a script's arguments are encoded and its reply decoded |
//! | `wire` | the data kept in Redis: lock value, queue member, wake-up payload |
//! | `scripts` | the Lua scripts, one per operation (`scripts/*.lua`), grant, release and leave sharing `prelude.lua` |
//! | `target` | the one URL for every topology (`redis://`, `rediss://`, `unix://`, `redis+sentinel://`, `redis+cluster://`), parsed |
//! | `conn` | [`RedisConn`], the connection seam: one variant per kind of deployment (one server, Sentinel, Cluster), script calls by SHA with `NOSCRIPT` reload, error mapping |
//! | `sentinel` | the master found through Sentinel, followed across failovers |
//! | `tls` | the CA and client certificate of `rediss` URLs; what a failed handshake means |
//! | `pubsub` | [`PubSub`], the pub/sub connection behind wake-ups |
//! | `audit` | what the deployment reports about itself (`INFO` fields, the memory policy): the check at connect, and the deployment audit (`crate::audit`) |
//! | `errors` | server errors as typed errors that name the one key, command or setting in the way |
//! | `url` | URLs without their credentials |
//!
//! [`Backend`] is where a second kind of store (etcd) plugs in: the engine
//! runs every lock operation through [`Backend::run`], which a Redis backend
//! runs as a script call.

mod audit;
mod conn;
mod errors;
pub(crate) mod ops;
mod pubsub;
mod scripts;
mod sentinel;
mod target;
mod tls;
mod url;
pub(crate) mod wire;

pub(crate) use audit::{info_field, memory_policy};
#[cfg(feature = "testing")]
pub(crate) use conn::invocation;
pub(crate) use conn::{ConnSettings, Node, RedisConn, Topology};
pub(crate) use errors::without_script_internals;
pub(crate) use pubsub::{Event, PubSub};
pub use url::{redact, redact_url_in};

use crate::error::Result;
use ops::{Publish, ScriptCall};

/// The store that holds the locks.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// Redis: the operations are Lua scripts.
    Redis(RedisConn),
}

impl Backend {
    /// Connects to the store `url` names.
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        Ok(Backend::Redis(RedisConn::connect(url, settings).await?))
    }

    /// Runs one lock operation.
    pub(crate) async fn run<C: ScriptCall>(&self, call: &C) -> Result<C::Reply> {
        match self {
            Backend::Redis(conn) => conn.run(call).await,
        }
    }

    /// How this store publishes wake-ups.
    pub(crate) fn publish(&self) -> Publish {
        match self {
            Backend::Redis(conn) => conn.publish(),
        }
    }

    /// The URL, without its password.
    pub(crate) fn url(&self) -> &str {
        match self {
            Backend::Redis(conn) => conn.url(),
        }
    }

    /// Opens the connection that delivers wake-ups to `on_event`.
    pub(crate) async fn pubsub(
        &self,
        on_event: impl Fn(Event) + Send + Sync + 'static,
    ) -> Result<PubSub> {
        match self {
            Backend::Redis(conn) => PubSub::connect(conn, on_event).await,
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
        }
    }

    /// Which calls on `key` may run together in one script: keys with the
    /// same group share a Cluster slot (every key does on one server).
    pub(crate) fn batch_group(&self, key: &str) -> Option<redis::cluster_routing::Slot> {
        match self {
            Backend::Redis(conn) => conn.batch_group(key),
        }
    }

    /// Whether the store is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            Backend::Redis(conn) => conn.topology() == Topology::Cluster,
        }
    }

    /// The Redis connection, for resources kept in Redis.
    pub(crate) fn redis(&self) -> &RedisConn {
        match self {
            Backend::Redis(conn) => conn,
        }
    }
}
