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
//! ## Semaphores
//!
//! [`LockOptions::permits`] makes an acquisition one of N permits of a
//! fenced semaphore: up to N holders at once, each in its own slot
//! ([`LeaseHandle::slot`]) with a fence from the name's one counter.
//! Resources fence permits per slot ([`FencedHash::slot`], `FencedKey::slot`,
//! a row per slot in Postgres): a stale holder of a slot is refused, two
//! live permits of different slots never refuse each other. A name is one
//! kind while held ([`Error::KindConflict`], [`Error::PermitsConflict`]).
//!
//! ## Read-write locks
//!
//! [`LockClient::rwlock`] gives a fenced read-write lock: readers share the
//! name, a writer holds it alone and is fenced like a mutex. A reader's
//! fence is the write epoch it saw; a read validated against it
//! ([`FencedHash::read_validated`], `FencedKey::read_validated`,
//! `FencedTable::read_validated`) says whether a writer granted after the
//! reader had written ([`ValidatedRead::Torn`]). Fair mode queues readers
//! and writers in one order.
//!
//! ## Module map
//!
//! Three layers, knowledge pointing one way — `client` → `resource` →
//! `lease` → `engine` → `audit` → `store` → the foundation — and no import
//! circle between files (`fencelock-checks` enforces both):
//!
//! | module | layer | concern |
//! |---|---|---|
//! | `client` | façade | [`LockClient`], its builder, `try_acquire` / `acquire` / `with_lock` / `revoke` / `inspect`, resources, stats: checks input and delegates, never matches on the kind of store |
//! | `rwlock` | façade | [`LockClient::rwlock`] and [`RwLock`]: a fenced read-write lock's `read` / `write` / `with_read` / `with_write`, shorthand for [`LockOptions::access`] |
//! | `resource` | resources | fenced resources: the [`Fenced`] trait, [`fence_accepts`], [`FencedHash`] (and its per-slot views, [`FencedHash::slot`]), [`WriteOutcome`]; a reader's validated reads ([`ValidatedRead`], [`read_is_clean`], each resource's `read_validated`); a revoke's seals (`resource/seal.rs`: [`Sealable`], [`Revoked`]); `resource::postgres` (feature `postgres`: `FencedTable`, `SetClause`, `RowKey`, sqlx) and `resource::etcd_key` (feature `etcd`: `FencedKey` and `FencedKey::slot`) |
//! | `lease` | lease | what a holder has and keeps, for every store and primitive (a mutex's lease or a semaphore's permit): the [`Lease`] guard and [`LeaseHandle`] (`lease/guard.rs`), the shared state with its deadline and loss signal (`lease/state.rs`), the client's keeper that renews every lease in batches (`lease/keeper.rs`) |
//! | `engine` | engine | the protocol's decisions and the one place that matches on the kind of store: grant, wait, hand-over, renew, release, inspect. `engine/redis/` (`acquire.rs`: attempts, the wait loop, hand-overs; `wakeups.rs`: the waiters' wake-ups; `mod.rs`: renew, release, inspect) and `engine/etcd/` side by side; `engine/timing.rs` holds the decisions about time as pure functions; `engine/grant.rs` what a grant holds (the seam for new primitives: a semaphore's permit is `Hold::RedisPermit`) |
//! | [`audit`] | audit | the deployment audit ([`LockClient::audit`], `fencelock doctor`): [`audit::Audit`], its [`audit::Check`] rows and their [`audit::Status`] |
//! | `store` | store | I/O only. `store/redis/`: typed calls and replies, one file per operation (`store/redis/ops/`), the Lua scripts (`store/redis/scripts/*.lua`), the data kept in Redis (`wire.rs`), the connection (`conn.rs`, `connect.rs`, `invoke.rs`, `command.rs`), Sentinel, Cluster, pub/sub, batching (`coalesce.rs`). `store/etcd/` (feature `etcd`): the connection, keys, the grant transactions, the queue and its watch, keep-alive and release, `FencedKey`'s transactions. TLS and URL redaction |
//! | `options` | foundation | [`LockOptions`], [`Renewal`], [`FenceMode`], [`WaitMode`] and their limits |
//! | `keys` | foundation | name and resource key checks ([`check_name`], [`check_resource_key`], a lock's own keys) and [`KeyLayout`]: the Redis keys of a lock |
//! | `fence` | foundation | the [`Fence`] newtype |
//! | `holder` | foundation | the secret token, the public [`holder_id`], and [`REVOKED_HOLDER`], the holder a revoke's seal records |
//! | `error` | foundation | [`Error`], [`Retry`], [`DriverError`] and [`LossReason`] |
//! | [`metrics`] | foundation | diagnostics: metric names, the family rule for labels, recording helpers, the [`Stats`] snapshot |
//! | `testing` | — | feature `testing`: the wire formats, raw script calls, broken variants for negative controls, the engine's pure decisions about time |
//!
//! Where to find the four things a reader looks for first:
//!
//! - **the grant** (lock and fence in one step): `store/redis/scripts/grant_free.lua`
//!   runs first (a free lock), then `grant_fast.lua` (a refusal); both fall
//!   through to `grant.lua` for the rest (queueing, fair hand-overs,
//!   retries, errors), whose fence minting is `next_fence` / `mint` in
//!   `prelude.lua`; concurrent grants of one client go as one call to
//!   `grant_many.lua`; the clock-floored fence itself is `clock_fence` in
//!   `fence_clock.lua`. Arguments and replies: `store/redis/ops/grant.rs`.
//!   The attempt and the wait around it: `engine/redis/acquire.rs`. On
//!   etcd: the grant transactions in `store/etcd/grant.rs`, the recipe in
//!   `engine/etcd/acquire.rs`;
//! - **the renewal loop**: `run` in `lease/keeper.rs`, one task per
//!   client whose rounds (`Keeper::tick`) renew the leases due in batches through
//!   `Engine::renew_many`; on Redis the compare-and-pexpire
//!   it sends is `store/redis/scripts/extend_many.lua` (`extend.lua` for a
//!   manual `extend`), on etcd one keep-alive per lease;
//! - **the fence rule at the resource**: [`fence_accepts`] states it; each
//!   resource writes the same rule again in its own language: in
//!   `store/redis/scripts/fenced_write.lua` (Redis hash), as SQL in
//!   `resource/postgres/sql.rs` (`rule_sql`), and as a transaction in
//!   `store/etcd/fenced.rs` (`rule_txn`, etcd key);
//! - **the wait queue**: its Redis side is `enqueue` in `grant.lua`,
//!   `live_head` / `pass_on` in `prelude.lua` and the hand-over in
//!   `release_fast.lua`; the member format is `QueueMember` in
//!   `store/redis/wire.rs`; the waiting loop is `engine/redis/acquire.rs`,
//!   and the wake-up routing `engine/redis/wakeups.rs`.
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
//! - **A session per client and ttl**: one etcd lease shared by the
//!   client's locks of that ttl (etcd's own `concurrency.Session` model),
//!   kept alive at ttl/3 by the same keeper task, with a key of its own per
//!   acquisition; an uncontended acquire + release is two Raft commits.
//!   etcd leases count whole seconds (the ttl is rounded up, and etcd may
//!   raise it to its shortest lease, 1.5 election timeouts): the local
//!   deadline stays the ttl, etcd's expiry can only be later. A lock taken
//!   over is lost alone; a session lost (expired, revoked) loses every lock
//!   held on it at once, and each one's loss signal fires.
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
//! - **Release** deletes the holder's key (the session stays for the
//!   client's next lock); one that fails is sent again in the background
//!   while the session lives.
//! - Resources: every resource takes etcd fences; `FencedKey` keeps state
//!   in etcd and can check in the same transaction that the writer still
//!   holds its lock (`FencedKey::write_held`).
//! - Semaphores ([`LockOptions::permits`]): a key per held slot, its
//!   create revision the fence, waiters served first come, first served
//!   across all permits (`engine/etcd/semaphore.rs`).
//! - Not on etcd: the guide layout, fence modes (ignored), waiting for
//!   replicas, fenced hashes on the etcd client (use a Redis client).
//!
//! The protocol, step by step, is in `engine/etcd/mod.rs`.
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

pub mod audit;
mod client;
mod engine;
mod error;
mod fence;
mod holder;
mod keys;
mod lease;
pub mod metrics;
mod options;
mod resource;
mod rwlock;
mod store;

pub use client::{DEFAULT_PREFIX, LockClient, LockClientBuilder, MAX_PREFIX_LEN};
pub use engine::{Deposed, LockState, PermitHolder, RwHolder};
pub use error::{DriverError, Error, LossReason, Result, Retry};
pub use fence::Fence;
pub use holder::{REVOKED_HOLDER, holder_id};
pub use keys::{KeyLayout, LockKeys, MAX_NAME_LEN, check_name, check_resource_key};
pub use lease::{Lease, LeaseHandle, ReleaseOutcome};
pub use metrics::{LockStats, ResourceStats, Stats, StatsHandle};
pub use options::{
    Access, DEFAULT_WAITER_LEASE, ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, FENCE_RETENTION,
    FenceMode, LockOptions, MAX_CONNECTION_TIMEOUT, MAX_FENCE_EPOCH, MAX_PERMITS, MAX_TTL, MIN_TTL,
    NOTIFY_HANDOVER_LEASE, Renewal, Replication, STARVATION_THRESHOLD, WaitMode,
};
#[cfg(feature = "postgres")]
pub use resource::postgres::{
    FENCE_COLUMN, FencedRow, FencedTable, HOLDER_COLUMN, RowFence, RowKey, SetClause,
};
pub use resource::{
    Fenced, FencedHash, HashState, Revoked, SealFuture, Sealable, Sealed, ValidatedRead,
    WriteOutcome, fence_accepts, read_is_clean,
};
#[cfg(feature = "etcd")]
pub use resource::{FencedKey, KeyState};
pub use rwlock::RwLock;
/// The sqlx version fencelock's Postgres resource is built on (feature
/// `postgres`), so a `PgPool` from it always fits [`FencedTable::new`].
#[cfg(feature = "postgres")]
pub use sqlx;
pub use store::{redact as redact_url, redact_url_in};

#[cfg(feature = "testing")]
pub mod testing;

/// The README's examples, compiled as doc-tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
