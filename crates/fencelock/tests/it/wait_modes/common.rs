//! What the wait modes share:
//!
//! - what Redis sees while a waiter waits behind a holder (measured here,
//!   checked per mode in `notify` and `poll`);
//! - ACL users without pub/sub permission: notify and fair waiters fall
//!   back to polling, and a release never fails because a wake-up cannot be
//!   published;
//! - every mode: no overlapping holders and strictly increasing fences over
//!   10,000 contended grants.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{KeyLayout, LockClient, LockOptions, ReleaseOutcome, WaitMode};
use fencelock_testkit::RedisServer;
use tokio::time::Instant;

use super::SLACK;
use crate::support::fixture::{
    Fixture, granted, holder_opts, queue, queued, release, release_to_waiter, spawn_acquire,
    waiter_opts,
};
use crate::support::{Keys, POLL_DEADLINE, lock_client, poll};

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

/// What Redis saw while a waiter waited behind a holder for 2 s.
#[derive(Debug)]
pub(super) struct Waited {
    /// Script calls (grant attempts) from just before the waiter started
    /// until just before the release.
    pub(super) scripts: u64,
    /// Every command Redis executed in the 2 s after the waiter's first
    /// attempt (for notify and fair, after it was queued; a refused attempt
    /// alone is about ten: the script and the commands inside it).
    pub(super) commands_after_first_attempt: u64,
    /// From just before the release was sent until the waiter had the lease.
    pub(super) release_to_grant: Duration,
}

/// A waiter in `mode` waits behind a holder that keeps the lock (10 s lease,
/// no renewal) for 2 s after the waiter's first attempt, then releases.
pub(super) async fn wait_behind_a_two_second_holder(mode: WaitMode) -> Result<Waited> {
    let f = Fixture::start().await?;
    let mut admin = redis::Client::open(f.server.url())?.get_connection()?;
    let h = f.hold(Duration::from_secs(10)).await?;
    let scripts_before = f.server.script_calls();
    // A 30 s waiter lease: a queued waiter retries by itself only every 10 s
    // (a third of it) or when the holder's 10 s lease runs out.
    let task = f.spawn_waiter(&waiter_opts(mode, Duration::from_secs(30)));
    // A queued waiter (notify, fair) is counted from when it is queued (a
    // notify waiter's first attempt is not queued: only a refused one
    // registers and queues with its next attempt, at once).
    poll("the waiter's first attempt", POLL_DEADLINE, || {
        let tried = f.server.script_calls() > scripts_before;
        let queued = mode == WaitMode::Poll || !f.queue().is_empty();
        (tried && queued).then_some(())
    })
    .await?;
    let commands_before = total_commands(&mut admin)?;
    // Let the holder keep the lock for 2 s, on purpose.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let commands_after_first_attempt = total_commands(&mut admin)? - commands_before - 1;
    let scripts = f.server.script_calls() - scripts_before;
    ensure!(
        !task.is_finished(),
        "the waiter returned while the lock was held"
    );
    let (h_fence, released_at) = release(h).await?;
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    ensure!(granted_at > released_at, "granted before the release");
    ensure!(
        lease.fence() > h_fence,
        "fence {} after {h_fence}",
        lease.fence()
    );
    ensure!(f.server.get(f.keys.lock()) == Some(format!("{}:{}", lease.token(), lease.fence())));
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(Waited {
        scripts,
        commands_after_first_attempt,
        release_to_grant: granted_at - released_at,
    })
}

/// Creates an ACL user with every command and key but no pub/sub channel
/// (`resetchannels`) and returns its URL.
fn user_without_channels(server: &RedisServer) -> String {
    server.acl_user("app", &["~*", "+@all", "resetchannels"])
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
        let waited = release_to_waiter(h, task, POLL_DEADLINE).await?;
        ensure!(
            waited <= Duration::from_millis(200) + SLACK,
            "{mode:?}: granted {waited:?} after the release"
        );
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
        server.get(keys.lock())
    );
    let (lease, _) = granted(task, POLL_DEADLINE).await?;
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
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
        let client = lock_client(&server).await?;
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
