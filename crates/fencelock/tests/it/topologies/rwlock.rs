//! The fenced read-write lock on every Redis deployment: over TLS, through
//! Sentinel across a failover, on a Cluster (all keys of a name on one
//! node, wake-ups over sharded pub/sub), with grants that wait for their
//! replicas.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{Error, KeyLayout, LockClient, LockState, WaitMode};
use fencelock_testkit::{RedisCluster, RedisConfig, RedisSentinel, RedisServer, TlsConfig};

/// Two readers of `client` held, a writer of `other` woken when the last
/// leaves (long before the leases would end), renewals carrying the
/// readers past their ttl, the writer's fence above their epoch, and a
/// later read validated clean against it.
async fn rwlock_works_end_to_end(
    client: &LockClient,
    other: LockClient,
    mode: WaitMode,
) -> Result<()> {
    let ttl = Duration::from_millis(900);
    let opts = client.options().ttl(ttl).wait_mode(mode);
    let lock = client.rwlock("shared")?;
    let doc = client.fenced_hash("shared:data")?;
    let a = lock.try_read(&opts).await?;
    let b = lock.try_read(&opts).await?;
    let epoch = a.fence();
    ensure!(
        b.fence() == epoch,
        "readers granted together share the epoch"
    );
    let wait = opts.clone().wait(Duration::from_secs(20));
    let writer = other.rwlock("shared")?;
    let waiting = tokio::spawn(async move { writer.write(&wait).await });
    tokio::time::sleep(ttl * 2).await; // renewals happen
    ensure!(!a.is_lost() && !b.is_lost(), "a reader was not renewed");
    ensure!(!waiting.is_finished(), "a writer got in with readers");
    ensure!(a.release().await?.is_released());
    let released = tokio::time::Instant::now();
    ensure!(b.release().await?.is_released());
    let w = waiting.await??;
    ensure!(
        released.elapsed() < ttl,
        "the writer was not woken by the release"
    );
    ensure!(w.fence() > epoch);
    ensure!(doc.write(w.fence(), w.token(), "v").await?.is_accepted());
    ensure!(
        !doc.read_validated(epoch).await?.is_clean(),
        "torn for the old epoch"
    );
    ensure!(w.release().await?.is_released());
    let reader = lock.try_read(&opts).await?;
    ensure!(doc.read_validated(reader.fence()).await?.is_clean());
    ensure!(reader.release().await?.is_released());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_rwlock_works_end_to_end() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_tls(TlsConfig::default()));
    let files = server.tls_files().context("a TLS server")?;
    let connect = || async {
        LockClient::builder(server.url())
            .tls_ca(&files.ca_cert)
            .connect()
            .await
    };
    rwlock_works_end_to_end(&connect().await?, connect().await?, WaitMode::Notify).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rwlock_keys_share_a_node_and_writers_are_woken() -> Result<()> {
    let cluster = RedisCluster::start();
    let client = LockClient::connect(&cluster.seed_urls()[0]).await?;
    let other = LockClient::connect(&cluster.seed_urls()[1]).await?;
    rwlock_works_end_to_end(&client, other, WaitMode::Fair).await?;
    // Readers of names on every shard, renewed in the keeper's batches per
    // node.
    let opts = client.options().ttl(Duration::from_millis(600));
    let mut leases = Vec::new();
    for i in 0..30 {
        leases.push(
            client
                .rwlock(&format!("shared:{i}"))?
                .try_read(&opts)
                .await?,
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for lease in leases {
        ensure!(!lease.is_lost(), "{} lost on the cluster", lease.name());
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_sentinel_rwlock_readers_replicated_before_a_failover_stay_held() -> Result<()> {
    let sentinel = RedisSentinel::start();
    let client = LockClient::connect(&sentinel.url()).await?;
    rwlock_works_end_to_end(
        &client,
        LockClient::connect(&sentinel.url()).await?,
        WaitMode::Notify,
    )
    .await?;
    // Readers granted and renewed with WAIT: a failover keeps them, so the
    // new primary refuses a writer and the readers keep renewing.
    let opts = client
        .options()
        .ttl(Duration::from_secs(3))
        .wait_for_replicas(1, Duration::from_millis(500));
    let lock = client.rwlock("failover-rw")?;
    let (a, b) = (lock.try_read(&opts).await?, lock.try_read(&opts).await?);
    let old = sentinel.primary();
    sentinel.failover();
    let new = sentinel.wait_new_primary(old);
    ensure!(new != old);
    let after = LockClient::connect(&sentinel.url()).await?;
    match after
        .rwlock("failover-rw")?
        .try_write(&after.options())
        .await
    {
        Err(Error::Contended { .. }) => {}
        other => bail!("a writer after the failover: {other:?}"),
    }
    match after.inspect("failover-rw", KeyLayout::HashTagged).await? {
        LockState::RwLock {
            writer: None,
            readers,
            ..
        } => ensure!(readers.len() == 2, "{readers:?}"),
        other => bail!("inspect after the failover: {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    ensure!(
        !a.is_lost() && !b.is_lost(),
        "a reader was lost across the failover"
    );
    ensure!(a.release().await?.is_released() && b.release().await?.is_released());
    Ok(())
}
