//! Fair mode: waiters are granted in queue order; a SIGKILLed, timed-out or
//! cancelled waiter does not hold up the ones behind it; a waiter with a
//! long waiter lease keeps its place when one with a short lease leaves;
//! `try_acquire` honours the queue. How a release hands the lock to the head
//! is in `handover`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{Error, Fence, LockOptions, ReleaseOutcome, WaitMode};
use fencelock_testkit::RedisServer;

use super::{SLACK, WAKE_BOUND, handed_over, worker_head_and_waiter_behind};
use crate::support::fixture::{
    Fixture, granted, parse_member, release, release_to_waiter, spawn_acquire, value_fence,
    waiter_opts,
};
use crate::support::{Keys, POLL_DEADLINE, poll};

/// Fair: 8 waiters, each with its own client, queued one by one (each seen
/// in the queue before the next starts) behind a holder, are granted in
/// exactly that order once the holder releases, with increasing fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_waiters_are_granted_in_queue_order() -> Result<()> {
    const WAITERS: usize = 8;
    let f = Fixture::start().await?;
    let h = f.hold(Duration::from_secs(60)).await?;
    let opts = waiter_opts(WaitMode::Fair, Duration::from_secs(3)).wait(Duration::from_secs(60));
    let grants: Arc<Mutex<Vec<(usize, Fence)>>> = Arc::default();
    let mut tasks = Vec::new();
    let mut expected_queue: Vec<String> = Vec::new();
    for i in 0..WAITERS {
        let client = f.client().await?;
        let (name, opts, grants) = (f.name.clone(), opts.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire(&name, &opts).await?;
            grants
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((i, lease.fence()));
            lease.release().await
        }));
        let q = f.queued(i + 1).await?;
        ensure!(
            q[..i] == expected_queue[..],
            "waiter {i} did not join at the tail: {q:?}"
        );
        expected_queue = q;
    }
    let (h_fence, _) = release(h).await?;
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
    ensure!(f.queue().is_empty(), "the queue is not empty");
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
    let f = Fixture::start().await?;
    let wlease = Duration::from_millis(300);
    let h = f.hold(Duration::from_secs(30)).await?;

    let b_opts = waiter_opts(WaitMode::Fair, wlease);
    let (mut dead, dead_member, b) =
        worker_head_and_waiter_behind(&f, "fair", wlease, &b_opts).await?;
    let dead_token = parse_member(&dead_member)?.token;

    // Kill the head right after it renewed its place, so its waiter lease is
    // surely live when the holder releases a moment later.
    let score = |server: &RedisServer| -> Option<String> {
        server.query(&["ZSCORE", &f.keys.waiters(), &dead_member])
    };
    let first = score(&f.server);
    poll("a renewal of the worker's place", POLL_DEADLINE, || {
        let now = score(&f.server);
        (now.is_some() && now != first).then_some(())
    })
    .await?;
    dead.kill();
    let (h_fence, released_at) = release(h).await?;
    let handed = handed_over(&f.server, &f.keys, &dead_token)?;
    let provisional = f.server.pttl(f.keys.lock());
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
    ensure!(!f.queue().contains(&dead_member));
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// Fair: a waiter that times out leaves the queue at once (within 1 s of
/// its `Timeout`, from a background task), and the waiter behind it is
/// handed the lock at the next release — it is not held up by the long
/// (10 s) waiter lease of the one that gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_waiter_that_times_out_leaves_the_queue() -> Result<()> {
    let f = Fixture::start().await?;
    let wlease = Duration::from_secs(10);
    let h = f.hold(Duration::from_secs(60)).await?;
    let quitter =
        f.spawn_waiter(&waiter_opts(WaitMode::Fair, wlease).wait(Duration::from_millis(1500)));
    let quitter_member = f.queued(1).await?.remove(0);
    let next_client = f.client().await?;
    let next = spawn_acquire(&next_client, &f.name, &waiter_opts(WaitMode::Fair, wlease));
    let q = f.queued(2).await?;
    ensure!(q[0] == quitter_member, "{q:?}");

    match tokio::time::timeout(POLL_DEADLINE, quitter).await?? {
        Err(Error::Timeout { .. }) => {}
        other => bail!("expected a timeout, got {other:?}"),
    }
    let left = poll(
        "the quitter to leave the queue",
        Duration::from_secs(1),
        || {
            let gone = !f.queue().contains(&quitter_member)
                && f.server
                    .query::<Option<String>>(&["ZSCORE", &f.keys.waiters(), &quitter_member])
                    .is_none();
            gone.then_some(())
        },
    )
    .await;
    left.context("the timed-out waiter is still queued")?;
    ensure!(f.queue().len() == 1);

    let waited = release_to_waiter(h, next, POLL_DEADLINE).await?;
    ensure!(
        waited <= WAKE_BOUND,
        "the next waiter was granted {waited:?} after the release"
    );
    Ok(())
}

/// Fair: a free lock reserved for the live head of its queue is refused to
/// a fair `try_acquire` (`Contended`, no remaining lease, nothing changed),
/// while a poll-mode `try_acquire` jumps the queue — the documented reason
/// to use one mode per name. The poll holder's release then hands the lock
/// to the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_try_acquire_respects_the_queue_and_poll_jumps_it() -> Result<()> {
    let f = Fixture::start().await?;
    let h = f.hold(Duration::from_secs(60)).await?;
    // 30 s waiter lease: the head retries by itself only every 10 s.
    let head = f.spawn_waiter(&waiter_opts(WaitMode::Fair, Duration::from_secs(30)));
    let q = f.queued(1).await?;
    // Free the lock behind everyone's back: no release, so no hand-over.
    ensure!(f.server.query::<i64>(&["DEL", f.keys.lock()]) == 1);

    let fair = LockOptions::default().wait_mode(WaitMode::Fair);
    match f.holder.try_acquire(&f.name, &fair).await {
        Err(Error::Contended {
            remaining: None, ..
        }) => {}
        other => bail!("a fair try_acquire of a reserved lock returned {other:?}"),
    }
    ensure!(
        f.server.get(f.keys.lock()).is_none(),
        "the refused try changed the lock"
    );
    ensure!(f.queue() == q, "the refused try changed the queue");

    let jumper = f
        .holder
        .try_acquire(&f.name, &LockOptions::default().wait_mode(WaitMode::Poll))
        .await
        .context("a poll try_acquire does not honour the fair queue")?;
    ensure!(jumper.fence() > h.fence());
    ensure!(!head.is_finished());
    let waited = release_to_waiter(jumper, head, POLL_DEADLINE).await?;
    ensure!(
        waited <= WAKE_BOUND,
        "the head was granted {waited:?} after the release"
    );
    Ok(())
}

/// Fair: a queued waiter whose `acquire` future is dropped (its task
/// aborted) leaves the queue from the background, so the holder's release
/// hands the lock to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_cancelled_waiter_leaves_the_queue() -> Result<()> {
    let f = Fixture::start().await?;
    let h = f.hold(Duration::from_secs(60)).await?;
    let task = f.spawn_waiter(&waiter_opts(WaitMode::Fair, Duration::from_secs(30)));
    f.queued(1).await?;
    task.abort();
    ensure!(
        task.await.is_err_and(|e| e.is_cancelled()),
        "the waiter was not cancelled"
    );
    poll(
        "the cancelled waiter to leave the queue",
        Duration::from_secs(2),
        || {
            let waiters: i64 = f.server.query(&["ZCARD", &f.keys.waiters()]);
            (f.queue().is_empty() && waiters == 0).then_some(())
        },
    )
    .await?;
    ensure!(h.release().await? == ReleaseOutcome::Released);
    ensure!(
        f.server.get(f.keys.lock()).is_none(),
        "the release handed the lock to a cancelled waiter"
    );
    Ok(())
}

/// Fair, waiters with different waiter leases on one name: a waiter with a
/// long lease (30 s, so it renews its place every 10 s) queued at the head
/// keeps its place when a short-lease waiter (300 ms) behind it leaves, and
/// the holder's next release hands the lock to it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_fair_long_lease_head_keeps_its_place_after_a_short_lease_waiter_leaves() -> Result<()>
{
    let f = Fixture::start().await?;
    let h = f.hold(Duration::from_secs(60)).await?;
    let long = f.spawn_waiter(&waiter_opts(WaitMode::Fair, Duration::from_secs(30)));
    let head = f.queued(1).await?.remove(0);
    let short_client = f.client().await?;
    let short = spawn_acquire(
        &short_client,
        &f.name,
        &waiter_opts(WaitMode::Fair, Duration::from_millis(300)),
    );
    f.queued(2).await?;
    short.abort();
    ensure!(short.await.is_err_and(|e| e.is_cancelled()));
    poll(
        "the short-lease waiter to leave",
        Duration::from_secs(2),
        || (f.queue() == [head.clone()]).then_some(()),
    )
    .await?;
    // Longer than twice the short waiter lease, on purpose; far shorter than
    // the head's own 30 s lease.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let still_queued = f.queue() == [head.clone()];
    let queue_pttl = f.server.pttl(&f.keys.queue());
    let (h_fence, released_at) = release(h).await?;
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
