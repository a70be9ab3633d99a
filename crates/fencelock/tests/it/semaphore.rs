//! The fenced semaphore on Redis (`LockOptions::permits`): N holders at
//! once, each in its own slot with a fence from the name's one counter.
//!
//! - slots: the lowest free slot, fences growing across slots, a full
//!   semaphore refused, a freed slot taken again;
//! - safety under contention in every wait mode: never more than N valid
//!   holders, never two in one slot, fences strictly increasing in grant
//!   order; with a negative control (the same workers on a mutex-sized
//!   count of 1 never overlap, so the count is what lets N in);
//! - lapse and renewal: a permit that is not renewed lapses and its slot is
//!   taken; renewed permits (in the keeper's batches, with mutexes) last;
//! - waiting: a notify waiter is woken when any slot frees; fair waiters
//!   are served in queue order across permits;
//! - conflicts: a mutex and a semaphore on one name, two permit counts;
//!   bad permit counts and the guide layout refused before anything is
//!   sent;
//! - inspect and lock names show a semaphore's holders per slot.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, KeyLayout, LockClient, LockOptions, LockState, LossReason, ReleaseOutcome, Renewal,
    WaitMode,
};
use fencelock_testkit::RedisServer;
use tokio::sync::Mutex;

use crate::support::{Keys, POLL_DEADLINE, TestRedis};

fn permits(client: &LockClient, n: u32) -> LockOptions {
    client.options().permits(n).ttl(Duration::from_secs(5))
}

#[tokio::test]
async fn a_semaphore_gives_the_lowest_free_slot_and_refuses_when_full() -> Result<()> {
    let t = TestRedis::start().await?;
    let opts = permits(&t.client, 3);
    let mut leases = Vec::new();
    for want in 0..3 {
        let lease = t.client.try_acquire("jobs", &opts).await?;
        ensure!(lease.slot() == Some(want), "slot {:?}", lease.slot());
        if let Some(last) = leases.last() {
            let last: &fencelock::Lease = last;
            ensure!(
                lease.fence() > last.fence(),
                "fences must grow across slots"
            );
        }
        leases.push(lease);
    }
    match t.client.try_acquire("jobs", &opts).await {
        Err(Error::Contended {
            name,
            remaining: Some(left),
        }) => ensure!(name == "jobs" && left <= Duration::from_secs(5)),
        other => bail!("a full semaphore must refuse, got {other:?}"),
    }
    // Slot 1 freed: the next permit takes it, with a higher fence.
    let top = leases.iter().map(|l| l.fence()).max().context("fence")?;
    let middle = leases.remove(1);
    ensure!(middle.release().await?.is_released());
    let again = t.client.try_acquire("jobs", &opts).await?;
    ensure!(again.slot() == Some(1) && again.fence() > top);
    // The key holds the count and one field per held slot.
    let stored = t.server.hgetall(again.key());
    ensure!(stored.get("permits").map(String::as_str) == Some("3"));
    ensure!(stored.len() == 4, "{stored:?}");
    // A mutex lease has no slot.
    let mutex = t.client.try_acquire("plain", &t.client.options()).await?;
    ensure!(mutex.slot().is_none());
    for lease in leases.into_iter().chain([again, mutex]) {
        ensure!(lease.release().await?.is_released());
    }
    // Nobody holds it: the semaphore key is gone (the fence key stays).
    ensure!(!t.server.exists("lock:{jobs}"));
    ensure!(t.server.exists("lock:{jobs}:fence"));
    Ok(())
}

/// The largest number of valid holders seen at once, and slots held twice.
#[derive(Default)]
struct Overlap {
    now: AtomicU32,
    most: AtomicU32,
}

/// `workers` tasks each take a permit of `n` `cycles` times, hold it for a
/// moment and release it, checking slots and fences as they go.
async fn contend(
    server: &RedisServer,
    n: u32,
    mode: WaitMode,
    workers: usize,
    cycles: usize,
) -> Result<u32> {
    let overlap = Arc::new(Overlap::default());
    let slots = Arc::new(Mutex::new(BTreeSet::new()));
    let last_fence = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let client = LockClient::connect(&server.url()).await?;
        let (overlap, slots, last_fence) = (overlap.clone(), slots.clone(), last_fence.clone());
        tasks.push(tokio::spawn(async move {
            let opts = client
                .options()
                .permits(n)
                .wait_mode(mode)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(30));
            for _ in 0..cycles {
                let lease = client.acquire("pool", &opts).await?;
                let slot = lease.slot().context("a permit has a slot")?;
                ensure!(slot < n, "slot {slot} of {n}");
                {
                    let mut held = slots.lock().await;
                    ensure!(held.insert(slot), "slot {slot} held twice");
                    // Grants happen one at a time in Redis; the fence read
                    // under the same mutex as the slot set is in grant order
                    // for the holders inside it.
                    let previous = last_fence.fetch_max(lease.fence().get(), Ordering::SeqCst);
                    ensure!(
                        lease.fence().get() != previous,
                        "fence {} issued twice",
                        lease.fence()
                    );
                }
                let now = overlap.now.fetch_add(1, Ordering::SeqCst) + 1;
                overlap.most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(300)).await;
                overlap.now.fetch_sub(1, Ordering::SeqCst);
                slots.lock().await.remove(&slot);
                ensure!(!lease.is_lost(), "a permit was lost while held");
                ensure!(lease.release().await?.is_released());
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(overlap.most.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_never_more_than_n_holders_in_every_wait_mode() -> Result<()> {
    let server = RedisServer::start();
    for mode in [WaitMode::Poll, WaitMode::Notify, WaitMode::Fair] {
        let most = contend(&server, 3, mode, 8, 25).await?;
        ensure!(most <= 3, "{mode:?}: {most} holders at once with 3 permits");
        // Not a vacuous bound: several held at once.
        ensure!(
            most >= 2,
            "{mode:?}: the permits were never shared ({most})"
        );
    }
    // Negative control: one permit never lets two in.
    let most = contend(&server, 1, WaitMode::Notify, 6, 20).await?;
    ensure!(most == 1, "one permit let {most} in");
    Ok(())
}

#[tokio::test]
async fn a_permit_not_renewed_lapses_and_its_slot_is_taken() -> Result<()> {
    let t = TestRedis::start().await?;
    let short = t
        .client
        .options()
        .permits(1)
        .ttl(Duration::from_millis(200))
        .renewal(Renewal::Off);
    let lapsing = t.client.try_acquire("lapse", &short).await?;
    tokio::time::timeout(Duration::from_secs(5), lapsing.lost()).await?;
    ensure!(lapsing.loss_reason() == Some(LossReason::DeadlinePassed));
    // The slot is free once the permit's deadline passed on the server.
    let next = crate::support::poll_async("the lapsed slot to be free", POLL_DEADLINE, || async {
        Ok(t.client
            .try_acquire("lapse", &permits(&t.client, 1))
            .await
            .ok())
    })
    .await?;
    ensure!(next.slot() == Some(0) && next.fence() > lapsing.fence());
    // The lapsed permit's release and renewal touch nothing.
    ensure!(matches!(
        lapsing.release().await?,
        ReleaseOutcome::NotOurs(LossReason::TakenOver)
    ));
    ensure!(!next.is_lost());
    ensure!(next.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn permits_are_renewed_in_batches_with_mutexes() -> Result<()> {
    let t = TestRedis::start().await?;
    let ttl = Duration::from_millis(300);
    let sem = t.client.options().permits(2).ttl(ttl);
    let a = t.client.try_acquire("renewed", &sem).await?;
    let b = t.client.try_acquire("renewed", &sem).await?;
    let m = t
        .client
        .try_acquire("renewed-mutex", &t.client.options().ttl(ttl))
        .await?;
    tokio::time::sleep(ttl * 4).await;
    for lease in [&a, &b, &m] {
        ensure!(!lease.is_lost(), "{} lost", lease.name());
    }
    // Explicit extends too.
    a.extend().await?;
    match t.client.inspect("renewed", KeyLayout::HashTagged).await? {
        LockState::Semaphore {
            permits: 2,
            holders,
            last_fence: Some(last),
        } => {
            ensure!(holders.len() == 2);
            ensure!(holders[0].slot == 0 && holders[0].holder == a.holder_id());
            ensure!(holders[1].slot == 1 && holders[1].fence == Some(b.fence()));
            ensure!(last == b.fence());
            ensure!(holders.iter().all(|h| h.remaining <= ttl));
        }
        other => bail!("inspect showed {other:?}"),
    }
    let names = t.client.lock_names("*", KeyLayout::HashTagged).await?;
    ensure!(names == ["renewed", "renewed-mutex"], "{names:?}");
    for lease in [a, b, m] {
        ensure!(lease.release().await?.is_released());
    }
    ensure!(matches!(
        t.client.inspect("renewed", KeyLayout::HashTagged).await?,
        LockState::Free {
            last_fence: Some(_)
        }
    ));
    Ok(())
}

#[tokio::test]
async fn a_waiter_is_woken_when_any_slot_frees() -> Result<()> {
    let t = TestRedis::start().await?;
    let opts = permits(&t.client, 2).wait(Duration::from_secs(10));
    let a = t.client.try_acquire("woken", &opts).await?;
    let b = t.client.try_acquire("woken", &opts).await?;
    let waiter = {
        let client = LockClient::connect(&t.server.url()).await?;
        let opts = opts.clone();
        tokio::spawn(async move { client.acquire("woken", &opts).await })
    };
    crate::support::poll_async("the waiter to queue", POLL_DEADLINE, || async {
        Ok((t.client.waiters("woken", KeyLayout::HashTagged).await? == 1).then_some(()))
    })
    .await?;
    let released_at = tokio::time::Instant::now();
    ensure!(b.release().await?.is_released());
    let got = waiter.await??;
    // Woken by the release, not by the holders' 5 s leases running out.
    ensure!(released_at.elapsed() < Duration::from_secs(2));
    ensure!(got.slot() == Some(1));
    ensure!(got.release().await?.is_released() && a.release().await?.is_released());
    Ok(())
}

/// Fair waiters take permits in queue order: with two permits held and four
/// waiters queued, each release frees one slot, and the first waiter still
/// waiting gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_served_in_queue_order_across_permits() -> Result<()> {
    let t = TestRedis::start().await?;
    let opts = permits(&t.client, 2)
        .wait_mode(WaitMode::Fair)
        .wait(Duration::from_secs(20));
    let mut held = vec![
        t.client.try_acquire("fifo", &opts).await?,
        t.client.try_acquire("fifo", &opts).await?,
    ];
    let (granted, mut grants) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..4usize {
        let client = LockClient::connect(&t.server.url()).await?;
        let (opts, granted) = (opts.clone(), granted.clone());
        tokio::spawn(async move {
            let _ = granted.send((i, client.acquire("fifo", &opts).await));
        });
        // Queue one at a time, so the queue order is i.
        crate::support::poll_async("the waiter to queue", POLL_DEADLINE, || async {
            Ok(
                (t.client.waiters("fifo", KeyLayout::HashTagged).await? == i as u64 + 1)
                    .then_some(()),
            )
        })
        .await?;
    }
    // One slot frees at a time: the next waiter in the queue gets it.
    for expected in 0..4usize {
        ensure!(held.remove(0).release().await?.is_released());
        let (i, lease) = tokio::time::timeout(POLL_DEADLINE, grants.recv())
            .await?
            .context("a waiter ended")?;
        ensure!(
            i == expected,
            "waiter {i} got the freed slot, not waiter {expected}"
        );
        held.push(lease?);
    }
    for lease in held {
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}

/// A free slot is reserved for the fair queue's first live waiter: a fair
/// newcomer is refused while that waiter has not come for it. Negative
/// control: a notify newcomer, which honours no reservation, takes it.
#[tokio::test]
async fn a_freed_slot_is_reserved_for_the_first_fair_waiter() -> Result<()> {
    let t = TestRedis::start().await?;
    let fair = permits(&t.client, 1).wait_mode(WaitMode::Fair);
    let held = t.client.try_acquire("reserved", &fair).await?;
    // A queued fair waiter that does not come when woken (its process
    // paused), with a long waiter lease.
    let keys = t.client.keys("reserved", KeyLayout::HashTagged)?;
    let member = "someone:1:fair:5000:1000:0b5e7a9c-0000-4000-8000-000000000001";
    t.server.cmd(&["ZADD", &keys.queue(), "1", member]);
    t.server
        .cmd(&["ZADD", &keys.waiters(), "99999999999999", member]);
    ensure!(held.release().await?.is_released());
    match t.client.try_acquire("reserved", &fair).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a fair newcomer took the reserved slot: {other:?}"),
    }
    let notify = fair.clone().wait_mode(WaitMode::Notify);
    let barged = t.client.try_acquire("reserved", &notify).await?;
    ensure!(barged.slot() == Some(0));
    ensure!(barged.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_name_is_one_kind_and_one_permit_count_while_held() -> Result<()> {
    let t = TestRedis::start().await?;
    let waiting = Duration::from_secs(5);
    let mutex = t.client.try_acquire("shared", &t.client.options()).await?;
    // A semaphore on a mutex's name: refused at once, even when waiting.
    let started = tokio::time::Instant::now();
    match t
        .client
        .acquire("shared", &permits(&t.client, 2).wait(waiting))
        .await
    {
        Err(e @ Error::KindConflict { .. }) => {
            ensure!(e.is_config() && !e.is_retryable());
            let text = e.to_string();
            ensure!(text.contains("\"shared\"") && text.contains("held as a mutex"));
            ensure!(text.contains("asked for as a semaphore"), "{text}");
        }
        other => bail!("expected KindConflict, got {other:?}"),
    }
    ensure!(started.elapsed() < Duration::from_secs(2));
    ensure!(mutex.release().await?.is_released());

    let permit = t
        .client
        .try_acquire("shared", &permits(&t.client, 2))
        .await?;
    for opts in [t.client.options(), t.client.options().wait(waiting)] {
        match t.client.acquire("shared", &opts).await {
            Err(Error::KindConflict {
                name,
                held: "semaphore",
                asked: "mutex",
            }) => ensure!(name == "shared"),
            other => bail!("expected KindConflict, got {other:?}"),
        }
    }
    // Another permit count while held: refused, nothing changed.
    match t
        .client
        .acquire("shared", &permits(&t.client, 3).wait(waiting))
        .await
    {
        Err(
            e @ Error::PermitsConflict {
                held: 2, asked: 3, ..
            },
        ) => {
            ensure!(e.to_string().contains("nothing was changed"));
        }
        other => bail!("expected PermitsConflict, got {other:?}"),
    }
    ensure!(
        t.server
            .hgetall(permit.key())
            .get("permits")
            .map(String::as_str)
            == Some("2")
    );
    ensure!(permit.release().await?.is_released());
    // Once nobody holds it, the next grant sets the count or the kind.
    let three = t
        .client
        .try_acquire("shared", &permits(&t.client, 3))
        .await?;
    ensure!(
        t.server
            .hgetall(three.key())
            .get("permits")
            .map(String::as_str)
            == Some("3")
    );
    ensure!(three.release().await?.is_released());
    let mutex = t.client.try_acquire("shared", &t.client.options()).await?;
    ensure!(mutex.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn bad_permit_counts_and_the_guide_layout_are_refused_before_sending() -> Result<()> {
    let t = TestRedis::start().await?;
    for n in [0, fencelock::MAX_PERMITS + 1, u32::MAX] {
        match t
            .client
            .try_acquire("bad", &t.client.options().permits(n))
            .await
        {
            Err(e @ Error::InvalidOption(_)) => {
                ensure!(e.to_string().contains(&n.to_string()), "{e}");
            }
            other => bail!("{n} permits: got {other:?}"),
        }
    }
    let guide = t.client.options().permits(2).layout(KeyLayout::Guide);
    match t.client.try_acquire("bad", &guide).await {
        Err(e @ Error::InvalidOption(_)) => ensure!(e.to_string().contains("guide layout")),
        other => bail!("guide layout: got {other:?}"),
    }
    ensure!(t.server.dbsize() == 0, "something was written");
    // The largest count works.
    let most = t
        .client
        .try_acquire("most", &t.client.options().permits(fencelock::MAX_PERMITS))
        .await?;
    ensure!(most.slot() == Some(0));
    ensure!(most.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_semaphore_key_holding_other_data_is_named() -> Result<()> {
    let t = TestRedis::start().await?;
    t.server.cmd(&["RPUSH", "lock:{listed}", "x"]);
    match t.client.try_acquire("listed", &permits(&t.client, 2)).await {
        Err(e @ Error::WrongType { .. }) => {
            ensure!(e.to_string().contains("lock:{listed}") && e.to_string().contains("list"));
        }
        other => bail!("expected WrongType, got {other:?}"),
    }
    // A permit that lapsed with a garbled field is treated as free, not as
    // an error: only fencelock writes those fields.
    t.server
        .cmd(&["HSET", "lock:{garbled}", "permits", "2", "0", "junk"]);
    let lease = t
        .client
        .try_acquire("garbled", &permits(&t.client, 2))
        .await?;
    ensure!(lease.slot() == Some(0));
    ensure!(lease.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn revoke_refuses_a_semaphore_and_changes_nothing() -> Result<()> {
    let t = TestRedis::start().await?;
    let permit = t.client.try_acquire("pool", &permits(&t.client, 2)).await?;
    let before = t.server.hgetall(permit.key());
    match t.client.revoke("pool", &t.client.options(), &[]).await {
        Err(Error::KindConflict {
            held: "semaphore",
            asked: "mutex",
            ..
        }) => {}
        other => bail!("a revoke of a semaphore: {other:?}"),
    }
    match t.client.revoke("pool", &permits(&t.client, 2), &[]).await {
        Err(e @ Error::InvalidOption(_)) => ensure!(e.to_string().contains("semaphore")),
        other => bail!("a revoke with permits: {other:?}"),
    }
    ensure!(
        t.server.hgetall(permit.key()) == before,
        "the revoke changed the semaphore"
    );
    permit.extend().await?;
    ensure!(permit.release().await?.is_released());
    Ok(())
}
