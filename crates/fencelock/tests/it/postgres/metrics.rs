//! Fenced Postgres writes are counted (feature `postgres`): accepted and
//! stale updates and upserts of a `FencedTable` given the client's stats
//! handle, in the recorder (`resource` = the table name) and in the stats.
use crate::support::postgres::{counter_table, pool, start_server};
use anyhow::{Result, ensure};
use fencelock::metrics::FENCED_WRITES;
use fencelock::{Fence, LockClient, SetClause};
use fencelock_testkit::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn fenced_table_writes_are_counted() -> Result<()> {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let stats = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let pg = start_server().await;
            let pool = pool(&pg.url(), 2).await?;
            let client = LockClient::connect(&redis.url()).await?;
            let table = counter_table(&pool, "invoices")
                .await?
                .with_stats(client.stats_handle());
            let set = || SetClause::new().set("status", "closed");
            ensure!(
                table
                    .update(&pool, 1i64, Fence::new(5), "b", &set())
                    .await?
                    .is_accepted()
            );
            ensure!(
                !table
                    .update(&pool, 1i64, Fence::new(4), "a", &set())
                    .await?
                    .is_accepted()
            );
            ensure!(
                !table
                    .upsert(&pool, 1i64, Fence::new(3), "a", &set())
                    .await?
                    .is_accepted()
            );
            ensure!(
                table
                    .upsert(&pool, 2i64, Fence::new(1), "c", &set())
                    .await?
                    .is_accepted()
            );
            Ok(client.stats())
        })
    })?;
    let mut counts = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != FENCED_WRITES {
            continue;
        }
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if let DebugValue::Counter(n) = value {
            counts.push((labels.join(","), n));
        }
    }
    counts.sort();
    assert_eq!(
        counts,
        [
            ("resource=invoices,outcome=accepted".to_string(), 2),
            ("resource=invoices,outcome=rejected_stale".to_string(), 2),
        ]
    );
    let invoices = stats.resource("invoices").expect("table family");
    assert_eq!((invoices.accepted, invoices.rejected_stale), (2, 2));
    Ok(())
}
