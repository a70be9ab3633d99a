//! The fenced semaphore on etcd (`LockOptions::permits`), against a real
//! etcd member: a key per slot (`NAME/sem/N/slot/S`) on the client's
//! session, its create revision the fence.
//!
//! - slots: the lowest free slot, fences growing across slots (create
//!   revisions in the fence epoch), a full semaphore refused, a freed slot
//!   taken again, nothing left behind;
//! - a lost reply: a resent take finds its slot; a dropped acquisition
//!   gives back the slot its unanswered take took;
//! - waiting: a release wakes a waiter at once; waiters are served in
//!   queue order across permits; a waiter that times out leaves no key;
//! - safety under contention: never more than N holders, never two in one
//!   slot, no fence twice; with a negative control (one permit never lets
//!   two in, so the count is what lets N in);
//! - loss: a permit whose session dies is lost, and its slot taken;
//!   renewed permits last;
//! - conflicts: a mutex and a semaphore on one name (both ways, revoke
//!   included), two permit counts;
//! - inspect, waiters and lock names show a semaphore per slot.
//!
//! Every test name has `etcd` in it: nextest runs them one at a time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, FENCE_EPOCH_SIZE, KeyLayout, Lease, LockClient, LockOptions, LockState, LossReason,
    WaitMode, holder_id,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use fencelock::testing::etcd_hold_next_reply;

use crate::support::etcd::{TestEtcd, keys_under};
use crate::support::{POLL_DEADLINE, poll_async};

fn permits(client: &LockClient, n: u32) -> LockOptions {
    client.options().permits(n).ttl(Duration::from_secs(5))
}

/// Polls until `client` counts `n` waiters of `name`.
async fn waiters_reach(client: &LockClient, name: &str, n: u64) -> Result<()> {
    poll_async("the waiters to queue", POLL_DEADLINE, || async {
        Ok((client.waiters(name, KeyLayout::default()).await? == n).then_some(()))
    })
    .await
}

/// A grant is a key per slot, `lock:NAME/sem/N/slot/S`, holding the holder
/// id on the client's session; its fence is 2^53 + the key's create
/// revision, so fences grow across slots; the lowest free slot is taken;
/// a full semaphore refuses at once; a release frees its slot, which the
/// next grant takes with a higher fence; nothing is left once all are
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_takes_the_lowest_free_slot_with_growing_fences() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = permits(&t.client, 3);
    let mut leases: Vec<Lease> = Vec::new();
    for want in 0..3 {
        let lease = t.client.try_acquire("jobs", &opts).await?;
        ensure!(lease.slot() == Some(want), "slot {:?}", lease.slot());
        ensure!(lease.key() == format!("lock:jobs/sem/3/slot/{want}"));
        if let Some(last) = leases.last() {
            ensure!(
                lease.fence() > last.fence(),
                "fences must grow across slots"
            );
        }
        leases.push(lease);
    }
    let keys = keys_under(&mut admin, "lock:jobs/").await?;
    ensure!(keys.len() == 3, "{keys:?}");
    for (lease, (key, revision, session)) in leases.iter().zip(&keys) {
        ensure!(lease.key() == key);
        ensure!(lease.fence().get() == FENCE_EPOCH_SIZE + *revision as u64);
        ensure!(
            *session == keys[0].2,
            "one session for the client's permits"
        );
        let stored = admin.get(key.as_str(), None).await?;
        ensure!(stored.kvs()[0].value_str()? == holder_id(lease.token()));
    }
    match t.client.try_acquire("jobs", &opts).await {
        Err(Error::Contended { name, .. }) => ensure!(name == "jobs"),
        other => bail!("a full semaphore must refuse, got {other:?}"),
    }
    ensure!(
        keys_under(&mut admin, "lock:jobs/").await?.len() == 3,
        "a refusal leaves no key"
    );
    let top = leases.iter().map(|l| l.fence()).max().context("fence")?;
    let middle = leases.remove(1);
    ensure!(middle.release().await?.is_released());
    let again = t.client.try_acquire("jobs", &opts).await?;
    ensure!(again.slot() == Some(1) && again.fence() > top);
    let mutex = t.client.try_acquire("plain", &t.client.options()).await?;
    ensure!(mutex.slot().is_none());
    for lease in leases.into_iter().chain([again, mutex]) {
        ensure!(lease.release().await?.is_released());
    }
    ensure!(keys_under(&mut admin, "lock:jobs/").await?.is_empty());
    Ok(())
}

/// A waiter is granted the slot a release frees at once (not when the
/// holders' 5 s leases would run out); a waiter that times out leaves no
/// key in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_release_wakes_a_waiter_and_a_timeout_leaves_no_key() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = permits(&t.client, 2).wait(Duration::from_secs(10));
    let a = t.client.try_acquire("woken", &opts).await?;
    let b = t.client.try_acquire("woken", &opts).await?;

    let timed_out = t
        .client
        .acquire("woken", &opts.clone().wait(Duration::from_millis(300)))
        .await;
    ensure!(
        matches!(&timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    ensure!(
        keys_under(&mut admin, "lock:woken/").await?.len() == 2,
        "the timed-out waiter's key is gone"
    );

    let waiter = {
        let client = LockClient::connect(&t.cluster.url()).await?;
        let opts = opts.clone();
        tokio::spawn(async move { client.acquire("woken", &opts).await })
    };
    waiters_reach(&t.client, "woken", 1).await?;
    let released_at = Instant::now();
    ensure!(b.release().await?.is_released());
    let got = waiter.await??;
    let took = released_at.elapsed();
    ensure!(took < Duration::from_secs(2), "woken after {took:?}");
    ensure!(got.slot() == Some(1) && got.fence() > a.fence());
    ensure!(got.release().await?.is_released() && a.release().await?.is_released());
    ensure!(keys_under(&mut admin, "lock:woken/").await?.is_empty());
    Ok(())
}

/// Waiters of a full semaphore are served in the order they queued, across
/// both permits (slots free one at a time, so each grant has one waiter to
/// go to), in fair mode and in the default mode alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_waiters_are_served_in_queue_order_across_permits() -> Result<()> {
    let t = TestEtcd::single().await?;
    for mode in [WaitMode::Fair, WaitMode::Notify] {
        let name = format!("fifo-{mode:?}");
        let opts = permits(&t.client, 2)
            .wait_mode(mode)
            .wait(Duration::from_secs(20));
        let holders = [
            t.client.try_acquire(&name, &opts).await?,
            t.client.try_acquire(&name, &opts).await?,
        ];
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4u64 {
            let client = LockClient::connect(&t.cluster.url()).await?;
            let (opts, order, own) = (opts.clone(), order.clone(), name.clone());
            waiters.push(tokio::spawn(async move {
                let lease = client.acquire(&own, &opts).await?;
                order.lock().await.push((lease.fence(), i));
                tokio::time::sleep(Duration::from_millis(100)).await;
                anyhow::Ok(lease.release().await?.is_released())
            }));
            // Queue one at a time, so the queue order is i.
            waiters_reach(&t.client, &name, i + 1).await?;
        }
        for lease in holders {
            ensure!(lease.release().await?.is_released());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        for w in waiters {
            ensure!(w.await??);
        }
        let mut granted = order.lock().await.clone();
        granted.sort();
        let order: Vec<u64> = granted.iter().map(|(_, i)| *i).collect();
        ensure!(order == [0, 1, 2, 3], "{mode:?}: served in {order:?}");
    }
    Ok(())
}

/// A take whose reply is lost (etcd applied it) is sent again: the resend
/// finds the slot holding the attempt's own holder id and returns it, at
/// the first send's create revision, with no second key. An acquisition
/// dropped while its take's reply is held back gives the slot back (it
/// compares the holder id, so never another holder's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_a_lost_take_reply_keeps_its_slot_and_a_dropped_one_gives_it_back()
-> Result<()> {
    let t = TestEtcd::single().await?;
    let admin = t.admin().await?;
    let opts = permits(&t.client, 2);
    let deliver = etcd_hold_next_reply(&t.client, true)?;
    let acquire = {
        let (client, opts) = (t.client.clone(), opts.clone());
        tokio::spawn(async move { client.try_acquire("lost", &opts).await })
    };
    let admin_ref = &admin;
    let (first, revision, _) = poll_async("the first send's slot", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok(keys_under(&mut admin, "lock:lost/").await?.first().cloned()) }
    })
    .await?;
    drop(deliver);
    let held = acquire.await??;
    ensure!(held.key() == first && held.slot() == Some(0));
    ensure!(held.fence().get() == FENCE_EPOCH_SIZE + revision as u64);
    ensure!(keys_under(&mut admin.clone(), "lock:lost/").await?.len() == 1);

    // Dropped while the reply of its take is held back.
    let deliver = etcd_hold_next_reply(&t.client, false)?;
    let dropped = {
        let (client, opts) = (t.client.clone(), opts.clone());
        tokio::spawn(async move { client.try_acquire("lost", &opts).await })
    };
    poll_async("the dropped attempt's slot", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok((keys_under(&mut admin, "lock:lost/").await?.len() == 2).then_some(())) }
    })
    .await?;
    dropped.abort();
    let _ = dropped.await;
    drop(deliver);
    poll_async("the dropped attempt's slot to be given back", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok((keys_under(&mut admin, "lock:lost/").await?.len() == 1).then_some(())) }
    })
    .await?;
    ensure!(!held.is_lost());
    ensure!(held.release().await?.is_released());
    Ok(())
}

/// The largest number of holders seen at once.
#[derive(Default)]
struct Overlap {
    now: AtomicU32,
    most: AtomicU32,
}

/// `workers` clients each take a permit of `n` `cycles` times, hold it for
/// a moment and release it, checking slots and fences as they go; returns
/// the most holders seen at once.
async fn contend(t: &TestEtcd, name: &str, n: u32, workers: usize, cycles: usize) -> Result<u32> {
    let overlap = Arc::new(Overlap::default());
    let held = Arc::new(Mutex::new((BTreeSet::new(), BTreeSet::new())));
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = LockClient::connect(&t.cluster.url()).await?;
        let (overlap, held, name) = (overlap.clone(), held.clone(), name.to_owned());
        // Half the workers wait on the short waiter lease, half on the
        // holder's session (a ttl of 2 s or less queues there).
        let ttl = Duration::from_secs(if w % 2 == 0 { 5 } else { 2 });
        tasks.push(tokio::spawn(async move {
            let opts = client
                .options()
                .permits(n)
                .ttl(ttl)
                .wait(Duration::from_secs(30));
            for _ in 0..cycles {
                let lease = client.acquire(&name, &opts).await?;
                let slot = lease.slot().context("a permit has a slot")?;
                ensure!(slot < n, "slot {slot} of {n}");
                {
                    let mut held = held.lock().await;
                    ensure!(held.0.insert(slot), "slot {slot} held twice");
                    ensure!(
                        held.1.insert(lease.fence()),
                        "fence {} issued twice",
                        lease.fence()
                    );
                }
                let now = overlap.now.fetch_add(1, Ordering::SeqCst) + 1;
                overlap.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                overlap.now.fetch_sub(1, Ordering::SeqCst);
                held.lock().await.0.remove(&slot);
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

/// Six clients, three permits, 240 grants: never more than three holders,
/// never two in one slot, no fence twice, and the permits were shared.
/// Negative control: the same workers on one permit never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_etcd_semaphore_never_lets_more_than_n_holders_in() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let started = Instant::now();
    let most = contend(&t, "pool", 3, 6, 40).await?;
    ensure!(most <= 3, "{most} holders at once with 3 permits");
    ensure!(most >= 2, "the permits were never shared ({most})");
    let most = contend(&t, "single", 1, 4, 15).await?;
    ensure!(most == 1, "one permit let {most} in");
    eprintln!("300 contended grants in {:?}", started.elapsed());
    for prefix in ["lock:pool/", "lock:single/"] {
        let left = keys_under(&mut admin, prefix).await?;
        ensure!(left.is_empty(), "{prefix}: {left:?}");
    }
    Ok(())
}

/// A permit whose session dies (its etcd lease revoked behind the client's
/// back) is lost (Expired) and its slot freed: a waiter takes it with a
/// higher fence, and the client's next permit gets a new session. A
/// permit on another client's session is untouched; renewed permits
/// outlive their ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_permit_whose_session_dies_is_lost_and_its_slot_taken() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let other = LockClient::connect(&t.cluster.url()).await?;
    let opts = t
        .client
        .options()
        .permits(2)
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(10));
    let doomed = t.client.acquire("lapse", &opts).await?;
    let kept = other.acquire("lapse", &opts).await?;
    ensure!(doomed.slot() == Some(0) && kept.slot() == Some(1));
    // Renewed past their ttl.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(!doomed.is_lost() && !kept.is_lost(), "renewed permits lost");

    let waiter = {
        let client = LockClient::connect(&t.cluster.url()).await?;
        let opts = opts.clone();
        tokio::spawn(async move { client.acquire("lapse", &opts).await })
    };
    waiters_reach(&t.client, "lapse", 1).await?;
    let keys = keys_under(&mut admin, "lock:lapse/sem/2/slot/").await?;
    let session = keys
        .iter()
        .find(|(key, _, _)| key == doomed.key())
        .map(|(_, _, lease)| *lease)
        .context("the doomed permit's key")?;
    admin.lease_revoke(session).await?;

    let next = waiter.await??;
    ensure!(next.slot() == Some(0), "the freed slot: {:?}", next.slot());
    ensure!(next.fence() > doomed.fence() && next.fence() > kept.fence());
    tokio::time::timeout(Duration::from_secs(5), doomed.lost())
        .await
        .context("the loss signal of the permit whose session died")?;
    ensure!(doomed.loss_reason() == Some(LossReason::Expired));
    ensure!(!kept.is_lost(), "the other client's permit was lost");
    // The client's next permit lives on a new session.
    ensure!(next.release().await?.is_released());
    let again = t.client.acquire("lapse", &opts).await?;
    let now = keys_under(&mut admin, again.key()).await?;
    ensure!(now.first().is_some_and(|(_, _, lease)| *lease != session));
    for lease in [again, kept] {
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}

/// One name is one kind while it has holders, both ways, refused at once
/// even when waiting and without writing anything; revoke (a mutex's) is
/// refused on a semaphore; another permit count while held is refused;
/// once the holders are gone the next grant sets the kind and count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_and_mutex_and_permit_counts_conflict_on_one_name() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let waiting = Duration::from_secs(5);
    let mutex = t.client.try_acquire("shared", &t.client.options()).await?;
    let started = Instant::now();
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
    ensure!(keys_under(&mut admin, "lock:shared/sem/").await?.is_empty());
    ensure!(mutex.release().await?.is_released());

    let permit = t
        .client
        .try_acquire("shared", &permits(&t.client, 2))
        .await?;
    // Once, waiting on the holder's session (ttl 2 s), and waiting on the
    // waiter session (ttl 10 s): the three grant transactions of a mutex.
    let mutexes = [
        (t.client.options(), false),
        (
            t.client.options().ttl(Duration::from_secs(2)).wait(waiting),
            true,
        ),
        (
            t.client
                .options()
                .ttl(Duration::from_secs(10))
                .wait(waiting),
            true,
        ),
    ];
    for (opts, wait) in mutexes {
        let started = Instant::now();
        let got = if wait {
            t.client.acquire("shared", &opts).await
        } else {
            t.client.try_acquire("shared", &opts).await
        };
        match got {
            Err(Error::KindConflict {
                name,
                held: "semaphore",
                asked: "mutex",
            }) => ensure!(name == "shared"),
            other => bail!("expected KindConflict, got {other:?}"),
        }
        ensure!(started.elapsed() < Duration::from_secs(2));
    }
    match t.client.revoke("shared", &t.client.options(), &[]).await {
        Err(Error::KindConflict {
            held: "semaphore", ..
        }) => {}
        other => bail!("a revoke of a semaphore must be refused, got {other:?}"),
    }
    ensure!(!permit.is_lost());
    match t
        .client
        .acquire("shared", &permits(&t.client, 3).wait(waiting))
        .await
    {
        Err(
            e @ Error::PermitsConflict {
                held: 2, asked: 3, ..
            },
        ) => ensure!(e.to_string().contains("nothing was changed")),
        other => bail!("expected PermitsConflict, got {other:?}"),
    }
    let keys = keys_under(&mut admin, "lock:shared/").await?;
    ensure!(
        keys.len() == 1 && keys[0].0 == permit.key(),
        "only the permit's key: {keys:?}"
    );
    ensure!(permit.release().await?.is_released());
    let three = t
        .client
        .try_acquire("shared", &permits(&t.client, 3))
        .await?;
    ensure!(three.key() == "lock:shared/sem/3/slot/0");
    ensure!(three.release().await?.is_released());
    let mutex = t.client.try_acquire("shared", &t.client.options()).await?;
    ensure!(mutex.release().await?.is_released());
    Ok(())
}

/// inspect shows the holder of each slot (holder id, fence, time left),
/// waiters counts the semaphore's waiters, lock names list the semaphore
/// beside mutexes; a released semaphore is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_inspect_waiters_and_lock_names_show_its_slots() -> Result<()> {
    let t = TestEtcd::single().await?;
    let ttl = Duration::from_secs(5);
    let opts = permits(&t.client, 2);
    let a = t.client.try_acquire("seen", &opts).await?;
    let b = t.client.try_acquire("seen", &opts).await?;
    let m = t
        .client
        .try_acquire("seen-mutex", &t.client.options())
        .await?;
    let waiter = {
        let client = LockClient::connect(&t.cluster.url()).await?;
        let opts = opts.clone().wait(Duration::from_secs(20));
        tokio::spawn(async move { client.acquire("seen", &opts).await })
    };
    waiters_reach(&t.client, "seen", 1).await?;
    match t.client.inspect("seen", KeyLayout::default()).await? {
        LockState::Semaphore {
            permits: 2,
            holders,
            last_fence: None,
        } => {
            ensure!(holders.len() == 2, "{holders:?}");
            for (h, lease) in holders.iter().zip([&a, &b]) {
                ensure!(Some(h.slot) == lease.slot());
                ensure!(h.holder == lease.holder_id());
                ensure!(h.fence == Some(lease.fence()));
                ensure!(h.remaining <= ttl && h.remaining >= ttl / 2, "{h:?}");
            }
        }
        other => bail!("inspect showed {other:?}"),
    }
    let names = t.client.lock_names("*", KeyLayout::default()).await?;
    ensure!(names == ["seen", "seen-mutex"], "{names:?}");
    ensure!(a.release().await?.is_released());
    let got = waiter.await??;
    ensure!(got.slot() == Some(0));
    for lease in [b, got, m] {
        ensure!(lease.release().await?.is_released());
    }
    ensure!(matches!(
        t.client.inspect("seen", KeyLayout::default()).await?,
        LockState::Free { last_fence: None }
    ));
    ensure!(t.client.waiters("seen", KeyLayout::default()).await? == 0);
    Ok(())
}
