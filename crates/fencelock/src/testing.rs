//! Internals for tests, benchmarks, the torture harness and the protocol
//! model (feature `testing`; not part of the stable API): the data
//! fencelock keeps in Redis — lock values, the wait queue's members,
//! wake-up messages — encoded and decoded exactly as the library does, raw
//! script and transaction calls, deliberately broken variants for negative
//! controls, and the engine's decisions about time as the pure functions
//! the engine itself calls.

use std::time::Duration;

use tokio::time::Instant;

use crate::store::redis::invocation;
use crate::store::redis::ops::{Extend, ExtendMany, Grant, GrantReply, Mint};
use crate::{Fence, LockClient, LockKeys, LockOptions};

mod protocol;

pub use crate::store::redis::BatchFault;
pub use crate::store::redis::BatchGate;
pub use crate::store::redis::ScriptMutation;
pub use crate::store::redis::wire::*;
pub use protocol::{ProtocolScripts, ResourceChange};

/// The grant script call that [`LockClient::try_acquire`] makes for `keys`,
/// `token` and `opts`, to run on any connection.
pub fn grant_invocation(
    keys: &LockKeys,
    token: &str,
    opts: &LockOptions,
) -> redis::ScriptInvocation<'static> {
    invocation(&Grant {
        keys,
        mint: Mint::new(opts),
        token,
        ttl: opts.ttl,
        wait_mode: opts.wait_mode,
        member: None,
        waiter_lease: opts.waiter_lease,
        queued: false,
    })
}

/// The fence a [`grant_invocation`]'s `reply` granted, or `None` for a
/// refusal (held, or reserved for the head of a fair queue).
///
/// # Errors
/// The reply is none a grant script gives.
pub fn granted_fence(reply: redis::Value) -> std::result::Result<Option<Fence>, String> {
    use redis::FromRedisValue;
    match GrantReply::from_redis_value(reply).map_err(|e| e.to_string())? {
        GrantReply::Granted(fence) => Ok(Some(fence)),
        GrantReply::Held { .. } | GrantReply::ReservedForHead { .. } => Ok(None),
    }
}

/// How many grant (or release) calls of one client, of one Cluster slot,
/// go to Redis at once before further ones queue and are batched: a test
/// that wants a batch first holds this many calls inside Redis.
pub const BATCH_IN_FLIGHT: usize = crate::store::redis::IN_FLIGHT;

/// Makes `client`'s batched grants run a deliberately broken script
/// (`None`: the real one again): the negative controls of the tests of
/// batched grants. A Redis client only.
pub fn break_batched_grants(client: &LockClient, fault: Option<BatchFault>) {
    if let Some(redis) = client.engine().redis_engine() {
        redis.batches().break_grants(fault);
    }
}

/// Makes `client`'s batches of grants wait at `gate` before they are sent
/// (`None`: no more): the tests of callers that leave while their batch is
/// under way. A Redis client only.
pub fn gate_batched_grants(client: &LockClient, gate: Option<BatchGate>) {
    if let Some(redis) = client.engine().redis_engine() {
        redis.batches().gate_grants(gate);
    }
}

/// The script call one keeper tick makes to renew a batch of leases
/// (`(lock key, exact lock value)` each) to `ttl`, to run on any
/// connection. It replies with the leases it did not renew, as pairs
/// (1-based index, 0 absent or -1 another value): empty when all were.
pub fn renewal_batch_invocation(
    leases: &[(&str, &str)],
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    invocation(&ExtendMany { leases, ttl })
}

/// The script call a lease's own `extend` makes, to run on any connection.
pub fn extend_invocation(
    key: &str,
    value: &str,
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    invocation(&Extend { key, value, ttl })
}

/// The margin the engine subtracts from every lease for clock drift and
/// timer lateness: 1 % of the ttl plus 2 ms.
pub fn drift(ttl: Duration) -> Duration {
    crate::engine::timing::drift(ttl)
}

/// The local deadline the engine gives a lock that a release handed over
/// for `provisional` to a waiter whose last refused attempt was sent at
/// `refused_at`, or `None` when too little of it is left at `now` to take
/// it.
pub fn handover_deadline(
    refused_at: Instant,
    provisional: Duration,
    now: Instant,
) -> Option<Instant> {
    crate::engine::timing::handover_deadline(refused_at, provisional, now)
}

/// Whether the engine trusts a hand-over wake-up carrying fence `handed`
/// without asking the store, given the fence `seen` stored when the
/// waiter's last attempt was refused: only if `handed` is above it.
pub fn handover_is_fresh(seen: Option<u64>, handed: Fence) -> bool {
    crate::engine::timing::handover_is_fresh(seen, handed)
}

/// Whether the engine treats a grant whose local deadline is `deadline`
/// (of a `ttl` lease) as too late at `now`: less than a tenth of the ttl
/// left.
pub fn arrived_too_late(deadline: Instant, ttl: Duration, now: Instant) -> bool {
    crate::engine::timing::arrived_too_late(deadline, ttl, now)
}

/// The etcd grant transaction for lock `name` and the existing lease
/// `lease`, on an etcd `client` (feature `etcd`), as an acquisition sends
/// it (and sends it again when its reply was lost): creates the lease's key
/// unless it exists. Returns the key's create revision and how many keys
/// the lock has.
///
/// # Errors
/// [`crate::Error::InvalidOption`] for a Redis client; etcd errors.
#[cfg(feature = "etcd")]
pub async fn etcd_grant_txn(
    client: &LockClient,
    name: &str,
    lease: i64,
) -> crate::Result<(i64, usize)> {
    let Some(conn) = client.engine().etcd() else {
        return Err(crate::Error::InvalidOption("not an etcd client".into()));
    };
    let prefix = crate::store::etcd::lock_prefix(conn.namespace(), client.prefix(), name);
    crate::store::etcd::grant_txn_for_tests(conn, &prefix, lease).await
}

/// Holds back the reply of the next transaction an etcd `client` sends
/// (feature `etcd`; the next acquisition's first is its grant): etcd applies
/// it at once, and the reply reaches the client only when the returned
/// sender is used or dropped. With `lose` the reply is then lost: the
/// client gets a transient error, as when the connection broke after etcd
/// applied the request, and sends the transaction again.
///
/// # Errors
/// [`crate::Error::InvalidOption`] for a Redis client.
#[cfg(feature = "etcd")]
pub fn etcd_hold_next_reply(
    client: &LockClient,
    lose: bool,
) -> crate::Result<tokio::sync::oneshot::Sender<()>> {
    let Some(conn) = client.engine().etcd() else {
        return Err(crate::Error::InvalidOption("not an etcd client".into()));
    };
    let (release, until) = tokio::sync::oneshot::channel();
    conn.hold_next_reply(until, lose);
    Ok(release)
}

/// Serves an etcd `client`'s serializable reads as of `revision` (`None`:
/// current again), as a member that has applied nothing after it would
/// (feature `etcd`): a lagging member, on demand. A waiter's look is the
/// only serializable read the engine makes.
///
/// # Errors
/// [`crate::Error::InvalidOption`] for a Redis client.
#[cfg(feature = "etcd")]
pub fn etcd_serve_stale_reads(client: &LockClient, revision: Option<i64>) -> crate::Result<()> {
    let Some(conn) = client.engine().etcd() else {
        return Err(crate::Error::InvalidOption("not an etcd client".into()));
    };
    conn.serve_stale_reads(revision);
    Ok(())
}

/// Deletes every etcd key under the `client`'s namespace and prefix
/// (feature `etcd`): what a run that made up its own prefix leaves behind
/// (holder and waiter keys whose leases have not expired yet). Returns how
/// many keys were deleted.
///
/// # Errors
/// [`crate::Error::InvalidOption`] for a Redis client, or an empty
/// namespace and prefix (that would be every key); etcd errors.
#[cfg(feature = "etcd")]
pub async fn etcd_delete_prefix(client: &LockClient) -> crate::Result<i64> {
    let Some(conn) = client.engine().etcd() else {
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

/// A Redis client's own connection, as a raw `redis` connection: the same
/// URL forms, TLS files, Sentinel failovers and Cluster routing as the
/// client, for data a test or the torture harness keeps next to the locks
/// (its audited resource, its clean-up).
///
/// Every command and pipeline is sent **once**: a call that fails is never
/// sent again, so a script that is not safe to repeat is not repeated
/// (behind Sentinel a failure the way a failover explains makes the next
/// call ask the sentinels first). On a Cluster a command goes to the master
/// of its first key's slot (a pipeline: of its first keyed command's).
#[derive(Clone)]
pub struct RawConnection {
    conn: crate::store::redis::RedisConn,
}

impl std::fmt::Debug for RawConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConnection")
            .field("url", &self.conn.url())
            .finish()
    }
}

impl RawConnection {
    /// The connection of the Redis `client`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] for an etcd client.
    pub fn of(client: &LockClient) -> crate::Result<Self> {
        Ok(RawConnection {
            conn: client.engine().redis()?.clone(),
        })
    }

    /// Runs `cmd` on the master of `key`'s slot (any master without one),
    /// with the client's error mapping; behind Sentinel it follows a
    /// failover and runs `cmd` again, so only for commands safe to repeat.
    ///
    /// # Errors
    /// The client's typed errors.
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> crate::Result<T> {
        self.conn.cmd(key, cmd).await
    }

    /// Deletes every key that starts with `prefix`, on every master (`SCAN`,
    /// never `KEYS`); returns how many were deleted.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] for an empty prefix (that would be
    /// every key); the client's typed errors.
    pub async fn delete_prefix(&self, prefix: &str) -> crate::Result<u64> {
        if prefix.is_empty() {
            return Err(crate::Error::InvalidOption(
                "refusing to delete every key: the prefix is empty".into(),
            ));
        }
        let pattern = format!("{}*", glob_escape(prefix));
        let mut deleted = 0;
        for key in self.conn.scan_any(&pattern).await? {
            let n: u64 = self.conn.cmd(&key, redis::cmd("DEL").arg(&key)).await?;
            deleted += n;
        }
        Ok(deleted)
    }
}

/// `s` with the characters `SCAN … MATCH` treats as a pattern escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl redis::aio::ConnectionLike for RawConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(self.conn.send_once(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(self.conn.send_pipeline_once(cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        0
    }
}
