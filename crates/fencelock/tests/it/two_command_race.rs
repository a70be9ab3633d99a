//! The two-command race of docs/design.md §2.1: the
//! guide's `SET NX PX` followed by a separate `INCR` lets a holder paused
//! between the two get a *higher* fence than the next legitimate holder. The
//! first test reproduces the bug (negative control); the others show that
//! fencelock's one-script grant cannot be split that way.

use std::time::Duration;

use fencelock::{Fence, FenceMode, ReleaseOutcome, Renewal, WriteOutcome, holder_id};
use redis::aio::MultiplexedConnection;

use crate::support::TestRedis;
use crate::support::{GUIDE_FENCED_WRITE, connect, wait_key_gone};

/// The guide's acquire, first half: `SET lock:NAME token NX PX ttl`.
async fn guide_set_nx(
    con: &mut MultiplexedConnection,
    key: &str,
    token: &str,
    ttl_ms: u64,
) -> anyhow::Result<bool> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(con)
        .await?;
    Ok(set.is_some())
}

/// The guide's acquire, second half: `INCR lock:NAME:fence`.
async fn guide_incr(con: &mut MultiplexedConnection, key: &str) -> anyhow::Result<u64> {
    Ok(redis::cmd("INCR")
        .arg(format!("{key}:fence"))
        .query_async(con)
        .await?)
}

async fn guide_fenced_write(
    con: &mut MultiplexedConnection,
    resource: &str,
    fence: u64,
    value: &str,
) -> anyhow::Result<bool> {
    let r: i64 = redis::cmd("EVAL")
        .arg(GUIDE_FENCED_WRITE)
        .arg(1)
        .arg(resource)
        .arg(fence)
        .arg(value)
        .query_async(con)
        .await?;
    Ok(r == 1)
}

/// Negative control: with the guide's SET-then-INCR, a holder stalled between the two commands outranks the legitimate holder, whatever the resource checks.
#[tokio::test(flavor = "multi_thread")]
async fn guide_two_command_acquire_lets_a_stale_holder_win() -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let mut con = connect(&server).await?;
    // Both resources: fencelock's holder-aware hash and the guide's `>=` hash.
    let hash = client.fenced_hash("race:data")?;
    let guide_hash = "race:guide-data";
    let key = "lock:race";

    // A: SET NX PX 300, then stalls before its INCR.
    assert!(guide_set_nx(&mut con, key, "token-A", 300).await?);
    wait_key_gone(&server, key).await?;

    // B: the complete two-command acquire, then a write with fence 1.
    assert!(guide_set_nx(&mut con, key, "token-B", 10_000).await?);
    let b_fence = guide_incr(&mut con, key).await?;
    assert_eq!(b_fence, 1);
    assert_eq!(
        hash.write(Fence::new(b_fence), "token-B", "B-1").await?,
        WriteOutcome::Accepted
    );
    assert!(guide_fenced_write(&mut con, guide_hash, b_fence, "B-1").await?);

    // A resumes: its INCR mints fence 2 although B holds the lock.
    let a_fence = guide_incr(&mut con, key).await?;
    assert_eq!(a_fence, 2);
    let holder: Option<String> = redis::cmd("GET").arg(key).query_async(&mut con).await?;
    assert_eq!(holder.as_deref(), Some("token-B"), "B holds the lock");

    // The bug: the stale holder's write is ACCEPTED on both resources ...
    assert_eq!(
        hash.write(Fence::new(a_fence), "token-A", "A-stale")
            .await?,
        WriteOutcome::Accepted,
        "the broken grant hands the non-holder the highest fence"
    );
    assert!(guide_fenced_write(&mut con, guide_hash, a_fence, "A-stale").await?);

    // ... and the legitimate holder is fenced out mid critical section.
    assert_eq!(
        hash.write(Fence::new(b_fence), "token-B", "B-2").await?,
        WriteOutcome::Rejected {
            current_fence: Some(Fence::new(2)),
            current_holder: Some(holder_id("token-A")),
        }
    );
    assert!(!guide_fenced_write(&mut con, guide_hash, b_fence, "B-2").await?);
    assert_eq!(hash.read().await?.value.as_deref(), Some("A-stale"));
    let guide_value: Option<String> = redis::cmd("HGET")
        .arg(guide_hash)
        .arg("value")
        .query_async(&mut con)
        .await?;
    assert_eq!(guide_value.as_deref(), Some("A-stale"));
    Ok(())
}

/// The same interleaving against fencelock's one-script grant: the stale holder keeps its lower fence and is refused.
async fn one_script_grant_keeps_the_stale_holder_out(mode: FenceMode) -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let _con = connect(&server).await?;
    let hash = client.fenced_hash("race:data")?;
    let opts = client.options().fence_mode(mode).wait(Duration::ZERO);

    // A: grant (lock + fence in one script), renewal off, then stalls past
    // its 300 ms lease.
    let a = client
        .try_acquire(
            "race",
            &opts
                .clone()
                .ttl(Duration::from_millis(300))
                .renewal(Renewal::Off),
        )
        .await?;
    wait_key_gone(&server, a.key()).await?;

    // B: the next grant has a higher fence, and writes.
    let b = client
        .try_acquire("race", &opts.clone().ttl(Duration::from_secs(10)))
        .await?;
    assert!(
        b.fence() > a.fence(),
        "the later grant must carry the higher fence: A {} B {}",
        a.fence(),
        b.fence()
    );
    if mode == FenceMode::Counter {
        assert_eq!((a.fence(), b.fence()), (Fence::new(1), Fence::new(2)));
    }
    assert_eq!(
        hash.write(b.fence(), b.token(), "B-1").await?,
        WriteOutcome::Accepted
    );

    // A resumes and writes with its fence: refused.
    assert_eq!(
        hash.write(a.fence(), a.token(), "A-stale").await?,
        WriteOutcome::Rejected {
            current_fence: Some(b.fence()),
            current_holder: Some(b.holder_id()),
        }
    );
    // B keeps working.
    assert_eq!(
        hash.write(b.fence(), b.token(), "B-2").await?,
        WriteOutcome::Accepted
    );
    let state = hash.read().await?;
    assert_eq!(state.value.as_deref(), Some("B-2"));
    assert_eq!(state.fence, Some(b.fence()));

    assert_eq!(
        a.release().await?,
        ReleaseOutcome::NotOurs(fencelock::LossReason::TakenOver)
    );
    assert_eq!(b.release().await?, ReleaseOutcome::Released);
    Ok(())
}

/// Clock mode: the stalled holder's write is refused and the current holder's accepted.
#[tokio::test(flavor = "multi_thread")]
async fn fencelock_grant_cannot_be_split_clock_mode() -> anyhow::Result<()> {
    one_script_grant_keeps_the_stale_holder_out(FenceMode::Clock).await
}

/// Counter mode: A gets 1, B gets 2; A's write is refused and B's accepted twice.
#[tokio::test(flavor = "multi_thread")]
async fn fencelock_grant_cannot_be_split_counter_mode() -> anyhow::Result<()> {
    one_script_grant_keeps_the_stale_holder_out(FenceMode::Counter).await
}
