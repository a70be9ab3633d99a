//! Shared helpers of the `postgres_*` test binaries: a Postgres server per
//! test (started by the testkit as the `postgres` user on a free port, with
//! its own data directory) and a counter table with the fence columns.
//! Postgres test setup shared by the `postgres` tests: a server, pools, the
//! counter table.

use std::time::Duration;

use anyhow::Context;
use fencelock::FencedTable;
use fencelock::sqlx::postgres::{PgPool, PgPoolOptions};
use fencelock::sqlx::{self, AssertSqlSafe, Executor};
use fencelock_testkit::PgServer;

/// Starts a server (blocking, ~2 s: initdb + start). Call it from
/// `spawn_blocking` or before the runtime is busy.
pub(crate) async fn start_server() -> PgServer {
    tokio::task::spawn_blocking(PgServer::start)
        .await
        .expect("PgServer::start panicked")
}

/// A pool on `url` with up to `max` connections.
pub(crate) async fn pool(url: &str, max: u32) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        // No ping before every checkout: it doubles the round trips.
        .test_before_acquire(false)
        .connect(url)
        .await
        .with_context(|| format!("connect to {url}"))
}

/// Creates `name (id bigint primary key, v bigint, status text)` with the
/// fence columns added by the library's migration, and one row `id = 1,
/// v = 0` that was never written under a lock.
pub(crate) async fn counter_table(pool: &PgPool, name: &str) -> anyhow::Result<FencedTable> {
    pool.execute(AssertSqlSafe(format!(
        "CREATE TABLE {name} (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0, status text)"
    )))
    .await?;
    let table = FencedTable::new(pool.clone(), name)?;
    table.add_fence_columns().await?;
    pool.execute(AssertSqlSafe(format!(
        "INSERT INTO {name} (id, v) VALUES (1, 0)"
    )))
    .await?;
    Ok(table)
}

/// `v` of row `id` in `table`.
pub(crate) async fn value(pool: &PgPool, table: &str, id: i64) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT v FROM {table} WHERE id = $1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await?)
}

/// `(v, status, lock_fence, lock_holder)` of row `id` in `table`.
pub(crate) async fn row(
    pool: &PgPool,
    table: &str,
    id: i64,
) -> anyhow::Result<(i64, Option<String>, Option<i64>, Option<String>)> {
    Ok(sqlx::query_as(AssertSqlSafe(format!(
        "SELECT v, status, lock_fence, lock_holder FROM {table} WHERE id = $1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await?)
}
