//! Replication acknowledgement (`WAIT`): a primary with one replica (the
//! replica started with `--replicaof`). A grant or fenced write acknowledged
//! by enough replicas succeeds; with fewer, the grant is released again and
//! the error says how many acknowledged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use fencelock::{Error, LockClient, LossReason};
use fencelock_testkit::RedisServer;

use crate::support::{Keys, poll_until};

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

/// A renewal waits for the replicas its grant waited for. With the replica
/// frozen after the grant, renewals reach the primary alone; a failover
/// could lose them and expire the lock on the new primary at the grant's
/// expiry, while the holder, trusting them, still worked. So they do not
/// count: the lease keeps its first deadline and is lost there, saying
/// why, while the explicit `extend` reports the too few replicas.
/// Negative control: a lease without replicas, renewed by the same client
/// through the same frozen replica, keeps its lock (were renewals counted
/// without their `WAIT`, the replicated lease would behave the same).
#[tokio::test]
async fn renewals_wait_for_the_replicas_the_grant_waited_for() -> Result<()> {
    let primary = RedisServer::start();
    let replica = primary.start_replica();
    let client = LockClient::connect(&primary.url()).await?;
    // The grant must be acknowledged while the replica runs, so its wait
    // is generous (a loaded machine can take a while to schedule the
    // replica); the ttl leaves room for the renewals that wait it out.
    let ttl = Duration::from_secs(3);
    let replicated = client
        .options()
        .ttl(ttl)
        .wait_for_replicas(1, Duration::from_millis(500));
    let lease = client.try_acquire("renewed", &replicated).await?;
    let alone = client
        .try_acquire("renewed-alone", &client.options().ttl(ttl))
        .await?;
    let granted = tokio::time::Instant::now();
    let _frozen = replica.pause_guard();
    match lease.extend().await {
        Err(Error::RenewalNotReplicated {
            name,
            acked: 0,
            wanted: 1,
        }) => ensure!(name == "renewed"),
        other => bail!("expected RenewalNotReplicated, got {other:?}"),
    }
    ensure!(
        tokio::time::timeout(3 * ttl, lease.lost()).await.is_ok(),
        "the lease outlived its grant's deadline on renewals no replica acknowledged"
    );
    ensure!(
        lease.loss_reason() == Some(LossReason::DeadlinePassed),
        "{:?}",
        lease.loss_reason()
    );
    ensure!(
        granted.elapsed() < ttl + Duration::from_millis(300),
        "lost only after {:?}",
        granted.elapsed()
    );
    // The same client's lease without replicas was renewed all along.
    ensure!(
        !alone.is_lost(),
        "the control lease without replicas was lost"
    );
    ensure!(alone.release().await?.is_released());
    Ok(())
}

/// A master under `min-replicas-to-write 1` whose replica is gone refuses
/// every write (`NOREPLICAS`): a waiting acquire keeps waiting through it,
/// hearing why, until the replica is back and the grant goes through. With
/// a wait of zero the refusal comes back at once, as one that may pass.
#[tokio::test(flavor = "multi_thread")]
async fn heavy_a_waiter_waits_through_noreplicas_until_a_replica_is_back() -> Result<()> {
    let primary = RedisServer::start();
    let mut replica = primary.start_replica();
    primary.cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    replica.kill();
    poll_until(
        "the master to refuse writes",
        Duration::from_secs(10),
        || {
            primary
                .try_cmd(&["SET", "probe", "1"])
                .is_err_and(|e| e.code() == Some("NOREPLICAS"))
        },
    )
    .await?;
    let client = LockClient::connect(&primary.url()).await?;

    let once = client.try_acquire("job", &client.options()).await;
    match &once {
        Err(e @ Error::Unreachable { source, .. }) => ensure!(
            source.code() == Some("NOREPLICAS") && e.is_retryable(),
            "{e}"
        ),
        other => bail!(
            "expected a NOREPLICAS refusal, got {:?}",
            other.as_ref().map(|l| l.fence())
        ),
    }

    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let acquiring = tokio::spawn({
        let (client, heard) = (client.clone(), Arc::clone(&heard));
        async move {
            let opts = client.options().wait(Duration::from_secs(20));
            let hear = |e: &Error| {
                let code = match e {
                    Error::Unreachable { source, .. } => source.code().unwrap_or("none"),
                    _ => "other",
                };
                heard
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(code.to_owned());
            };
            client.acquire_reporting("job", &opts, &hear).await
        }
    });
    poll_until(
        "the waiter to hear NOREPLICAS",
        Duration::from_secs(5),
        || heard_codes(&heard).len() >= 3,
    )
    .await?;
    ensure!(!acquiring.is_finished(), "the waiter gave up on NOREPLICAS");
    ensure!(
        heard_codes(&heard).iter().all(|code| code == "NOREPLICAS"),
        "{:?}",
        heard_codes(&heard)
    );

    replica.restart();
    let lease = tokio::time::timeout(Duration::from_secs(15), acquiring).await???;
    ensure!(primary.exists("lock:{job}"));
    ensure!(lease.release().await?.is_released());
    Ok(())
}

/// What the waiter heard so far.
fn heard_codes(heard: &Mutex<Vec<String>>) -> Vec<String> {
    heard.lock().unwrap_or_else(|p| p.into_inner()).clone()
}
