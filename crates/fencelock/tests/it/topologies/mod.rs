//! Deployments other than one plaintext server: TLS, Sentinel and Cluster,
//! each started by the testkit. Tests of Sentinel and Cluster carry those
//! words in their names, so nextest runs them one at a time.

mod cluster;
mod replication;
mod rwlock;
mod semaphore;
mod sentinel;
mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{Fence, FencedHash, LockClient, WriteOutcome};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What counter workers saw: every grant (when, which fence), how many
/// increments the resource acknowledged, and how many failed with an error
/// (a reply lost in the failover, replicas that did not confirm in time):
/// those may have been applied all the same.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) grants: Vec<(Instant, Fence)>,
    pub(crate) acknowledged: u64,
    pub(crate) uncertain: u64,
}

impl Tally {
    /// The counter's final value holds every acknowledged increment (none
    /// lost) and nothing beyond the increments that may have been applied
    /// (none invented).
    pub(crate) fn check_counter(&self, final_value: u64) -> Result<()> {
        ensure!(
            final_value >= self.acknowledged && final_value <= self.acknowledged + self.uncertain,
            "acknowledged {} increments ({} more failed with an error), the counter holds {final_value}",
            self.acknowledged,
            self.uncertain
        );
        Ok(())
    }

    /// Fences granted after `failed_over` are all above every fence granted
    /// before `paused_at`, and there is at least one of each; no fence was
    /// granted twice.
    pub(crate) fn check_fences_across(
        &self,
        paused_at: Instant,
        failed_over: Instant,
    ) -> Result<()> {
        let max_before = self
            .grants
            .iter()
            .filter(|(at, _)| *at < paused_at)
            .map(|(_, f)| *f)
            .max()
            .context("no grant before the failover")?;
        let after: Vec<Fence> = self
            .grants
            .iter()
            .filter(|(at, _)| *at > failed_over)
            .map(|(_, f)| *f)
            .collect();
        ensure!(!after.is_empty(), "no grant after the failover");
        ensure!(
            after.iter().all(|f| *f > max_before),
            "a fence after the failover is not above {max_before}"
        );
        let mut fences: Vec<Fence> = self.grants.iter().map(|(_, f)| *f).collect();
        fences.sort();
        let n = fences.len();
        fences.dedup();
        ensure!(fences.len() == n, "a fence was granted twice");
        Ok(())
    }
}

/// Workers that, until stopped, take lock `ctr` and increment a fenced
/// counter under it (register, read, write: no lost update), each with its
/// own lock client and counter.
pub(crate) struct CounterWorkers {
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Result<()>>>,
}

impl CounterWorkers {
    pub(crate) fn spawn(workers: Vec<(LockClient, FencedHash)>) -> Self {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let handles = workers
            .into_iter()
            .map(|(locks, counter)| {
                let (tally, stop) = (tally.clone(), stop.clone());
                tokio::spawn(async move {
                    let opts = locks
                        .options()
                        .ttl(Duration::from_millis(1500))
                        .wait(Duration::from_secs(15));
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(lease) = locks.acquire("ctr", &opts).await else {
                            continue;
                        };
                        tally
                            .lock()
                            .await
                            .grants
                            .push((Instant::now(), lease.fence()));
                        let updated = counter
                            .update(lease.fence(), lease.token(), |v| {
                                (v.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1).to_string()
                            })
                            .await;
                        match updated {
                            Ok(WriteOutcome::Accepted) => tally.lock().await.acknowledged += 1,
                            Err(_) => tally.lock().await.uncertain += 1,
                            Ok(_) => {}
                        }
                        let _ = lease.release().await;
                    }
                    Ok(())
                })
            })
            .collect();
        CounterWorkers {
            tally,
            stop,
            handles,
        }
    }

    /// How many grants the workers have had so far.
    pub(crate) async fn grants(&self) -> usize {
        self.tally.lock().await.grants.len()
    }

    /// Stops the workers and returns what they saw.
    pub(crate) async fn stop(self) -> Result<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        for handle in self.handles {
            handle.await??;
        }
        Ok(std::mem::take(&mut *self.tally.lock().await))
    }
}

/// The counter's value as the resource holds it.
pub(crate) async fn counter_value(counter: &FencedHash) -> Result<u64> {
    Ok(counter
        .read()
        .await?
        .value
        .as_deref()
        .unwrap_or("0")
        .parse()?)
}
