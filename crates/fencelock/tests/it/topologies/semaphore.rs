//! The fenced semaphore on every Redis deployment: over TLS, through
//! Sentinel across a failover, on a Cluster (all keys of a name on one
//! node, wake-ups over sharded pub/sub), and with grants that wait for
//! their replicas.

use std::time::Duration;

use crate::support::Keys;
use anyhow::{Context, Result, bail, ensure};
use fencelock::{Error, KeyLayout, LockClient, LockState, WaitMode};
use fencelock_testkit::{RedisCluster, RedisConfig, RedisSentinel, RedisServer, TlsConfig};

/// Two permits of `client` held, a waiter of `other` woken when one frees
/// (long before the 5 s leases would end), renewals carrying the permits
/// past their ttl, fences growing across slots.
async fn permits_work_end_to_end(
    client: &LockClient,
    other: LockClient,
    mode: WaitMode,
) -> Result<()> {
    let ttl = Duration::from_millis(900);
    let opts = client.options().permits(2).ttl(ttl).wait_mode(mode);
    let a = client.try_acquire("pool", &opts).await?;
    let b = client.try_acquire("pool", &opts).await?;
    ensure!((a.slot(), b.slot()) == (Some(0), Some(1)));
    ensure!(b.fence() > a.fence());
    let wait = opts.clone().wait(Duration::from_secs(20));
    let waiting = tokio::spawn(async move { other.acquire("pool", &wait).await });
    tokio::time::sleep(ttl * 2).await; // renewals happen
    ensure!(!a.is_lost() && !b.is_lost(), "a permit was not renewed");
    ensure!(
        !waiting.is_finished(),
        "a third holder got in with two permits"
    );
    let released = tokio::time::Instant::now();
    let top = b.fence();
    ensure!(a.release().await?.is_released());
    let c = waiting.await??;
    ensure!(
        released.elapsed() < ttl,
        "the waiter was not woken by the release"
    );
    ensure!(c.slot() == Some(0) && c.fence() > top);
    ensure!(b.release().await?.is_released() && c.release().await?.is_released());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_semaphore_permits_work_end_to_end() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_tls(TlsConfig::default()));
    let files = server.tls_files().context("a TLS server")?;
    let connect = || async {
        LockClient::builder(server.url())
            .tls_ca(&files.ca_cert)
            .connect()
            .await
    };
    permits_work_end_to_end(&connect().await?, connect().await?, WaitMode::Notify).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_semaphore_keys_share_a_node_and_waiters_are_woken() -> Result<()> {
    let cluster = RedisCluster::start();
    let client = LockClient::connect(&cluster.seed_urls()[0]).await?;
    let keys = client.keys("pool", KeyLayout::HashTagged)?;
    ensure!(cluster.owner_of_key(keys.lock()) == cluster.owner_of_key(&keys.fence()));
    ensure!(cluster.owner_of_key(keys.lock()) == cluster.owner_of_key(&keys.queue()));
    let other = LockClient::connect(&cluster.seed_urls()[1]).await?;
    permits_work_end_to_end(&client, other, WaitMode::Fair).await?;
    // Permits of names on every shard, renewed in the keeper's batches
    // per node.
    let opts = client.options().permits(3).ttl(Duration::from_millis(600));
    let mut leases = Vec::new();
    for i in 0..30 {
        leases.push(client.try_acquire(&format!("pool:{i}"), &opts).await?);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for lease in leases {
        ensure!(!lease.is_lost(), "{} lost on the cluster", lease.name());
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_sentinel_semaphore_permits_replicated_before_a_failover_stay_held() -> Result<()> {
    let sentinel = RedisSentinel::start();
    let client = LockClient::connect(&sentinel.url()).await?;
    permits_work_end_to_end(
        &client,
        LockClient::connect(&sentinel.url()).await?,
        WaitMode::Notify,
    )
    .await?;
    // Permits granted and renewed with WAIT: a failover keeps them, so the
    // new primary refuses a third holder and the holders keep renewing.
    let opts = client
        .options()
        .permits(2)
        .ttl(Duration::from_secs(3))
        .wait_for_replicas(1, Duration::from_millis(500));
    let a = client.try_acquire("failover-pool", &opts).await?;
    let b = client.try_acquire("failover-pool", &opts).await?;
    let old = sentinel.primary();
    sentinel.failover();
    let new = sentinel.wait_new_primary(old);
    ensure!(new != old);
    let after = LockClient::connect(&sentinel.url()).await?;
    match after
        .try_acquire("failover-pool", &after.options().permits(2))
        .await
    {
        Err(Error::Contended { .. }) => {}
        other => bail!("a third permit after the failover: {other:?}"),
    }
    match after
        .inspect("failover-pool", KeyLayout::HashTagged)
        .await?
    {
        LockState::Semaphore { holders, .. } => {
            let slots: Vec<u32> = holders.iter().map(|h| h.slot).collect();
            ensure!(slots == [0, 1], "{slots:?}");
        }
        other => bail!("inspect after the failover: {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    ensure!(
        !a.is_lost() && !b.is_lost(),
        "a permit was lost across the failover"
    );
    ensure!(a.release().await?.is_released() && b.release().await?.is_released());
    Ok(())
}

/// A permit whose grant too few replicas acknowledged is given back: its
/// slot is free at once, and the error says why.
#[tokio::test]
async fn a_permit_not_replicated_in_time_is_given_back() -> Result<()> {
    let primary = RedisServer::start();
    let replica = primary.start_replica();
    let client = LockClient::connect(&primary.url()).await?;
    let opts = client
        .options()
        .permits(1)
        .ttl(Duration::from_secs(3))
        .wait_for_replicas(1, Duration::from_millis(500));
    let replicated = client.try_acquire("replicated-pool", &opts).await?;
    ensure!(replica.hgetall(replicated.key()).contains_key("0"));
    ensure!(replicated.release().await?.is_released());
    let frozen = replica.pause_guard();
    match client.try_acquire("replicated-pool", &opts).await {
        Err(Error::NotReplicated {
            acked: 0,
            wanted: 1,
            ..
        }) => {}
        other => bail!("expected NotReplicated, got {other:?}"),
    }
    drop(frozen);
    // Given back: the one slot is free for a grant without replicas.
    let next = client
        .try_acquire("replicated-pool", &client.options().permits(1))
        .await?;
    ensure!(next.slot() == Some(0));
    ensure!(next.release().await?.is_released());
    Ok(())
}
