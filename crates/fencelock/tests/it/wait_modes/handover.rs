//! Hand-over, where the release itself grants the lock to the head of the
//! queue: fair mode always, notify mode once the head has waited 10 ms
//! (ahead of a worker taking the lock back; a head that arrived just now is
//! only woken). The release of a contended lease is sent behind a `PING`
//! so the next holder is woken first; a handed-over lease is renewed to its
//! full ttl at once; a hand-over whose message is lost is picked up by the
//! waiter's retry with the same fence; a hand-over wake-up is trusted only
//! with a fence above the one the waiter saw refused.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{Error, Fence, KeyLayout, LockOptions, ReleaseOutcome, Renewal, WaitMode};
use fencelock_testkit::RedisServer;

use super::{SLACK, handed_over};
use crate::support::fixture::{
    Fixture, granted, holder_opts, parse_member, queue, queued, release, spawn_acquire,
    subscribers, value_fence, waiter_opts,
};
use crate::support::{Keys, POLL_DEADLINE, TestRedis, poll};

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

/// Fair hand-over: the release grants the lock to the head for its waiter
/// lease (1 s) only; the new holder renews it to the full ttl at once —
/// also with renewal off — keeps it past the provisional 1 s, gets a
/// greater fence than the previous holder, and releases it normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_handed_over_lease_is_renewed_to_the_full_ttl_at_once() -> Result<()> {
    let f = Fixture::start().await?;
    let wlease = Duration::from_secs(1);
    let ttl = Duration::from_secs(10);
    for renewal in [Renewal::Off, Renewal::Auto] {
        let name = format!("job-{renewal:?}");
        let keys = f.holder.keys(&name, KeyLayout::HashTagged)?;
        let h = f.holder.try_acquire(&name, &holder_opts(ttl)).await?;
        let task = spawn_acquire(
            &f.waiter,
            &name,
            &waiter_opts(WaitMode::Fair, wlease)
                .ttl(ttl)
                .renewal(renewal),
        );
        let member = queued(&f.server, &keys, 1).await?.remove(0);
        let token = parse_member(&member)?.token;
        let (h_fence, _) = release(h).await?;
        // The release itself granted the lock to the head.
        let handed = handed_over(&f.server, &keys, &token).context(format!("{renewal:?}"))?;
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
            || (f.server.pttl(keys.lock()) > 9000).then_some(()),
        )
        .await
        .with_context(|| format!("{renewal:?}: PTTL {}", f.server.pttl(keys.lock())))?;
        // Past the provisional lease (on purpose): still held, not lost.
        tokio::time::sleep(wlease + Duration::from_millis(100)).await;
        ensure!(f.server.get(keys.lock()) == Some(handed.clone()));
        ensure!(!lease.is_lost(), "{renewal:?}: {:?}", lease.loss_reason());
        ensure!(
            lease.remaining() > Duration::from_secs(5),
            "{renewal:?}: local deadline {:?} away",
            lease.remaining()
        );
        ensure!(lease.release().await? == ReleaseOutcome::Released);
        ensure!(f.server.get(keys.lock()).is_none());
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
    let f = Fixture::start().await?;
    let wlease = Duration::from_millis(600);
    let h = f.hold(Duration::from_secs(30)).await?;
    let task = f.spawn_waiter(&waiter_opts(WaitMode::Fair, wlease));
    let member = parse_member(&f.queued(1).await?.remove(0))?;
    let token = member.token.clone();
    let channel = member.wake_channel(&f.keys);
    let killed: i64 = f.server.query(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    ensure!(killed == 1, "killed {killed} pub/sub connections");
    let (h_fence, released_at) = release(h).await?;
    let listening = subscribers(&f.server, &channel)?;
    let handed = handed_over(&f.server, &f.keys, &token)?;
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
    ensure!(f.server.get(f.keys.lock()) == Some(handed));
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
    let f = Fixture::start().await?;
    // A hand-over lease (the waiter lease) shorter than the ttl: renewed at
    // once after a hand-over.
    let opts = waiter_opts(WaitMode::Fair, Duration::from_secs(30)).ttl(Duration::from_secs(60));
    let wake = |member: &str, fence: Fence| -> Result<(String, String)> {
        let member = parse_member(member)?;
        let message = fencelock::testing::Wake::HandedOver {
            waiter: member.waiter,
            fence,
        };
        Ok((member.wake_channel(&f.keys), message.to_string()))
    };

    let h = f.hold(Duration::from_secs(30)).await?;
    let task = f.spawn_waiter(&opts);
    let member = f.queued(1).await?.remove(0);
    let (channel, stale) = wake(&member, h.fence())?;
    let before = f.server.script_calls();
    let heard: i64 = f.server.query(&["PUBLISH", &channel, &stale]);
    ensure!(heard == 1, "{heard} subscribers heard the wake-up");
    // The confirmation, then the next attempt, refused.
    poll(
        "the waiter's confirmation and next attempt",
        POLL_DEADLINE,
        || (f.server.script_calls() >= before + 2).then_some(()),
    )
    .await?;
    ensure!(
        !task.is_finished(),
        "a wake-up with the fence seen at the refusal was trusted: {:?}",
        task.await
    );
    ensure!(f.server.get(f.keys.lock()) == Some(format!("{}:{}", h.token(), h.fence())));
    ensure!(f.queue() == vec![member.clone()]);

    // A real hand-over: granted at once, with a fence above.
    let (h_fence, _) = release(h).await?;
    let (lease, _) = granted(task, POLL_DEADLINE).await?;
    ensure!(lease.fence() > h_fence);
    ensure!(lease.release().await? == ReleaseOutcome::Released);

    // Forged, with a fence above the one seen: taken without asking, and
    // lost as soon as the renewal finds the lock is the holder's.
    let h = f.hold(Duration::from_secs(30)).await?;
    let task = f.spawn_waiter(&opts);
    let member = f.queued(1).await?.remove(0);
    let forged = Fence::new(h.fence().get() + 1);
    let (channel, fresh) = wake(&member, forged)?;
    let heard: i64 = f.server.query(&["PUBLISH", &channel, &fresh]);
    ensure!(heard == 1, "{heard} subscribers heard the wake-up");
    let (lease, _) = granted(task, POLL_DEADLINE).await?;
    ensure!(lease.fence() == forged, "fence {}", lease.fence());
    poll("the forged lease lost", Duration::from_secs(1), || {
        lease.is_lost().then_some(())
    })
    .await?;
    ensure!(f.server.get(f.keys.lock()) == Some(format!("{}:{}", h.token(), h.fence())));
    ensure!(h.release().await? == ReleaseOutcome::Released);
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
        server.cmd(&["ZADD", &keys.queue(), &arrived_us.to_string(), &member]);
        server.cmd(&["ZADD", &keys.waiters(), &lease_end, &member]);
        let (h_fence, _) = release(h).await?;
        let value = server.get(keys.lock());
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
            server.cmd(&["DEL", &keys.queue(), &keys.waiters()]);
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
    let f = Fixture::start().await?;
    let h = f.hold(Duration::from_secs(10)).await?;
    // 30 s waiter lease: the waiter retries by itself only every 10 s.
    let waiter = f.spawn_waiter(&waiter_opts(WaitMode::Notify, Duration::from_secs(30)));
    f.queued(1).await?;
    // Its arrival was recorded before it showed in the queue: after this
    // sleep it has waited at least 20 ms.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (h_fence, _) = release(h).await?;
    let again = f.hold(Duration::from_secs(10)).await;
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
