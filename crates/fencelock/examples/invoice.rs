//! The guide's invoice example, end to end: two workers close invoice 42
//! under the lock `invoice:42`, writing to a Postgres row through the fence
//! check.
//!
//! Worker A takes the lock (lease 300 ms) and then stalls for 400 ms — a
//! real stall: its thread sleeps, so its runtime, lease renewal included,
//! does nothing. B takes the lock once A's lease has run out and closes the
//! invoice with its fence. A wakes up and runs the guide's `fenced_update`
//! with its older fence: rejected. The row holds B's status and fence.
//!
//! ```text
//! cargo run -p fencelock --features postgres --example invoice
//! ```
//!
//! By default it starts its own `redis-server` and PostgreSQL server
//! (through `fencelock-testkit`, on free loopback ports, in temporary
//! directories, stopped at the end), so it needs `redis-server` and the
//! PostgreSQL server binaries installed (`scripts/setup.sh`). Given
//! `FENCELOCK_URL` (a Redis URL) it uses that Redis instead, and given
//! `FENCELOCK_PG_URL` that database, in which it creates the table
//! `invoices` (it stops if the table exists, and leaves it for you to
//! look at). It exits non-zero unless the row ends up holding B's write,
//! which the tests check on every change.
#![allow(clippy::print_stdout)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use fencelock::sqlx::postgres::PgPoolOptions;
use fencelock::sqlx::{self, Executor};
use fencelock::{
    Fence, FenceMode, FencedTable, LockClient, LockOptions, ReleaseOutcome, SetClause, WriteOutcome,
};
use fencelock_testkit::{PgServer, RedisServer};

const INVOICE: i64 = 42;
const LOCK: &str = "invoice:42";
const TTL: Duration = Duration::from_millis(300);
const STALL: Duration = Duration::from_millis(400);

/// The guide's `fenced_update(conn, invoice_id, fence, status)`: one
/// conditional UPDATE, accepted iff the fence is newer than the row's (or
/// the same holder's). It runs on the table's pool here; a connection
/// (`&mut conn`) or a transaction (`&mut *tx`) works the same way.
async fn fenced_update(
    invoices: &FencedTable,
    invoice_id: i64,
    fence: Fence,
    holder: &str,
    status: &str,
) -> fencelock::Result<WriteOutcome> {
    invoices
        .update(
            invoices.pool(),
            invoice_id,
            fence,
            holder,
            &SetClause::new().set("status", status),
        )
        .await
}

fn describe(outcome: &WriteOutcome) -> String {
    match outcome {
        WriteOutcome::Accepted => "accepted".to_owned(),
        WriteOutcome::Rejected { current_fence, .. } => format!(
            "rejected as stale (the row holds fence {})",
            current_fence.map_or("none".to_owned(), |f| f.to_string())
        ),
        other => format!("{other:?}"),
    }
}

/// The URL in environment variable `var`, if set and not empty.
fn env_url(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

fn main() -> anyhow::Result<()> {
    // Each server is started only when no URL names one; dropping it stops
    // it, so both live until `main` returns.
    let redis = env_url("FENCELOCK_URL").map_or_else(
        || {
            println!("starting a private redis-server ...");
            let server = RedisServer::start();
            (server.url(), Some(server))
        },
        |url| (url, None),
    );
    let pg = env_url("FENCELOCK_PG_URL").map_or_else(
        || {
            println!("starting a private PostgreSQL server ...");
            let server = PgServer::start();
            (server.create_database("billing"), Some(server))
        },
        |url| (url, None),
    );
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(run(&redis.0, &pg.0));
    drop(rt);
    result
}

async fn run(redis_url: &str, db_url: &str) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(db_url)
        .await?;
    pool.execute("CREATE TABLE invoices (id bigint PRIMARY KEY, status text NOT NULL)")
        .await?;
    let invoices = FencedTable::new(pool.clone(), "invoices")?;
    // The two fence columns: lock_fence bigint, lock_holder text.
    invoices.add_fence_columns().await?;
    pool.execute("INSERT INTO invoices (id, status) VALUES (42, 'open')")
        .await?;
    // Counter fences (1, 2, ...) as in the guide; the default clock fences
    // behave the same, with larger numbers.
    let opts = LockOptions::default()
        .ttl(TTL)
        .wait(Duration::from_secs(10))
        .fence_mode(FenceMode::Counter);
    let start = Instant::now();
    let say = move |who: &str, what: String| {
        println!(
            "{:>7.1} ms  {who}  {what}",
            start.elapsed().as_secs_f64() * 1000.0
        );
    };

    // Worker A, on its own thread and single-threaded runtime.
    let (a_holds_tx, a_holds_rx) = tokio::sync::oneshot::channel::<()>();
    let (b_closed_tx, b_closed_rx) = mpsc::channel::<()>();
    let worker_a = {
        let (redis_url, invoices, opts) = (redis_url.to_owned(), invoices.clone(), opts.clone());
        std::thread::spawn(
            move || -> anyhow::Result<(Fence, WriteOutcome, ReleaseOutcome)> {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(async move {
                        let client = LockClient::connect(&redis_url).await?;
                        let lease = client.acquire(LOCK, &opts).await?;
                        say("A", format!("acquired {LOCK}, fence {}", lease.fence()));
                        let _ = a_holds_tx.send(());
                        say("A", format!("stalls for {STALL:?} (lease {TTL:?})"));
                        std::thread::sleep(STALL);
                        b_closed_rx.recv_timeout(Duration::from_secs(10))?;
                        say("A", "wakes up and closes the invoice".into());
                        let write = fenced_update(
                            &invoices,
                            INVOICE,
                            lease.fence(),
                            lease.token(),
                            "closed by A",
                        )
                        .await?;
                        say(
                            "A",
                            format!(
                                "fenced_update with fence {} -> {}",
                                lease.fence(),
                                describe(&write)
                            ),
                        );
                        let fence = lease.fence();
                        let release = lease.release().await?;
                        say(
                            "A",
                            match release {
                                ReleaseOutcome::Released => "release -> released".to_owned(),
                                _ => "release -> not ours any more: B's lock stays".to_owned(),
                            },
                        );
                        Ok((fence, write, release))
                    })
            },
        )
    };

    a_holds_rx.await.context("worker A stopped early")?;
    let client = LockClient::connect(redis_url).await?;
    let lease_b = client.acquire(LOCK, &opts).await?;
    say(
        "B",
        format!(
            "acquired {LOCK}, fence {} (A's lease ran out)",
            lease_b.fence()
        ),
    );
    let b_write = fenced_update(
        &invoices,
        INVOICE,
        lease_b.fence(),
        lease_b.token(),
        "closed by B",
    )
    .await?;
    say(
        "B",
        format!(
            "fenced_update with fence {} -> {}",
            lease_b.fence(),
            describe(&b_write)
        ),
    );
    b_closed_tx.send(())?;
    let (a_fence, a_write, a_release) = tokio::task::spawn_blocking(move || worker_a.join())
        .await?
        .map_err(|_| anyhow::anyhow!("worker A panicked"))??;

    let (status, fence, holder): (String, Option<i64>, Option<String>) =
        sqlx::query_as("SELECT status, lock_fence, lock_holder FROM invoices WHERE id = 42")
            .fetch_one(&pool)
            .await?;
    println!();
    // The row records the writer's public holder id (a hash of its token),
    // never the token itself.
    let b_holder = lease_b.holder_id();
    println!(
        "invoices row 42: status {status:?}, lock_fence {}, lock_holder is B's holder id: {}",
        fence.map_or("NULL".into(), |f| f.to_string()),
        holder.as_deref() == Some(b_holder.as_str())
    );
    let b_fence = lease_b.fence();
    lease_b.release().await?;

    ensure!(b_write.is_accepted(), "B's update was refused: {b_write:?}");
    ensure!(
        !a_write.is_accepted(),
        "A's stale update (fence {a_fence}) was accepted"
    );
    ensure!(
        !a_release.is_released(),
        "A's release removed B's lock: {a_release:?}"
    );
    ensure!(
        status == "closed by B"
            && fence == i64::try_from(b_fence.get()).ok()
            && holder.as_deref() == Some(b_holder.as_str()),
        "the row does not hold B's write"
    );
    println!("ok: the stale holder's update was rejected; the row holds B's status and fence");
    Ok(())
}
