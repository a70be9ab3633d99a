//! The client's keeper: one task renews every lease of a client, the
//! renewals that fall due together in one script call per batch, and the
//! deadline watchdog runs beside them, so that
//!
//! - renewing many leases costs a few script calls per interval, not one per
//!   lease (negative control: the same leases held by one client each make
//!   one call per lease);
//! - a lease whose batched renewal finds it gone (deleted, or taken by
//!   another holder) is declared lost within one interval, while the leases
//!   renewed in the same call keep their locks;
//! - a batch that hangs (Redis frozen) holds up no lease's deadline
//!   watchdog: each lease is declared lost at its own deadline.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{LockClient, LockOptions, LossReason, ReleaseOutcome, Renewal};
use tokio::time::Instant;

use crate::support::{Keys, TestRedis};

/// 300 leases renewed every 150 ms for 1.2 s cost a few script calls per
/// interval (batches of up to 256 leases), and every lease keeps its lock.
/// Negative control: 300 leases held by 300 clients (one keeper each) make
/// at least one call per lease and interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_renewals_of_many_leases_travel_in_few_script_calls() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let opts = LockOptions::default()
        .ttl(Duration::from_millis(900))
        .renewal(Renewal::Every(Duration::from_millis(150)));
    // Acquired together, so the leases' schedules start close together
    // however busy the machine is (one by one, a loaded machine spread them
    // over several renewal slacks and the batches with them).
    let mut acquiring = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (client, opts) = (client.clone(), opts.clone());
        acquiring.spawn(async move { client.try_acquire(&format!("batch:{i}"), &opts).await });
    }
    let mut leases = Vec::new();
    while let Some(lease) = acquiring.join_next().await {
        leases.push(lease??);
    }
    let before = server.script_calls();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let batched = server.script_calls() - before;
    ensure!(
        leases.iter().all(|l| !l.is_lost()),
        "a lease was lost while renewed"
    );
    // 8 intervals; each takes a handful of batches, not 300 calls.
    ensure!(
        batched <= 8 * 12,
        "{batched} script calls renewed 300 leases over 8 intervals"
    );
    for lease in leases {
        ensure!(lease.release().await? == ReleaseOutcome::Released);
    }

    // Negative control: one client (one keeper) per lease.
    let mut alone = Vec::new();
    for i in 0..300 {
        let own = LockClient::connect(&server.url()).await?;
        let lease = own.try_acquire(&format!("alone:{i}"), &opts).await?;
        alone.push((own, lease));
    }
    let before = server.script_calls();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let unbatched = server.script_calls() - before;
    ensure!(
        unbatched >= 300 * 6,
        "300 lone leases made only {unbatched} renewal calls over 8 intervals"
    );
    for (_, lease) in alone {
        lease.release().await?;
    }
    Ok(())
}

/// Of 20 leases renewed in the same batches, the 3 whose keys are deleted
/// and the 2 whose keys another holder takes are declared lost within one
/// interval (plus slack) with the right reason; the 15 others keep their
/// exact values, and no renewal re-creates or touches the 5 keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_batched_renewal_that_finds_its_lease_gone_marks_only_that_lease_lost() -> Result<()>
{
    let TestRedis { server, client } = TestRedis::start().await?;
    let ttl = Duration::from_millis(900);
    let interval = ttl / 3;
    let opts = LockOptions::default().ttl(ttl);
    let mut leases = Vec::new();
    for i in 0..20 {
        leases.push(client.try_acquire(&format!("shared:{i}"), &opts).await?);
    }
    let t0 = Instant::now();
    for i in 0..3 {
        server.cmd(&["DEL", &format!("lock:{{shared:{i}}}")]);
    }
    for i in 3..5 {
        server.cmd(&[
            "SET",
            &format!("lock:{{shared:{i}}}"),
            "intruder:1",
            "PX",
            "30000",
        ]);
    }
    for (i, lease) in leases.iter().enumerate().take(5) {
        tokio::time::timeout(Duration::from_secs(5), lease.lost())
            .await
            .with_context(|| format!("lease {i} was not declared lost within 5 s"))?;
        let reason = if i < 3 {
            LossReason::Expired
        } else {
            LossReason::TakenOver
        };
        ensure!(
            lease.loss_reason() == Some(reason),
            "lease {i}: {:?}",
            lease.loss_reason()
        );
    }
    let after = t0.elapsed();
    ensure!(
        after <= interval + Duration::from_millis(300),
        "the last loss fired {after:?} after the keys changed; renewal runs every {interval:?}"
    );
    // Two more intervals: the others are renewed, the lost ones left alone.
    tokio::time::sleep(interval * 2).await;
    for (i, lease) in leases.iter().enumerate() {
        let key = format!("lock:{{shared:{i}}}");
        match i {
            0..3 => ensure!(!server.exists(&key), "a renewal re-created {key}"),
            3..5 => ensure!(server.get(&key).as_deref() == Some("intruder:1")),
            _ => {
                ensure!(!lease.is_lost(), "lease {i} was lost");
                let value = server.get(&key).context("a kept lock vanished")?;
                ensure!(value == format!("{}:{}", lease.token(), lease.fence()));
                let pttl: i64 = server.query(&["PTTL", &key]);
                ensure!(pttl > 0, "{key}: pttl {pttl}");
            }
        }
    }
    for (i, lease) in leases.into_iter().enumerate() {
        let expected = match i {
            0..3 => ReleaseOutcome::NotOurs(LossReason::Expired),
            3..5 => ReleaseOutcome::NotOurs(LossReason::TakenOver),
            _ => ReleaseOutcome::Released,
        };
        ensure!(lease.release().await? == expected, "lease {i}");
    }
    Ok(())
}

/// Redis is frozen (SIGSTOP) right after one client took three leases with
/// ttls of 400 ms, 1.2 s and 2 s: every renewal batch hangs. The deadline
/// watchdog does not wait for them: each lease is declared lost
/// (`DeadlinePassed`) at its own deadline, never before it, and soon after
/// it, the short lease first although the batches sent before it still
/// hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_hanging_batches_delay_no_lease_past_its_own_deadline() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let ttls = [400u64, 1200, 2000].map(Duration::from_millis);
    let mut leases = Vec::new();
    for (i, ttl) in ttls.iter().enumerate() {
        let opts = LockOptions::default().ttl(*ttl);
        leases.push(client.try_acquire(&format!("frozen:{i}"), &opts).await?);
    }
    let paused = server.pause_guard();
    let t0 = Instant::now();
    for (lease, ttl) in leases.iter().zip(ttls) {
        tokio::time::timeout(ttl * 3, lease.lost())
            .await
            .with_context(|| format!("the {ttl:?} lease was never declared lost"))?;
        let after = t0.elapsed();
        ensure!(lease.loss_reason() == Some(LossReason::DeadlinePassed));
        // Its local deadline is at most ttl - drift after the pause began.
        ensure!(
            after >= ttl - ttl / 100 - Duration::from_millis(2) - Duration::from_millis(100),
            "the {ttl:?} lease was declared lost early, {after:?} after the pause"
        );
        ensure!(
            after <= ttl + Duration::from_millis(400),
            "the {ttl:?} lease was declared lost only {after:?} after the pause"
        );
    }
    drop(paused);
    for lease in leases {
        lease.release().await?;
    }
    Ok(())
}

/// The keeper plans its next wake-up when a lease is taken, and keeps that
/// plan when the lease is released before it: a client that takes and
/// releases locks one after another then wakes its keeper about once per
/// renewal interval instead of once per lease. A lease taken meanwhile that
/// needs the keeper later than planned is found at the planned wake-up and
/// renewed on time; one that needs it sooner wakes it. Both kinds here hold
/// well past their ttl and stay ours. Negative control: a keeper that
/// forgot leases taken while it slept (no wake-up, no plan) would let the
/// second lease expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_taken_after_released_ones_are_renewed_on_time() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let short = LockOptions::default().ttl(Duration::from_millis(300));
    let long = LockOptions::default().ttl(Duration::from_millis(1200));
    // Quick cycles first: the keeper's plan is the released leases'.
    for i in 0..50 {
        let lease = client.acquire(&format!("cycle:{i}"), &short).await?;
        ensure!(lease.release().await? == ReleaseOutcome::Released);
    }
    // Needs the keeper later than planned (its first renewal at 400 ms).
    let later = client.acquire("later", &long).await?;
    // And a cycle of a long lease, then a short one that needs it sooner.
    let lease = client.acquire("cycle:long", &long).await?;
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    let sooner = client.acquire("sooner", &short).await?;
    let held_until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < held_until {
        for (lease, name) in [(&later, "later"), (&sooner, "sooner")] {
            ensure!(
                !lease.is_lost(),
                "{name} was lost: {:?}",
                lease.loss_reason()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (lease, name) in [(later, "later"), (sooner, "sooner")] {
        let pttl = server.pttl(lease.key());
        ensure!(pttl > 0, "{name}: the key's ttl is {pttl}");
        ensure!(lease.release().await? == ReleaseOutcome::Released, "{name}");
    }
    drop(server);
    Ok(())
}
