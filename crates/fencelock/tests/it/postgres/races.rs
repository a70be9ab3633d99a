//! Read-modify-write on a fenced Postgres row (feature `postgres`) when a
//! stale holder's write lands between the new holder's read and its write
//! (docs/design.md §2.4), over 1,000 orchestrated races per
//! variant:
//!
//! - write-only check (negative control): every race loses the stale
//!   holder's acknowledged increment;
//! - register the fence before reading: nothing is lost (the stale write is
//!   rejected);
//! - one conditional statement (`SET v = v + 1`), the two holders' statements
//!   sent concurrently: nothing is lost.
//!
//! Each holder has its own connection. Fences are minted per race (stale
//! `A` = 2r+1, new `B` = 2r+2); where they come from does not matter to the
//! resource.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::support::postgres::{counter_table, pool, start_server, value};
use fencelock::sqlx::postgres::PgPool;
use fencelock::{Fence, FencedTable, SetClause, WriteOutcome, holder_id};

/// Races per variant.
const RACES: u64 = 1_000;

struct Holders {
    /// The stale holder's connection and the new holder's.
    a: FencedTable,
    b: FencedTable,
    admin: PgPool,
}

async fn setup() -> anyhow::Result<(fencelock_testkit::PgServer, Holders)> {
    let pg = start_server().await;
    let admin = pool(&pg.url(), 1).await?;
    counter_table(&admin, "counter").await?;
    let a = FencedTable::new(pool(&pg.url(), 1).await?, "counter")?;
    let b = FencedTable::new(pool(&pg.url(), 1).await?, "counter")?;
    Ok((pg, Holders { a, b, admin }))
}

async fn read_v(table: &FencedTable) -> anyhow::Result<i64> {
    Ok(
        fencelock::sqlx::query_scalar("SELECT v FROM counter WHERE id = 1")
            .fetch_one(table.pool())
            .await?,
    )
}

fn fences(race: u64) -> (Fence, Fence) {
    (Fence::new(2 * race + 1), Fence::new(2 * race + 2))
}

/// Negative control. A read v0 while it held the lock, then stalled; B
/// (newer fence) reads v0; A's write of v0 + 1 lands (its fence is still the
/// newest the row has seen) and is acknowledged; B writes v0 + 1. One
/// acknowledged increment is lost in every race.
#[tokio::test]
async fn write_only_check_loses_the_stale_increment_every_race() -> anyhow::Result<()> {
    let (_pg, h) = setup().await?;
    let mut acknowledged = 0;
    for race in 0..RACES {
        let (fa, fb) = fences(race);
        let a_read = read_v(&h.a).await?;
        let b_read = read_v(&h.b).await?;
        let a =
            h.a.update(
                h.a.pool(),
                1_i64,
                fa,
                "a",
                &SetClause::new().set("v", a_read + 1),
            )
            .await?;
        let b =
            h.b.update(
                h.b.pool(),
                1_i64,
                fb,
                "b",
                &SetClause::new().set("v", b_read + 1),
            )
            .await?;
        assert!(
            a.is_accepted() && b.is_accepted(),
            "race {race}: {a:?} {b:?}"
        );
        acknowledged += 2;
    }
    let lost = acknowledged - value(&h.admin, "counter", 1).await?;
    eprintln!("write-only check: {RACES} races, {acknowledged} acknowledged, {lost} lost");
    assert_eq!(
        lost as u64, RACES,
        "the negative control must lose one increment per race"
    );
    Ok(())
}

/// B registers its fence before reading: A's stale write is rejected (and
/// not acknowledged), B's write lands; nothing acknowledged is lost.
#[tokio::test]
async fn register_before_read_loses_nothing() -> anyhow::Result<()> {
    let (_pg, h) = setup().await?;
    let mut acknowledged = 0;
    for race in 0..RACES {
        let (fa, fb) = fences(race);
        let a_read = read_v(&h.a).await?;
        assert_eq!(
            h.b.register(h.b.pool(), 1_i64, fb, "b").await?,
            WriteOutcome::Accepted
        );
        let b_read = read_v(&h.b).await?;
        let a =
            h.a.update(
                h.a.pool(),
                1_i64,
                fa,
                "a",
                &SetClause::new().set("v", a_read + 1),
            )
            .await?;
        assert_eq!(
            a,
            WriteOutcome::Rejected {
                current_fence: Some(fb),
                current_holder: Some(holder_id("b"))
            },
            "race {race}"
        );
        let b =
            h.b.update(
                h.b.pool(),
                1_i64,
                fb,
                "b",
                &SetClause::new().set("v", b_read + 1),
            )
            .await?;
        assert!(b.is_accepted(), "race {race}: {b:?}");
        acknowledged += 1;
    }
    let lost = acknowledged - value(&h.admin, "counter", 1).await?;
    eprintln!("register before read: {RACES} races, {acknowledged} acknowledged, {lost} lost");
    assert_eq!(lost, 0);
    Ok(())
}

/// One conditional statement: A's stale increment and B's increment are sent
/// at the same time on their own connections. Whichever lands first, every
/// acknowledged increment is in the row, and B's is always acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_increment_loses_nothing() -> anyhow::Result<()> {
    let (_pg, h) = setup().await?;
    let inc = SetClause::new().set_sql("v = v + 1");
    let (mut acknowledged, mut stale_accepted) = (0_i64, 0);
    for race in 0..RACES {
        let (fa, fb) = fences(race);
        let a_write = h.a.update(h.a.pool(), 1_i64, fa, "a", &inc);
        let b_write = h.b.update(h.b.pool(), 1_i64, fb, "b", &inc);
        // `join!` polls (and so sends) its first future first: alternate.
        let (a, b) = if race % 2 == 0 {
            tokio::join!(a_write, b_write)
        } else {
            let (b, a) = tokio::join!(b_write, a_write);
            (a, b)
        };
        let (a, b) = (a?, b?);
        assert!(b.is_accepted(), "race {race}: {b:?}");
        acknowledged += 1;
        if a.is_accepted() {
            acknowledged += 1;
            stale_accepted += 1;
        }
    }
    let lost = acknowledged - value(&h.admin, "counter", 1).await?;
    eprintln!(
        "one statement: {RACES} races, {acknowledged} acknowledged ({stale_accepted} stale increments landed first), {lost} lost"
    );
    assert_eq!(lost, 0);
    Ok(())
}

/// No lock at all: 8 tasks on 8 connections send one-statement increments
/// with fences from a shared counter, so statements with older fences
/// constantly arrive after newer ones and race on the row lock. Every
/// acknowledged increment is in the row, and every rejection reported a
/// newer fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_one_statement_writers_ack_exactly_what_was_applied() -> anyhow::Result<()> {
    const TASKS: u64 = 8;
    const EACH: u64 = 250;
    let pg = start_server().await;
    let admin = pool(&pg.url(), 1).await?;
    counter_table(&admin, "counter").await?;
    let table = FencedTable::new(pool(&pg.url(), TASKS as u32).await?, "counter")?;
    let next = Arc::new(AtomicU64::new(1));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (table, next) = (table.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let holder = format!("w{t}");
            let inc = SetClause::new().set_sql("v = v + 1");
            let (mut acked, mut rejected) = (0_i64, 0_u64);
            for _ in 0..EACH {
                let fence = Fence::new(next.fetch_add(1, Ordering::SeqCst));
                match table
                    .update(table.pool(), 1_i64, fence, &holder, &inc)
                    .await?
                {
                    WriteOutcome::Accepted => acked += 1,
                    WriteOutcome::Rejected { current_fence, .. } => {
                        assert!(current_fence > Some(fence), "{current_fence:?} vs {fence}");
                        rejected += 1;
                    }
                    other => panic!("unexpected outcome {other:?}"),
                }
            }
            anyhow::Ok((acked, rejected))
        }));
    }
    let (mut acked, mut rejected) = (0, 0);
    for task in tasks {
        let (a, r) = task.await??;
        acked += a;
        rejected += r;
    }
    let applied = value(&admin, "counter", 1).await?;
    eprintln!(
        "concurrent one-statement writers: {} writes, {acked} acknowledged, {rejected} rejected, {applied} applied",
        TASKS * EACH
    );
    assert_eq!(acked + rejected as i64, (TASKS * EACH) as i64);
    assert_eq!(applied, acked);
    Ok(())
}
