//! Grants, releases, waiting, fences and losses on one etcd member.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, FENCE_EPOCH_SIZE, KeyLayout, LockClient, LockState, LossReason, ReleaseOutcome, Renewal,
    holder_id,
};
use tokio::time::Instant;

use crate::support::etcd::{TestEtcd, keys_under, lease_ttl};
use crate::support::{POLL_DEADLINE, poll_async};

/// A grant is one key, `PREFIX NAME/LEASE/ACQ` (the lease id and the
/// acquisition's number in hex), holding the public holder id and attached
/// to the client's session for the ttl asked for; the fence is 2^53 + the
/// key's create revision; inspect shows the holder id, the fence, the
/// lease's time left; release deletes the key and keeps the session, which
/// the client's next grant of that ttl uses again (another ttl gets a
/// session of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_one_key_on_the_clients_session_and_release_deletes_it() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t.client.options().ttl(Duration::from_secs(3));
    let lease = t.client.acquire("invoice:42", &opts).await?;

    let keys = keys_under(&mut admin, "lock:invoice:42/").await?;
    let [(key, revision, lease_id)] = keys.as_slice() else {
        bail!("one key expected, found {keys:?}");
    };
    assert_eq!(lease.key(), key);
    let acquisition = key
        .strip_prefix(&format!("lock:invoice:42/{lease_id:x}/"))
        .context("the key names its lease")?;
    ensure!(
        !acquisition.is_empty() && acquisition.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    assert_eq!(lease.fence().get(), FENCE_EPOCH_SIZE + *revision as u64);
    let (_, granted) = lease_ttl(&mut admin, *lease_id)
        .await?
        .context("the holder's lease")?;
    assert_eq!(granted, 3, "the lease has the ttl asked for");
    let value = admin.get(key.as_str(), None).await?;
    let stored = value.kvs()[0].value_str()?.to_owned();
    assert_eq!(stored, holder_id(lease.token()));
    assert_ne!(stored, lease.token(), "the token never reaches etcd");

    match t.client.inspect("invoice:42", KeyLayout::default()).await? {
        LockState::Held {
            holder,
            fence,
            remaining,
        } => {
            assert_eq!(holder, lease.holder_id());
            assert_eq!(fence, Some(lease.fence()));
            let left = remaining.context("ttl left")?;
            assert!(left <= Duration::from_secs(3), "{left:?}");
        }
        other => bail!("held expected, got {other:?}"),
    }
    assert_eq!(
        t.client.waiters("invoice:42", KeyLayout::default()).await?,
        0
    );

    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    assert!(keys_under(&mut admin, "lock:invoice:42/").await?.is_empty());
    assert!(
        lease_ttl(&mut admin, *lease_id).await?.is_some(),
        "the session outlives the release"
    );
    assert_eq!(
        t.client.inspect("invoice:42", KeyLayout::default()).await?,
        LockState::Free { last_fence: None }
    );

    let again = t.client.acquire("invoice:42", &opts).await?;
    let other_name = t.client.acquire("invoice:43", &opts).await?;
    let other_ttl = t
        .client
        .acquire("invoice:44", &opts.clone().ttl(Duration::from_secs(5)))
        .await?;
    let lease_of = |key: &str| -> Result<i64> {
        let hex = key.rsplit('/').nth(1).context("a key with a lease part")?;
        Ok(i64::from_str_radix(hex, 16)?)
    };
    assert_eq!(lease_of(again.key())?, *lease_id, "the same session");
    assert_eq!(
        lease_of(other_name.key())?,
        *lease_id,
        "one session per ttl"
    );
    assert_ne!(
        lease_of(other_ttl.key())?,
        *lease_id,
        "another ttl, another session"
    );
    assert_ne!(again.key(), key, "every acquisition has a key of its own");
    for l in [again, other_name, other_ttl] {
        l.release().await?;
    }
    Ok(())
}

/// An uncontended acquire + release is two Raft commits (the create
/// transaction and the delete), counted by etcd itself
/// (`etcd_server_proposals_committed_total`) over 50 cycles.
///
/// Negative control (same run): the recipe with a lease per acquisition
/// (grant a lease, create the key; delete it and revoke the lease), as bare
/// calls, is counted at four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_two_raft_commits() -> Result<()> {
    const CYCLES: u32 = 50;
    let t = TestEtcd::single().await?;
    let opts = t.client.options().ttl(Duration::from_secs(30));
    // The session is granted by the first cycle.
    t.client.acquire("cycle", &opts).await?.release().await?;
    let committed = || t.cluster.metric(0, "etcd_server_proposals_committed_total");
    let before = committed();
    for _ in 0..CYCLES {
        t.client.acquire("cycle", &opts).await?.release().await?;
    }
    let per_cycle = (committed() - before) / f64::from(CYCLES);
    eprintln!("fencelock: {per_cycle} commits per cycle");
    assert!(
        (2.0..2.1).contains(&per_cycle),
        "{per_cycle} commits per cycle"
    );

    let mut admin = t.admin().await?;
    let before = committed();
    for i in 0..CYCLES {
        let lease = admin.lease_grant(30, None).await?.id();
        let key = format!("control/{lease:x}");
        admin
            .put(
                key.as_str(),
                format!("{i}"),
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await?;
        admin.delete(key.as_str(), None).await?;
        admin.lease_revoke(lease).await?;
    }
    let per_cycle = (committed() - before) / f64::from(CYCLES);
    eprintln!("a lease per acquisition: {per_cycle} commits per cycle");
    assert!(per_cycle >= 4.0, "{per_cycle} commits per cycle");
    Ok(())
}

/// Successive grants of a name get strictly increasing fences, each its
/// key's create revision in the fence epoch asked for (epoch 0: the bare
/// revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_increasing_create_revisions_in_their_epoch() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let mut last = 0u64;
    for epoch in [0u16, 1, 5] {
        let opts = t.client.options().fence_epoch(epoch);
        for _ in 0..10 {
            let lease = t.client.acquire("job", &opts).await?;
            let keys = keys_under(&mut admin, "lock:job/").await?;
            let revision = keys.first().context("the holder's key")?.1 as u64;
            assert_eq!(
                lease.fence().get(),
                u64::from(epoch) * FENCE_EPOCH_SIZE + revision
            );
            assert!(lease.fence().get() > last, "{} after {last}", lease.fence());
            last = lease.fence().get();
            lease.release().await?;
        }
    }
    Ok(())
}

/// Waiters are served first come, first served (each watches the key just
/// ahead of its own), with increasing fences; `waiters` counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_the_order_they_queued() -> Result<()> {
    let t = TestEtcd::single().await?;
    let opts = t
        .client
        .options()
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(30));
    let first = t.client.acquire("fifo", &opts).await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5u64 {
        let (client, opts, order) = (t.client.clone(), opts.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.acquire("fifo", &opts).await?;
            order
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((i, lease.fence()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            lease.release().await?;
            Ok::<_, Error>(())
        }));
        // The next one queues only once this one has.
        let client = t.client.clone();
        poll_async("the waiter to queue", POLL_DEADLINE, || {
            let client = client.clone();
            async move {
                let n = client.waiters("fifo", KeyLayout::default()).await?;
                Ok((n == i + 1).then_some(()))
            }
        })
        .await?;
    }
    first.release().await?;
    for task in tasks {
        task.await??;
    }
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let indexes: Vec<u64> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, [0, 1, 2, 3, 4]);
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
    Ok(())
}

/// `try_acquire` on a held lock is refused and leaves nothing behind, as
/// does an `acquire` that times out or whose future is dropped while it
/// waits (its key is deleted): the queue never keeps a key of a waiter
/// that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_timed_out_and_dropped_acquisitions_leave_no_key() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t.client.options().ttl(Duration::from_secs(10));
    let held = t.client.acquire("busy", &opts).await?;

    let refused = t.client.try_acquire("busy", &opts).await;
    assert!(
        matches!(&refused, Err(e) if e.is_contended()),
        "{refused:?}"
    );
    assert_eq!(keys_under(&mut admin, "lock:busy/").await?.len(), 1);

    let timed_out = t
        .client
        .acquire("busy", &opts.clone().wait(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(&timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );

    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        t.client
            .acquire("busy", &opts.clone().wait(Duration::from_secs(60))),
    )
    .await;
    assert!(dropped.is_err(), "the acquisition was still waiting");

    let admin_ref = &mut admin;
    poll_async("the gone waiters' keys to be removed", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok((keys_under(&mut admin, "lock:busy/").await?.len() == 1).then_some(())) }
    })
    .await?;
    // The leases are the client's two sessions (the holders' and the
    // waiters'): no acquisition granted one of its own.
    let leases = admin.leases().await?;
    assert_eq!(leases.leases().len(), 2, "{:?}", leases.leases());
    held.release().await?;
    Ok(())
}

/// A grant whose reply was lost is sent again with the same lease: it finds
/// the key it created and returns its create revision; a lease never gets
/// two keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_grant_with_the_same_lease_creates_no_second_key() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let lease = admin.lease_grant(30, None).await?.id();
    let first = fencelock::testing::etcd_grant_txn(&t.client, "retried", lease).await?;
    let again = fencelock::testing::etcd_grant_txn(&t.client, "retried", lease).await?;
    assert_eq!(first, again);
    assert_eq!(first.1, 1, "one key");
    let other = admin.lease_grant(30, None).await?.id();
    let second = fencelock::testing::etcd_grant_txn(&t.client, "retried", other).await?;
    assert_eq!(second.1, 2);
    assert!(second.0 > first.0);
    Ok(())
}

/// The loss signal fires when the holder's lease is revoked behind its back
/// (Expired), or its key deleted while the lease lives (TakenOver), at the
/// next renewal; `with_lock` then cancels the work and returns LockLost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_or_a_deleted_key_is_a_loss_at_the_next_renewal() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t.client.options().ttl(Duration::from_secs(1));

    let lease = t.client.acquire("revoked", &opts).await?;
    let id = keys_under(&mut admin, "lock:revoked/").await?[0].2;
    admin.lease_revoke(id).await?;
    tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .context("the loss signal")?;
    assert_eq!(lease.loss_reason(), Some(LossReason::Expired));
    assert!(matches!(lease.release().await?, ReleaseOutcome::NotOurs(_)));

    let lease = t.client.acquire("deleted", &opts).await?;
    admin.delete(lease.key(), None).await?;
    tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .context("the loss signal")?;
    assert_eq!(lease.loss_reason(), Some(LossReason::TakenOver));
    drop(lease);

    let mut admin2 = admin.clone();
    let lost = t
        .client
        .with_lock("work", &opts, |_handle| async move {
            let id = keys_under(&mut admin2, "lock:work/").await?[0].2;
            admin2.lease_revoke(id).await?;
            // Cancelled at this await by the loss.
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, anyhow::Error>(())
        })
        .await;
    assert!(matches!(lost, Err(Error::LockLost { .. })), "{lost:?}");
    Ok(())
}

/// fencelock's own locks never expire while renewed: a 1 s lease held for 4
/// s stays, its etcd lease refreshed at every renewal. The control: the same
/// lease without renewal expires in etcd after about its ttl, and the loss
/// signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_leases_never_expire_and_unrenewed_ones_do() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t.client.options().ttl(Duration::from_secs(1));
    let lease = t.client.acquire("kept", &opts).await?;
    let id = keys_under(&mut admin, "lock:kept/").await?[0].2;
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(!lease.is_lost());
        let ttl = lease_ttl(&mut admin, id).await?;
        assert!(ttl.is_some(), "the lease is alive");
        assert_eq!(keys_under(&mut admin, "lock:kept/").await?.len(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);

    let unrenewed = t
        .client
        .acquire("unkept", &opts.clone().renewal(Renewal::Off))
        .await?;
    tokio::time::timeout(Duration::from_secs(3), unrenewed.lost())
        .await
        .context("the loss signal of an unrenewed lease")?;
    let admin_ref = &admin;
    poll_async("etcd to expire the unrenewed lease", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move {
            Ok(keys_under(&mut admin, "lock:unkept/")
                .await?
                .is_empty()
                .then_some(()))
        }
    })
    .await?;
    Ok(())
}

/// The "no lease" pitfall. etcd's Lock RPC called without a lease (what
/// etcd-client's `lock(name, None)` does) runs under a lease the server
/// grants itself — 60 s — and then orphans: nobody keeps it alive, so the
/// lock silently expires 60 s after it was taken, however long its holder
/// works. Waiting 60 s is too slow for CI; the test shows the two facts that
/// make it so, right after the call: the key's lease was granted 60 s, and
/// its time to live only goes down. fencelock's lease, under the same
/// observation, has the ttl asked for and is refreshed at every renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_rpc_without_a_lease_expires_after_60_s_and_fencelock_leases_are_refreshed()
-> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let locked = admin.lock("pitfall", None).await?;
    let key = locked.key().to_vec();
    let found = admin.get(key.clone(), None).await?;
    let server_lease = found.kvs().first().context("the Lock RPC's key")?.lease();
    let (first_left, granted) = lease_ttl(&mut admin, server_lease)
        .await?
        .context("the server's lease")?;
    assert_eq!(granted, 60, "the server granted itself a 60 s lease");
    // Never refreshed: after 2.5 s its time to live is lower, and keeps
    // falling towards the silent expiry.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (later_left, _) = lease_ttl(&mut admin, server_lease)
        .await?
        .context("the server's lease")?;
    assert!(
        later_left <= first_left - 2,
        "not kept alive: {first_left} s then {later_left} s"
    );

    let opts = t.client.options().ttl(Duration::from_secs(3));
    let lease = t.client.acquire("fenced", &opts).await?;
    let id = keys_under(&mut admin, "lock:fenced/").await?[0].2;
    let mut lowest = i64::MAX;
    let until = Instant::now() + Duration::from_millis(3500);
    while Instant::now() < until {
        let (left, granted) = lease_ttl(&mut admin, id).await?.context("our lease")?;
        assert_eq!(granted, 3);
        lowest = lowest.min(left);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Renewed every second: it never falls below a second left (a 3 s lease
    // not kept alive would be gone by now).
    assert!(lowest >= 1, "lowest time to live {lowest} s");
    assert!(!lease.is_lost());
    lease.release().await?;
    Ok(())
}

/// Names with `/` and `%` never share keys with other names: `a` and `a/b`
/// are two locks, both listed by `lock_names`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_slashes_are_separate_locks() -> Result<()> {
    let t = TestEtcd::single().await?;
    let opts = t.client.options();
    let a = t.client.try_acquire("a", &opts).await?;
    let ab = t.client.try_acquire("a/b", &opts).await?;
    let pct = t.client.try_acquire("50%", &opts).await?;
    assert_eq!(t.client.waiters("a", KeyLayout::default()).await?, 0);
    assert_eq!(
        t.client.lock_names("*", KeyLayout::default()).await?,
        ["50%", "a", "a/b"]
    );
    assert_eq!(
        t.client.lock_names("a*", KeyLayout::default()).await?,
        ["a", "a/b"]
    );
    for l in [a, ab, pct] {
        l.release().await?;
    }
    assert!(
        t.client
            .lock_names("*", KeyLayout::default())
            .await?
            .is_empty()
    );
    Ok(())
}

/// What exists only on Redis is refused on etcd with a message that says
/// so: the guide layout, waiting for replicas, fenced hashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_only_features_are_refused_with_a_reason() -> Result<()> {
    let t = TestEtcd::single().await?;
    let guide = t
        .client
        .try_acquire("x", &t.client.options().layout(KeyLayout::Guide))
        .await;
    assert!(
        matches!(&guide, Err(e) if e.is_invalid_input()),
        "{guide:?}"
    );
    let replicas = t
        .client
        .try_acquire(
            "x",
            &t.client
                .options()
                .wait_for_replicas(1, Duration::from_millis(10)),
        )
        .await;
    assert!(
        matches!(&replicas, Err(e) if e.to_string().contains("majority")),
        "{replicas:?}"
    );
    let hash = t.client.fenced_hash("x");
    assert!(
        matches!(&hash, Err(e) if e.to_string().contains("etcd")),
        "{hash:?}"
    );
    assert_eq!(t.client.backend_kind(), "etcd");
    Ok(())
}

/// An etcd URL where nothing listens fails at connect as a connection
/// error that names it; a malformed one as invalid input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_malformed_urls_fail_at_connect() -> Result<()> {
    let port = fencelock_testkit::free_port();
    let url = format!("etcd://user:s3cret-pw@127.0.0.1:{port}");
    let e = LockClient::builder(&url)
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .err()
        .context("nothing listens")?;
    assert!(e.is_connection(), "{e}");
    let text = e.to_string();
    assert!(!text.contains("s3cret-pw"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    for bad in ["etcd://h:99999", "etcd://h?db=1", "etcd://"] {
        let e = LockClient::connect(bad).await.err().context(bad)?;
        assert!(e.is_invalid_input(), "{bad}: {e}");
    }
    Ok(())
}
