//! One rule, four spellings: `fence_accepts` states the resource rule
//! (docs/design.md §2.4) in Rust, and each ready-made resource writes it
//! again in its own language (Lua for the Redis hash, SQL for the Postgres
//! row, an etcd transaction for the etcd key). These tests hold every
//! spelling to `fence_accepts` over the same grid of stored states and
//! writes, on real servers: a resource that accepted an equal fence from
//! another holder (the guide's `>=`), or a lower one, or refused a higher
//! one, fails here with the case named.

use std::future::Future;

use fencelock::{Fence, Fenced, WriteOutcome, fence_accepts, holder_id};

/// Fences around the interesting edges: small, past 2^53 (where a float
/// comparison would merge neighbours) and near the top of Postgres' bigint.
const FENCES: &[u64] = &[
    1,
    2,
    3,
    (1 << 53) + 1,
    (1 << 53) + 2,
    i64::MAX as u64 - 1,
    i64::MAX as u64,
];

/// The holder tokens of the grid.
const HOLDERS: &[&str] = &["token-a", "token-b"];

/// One case: what the resource stores first (nothing, or a write with that
/// fence and holder), then the write under test.
#[derive(Debug, Clone, Copy)]
struct Case {
    stored: Option<(u64, &'static str)>,
    fence: u64,
    holder: &'static str,
}

/// Every case of the grid: each stored state against each write whose
/// fence is the stored one, a neighbour or a far one.
fn grid() -> Vec<Case> {
    let mut cases = Vec::new();
    for &fence in FENCES {
        for &holder in HOLDERS {
            cases.push(Case {
                stored: None,
                fence,
                holder,
            });
        }
    }
    for &stored in FENCES {
        for &stored_holder in HOLDERS {
            for &fence in FENCES {
                for &holder in HOLDERS {
                    cases.push(Case {
                        stored: Some((stored, stored_holder)),
                        fence,
                        holder,
                    });
                }
            }
        }
    }
    cases
}

/// Runs the grid on one kind of resource: `fresh(i)` makes an unwritten
/// resource for case `i`, `value` what each write stores. Every outcome
/// must be what `fence_accepts` says, and a refusal must report what was
/// stored.
async fn holds_to_fence_accepts<R, F, Fut>(
    kind: &str,
    fresh: F,
    value: &R::Write,
) -> anyhow::Result<()>
where
    R: Fenced,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<R>>,
{
    for (i, case) in grid().into_iter().enumerate() {
        let resource = fresh(i).await?;
        if let Some((stored, stored_holder)) = case.stored {
            let seeded = resource
                .fenced_write(Fence::new(stored), stored_holder, value)
                .await?;
            anyhow::ensure!(
                seeded.is_accepted(),
                "{kind}: the first write of case {case:?} was refused: {seeded:?}"
            );
        }
        let outcome = resource
            .fenced_write(Fence::new(case.fence), case.holder, value)
            .await?;
        let stored_holder = case.stored.map(|(_, h)| holder_id(h));
        let expected = fence_accepts(
            case.stored.map(|(f, _)| Fence::new(f)),
            stored_holder.as_deref(),
            Fence::new(case.fence),
            &holder_id(case.holder),
        );
        match (&outcome, expected) {
            (WriteOutcome::Accepted, true) => {}
            (
                WriteOutcome::Rejected {
                    current_fence,
                    current_holder,
                },
                false,
            ) => {
                anyhow::ensure!(
                    *current_fence == case.stored.map(|(f, _)| Fence::new(f))
                        && *current_holder == stored_holder,
                    "{kind}: case {case:?} was refused reporting {current_fence:?} by {current_holder:?}, not what was stored"
                );
            }
            _ => anyhow::bail!(
                "{kind}: case {case:?} gave {outcome:?}, but fence_accepts says {}",
                if expected { "accept" } else { "refuse" }
            ),
        }
    }
    Ok(())
}

/// The Redis hash's script (`fenced_write.lua`) applies `fence_accepts`.
#[tokio::test]
async fn fence_rule_of_the_redis_hash_is_fence_accepts() -> anyhow::Result<()> {
    let redis = crate::support::TestRedis::start().await?;
    let client = &redis.client;
    holds_to_fence_accepts(
        "Redis hash",
        |i| async move { Ok(client.fenced_hash(&format!("grid:{i}"))?) },
        "v",
    )
    .await
}

/// The Postgres row's statement (`rule_sql`) applies `fence_accepts`.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn fence_rule_of_the_postgres_row_is_fence_accepts() -> anyhow::Result<()> {
    use fencelock::SetClause;
    use fencelock::sqlx::{AssertSqlSafe, Executor};

    let pg = crate::support::postgres::start_server().await;
    let pool = crate::support::postgres::pool(&pg.url(), 2).await?;
    let table = crate::support::postgres::counter_table(&pool, "grid").await?;
    let rows = grid().len();
    pool.execute(AssertSqlSafe(format!(
        "INSERT INTO grid (id, v) SELECT g, 0 FROM generate_series(2, {}) AS g",
        rows + 1
    )))
    .await?;
    let table = &table;
    holds_to_fence_accepts(
        "Postgres row",
        |i| async move { Ok(table.row(i64::try_from(i)? + 2)) },
        &SetClause::new().set("status", "v"),
    )
    .await
}

/// The etcd key's transaction (`rule_txn`) applies `fence_accepts`.
#[cfg(feature = "etcd")]
#[tokio::test]
async fn fence_rule_of_the_etcd_key_is_fence_accepts() -> anyhow::Result<()> {
    let etcd = crate::support::etcd::TestEtcd::single().await?;
    let client = &etcd.client;
    holds_to_fence_accepts(
        "etcd key",
        |i| async move { Ok(client.fenced_key(&format!("grid/{i}"))?) },
        "v",
    )
    .await
}
