//! Concurrent worker *processes* (feature `postgres`): 4 processes each
//! make 2,000 increments of one Postgres row through one Redis lock
//! (acquire → one-statement fenced increment → release) with a short lease,
//! while the test freezes random workers with SIGSTOP past their lease. The
//! row must end with exactly the number of increments the workers saw
//! acknowledged.
//!
//! The worker processes are this test binary itself, re-executed with
//! `pg_worker_process_entry` and its job in the environment, so they
//! always run the library under test with the same features, without a
//! separately built binary. They are spawned through the testkit
//! (orphan-safe: they die with the test).
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::entry_command;
use crate::support::postgres::{counter_table, pool, start_server, value};
use anyhow::Context;
use fencelock::{FencedTable, LockClient, SetClause, WriteOutcome};
use fencelock_testkit::{GuardedChild, RedisServer, spawn_guarded};

const WORKERS: usize = 4;
const INCREMENTS: u64 = 2_000;
/// A short lease, so that a frozen worker really loses it.
const TTL: Duration = Duration::from_millis(200);
const LOCK: &str = "pg-counter";

/// The worker's job: `REDIS_URL PG_URL OUT_FILE WORKER_ID`.
const WORKER_ENV: &str = "FENCELOCK_PG_WORKER";

/// Entry point of a worker process. As an ordinary test (the variable is
/// not set) it does nothing.
#[test]
fn pg_worker_process_entry() {
    let Ok(job) = std::env::var(WORKER_ENV) else {
        return;
    };
    let parts: Vec<String> = job.split(' ').map(str::to_owned).collect();
    let [redis_url, pg_url, out, id] = parts.as_slice() else {
        panic!("bad {WORKER_ENV}: {job:?}");
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (acked, rejected) = rt
        .block_on(worker(redis_url, pg_url, id))
        .unwrap_or_else(|e| panic!("worker {id}: {e:#}"));
    std::fs::write(out, format!("{acked} {rejected}")).expect("write the worker's result");
}

async fn worker(redis_url: &str, pg_url: &str, id: &str) -> anyhow::Result<(u64, u64)> {
    let client = LockClient::connect(redis_url).await?;
    let table = FencedTable::new(pool(pg_url, 1).await?, "counter")?;
    let opts = client.options().ttl(TTL).wait(Duration::from_secs(60));
    let inc = SetClause::new().set_sql("v = v + 1");
    let (mut acked, mut rejected) = (0, 0);
    for i in 0..INCREMENTS {
        let lease = client
            .acquire(LOCK, &opts)
            .await
            .with_context(|| format!("worker {id}: acquire #{i}"))?;
        match table
            .update(table.pool(), 1_i64, lease.fence(), lease.token(), &inc)
            .await?
        {
            WriteOutcome::Accepted => acked += 1,
            WriteOutcome::Rejected { .. } => rejected += 1,
            other => anyhow::bail!("unexpected outcome {other:?}"),
        }
        // After a freeze the lease may be gone: "not ours" is expected then.
        lease.release().await?;
    }
    Ok((acked, rejected))
}

fn spawn_worker(redis_url: &str, pg_url: &str, out: &std::path::Path, id: usize) -> GuardedChild {
    let job = format!("{redis_url} {pg_url} {} {id}", out.display());
    let mut command = entry_command(
        module_path!(),
        "pg_worker_process_entry",
        (WORKER_ENV, &job),
    );
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    spawn_guarded(command)
}

/// (`heavy_`: the nextest config runs heavy tests one at a time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_worker_processes_end_with_exactly_the_acknowledged_count() -> anyhow::Result<()> {
    let redis = RedisServer::start();
    let pg = start_server().await;
    let admin = pool(&pg.url(), 1).await?;
    counter_table(&admin, "counter").await?;
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let mut workers: Vec<(GuardedChild, std::path::PathBuf)> = (0..WORKERS)
        .map(|id| {
            let out = dir.path().join(format!("worker-{id}"));
            (spawn_worker(&redis.url(), &pg.url(), &out, id), out)
        })
        .collect();

    // Freeze a worker past its lease now and then, until they are done.
    let mut freezes = 0;
    let deadline = started + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if workers.iter_mut().all(|(w, _)| !w.is_running()) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "workers did not finish within 120 s"
        );
        if freezes < 8
            && let Some((w, _)) = workers.get_mut(freezes % WORKERS)
            && w.is_running()
        {
            w.stop();
            tokio::time::sleep(TTL * 2).await;
            w.cont();
            freezes += 1;
        }
    }
    let elapsed = started.elapsed();

    let (mut acked, mut rejected) = (0_u64, 0_u64);
    for (id, (w, out)) in workers.iter_mut().enumerate() {
        let status = w.try_wait().context("worker still running")?;
        anyhow::ensure!(status.success(), "worker {id} failed: {status}");
        let result = std::fs::read_to_string(out.as_path())?;
        let (a, r) = result.split_once(' ').context("worker result")?;
        acked += a.parse::<u64>()?;
        rejected += r.parse::<u64>()?;
    }
    let applied = value(&admin, "counter", 1).await?;
    eprintln!(
        "{WORKERS} worker processes x {INCREMENTS} increments in {elapsed:.1?} ({:.0} lock cycles/s), {freezes} freezes of {:?}: {acked} acknowledged, {rejected} rejected as stale, {applied} applied",
        (WORKERS as u64 * INCREMENTS) as f64 / elapsed.as_secs_f64(),
        TTL * 2
    );
    assert_eq!(acked + rejected, WORKERS as u64 * INCREMENTS);
    assert_eq!(
        applied, acked as i64,
        "the row must hold exactly the acknowledged increments"
    );
    Ok(())
}
