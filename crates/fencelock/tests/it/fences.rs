//! Fences never go backwards for a name (docs/design.md §2.3): across Redis
//! restarts without persistence, deletion and expiry of the fence key, under
//! concurrency; 16-digit clock fences are exact; and what counter mode does
//! after a restart (the counter resets, the holder-aware resource still
//! refuses a re-issued fence from another holder).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use fencelock::{
    FENCE_RETENTION, Fence, FenceMode, KeyLayout, LockClient, LockOptions, LockState,
    ReleaseOutcome, WriteOutcome,
};
use fencelock_testkit::{Persistence, RedisConfig, RedisServer};
use tokio::time::Instant;

use crate::support::TestRedis;
use crate::support::{GUIDE_FENCED_WRITE, Keys, POLL_DEADLINE, connect};

/// Options that retry through a restart (`acquire` retries while Redis is
/// unreachable) and do not renew (each grant is released at once).
fn cycle_opts(client: &LockClient, mode: FenceMode) -> LockOptions {
    client
        .options()
        .fence_mode(mode)
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10))
}

/// Acquires and releases `name` once, returning the fence.
async fn grant_once(client: &LockClient, name: &str, opts: &LockOptions) -> anyhow::Result<Fence> {
    let lease = client.acquire(name, opts).await?;
    let fence = lease.fence();
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    Ok(fence)
}

fn assert_strictly_increasing(name: &str, fences: &[Fence]) {
    for pair in fences.windows(2) {
        assert!(
            pair[0] < pair[1],
            "fences of {name:?} went from {} to {}: history {fences:?}",
            pair[0],
            pair[1]
        );
    }
}

/// Clock mode: 3 restarts without persistence, 50 grants on 5 names per epoch; fences per name stay strictly increasing.
#[tokio::test(flavor = "multi_thread")]
async fn clock_fences_keep_increasing_across_restarts_without_persistence() -> anyhow::Result<()> {
    let mut server =
        RedisServer::start_with(RedisConfig::default().with_persistence(Persistence::None));
    let client = LockClient::connect(&server.url()).await?;
    let opts = cycle_opts(&client, FenceMode::Clock);
    let names = ["orders", "invoice:1", "invoice:2", "mail", "report"];
    let mut history: BTreeMap<&str, Vec<Fence>> = BTreeMap::new();

    for epoch in 0..4 {
        if epoch > 0 {
            tokio::task::block_in_place(|| server.restart());
            // The restart really lost the counters: the floor, not the
            // counter, keeps the next fences above the old ones.
            let _con = connect(&server).await?;
            for name in names {
                let fence_key = client.keys(name, KeyLayout::HashTagged)?.fence();
                assert!(
                    !server.exists(&fence_key),
                    "{fence_key} survived a restart without persistence"
                );
            }
        }
        for _ in 0..50 {
            for name in names {
                let fence = grant_once(&client, name, &opts).await?;
                history.entry(name).or_default().push(fence);
            }
        }
    }
    for (name, fences) in &history {
        assert_eq!(fences.len(), 200);
        assert_strictly_increasing(name, fences);
    }
    Ok(())
}

/// Counter mode after a restart without persistence: the counter resets (documented), yet the holder-aware resource refuses the re-issued fence from another holder; the guide's `>=` accepts it (negative control).
#[tokio::test(flavor = "multi_thread")]
async fn counter_reset_is_caught_by_the_holder_check() -> anyhow::Result<()> {
    let mut locks =
        RedisServer::start_with(RedisConfig::default().with_persistence(Persistence::None));
    // The resource lives on its own server and survives the lock server's restart.
    let storage = RedisServer::start();
    let client = LockClient::connect(&locks.url()).await?;
    let storage_client = LockClient::connect(&storage.url()).await?;
    let mut storage_con = connect(&storage).await?;
    let hash = storage_client.fenced_hash("account:9")?;
    let opts = cycle_opts(&client, FenceMode::Counter);

    // Before the restart: fences 1..=4 come and go, A holds N = 5 and writes.
    for expected in 1..=4 {
        assert_eq!(
            grant_once(&client, "account", &opts).await?,
            Fence::new(expected)
        );
    }
    let a = client.acquire("account", &opts).await?;
    let n = a.fence();
    assert_eq!(n, Fence::new(5));
    assert_eq!(hash.write(n, a.token(), "A").await?, WriteOutcome::Accepted);

    tokio::task::block_in_place(|| locks.restart());

    // The counter reset: a fence at or below one issued before the restart.
    let first_after = grant_once(&client, "account", &opts).await?;
    assert!(
        first_after <= n,
        "counter mode without persistence should re-issue fences after a restart (got {first_after} after {n})"
    );
    assert_eq!(first_after, Fence::new(1));
    // Drive the counter to N again: B is issued A's fence.
    let mut b = client.acquire("account", &opts).await?;
    while b.fence() < n {
        assert_eq!(b.release().await?, ReleaseOutcome::Released);
        b = client.acquire("account", &opts).await?;
    }
    assert_eq!(b.fence(), n, "B must be issued the same fence as A");
    assert_ne!(a.token(), b.token());

    // B's equal fence from a different holder: refused, nothing changes.
    let before: Vec<String> = redis::cmd("HGETALL")
        .arg("account:9")
        .query_async(&mut storage_con)
        .await?;
    assert_eq!(
        hash.write(n, b.token(), "B").await?,
        WriteOutcome::Rejected {
            current_fence: Some(n),
            current_holder: Some(a.holder_id()),
        }
    );
    let after: Vec<String> = redis::cmd("HGETALL")
        .arg("account:9")
        .query_async(&mut storage_con)
        .await?;
    assert_eq!(before, after);
    // A (same holder, same fence) is still accepted.
    assert_eq!(
        hash.write(n, a.token(), "A2").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(hash.read().await?.value.as_deref(), Some("A2"));

    // Negative control: the guide's `>=` rule accepts both holders of fence N.
    for (writer, value) in [("A", "guide-A"), ("B", "guide-B")] {
        let accepted: i64 = redis::cmd("EVAL")
            .arg(GUIDE_FENCED_WRITE)
            .arg(1)
            .arg("account:9:guide")
            .arg(n.get())
            .arg(value)
            .query_async(&mut storage_con)
            .await?;
        assert_eq!(
            accepted, 1,
            "the guide's script accepts holder {writer} with the equal fence {n}"
        );
    }
    let guide_value: Option<String> = redis::cmd("HGET")
        .arg("account:9:guide")
        .arg("value")
        .query_async(&mut storage_con)
        .await?;
    assert_eq!(
        guide_value.as_deref(),
        Some("guide-B"),
        "B overwrote A: the bug"
    );

    assert_eq!(b.release().await?, ReleaseOutcome::Released);
    // A's lock vanished with the restart.
    assert_eq!(
        a.release().await?,
        ReleaseOutcome::NotOurs(fencelock::LossReason::Expired)
    );
    Ok(())
}

/// Clock mode: deleting the fence key or letting it expire between grants never makes a fence repeat or go down.
#[tokio::test(flavor = "multi_thread")]
async fn clock_fences_survive_fence_key_deletion_and_expiry() -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let mut con = connect(&server).await?;
    let opts = cycle_opts(&client, FenceMode::Clock);
    let fence_key = client.keys("jobs", KeyLayout::HashTagged)?.fence();

    let mut fences = vec![grant_once(&client, "jobs", &opts).await?];
    for round in 0..20 {
        if round % 2 == 0 {
            let deleted: i64 = redis::cmd("DEL")
                .arg(&fence_key)
                .query_async(&mut con)
                .await?;
            assert_eq!(deleted, 1);
        } else {
            let set: i64 = redis::cmd("PEXPIRE")
                .arg(&fence_key)
                .arg(1)
                .query_async(&mut con)
                .await?;
            assert_eq!(set, 1);
            let deadline = Instant::now() + POLL_DEADLINE;
            while server.exists(&fence_key) {
                ensure!(Instant::now() < deadline, "{fence_key} did not expire");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        fences.push(grant_once(&client, "jobs", &opts).await?);
    }
    assert_strictly_increasing("jobs", &fences);
    Ok(())
}

/// The fence key expires after the retention period in clock mode (default layout) and never in counter mode or the guide layout.
#[tokio::test(flavor = "multi_thread")]
async fn fence_key_ttl_depends_on_mode_and_layout() -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let _con = connect(&server).await?;
    let cases = [
        (
            "clock-default",
            FenceMode::Clock,
            KeyLayout::HashTagged,
            true,
        ),
        (
            "counter-default",
            FenceMode::Counter,
            KeyLayout::HashTagged,
            false,
        ),
        ("clock-guide", FenceMode::Clock, KeyLayout::Guide, false),
        ("counter-guide", FenceMode::Counter, KeyLayout::Guide, false),
    ];
    for (name, mode, layout, expires) in cases {
        let opts = cycle_opts(&client, mode).layout(layout);
        grant_once(&client, name, &opts).await?;
        let fence_key = client.keys(name, layout)?.fence();
        let ttl = server.pttl(&fence_key);
        if expires {
            let retention = i64::try_from(FENCE_RETENTION.as_millis())?;
            assert_eq!(retention, 24 * 3600 * 1000);
            assert!(
                ttl > retention - 60_000 && ttl <= retention,
                "{fence_key}: PTTL {ttl} ms, expected about 24 h"
            );
        } else {
            assert_eq!(ttl, -1, "{fence_key} must never expire ({name})");
        }
    }
    Ok(())
}

/// 16-digit clock fences are exact everywhere: the returned fence, the lock value, the fence key and the resource agree as strings.
#[tokio::test(flavor = "multi_thread")]
async fn sixteen_digit_fences_are_not_rounded() -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let mut con = connect(&server).await?;
    let opts = cycle_opts(&client, FenceMode::Clock);
    let keys = client.keys("ledger", KeyLayout::HashTagged)?;
    let hash = client.fenced_hash("ledger:data")?;

    let check = |lease: &fencelock::Lease| {
        let fence = lease.fence().to_string();
        (fence, format!("{}:{}", lease.token(), lease.fence()))
    };
    // Twenty clock fences (µs since the epoch): a %.14g rounding would zero
    // their last two digits, which cannot go unnoticed twenty times.
    for _ in 0..20 {
        let lease = client.acquire("ledger", &opts).await?;
        let (fence, value) = check(&lease);
        assert_eq!(fence.len(), 16, "clock fence {fence} should have 16 digits");
        assert_eq!(server.get(keys.lock()), Some(value));
        assert_eq!(server.get(&keys.fence()), Some(fence.clone()));
        match client.inspect("ledger", KeyLayout::HashTagged).await? {
            LockState::Held {
                fence: f, holder, ..
            } => {
                assert_eq!(f, Some(lease.fence()));
                assert_eq!(holder, lease.holder_id());
            }
            other => panic!("expected the lock held, got {other:?}"),
        }
        assert_eq!(
            hash.write(lease.fence(), lease.token(), "v").await?,
            WriteOutcome::Accepted
        );
        let stored: Option<String> = redis::cmd("HGET")
            .arg("ledger:data")
            .arg("fence")
            .query_async(&mut con)
            .await?;
        assert_eq!(stored, Some(fence));
        assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    }

    // Deterministic: a fence key ahead of the clock makes the next fence
    // last + 1, a 16-digit number with non-zero low digits.
    let _: () = redis::cmd("SET")
        .arg(keys.fence())
        .arg("8765432109876543")
        .query_async(&mut con)
        .await?;
    let lease = client.acquire("ledger", &opts).await?;
    assert_eq!(lease.fence(), Fence::new(8_765_432_109_876_544));
    assert_eq!(
        server.get(keys.lock()),
        Some(format!("{}:8765432109876544", lease.token()))
    );
    assert_eq!(
        server.get(&keys.fence()).as_deref(),
        Some("8765432109876544")
    );
    assert_eq!(
        hash.write(lease.fence(), lease.token(), "w").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        hash.read().await?.fence,
        Some(Fence::new(8_765_432_109_876_544))
    );
    let stored: Option<String> = redis::cmd("HGET")
        .arg("ledger:data")
        .arg("fence")
        .query_async(&mut con)
        .await?;
    assert_eq!(stored.as_deref(), Some("8765432109876544"));
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    Ok(())
}

/// 8 tasks × 200 acquire/release cycles on one name: no fence is issued twice, fences follow grant order, and holders never overlap.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_grants_get_distinct_increasing_fences_without_overlap() -> anyhow::Result<()> {
    const TASKS: usize = 8;
    const CYCLES: usize = 200;
    let server = RedisServer::start();
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let grants: Arc<Mutex<Vec<(Instant, Fence, usize)>>> = Arc::new(Mutex::new(Vec::new()));

    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        // Each task has its own connection, like a separate worker.
        let client = LockClient::connect(&server.url()).await?;
        let (inside, max_inside, grants) = (inside.clone(), max_inside.clone(), grants.clone());
        tasks.spawn(async move {
            let opts = client
                .options()
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(120));
            for _ in 0..CYCLES {
                let lease = client.acquire("hot", &opts).await?;
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now_inside, Ordering::SeqCst);
                grants
                    .lock()
                    .map_err(|_| anyhow::anyhow!("grant log poisoned"))?
                    .push((Instant::now(), lease.fence(), task));
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                anyhow::ensure!(
                    lease.release().await?.is_released(),
                    "a lease was lost during a short critical section"
                );
            }
            anyhow::Ok(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a worker task panicked")??;
    }

    assert_eq!(
        max_inside.load(Ordering::SeqCst),
        1,
        "two holders overlapped"
    );
    let mut grants = grants
        .lock()
        .map_err(|_| anyhow::anyhow!("grant log poisoned"))?
        .clone();
    assert_eq!(grants.len(), TASKS * CYCLES);
    let distinct: HashSet<Fence> = grants.iter().map(|(_, f, _)| *f).collect();
    assert_eq!(distinct.len(), grants.len(), "a fence was issued twice");
    grants.sort_by_key(|(at, _, _)| *at);
    let ordered: Vec<Fence> = grants.iter().map(|(_, f, _)| *f).collect();
    assert_strictly_increasing("hot", &ordered);
    // The lock really changed hands between tasks (the test exercised contention).
    let handoffs = grants.windows(2).filter(|w| w[0].2 != w[1].2).count();
    assert!(
        handoffs >= TASKS - 1,
        "only {handoffs} handoffs between tasks"
    );
    Ok(())
}
