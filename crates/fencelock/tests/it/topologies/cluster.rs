//! Redis Cluster: 3 masters and 3 replicas (node timeout 2 s), started by
//! the testkit; clients use `redis+cluster://` (or a plain `redis://` seed,
//! which is detected).
//!
//! - Locks on many names spread over every shard; each lock's keys share a
//!   slot; notify and fair waiters are woken over sharded pub/sub; a grant
//!   waits for its replica (`WAIT`) on a node without the script loaded.
//! - Failover of the shard that holds a lock, under load: workers carry on,
//!   fences after the failover are above every fence before it, and no
//!   acknowledged increment is lost at a resource outside the cluster.
//! - The slot of a held lock migrates to another master while the lease is
//!   renewed; the lease is never lost and the release finds it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{KeyLayout, LockClient, LockState, ReleaseOutcome, WaitMode};
use fencelock_testkit::{RedisCluster, RedisServer};
use tokio::time::Instant;

use super::{CounterWorkers, counter_value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_spread_over_every_shard_and_wake_ups_are_sharded() -> Result<()> {
    let cluster = RedisCluster::start();
    // A plain redis:// URL of one node is detected as a Cluster seed.
    let client = LockClient::connect(&cluster.seed_urls()[0]).await?;
    let opts = client.options();
    // A grant that waits for its replica, on a node that has not loaded the
    // grant script yet: the NOSCRIPT inside the pipeline loads it.
    let replicated = opts
        .clone()
        .wait_for_replicas(1, Duration::from_millis(500));
    let lease = client.try_acquire("replicated", &replicated).await?;
    ensure!(lease.release().await?.is_released());
    let mut leases = Vec::new();
    let mut owners = BTreeSet::new();
    for i in 0..60 {
        let name = format!("job:{i}");
        let keys = client.keys(&name, KeyLayout::HashTagged)?;
        let owner = cluster.owner_of_key(keys.lock());
        ensure!(
            owner == cluster.owner_of_key(&keys.fence()),
            "{name}: keys in two slots"
        );
        owners.insert(owner);
        leases.push(client.try_acquire(&name, &opts).await?);
    }
    ensure!(
        owners.len() == 3,
        "60 names should reach all 3 masters: {owners:?}"
    );
    for lease in &leases {
        let state = client.inspect(lease.name(), KeyLayout::HashTagged).await?;
        ensure!(
            matches!(&state, LockState::Held { fence: Some(f), .. } if *f == lease.fence()),
            "{}: {state:?}",
            lease.name()
        );
    }
    // The audit has a row per master for what each node reports, and rows
    // for each replica a failover could promote: one that would evict
    // locks once promoted warns.
    let replicas = cluster.replicas();
    let evicting = cluster.node(replicas[0]);
    evicting.cmd(&["CONFIG", "SET", "maxmemory", "100mb"]);
    evicting.cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let audit = client.audit().await?;
    let topology = audit.check("topology").context("a topology row")?;
    ensure!(topology.found().contains("3 masters"), "{topology:?}");
    let rows = |check: &str| {
        audit
            .checks()
            .iter()
            .filter(|c| c.name().starts_with(&format!("{check}@")))
            .count()
    };
    for check in ["version", "eviction", "clock", "fences"] {
        ensure!(
            rows(check) == 3 + replicas.len(),
            "{check}: {} rows in {audit:?}",
            rows(check)
        );
    }
    ensure!(rows("role") == 3 && rows("replica") == replicas.len());
    ensure!(
        audit
            .check(&format!("eviction@{}", evicting.addr()))
            .map(|c| c.status())
            == Some(fencelock::audit::Status::Warn),
        "{audit:?}"
    );
    ensure!(
        audit.check("permissions").map(|c| c.status()) == Some(fencelock::audit::Status::Ok),
        "{audit:?}"
    );
    for lease in leases {
        ensure!(lease.release().await?.is_released());
    }

    // Wake-ups over sharded pub/sub: a waiter whose waiter lease is long is
    // woken by the release long before it would retry on its own.
    let cluster_client = LockClient::connect(&cluster.cluster_url()).await?;
    for mode in [WaitMode::Notify, WaitMode::Fair] {
        let name = format!("woken-{mode:?}");
        let holder = client.try_acquire(&name, &opts).await?;
        let waiter = cluster_client.clone();
        let wait = waiter
            .options()
            .wait_mode(mode)
            .waiter_lease(Duration::from_secs(30))
            .wait(Duration::from_secs(20));
        let waiting = {
            let name = name.clone();
            tokio::spawn(async move { waiter.acquire(&name, &wait).await })
        };
        // Until the waiter is queued, a release would find nobody to wake.
        let queue = client.keys(&name, KeyLayout::HashTagged)?.queue();
        let node = cluster.owner_of_key(&queue);
        let give_up = Instant::now() + Duration::from_secs(10);
        while cluster.node(node).query::<i64>(&["ZCARD", &queue]) == 0 {
            ensure!(
                Instant::now() < give_up,
                "{mode:?}: the waiter never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released = Instant::now();
        ensure!(holder.release().await?.is_released());
        let next = waiting.await??;
        ensure!(
            released.elapsed() < Duration::from_secs(2),
            "{mode:?}: woken after {:?}",
            released.elapsed()
        );
        ensure!(next.release().await?.is_released());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_cluster_failover_of_the_lock_shard_under_load() -> Result<()> {
    let cluster = Arc::new(RedisCluster::start());
    let resource = RedisServer::start();
    let shard = cluster.owner_of_key("lock:{ctr}");
    let mut workers = Vec::new();
    for _ in 0..6 {
        let locks = LockClient::connect(&cluster.cluster_url()).await?;
        let counter = LockClient::connect(&resource.url())
            .await?
            .fenced_hash("counter")?;
        workers.push((locks, counter));
    }
    let workers = CounterWorkers::spawn(workers);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let paused_at = Instant::now();
    cluster.pause(shard);
    // The testkit waits until a replica has taken the shard over.
    tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || cluster.wait_replaced(shard)
    })
    .await?;
    let failed_over = Instant::now();
    cluster.resume(shard);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tally = workers.stop().await?;
    tally.check_fences_across(paused_at, failed_over)?;
    let counter = LockClient::connect(&resource.url())
        .await?
        .fenced_hash("counter")?;
    let final_value = counter_value(&counter).await?;
    tally.check_counter(final_value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_cluster_slot_migration_of_a_held_lock_keeps_the_lease() -> Result<()> {
    let cluster = Arc::new(RedisCluster::start());
    let client = LockClient::connect(&cluster.cluster_url()).await?;
    let keys = client.keys("moving", KeyLayout::HashTagged)?;
    let lease = client
        .acquire("moving", &client.options().ttl(Duration::from_millis(600)))
        .await?;
    let slot = RedisCluster::slot_of_key(keys.lock());
    let from = cluster.owner_of_slot(slot);
    let to = cluster
        .masters()
        .into_iter()
        .find(|m| *m != from)
        .context("another master")?;
    // Renewals (every 200 ms) run through the migration.
    tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || cluster.migrate_slot(slot, to)
    })
    .await?;
    ensure!(cluster.owner_of_slot(slot) == to);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    ensure!(
        !lease.is_lost(),
        "the lease was lost during the slot migration"
    );
    ensure!(cluster.node(to).query::<i64>(&["EXISTS", keys.lock()]) == 1);
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    ensure!(cluster.node(to).query::<i64>(&["EXISTS", keys.lock()]) == 0);
    Ok(())
}
