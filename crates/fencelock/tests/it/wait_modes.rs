//! The wait modes against a real `redis-server` (one per test):
//!
//! - notify: a waiter sleeps until the release wakes it (Redis executes
//!   nothing for it meanwhile, unlike a poller), and still acquires when the
//!   wake-up is lost (no release message; its subscription killed; Redis
//!   restarted, or down for a while) — through its retry when the holder's
//!   lease runs out or every third of its waiter lease; a SIGKILLed head
//!   delays the next waiter by at most a third of its waiter lease; idle
//!   subscriptions dropped past 256 are taken again when needed; a head
//!   that has waited 10 ms is handed the lock by the release, ahead of a
//!   worker taking it back (one that arrived just now is only woken);
//! - fair: waiters are granted in queue order; a SIGKILLed, timed-out or
//!   cancelled waiter does not hold up the ones behind it; a waiter with a
//!   long waiter lease keeps its place when one with a short lease leaves;
//!   `try_acquire` honours the queue; a handed-over lease is renewed to its
//!   full ttl at once; a hand-over whose message is lost is picked up by the
//!   waiter's retry with the same fence;
//! - ACL users without pub/sub permission: waiters fall back to polling, and
//!   a release never fails because a wake-up cannot be published;
//! - every mode: no overlapping holders and strictly increasing fences over
//!   10,000 contended grants.
//!
//! Keys of lock `NAME` (default prefix and layout): `lock:{NAME}` (value
//! `TOKEN:FENCE`), the queue `lock:{NAME}:queue` (members
//! `CLIENT:WAITER:MODE:TTL:WLEASE:TOKEN`, scored by arrival), the waiter leases
//! `lock:{NAME}:waiters`, and the wake-up channel `lock:{NAME}:wake:CLIENT`.
//!
//! Tests whose assertions are timing windows, or that take more than a few
//! seconds, carry `heavy_` in their name, so nextest runs them one at a time
//! (see `.config/nextest.toml`). Fair-mode worker processes need
//! `cargo build -p fencelock-testkit --bins` (nextest builds them with the
//! workspace).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::testing::{QueueMember, parse_lock_value};
use fencelock::{
    Error, Fence, KeyLayout, Lease, LockClient, LockKeys, LockOptions, NOTIFY_HANDOVER_LEASE,
    ReleaseOutcome, Renewal, WaitMode,
};
use fencelock_testkit::RedisServer;

use crate::support::TestRedis;
use crate::support::{Keys, POLL_DEADLINE, poll};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Allowance for scheduling on a loaded 2-core machine, added to every upper
/// bound that the design derives from leases and retry intervals.
const SLACK: Duration = Duration::from_millis(400);

/// Longest accepted release → grant time of a woken waiter. The waiters of
/// these tests would otherwise retry only after seconds (their waiter lease
/// is long), so only the wake-up can explain a grant this fast.
const WAKE_BOUND: Duration = Duration::from_millis(100);

/// Commands the server has executed (`total_commands_processed`, which
/// counts the commands inside scripts too), read on one admin connection
/// kept open so that no connection handshake adds to the count; the `INFO`
/// that reads it counts only towards the next reading.
fn total_commands(admin: &mut redis::Connection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("stats").query(admin)?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO stats lacks total_commands_processed")
}

/// The wait queue of a lock, head first.
fn queue(server: &RedisServer, keys: &LockKeys) -> Vec<String> {
    server.query(&["ZRANGE", &keys.queue, "0", "-1"])
}

/// A queue member, parsed as the library encodes it.
fn parse_member(text: &str) -> Result<QueueMember> {
    Ok(text.parse()?)
}

/// The fence in a hash-tagged lock value (`TOKEN:FENCE`).
fn value_fence(value: &str) -> Result<Fence> {
    parse_lock_value(value, KeyLayout::HashTagged)
        .1
        .with_context(|| format!("lock value {value:?} has no fence"))
}

/// Subscribers of one channel (`PUBSUB NUMSUB`).
fn subscribers(server: &RedisServer, channel: &str) -> Result<i64> {
    let reply: Vec<redis::Value> = server.query(&["PUBSUB", "NUMSUB", channel]);
    match reply.get(1) {
        Some(redis::Value::Int(n)) => Ok(*n),
        other => bail!("unexpected PUBSUB NUMSUB reply {other:?}"),
    }
}

/// Waits until the queue holds exactly `n` members and returns them (head
/// first).
async fn queued(server: &RedisServer, keys: &LockKeys, n: usize) -> Result<Vec<String>> {
    poll(&format!("{n} queued waiters"), POLL_DEADLINE, || {
        let q = queue(server, keys);
        (q.len() == n).then_some(q)
    })
    .await
}

/// An acquisition in the background, reporting when the lease was granted.
fn spawn_acquire(
    client: &LockClient,
    name: &str,
    opts: &LockOptions,
) -> JoinHandle<fencelock::Result<(Lease, Instant)>> {
    let (client, name, opts) = (client.clone(), name.to_string(), opts.clone());
    tokio::spawn(async move {
        let lease = client.acquire(&name, &opts).await?;
        Ok((lease, Instant::now()))
    })
}

/// Awaits a background acquisition for at most `limit`.
async fn granted(
    task: JoinHandle<fencelock::Result<(Lease, Instant)>>,
    limit: Duration,
) -> Result<(Lease, Instant)> {
    Ok(tokio::time::timeout(limit, task)
        .await
        .with_context(|| format!("the waiter was not granted the lock within {limit:?}"))?
        .context("the waiter task panicked")??)
}

/// A holder that keeps the lock for as long as the test wants: no renewal,
/// so no Redis traffic from it while others wait.
fn holder_opts(ttl: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl).renewal(Renewal::Off)
}

/// A waiter in `mode` with waiter lease `wlease`, waiting up to 30 s.
fn waiter_opts(mode: WaitMode, wlease: Duration) -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(30))
        .wait_mode(mode)
        .waiter_lease(wlease)
}

/// What Redis saw while a waiter waited behind a holder for 2 s.
#[derive(Debug)]
struct Waited {
    /// Script calls (grant attempts) from just before the waiter started
    /// until just before the release.
    scripts: u64,
    /// Every command Redis executed in the 2 s after the waiter's first
    /// attempt (for notify and fair, after it was queued; a refused attempt
    /// alone is about ten: the script and the commands inside it).
    commands_after_first_attempt: u64,
    /// From just before the release was sent until the waiter had the lease.
    release_to_grant: Duration,
}

/// A waiter in `mode` waits behind a holder that keeps the lock (10 s lease,
/// no renewal) for 2 s after the waiter's first attempt, then releases.
async fn wait_behind_a_two_second_holder(mode: WaitMode) -> Result<Waited> {
    let server = RedisServer::start();
    let mut admin = redis::Client::open(server.url())?.get_connection()?;
    let holder = LockClient::connect(&server.url()).await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(10)))
        .await?;
    let scripts_before = server.script_calls();
    // A 30 s waiter lease: a queued waiter retries by itself only every 10 s
    // (a third of it) or when the holder's 10 s lease runs out.
    let task = spawn_acquire(&waiter, "job", &waiter_opts(mode, Duration::from_secs(30)));
    // A queued waiter (notify, fair) is counted from when it is queued (a
    // notify waiter's first attempt is not queued: only a refused one
    // registers and queues with its next attempt, at once).
    poll("the waiter's first attempt", POLL_DEADLINE, || {
        let tried = server.script_calls() > scripts_before;
        let queued = mode == WaitMode::Poll || !queue(&server, &keys).is_empty();
        (tried && queued).then_some(())
    })
    .await?;
    let commands_before = total_commands(&mut admin)?;
    // Let the holder keep the lock for 2 s, on purpose.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let commands_after_first_attempt = total_commands(&mut admin)? - commands_before - 1;
    let scripts = server.script_calls() - scripts_before;
    ensure!(
        !task.is_finished(),
        "the waiter returned while the lock was held"
    );
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    ensure!(granted_at > released_at, "granted before the release");
    ensure!(
        lease.fence() > h_fence,
        "fence {} after {h_fence}",
        lease.fence()
    );
    ensure!(server.get(&keys.lock) == Some(format!("{}:{}", lease.token(), lease.fence())));
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(Waited {
        scripts,
        commands_after_first_attempt,
        release_to_grant: granted_at - released_at,
    })
}

/// Notify: a waiter behind a holder that keeps the lock for 2 s sends its
/// first attempts (refused, then queued) and then nothing (at most 3 script
/// calls in all; no command at all reaches Redis in the 2 s after it was
/// queued) and
/// still has the lock within 100 ms of the release: only the wake-up can
/// explain that, since its own retry was 10 s away.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_waiter_sends_nothing_while_waiting_and_wakes_at_the_release() -> Result<()> {
    let waited = wait_behind_a_two_second_holder(WaitMode::Notify).await?;
    eprintln!("notify: {waited:?}");
    ensure!(
        waited.scripts <= 3,
        "a notify waiter made {} script calls in 2 s of waiting",
        waited.scripts
    );
    ensure!(
        waited.commands_after_first_attempt == 0,
        "Redis executed {} commands in the 2 s after a notify waiter's first attempt",
        waited.commands_after_first_attempt
    );
    ensure!(
        waited.release_to_grant <= WAKE_BOUND,
        "the woken waiter took {:?} after the release",
        waited.release_to_grant
    );
    Ok(())
}

/// The negative control: the same wait in poll mode costs Redis many script
/// calls (backoff from 4 ms up to 200 ms: at least 8 in 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_poll_waiter_retries_many_times_while_the_lock_is_held() -> Result<()> {
    let waited = wait_behind_a_two_second_holder(WaitMode::Poll).await?;
    eprintln!("poll: {waited:?}");
    ensure!(
        waited.scripts >= 8,
        "a poll waiter made only {} script calls in 2 s of waiting",
        waited.scripts
    );
    // A poller notices a release at most one capped backoff (200 ms) late.
    ensure!(
        waited.release_to_grant <= Duration::from_millis(200) + SLACK,
        "the poller took {:?} after the release",
        waited.release_to_grant
    );
    Ok(())
}

/// Notify, no release message at all (the holder's lock is deleted behind
/// the scenes, so no release script runs): with a long waiter lease, the
/// waiter retries when the holder's lease would have run out, and acquires
/// then — not before (nothing told it), and not much later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_waiter_without_a_release_message_acquires_when_the_holder_ttl_runs_out()
-> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let ttl = Duration::from_millis(1500);
    let wlease = Duration::from_secs(30);
    let acquired_at = Instant::now();
    let h = holder.try_acquire("job", &holder_opts(ttl)).await?;
    let task = spawn_acquire(&waiter, "job", &waiter_opts(WaitMode::Notify, wlease));
    queued(&server, &keys, 1).await?;
    ensure!(server.query::<i64>(&["DEL", &keys.lock]) == 1);
    let deleted_at = Instant::now();
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    let after_grant = granted_at - acquired_at;
    eprintln!(
        "deleted after {:?}, granted {after_grant:?} after the holder's grant (ttl {ttl:?})",
        deleted_at - acquired_at
    );
    // The waiter's first refusal reported the holder's remaining lease, at
    // most `ttl` from `acquired_at`; it sleeps until then (+1 ms).
    ensure!(
        after_grant <= ttl + SLACK,
        "granted only {after_grant:?} after the holder's grant (ttl {ttl:?}, waiter lease {wlease:?})"
    );
    ensure!(
        after_grant >= ttl - Duration::from_millis(300),
        "granted {after_grant:?} after the holder's grant: something woke the waiter early"
    );
    ensure!(lease.fence() > h.fence());
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    ensure!(
        h.release().await? == ReleaseOutcome::NotOurs(fencelock::LossReason::Expired),
        "the deleted holder's release must find nothing of its own"
    );
    Ok(())
}

/// Notify, no release message, a holder with a long lease: the waiter's
/// retry every third of its waiter lease finds the lock free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_waiter_without_a_release_message_acquires_within_a_third_of_its_waiter_lease()
-> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let wlease = Duration::from_millis(900);
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let task = spawn_acquire(&waiter, "job", &waiter_opts(WaitMode::Notify, wlease));
    queued(&server, &keys, 1).await?;
    ensure!(server.query::<i64>(&["DEL", &keys.lock]) == 1);
    let deleted_at = Instant::now();
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    let waited = granted_at - deleted_at;
    eprintln!("granted {waited:?} after the silent delete (waiter lease {wlease:?})");
    ensure!(
        waited <= wlease / 3 + SLACK,
        "granted {waited:?} after the lock was freed (waiter lease {wlease:?})"
    );
    ensure!(lease.fence() > h.fence());
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Notify, the waiter's pub/sub connection killed while it waits: the
/// disconnection makes it retry at once (one script call), its subscription
/// is restored, and the next release wakes it promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_waiter_survives_its_subscription_being_killed() -> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let task = spawn_acquire(
        &waiter,
        "job",
        &waiter_opts(WaitMode::Notify, Duration::from_secs(30)),
    );
    let member = queued(&server, &keys, 1).await?.remove(0);
    let channel = parse_member(&member)?.wake_channel(&keys);
    ensure!(subscribers(&server, &channel)? == 1);
    let scripts_before = server.script_calls();
    let killed: i64 = server.query(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    ensure!(killed == 1, "killed {killed} pub/sub connections");
    poll(
        "the waiter's retry after the disconnection",
        POLL_DEADLINE,
        || (server.script_calls() > scripts_before).then_some(()),
    )
    .await?;
    poll("the resubscription", POLL_DEADLINE, || {
        (subscribers(&server, &channel).ok()? == 1).then_some(())
    })
    .await?;
    ensure!(
        !task.is_finished(),
        "the waiter returned while the lock was held"
    );
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    ensure!(
        granted_at - released_at <= WAKE_BOUND,
        "woken {:?} after the release",
        granted_at - released_at
    );
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Notify after a Redis restart (no persistence) that left Redis down for
/// `down`: the client that waited on a name before the restart waits on it
/// again behind a new holder, and is woken by that holder's release (its
/// 30 s waiter lease rules out its own retry); also on a name it first waits
/// on after the restart.
async fn wake_ups_survive_a_restart(down: Duration) -> Result<()> {
    let TestRedis {
        mut server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let wait_opts = waiter_opts(WaitMode::Notify, Duration::from_secs(30));
    // Before the restart: the waiter subscribes for "job" and is woken.
    let before = wake_up_once(&server, &holder, &waiter, "job", &wait_opts).await?;
    eprintln!("before the restart: {before:?}");
    ensure!(
        before.release_to_grant <= WAKE_BOUND && before.subscribers == 1,
        "before the restart: {before:?}"
    );

    server.kill();
    // Redis stays down for `down`, on purpose.
    tokio::time::sleep(down).await;
    server.restart();
    for name in ["job", "other"] {
        let woken = wake_up_once(&server, &holder, &waiter, name, &wait_opts)
            .await
            .with_context(|| {
                format!("after a restart with Redis down for {down:?}, on {name:?}")
            })?;
        eprintln!("after the restart, {name}: {woken:?}");
        ensure!(
            woken.release_to_grant <= WAKE_BOUND && woken.subscribers == 1,
            "Redis down for {down:?}, then restarted: the waiter on {name:?} was woken only {:?} after the release ({} subscriber(s) on its wake-up channel)",
            woken.release_to_grant,
            woken.subscribers
        );
    }
    Ok(())
}

/// Notify: wake-ups work again right after a Redis restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_subscription_recovers_after_a_redis_restart() -> Result<()> {
    wake_ups_survive_a_restart(Duration::ZERO).await
}

/// Notify: wake-ups work again after Redis was down for 2 s (longer than the
/// pub/sub connection's own reconnection attempts last).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_subscription_recovers_after_redis_was_down_for_two_seconds() -> Result<()> {
    wake_ups_survive_a_restart(Duration::from_secs(2)).await
}

/// How a waiter was woken by [`wake_up_once`].
#[derive(Debug)]
struct WakeUp {
    /// Release sent → lease granted.
    release_to_grant: Duration,
    /// Subscribers on the waiter's wake-up channel when the release was sent.
    subscribers: i64,
}

/// The holder client takes `name` (retrying while Redis comes back), the
/// waiter client queues behind it; once the waiter's wake-up channel has a
/// subscriber (or 3 s passed without one: the release then shows what a
/// waiter without a subscription gets), the holder releases.
async fn wake_up_once(
    server: &RedisServer,
    holder: &LockClient,
    waiter: &LockClient,
    name: &str,
    wait_opts: &LockOptions,
) -> Result<WakeUp> {
    let keys = holder.keys(name, KeyLayout::HashTagged)?;
    let h = holder
        .acquire(
            name,
            &holder_opts(Duration::from_secs(30))
                .wait(Duration::from_secs(10))
                .wait_mode(WaitMode::Poll),
        )
        .await
        .context("the holder's acquire")?;
    let task = spawn_acquire(waiter, name, wait_opts);
    let member = queued(server, &keys, 1).await?.remove(0);
    let channel = parse_member(&member)?.wake_channel(&keys);
    let _ = poll(
        &format!("a subscriber on {channel}"),
        Duration::from_secs(3),
        || (subscribers(server, &channel).ok()? == 1).then_some(()),
    )
    .await;
    let subscribers = subscribers(server, &channel)?;
    ensure!(
        !task.is_finished(),
        "the waiter returned while the lock was held"
    );
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let (lease, granted_at) = granted(task, Duration::from_secs(20)).await?;
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(WakeUp {
        release_to_grant: granted_at - released_at,
        subscribers,
    })
}

/// `PING`s the server has executed (`INFO commandstats`).
fn pings(server: &RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Fair: the release of a contended lease (one whose acquisition was
/// refused first) is sent behind a `PING` in the same write, so that Redis,
/// which writes the replies of one event-loop turn newest client first,
/// writes the next holder's hand-over before the releaser's reply; an
/// uncontended lease's release is sent alone. Both hand the lock over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_contended_release_goes_behind_a_ping_so_the_next_holder_is_woken_first() -> Result<()>
{
    let TestRedis { server, client } = TestRedis::start().await?;
    let keys = client.keys("job", KeyLayout::HashTagged)?;
    let opts = waiter_opts(WaitMode::Fair, Duration::from_secs(3)).wait(Duration::from_secs(60));
    let first = client.acquire("job", &opts).await?;
    let second = spawn_acquire(&client, "job", &opts);
    queued(&server, &keys, 1).await?;
    let (before, first_fence) = (pings(&server), first.fence());
    ensure!(first.release().await? == ReleaseOutcome::Released);
    let (second, _) = second.await??;
    ensure!(
        pings(&server) == before,
        "an uncontended lease was released behind a PING"
    );
    ensure!(second.fence() > first_fence);
    let third = spawn_acquire(&client, "job", &opts);
    queued(&server, &keys, 1).await?;
    let (before, second_fence) = (pings(&server), second.fence());
    ensure!(second.release().await? == ReleaseOutcome::Released);
    let (third, _) = third.await??;
    ensure!(
        pings(&server) == before + 1,
        "a contended lease was released without a PING ahead of it"
    );
    ensure!(third.fence() > second_fence);
    ensure!(third.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair: 8 waiters, each with its own client, queued one by one (each seen
/// in the queue before the next starts) behind a holder, are granted in
/// exactly that order once the holder releases, with increasing fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_waiters_are_granted_in_queue_order() -> Result<()> {
    const WAITERS: usize = 8;
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(60)))
        .await?;
    let opts = waiter_opts(WaitMode::Fair, Duration::from_secs(3)).wait(Duration::from_secs(60));
    let grants: Arc<Mutex<Vec<(usize, Fence)>>> = Arc::default();
    let mut tasks = Vec::new();
    let mut expected_queue: Vec<String> = Vec::new();
    for i in 0..WAITERS {
        let client = LockClient::connect(&server.url()).await?;
        let (opts, grants) = (opts.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire("job", &opts).await?;
            grants
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((i, lease.fence()));
            lease.release().await
        }));
        let q = queued(&server, &keys, i + 1).await?;
        ensure!(
            q[..i] == expected_queue[..],
            "waiter {i} did not join at the tail: {q:?}"
        );
        expected_queue = q;
    }
    let h_fence = h.fence();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    for (i, task) in tasks.into_iter().enumerate() {
        let outcome = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .with_context(|| format!("waiter {i} was not granted in time"))???;
        ensure!(
            outcome == ReleaseOutcome::Released,
            "waiter {i}: {outcome:?}"
        );
    }
    let grants = grants.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let order: Vec<usize> = grants.iter().map(|(i, _)| *i).collect();
    ensure!(
        order == (0..WAITERS).collect::<Vec<_>>(),
        "granted in order {order:?}"
    );
    let mut last = h_fence;
    for (i, fence) in grants {
        ensure!(fence > last, "waiter {i}: fence {fence} after {last}");
        last = fence;
    }
    ensure!(queue(&server, &keys).is_empty(), "the queue is not empty");
    Ok(())
}

/// Fair: a queued waiter process SIGKILLed at the head of the queue does not
/// block the waiter behind it for longer than its waiter lease.
///
/// The dead head (waiter lease 300 ms, renewed every 100 ms until the kill)
/// is still live when the holder releases right after the kill, so the
/// release hands the lock to it with a provisional lease of
/// min(ttl, waiter lease) = 300 ms. B, behind it, is told nothing; it
/// retries every 100 ms and when the provisional lease runs out, so it must
/// get the lock no sooner than 300 ms after the release and no later than
/// waiter lease + waiter lease / 3 + slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_sigkilled_head_blocks_the_next_waiter_only_for_its_waiter_lease() -> Result<()>
{
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let wlease = Duration::from_millis(300);
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;

    let mut dead = crate::support::worker::start(&server.url(), &["default", "clock"]);
    dead.post(&format!(
        "acquire job 10000 30000 renew fair wlease={}",
        wlease.as_millis()
    ));
    let dead_member = queued(&server, &keys, 1).await?.remove(0);
    let dead_token = parse_member(&dead_member)?.token;

    let b_client = LockClient::connect(&server.url()).await?;
    let b = spawn_acquire(&b_client, "job", &waiter_opts(WaitMode::Fair, wlease));
    let q = queued(&server, &keys, 2).await?;
    ensure!(q[0] == dead_member, "the worker is not the head: {q:?}");

    // Kill the head right after it renewed its place, so its waiter lease is
    // surely live when the holder releases a moment later.
    let score = |server: &RedisServer| -> Option<String> {
        server.query(&["ZSCORE", &keys.waiters, &dead_member])
    };
    let first = score(&server);
    poll("a renewal of the worker's place", POLL_DEADLINE, || {
        let now = score(&server);
        (now.is_some() && now != first).then_some(())
    })
    .await?;
    dead.kill();
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let handed = server
        .get(&keys.lock)
        .context("the release handed the lock to nobody")?;
    ensure!(
        handed.starts_with(&format!("{dead_token}:")),
        "the release did not hand the lock to the dead head: {handed:?}"
    );
    let provisional = server.pttl(&keys.lock);
    ensure!(
        provisional <= wlease.as_millis() as i64,
        "the dead head's provisional lease is {provisional} ms"
    );

    let (lease, granted_at) = granted(b, POLL_DEADLINE).await?;
    let waited = granted_at - released_at;
    eprintln!("B granted {waited:?} after the release (waiter lease {wlease:?})");
    ensure!(
        waited >= wlease - Duration::from_millis(10),
        "B was granted {waited:?} after the release, while the dead head's {wlease:?} provisional lease ran"
    );
    ensure!(
        waited <= wlease + wlease / 3 + SLACK,
        "B waited {waited:?} after the release (waiter lease {wlease:?})"
    );
    ensure!(value_fence(&handed)? > h_fence);
    ensure!(lease.fence() > value_fence(&handed)?);
    ensure!(!queue(&server, &keys).contains(&dead_member));
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair: a waiter that times out leaves the queue at once (within 1 s of
/// its `Timeout`, from a background task), and the waiter behind it is
/// handed the lock at the next release — it is not held up by the long
/// (10 s) waiter lease of the one that gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_waiter_that_times_out_leaves_the_queue() -> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let wlease = Duration::from_secs(10);
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(60)))
        .await?;
    let quitter_client = LockClient::connect(&server.url()).await?;
    let quitter = spawn_acquire(
        &quitter_client,
        "job",
        &waiter_opts(WaitMode::Fair, wlease).wait(Duration::from_millis(1500)),
    );
    let quitter_member = queued(&server, &keys, 1).await?.remove(0);
    let next_client = LockClient::connect(&server.url()).await?;
    let next = spawn_acquire(&next_client, "job", &waiter_opts(WaitMode::Fair, wlease));
    let q = queued(&server, &keys, 2).await?;
    ensure!(q[0] == quitter_member, "{q:?}");

    match tokio::time::timeout(POLL_DEADLINE, quitter).await?? {
        Err(Error::Timeout { .. }) => {}
        other => bail!("expected a timeout, got {other:?}"),
    }
    let left = poll(
        "the quitter to leave the queue",
        Duration::from_secs(1),
        || {
            let gone = !queue(&server, &keys).contains(&quitter_member)
                && server
                    .query::<Option<String>>(&["ZSCORE", &keys.waiters, &quitter_member])
                    .is_none();
            gone.then_some(())
        },
    )
    .await;
    left.context("the timed-out waiter is still queued")?;
    ensure!(queue(&server, &keys).len() == 1);

    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let (lease, granted_at) = granted(next, POLL_DEADLINE).await?;
    ensure!(
        granted_at - released_at <= WAKE_BOUND,
        "the next waiter was granted {:?} after the release",
        granted_at - released_at
    );
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair: a free lock reserved for the live head of its queue is refused to
/// a fair `try_acquire` (`Contended`, no remaining lease, nothing changed),
/// while a poll-mode `try_acquire` jumps the queue — the documented reason
/// to use one mode per name. The poll holder's release then hands the lock
/// to the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_try_acquire_respects_the_queue_and_poll_jumps_it() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let keys = client.keys("job", KeyLayout::HashTagged)?;
    let h = client
        .try_acquire("job", &holder_opts(Duration::from_secs(60)))
        .await?;
    let head_client = LockClient::connect(&server.url()).await?;
    // 30 s waiter lease: the head retries by itself only every 10 s.
    let head = spawn_acquire(
        &head_client,
        "job",
        &waiter_opts(WaitMode::Fair, Duration::from_secs(30)),
    );
    let q = queued(&server, &keys, 1).await?;
    // Free the lock behind everyone's back: no release, so no hand-over.
    ensure!(server.query::<i64>(&["DEL", &keys.lock]) == 1);

    let fair = LockOptions::default().wait_mode(WaitMode::Fair);
    match client.try_acquire("job", &fair).await {
        Err(Error::Contended {
            remaining: None, ..
        }) => {}
        other => bail!("a fair try_acquire of a reserved lock returned {other:?}"),
    }
    ensure!(
        server.get(&keys.lock).is_none(),
        "the refused try changed the lock"
    );
    ensure!(
        queue(&server, &keys) == q,
        "the refused try changed the queue"
    );

    let jumper = client
        .try_acquire("job", &LockOptions::default().wait_mode(WaitMode::Poll))
        .await
        .context("a poll try_acquire does not honour the fair queue")?;
    ensure!(jumper.fence() > h.fence());
    ensure!(!head.is_finished());
    let released_at = Instant::now();
    let jumper_fence = jumper.fence();
    ensure!(jumper.release().await? == ReleaseOutcome::Released);
    let (lease, granted_at) = granted(head, POLL_DEADLINE).await?;
    ensure!(
        granted_at - released_at <= WAKE_BOUND,
        "the head was granted {:?} after the release",
        granted_at - released_at
    );
    ensure!(lease.fence() > jumper_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair hand-over: the release grants the lock to the head for its waiter
/// lease (1 s) only; the new holder renews it to the full ttl at once —
/// also with renewal off — keeps it past the provisional 1 s, gets a
/// greater fence than the previous holder, and releases it normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_handed_over_lease_is_renewed_to_the_full_ttl_at_once() -> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let wlease = Duration::from_secs(1);
    let ttl = Duration::from_secs(10);
    for renewal in [Renewal::Off, Renewal::Auto] {
        let name = format!("job-{renewal:?}");
        let keys = holder.keys(&name, KeyLayout::HashTagged)?;
        let h = holder.try_acquire(&name, &holder_opts(ttl)).await?;
        let task = spawn_acquire(
            &waiter,
            &name,
            &waiter_opts(WaitMode::Fair, wlease)
                .ttl(ttl)
                .renewal(renewal),
        );
        let member = queued(&server, &keys, 1).await?.remove(0);
        let token = parse_member(&member)?.token;
        let h_fence = h.fence();
        ensure!(h.release().await? == ReleaseOutcome::Released);
        // The release itself granted the lock to the head.
        let handed = server.get(&keys.lock).context("nothing was handed over")?;
        ensure!(
            handed.starts_with(&format!("{token}:")),
            "{renewal:?}: the release did not hand the lock to the head: {handed:?}"
        );
        let (lease, _) = granted(task, POLL_DEADLINE).await?;
        ensure!(lease.token() == token);
        ensure!(
            handed == format!("{token}:{}", lease.fence()),
            "{renewal:?}: the lease's fence {} is not the handed-over {handed:?}",
            lease.fence()
        );
        ensure!(lease.fence() > h_fence);
        // Renewed to the full ttl: far above the 1 s provisional lease.
        poll(
            "the handed-over lease renewed",
            Duration::from_secs(1),
            || (server.pttl(&keys.lock) > 9000).then_some(()),
        )
        .await
        .with_context(|| format!("{renewal:?}: PTTL {}", server.pttl(&keys.lock)))?;
        // Past the provisional lease (on purpose): still held, not lost.
        tokio::time::sleep(wlease + Duration::from_millis(100)).await;
        ensure!(server.get(&keys.lock) == Some(handed.clone()));
        ensure!(!lease.is_lost(), "{renewal:?}: {:?}", lease.loss_reason());
        ensure!(
            lease.remaining() > Duration::from_secs(5),
            "{renewal:?}: local deadline {:?} away",
            lease.remaining()
        );
        ensure!(lease.release().await? == ReleaseOutcome::Released);
        ensure!(server.get(&keys.lock).is_none());
    }
    Ok(())
}

/// Fair hand-over whose message is lost: the waiter's pub/sub connection is
/// killed right before the holder releases. The waiter still gets the lock
/// within a third of its waiter lease (its retry finds the lock handed to
/// its token and gets the same grant back) and reports exactly the fence
/// stored in the lock value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_handover_with_a_lost_message_is_picked_up_by_the_retry() -> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let wlease = Duration::from_millis(600);
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let task = spawn_acquire(&waiter, "job", &waiter_opts(WaitMode::Fair, wlease));
    let member = queued(&server, &keys, 1).await?.remove(0);
    let token = parse_member(&member)?.token;
    let channel = parse_member(&member)?.wake_channel(&keys);
    let killed: i64 = server.query(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    ensure!(killed == 1, "killed {killed} pub/sub connections");
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let listening = subscribers(&server, &channel)?;
    let handed = server.get(&keys.lock).context("nothing was handed over")?;
    ensure!(
        handed.starts_with(&format!("{token}:")),
        "the release did not hand the lock to the waiter: {handed:?}"
    );
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    let waited = granted_at - released_at;
    eprintln!("granted {waited:?} after the release ({listening} subscriber(s) right after it)");
    ensure!(
        waited <= wlease / 3 + SLACK,
        "granted {waited:?} after the release (waiter lease {wlease:?})"
    );
    ensure!(lease.token() == token);
    ensure!(
        lease.fence() == value_fence(&handed)?,
        "the waiter reports fence {} but the lock value is {handed:?}",
        lease.fence()
    );
    ensure!(server.get(&keys.lock) == Some(handed));
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// A hand-over wake-up is trusted without another round trip only if its
/// fence is above the one stored when the waiter's last attempt was
/// refused: only then was the hand-over made after that attempt. A queued
/// fair waiter (long waiter lease: no retries of its own) is sent forged
/// wake-ups on its channel while another client holds the lock:
///
/// - one with the fence it saw refused (as a stale message from before its
///   last attempt would carry): it asks Redis (a compare-and-pexpire, which
///   fails), tries again, and keeps waiting; a waiter that trusted the
///   message would hold a lease next to the holder;
/// - after a real hand-over, which it takes at once with a fence above;
/// - one above the fence it saw (as only a hand-over made after its attempt
///   can carry): taken without asking, on a lease of the hand-over lease
///   only, which its renewal at once finds not its own: lost within
///   moments, where trusting a stale message would have left it believed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handover_wake_ups_are_trusted_only_above_the_fence_seen_at_the_last_refusal() -> Result<()>
{
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    // A hand-over lease (the waiter lease) shorter than the ttl: renewed at
    // once after a hand-over.
    let opts = waiter_opts(WaitMode::Fair, Duration::from_secs(30)).ttl(Duration::from_secs(60));
    let wake = |member: &str, fence: Fence| -> Result<(String, String)> {
        let member = parse_member(member)?;
        let message = fencelock::testing::Wake::HandedOver {
            waiter: member.waiter,
            fence,
        };
        Ok((member.wake_channel(&keys), message.to_string()))
    };

    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let task = spawn_acquire(&waiter, "job", &opts);
    let member = queued(&server, &keys, 1).await?.remove(0);
    let (channel, stale) = wake(&member, h.fence())?;
    let before = server.script_calls();
    let heard: i64 = server.query(&["PUBLISH", &channel, &stale]);
    ensure!(heard == 1, "{heard} subscribers heard the wake-up");
    // The confirmation, then the next attempt, refused.
    poll(
        "the waiter's confirmation and next attempt",
        POLL_DEADLINE,
        || (server.script_calls() >= before + 2).then_some(()),
    )
    .await?;
    ensure!(
        !task.is_finished(),
        "a wake-up with the fence seen at the refusal was trusted: {:?}",
        task.await
    );
    ensure!(server.get(&keys.lock) == Some(format!("{}:{}", h.token(), h.fence())));
    ensure!(queue(&server, &keys) == vec![member.clone()]);

    // A real hand-over: granted at once, with a fence above.
    let h_fence = h.fence();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let (lease, _) = granted(task, POLL_DEADLINE).await?;
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);

    // Forged, with a fence above the one seen: taken without asking, and
    // lost as soon as the renewal finds the lock is the holder's.
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let task = spawn_acquire(&waiter, "job", &opts);
    let member = queued(&server, &keys, 1).await?.remove(0);
    let forged = Fence::new(h.fence().get() + 1);
    let (channel, fresh) = wake(&member, forged)?;
    let heard: i64 = server.query(&["PUBLISH", &channel, &fresh]);
    ensure!(heard == 1, "{heard} subscribers heard the wake-up");
    let (lease, _) = granted(task, POLL_DEADLINE).await?;
    ensure!(lease.fence() == forged, "fence {}", lease.fence());
    poll("the forged lease lost", Duration::from_secs(1), || {
        lease.is_lost().then_some(())
    })
    .await?;
    ensure!(server.get(&keys.lock) == Some(format!("{}:{}", h.token(), h.fence())));
    ensure!(h.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair: a queued waiter whose `acquire` future is dropped (its task
/// aborted) leaves the queue from the background, so the holder's release
/// hands the lock to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_cancelled_waiter_leaves_the_queue() -> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(60)))
        .await?;
    let task = spawn_acquire(
        &waiter,
        "job",
        &waiter_opts(WaitMode::Fair, Duration::from_secs(30)),
    );
    queued(&server, &keys, 1).await?;
    task.abort();
    ensure!(
        task.await.is_err_and(|e| e.is_cancelled()),
        "the waiter was not cancelled"
    );
    poll(
        "the cancelled waiter to leave the queue",
        Duration::from_secs(2),
        || {
            let waiters: i64 = server.query(&["ZCARD", &keys.waiters]);
            (queue(&server, &keys).is_empty() && waiters == 0).then_some(())
        },
    )
    .await?;
    ensure!(h.release().await? == ReleaseOutcome::Released);
    ensure!(
        server.get(&keys.lock).is_none(),
        "the release handed the lock to a cancelled waiter"
    );
    Ok(())
}

/// Notify: a queued waiter process SIGKILLed at the head of the queue, with
/// a long (5 s) waiter lease. It has waited more than 10 ms, so the release
/// hands it the lock, for 100 ms only (not its waiter lease, as fair mode
/// would); the waiter behind it is told nothing (one message per release)
/// and must still get the lock within a third of its own waiter lease (its
/// periodic retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_sigkilled_head_delays_the_next_waiter_at_most_a_third_of_its_waiter_lease()
-> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let dead_wlease = Duration::from_secs(5);
    let wlease = Duration::from_millis(600);
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let mut dead = crate::support::worker::start(&server.url(), &["default", "clock"]);
    dead.post(&format!(
        "acquire job 10000 30000 renew notify wlease={}",
        dead_wlease.as_millis()
    ));
    let dead_member = queued(&server, &keys, 1).await?.remove(0);
    let b_client = LockClient::connect(&server.url()).await?;
    let b = spawn_acquire(&b_client, "job", &waiter_opts(WaitMode::Notify, wlease));
    let q = queued(&server, &keys, 2).await?;
    ensure!(q[0] == dead_member, "the worker is not the head: {q:?}");
    let dead_token = parse_member(&dead_member)?.token;
    dead.kill();
    // The head queued before B did: after this it has surely waited 20 ms.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let handed = server
        .get(&keys.lock)
        .context("the release handed the lock to nobody")?;
    ensure!(
        handed.starts_with(&format!("{dead_token}:")),
        "the release did not hand the lock to the starving head: {handed:?}"
    );
    let provisional = server.pttl(&keys.lock);
    ensure!(
        provisional <= NOTIFY_HANDOVER_LEASE.as_millis() as i64,
        "the dead head's provisional lease is {provisional} ms"
    );
    let (lease, granted_at) = granted(b, POLL_DEADLINE).await?;
    let waited = granted_at - released_at;
    eprintln!("B granted {waited:?} after the release (its waiter lease {wlease:?})");
    ensure!(
        waited <= wlease / 3 + SLACK,
        "B waited {waited:?} after the release (its waiter lease {wlease:?})"
    );
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Notify, the starvation rule of the release script, with a queued member
/// that no real client owns (so nothing else touches the lock): a head that
/// arrived just now is only woken, and the lock is free after the release
/// (any worker may take it: the negative control); a head that has waited
/// 10 ms or more is handed the lock by the release itself, with a fence
/// above the previous holder's, so a worker that tries at once is refused.
#[tokio::test]
async fn notify_release_hands_the_lock_to_a_head_that_waited_10_ms_and_only_wakes_a_younger_one()
-> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let keys = client.keys("job", KeyLayout::HashTagged)?;
    let time: Vec<String> = server.query(&["TIME"]);
    let now_us: i64 = time[0].parse::<i64>()? * 1_000_000 + time[1].parse::<i64>()?;
    let token = "0b5e7a9c-0000-4000-8000-000000000001";
    let member = format!("ghostclient:7:notify:10000:60000:{token}");
    let lease_end = (now_us / 1000 + 60_000).to_string();
    for (arrived_us, starving) in [(now_us + 60_000_000, false), (now_us - 10_000, true)] {
        let h = client
            .try_acquire("job", &holder_opts(Duration::from_secs(10)))
            .await?;
        server.cmd(&["ZADD", &keys.queue, &arrived_us.to_string(), &member]);
        server.cmd(&["ZADD", &keys.waiters, &lease_end, &member]);
        let h_fence = h.fence();
        ensure!(h.release().await? == ReleaseOutcome::Released);
        let value = server.get(&keys.lock);
        let barger = client
            .try_acquire("job", &LockOptions::default().wait(Duration::ZERO))
            .await;
        if starving {
            let value = value.context("a starving head was not handed the lock")?;
            ensure!(
                value.starts_with(&format!("{token}:")),
                "the lock went to {value:?}"
            );
            ensure!(value_fence(&value)? > h_fence);
            ensure!(
                queue(&server, &keys).is_empty(),
                "the head that got the lock is still queued"
            );
            ensure!(
                matches!(barger, Err(Error::Contended { .. })),
                "a worker took the lock from the starving head: {barger:?}"
            );
        } else {
            ensure!(
                value.is_none(),
                "a head that just arrived was handed the lock ({value:?})"
            );
            ensure!(
                queue(&server, &keys) == vec![member.clone()],
                "the woken head left the queue"
            );
            let barger = barger.context("the free lock was refused to a barging worker")?;
            ensure!(barger.release().await? == ReleaseOutcome::Released);
            server.cmd(&["DEL", &keys.queue, &keys.waiters]);
        }
    }
    Ok(())
}

/// Notify, end to end: a worker that releases and at once takes the lock
/// again cannot keep it from a real waiter that has waited 10 ms: the
/// release hands the lock to the waiter (new fence), the worker's retry is
/// refused, and the waiter's `acquire` returns the handed-over lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_waiter_that_waited_10_ms_gets_the_lock_ahead_of_the_releasing_worker() -> Result<()>
{
    let TestRedis {
        server,
        client: worker,
    } = TestRedis::start().await?;
    let keys = worker.keys("job", KeyLayout::HashTagged)?;
    let h = worker
        .try_acquire("job", &holder_opts(Duration::from_secs(10)))
        .await?;
    let waiter_client = LockClient::connect(&server.url()).await?;
    // 30 s waiter lease: the waiter retries by itself only every 10 s.
    let waiter = spawn_acquire(
        &waiter_client,
        "job",
        &waiter_opts(WaitMode::Notify, Duration::from_secs(30)),
    );
    queued(&server, &keys, 1).await?;
    // Its arrival was recorded before it showed in the queue: after this
    // sleep it has waited at least 20 ms.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let h_fence = h.fence();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    let again = worker
        .try_acquire("job", &holder_opts(Duration::from_secs(10)))
        .await;
    ensure!(
        matches!(again, Err(Error::Contended { .. })),
        "the releasing worker took the lock back: {again:?}"
    );
    let (lease, _) = granted(waiter, POLL_DEADLINE).await?;
    ensure!(lease.fence() > h_fence);
    // Handed over for 100 ms; its keeper renews it to the full ttl at once.
    poll(
        "the renewal of the handed-over lease",
        POLL_DEADLINE,
        || (lease.remaining() > Duration::from_secs(5)).then_some(()),
    )
    .await?;
    ensure!(!lease.is_lost());
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair, waiters with different waiter leases on one name: a waiter with a
/// long lease (30 s, so it renews its place every 10 s) queued at the head
/// keeps its place when a short-lease waiter (300 ms) behind it leaves, and
/// the holder's next release hands the lock to it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_long_lease_head_keeps_its_place_after_a_short_lease_waiter_leaves() -> Result<()>
{
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(60)))
        .await?;
    let long_client = LockClient::connect(&server.url()).await?;
    let long = spawn_acquire(
        &long_client,
        "job",
        &waiter_opts(WaitMode::Fair, Duration::from_secs(30)),
    );
    let head = queued(&server, &keys, 1).await?.remove(0);
    let short_client = LockClient::connect(&server.url()).await?;
    let short = spawn_acquire(
        &short_client,
        "job",
        &waiter_opts(WaitMode::Fair, Duration::from_millis(300)),
    );
    queued(&server, &keys, 2).await?;
    short.abort();
    ensure!(short.await.is_err_and(|e| e.is_cancelled()));
    poll(
        "the short-lease waiter to leave",
        Duration::from_secs(2),
        || (queue(&server, &keys) == [head.clone()]).then_some(()),
    )
    .await?;
    // Longer than twice the short waiter lease, on purpose; far shorter than
    // the head's own 30 s lease.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let still_queued = queue(&server, &keys) == [head.clone()];
    let queue_pttl = server.pttl(&keys.queue);
    let h_fence = h.fence();
    let released_at = Instant::now();
    ensure!(h.release().await? == ReleaseOutcome::Released);
    // The head's own retry is 10 s away: only the hand-over explains a
    // grant within 2 s.
    let outcome = granted(long, Duration::from_secs(2)).await;
    let grant = match &outcome {
        Ok((_, at)) => format!("granted {:?} after the release", *at - released_at),
        Err(e) => format!("{e:#}"),
    };
    eprintln!("head still queued after 1 s: {still_queued} (queue PTTL {queue_pttl} ms); {grant}");
    ensure!(
        still_queued,
        "the head (waiter lease 30 s) lost its place 1 s after a 300 ms-lease waiter left (queue PTTL {queue_pttl} ms); after the release: {grant}"
    );
    let (lease, granted_at) = outcome?;
    let waited = granted_at - released_at;
    ensure!(
        waited <= WAKE_BOUND,
        "the head was granted {waited:?} after the release"
    );
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Creates an ACL user with every command and key but no pub/sub channel
/// (`resetchannels`) and returns its URL.
fn user_without_channels(server: &RedisServer) -> String {
    server.cmd(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">app-pw",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    format!("redis://app:app-pw@{}/", server.addr())
}

/// Notify and fair waiters whose Redis user may not use pub/sub channels
/// (`resetchannels`, the default for new ACL users since Redis 7) cannot
/// subscribe: they fall back to polling (no queue entry) and still acquire
/// soon after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_without_pubsub_permission_fall_back_to_polling() -> Result<()> {
    let server = RedisServer::start();
    let url = user_without_channels(&server);
    let holder = LockClient::connect(&url).await?;
    let waiter = LockClient::connect(&url).await?;
    for mode in [WaitMode::Notify, WaitMode::Fair] {
        let name = format!("job-{mode:?}");
        let keys = holder.keys(&name, KeyLayout::HashTagged)?;
        let h = holder
            .try_acquire(&name, &holder_opts(Duration::from_secs(30)))
            .await?;
        let scripts_before = server.script_calls();
        let task = spawn_acquire(&waiter, &name, &waiter_opts(mode, Duration::from_secs(30)));
        poll("the waiter's first attempts", POLL_DEADLINE, || {
            (server.script_calls() >= scripts_before + 2).then_some(())
        })
        .await?;
        ensure!(
            queue(&server, &keys).is_empty(),
            "{mode:?}: a waiter that cannot subscribe was queued"
        );
        ensure!(!task.is_finished());
        let h_fence = h.fence();
        let released_at = Instant::now();
        ensure!(h.release().await? == ReleaseOutcome::Released);
        let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
        let waited = granted_at - released_at;
        ensure!(
            waited <= Duration::from_millis(200) + SLACK,
            "{mode:?}: granted {waited:?} after the release"
        );
        ensure!(lease.fence() > h_fence);
        ensure!(lease.release().await? == ReleaseOutcome::Released);
    }
    Ok(())
}

/// A holder whose Redis user may not publish (no channel permission)
/// releases a lock that a waiter with channel permission is queued on: the
/// release succeeds (it must never fail because a wake-up cannot be sent),
/// and the waiter still gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_by_a_user_without_pubsub_permission_succeeds_with_waiters_queued() -> Result<()> {
    let server = RedisServer::start();
    let holder = LockClient::connect(&user_without_channels(&server)).await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let keys = holder.keys("job", KeyLayout::HashTagged)?;
    let h = holder
        .try_acquire("job", &holder_opts(Duration::from_secs(30)))
        .await?;
    let task = spawn_acquire(
        &waiter,
        "job",
        &waiter_opts(WaitMode::Notify, Duration::from_millis(900)),
    );
    queued(&server, &keys, 1).await?;
    let h_fence = h.fence();
    let released = h.release().await;
    ensure!(
        matches!(released, Ok(ReleaseOutcome::Released)),
        "the release returned {released:?} (lock key now {:?})",
        server.get(&keys.lock)
    );
    let (lease, _) = granted(task, POLL_DEADLINE).await?;
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// A client that waited on more names than it keeps subscribed (256 idle
/// channels) drops idle subscriptions and subscribes again when it waits on
/// an evicted name: the release still wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_wake_ups_work_after_idle_subscriptions_are_dropped() -> Result<()> {
    let TestRedis {
        server,
        client: holder,
    } = TestRedis::start().await?;
    let waiter = LockClient::connect(&server.url()).await?;
    let opts = waiter_opts(WaitMode::Notify, Duration::from_secs(30));
    // An uncontended notify acquire with a wait subscribes for the name.
    for i in 0..300 {
        waiter
            .acquire(&format!("n{i}"), &opts)
            .await?
            .release()
            .await?;
    }
    let channels: Vec<String> = server.query(&["PUBSUB", "CHANNELS", "lock:*"]);
    ensure!(
        channels.len() <= 256,
        "{} channels still subscribed",
        channels.len()
    );
    for name in ["n0", "n299"] {
        let woken = wake_up_once(&server, &holder, &waiter, name, &opts).await?;
        ensure!(
            woken.release_to_grant <= WAKE_BOUND && woken.subscribers == 1,
            "{name}: {woken:?}"
        );
    }
    Ok(())
}

/// 8 tasks, each with its own client, run `cycles` acquire → release cycles
/// each on one name in `mode`; a shared counter checks that no two are ever
/// inside at once, and the fences, in grant order, must strictly increase.
async fn contended_grants(mode: WaitMode, cycles: usize) -> Result<()> {
    const TASKS: usize = 8;
    let server = RedisServer::start();
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(120))
        .wait_mode(mode);
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = LockClient::connect(&server.url()).await?;
        let (opts, inside, overlaps, order) = (
            opts.clone(),
            inside.clone(),
            overlaps.clone(),
            order.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut grants = Vec::with_capacity(cycles);
            for cycle in 0..cycles {
                let lease = client
                    .acquire("hot", &opts)
                    .await
                    .with_context(|| format!("task {task}, cycle {cycle}"))?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                grants.push((order.fetch_add(1, Ordering::SeqCst), lease.fence(), task));
                // Give any other holder a chance to run while this one is in.
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let outcome = lease.release().await?;
                ensure!(
                    outcome == ReleaseOutcome::Released,
                    "task {task}, cycle {cycle}: {outcome:?}"
                );
            }
            Ok(grants)
        }));
    }
    let mut grants = Vec::with_capacity(TASKS * cycles);
    for task in tasks {
        grants.extend(task.await??);
    }
    let elapsed = started.elapsed();
    grants.sort_by_key(|(order, _, _)| *order);
    let mut per_task = [0usize; TASKS];
    for (_, _, task) in &grants {
        per_task[*task] += 1;
    }
    eprintln!(
        "{mode:?}: {} grants in {elapsed:?} ({:.0}/s)",
        grants.len(),
        grants.len() as f64 / elapsed.as_secs_f64()
    );
    ensure!(
        overlaps.load(Ordering::SeqCst) == 0,
        "{mode:?}: holders overlapped"
    );
    ensure!(grants.len() == TASKS * cycles);
    for pair in grants.windows(2) {
        let ((i, a, ta), (_, b, tb)) = (pair[0], pair[1]);
        ensure!(
            b > a,
            "{mode:?}: grant {} (task {tb}) has fence {b} after {a} (task {ta})",
            i + 1
        );
    }
    ensure!(
        server.query::<i64>(&["EXISTS", "lock:{hot}"]) == 0,
        "the lock is still held"
    );
    Ok(())
}

/// 10,000 contended grants in poll mode: no overlap, increasing fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_poll_ten_thousand_contended_grants_never_overlap_and_fences_increase() -> Result<()>
{
    contended_grants(WaitMode::Poll, 1250).await
}

/// 10,000 contended grants in notify mode: no overlap, increasing fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_ten_thousand_contended_grants_never_overlap_and_fences_increase() -> Result<()>
{
    contended_grants(WaitMode::Notify, 1250).await
}

/// 10,000 contended grants in fair mode (each one a hand-over through the
/// queue): no overlap, increasing fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_ten_thousand_contended_grants_never_overlap_and_fences_increase() -> Result<()>
{
    contended_grants(WaitMode::Fair, 1250).await
}
