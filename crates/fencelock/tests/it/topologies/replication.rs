//! Replication acknowledgement (`WAIT`): a primary with one replica (the
//! replica started with `--replicaof`). A grant or fenced write acknowledged
//! by enough replicas succeeds; with fewer, the grant is released again and
//! the error says how many acknowledged.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use fencelock::{Error, LockClient};
use fencelock_testkit::RedisServer;

use crate::support::Keys;

#[tokio::test]
async fn grants_and_writes_wait_for_their_replicas() -> Result<()> {
    let primary = RedisServer::start();
    let replica = primary.start_replica();
    let client = LockClient::connect(&primary.url()).await?;
    let one = client
        .options()
        .wait_for_replicas(1, Duration::from_millis(500));
    let lease = client.try_acquire("replicated", &one).await?;
    // Acknowledged means the replica has it.
    ensure!(replica.get("lock:{replicated}").is_some());
    ensure!(lease.release().await?.is_released());

    let two = client
        .options()
        .wait_for_replicas(2, Duration::from_millis(50));
    match client.try_acquire("replicated", &two).await {
        Err(Error::NotReplicated {
            name,
            acked,
            wanted,
        }) => ensure!((name.as_str(), acked, wanted) == ("replicated", 1, 2)),
        other => bail!("expected NotReplicated, got {:?}", other.map(|l| l.fence())),
    }
    ensure!(
        !primary.exists("lock:{replicated}"),
        "the unacknowledged grant was not released"
    );

    let lease = client.try_acquire("writer", &client.options()).await?;
    let hash = client
        .fenced_hash("doc")?
        .wait_for_replicas(2, Duration::from_millis(50));
    match hash.write(lease.fence(), lease.token(), "v").await {
        Err(Error::WriteNotReplicated {
            acked: 1,
            wanted: 2,
            ..
        }) => {}
        other => bail!("expected WriteNotReplicated, got {other:?}"),
    }
    let hash = hash.wait_for_replicas(1, Duration::from_millis(500));
    ensure!(
        hash.write(lease.fence(), lease.token(), "v")
            .await?
            .is_accepted()
    );
    ensure!(replica.hgetall("doc").get("value").map(String::as_str) == Some("v"));
    ensure!(lease.release().await?.is_released());

    // Bad settings are refused before anything is sent.
    let zero = client
        .options()
        .wait_for_replicas(0, Duration::from_millis(50));
    ensure!(matches!(
        client.try_acquire("x", &zero).await,
        Err(Error::InvalidOption(_))
    ));
    Ok(())
}
