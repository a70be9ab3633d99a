//! Fenced Postgres rows (feature `postgres`): the acceptance rule of
//! docs/design.md §2.4 on a real Postgres (started by the testkit as the
//! `postgres` user on a free port with its own data directory), the guide's
//! order with a real Redis lock and a real stall, upserts, registration,
//! custom keys, and the `Fenced` trait.
use std::time::Duration;

use crate::support::postgres::{counter_table, pool, row, start_server};
use anyhow::Context;
use fencelock::sqlx::{Connection, Executor, PgConnection};
use fencelock::{
    Fence, FenceMode, Fenced, FencedTable, LockClient, LockOptions, ReleaseOutcome, Renewal,
    RowFence, SetClause, WriteOutcome, holder_id,
};
use fencelock_testkit::RedisServer;

fn rejected(fence: u64, holder: Option<&str>) -> WriteOutcome {
    WriteOutcome::Rejected {
        current_fence: Some(Fence::new(fence)),
        current_holder: holder.map(holder_id),
    }
}

fn status(s: &'static str) -> SetClause {
    SetClause::new().set("status", s)
}

/// The guide's order with a real lock: A takes the lock (counter fences, as
/// in the guide) and its thread stalls 400 ms past its 300 ms lease (its
/// renewal cannot run either); B takes over and closes the invoice with
/// fence 2; A wakes and its update with fence 1 is rejected; the row keeps
/// B's status, fence and holder; A's release finds the lock not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guide_order_stale_holder_rejected_after_current_holder_wrote() -> anyhow::Result<()> {
    let redis = RedisServer::start();
    let pg = start_server().await;
    let pool = pool(&pg.url(), 4).await?;
    let table = counter_table(&pool, "invoices").await?;

    let opts = guide_opts();
    let (a_holds_tx, a_holds_rx) = tokio::sync::oneshot::channel::<Fence>();
    let (b_wrote_tx, b_wrote_rx) = std::sync::mpsc::channel::<()>();
    let worker_a = {
        let (url, table, opts) = (redis.url(), table.clone(), opts.clone());
        std::thread::spawn(
            move || -> anyhow::Result<(Fence, WriteOutcome, ReleaseOutcome)> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let client = LockClient::connect(&url).await?;
                    let lease = client.acquire("invoice:1", &opts).await?;
                    let fence = lease.fence();
                    let _ = a_holds_tx.send(fence);
                    // A real stall: this thread (and A's runtime, renewal
                    // included) does nothing for longer than the lease.
                    std::thread::sleep(Duration::from_millis(400));
                    b_wrote_rx.recv_timeout(Duration::from_secs(10))?;
                    let write = table
                        .update(
                            table.pool(),
                            1_i64,
                            fence,
                            lease.token(),
                            &status("closed by A"),
                        )
                        .await?;
                    let release = lease.release().await?;
                    Ok((fence, write, release))
                })
            },
        )
    };

    let a_fence = a_holds_rx.await.context("A did not take the lock")?;
    let client = LockClient::connect(&redis.url()).await?;
    let b = client.acquire("invoice:1", &opts).await?;
    assert_eq!((a_fence, b.fence()), (Fence::new(1), Fence::new(2)));
    assert_eq!(
        table
            .update(&pool, 1_i64, b.fence(), b.token(), &status("closed by B"))
            .await?,
        WriteOutcome::Accepted
    );
    b_wrote_tx.send(())?;
    let (_, a_write, a_release) = tokio::task::spawn_blocking(move || worker_a.join())
        .await?
        .map_err(|_| anyhow::anyhow!("worker A panicked"))??;

    assert_eq!(a_write, rejected(2, Some(b.token())));
    assert!(!a_release.is_released(), "A's release: {a_release:?}");
    assert_eq!(
        row(&pool, "invoices", 1).await?,
        (0, Some("closed by B".into()), Some(2), Some(b.holder_id()))
    );
    assert!(b.release().await?.is_released());
    Ok(())
}

/// Lock options of the guide: ttl 300 ms, counter fences (1, 2, ...).
fn guide_opts() -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_millis(300))
        .wait(Duration::from_secs(10))
        .renewal(Renewal::Auto)
        .fence_mode(FenceMode::Counter)
}

/// A fence equal to the stored one is accepted only from the holder that
/// stored it (two holders issued the same fence after a counter reset must
/// not both write); higher wins, lower loses; rejections change nothing.
#[tokio::test]
async fn equal_fence_other_holder_rejected_same_holder_accepted() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    let inc = SetClause::new().set_sql("v = v + 1");

    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(47), "a", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    // Same fence, another holder (the counter was reset and re-issued 47).
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(47), "b", &inc)
            .await?,
        rejected(47, Some("a"))
    );
    assert_eq!(
        table.register(&pool, 1_i64, Fence::new(47), "b").await?,
        rejected(47, Some("a"))
    );
    // Same fence, same holder: the holder writing again.
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(47), "a", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (2, None, Some(47), Some(holder_id("a")))
    );
    // Lower: refused, also from the stored holder.
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(46), "a", &inc)
            .await?,
        rejected(47, Some("a"))
    );
    // Higher: accepted from anyone.
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(48), "b", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (3, None, Some(48), Some(holder_id("b")))
    );

    // A row fenced by a writer that recorded no holder (the guide's
    // statement): an equal fence has an unknown holder and is refused.
    pool.execute("UPDATE doc SET lock_fence = 60, lock_holder = NULL WHERE id = 1")
        .await?;
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(60), "b", &inc)
            .await?,
        rejected(60, None)
    );
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(61), "b", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (4, None, Some(61), Some(holder_id("b")))
    );
    Ok(())
}

/// A row never written under a lock (`lock_fence IS NULL`) accepts any
/// fence, even 0, and the write records fence and holder.
#[tokio::test]
async fn row_never_written_under_a_lock_accepts_any_fence() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    pool.execute("INSERT INTO doc (id, v) VALUES (2, 0)")
        .await?;
    assert_eq!(table.read_fence(&pool, 1_i64).await?, RowFence::default());

    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(0), "a", &status("x"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (0, Some("x".into()), Some(0), Some(holder_id("a")))
    );
    assert_eq!(
        table.register(&pool, 2_i64, Fence::new(5), "b").await?,
        WriteOutcome::Accepted
    );
    let registered = table.read_fence(&pool, 2_i64).await?;
    assert_eq!(
        (registered.fence, registered.holder),
        (Some(Fence::new(5)), Some(holder_id("b")))
    );
    Ok(())
}

/// Registration records fence and holder without touching other columns,
/// and from then on refuses older fences.
#[tokio::test]
async fn register_records_the_fence_only() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(10), "a", &status("open"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        table.register(&pool, 1_i64, Fence::new(11), "b").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (0, Some("open".into()), Some(11), Some(holder_id("b")))
    );
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(10), "a", &status("stale"))
            .await?,
        rejected(11, Some("b"))
    );
    // Registering again with the same fence and holder is accepted (idempotent).
    assert_eq!(
        table.register(&pool, 1_i64, Fence::new(11), "b").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        table
            .update(&pool, 1_i64, Fence::new(11), "b", &status("closed"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (0, Some("closed".into()), Some(11), Some(holder_id("b")))
    );
    Ok(())
}

/// Insert-or-update: a missing row is inserted with the fence; an existing
/// row is updated only under the rule; a rejection reports the current
/// fence and changes nothing; SQL expressions are refused for upserts.
#[tokio::test]
async fn upsert_inserts_missing_rows_and_applies_the_rule() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    let values = |v: i64, s: &'static str| SetClause::new().set("v", v).set("status", s);

    assert_eq!(
        table
            .upsert(&pool, 7_i64, Fence::new(5), "a", &values(1, "new"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 7).await?,
        (1, Some("new".into()), Some(5), Some(holder_id("a")))
    );
    assert_eq!(
        table
            .upsert(&pool, 7_i64, Fence::new(4), "z", &values(2, "stale"))
            .await?,
        rejected(5, Some("a"))
    );
    assert_eq!(
        table
            .upsert(
                &pool,
                7_i64,
                Fence::new(5),
                "z",
                &values(2, "same fence, other holder")
            )
            .await?,
        rejected(5, Some("a"))
    );
    assert_eq!(
        row(&pool, "doc", 7).await?,
        (1, Some("new".into()), Some(5), Some(holder_id("a")))
    );
    assert_eq!(
        table
            .upsert(&pool, 7_i64, Fence::new(5), "a", &values(3, "again"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        table
            .upsert(&pool, 7_i64, Fence::new(6), "b", &values(4, "newer"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 7).await?,
        (4, Some("newer".into()), Some(6), Some(holder_id("b")))
    );
    // The pre-existing, never-fenced row 1 is updated by an upsert too.
    assert_eq!(
        table
            .upsert(&pool, 1_i64, Fence::new(1), "a", &values(9, "fenced"))
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (9, Some("fenced".into()), Some(1), Some(holder_id("a")))
    );

    let err = table
        .upsert(
            &pool,
            8_i64,
            Fence::new(9),
            "a",
            &SetClause::new().set_sql("v = v + 1"),
        )
        .await
        .expect_err("SQL in an upsert");
    assert!(err.is_invalid_input(), "{err}");
    Ok(())
}

/// Every operation takes the executor to run on, as sqlx's queries do: the
/// same methods work on the pool, on a plain connection, on a pooled
/// connection and inside a transaction. Writes inside a transaction see
/// each other (a stale write is rejected there too); a rolled-back
/// transaction leaves the row as it was, a committed one applies.
#[tokio::test]
async fn one_method_runs_on_a_pool_a_connection_and_a_transaction() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    let inc = SetClause::new().set_sql("v = v + 1");
    let values = SetClause::new().set("v", 10_i64).set("status", "new");
    let fence_of = |r: RowFence| (r.fence, r.holder);

    // The pool.
    assert_eq!(
        table.update(&pool, 1_i64, Fence::new(1), "a", &inc).await?,
        WriteOutcome::Accepted
    );
    // A plain connection.
    let mut conn = PgConnection::connect(&pg.url()).await?;
    assert_eq!(
        table.register(&mut conn, 1_i64, Fence::new(2), "b").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        table
            .update(&mut conn, 1_i64, Fence::new(2), "b", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        fence_of(table.read_fence(&mut conn, 1_i64).await?),
        (Some(Fence::new(2)), Some(holder_id("b")))
    );
    conn.close().await?;
    // A connection checked out of the pool.
    {
        let mut pooled = pool.acquire().await?;
        assert_eq!(
            table
                .upsert(&mut *pooled, 2_i64, Fence::new(1), "c", &values)
                .await?,
            WriteOutcome::Accepted
        );
    }
    let before = row(&pool, "doc", 1).await?;
    assert_eq!(before, (2, None, Some(2), Some(holder_id("b"))));

    // A transaction, rolled back: nothing it wrote remains.
    let mut tx = pool.begin().await?;
    assert_eq!(
        table.register(&mut *tx, 1_i64, Fence::new(3), "c").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        table
            .update(&mut *tx, 1_i64, Fence::new(3), "c", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        table
            .update(&mut *tx, 1_i64, Fence::new(2), "b", &inc)
            .await?,
        rejected(3, Some("c")),
        "the transaction's own registration refuses the older fence"
    );
    assert_eq!(
        table
            .upsert(&mut *tx, 3_i64, Fence::new(3), "c", &values)
            .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        fence_of(table.read_fence(&mut *tx, 1_i64).await?),
        (Some(Fence::new(3)), Some(holder_id("c")))
    );
    tx.rollback().await?;
    assert_eq!(row(&pool, "doc", 1).await?, before);
    assert!(
        matches!(
            table.read_fence(&pool, 3_i64).await,
            Err(fencelock::Error::RowNotFound { .. })
        ),
        "the rolled-back upsert inserted nothing"
    );

    // A transaction, committed: its write is applied.
    let mut tx = pool.begin().await?;
    assert_eq!(
        table
            .update(&mut *tx, 1_i64, Fence::new(3), "c", &inc)
            .await?,
        WriteOutcome::Accepted
    );
    tx.commit().await?;
    assert_eq!(
        row(&pool, "doc", 1).await?,
        (3, None, Some(3), Some(holder_id("c")))
    );
    Ok(())
}

/// A schema-qualified, mixed-case table with a text key column; values
/// bound with `$N` in trusted SQL.
#[tokio::test]
async fn schema_qualified_table_and_custom_key_column() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    pool.execute(
        r#"CREATE SCHEMA billing;
           CREATE TABLE billing."Invoices" (invoice_no text PRIMARY KEY, total bigint NOT NULL, status text);
           INSERT INTO billing."Invoices" VALUES ('INV-42', 100, 'open')"#,
    )
    .await?;
    let table =
        FencedTable::new(pool.clone(), "billing.Invoices")?.with_key_column("invoice_no")?;
    table.add_fence_columns().await?;
    table.add_fence_columns().await?; // idempotent
    let add = SetClause::new()
        .set("status", "adjusted")
        .set_sql("total = total + $2")
        .bind(25_i64);
    assert_eq!(
        table
            .update(&pool, "INV-42", Fence::new(3), "a", &add)
            .await?,
        WriteOutcome::Accepted
    );
    let (total, st): (i64, String) = fencelock::sqlx::query_as(
        r#"SELECT total, status FROM billing."Invoices" WHERE invoice_no = 'INV-42'"#,
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!((total, st.as_str()), (125, "adjusted"));
    let err = table
        .update(&pool, "INV-43", Fence::new(3), "a", &add)
        .await
        .expect_err("missing row");
    assert!(
        err.to_string().contains("invoice_no") && err.to_string().contains("INV-43"),
        "{err}"
    );
    Ok(())
}

/// Generic code over `Fenced` works with a Postgres row and a Redis hash,
/// and its futures are `Send` (spawnable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_trait_covers_rows_and_hashes() -> anyhow::Result<()> {
    async fn close<R>(
        resource: R,
        fence: Fence,
        holder: String,
        write: Box<R::Write>,
    ) -> fencelock::Result<WriteOutcome>
    where
        R: Fenced + Send + Sync + 'static,
        R::Write: Send + Sync,
    {
        // Spawning requires the trait's future to be Send.
        tokio::spawn(async move { resource.fenced_write(fence, &holder, &write).await })
            .await
            .expect("spawned write panicked")
    }

    let redis = RedisServer::start();
    let pg = start_server().await;
    let pool = pool(&pg.url(), 2).await?;
    let table = counter_table(&pool, "doc").await?;
    let client = LockClient::connect(&redis.url()).await?;

    let row1 = table.row(1_i64);
    assert_eq!(
        close(
            row1.clone(),
            Fence::new(2),
            "b".into(),
            Box::new(status("b"))
        )
        .await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        close(row1, Fence::new(1), "a".into(), Box::new(status("a"))).await?,
        rejected(2, Some("b"))
    );
    let hash = client.fenced_hash("doc:1")?;
    assert_eq!(
        close(hash.clone(), Fence::new(2), "b".into(), "b".into()).await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        close(hash, Fence::new(1), "a".into(), "a".into()).await?,
        rejected(2, Some("b"))
    );
    Ok(())
}
