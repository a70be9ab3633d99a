//! Two races of the etcd recipe, made deterministic with the `testing`
//! hooks: a grant's reply held back or lost
//! (`testing::etcd_hold_next_reply`), and a member that serves the
//! waiter's serializable reads from before a write
//! (`testing::etcd_serve_stale_reads`; a real lagging member cannot be
//! produced on demand: its reads are served as of an older revision, which
//! is what such a member answers).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::testing::{etcd_hold_next_reply, etcd_serve_stale_reads};
use fencelock::{KeyLayout, LockClient, LockState};

use crate::support::POLL_DEADLINE;
use crate::support::etcd::{TestEtcd, keys_under};
use crate::support::poll_async;

/// A grant sent while the lock is free creates the key on the holder's
/// session; its reply is lost, and by the time it is sent again the waiter
/// session has expired (etcd out of reach for longer than its 2 s lease,
/// here revoked: nothing keeps it alive during the resends), so the resend,
/// which puts the existing key on it, fails with the lease gone. The key
/// the first send created is deleted before the acquisition queues again,
/// so it gets the free lock at once. Left, that key stayed first, nobody's,
/// on a session the client keeps alive, and the lock was blocked: the next
/// attempt waited behind it until its wait ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_resent_after_its_waiter_session_expired_leaves_no_key_first() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let opts = t
        .client
        .options()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(3));
    let deliver = etcd_hold_next_reply(&t.client, true)?;
    let acquire = {
        let (client, opts) = (t.client.clone(), opts.clone());
        tokio::spawn(async move { client.acquire("lost", &opts).await })
    };
    let admin_ref = &admin;
    let (orphan, _, holder_session) = poll_async("the first send's key", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok(keys_under(&mut admin, "lock:lost/").await?.first().cloned()) }
    })
    .await?;
    // The client's two leases: its holder session, which the key is on,
    // and its waiter session, which expires now.
    let leases = admin.leases().await?;
    let ids: Vec<i64> = leases.leases().iter().map(|l| l.id()).collect();
    ensure!(ids.len() == 2 && ids.contains(&holder_session), "{ids:?}");
    let waiter_session = ids
        .into_iter()
        .find(|id| *id != holder_session)
        .context("the waiter session")?;
    admin.lease_revoke(waiter_session).await?;
    drop(deliver);

    let held = tokio::time::timeout(Duration::from_secs(10), acquire)
        .await
        .context("the acquisition never returned")???;
    let keys = keys_under(&mut admin, "lock:lost/").await?;
    let [(key, _, _)] = keys.as_slice() else {
        bail!("one key expected: {keys:?}");
    };
    assert_eq!(key, held.key(), "the holder's key is the only one");
    assert_ne!(key, &orphan, "the first send's key was deleted");
    held.release().await?;
    Ok(())
}

/// The revision etcd is at.
async fn revision_now(admin: &mut etcd_client::Client) -> Result<i64> {
    let reply = admin.get("revision", None).await?;
    Ok(reply.header().context("a header")?.revision())
}

/// A waiter whose key a revoke deleted just after it became first is not
/// told it holds, though a member that has not applied the revoke still
/// shows its key first: on the holder's session (a ttl of at most the
/// waiter lease) the look that decides reads linearizably; on the waiter
/// session the move to the holder's session compares the key and finds it
/// gone. Either way the waiter queues again and gets the free lock with a
/// fence above the revocation fence. The order is made deterministic: the
/// waiter's grant reply is held back until the revoke returned, and its
/// serializable reads are served as of the revision before the revoke.
/// (A serializable look on the holder's session, trusted when it showed
/// the waiter's key, told it that it held with its deleted key's fence,
/// below the revocation fence.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_revoked_as_it_became_first_is_not_told_it_holds() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let waiter = LockClient::connect(&t.cluster.url()).await?;
    // Holder's session (2 s: no waiter session) and waiter session (30 s).
    for (name, ttl) in [("short", 2), ("long", 30)] {
        let prefix = format!("lock:{name}/");
        let holder = t
            .client
            .acquire(name, &t.client.options().ttl(Duration::from_secs(30)))
            .await?;
        let deliver = etcd_hold_next_reply(&waiter, false)?;
        let acquire = {
            let client = waiter.clone();
            let opts = waiter
                .options()
                .ttl(Duration::from_secs(ttl))
                .wait(Duration::from_secs(10));
            tokio::spawn(async move { client.acquire(name, &opts).await })
        };
        let admin_ref = &admin;
        let queued = poll_async("the waiter's key", POLL_DEADLINE, || {
            let (mut admin, prefix) = (admin_ref.clone(), prefix.clone());
            async move {
                let keys = keys_under(&mut admin, &prefix).await?;
                Ok((keys.len() == 2).then(|| keys[1].clone()))
            }
        })
        .await?;
        // The holder releases: the waiter's key is first. A member stops
        // applying here; the revoke deletes the waiter's key.
        holder.release().await?;
        let behind = revision_now(&mut admin).await?;
        let revoked = t.client.revoke(name, &t.client.options(), &[]).await?;
        ensure!(
            revoked.deposed.is_some() && keys_under(&mut admin, &prefix).await?.is_empty(),
            "{name}: the revoke deleted the waiter's key {queued:?}: {revoked:?}"
        );
        etcd_serve_stale_reads(&waiter, Some(behind))?;
        drop(deliver);

        let held = tokio::time::timeout(Duration::from_secs(10), acquire)
            .await
            .with_context(|| format!("{name}: the acquisition never returned"))???;
        etcd_serve_stale_reads(&waiter, None)?;
        assert!(
            held.fence() > revoked.fence,
            "{name}: told it holds with fence {} at or below the revocation fence {}",
            held.fence(),
            revoked.fence
        );
        match t.client.inspect(name, KeyLayout::default()).await? {
            LockState::Held { fence, .. } => {
                assert_eq!(fence, Some(held.fence()), "{name}: its key holds the lock");
            }
            other => bail!("{name}: held expected, got {other:?}"),
        }
        held.release().await?;
    }
    Ok(())
}
