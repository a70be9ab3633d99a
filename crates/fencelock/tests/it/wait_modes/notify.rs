//! Notify mode: a waiter sleeps until the release wakes it (Redis executes
//! nothing for it meanwhile, unlike a poller), and still acquires when the
//! wake-up is lost (no release message; its subscription killed; Redis
//! restarted, or down for a while) — through its retry when the holder's
//! lease runs out or every third of its waiter lease; a SIGKILLed head
//! delays the next waiter by at most a third of its waiter lease; idle
//! subscriptions dropped past 256 are taken again when needed. How a
//! release hands the lock to a head that has waited 10 ms is in `handover`.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{KeyLayout, Lease, LockOptions, NOTIFY_HANDOVER_LEASE, ReleaseOutcome, WaitMode};
use tokio::time::Instant;

use super::common::wait_behind_a_two_second_holder;
use super::{SLACK, WAKE_BOUND, handed_over, worker_head_and_waiter_behind};
use crate::support::fixture::{
    Fixture, granted, holder_opts, parse_member, queued, release, release_to_waiter, spawn_acquire,
    subscribers, waiter_opts,
};
use crate::support::{Keys, POLL_DEADLINE, poll};

/// Notify: a waiter behind a holder that keeps the lock for 2 s sends its
/// first attempts (refused, then queued) and then nothing (at most 3 script
/// calls in all; no command at all reaches Redis in the 2 s after it was
/// queued) and still has the lock within 100 ms of the release: only the
/// wake-up can explain that, since its own retry was 10 s away. Its
/// negative control is `poll::heavy_poll_waiter_retries_many_times_while_the_lock_is_held`.
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

/// A notify waiter with waiter lease `wlease` queues behind the fixture's
/// holder, then the lock key is deleted behind the scenes: no release script
/// runs, so nothing wakes the waiter. Returns its lease once granted, when
/// it was granted, and when the key was deleted.
async fn granted_after_a_silent_delete(
    f: &Fixture,
    wlease: Duration,
) -> Result<(Lease, Instant, Instant)> {
    let task = f.spawn_waiter(&waiter_opts(WaitMode::Notify, wlease));
    f.queued(1).await?;
    ensure!(f.server.query::<i64>(&["DEL", f.keys.lock()]) == 1);
    let deleted_at = Instant::now();
    let (lease, granted_at) = granted(task, POLL_DEADLINE).await?;
    Ok((lease, granted_at, deleted_at))
}

/// Notify, no release message at all (the holder's lock is deleted behind
/// the scenes, so no release script runs): with a long waiter lease, the
/// waiter retries when the holder's lease would have run out, and acquires
/// then — not before (nothing told it), and not much later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_waiter_without_a_release_message_acquires_when_the_holder_ttl_runs_out()
-> Result<()> {
    let f = Fixture::start().await?;
    let ttl = Duration::from_millis(1500);
    let wlease = Duration::from_secs(30);
    let acquired_at = Instant::now();
    let h = f.hold(ttl).await?;
    let (lease, granted_at, deleted_at) = granted_after_a_silent_delete(&f, wlease).await?;
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
    let f = Fixture::start().await?;
    let wlease = Duration::from_millis(900);
    let h = f.hold(Duration::from_secs(30)).await?;
    let (lease, granted_at, deleted_at) = granted_after_a_silent_delete(&f, wlease).await?;
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
    let f = Fixture::start().await?;
    let h = f.hold(Duration::from_secs(30)).await?;
    let task = f.spawn_waiter(&waiter_opts(WaitMode::Notify, Duration::from_secs(30)));
    let member = f.queued(1).await?.remove(0);
    let channel = parse_member(&member)?.wake_channel(&f.keys);
    ensure!(subscribers(&f.server, &channel)? == 1);
    let scripts_before = f.server.script_calls();
    let killed: i64 = f.server.query(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    ensure!(killed == 1, "killed {killed} pub/sub connections");
    poll(
        "the waiter's retry after the disconnection",
        POLL_DEADLINE,
        || (f.server.script_calls() > scripts_before).then_some(()),
    )
    .await?;
    poll("the resubscription", POLL_DEADLINE, || {
        (subscribers(&f.server, &channel).ok()? == 1).then_some(())
    })
    .await?;
    ensure!(
        !task.is_finished(),
        "the waiter returned while the lock was held"
    );
    let waited = release_to_waiter(h, task, POLL_DEADLINE).await?;
    ensure!(waited <= WAKE_BOUND, "woken {waited:?} after the release");
    Ok(())
}

/// Notify after a Redis restart (no persistence) that left Redis down for
/// `down`: the client that waited on a name before the restart waits on it
/// again behind a new holder, and is woken by that holder's release (its
/// 30 s waiter lease rules out its own retry); also on a name it first waits
/// on after the restart.
async fn wake_ups_survive_a_restart(down: Duration) -> Result<()> {
    let mut f = Fixture::start().await?;
    let wait_opts = waiter_opts(WaitMode::Notify, Duration::from_secs(30));
    // Before the restart: the waiter subscribes for the lock and is woken.
    let before = wake_up_once(&f, &f.name, &wait_opts).await?;
    eprintln!("before the restart: {before:?}");
    ensure!(
        before.release_to_grant <= WAKE_BOUND && before.subscribers == 1,
        "before the restart: {before:?}"
    );

    f.server.kill();
    // Redis stays down for `down`, on purpose.
    tokio::time::sleep(down).await;
    f.server.restart();
    for name in [f.name.as_str(), "other"] {
        let woken = wake_up_once(&f, name, &wait_opts).await.with_context(|| {
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

/// A client that waited on more names than it keeps subscribed (256 idle
/// channels) drops idle subscriptions and subscribes again when it waits on
/// an evicted name: the release still wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_notify_wake_ups_work_after_idle_subscriptions_are_dropped() -> Result<()> {
    let f = Fixture::start().await?;
    let opts = waiter_opts(WaitMode::Notify, Duration::from_secs(30));
    // An uncontended notify acquire with a wait subscribes for the name.
    for i in 0..300 {
        f.waiter
            .acquire(&format!("n{i}"), &opts)
            .await?
            .release()
            .await?;
    }
    let channels: Vec<String> = f.server.query(&["PUBSUB", "CHANNELS", "lock:*"]);
    ensure!(
        channels.len() <= 256,
        "{} channels still subscribed",
        channels.len()
    );
    for name in ["n0", "n299"] {
        let woken = wake_up_once(&f, name, &opts).await?;
        ensure!(
            woken.release_to_grant <= WAKE_BOUND && woken.subscribers == 1,
            "{name}: {woken:?}"
        );
    }
    Ok(())
}

/// How a waiter was woken by [`wake_up_once`].
#[derive(Debug)]
struct WakeUp {
    /// Release sent → lease granted.
    release_to_grant: Duration,
    /// Subscribers on the waiter's wake-up channel when the release was sent.
    subscribers: i64,
}

/// The fixture's holder takes `name` (retrying while Redis comes back), its
/// waiter queues behind it with `wait_opts`; once the waiter's wake-up
/// channel has a subscriber (or 3 s passed without one: the release then
/// shows what a waiter without a subscription gets), the holder releases.
async fn wake_up_once(f: &Fixture, name: &str, wait_opts: &LockOptions) -> Result<WakeUp> {
    let keys = f.holder.keys(name, KeyLayout::HashTagged)?;
    let h = f
        .holder
        .acquire(
            name,
            &holder_opts(Duration::from_secs(30))
                .wait(Duration::from_secs(10))
                .wait_mode(WaitMode::Poll),
        )
        .await
        .context("the holder's acquire")?;
    let task = spawn_acquire(&f.waiter, name, wait_opts);
    let member = queued(&f.server, &keys, 1).await?.remove(0);
    let channel = parse_member(&member)?.wake_channel(&keys);
    let _ = poll(
        &format!("a subscriber on {channel}"),
        Duration::from_secs(3),
        || (subscribers(&f.server, &channel).ok()? == 1).then_some(()),
    )
    .await;
    let subscribers = subscribers(&f.server, &channel)?;
    ensure!(
        !task.is_finished(),
        "the waiter returned while the lock was held"
    );
    let release_to_grant = release_to_waiter(h, task, Duration::from_secs(20)).await?;
    Ok(WakeUp {
        release_to_grant,
        subscribers,
    })
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
    let f = Fixture::start().await?;
    let dead_wlease = Duration::from_secs(5);
    let wlease = Duration::from_millis(600);
    let h = f.hold(Duration::from_secs(30)).await?;
    let b_opts = waiter_opts(WaitMode::Notify, wlease);
    let (mut dead, dead_member, b) =
        worker_head_and_waiter_behind(&f, "notify", dead_wlease, &b_opts).await?;
    let dead_token = parse_member(&dead_member)?.token;
    dead.kill();
    // The head queued before B did: after this it has surely waited 20 ms.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (h_fence, released_at) = release(h).await?;
    handed_over(&f.server, &f.keys, &dead_token)?;
    let provisional = f.server.pttl(f.keys.lock());
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
