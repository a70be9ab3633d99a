//! `LockClient::revoke` on every deployment: the deposed holder's write,
//! sent right after the revoke returns, is refused at the sealed resource;
//! a waiter queued at the time gets the lock next, with a fence above the
//! revocation fence, and its writes are accepted; the deposed holder's loss
//! signal fires; the revoke is counted. Negative control: a revoke that
//! deposes without sealing (no resources) lets the deposed holder's write
//! through. Also: a free lock is sealed against a holder whose lease ended,
//! a seal overrides an equal fence from any holder (which `register` does
//! not), an ACL user without `+unlink` cannot revoke and changes nothing,
//! and a resource that cannot be sealed is named in the error.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, Fence, Fenced, KeyLayout, LockClient, REVOKED_HOLDER, Sealable, WaitMode, WriteOutcome,
    holder_id,
};
use fencelock_testkit::{RedisCluster, RedisConfig, RedisSentinel, RedisServer, TlsConfig};
use tokio::time::Instant;

use crate::support::{Keys, POLL_DEADLINE, TestRedis};

const NAME: &str = "job:revoke";

/// Waits until `client` sees at least one waiter of `NAME`.
async fn until_queued(client: &LockClient) -> Result<()> {
    let deadline = Instant::now() + POLL_DEADLINE;
    while client.waiters(NAME, KeyLayout::HashTagged).await? == 0 {
        ensure!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// A holder of `NAME` on `holder` writes the resource; a waiter on `waiter`
/// queues; `revoker` revokes, sealing the resource if `seal`. Returns
/// whether the deposed holder's write right after the revoke was accepted;
/// checks everything else a revoke promises.
async fn revoke_scenario<R>(
    holder: &LockClient,
    waiter: &LockClient,
    revoker: &LockClient,
    resource: impl Fn(&LockClient) -> Result<R>,
    seal: bool,
) -> Result<bool>
where
    R: Fenced<Write = str> + Sealable + Send + Sync + 'static,
{
    revoke_scenario_in(WaitMode::Notify, holder, waiter, revoker, resource, seal).await
}

/// [`revoke_scenario`] with a waiter in wait mode `mode`.
async fn revoke_scenario_in<R>(
    mode: WaitMode,
    holder: &LockClient,
    waiter: &LockClient,
    revoker: &LockClient,
    resource: impl Fn(&LockClient) -> Result<R>,
    seal: bool,
) -> Result<bool>
where
    R: Fenced<Write = str> + Sealable + Send + Sync + 'static,
{
    let opts = holder.options().ttl(Duration::from_secs(3));
    let lease = holder.acquire(NAME, &opts).await?;
    let (at_holder, at_waiter, at_revoker) =
        (resource(holder)?, resource(waiter)?, resource(revoker)?);
    ensure!(
        at_holder
            .fenced_write(lease.fence(), lease.token(), "before")
            .await?
            .is_accepted()
    );
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let opts = waiter
            .options()
            .ttl(Duration::from_secs(3))
            .wait_mode(mode)
            .wait(Duration::from_secs(20));
        async move { waiter.acquire(NAME, &opts).await }
    });
    until_queued(revoker).await?;

    let sealed: Vec<&dyn Sealable> = if seal { vec![&at_revoker] } else { vec![] };
    let revoked = revoker.revoke(NAME, &revoker.options(), &sealed).await?;
    // Sent at once: the deposed holder has not been told yet.
    let late = at_holder
        .fenced_write(lease.fence(), lease.token(), "late")
        .await?;

    let deposed = revoked.deposed.clone().context("a holder was deposed")?;
    ensure!(deposed.holder == holder_id(lease.token()), "{deposed:?}");
    ensure!(deposed.fence == Some(lease.fence()), "{deposed:?}");
    ensure!(revoked.fence >= lease.fence(), "{revoked:?}");
    if seal {
        ensure!(revoked.sealed.len() == 1, "{revoked:?}");
        match &revoked.sealed[0].outcome {
            WriteOutcome::Accepted => {}
            WriteOutcome::Rejected { current_fence, .. } => {
                ensure!(*current_fence > Some(revoked.fence), "{revoked:?}");
            }
            other => bail!("unexpected seal outcome {other:?}"),
        }
    }

    // Waiters keep their places: the queued one is next, above the
    // revocation fence, and the resource takes its writes.
    let next = waiting.await??;
    ensure!(
        next.fence() > revoked.fence,
        "{revoked:?} then {}",
        next.fence()
    );
    ensure!(
        at_waiter
            .fenced_write(next.fence(), next.token(), "next")
            .await?
            .is_accepted()
    );
    // The deposed holder hears of it at its next renewal.
    tokio::time::timeout(POLL_DEADLINE, lease.lost())
        .await
        .context("the deposed holder's loss signal never fired")?;
    let stats = revoker.stats();
    let counted = stats.lock("job").map_or(0, |s| s.revokes);
    ensure!(counted == 1, "revokes counted: {counted}");
    next.release().await?;
    drop(lease);
    Ok(late.is_accepted())
}

/// Three clients of `url`.
async fn three(url: &str) -> Result<[LockClient; 3]> {
    Ok([
        LockClient::connect(url).await?,
        LockClient::connect(url).await?,
        LockClient::connect(url).await?,
    ])
}

/// The scenario on three clients, sealing a Redis hash.
async fn on_redis_url(clients: [LockClient; 3]) -> Result<()> {
    let [holder, waiter, revoker] = clients;
    let hash = |c: &LockClient| Ok(c.fenced_hash("res:revoke")?);
    let accepted = revoke_scenario(&holder, &waiter, &revoker, hash, true).await?;
    ensure!(
        !accepted,
        "the deposed holder's write was accepted after the revoke"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_refuses_the_deposed_holder_at_once_and_the_waiter_goes_next() -> Result<()> {
    let server = RedisServer::start();
    on_redis_url(three(&server.url()).await?).await?;
    // The revocation fence and the seal are in Redis as documented.
    let sealed = server.hgetall("res:revoke");
    ensure!(
        sealed.get("value").map(String::as_str) == Some("next"),
        "{sealed:?}"
    );
    Ok(())
}

/// A fair waiter at the head is handed the lock by the revoke itself, with
/// a fence above the revocation fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_hands_the_lock_to_a_fair_waiter() -> Result<()> {
    let server = RedisServer::start();
    let [holder, waiter, revoker] = three(&server.url()).await?;
    let hash = |c: &LockClient| Ok(c.fenced_hash("res:fair")?);
    let accepted =
        revoke_scenario_in(WaitMode::Fair, &holder, &waiter, &revoker, hash, true).await?;
    ensure!(
        !accepted,
        "the deposed holder's write was accepted after the revoke"
    );
    Ok(())
}

/// Negative control: without a resource to seal, the deposed holder's
/// write right after the revoke is accepted (the write-time check alone
/// cannot know of the revoke).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sealing_the_deposed_holders_write_goes_through() -> Result<()> {
    let server = RedisServer::start();
    let [holder, waiter, revoker] = three(&server.url()).await?;
    let hash = |c: &LockClient| Ok(c.fenced_hash("res:unsealed")?);
    let accepted = revoke_scenario(&holder, &waiter, &revoker, hash, false).await?;
    ensure!(
        accepted,
        "expected the unsealed resource to take the late write"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_over_tls_refuses_the_deposed_holder() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_tls(TlsConfig::default()));
    let ca = server.tls_files().context("TLS files")?.ca_cert.clone();
    let c = || {
        LockClient::builder(server.url())
            .tls_ca(ca.clone())
            .connect()
    };
    on_redis_url([c().await?, c().await?, c().await?]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_revoke_waits_for_replicas_and_refuses_the_deposed_holder() -> Result<()> {
    let sentinel = RedisSentinel::start();
    let clients = three(&sentinel.url()).await?;
    // With replicas: the revoke is waited for on both.
    let opts = clients[2]
        .options()
        .wait_for_replicas(2, Duration::from_secs(2));
    let free = clients[2].revoke("free-job", &opts, &[]).await?;
    ensure!(free.deposed.is_none(), "{free:?}");
    on_redis_url(clients).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_revoke_refuses_the_deposed_holder() -> Result<()> {
    let cluster = RedisCluster::start();
    on_redis_url(three(&cluster.cluster_url()).await?).await
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_revoke_refuses_the_deposed_holder_and_lets_the_waiter_write() -> Result<()> {
    let etcd = fencelock_testkit::EtcdCluster::single();
    let [holder, waiter, revoker] = three(&etcd.url()).await?;
    let key = |c: &LockClient| Ok(c.fenced_key("res/revoke")?);
    let accepted = revoke_scenario(&holder, &waiter, &revoker, key, true).await?;
    ensure!(
        !accepted,
        "the deposed holder's write was accepted after the revoke"
    );
    // Negative control on etcd: without the seal the late write lands.
    let key = |c: &LockClient| Ok(c.fenced_key("res/unsealed")?);
    let [holder, waiter, revoker] = three(&etcd.url()).await?;
    let accepted = revoke_scenario(&holder, &waiter, &revoker, key, false).await?;
    ensure!(accepted, "expected the unsealed key to take the late write");
    Ok(())
}

/// On etcd a waiter queued right after the holder has the next revision,
/// so the revocation fence is the deposed holder's own: the seal must take
/// that fence over from the holder (the write rule would keep the holder
/// in, and its late write would land).
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_revoke_seals_the_deposed_holders_own_fence() -> Result<()> {
    let etcd = fencelock_testkit::EtcdCluster::single();
    let [holder, waiter, revoker] = three(&etcd.url()).await?;
    let lease = holder
        .acquire(NAME, &holder.options().ttl(Duration::from_secs(3)))
        .await?;
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let opts = waiter.options().wait(Duration::from_secs(20));
        async move { waiter.acquire(NAME, &opts).await }
    });
    until_queued(&revoker).await?;
    // The holder writes after the waiter queued: no revision in between.
    let key = holder.fenced_key("res/own")?;
    ensure!(
        key.write(lease.fence(), lease.token(), "a")
            .await?
            .is_accepted()
    );
    let sealed = revoker.fenced_key("res/own")?;
    let revoked = revoker.revoke(NAME, &revoker.options(), &[&sealed]).await?;
    ensure!(
        revoked.fence == lease.fence(),
        "{revoked:?}: the equal case"
    );
    ensure!(revoked.sealed[0].outcome == WriteOutcome::Accepted);
    ensure!(
        !key.write(lease.fence(), lease.token(), "late")
            .await?
            .is_accepted()
    );
    let next = waiting.await??;
    ensure!(next.fence() > revoked.fence);
    let at_waiter = waiter.fenced_key("res/own")?;
    ensure!(
        at_waiter
            .write(next.fence(), next.token(), "b")
            .await?
            .is_accepted()
    );
    next.release().await?;
    drop(lease);
    Ok(())
}

/// A free lock: nothing is deposed, and the resource is sealed all the
/// same, against a holder whose lease ended but who still writes.
#[tokio::test]
async fn revoking_a_free_lock_seals_against_an_expired_holder() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let hash = client.fenced_hash("res:free")?;
    let lease = client.acquire(NAME, &client.options()).await?;
    let (fence, token) = (lease.fence(), lease.token().to_owned());
    ensure!(hash.write(fence, &token, "v1").await?.is_accepted());
    // The lease ends while its holder is paused (here: its key goes), and
    // the holder writes later with the fence it had.
    server.cmd(&["DEL", &format!("lock:{{{NAME}}}")]);
    let revoked = client.revoke(NAME, &client.options(), &[&hash]).await?;
    ensure!(revoked.deposed.is_none(), "{revoked:?}");
    ensure!(revoked.fence > fence, "{revoked:?}");
    ensure!(!hash.write(fence, &token, "zombie").await?.is_accepted());
    drop(lease);
    let state = hash.read().await?;
    ensure!(state.value.as_deref() == Some("v1"), "{state:?}");
    ensure!(state.holder.as_deref() == Some(REVOKED_HOLDER), "{state:?}");
    ensure!(state.fence == Some(revoked.fence), "{state:?}");
    Ok(())
}

/// A seal records an equal fence over its holder (that holder is the one
/// revoked), which refuses that holder's next write at that fence; a
/// `register` by another holder at the same fence is refused instead (the
/// negative control: sealing with the write rule would leave the holder
/// in). A greater fence stored already is reported, not overwritten, and
/// a greater fence is accepted after a seal.
#[tokio::test]
async fn a_seal_takes_an_equal_fence_from_its_holder() -> Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let hash = client.fenced_hash("res:equal")?;
    let f = Fence::new(40);
    ensure!(hash.write(f, "holder-a", "a").await?.is_accepted());
    ensure!(!hash.register(f, "holder-b").await?.is_accepted());
    ensure!(hash.write(f, "holder-a", "a2").await?.is_accepted());
    ensure!(hash.seal(f).await? == WriteOutcome::Accepted);
    ensure!(!hash.write(f, "holder-a", "late").await?.is_accepted());
    ensure!(
        hash.seal(Fence::new(39)).await?
            == WriteOutcome::Rejected {
                current_fence: Some(f),
                current_holder: Some(REVOKED_HOLDER.into()),
            }
    );
    ensure!(
        hash.write(Fence::new(41), "holder-c", "c")
            .await?
            .is_accepted()
    );
    let state = hash.read().await?;
    ensure!(state.value.as_deref() == Some("c"), "{state:?}");
    Ok(())
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn an_etcd_seal_takes_an_equal_fence_and_keeps_the_value() -> Result<()> {
    let etcd = fencelock_testkit::EtcdCluster::single();
    let client = LockClient::connect(&etcd.url()).await?;
    let key = client.fenced_key("res/equal")?;
    let f = Fence::new(40);
    ensure!(key.write(f, "holder-a", "a").await?.is_accepted());
    ensure!(!key.register(f, "holder-b").await?.is_accepted());
    ensure!(key.seal(f).await? == WriteOutcome::Accepted);
    ensure!(!key.write(f, "holder-a", "late").await?.is_accepted());
    let state = key.read().await?;
    ensure!(state.value.as_deref() == Some("a"), "{state:?}");
    ensure!(state.holder.as_deref() == Some(REVOKED_HOLDER), "{state:?}");
    ensure!(state.fence == Some(f), "{state:?}");
    ensure!(!key.seal(Fence::new(39)).await?.is_accepted());
    ensure!(
        key.write(Fence::new(41), "holder-c", "c")
            .await?
            .is_accepted()
    );
    // A key that did not exist is sealed too: an old fence cannot create it.
    let fresh = client.fenced_key("res/fresh")?;
    ensure!(fresh.seal(f).await?.is_accepted());
    ensure!(!fresh.write(f, "holder-a", "x").await?.is_accepted());
    Ok(())
}

/// A user without `+unlink` cannot revoke: the error names the permission,
/// and the holder, its lock and the fence key are as they were.
#[tokio::test]
async fn a_user_without_unlink_cannot_revoke_and_changes_nothing() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&[
        "ACL",
        "SETUSER",
        "worker",
        "reset",
        "on",
        ">worker-pass",
        "~*",
        "&*",
        "+@all",
        "-unlink",
    ]);
    let url = server
        .url()
        .replacen("redis://", "redis://worker:worker-pass@", 1);
    let worker = LockClient::connect(&url).await?;
    let lease = client.acquire(NAME, &client.options()).await?;
    let lock_key = format!("lock:{{{NAME}}}");
    let (value, fence) = (
        server.get(&lock_key),
        server.get(&format!("{lock_key}:fence")),
    );
    let hash = worker.fenced_hash("res:acl")?;
    match worker.revoke(NAME, &worker.options(), &[&hash]).await {
        Err(Error::NoPermission { fix, .. }) => ensure!(fix.contains("+unlink"), "{fix}"),
        other => bail!("expected a missing +unlink permission, got {other:?}"),
    }
    ensure!(server.get(&lock_key) == value);
    ensure!(server.get(&format!("{lock_key}:fence")) == fence);
    ensure!(!server.exists("res:acl"));
    ensure!(!lease.is_lost());
    lease.release().await?;
    Ok(())
}

/// A resource that cannot be sealed (a key of another type) is named in the
/// error, which says the lock was revoked; the other resource was sealed.
#[tokio::test]
async fn a_resource_that_cannot_be_sealed_is_named() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&["SET", "res:string", "not a hash"]);
    let good = client.fenced_hash("res:good")?;
    let bad = client.fenced_hash("res:string")?;
    let lease = client.acquire(NAME, &client.options()).await?;
    match client.revoke(NAME, &client.options(), &[&good, &bad]).await {
        Err(e @ Error::RevokeIncomplete { .. }) => {
            let text = e.to_string();
            ensure!(
                text.contains("res:string") && text.contains("was revoked"),
                "{text}"
            );
            ensure!(e.is_config(), "{e:?}");
        }
        other => bail!("expected RevokeIncomplete, got {other:?}"),
    }
    ensure!(good.read().await?.holder.as_deref() == Some(REVOKED_HOLDER));
    tokio::time::timeout(POLL_DEADLINE, lease.lost())
        .await
        .context("the deposed holder was never told")?;
    Ok(())
}

/// Hostile names are refused before anything is changed.
#[tokio::test]
async fn revoke_refuses_bad_names_and_options() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let huge = "x".repeat(100_000);
    for name in ["", huge.as_str(), "a\u{0}b", "{brace}"] {
        match client.revoke(name, &client.options(), &[]).await {
            Err(e) if e.is_invalid_input() => {}
            other => bail!("{name:.20?}: expected invalid input, got {other:?}"),
        }
    }
    // A lock's own key is no resource: sealing it would break the lock. In
    // the hash-tagged layout no fenced hash is made there at all; in the
    // guide layout, where any key under the prefix may be some lock's, the
    // revoke refuses the lock's own keys.
    for key in ["lock:{job:revoke}", "lock:{job:revoke}:fence"] {
        let made = client.fenced_hash(key);
        ensure!(
            matches!(made, Err(Error::InvalidName { .. })),
            "{key}: {made:?}"
        );
    }
    let guide = client.options().layout(KeyLayout::Guide);
    let lease = client.acquire(NAME, &guide).await?;
    for key in ["lock:job:revoke", "lock:job:revoke:fence"] {
        let own = client.fenced_hash(key)?;
        match client.revoke(NAME, &guide, &[&own]).await {
            Err(e) if e.is_invalid_input() => {
                ensure!(e.to_string().contains("nothing was changed"), "{e}");
            }
            other => bail!("{key}: expected invalid input, got {other:?}"),
        }
    }
    ensure!(!lease.is_lost());
    lease.release().await?;
    ensure!(server.dbsize() == 1, "only the fence key may be left");
    // A unicode name is a name like any other.
    let revoked = client.revoke("facture:é🔒", &client.options(), &[]).await?;
    ensure!(revoked.deposed.is_none());
    Ok(())
}

/// A revoke right after the server restarted: the restart broke the
/// client's connection, which the client only finds out by using it. The
/// revoke is sent once (it is not safe to repeat), so it first makes sure
/// of a live connection with an idempotent `PING` (retried as any
/// idempotent call), and goes through instead of failing with a broken
/// pipe. Also on a client that never used its connection since.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoke_right_after_a_server_restart_goes_through() -> Result<()> {
    let mut server = RedisServer::start();
    let client = LockClient::connect(&server.url()).await?;
    let lease = client.try_acquire(NAME, &client.options()).await?;
    ensure!(lease.release().await?.is_released());
    for round in 0..3 {
        tokio::task::block_in_place(|| server.restart());
        let revoked = client
            .revoke(NAME, &client.options(), &[])
            .await
            .with_context(|| format!("revoke {round} after a restart"))?;
        ensure!(revoked.deposed.is_none(), "{revoked:?}");
    }
    Ok(())
}
