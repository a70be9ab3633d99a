//! The engine: the protocol's decisions, and the one place that knows which
//! kind of store a client talks to.
//!
//! [`Engine`] has a variant per kind of store, and every operation of a
//! lock — grant, wait, hand-over, renew, release, inspect — is one method
//! here that matches on it and runs that store's recipe: `redis` (the
//! recipe on Redis: grant attempts, the wait queue and its wake-ups,
//! hand-overs) and `etcd` (etcd's lock recipe with fences), side by side.
//! Every client-side policy lives in the engine: how long to wait and how
//! to back off, whether a hand-over is trusted, when a grant came too late
//! (`timing`, pure functions). The store below it (`crate::store`) only
//! does I/O.
//!
//! The engine hands out grants ([`Acquired`]), never leases: the lease
//! layer (`crate::lease`) turns a grant into a `Lease` and renews and
//! releases it through [`Engine::extend`], [`Engine::renew_many`] and
//! [`Engine::release`].
//!
//! **The seam for new primitives.** What a grant holds in the store is a
//! [`Hold`](grant::Hold); a new primitive adds a `Hold` variant, its store
//! calls, and its arms in `extend`, `release` and `renew_many`. The lease
//! layer, the keeper and the client façade do not change. The fenced
//! semaphore is one: a grant of [`LockOptions::permits`] holds one slot
//! (`Hold::RedisPermit` on Redis; on etcd the holder's key and its slot),
//! and the wait loop, the keeper and the lease are the mutex's. The fenced
//! read-write lock ([`LockOptions::access`]) is another: on Redis a reader
//! or the writer is a permit of the name's hash too (`Hold::RedisPermit`
//! with the writer's or a reader's field), on etcd its own key.
//!
//! | module | concern |
//! |---|---|
//! | `grant` | what a grant gave ([`Granted`], [`Hold`](grant::Hold)) and what an acquisition hands out ([`Acquired`]) |
//! | `timing` | the decisions about time, as pure functions: drift margin, retry delay, hand-over deadline and trust, too-late grants |
//! | `backoff` | backoff with jitter (poll mode) |
//! | `cleanup` | [`Cleanups`](cleanup::Cleanups): the clean-ups of dropped acquisitions and leases, run in the background, and the wait for them |
//! | `inspect` | [`LockState`], what `inspect` tells |
//! | `revoke` | [`Revocation`], what a revoke did in the store, and the holder it [`Deposed`] |
//! | `redis` | the recipe on Redis: `redis/acquire.rs` (attempts, the wait loop, hand-overs), `redis/permit.rs` (a permit's attempt: a semaphore's slot, a read-write lock's side), `redis/wakeups.rs` (the waiters' wake-ups), `redis/mod.rs` (renew, release, inspect) |
//! | `etcd` | the recipe on etcd (feature `etcd`): `etcd/acquire.rs` (the lease, the grant, the wait for the predecessor), `etcd/semaphore.rs` (a permit: its slot, the queue across permits), `etcd/rwlock.rs` (a reader or the writer: the keys in its way, the wait for their deletion), `etcd/mod.rs` (renew, release, inspect) |

pub(crate) mod backoff;
pub(crate) mod cleanup;
#[cfg(feature = "etcd")]
mod etcd;
pub(crate) mod grant;
mod inspect;
mod redis;
mod revoke;
pub(crate) mod timing;

use std::time::Duration;

use crate::audit::Audit;
use crate::error::{Error, Result};
use crate::keys::{KeyLayout, LockKeys};
use crate::metrics::in_span;
use crate::options::LockOptions;
use crate::store::redis::{BatchGroup, RedisConn};
use crate::store::{Checked, ConnSettings};

pub(crate) use grant::{Acquired, Granted};
pub use revoke::Deposed;
pub(crate) use revoke::Revocation;

/// Who hears why a waiting acquisition's attempts failed while its wait
/// goes on (see `LockClient::acquire_reporting`).
pub(crate) type Waiting<'a> = Option<&'a (dyn Fn(&Error) + Send + Sync)>;
pub use inspect::{LockState, PermitHolder, RwHolder};

/// The engine of one client: one variant per kind of store.
// The etcd side is one pointer; the Redis one is not boxed, to keep every
// Redis call free of an indirection (one engine per client).
#[cfg_attr(feature = "etcd", allow(clippy::large_enum_variant))]
#[derive(Debug)]
pub(crate) enum Engine {
    /// Redis: the operations are Lua scripts.
    Redis(redis::RedisEngine),
    /// etcd: leases, transactions and watches (feature `etcd`).
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdEngine),
}

impl Engine {
    /// Connects to the store `url` names.
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        if crate::store::is_etcd_url(url) {
            #[cfg(feature = "etcd")]
            return Ok(Engine::Etcd(etcd::EtcdEngine::new(
                crate::store::etcd::EtcdConn::connect(url, settings).await?,
            )));
            #[cfg(not(feature = "etcd"))]
            return Err(Error::InvalidOption(format!(
                "{} is an etcd URL, but this build of fencelock has no etcd support: enable the `etcd` feature of the fencelock crate",
                crate::store::redact(url)
            )));
        }
        Ok(Engine::Redis(redis::RedisEngine::new(
            RedisConn::connect(url, settings).await?,
        )))
    }

    /// The kind of store: `"redis"` or `"etcd"`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Engine::Redis(_) => "redis",
            #[cfg(feature = "etcd")]
            Engine::Etcd(_) => "etcd",
        }
    }

    /// The clean-ups this client runs in the background (dropped leases,
    /// dropped etcd acquisitions).
    pub(crate) fn cleanups(&self) -> &cleanup::Cleanups {
        match self {
            Engine::Redis(r) => &r.cleanups,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => &e.cleanups,
        }
    }

    /// Checks that the lock prefix can be used on this store: on etcd, it
    /// and the URL's namespace must join without ambiguity (see
    /// `store::etcd::check_key_space`).
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    pub(crate) fn check_prefix(&self, prefix: &str) -> Result<()> {
        match self {
            Engine::Redis(_) => Ok(()),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => crate::store::etcd::check_key_space(e.conn.namespace(), prefix),
        }
    }

    /// The URL, without its password.
    pub(crate) fn url(&self) -> &str {
        match self {
            Engine::Redis(r) => r.conn.url(),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.conn.url(),
        }
    }

    /// The Redis connection, for what lives in Redis (fenced hashes).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] on etcd, naming what needs Redis.
    pub(crate) fn redis(&self) -> Result<&RedisConn> {
        match self {
            Engine::Redis(r) => Ok(&r.conn),
            #[cfg(feature = "etcd")]
            Engine::Etcd(_) => Err(Error::InvalidOption(
                "this operation needs Redis, but this client is connected to etcd (on etcd, use FencedKey for fenced state, and a separate Redis client for fenced hashes)".into(),
            )),
        }
    }

    /// The Redis side of the engine (feature `testing`: the negative
    /// controls reach its batches).
    #[cfg(feature = "testing")]
    pub(crate) fn redis_engine(&self) -> Option<&redis::RedisEngine> {
        match self {
            Engine::Redis(r) => Some(r),
            #[cfg(feature = "etcd")]
            Engine::Etcd(_) => None,
        }
    }

    /// The etcd connection, if the store is etcd.
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd(&self) -> Option<&crate::store::etcd::EtcdConn> {
        match self {
            Engine::Etcd(e) => Some(&e.conn),
            Engine::Redis(_) => None,
        }
    }

    /// The keys of lock `name` under `prefix` in `layout` (on etcd, the
    /// prefix of its keys; see `LockClient::keys`).
    pub(crate) fn keys(&self, prefix: &str, name: &str, layout: KeyLayout) -> Result<LockKeys> {
        match self {
            Engine::Redis(_) => LockKeys::new(prefix, layout, name),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.keys(prefix, name),
        }
    }

    /// The keys of lock `name` for a call on this deployment: a layout the
    /// deployment cannot hold is refused.
    pub(crate) fn lock_keys(
        &self,
        prefix: &str,
        name: &str,
        layout: KeyLayout,
    ) -> Result<LockKeys> {
        match self {
            Engine::Redis(r) => r.lock_keys(prefix, name, layout),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.lock_keys(prefix, name, layout),
        }
    }

    /// One grant attempt for lock `name` (`try_acquire`).
    pub(crate) async fn try_acquire(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
    ) -> Result<Acquired> {
        match self {
            Engine::Redis(r) => r.try_acquire(name, keys, opts).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.acquire(name, keys, opts, false).await,
        }
    }

    /// Attempts until the options' wait deadline (`acquire`); `waiting`
    /// hears why an attempt the wait goes on from failed (on Redis; an etcd
    /// waiter watches its predecessor and has no failed attempts to tell).
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
        waiting: Waiting<'_>,
    ) -> Result<Acquired> {
        match self {
            Engine::Redis(r) => r.acquire(name, keys, opts, waiting).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.acquire(name, keys, opts, true).await,
        }
    }

    /// One renewal of `granted` to its ttl (compare-and-pexpire; on etcd a
    /// keep-alive of its lease and a read of its key).
    pub(crate) async fn extend(&self, granted: &Granted) -> Result<Checked> {
        let span = tracing::debug_span!("renew", lock = %granted.name, fence = %granted.fence);
        match self {
            Engine::Redis(r) => in_span!(span, r.extend(granted)),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => in_span!(span, e.extend(granted)),
        }
    }

    /// Renews a batch of leases of one ttl and one [`BatchGroup`]: on Redis
    /// one compare-and-pexpire script call for all; on etcd one keep-alive
    /// per session and a read of each holder's key, all sent at once. One code per lease, in order;
    /// an error fails the batch (each lease retries).
    pub(crate) async fn renew_many(
        &self,
        leases: &[&Granted],
        ttl: Duration,
    ) -> Result<Vec<Checked>> {
        match self {
            Engine::Redis(r) => r.renew_many(leases, ttl).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.renew_many(leases).await,
        }
    }

    /// Which renewals may travel with `granted`'s in one call.
    pub(crate) fn batch_group(&self, granted: &Granted) -> BatchGroup {
        match self {
            Engine::Redis(r) => r.batch_group(granted),
            #[cfg(feature = "etcd")]
            Engine::Etcd(_) => None,
        }
    }

    /// `granted` was declared lost because its local deadline passed: on
    /// etcd its key may outlive it on the client's session, which the
    /// client's other locks keep alive, so it is deleted in the background
    /// (on Redis the key expires by itself).
    #[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
    pub(crate) fn deadline_passed(&self, granted: &Granted) {
        match self {
            Engine::Redis(_) => {}
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.deadline_passed(granted),
        }
    }

    /// Releases `granted` if it is still its holder's (compare-and-delete,
    /// which passes the lock on to a waiter; on etcd a delete of the
    /// holder's key if it still has the holder's create revision).
    pub(crate) async fn release(&self, granted: &Granted) -> Result<Checked> {
        let span = tracing::debug_span!("release", lock = %granted.name, fence = %granted.fence, outcome = tracing::field::Empty);
        let reply = match self {
            Engine::Redis(r) => in_span!(span, r.release(granted)),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => in_span!(span, e.release(granted)),
        }?;
        span.record(
            "outcome",
            if reply == Checked::Done {
                "released"
            } else {
                "not_ours"
            },
        );
        Ok(reply)
    }

    /// Takes lock `name` away from whoever holds it (no token needed):
    /// deposes the holder (a read-write lock's writer or all its readers),
    /// passes the lock on to the head waiter, and
    /// returns the revocation fence (see [`Revocation`]). On Redis one
    /// script; on etcd one transaction that deletes the holder's key.
    pub(crate) async fn revoke(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
    ) -> Result<Revocation> {
        if opts.permits.is_some() {
            return Err(Error::InvalidOption(
                "revoke takes a mutex or a read-write lock: a semaphore's permits cannot be revoked".into(),
            ));
        }
        let span = tracing::debug_span!("revoke", lock = %name);
        match self {
            Engine::Redis(r) => in_span!(span, r.revoke(name, keys, opts)),
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => in_span!(span, e.revoke(name, keys, opts)),
        }
    }

    /// The state of lock `keys`, fences in the epoch of `defaults`.
    pub(crate) async fn inspect(
        &self,
        keys: &LockKeys,
        layout: KeyLayout,
        defaults: &LockOptions,
    ) -> Result<LockState> {
        match self {
            Engine::Redis(r) => r.inspect(keys, layout, defaults).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.inspect(keys, defaults).await,
        }
    }

    /// How many waiters are queued for lock `keys`.
    pub(crate) async fn waiters(&self, keys: &LockKeys) -> Result<u64> {
        match self {
            Engine::Redis(r) => r.waiters(keys).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.waiters(keys).await,
        }
    }

    /// The names of the held locks under `prefix` matching the glob
    /// `pattern`, sorted.
    pub(crate) async fn lock_names(
        &self,
        prefix: &str,
        pattern: &str,
        layout: KeyLayout,
    ) -> Result<Vec<String>> {
        match self {
            Engine::Redis(r) => r.lock_names(prefix, pattern, layout).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => e.lock_names(prefix, pattern).await,
        }
    }

    /// The deployment audit (see `crate::audit`).
    pub(crate) async fn audit(&self, prefix: &str, defaults: &LockOptions) -> Result<Audit> {
        match self {
            Engine::Redis(r) => crate::audit::redis(&r.conn, prefix, defaults).await,
            #[cfg(feature = "etcd")]
            Engine::Etcd(e) => crate::audit::etcd(&e.conn, defaults).await,
        }
    }
}
