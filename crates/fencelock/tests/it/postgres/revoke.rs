//! A revoke that seals a Postgres row (`FencedRow` as `Sealable`): the
//! deposed holder's update right after the revoke is refused, the row
//! keeps its values and records the revocation fence with the holder
//! `revoked`; a seal takes an equal fence from its holder (where
//! `register` by another holder is refused), keeps a greater one, and a
//! missing row is named.

use anyhow::{bail, ensure};
use fencelock::{Error, Fence, LockClient, REVOKED_HOLDER, SetClause, WriteOutcome};
use fencelock_testkit::RedisServer;

use crate::support::postgres::{counter_table, pool, row, start_server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_seals_a_postgres_row_against_the_deposed_holder() -> anyhow::Result<()> {
    let redis = RedisServer::start();
    let pg = start_server().await;
    let pool = pool(&pg.url(), 4).await?;
    let table = counter_table(&pool, "revoked_rows").await?;
    let holder = LockClient::connect(&redis.url()).await?;
    let admin = LockClient::connect(&redis.url()).await?;

    let lease = holder.acquire("invoice:7", &holder.options()).await?;
    let set = |s: &'static str| SetClause::new().set("status", s);
    ensure!(
        table
            .update(&pool, 1_i64, lease.fence(), lease.token(), &set("open"))
            .await?
            .is_accepted()
    );
    let revoked = admin
        .revoke("invoice:7", &admin.options(), &[&table.row(1_i64)])
        .await?;
    ensure!(revoked.deposed.is_some(), "{revoked:?}");
    ensure!(revoked.sealed[0].outcome == WriteOutcome::Accepted);
    ensure!(revoked.sealed[0].resource.contains("revoked_rows"));
    let late = table
        .update(&pool, 1_i64, lease.fence(), lease.token(), &set("late"))
        .await?;
    ensure!(!late.is_accepted(), "{late:?}");
    let (_, status, fence, who) = row(&pool, "revoked_rows", 1).await?;
    ensure!(status.as_deref() == Some("open"));
    ensure!(fence == Some(i64::try_from(revoked.fence.get())?));
    ensure!(who.as_deref() == Some(REVOKED_HOLDER));
    drop(lease);

    // The seal's rule: an equal fence from any holder, never a lower one.
    let f = Fence::new(revoked.fence.get() + 10);
    ensure!(
        table
            .update(&pool, 1_i64, f, "a", &set("a"))
            .await?
            .is_accepted()
    );
    ensure!(!table.register(&pool, 1_i64, f, "b").await?.is_accepted());
    ensure!(table.seal(&pool, 1_i64, f).await?.is_accepted());
    ensure!(
        !table
            .update(&pool, 1_i64, f, "a", &set("a2"))
            .await?
            .is_accepted()
    );
    ensure!(
        !table
            .seal(&pool, 1_i64, Fence::new(f.get() - 1))
            .await?
            .is_accepted()
    );

    // A missing row cannot be sealed: named, and the revoke says it was done.
    match admin
        .revoke("invoice:8", &admin.options(), &[&table.row(99_i64)])
        .await
    {
        Err(e @ Error::RevokeIncomplete { .. }) => {
            let text = e.to_string();
            ensure!(
                text.contains("99") && text.contains("revoked_rows"),
                "{text}"
            );
        }
        other => bail!("expected RevokeIncomplete for a missing row, got {other:?}"),
    }
    let _ = pool.close().await;
    Ok(())
}
