//! Sentinel: 1 primary, 2 replicas, 3 sentinels (quorum 2, down-after
//! 1 s), started by the testkit; clients use `redis+sentinel://`.
//!
//! - Under load, the primary is frozen past down-after, a failover happens
//!   and the old primary resumes: workers carry on on the new master,
//!   fences granted after the failover are above every fence before it,
//!   no acknowledged increment is lost at the resource (its writes wait for
//!   both replicas), and the resumed old primary, with
//!   `min-replicas-to-write 1`, grants nothing once it has recounted its
//!   replicas.
//! - A holder whose renewal hits the failover window is told it lost the
//!   lease before a waiter gets the lock on the new master.
//! - Split brain, the negative control: without `min-replicas-to-write`, the
//!   resumed old primary and the new one both issue the same counter fence;
//!   the guide's `>=` check accepts both holders' writes, fencelock's
//!   holder-aware rule refuses the second.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{Fence, FenceMode, KeyLayout, LockClient, LockState, Renewal};
use fencelock_testkit::{
    RedisConfig, RedisSentinel, RedisSentinelConfig, RedisServer, SentinelNode,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{CounterWorkers, counter_value};
use crate::support::{GUIDE_FENCED_WRITE, connect};

/// Data nodes that refuse writes without a replica within 1 s of lag: a
/// cut-off old primary grants nothing.
fn guarded() -> RedisSentinelConfig {
    RedisSentinelConfig::default().with_data(
        RedisConfig::default()
            .with_arg("--min-replicas-to-write")
            .with_arg("1")
            .with_arg("--min-replicas-max-lag")
            .with_arg("1"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_sentinel_failover_under_load_keeps_fences_and_increments() -> Result<()> {
    let sentinel = RedisSentinel::start_with(guarded());
    let old = sentinel.primary();
    let mut workers = Vec::new();
    for _ in 0..8 {
        let client = LockClient::connect(&sentinel.url()).await?;
        // Both replicas: the sentinels promote the replica that was most up
        // to date at their last look, which may be a moment old, so a write
        // only one replica has could be lost.
        let counter = client
            .fenced_hash("counter")?
            .wait_for_replicas(2, Duration::from_millis(500));
        workers.push((client, counter));
    }
    let workers = CounterWorkers::spawn(workers);
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(workers.grants().await > 0, "no grant before the failover");

    // Freeze the primary past down-after; the sentinels promote a replica.
    let paused_at = Instant::now();
    sentinel.pause(SentinelNode::Data(old));
    tokio::task::spawn_blocking({
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let addrs = sentinel.sentinel_urls();
        move || wait_new_primary(&addrs, deadline)
    })
    .await??;
    let failed_over = Instant::now();
    sentinel.resume(SentinelNode::Data(old));

    // The resumed old primary, cut off from its replicas, grants nothing once
    // it has recounted its good replicas (its replication cron runs every
    // second: until then it still counts the ones it had before the pause).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if let Ok(direct) = LockClient::connect(&sentinel.data_node(old).url()).await {
        let granted = direct
            .try_acquire("split", &direct.options().renewal(Renewal::Off))
            .await;
        ensure!(granted.is_err(), "the resumed old primary granted a lock");
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    let tally = workers.stop().await?;
    tally.check_fences_across(paused_at, failed_over)?;
    let reader = LockClient::connect(&sentinel.url()).await?;
    let final_value = counter_value(&reader.fenced_hash("counter")?).await?;
    tally.check_counter(final_value)
}

/// Asks the sentinels until one names a primary other than the first one
/// they named, or `deadline` passes; returns its address.
fn wait_new_primary(sentinels: &[String], deadline: std::time::Instant) -> Result<String> {
    let ask = || -> Option<String> {
        sentinels.iter().find_map(|url| {
            let mut con = redis::Client::open(url.as_str())
                .ok()?
                .get_connection_with_timeout(Duration::from_millis(300))
                .ok()?;
            let addr: Vec<String> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg("fencelock")
                .query(&mut con)
                .ok()?;
            Some(addr.join(":"))
        })
    };
    let first = ask().context("no sentinel answers")?;
    while std::time::Instant::now() < deadline {
        if let Some(now) = ask()
            && now != first
        {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("no failover away from {first} in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_sentinel_holder_in_the_failover_window_loses_before_the_waiter_gets_it() -> Result<()>
{
    let sentinel = RedisSentinel::start_with(guarded());
    let old = sentinel.primary();
    let holder = LockClient::connect(&sentinel.url()).await?;
    let waiter = LockClient::connect(&sentinel.url()).await?;
    let audit = holder.audit().await?;
    for check in ["topology", "role", "replication", "permissions"] {
        ensure!(
            audit.check(check).map(|c| c.status()) == Some(fencelock::audit::Status::Ok),
            "{check}: {audit:?}"
        );
    }
    let lease = holder
        .acquire("job", &holder.options().ttl(Duration::from_millis(1200)))
        .await?;
    let lost_at = Arc::new(Mutex::new(None));
    {
        let (handle, lost_at) = (lease.handle(), lost_at.clone());
        tokio::spawn(async move {
            handle.lost().await;
            *lost_at.lock().await = Some(Instant::now());
        });
    }
    let wait = waiter.options().wait(Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        let lease = waiter.acquire("job", &wait).await;
        (Instant::now(), lease)
    });
    sentinel.pause(SentinelNode::Data(old));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let addrs = sentinel.sentinel_urls();
    tokio::task::spawn_blocking(move || wait_new_primary(&addrs, deadline)).await??;
    sentinel.resume(SentinelNode::Data(old));
    let (granted_at, granted) = waiting.await?;
    let next = granted.context("the waiter did not get the lock on the new master")?;
    let lost = lost_at
        .lock()
        .await
        .context("the holder was never told it lost the lease")?;
    ensure!(
        lost <= granted_at,
        "the waiter got the lock before the holder's loss signal"
    );
    ensure!(next.fence() > lease.fence());
    drop(lease);
    let _ = next.release().await;
    Ok(())
}

/// The negative control of split brain: without `min-replicas-to-write`,
/// the resumed old primary and the new one each issue counter fence 2. The
/// guide's `>=` check accepts both holders' writes; fencelock's fenced hash
/// refuses the second holder's equal fence. With `min-replicas-to-write 1`
/// the old primary refuses the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_sentinel_split_brain_duplicates_counter_fences_only_without_min_replicas()
-> Result<()> {
    for guard in [false, true] {
        let config = if guard {
            guarded()
        } else {
            RedisSentinelConfig::default()
        };
        let sentinel = RedisSentinel::start_with(config);
        let old = sentinel.primary();
        let counter = client_opts(FenceMode::Counter);
        let via_sentinel = LockClient::connect(&sentinel.url()).await?;
        let first = via_sentinel.try_acquire("split", &counter).await?;
        ensure!(first.fence() == Fence::new(1));
        ensure!(first.release().await?.is_released());
        // Let the replicas have the counter before the primary freezes.
        let _: i64 = sentinel.data_node(old).query(&["WAIT", "2", "1000"]);

        sentinel.pause(SentinelNode::Data(old));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let addrs = sentinel.sentinel_urls();
        tokio::task::spawn_blocking(move || wait_new_primary(&addrs, deadline)).await??;
        // The client follows the announced failover: it sees a key only the
        // new primary has.
        let new = sentinel.primary();
        ensure!(new != old);
        // With min-replicas-to-write the new primary refuses writes until a
        // replica has linked to it.
        let give_up = Instant::now() + Duration::from_secs(10);
        while sentinel
            .data_node(new)
            .try_cmd(&["SET", "lock:{marker}", "x:1", "PX", "60000"])
            .is_err()
        {
            ensure!(
                Instant::now() < give_up,
                "the new primary never accepted a write"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while !matches!(
            via_sentinel.inspect("marker", KeyLayout::HashTagged).await,
            Ok(LockState::Held { .. })
        ) {
            ensure!(
                Instant::now() < give_up,
                "the client did not follow the failover"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sentinel.resume(SentinelNode::Data(old));
        if guard {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }

        // A worker still talking to the old primary, one through the sentinels.
        let stale = LockClient::connect(&sentinel.data_node(old).url()).await?;
        let stale_grant = stale.try_acquire("split", &counter).await;
        let current = via_sentinel.try_acquire("split", &counter).await?;
        ensure!(current.fence() == Fence::new(2));
        if guard {
            ensure!(
                stale_grant.is_err(),
                "min-replicas-to-write 1: the old primary must refuse the grant"
            );
            continue;
        }
        let stale_grant = stale_grant.context("without min-replicas the old primary grants")?;
        ensure!(
            stale_grant.fence() == current.fence(),
            "split brain: both primaries issue counter fence 2"
        );
        // The resource lives elsewhere (it survives the failover).
        let resource = RedisServer::start();
        let con = connect(&resource).await?;
        ensure!(guide_write(&con, current.fence(), "current").await? == 1);
        ensure!(
            guide_write(&con, stale_grant.fence(), "stale").await? == 1,
            "negative control: the guide's >= check accepts the duplicate fence"
        );
        let hash = LockClient::connect(&resource.url())
            .await?
            .fenced_hash("doc")?;
        ensure!(
            hash.write(current.fence(), current.token(), "current")
                .await?
                .is_accepted()
        );
        ensure!(
            !hash
                .write(stale_grant.fence(), stale_grant.token(), "stale")
                .await?
                .is_accepted(),
            "fencelock's holder-aware rule refuses the other holder's equal fence"
        );
    }
    Ok(())
}

/// The guide's fenced write (`fence >= stored`, no holder) of `value`.
async fn guide_write(
    con: &redis::aio::MultiplexedConnection,
    fence: Fence,
    value: &str,
) -> Result<i64> {
    Ok(redis::Script::new(GUIDE_FENCED_WRITE)
        .key("guide:doc")
        .arg(fence.get())
        .arg(value)
        .invoke_async(&mut con.clone())
        .await?)
}

fn client_opts(mode: FenceMode) -> fencelock::LockOptions {
    fencelock::LockOptions::default()
        .fence_mode(mode)
        .renewal(Renewal::Off)
        .ttl(Duration::from_secs(30))
}

/// The audit behind Sentinel has rows for every replica a failover could
/// promote, named `CHECK@HOST:PORT`: a replica that would evict locks once
/// promoted warns; one with `replica-priority 0` is never promoted and is
/// not audited; one that cannot be reached is a WARN row, not a failed
/// audit.
#[tokio::test]
async fn sentinel_audit_has_rows_for_every_replica_a_failover_could_promote() -> Result<()> {
    use fencelock::audit::Status;
    let mut sentinel = RedisSentinel::start_with(guarded());
    sentinel.wait_healthy();
    let replicas = sentinel.replicas();
    let (evicting, other) = (replicas[0], replicas[1]);
    let evicting_node = sentinel.data_node(evicting);
    evicting_node.cmd(&["CONFIG", "SET", "maxmemory", "100mb"]);
    evicting_node.cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let (at_evicting, at_other) = (evicting_node.addr(), sentinel.data_node(other).addr());
    let client = LockClient::connect(&sentinel.url()).await?;

    let audit = client.audit().await?;
    let status = |audit: &fencelock::audit::Audit, name: &str| {
        audit
            .check(name)
            .map(|c| c.status())
            .with_context(|| format!("no {name} row in {audit:#?}"))
    };
    ensure!(status(&audit, &format!("eviction@{at_evicting}"))? == Status::Warn);
    for row in [
        "replica",
        "eviction",
        "replication",
        "persistence",
        "clock",
        "fences",
    ] {
        ensure!(
            status(&audit, &format!("{row}@{at_other}"))? == Status::Ok,
            "{row}: {audit:#?}"
        );
    }
    ensure!(
        status(&audit, "eviction")? == Status::Ok,
        "the master's own row"
    );

    sentinel
        .data_node(evicting)
        .cmd(&["CONFIG", "SET", "replica-priority", "0"]);
    sentinel.kill(SentinelNode::Data(other));
    let audit = client.audit().await?;
    let skipped = audit
        .check(&format!("replica@{at_evicting}"))
        .with_context(|| format!("{audit:#?}"))?;
    ensure!(skipped.status() == Status::Ok && skipped.found().contains("replica-priority 0"));
    ensure!(
        audit.check(&format!("eviction@{at_evicting}")).is_none(),
        "{audit:#?}"
    );
    ensure!(
        status(&audit, &format!("replica@{at_other}"))? == Status::Warn,
        "{audit:#?}"
    );
    ensure!(audit.worst() != Status::Fail, "{audit:#?}");
    Ok(())
}
