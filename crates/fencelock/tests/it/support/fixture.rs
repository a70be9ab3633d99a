//! Two clients contending for one lock on a redis-server of their own, and
//! the steps the contention tests share: a holder that keeps the lock
//! without renewing it, a waiter acquiring in the background, reads of the
//! lock's wait queue and of what fencelock stores in it.
//!
//! The lock is [`NAME`] unless a test names another ([`Fixture::named`]),
//! under the default prefix in the hash-tagged layout: its keys are
//! `lock:{NAME}` (value `TOKEN:FENCE`), the queue `lock:{NAME}:queue`
//! (members `CLIENT:WAITER:MODE:TTL:WLEASE:TOKEN`, scored by arrival), the
//! waiter leases `lock:{NAME}:waiters`, and the wake-up channels
//! `lock:{NAME}:wake:CLIENT`.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::testing::{QueueMember, parse_lock_value};
use fencelock::{
    Fence, KeyLayout, Lease, LockClient, LockKeys, LockOptions, ReleaseOutcome, Renewal, WaitMode,
};
use fencelock_testkit::RedisServer;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{POLL_DEADLINE, TestRedis, lock_client, poll};

/// The lock of [`Fixture::start`].
pub(crate) const NAME: &str = "job";

/// A fresh redis-server (no persistence, no password), a holder client and
/// a waiter client on separate connections, and the lock they contend for.
pub(crate) struct Fixture {
    /// The server both clients use.
    pub(crate) server: RedisServer,
    /// The client that takes the lock first ([`Fixture::hold`]).
    pub(crate) holder: LockClient,
    /// The client that waits for it ([`Fixture::spawn_waiter`]).
    pub(crate) waiter: LockClient,
    /// The lock's name.
    pub(crate) name: String,
    /// The lock's keys.
    pub(crate) keys: LockKeys,
}

impl Fixture {
    /// A fixture for lock [`NAME`].
    pub(crate) async fn start() -> Result<Self> {
        Self::named(NAME).await
    }

    /// A fixture for lock `name`.
    pub(crate) async fn named(name: &str) -> Result<Self> {
        let TestRedis {
            server,
            client: holder,
        } = TestRedis::start().await?;
        let waiter = lock_client(&server).await?;
        let keys = holder.keys(name, KeyLayout::HashTagged)?;
        Ok(Fixture {
            server,
            holder,
            waiter,
            name: name.to_owned(),
            keys,
        })
    }

    /// One more client of the server, on a connection of its own, for a
    /// test with more contenders than the holder and the waiter.
    pub(crate) async fn client(&self) -> Result<LockClient> {
        lock_client(&self.server).await
    }

    /// The holder takes the free lock at once, for `ttl` and without
    /// renewal ([`holder_opts`]).
    pub(crate) async fn hold(&self, ttl: Duration) -> fencelock::Result<Lease> {
        self.holder.try_acquire(&self.name, &holder_opts(ttl)).await
    }

    /// The waiter acquires the lock with `opts`, in the background.
    pub(crate) fn spawn_waiter(&self, opts: &LockOptions) -> Acquisition {
        spawn_acquire(&self.waiter, &self.name, opts)
    }

    /// The lock's wait queue now, head first.
    pub(crate) fn queue(&self) -> Vec<String> {
        queue(&self.server, &self.keys)
    }

    /// Waits until the lock's queue holds exactly `n` members and returns
    /// them, head first.
    pub(crate) async fn queued(&self, n: usize) -> Result<Vec<String>> {
        queued(&self.server, &self.keys, n).await
    }
}

/// Options of a holder that keeps the lock for as long as the test wants:
/// lease `ttl`, no renewal, so no Redis traffic from it while others wait.
pub(crate) fn holder_opts(ttl: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl).renewal(Renewal::Off)
}

/// Options of a waiter in `mode` with waiter lease `wlease` (a notify or
/// fair waiter renews its place, and retries by itself, every third of it),
/// waiting up to 30 s for a 10 s lease.
pub(crate) fn waiter_opts(mode: WaitMode, wlease: Duration) -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .wait_mode(mode)
        .waiter_lease(wlease)
}

/// An acquisition running in the background ([`spawn_acquire`]): its lease
/// and the instant it was granted.
pub(crate) type Acquisition = JoinHandle<fencelock::Result<(Lease, Instant)>>;

/// `client` acquires `name` with `opts` in the background, reporting when
/// the lease was granted; await it with [`granted`].
pub(crate) fn spawn_acquire(client: &LockClient, name: &str, opts: &LockOptions) -> Acquisition {
    let (client, name, opts) = (client.clone(), name.to_string(), opts.clone());
    tokio::spawn(async move {
        let lease = client.acquire(&name, &opts).await?;
        Ok((lease, Instant::now()))
    })
}

/// Awaits a background acquisition for at most `limit`: its lease and the
/// instant it was granted, or why it was not.
pub(crate) async fn granted(task: Acquisition, limit: Duration) -> Result<(Lease, Instant)> {
    Ok(tokio::time::timeout(limit, task)
        .await
        .with_context(|| format!("the waiter was not granted the lock within {limit:?}"))?
        .context("the waiter task panicked")??)
}

/// Releases `lease`, which must still hold its lock (`Released`), and
/// returns its fence and the instant just before the release was sent, to
/// measure and check what the release brings about.
pub(crate) async fn release(lease: Lease) -> Result<(Fence, Instant)> {
    let fence = lease.fence();
    let released_at = Instant::now();
    let outcome = lease.release().await?;
    ensure!(
        outcome == ReleaseOutcome::Released,
        "the release returned {outcome:?}"
    );
    Ok((fence, released_at))
}

/// Releases `holder`, which must still hold its lock, and awaits `waiter`,
/// which must then be granted the lock within `limit` with a fence above the
/// holder's; releases the waiter's lease too. Returns how long after the
/// release (from just before it was sent) the waiter was granted the lock.
pub(crate) async fn release_to_waiter(
    holder: Lease,
    waiter: Acquisition,
    limit: Duration,
) -> Result<Duration> {
    let (h_fence, released_at) = release(holder).await?;
    let (lease, granted_at) = granted(waiter, limit).await?;
    ensure!(
        lease.fence() > h_fence,
        "the waiter's fence {} is not above the holder's {h_fence}",
        lease.fence()
    );
    release(lease).await?;
    Ok(granted_at - released_at)
}

/// The wait queue of the lock with `keys`, head first.
pub(crate) fn queue(server: &RedisServer, keys: &LockKeys) -> Vec<String> {
    server.query(&["ZRANGE", &keys.queue(), "0", "-1"])
}

/// Waits until the queue of the lock with `keys` holds exactly `n` members
/// and returns them, head first.
pub(crate) async fn queued(server: &RedisServer, keys: &LockKeys, n: usize) -> Result<Vec<String>> {
    poll(&format!("{n} queued waiters"), POLL_DEADLINE, || {
        let q = queue(server, keys);
        (q.len() == n).then_some(q)
    })
    .await
}

/// A queue member, parsed as the library encodes it.
pub(crate) fn parse_member(text: &str) -> Result<QueueMember> {
    Ok(text.parse()?)
}

/// The fence in a hash-tagged lock value (`TOKEN:FENCE`).
pub(crate) fn value_fence(value: &str) -> Result<Fence> {
    parse_lock_value(value, KeyLayout::HashTagged)
        .1
        .with_context(|| format!("lock value {value:?} has no fence"))
}

/// Subscribers of one pub/sub channel (`PUBSUB NUMSUB`), such as a
/// waiter's wake-up channel.
pub(crate) fn subscribers(server: &RedisServer, channel: &str) -> Result<i64> {
    let reply: Vec<redis::Value> = server.query(&["PUBSUB", "NUMSUB", channel]);
    match reply.get(1) {
        Some(redis::Value::Int(n)) => Ok(*n),
        other => bail!("unexpected PUBSUB NUMSUB reply {other:?}"),
    }
}
