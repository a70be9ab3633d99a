//! Locks on a three-member etcd cluster under faults: leader changes and a
//! killed member, with workers incrementing a fenced counter throughout.
//! Every test here starts three members and has `etcd` in its name (run one
//! at a time).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{LockClient, WriteOutcome};
use fencelock_testkit::EtcdCluster;
use tokio::time::Instant;

use crate::support::etcd::admin;

/// Workers incrementing the counter.
const WORKERS: usize = 4;

/// What the workers saw.
#[derive(Default)]
struct Tally {
    /// Increments acknowledged (the fenced update returned Accepted).
    acked: AtomicU64,
    /// Increments whose outcome is unknown (the call failed).
    unknown: AtomicU64,
    /// (time since start, fence) of every accepted write, in the order the
    /// workers saw them accepted.
    accepted: std::sync::Mutex<Vec<(Duration, u64)>>,
    /// The last error an acquisition ended with (the workers try again):
    /// what a failure to make progress reports.
    last_error: std::sync::Mutex<Option<String>>,
    /// The last error a release ended with (a key left behind keeps
    /// everyone waiting): reported with it.
    last_release_error: std::sync::Mutex<Option<String>>,
}

/// The longest stretch without an accepted increment between `from` and
/// `to` (offsets from the start): the unavailability a fault caused.
fn longest_gap(times: &[Duration], from: Duration, to: Duration) -> Duration {
    let mut points: Vec<Duration> = times
        .iter()
        .copied()
        .filter(|t| *t > from && *t < to)
        .collect();
    points.push(from);
    points.push(to);
    points.sort();
    points
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

/// Workers take the lock and increment a fenced counter in etcd (a
/// read-modify-write that checks, in one transaction, that the writer
/// still holds its lock and that the key did not change since the read),
/// while the leadership moves twice and the leader is killed and brought
/// back. Afterwards: the counter equals the acknowledged increments (plus
/// at most the ones whose reply was lost), the accepted writes' fences
/// strictly increase (no stale write accepted), the lock is granted again
/// within 30 s of each fault, and the unavailability window of each fault
/// (the longest stretch without an increment) is reported. Requests caught
/// in a leader change wait for their timeout (2 s here): that is most of
/// the window.
///
/// Negative control: the same workers incrementing without the lock and
/// without the fence check (read, then put) lose increments, and the same
/// check says how many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_leader_changes_and_a_member_kill_lose_no_acknowledged_increment() -> Result<()>
{
    let mut cluster = EtcdCluster::start();
    let url = cluster.url();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let client = LockClient::builder(&url)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await?;
        let (tally, stop) = (tally.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let opts = client
                .options()
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(30));
            let counter = client.fenced_key("counter")?;
            while !stop.load(Ordering::SeqCst) {
                let lease = match client.acquire("counter", &opts).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        *tally.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(e.to_string());
                        continue;
                    }
                };
                let update = counter
                    .update_held(&lease, |v| {
                        let n: u64 = v.and_then(|v| v.parse().ok()).unwrap_or(0);
                        (n + 1).to_string()
                    })
                    .await;
                match update {
                    Ok(WriteOutcome::Accepted) => {
                        tally.acked.fetch_add(1, Ordering::SeqCst);
                        tally
                            .accepted
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((started.elapsed(), lease.fence().get()));
                    }
                    Ok(_) => {}
                    Err(_) => {
                        tally.unknown.fetch_add(1, Ordering::SeqCst);
                    }
                }
                if let Err(e) = lease.release().await {
                    *tally
                        .last_release_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(format!("{e:?}"));
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }

    // Each fault, then until the counter moves again (at most 30 s), then
    // a second of normal work: the time from the fault to the first
    // increment after it is its unavailability window.
    let progress_after = |at: Duration, fault: &'static str| {
        let tally = tally.clone();
        async move {
            let give_up = Instant::now() + Duration::from_secs(30);
            loop {
                let first = tally
                    .accepted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(t, _)| *t)
                    .find(|t| *t > at);
                if let Some(t) = first {
                    return Ok(t - at);
                }
                if Instant::now() >= give_up {
                    let t = tally.acked.load(Ordering::SeqCst);
                    let u = tally.unknown.load(Ordering::SeqCst);
                    let last = tally
                        .last_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    let release = tally
                        .last_release_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    anyhow::bail!(
                        "no increment within 30 s of the fault ({fault}; {t} acknowledged, {u} unknown so far; the last failed acquisition: {last:?}; the last failed release: {release:?})"
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let settle = Duration::from_secs(1);
    tokio::time::sleep(settle).await;
    // Fault 1: the leadership moves.
    let t1 = started.elapsed();
    let leader = cluster.leader();
    let to = (leader + 1) % cluster.len();
    tokio::task::block_in_place(|| cluster.move_leader(to));
    let moved = progress_after(t1, "the leadership moved").await?;
    tokio::time::sleep(settle).await;
    // Fault 2: the leader is killed; another is elected.
    let t2 = started.elapsed();
    let leader = cluster.leader();
    cluster.kill(leader);
    let killed = progress_after(t2, "the leader killed").await?;
    let elected = tokio::task::block_in_place(|| cluster.wait_new_leader(leader));
    tokio::time::sleep(settle).await;
    // Back to three members, and the leadership moves to the returned one.
    let t3 = started.elapsed();
    tokio::task::block_in_place(|| {
        cluster.restart(leader);
        cluster.move_leader(leader);
    });
    let returned = progress_after(t3, "the killed leader back and leading").await?;
    tokio::time::sleep(settle).await;
    let t4 = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await??;
    }

    let accepted = tally
        .accepted
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (acked, unknown) = (
        tally.acked.load(Ordering::SeqCst),
        tally.unknown.load(Ordering::SeqCst),
    );
    let mut etcd = admin(&cluster).await?;
    let stored = etcd.get("counter", None).await?;
    let value = stored
        .kvs()
        .first()
        .context("the counter")?
        .value_str()?
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .parse::<u64>()?;
    let times: Vec<Duration> = accepted.iter().map(|(t, _)| *t).collect();
    eprintln!(
        "etcd cluster: {acked} acknowledged increments, {unknown} unknown, counter {value}; \
         unavailability (longest gap between increments after the fault; first increment \
         after it): move-leader {:?} ({moved:?}), leader m{leader} killed, m{elected} elected \
         {:?} ({killed:?}), m{leader} restarted and made leader {:?} ({returned:?})",
        longest_gap(&times, t1, t2),
        longest_gap(&times, t2, t3),
        longest_gap(&times, t3, t4),
    );
    ensure!(
        value >= acked && value <= acked + unknown,
        "lost acknowledged increments: counter {value}, acknowledged {acked}, unknown {unknown}"
    );
    let fences: Vec<u64> = accepted.iter().map(|(_, f)| *f).collect();
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "an accepted write's fence did not increase (a stale write was accepted)"
    );

    // The control: no lock, no fence, read then put.
    etcd.put("control", "0", None).await?;
    let control_acked = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let mut etcd = admin(&cluster).await?;
        let acked = control_acked.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let read = etcd.get("control", None).await?;
                let n: u64 = read
                    .kvs()
                    .first()
                    .and_then(|kv| kv.value_str().ok()?.parse().ok())
                    .unwrap_or(0);
                etcd.put("control", (n + 1).to_string(), None).await?;
                acked.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let read = etcd.get("control", None).await?;
    let control: u64 = read.kvs()[0].value_str()?.parse()?;
    let acked = control_acked.load(Ordering::SeqCst);
    eprintln!("control: {acked} acknowledged unfenced increments, counter {control}");
    ensure!(
        control < acked,
        "the control should lose increments (counter {control}, acknowledged {acked})"
    );
    Ok(())
}

/// The `Txn` requests member `index` has served (grants and releases).
fn txns(cluster: &EtcdCluster, index: usize) -> f64 {
    cluster.metric(index, "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}")
}

/// Grants and releases go to the leader (a write sent to a follower is
/// forwarded, a hop more): with the followers listed first in the URL, the
/// client finds the leader and sends it every transaction; after the
/// leadership moves, it finds the new leader while it keeps working.
///
/// Negative control (same run): the same cycles from a client of one
/// follower alone land on that follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_grants_and_releases_go_to_the_leader_also_after_it_moves() -> Result<()> {
    let cluster = EtcdCluster::start();
    let leader = cluster.leader();
    let mut order: Vec<usize> = (0..cluster.len()).filter(|i| *i != leader).collect();
    order.push(leader);
    let url = format!(
        "etcd://{}",
        order
            .iter()
            .map(|i| cluster.addr(*i))
            .collect::<Vec<_>>()
            .join(",")
    );
    let client = LockClient::connect(&url).await?;
    let opts = client.options().ttl(Duration::from_secs(5));
    // Cycles until the leader serves them all: 20 cycles, 40 transactions,
    // every one on `on`.
    let all_on = |on: usize| {
        let (client, opts, cluster) = (&client, &opts, &cluster);
        async move {
            let give_up = Instant::now() + Duration::from_secs(15);
            loop {
                let before: Vec<f64> = (0..cluster.len()).map(|i| txns(cluster, i)).collect();
                for _ in 0..20 {
                    client.acquire("routed", opts).await?.release().await?;
                }
                let served: Vec<f64> = (0..cluster.len())
                    .map(|i| txns(cluster, i) - before[i])
                    .collect();
                if served[on] == 40.0 {
                    return Ok::<_, anyhow::Error>(());
                }
                ensure!(
                    Instant::now() < give_up,
                    "member {on} never served every transaction: {served:?}"
                );
            }
        }
    };
    all_on(leader).await?;

    let next = order[0];
    cluster.move_leader(next);
    all_on(next).await?;

    // The control: a client of one follower alone.
    let follower = (0..cluster.len())
        .find(|i| *i != next)
        .context("a follower")?;
    let alone = LockClient::connect(&cluster.member_url(follower)).await?;
    let before = txns(&cluster, follower);
    for _ in 0..20 {
        alone.acquire("routed", &opts).await?.release().await?;
    }
    assert_eq!(txns(&cluster, follower) - before, 40.0);
    Ok(())
}
