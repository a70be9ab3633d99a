//! # fencelock
//!
//! A distributed lock on Redis (and, with the `etcd` feature, on etcd) with
//! **fencing tokens**. A lease alone cannot
//! stop a worker that paused past its lease (GC, a blocked event loop, a slow
//! call) from writing after someone else took over; a fence checked by the
//! storage can. fencelock gives you both halves:
//!
//! - an atomic grant that sets the lock *and* mints its fence in one script,
//!   ownership-checked release and renewal, background renewal every ttl/3
//!   and a loss signal that fires at once;
//! - fenced writes to a Redis hash ([`FencedHash`]) that refuse stale fences.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fencelock::Error> {
//! use std::time::Duration;
//! use fencelock::LockClient;
//!
//! let client = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let invoice = client.fenced_hash("invoice:42:data")?;
//! let opts = client.options().ttl(Duration::from_secs(10));
//! client
//!     .with_lock("invoice:42", &opts, |lease| async move {
//!         // Every protected write carries the fence; a stale holder is refused.
//!         invoice.write(lease.fence(), lease.token(), "closed").await
//!     })
//!     .await??;
//! # Ok(()) }
//! ```
//!
//! ## Safety rules (never traded for speed)
//!
//! 1. One atomic grant: lock and fence in one script; a retried grant with
//!    the same token returns the same fence.
//! 2. Release and extend compare the stored value first; extend never
//!    re-creates an expired lock.
//! 3. Fences never go backwards for a name in the default [`FenceMode::Clock`]
//!    (`max(last + 1, server time in µs)`), even when Redis loses the fence key.
//!    This assumes the Redis server's clock does not step back by more than
//!    the time between two grants, or by more than [`FENCE_RETENTION`] after
//!    the last grant.
//! 4. The resource decides: a write is accepted iff its fence is greater than
//!    the stored one, or equal and from the same holder token.
//! 5. Validity comes from the local monotonic clock, starting when the grant
//!    was *sent*, minus a drift margin; a grant that arrives too late is
//!    released and reported as [`Error::GrantTooLate`].
//! 6. Loss is loud: [`LeaseHandle::lost`] completes at once, and
//!    [`LockClient::with_lock`] cancels the critical section and returns
//!    [`Error::LockLost`].
//!
//! ## Module map
//!
//! | module | concern |
//! |---|---|
//! | `client` | the façade: [`LockClient`], its builder, `try_acquire` / `acquire` / `with_lock` / `inspect`, resources, stats |
//! | `acquire` | the acquire engine: grant attempts, the wait loop, hand-overs; `retry_delay` and `handover_deadline` as pure functions |
//! | `lease` | the [`Lease`] guard and [`LeaseHandle`]: fence, token, `remaining`, `lost`, `extend`, `release` |
//! | `state` | what a grant gave and the shared lease state: local deadline, loss signal, one renew / one release call |
//! | `renew` | the client's keeper: one task renews all its leases, those due together in one script call per batch, and watches every deadline |
//! | `notify` | the client's waiters and the routing of wake-ups to them (notify and fair modes) |
//! | `wait` | backoff with jitter (poll mode) |
//! | `backend` | everything that talks to Redis: typed calls and replies (`backend::ops`), the data kept in Redis (`backend::wire`), the Lua scripts (`backend/scripts/*.lua`), the connection seam (`backend::conn`), pub/sub |
//! | `options` | [`LockOptions`], [`Renewal`], [`FenceMode`], [`WaitMode`] and their limits |
//! | `keys` | name checks and [`KeyLayout`]: the Redis keys of a lock |
//! | `fence` | the [`Fence`] newtype |
//! | `holder` | the secret token and the public [`holder_id`] |
//! | `resource` | fenced resources: the [`Fenced`] trait, [`fence_accepts`], [`FencedHash`], [`WriteOutcome`] |
//! | `resource::postgres` | feature `postgres`: fenced Postgres rows, `FencedTable`, `SetClause`, `RowKey` (sqlx) |
//! | `resource::etcd_key` | feature `etcd`: `FencedKey`, a fenced key in etcd |
//! | `backend::etcd` | feature `etcd`: the lock on etcd — URL and connection, keys, the grant transaction and the wait, keep-alive and release, `FencedKey`'s transactions |
//! | `error` | [`Error`] and [`LossReason`] |
//! | [`audit`] | the deployment audit ([`LockClient::audit`], `fencelock doctor`): [`audit::Audit`], its [`audit::Check`] rows and their [`audit::Status`] |
//! | [`metrics`] | diagnostics: metric names, the family rule for labels, recording helpers, the [`Stats`] snapshot |
//!
//! Where to find the four things a reader looks for first:
//!
//! - **the grant** (lock and fence in one step): `backend/scripts/grant.lua`,
//!   with fence minting (`mint`) in `backend/scripts/prelude.lua`; its
//!   arguments and reply are `backend::ops::Grant` and `GrantReply`;
//! - **the renewal loop**: `renew::Keeper`, one task per client that renews
//!   the leases due in each tick in batches; the compare-and-pexpire it
//!   sends is `backend/scripts/extend_many.lua` (`extend.lua` for a manual
//!   `extend`);
//! - **the fence rule at the resource**: [`fence_accepts`] states it; it runs
//!   in `backend/scripts/fenced_write.lua` (Redis hash) and as SQL in
//!   `resource::postgres::sql` (`rule_sql`);
//! - **the wait queue**: its Redis side is `enqueue` in `grant.lua` and
//!   `live_head` / `pass_on` in `prelude.lua`; the member format is
//!   `backend::wire::QueueMember`; the waiting loop is `acquire`, and the
//!   wake-up routing `notify`.
//!
//! ## Fenced resources
//!
//! The fence only protects writes that the resource checks. A write is
//! accepted iff its fence is greater than the stored one, or equal and from
//! the same holder token ([`fence_accepts`]); a stale write is
//! [`WriteOutcome::Rejected`], never an error. Ready-made:
//!
//! - [`FencedHash`]: a Redis hash (`value`, `fence`, `holder`), written by one
//!   script.
//! - `FencedTable` (feature `postgres`, on by default in the CLI): rows of a
//!   Postgres table with two added columns, `lock_fence bigint` and
//!   `lock_holder text` (migration SQL and `add_fence_columns` provided);
//!   fenced `update`, `upsert` and `register`, each one statement, run on a
//!   pool, a connection or an open transaction (sqlx's executor argument). A
//!   missing row and a table without the columns are typed errors.
//! - Anything else with a conditional write (an object store's `If-Match`, a
//!   version column, a compare-and-set) implements the [`Fenced`] trait; its
//!   docs show how.
//!
//! For read-modify-write, either compute the new value inside the resource
//! in one conditional statement (`SET v = v + 1`), or register the fence at
//! the resource before reading ([`FencedHash::register`],
//! `FencedTable::register`); otherwise a stale write landing between your
//! read and your write is a lost update.
//!
//! ## Key layouts
//!
//! [`KeyLayout::HashTagged`] (default) uses `lock:{NAME}` and
//! `lock:{NAME}:fence`, Cluster-safe. [`KeyLayout::Guide`] uses `lock:NAME` and
//! `lock:NAME:fence` with the bare token as value, so workers written from the
//! guide in Python exclude fencelock workers on the same names.
//!
//! ## Waiting
//!
//! [`WaitMode::Notify`] (default): waiters queue and a release wakes the head
//! through one pub/sub connection per client; once the head has waited 10 ms,
//! the release hands the lock over to it instead, so barging workers cannot
//! starve it. [`WaitMode::Fair`]: the release
//! hands the lock (with a freshly minted fence) straight to the head of the
//! queue, first come first served. [`WaitMode::Poll`]: backoff with jitter,
//! no queue. Every mode also retries when the holder's lease runs out, so a
//! lost message or a crashed holder never stalls a waiter.
//!
//! ## etcd
//!
//! With the `etcd` feature, `LockClient::connect("etcd://host:2379,…")`
//! (`etcds://` for TLS) gives the same API on etcd: `acquire`,
//! `try_acquire`, `with_lock`, [`Lease`], the loss signal, metrics and
//! stats. What differs:
//!
//! - **Mutual exclusion survives failures**: etcd commits every grant to a
//!   majority of its members (Raft) before answering; no failover loses a
//!   granted lock.
//! - **A lease per holder**, kept alive at ttl/3 by the same keeper task;
//!   etcd leases count whole seconds (the ttl is rounded up, and etcd may
//!   raise it to its shortest lease, 1.5 election timeouts): the local
//!   deadline stays the ttl, etcd's expiry can only be later.
//! - **The fence is the holder key's create revision** (in fence epoch 1:
//!   2^53 + revision, see [`LockOptions::fence_epoch`]). Revisions grow
//!   with every write cluster-wide and survive leader changes. Not the
//!   response-header revision that `etcdctl lock` exports as
//!   `ETCD_LOCK_REV`: the two must not be mixed. A snapshot restore rewinds
//!   revisions unless it is done with `etcdutl snapshot restore
//!   --bump-revision … --mark-compacted`; raise the fence epoch after
//!   restoring without.
//! - **Waiting** watches the key just ahead in the queue: first come, first
//!   served, whatever the [`WaitMode`]; no polling.
//! - **Release** deletes the holder's key and revokes its lease.
//! - Resources: every resource takes etcd fences; `FencedKey` keeps state
//!   in etcd and can check in the same transaction that the writer still
//!   holds its lock (`FencedKey::write_held`).
//! - Not on etcd: the guide layout, fence modes (ignored), waiting for
//!   replicas, fenced hashes on the etcd client (use a Redis client).
//!
//! The protocol, step by step, is in `backend/etcd/mod.rs`.
//!
//! ## Diagnostics
//!
//! Acquisitions, renewals, losses, releases and fenced writes are counted
//! through the [`metrics`](https://docs.rs/metrics) facade (install any
//! exporter; nothing is installed by the library) with bounded labels (the
//! lock's *family*, see [`metrics::family`]), and per family in the client's
//! [`LockClient::stats`] snapshot. `tracing` spans (debug) cover acquire,
//! renew, release and fenced writes; a lost lease, a stale write and a
//! renewal task that woke later than a third of the ttl are `warn` events.
//!
//! ## Dropping a lease
//!
//! Dropping a [`Lease`] without [`Lease::release`] stops its renewal at once
//! and sends a best-effort release when a tokio runtime is running;
//! otherwise the lock expires after its ttl. It never panics.

// The async state machines of a grant nest deeply (acquire → grant → a
// pipelined call → following a Sentinel failover); computing their layout
// needs more than the default query depth.
#![recursion_limit = "256"]

mod acquire;
pub mod audit;
mod backend;
mod client;
mod error;
mod fence;
mod holder;
mod keys;
mod lease;
pub mod metrics;
mod notify;
mod options;
mod renew;
mod resource;
mod state;
mod wait;

pub use backend::{redact as redact_url, redact_url_in};
pub use client::{DEFAULT_PREFIX, LockClient, LockClientBuilder, LockState, MAX_PREFIX_LEN};
pub use error::{DriverError, Error, LossReason, Result, Retry};
pub use fence::Fence;
pub use holder::holder_id;
pub use keys::{KeyLayout, LockKeys, MAX_NAME_LEN};
pub use lease::{Lease, LeaseHandle, ReleaseOutcome};
pub use metrics::{LockStats, ResourceStats, Stats, StatsHandle};
pub use options::{
    DEFAULT_WAITER_LEASE, ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, FENCE_RETENTION, FenceMode,
    LockOptions, MAX_FENCE_EPOCH, MAX_TTL, MIN_TTL, NOTIFY_HANDOVER_LEASE, Renewal, Replication,
    STARVATION_THRESHOLD, WaitMode,
};
#[cfg(feature = "postgres")]
pub use resource::postgres::{
    FENCE_COLUMN, FencedRow, FencedTable, HOLDER_COLUMN, RowFence, RowKey, SetClause,
};
pub use resource::{Fenced, FencedHash, HashState, WriteOutcome, fence_accepts};
#[cfg(feature = "etcd")]
pub use resource::{FencedKey, KeyState};
/// The sqlx version fencelock's Postgres resource is built on (feature
/// `postgres`), so a `PgPool` from it always fits [`FencedTable::new`].
#[cfg(feature = "postgres")]
pub use sqlx;

/// Internals for tests and benchmarks that read or write Redis directly
/// (feature `testing`; not a stable API): the data fencelock keeps in Redis —
/// lock values, the wait queue's members, wake-up messages — encoded and
/// decoded exactly as the library does, and raw script calls.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::backend::wire::*;

    /// The grant script call that [`LockClient::try_acquire`](crate::LockClient::try_acquire) makes for
    /// `keys`, `token` and `opts`, to run on any connection.
    pub fn grant_invocation(
        keys: &crate::LockKeys,
        token: &str,
        opts: &crate::LockOptions,
    ) -> redis::ScriptInvocation<'static> {
        crate::backend::invocation(&crate::backend::ops::Grant {
            keys,
            mint: crate::backend::ops::Mint::new(opts),
            token,
            ttl: opts.ttl,
            wait_mode: opts.wait_mode,
            member: None,
            waiter_lease: opts.waiter_lease,
            queued: false,
        })
    }

    pub use crate::backend::BatchFault;

    /// How many grant (or release) calls of one client, of one Cluster
    /// slot, go to Redis at once before further ones queue and are batched:
    /// a test that wants a batch first holds this many calls inside Redis.
    pub const BATCH_IN_FLIGHT: usize = crate::backend::IN_FLIGHT;

    /// Makes `client`'s batched grants run a deliberately broken script
    /// (`None`: the real one again): the negative controls of the tests
    /// of batched grants. A Redis client only.
    pub fn break_batched_grants(client: &crate::LockClient, fault: Option<BatchFault>) {
        if let Ok(conn) = client.backend().redis() {
            conn.break_batched_grants(fault);
        }
    }

    /// The script call one keeper tick makes to renew a batch of leases
    /// (`(lock key, exact lock value)` each) to `ttl`, to run on any
    /// connection. It replies with the leases it did not renew, as pairs
    /// (1-based index, 0 absent or -1 another value): empty when all were.
    pub fn renewal_batch_invocation(
        leases: &[(&str, &str)],
        ttl: std::time::Duration,
    ) -> redis::ScriptInvocation<'static> {
        crate::backend::invocation(&crate::backend::ops::ExtendMany { leases, ttl })
    }

    /// The script call a lease's own `extend` makes, to run on any
    /// connection.
    pub fn extend_invocation(
        key: &str,
        value: &str,
        ttl: std::time::Duration,
    ) -> redis::ScriptInvocation<'static> {
        crate::backend::invocation(&crate::backend::ops::Extend { key, value, ttl })
    }

    /// The etcd grant transaction for lock `name` and the existing lease
    /// `lease`, on an etcd `client` (feature `etcd`), as an acquisition
    /// sends it (and sends it again when its reply was lost): creates the
    /// lease's key unless it exists. Returns the key's create revision and
    /// how many keys the lock has.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] for a Redis client; etcd errors.
    #[cfg(feature = "etcd")]
    pub async fn etcd_grant_txn(
        client: &crate::LockClient,
        name: &str,
        lease: i64,
    ) -> crate::Result<(i64, usize)> {
        let Some(conn) = client.backend().etcd() else {
            return Err(crate::Error::InvalidOption("not an etcd client".into()));
        };
        crate::backend::etcd::grant_txn(conn, client.prefix(), name, lease).await
    }

    /// Deletes every etcd key under the `client`'s namespace and prefix
    /// (feature `etcd`): what a run that made up its own prefix leaves
    /// behind (holder and waiter keys whose leases have not expired yet).
    /// Returns how many keys were deleted.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] for a Redis client, or an empty
    /// namespace and prefix (that would be every key); etcd errors.
    #[cfg(feature = "etcd")]
    pub async fn etcd_delete_prefix(client: &crate::LockClient) -> crate::Result<i64> {
        let Some(conn) = client.backend().etcd() else {
            return Err(crate::Error::InvalidOption("not an etcd client".into()));
        };
        let prefix = format!("{}{}", conn.namespace(), client.prefix());
        if prefix.is_empty() {
            return Err(crate::Error::InvalidOption(
                "refusing to delete every key: the client has no namespace or prefix".into(),
            ));
        }
        conn.delete_prefix(&prefix)
            .await
            .map(|r| r.deleted())
            .map_err(|e| conn.error(e, "deleting the keys under the prefix"))
    }
}

/// The README's examples, compiled as doc-tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
