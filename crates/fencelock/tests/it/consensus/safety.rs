//! The safety properties on etcd, each with its negative control: mutual
//! exclusion and increasing fences under contention, and a holder frozen
//! past its lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{Fence, LockClient, WriteOutcome};
use tokio::time::Instant;

use crate::support::POLL_DEADLINE;
use crate::support::etcd::{TestEtcd, keys_under};
use crate::support::poll_async;

/// Grants to reach in the contended run.
const GRANTS: usize = 10_000;
/// Contending clients.
const WORKERS: usize = 4;
/// Grants that also read the `ETCD_LOCK_REV` revision for the control (a
/// read inside the critical section: the first ones suffice).
const CONTROL_GRANTS: usize = 1_000;

/// One grant as the contended run saw it.
#[derive(Debug, Clone, Copy)]
struct Grant {
    /// The lease's fence (its key's create revision, epoch 0 here).
    fence: u64,
    /// The revision `etcdctl lock` would export as `ETCD_LOCK_REV`: the
    /// header of a read of the holder's key right after the grant.
    header_revision: u64,
}

/// The first place where `fences` (in grant order) does not strictly
/// increase, if any.
fn first_decrease(fences: &[u64]) -> Option<(usize, u64, u64)> {
    fences
        .windows(2)
        .enumerate()
        .find(|(_, w)| w[1] <= w[0])
        .map(|(i, w)| (i + 1, w[0], w[1]))
}

/// At least 10,000 grants of one name among 8 contending clients: never two
/// holders at once, and fences strictly increasing in grant order.
///
/// Negative control (same run): fences that mix the two revisions etcd
/// offers — the holder key's create revision for some holders, the revision
/// of the read after the grant (`etcdctl lock`'s `ETCD_LOCK_REV`) for the
/// others — go backwards, and the same checker says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_contended_etcd_grants_exclude_each_other_and_fences_increase() -> Result<()> {
    let t = TestEtcd::single().await?;
    let inside = Arc::new(AtomicI64::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(std::sync::Mutex::new(Vec::<Grant>::with_capacity(
        GRANTS + WORKERS,
    )));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let client = LockClient::connect(&t.cluster.url()).await?;
        let mut admin = t.admin().await?;
        let (inside, overlaps, granted, log) = (
            inside.clone(),
            overlaps.clone(),
            granted.clone(),
            log.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let opts = client
                .options()
                .fence_epoch(0)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(60));
            while granted.load(Ordering::SeqCst) < GRANTS {
                let lease = client.acquire("contended", &opts).await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let header_revision = if granted.load(Ordering::SeqCst) < CONTROL_GRANTS {
                    let read = admin.get(lease.key(), None).await?;
                    read.header().map_or(0, |h| h.revision()) as u64
                } else {
                    0
                };
                log.lock().unwrap_or_else(|p| p.into_inner()).push(Grant {
                    fence: lease.fence().get(),
                    header_revision,
                });
                granted.fetch_add(1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!(
        "{} grants by {WORKERS} clients in {elapsed:?} ({:.0}/s)",
        log.len(),
        log.len() as f64 / elapsed.as_secs_f64()
    );
    ensure!(log.len() >= GRANTS, "only {} grants", log.len());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let fences: Vec<u64> = log.iter().map(|g| g.fence).collect();
    assert_eq!(
        first_decrease(&fences),
        None,
        "fences must strictly increase"
    );

    // The control: alternate the two revisions.
    let mixed: Vec<u64> = log[..CONTROL_GRANTS]
        .iter()
        .enumerate()
        .map(|(i, g)| {
            if i % 2 == 0 {
                g.header_revision
            } else {
                g.fence
            }
        })
        .collect();
    let Some((at, before, after)) = first_decrease(&mixed) else {
        bail!("mixing header and create revisions should go backwards under contention");
    };
    eprintln!("control: mixed revisions go backwards at grant {at}: {before} then {after}");
    Ok(())
}

/// A holder process frozen (SIGSTOP) past its 1 s lease loses it: etcd
/// expires the lease, B takes the lock and writes. Resumed, A's loss signal
/// fires, its fenced write and its held write are refused, and its release
/// leaves B's lock alone.
///
/// Negative control: the same stale write without the fence check (a plain
/// put, as a worker that does not use fences would make) lands over B's
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_frozen_etcd_holder_loses_its_lease_and_its_stale_writes_are_refused() -> Result<()>
{
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let resource = "invoice:42:data";

    let mut a = crate::support::worker::start(&t.cluster.url(), &[]);
    let reply = a.send("acquire invoice:42 1000 0 renew");
    let a_fence: Fence = match reply.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["acquired", fence, _token] => fence.parse()?,
        _ => bail!("A did not acquire: {reply:?}"),
    };
    ensure!(a.send(&format!("write-held {resource} by-A")) == "accepted");

    a.stop();
    let admin_ref = &admin;
    poll_async("A's lease to expire in etcd", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move {
            Ok(keys_under(&mut admin, "lock:invoice:42/")
                .await?
                .is_empty()
                .then_some(()))
        }
    })
    .await?;

    let opts = t.client.options().ttl(Duration::from_secs(10));
    let b = t.client.try_acquire("invoice:42", &opts).await?;
    assert!(b.fence() > a_fence);
    let data = t.client.fenced_key(resource)?;
    assert_eq!(data.write_held(&b, "by-B").await?, WriteOutcome::Accepted);

    a.cont();
    let lost = a.send_timeout("wait-lost 5000", Duration::from_secs(15));
    assert!(lost.starts_with("lost Some("), "A's loss signal: {lost:?}");
    let fenced = a.send(&format!("write-key {resource} stale-by-A"));
    assert_eq!(fenced, format!("rejected {}", b.fence()));
    let held = a.send(&format!("write-held {resource} stale-by-A"));
    assert!(held.starts_with("rejected"), "{held:?}");
    let released = a.send("release");
    assert!(released.starts_with("not-ours"), "{released:?}");
    let state = data.read().await?;
    assert_eq!(state.value.as_deref(), Some("by-B"));
    assert_eq!(state.fence, Some(b.fence()));
    let keys = keys_under(&mut admin, "lock:invoice:42/").await?;
    assert_eq!(keys.len(), 1, "B's key is intact: {keys:?}");
    assert_eq!(keys[0].0, b.key());
    a.send("quit");

    // The control: without the fence check, A's stale write wins.
    let full = format!("{resource}:unfenced");
    admin.put(full.as_str(), "by-B", None).await?;
    admin.put(full.as_str(), "stale-by-A", None).await?;
    let plain = admin.get(full.as_str(), None).await?;
    assert_eq!(
        plain
            .kvs()
            .first()
            .context("the unfenced key")?
            .value_str()?,
        "stale-by-A",
        "without fences the stale write lands"
    );
    b.release().await?;
    Ok(())
}
