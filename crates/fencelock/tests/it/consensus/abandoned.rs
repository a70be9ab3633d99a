//! Waiters that give up on etcd leave no key behind: an `acquire` whose
//! wait runs out has revoked its leases when it returns, a dropped one
//! revokes them in the background (`LockClient::flush` waits for that), and
//! a waiter that dies keeps its key only for the short waiter lease, never
//! for the lock's ttl.
//!
//! The waiters run as "processes": a runtime of their own, dropped at the
//! end like a process that exits, so nothing left in the background after
//! the call returns gets to run.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use fencelock::{Error, FENCE_EPOCH_SIZE, KeyLayout, LockClient, LockState};
use fencelock_testkit::EtcdCluster;
use tokio::runtime::Runtime;
use tokio::time::Instant;

use crate::support::etcd::{admin, keys_under, lease_ttl};
use crate::support::poll_async;

/// The lock's ttl: far longer than any bound below.
const TTL: Duration = Duration::from_secs(30);

fn runtime() -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Runs `work` with a client of `cluster` in a runtime of its own, then
/// drops the runtime: what the work left running is cancelled.
fn as_a_process<T>(
    cluster: &EtcdCluster,
    work: impl AsyncFnOnce(LockClient) -> Result<T>,
) -> Result<T> {
    let rt = runtime()?;
    let url = cluster.url();
    let out = rt.block_on(async move { work(LockClient::connect(&url).await?).await });
    drop(rt);
    out
}

/// The keys of lock `name` with their create revisions and leases.
async fn keys_of(cluster: &EtcdCluster, name: &str) -> Result<Vec<(String, i64, i64)>> {
    keys_under(&mut admin(cluster).await?, &format!("lock:{name}/")).await
}

/// An `acquire` whose wait runs out has removed its waiter's key by the
/// time it returns `Timeout`, although its process ends right after; the
/// holder's release then leaves the lock free.
#[test]
fn etcd_a_timed_out_acquire_has_removed_its_key_when_it_returns() -> Result<()> {
    let cluster = EtcdCluster::single();
    let main = runtime()?;
    let (client, held) = main.block_on(async {
        let client = LockClient::connect(&cluster.url()).await?;
        let held = client.acquire("busy", &client.options().ttl(TTL)).await?;
        anyhow::Ok((client, held))
    })?;
    let timed_out = as_a_process(&cluster, async |c| {
        let opts = c.options().ttl(TTL).wait(Duration::from_millis(500));
        Ok(c.acquire("busy", &opts).await)
    })?;
    assert!(
        matches!(&timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    main.block_on(async {
        let keys = keys_of(&cluster, "busy").await?;
        assert_eq!(keys.len(), 1, "only the holder's key: {keys:?}");
        held.release().await?;
        assert_eq!(
            client.inspect("busy", KeyLayout::default()).await?,
            LockState::Free { last_fence: None }
        );
        client
            .try_acquire("busy", &client.options())
            .await?
            .release()
            .await?;
        Ok(())
    })
}

/// An `acquire` future dropped while it waits revokes its leases in the
/// background; `flush` waits for that, so a process that flushes before it
/// ends leaves no key. One that does not flush leaves its key on the short
/// waiter lease only: gone within a few seconds, not the 30 s ttl.
#[test]
fn etcd_a_dropped_acquire_removes_its_key_and_flush_waits_for_it() -> Result<()> {
    let cluster = EtcdCluster::single();
    let main = runtime()?;
    let held = main.block_on(async {
        let client = LockClient::connect(&cluster.url()).await?;
        anyhow::Ok(client.acquire("busy", &client.options().ttl(TTL)).await?)
    })?;
    // Queues an acquisition, then drops it (at the end of the block).
    let queued = |c: LockClient| async move {
        {
            let opts = c.options().ttl(TTL).wait(Duration::from_secs(60));
            let acquire = c.acquire("busy", &opts);
            tokio::pin!(acquire);
            let give_up = Instant::now() + Duration::from_secs(10);
            loop {
                tokio::select! {
                    r = &mut acquire => bail!("the acquisition ended: {r:?}"),
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
                if c.waiters("busy", KeyLayout::default()).await? == 1 {
                    break;
                }
                if Instant::now() > give_up {
                    bail!("never queued");
                }
            }
        }
        anyhow::Ok(c)
    };

    as_a_process(&cluster, async |c| {
        let c = queued(c).await?;
        c.flush().await;
        Ok(())
    })?;
    main.block_on(async {
        let keys = keys_of(&cluster, "busy").await?;
        assert_eq!(keys.len(), 1, "flushed: only the holder's key: {keys:?}");
        anyhow::Ok(())
    })?;

    as_a_process(&cluster, async |c| {
        queued(c).await?;
        Ok(())
    })?;
    let dropped = Instant::now();
    main.block_on(poll_async(
        "the unflushed waiter's key to expire",
        Duration::from_secs(5),
        || async { Ok((keys_of(&cluster, "busy").await?.len() == 1).then_some(())) },
    ))?;
    assert!(dropped.elapsed() < Duration::from_secs(5));
    main.block_on(held.release())?;
    Ok(())
}

/// A waiter's key sits on the client's short waiter session (2 s granted,
/// whatever the ttl) while it waits, and moves to the holder's session of
/// the full ttl when it is first: the same key, the same create revision,
/// so the fence is that revision. The client has two leases, whatever its
/// number of locks and waiters: its holder session and its waiter session,
/// which expires once nobody waits.
#[test]
fn etcd_waiters_queue_on_a_short_lease_and_hold_on_the_ttl() -> Result<()> {
    let cluster = EtcdCluster::single();
    let rt = runtime()?;
    rt.block_on(async {
        let mut admin = admin(&cluster).await?;
        let client = LockClient::connect(&cluster.url()).await?;
        let opts = client.options().ttl(TTL).wait(Duration::from_secs(30));
        let first = client.acquire("q", &opts).await?;
        assert_eq!(
            admin.leases().await?.leases().len(),
            2,
            "the client's holder and waiter sessions"
        );
        let first_lease = keys_of(&cluster, "q").await?[0].2;
        let (c2, o2) = (client.clone(), opts.clone());
        let second = tokio::spawn(async move { c2.acquire("q", &o2).await });
        let (key, revision, waiter_lease) =
            poll_async("the waiter", Duration::from_secs(10), || async {
                let keys = keys_of(&cluster, "q").await?;
                Ok((keys.len() == 2).then(|| keys[1].clone()))
            })
            .await?;
        let (_, granted) = lease_ttl(&mut admin, waiter_lease)
            .await?
            .context("the waiter lease")?;
        assert_eq!(granted, 2, "the waiter's key is on a 2 s lease");
        first.release().await?;
        let second = second.await??;
        assert_eq!(second.key(), key, "the same key");
        assert_eq!(second.fence().get(), FENCE_EPOCH_SIZE + revision as u64);
        let keys = keys_of(&cluster, "q").await?;
        let [(k, r, holder_lease)] = keys.as_slice() else {
            bail!("one key expected: {keys:?}");
        };
        assert_eq!((k, *r), (&key, revision), "same key, same create revision");
        let (_, granted) = lease_ttl(&mut admin, *holder_lease)
            .await?
            .context("the holder's lease")?;
        assert_eq!(granted, 30, "the holder's key is on the ttl's lease");
        assert_eq!(
            keys_of(&cluster, "q").await?[0].2,
            first_lease,
            "the holder's session is the first holder's"
        );
        poll_async(
            "the waiter session to expire once nobody waits",
            Duration::from_secs(5),
            || async {
                Ok(lease_ttl(&mut admin.clone(), waiter_lease)
                    .await?
                    .is_none()
                    .then_some(()))
            },
        )
        .await?;
        second.release().await?;
        Ok(())
    })
}
