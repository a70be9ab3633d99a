//! Bad input and faults on fenced Postgres rows (feature `postgres`): a
//! table without the fence columns, a missing row, malformed names and
//! fences, and a connection killed mid-transaction or mid-statement — each a
//! typed error, never a silent "accepted", and never a partial write.
use std::time::{Duration, Instant};

use crate::support::postgres::{counter_table, pool, row, start_server};
use fencelock::sqlx::{self, Connection, Executor};
use fencelock::{Error, Fence, FencedTable, SetClause, WriteOutcome, holder_id};

/// A table without `lock_fence`/`lock_holder`: every operation fails with
/// `MissingFenceColumns` naming the table and the migration, and writes
/// nothing. An unknown column in the caller's own SET clause is not
/// mistaken for it.
#[tokio::test]
async fn missing_fence_columns_is_a_typed_error_naming_the_table() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    pool.execute(
        "CREATE TABLE plain (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0, status text);
         INSERT INTO plain (id) VALUES (1);
         CREATE TABLE half (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0, lock_fence bigint);
         INSERT INTO half (id) VALUES (1)",
    )
    .await?;
    let set = SetClause::new().set("status", "closed");
    for name in ["plain", "half"] {
        let table = FencedTable::new(pool.clone(), name)?;
        let errors = [
            table
                .update(&pool, 1_i64, Fence::new(1), "a", &set)
                .await
                .err(),
            table.register(&pool, 1_i64, Fence::new(1), "a").await.err(),
            table
                .upsert(&pool, 2_i64, Fence::new(1), "a", &set)
                .await
                .err(),
            table.read_fence(&pool, 1_i64).await.err(),
        ];
        for error in errors {
            let error = error.expect("must fail without the fence columns");
            assert!(
                matches!(&error, Error::MissingFenceColumns { table } if table == name),
                "{error:?}"
            );
            assert!(error.is_resource_setup() && !error.is_retryable());
            let message = error.to_string();
            assert!(
                message.contains(name)
                    && message.contains("add_fence_columns")
                    && message.contains("ALTER TABLE"),
                "{message}"
            );
        }
    }
    let untouched: (i64, Option<String>) =
        sqlx::query_as("SELECT v, status FROM plain WHERE id = 1")
            .fetch_one(&pool)
            .await?;
    assert_eq!(untouched, (0, None));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM plain")
        .fetch_one(&pool)
        .await?;
    assert_eq!(rows, 1, "the upsert inserted nothing");

    // After the migration the same table works; a typo in the caller's own
    // SQL is a plain Postgres error, not "run the migration".
    let table = FencedTable::new(pool.clone(), "plain")?;
    table.add_fence_columns().await?;
    assert_eq!(
        table.update(&pool, 1_i64, Fence::new(1), "a", &set).await?,
        WriteOutcome::Accepted
    );
    let typo = table
        .update(
            &pool,
            1_i64,
            Fence::new(2),
            "a",
            &SetClause::new().set_sql("v = vv + 1"),
        )
        .await
        .expect_err("unknown column in the SET clause");
    assert!(matches!(&typo, Error::Postgres(_)), "{typo:?}");
    assert!(typo.to_string().contains("vv"), "{typo}");
    // The SQLSTATE is the driver error's code: undefined_column.
    assert!(
        matches!(&typo, Error::Postgres(e) if e.code() == Some("42703")),
        "{typo:?}"
    );
    Ok(())
}

/// A missing row: `update` and `register` fail with `RowNotFound` (not
/// "accepted", not "rejected") and create nothing.
#[tokio::test]
async fn missing_row_is_a_typed_error() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    let update = table
        .update(
            &pool,
            42_i64,
            Fence::new(1),
            "a",
            &SetClause::new().set("status", "closed"),
        )
        .await
        .expect_err("no row 42");
    assert!(
        matches!(&update, Error::RowNotFound { table, key_column, key } if table == "doc" && key_column == "id" && key == "42"),
        "{update:?}"
    );
    assert!(update.is_resource_setup() && !update.is_retryable());
    let register = table
        .register(&pool, 42_i64, Fence::new(1), "a")
        .await
        .expect_err("no row 42");
    assert!(
        matches!(register, Error::RowNotFound { .. }),
        "{register:?}"
    );
    assert!(matches!(
        table.read_fence(&pool, 42_i64).await,
        Err(Error::RowNotFound { .. })
    ));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM doc")
        .fetch_one(&pool)
        .await?;
    assert_eq!(rows, 1);
    Ok(())
}

/// Malformed names, fences and clauses are refused before anything is sent.
#[tokio::test]
async fn bad_names_fences_and_clauses_are_refused_before_sending() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;

    for bad in ["", "doc\"; DROP TABLE doc; --", "a.b.c", "x\u{0}"] {
        let err = FencedTable::new(pool.clone(), bad).expect_err("bad table name");
        assert!(matches!(err, Error::InvalidName { .. }), "{bad:?}: {err:?}");
    }
    assert!(matches!(
        table.clone().with_key_column("id\" OR 1=1 --"),
        Err(Error::InvalidName { .. })
    ));
    let set = SetClause::new().set("status", "x");
    let too_big = table
        .update(&pool, 1_i64, Fence::new(u64::MAX), "a", &set)
        .await
        .expect_err("fence above i64::MAX");
    assert!(
        too_big.is_invalid_input() && too_big.to_string().contains("bigint"),
        "{too_big}"
    );
    let empty_holder = table
        .update(&pool, 1_i64, Fence::new(1), "", &set)
        .await
        .expect_err("empty holder");
    assert!(empty_holder.is_invalid_input(), "{empty_holder}");
    let bad_column = table
        .update(
            &pool,
            1_i64,
            Fence::new(1),
            "a",
            &SetClause::new().set("status\" = 'x', v = 99 --", "y"),
        )
        .await
        .expect_err("bad column");
    assert!(
        matches!(bad_column, Error::InvalidName { .. }),
        "{bad_column:?}"
    );
    let unbound = table
        .update(
            &pool,
            1_i64,
            Fence::new(1),
            "a",
            &SetClause::new().set_sql("v = $1"),
        )
        .await
        .expect_err("placeholder without a value");
    assert!(unbound.is_invalid_input(), "{unbound}");
    let empty = table
        .update(&pool, 1_i64, Fence::new(1), "a", &SetClause::new())
        .await
        .expect_err("empty");
    assert!(empty.is_invalid_input(), "{empty}");
    // A value that looks like SQL is just a value.
    let injection = "x'; UPDATE doc SET v = 99; --";
    assert_eq!(
        table
            .update(
                &pool,
                1_i64,
                Fence::new(1),
                "a",
                &SetClause::new().set("status", injection)
            )
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (0, Some(injection.into()), Some(1), Some(holder_id("a")))
    );
    Ok(())
}

/// The connection of a transaction is killed (`pg_terminate_backend` from
/// an admin connection) after fenced statements succeeded inside it: the
/// next fenced statement fails with a connection error, the commit fails,
/// and the row is unchanged — the server rolled everything back.
#[tokio::test]
async fn connection_killed_mid_transaction_is_a_typed_error_and_writes_nothing()
-> anyhow::Result<()> {
    let pg = start_server().await;
    let admin = pool(&pg.url(), 2).await?;
    let table = counter_table(&admin, "doc").await?;
    let mut conn = sqlx::PgConnection::connect(&pg.url()).await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await?;

    let mut tx = conn.begin().await?;
    assert_eq!(
        table.register(&mut *tx, 1_i64, Fence::new(5), "b").await?,
        WriteOutcome::Accepted
    );
    let inc = SetClause::new().set_sql("v = v + 1");
    assert_eq!(
        table
            .update(&mut *tx, 1_i64, Fence::new(5), "b", &inc)
            .await?,
        WriteOutcome::Accepted
    );

    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await?;
    assert!(killed);

    let err = table
        .update(&mut *tx, 1_i64, Fence::new(5), "b", &inc)
        .await
        .expect_err("the connection is gone");
    eprintln!("mid-transaction kill: {err:?}");
    assert!(matches!(err, Error::Postgres(_)), "{err:?}");
    assert!(err.is_connection() && err.is_retryable(), "{err:?}");
    assert!(tx.commit().await.is_err(), "commit on a killed connection");
    assert_eq!(row(&admin, "doc", 1).await?, (0, None, None, None));
    Ok(())
}

/// The backend running a fenced update is killed while the statement runs
/// (it sleeps inside its SET clause): a connection error, and the row is
/// unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_mid_statement_is_a_typed_error_and_writes_nothing() -> anyhow::Result<()>
{
    let pg = start_server().await;
    let admin = pool(&pg.url(), 2).await?;
    let table = counter_table(&admin, "doc").await?;
    let mut conn = sqlx::PgConnection::connect(&pg.url()).await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await?;

    let slow = SetClause::new()
        .set("status", "half-written")
        .set_sql("v = v + 1 + (SELECT 0 FROM pg_sleep(10))");
    let write = {
        let table = table.clone();
        tokio::spawn(async move {
            let mut conn = conn;
            table
                .update(&mut conn, 1_i64, Fence::new(5), "b", &slow)
                .await
        })
    };
    // Wait until the statement is running, then kill its backend.
    let started = Instant::now();
    loop {
        let running: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep%')",
        )
        .bind(pid)
        .fetch_one(&admin)
        .await?;
        if running {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the statement never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await?;
    assert!(killed);
    let err = write
        .await?
        .expect_err("the statement's backend was killed");
    eprintln!("mid-statement kill: {err:?}");
    assert!(
        matches!(err, Error::Postgres(_)) && err.is_connection(),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the kill did not cut the statement short"
    );
    assert_eq!(row(&admin, "doc", 1).await?, (0, None, None, None));
    Ok(())
}

/// A dead pool (server stopped) is a connection error, not a rejection.
#[tokio::test]
async fn server_gone_is_a_connection_error() -> anyhow::Result<()> {
    let mut pg = start_server().await;
    let pool = fencelock::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&pg.url())
        .await?;
    let table = counter_table(&pool, "doc").await?;
    pg.kill();
    let err = table
        .update(
            &pool,
            1_i64,
            Fence::new(1),
            "a",
            &SetClause::new().set("status", "x"),
        )
        .await
        .expect_err("server is gone");
    assert!(err.is_connection(), "{err:?}");
    Ok(())
}
