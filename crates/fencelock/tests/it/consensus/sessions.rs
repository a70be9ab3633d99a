//! The client's etcd sessions: one lease per client and ttl, shared by its
//! locks, each acquisition with a key of its own; old clients' keys (a lease
//! per holder, `NAME/LEASE`) and new ones exclude each other; a session lost
//! loses every lock on it; a release that failed is sent again while the
//! session lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use fencelock::{KeyLayout, LockClient, LockState, LossReason};

use crate::support::POLL_DEADLINE;
use crate::support::etcd::{TestEtcd, keys_under};
use crate::support::poll_async;

/// Two tasks of one client on one name (one session) never hold the lock
/// at once: each acquisition has a key of its own, so the second waits in
/// the queue behind the first.
///
/// Negative control (same run): two keys that were one (both tasks writing
/// the session's key `NAME/LEASE`, as a client that named keys by lease
/// alone would) both find themselves first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_of_one_client_exclude_each_other_on_one_name() -> Result<()> {
    let t = TestEtcd::single().await?;
    let client = Arc::new(t.client.clone());
    let inside = Arc::new(AtomicI64::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (client, inside, overlaps) = (client.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let opts = client
                .options()
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(30));
            for _ in 0..50 {
                let lease = client.acquire("shared", &opts).await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");

    // The control: one key per lease, written by both "acquisitions".
    let mut admin = t.admin().await?;
    let lease = admin.lease_grant(30, None).await?.id();
    let key = format!("lock:control/{lease:x}");
    let mut firsts = 0;
    for _ in 0..2 {
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "x",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        admin.txn(txn).await?;
        let first = keys_under(&mut admin, "lock:control/").await?;
        if first.first().is_some_and(|(k, _, _)| *k == key) {
            firsts += 1;
        }
    }
    assert_eq!(firsts, 2, "one key per lease: both believe they are first");
    Ok(())
}

/// During an upgrade, a client that holds keys of the old shape
/// (`NAME/LEASE`, on a lease of its own) and one of the new shape exclude
/// each other: a new client is refused while an old key holds the lock and
/// queues behind it; an old client's grant (create if the prefix is empty)
/// is refused while a new client holds it. `status` and `top` read both
/// shapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_key_shapes_exclude_each_other() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t.client.options().ttl(Duration::from_secs(5));

    // An old client holds `upgrade`.
    let old_lease = admin.lease_grant(30, None).await?.id();
    let old_key = format!("lock:upgrade/{old_lease:x}");
    admin
        .put(
            old_key.as_str(),
            "old-holder",
            Some(PutOptions::new().with_lease(old_lease)),
        )
        .await?;
    let refused = t.client.try_acquire("upgrade", &opts).await;
    ensure!(
        matches!(&refused, Err(e) if e.is_contended()),
        "{refused:?}"
    );
    match t.client.inspect("upgrade", KeyLayout::default()).await? {
        LockState::Held { holder, .. } => assert_eq!(holder, "old-holder"),
        other => bail!("held by the old client expected, got {other:?}"),
    }
    let new_lease = t.client.acquire("new", &opts).await?;
    assert_eq!(
        t.client.lock_names("*", KeyLayout::default()).await?,
        ["new", "upgrade"]
    );
    new_lease.release().await?;

    // A new waiter queues behind the old holder and gets the lock when the
    // old client releases it (deletes its key, revokes its lease).
    let waiter = {
        let client = t.client.clone();
        let opts = opts.clone().wait(Duration::from_secs(20));
        tokio::spawn(async move { client.acquire("upgrade", &opts).await })
    };
    let admin_ref = &admin;
    poll_async("the new waiter to queue", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok((keys_under(&mut admin, "lock:upgrade/").await?.len() == 2).then_some(())) }
    })
    .await?;
    ensure!(!waiter.is_finished(), "the waiter got the lock early");
    admin.delete(old_key.as_str(), None).await?;
    admin.lease_revoke(old_lease).await?;
    let held = waiter.await??;

    // An old client's grant is refused while the new client holds it.
    let lease = admin.lease_grant(30, None).await?.id();
    let key = format!("lock:upgrade/{lease:x}");
    let txn = Txn::new()
        .when([Compare::create_revision("lock:upgrade/", CompareOp::Equal, 0).with_prefix()])
        .and_then([TxnOp::put(
            key.as_str(),
            "old-holder",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    ensure!(
        !admin.txn(txn).await?.succeeded(),
        "the old client's grant went through"
    );
    let count = admin
        .get(
            "lock:upgrade/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?
        .count();
    assert_eq!(count, 1, "only the new holder's key");
    held.release().await?;
    Ok(())
}

/// A session lost (its lease revoked behind the client's back) loses every
/// lock held on it at once: each one's loss signal fires (Expired), and the
/// client's next acquisition gets a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_loses_every_lock_on_it_and_the_next_grant_gets_a_new_one() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t.client.options().ttl(Duration::from_secs(3));
    let a = t.client.acquire("a", &opts).await?;
    let b = t.client.acquire("b", &opts).await?;
    let session = session_of(a.key())?;
    assert_eq!(session_of(b.key())?, session, "one session for both");
    admin.lease_revoke(session).await?;
    for lease in [&a, &b] {
        tokio::time::timeout(Duration::from_secs(5), lease.lost()).await?;
        assert_eq!(lease.loss_reason(), Some(LossReason::Expired));
    }
    let c = t.client.acquire("a", &opts).await?;
    assert_ne!(session_of(c.key())?, session, "a new session");
    c.release().await?;
    Ok(())
}

/// A release that never reaches etcd (sent to a paused member that is then
/// killed, so the request dies unread) fails, and is sent again in the
/// background: once etcd is back, the key is gone, although the client's
/// other lock keeps the shared session alive (which would otherwise keep
/// the released lock held for as long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_sent_again_while_the_session_lives() -> Result<()> {
    let mut t = TestEtcd::single().await?;
    let client = LockClient::builder(t.cluster.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    let opts = client.options().ttl(Duration::from_secs(10));
    let released = client.acquire("released", &opts).await?;
    let kept = client.acquire("kept", &opts).await?;
    let key = released.key().to_owned();
    t.cluster.pause(0);
    let outcome = released.release().await;
    ensure!(
        outcome.is_err(),
        "the release reached a paused etcd: {outcome:?}"
    );
    t.cluster.kill(0);
    t.cluster.restart(0);
    let mut admin = t.admin().await?;
    let admin_ref = &mut admin;
    poll_async("the failed release to be sent again", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        let key = key.clone();
        async move {
            let left = admin
                .get(key.as_str(), Some(GetOptions::new().with_count_only()))
                .await?
                .count();
            Ok((left == 0).then_some(()))
        }
    })
    .await?;
    ensure!(!kept.is_lost(), "the other lock was lost");
    match client.inspect("released", KeyLayout::default()).await? {
        LockState::Free { .. } => {}
        other => bail!("free expected, got {other:?}"),
    }
    kept.release().await?;
    Ok(())
}

/// The lease id in a key `PREFIX NAME/LEASE/ACQ`.
fn session_of(key: &str) -> Result<i64> {
    let Some(hex) = key.rsplit('/').nth(1) else {
        bail!("{key}: no lease part");
    };
    Ok(i64::from_str_radix(hex, 16)?)
}
