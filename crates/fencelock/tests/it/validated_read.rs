//! Validated reads, a fenced read-write lock's readers' check: a reader's
//! lease carries the write epoch it saw (the last fence issued for the name
//! when it was granted), every later writer has a greater fence, so a read
//! is clean iff the resource's stored fence is absent or at most the epoch
//! (`read_is_clean`). On a Redis hash (and its slot views), an etcd key and
//! Postgres rows: a clean read (nothing stored, an equal fence, a lower
//! one), a torn read (a writer with a greater fence wrote after the
//! reader's epoch: `Torn` with that fence), and the negative control: the
//! plain read returns the very same torn value without a word, so the check
//! is what catches it.

use fencelock::{Fence, ValidatedRead};

/// The reader's epoch and the fences of the writers around it.
const EPOCH: u64 = 40;
const BEFORE: u64 = 39;
const LATER: u64 = 41;

/// The fence of a torn read (panics with the value on a clean one).
fn torn_fence<T: std::fmt::Debug>(read: &ValidatedRead<T>) -> Fence {
    match read {
        ValidatedRead::Torn { fence, .. } => *fence,
        other => panic!("expected a torn read, got {other:?}"),
    }
}

mod redis_hash {
    use fencelock::{Fence, HashState, ValidatedRead, holder_id};

    use super::{BEFORE, EPOCH, LATER, torn_fence};
    use crate::support::TestRedis;

    /// Absent, lower and equal stored fences are clean and carry what was
    /// read; a writer with a greater fence makes the same epoch's read torn,
    /// reporting that fence and the writer's value — which the plain
    /// `read()` returns as is, with nothing to tell it apart.
    #[tokio::test]
    async fn validated_read_hash_clean_torn_and_plain_read_control() -> anyhow::Result<()> {
        let TestRedis {
            server: _server,
            client,
        } = TestRedis::start().await?;
        let hash = client.fenced_hash("doc:1")?;
        let epoch = Fence::new(EPOCH);

        // Nothing stored: clean.
        let read = hash.read_validated(epoch).await?;
        assert_eq!(read, ValidatedRead::Clean(HashState::default()));

        // A writer before the epoch, then the epoch's own writer: clean.
        let before = hash.write(Fence::new(BEFORE), "w0", "old").await?;
        assert!(before.is_accepted());
        let read = hash.read_validated(epoch).await?;
        assert!(read.is_clean());
        assert_eq!(read.value().fence, Some(Fence::new(BEFORE)));
        assert!(hash.write(epoch, "w1", "v1").await?.is_accepted());
        let clean = hash
            .read_validated(epoch)
            .await?
            .clean()
            .expect("an equal fence is clean");
        assert_eq!(
            (clean.value.as_deref(), clean.fence, clean.holder),
            (Some("v1"), Some(epoch), Some(holder_id("w1")))
        );

        // A writer granted after the reader writes: torn, with its fence.
        assert!(
            hash.write(Fence::new(LATER), "w2", "v2")
                .await?
                .is_accepted()
        );
        let read = hash.read_validated(epoch).await?;
        assert!(!read.is_clean());
        assert_eq!(torn_fence(&read), Fence::new(LATER));
        assert_eq!(read.value().value.as_deref(), Some("v2"));
        // A reader of the later epoch reads it clean.
        assert!(hash.read_validated(Fence::new(LATER)).await?.is_clean());

        // Negative control: the plain read gives the same torn state, with
        // no verdict; only the comparison with the epoch exposes it.
        let plain: HashState = hash.read().await?;
        assert_eq!(plain, read.clone().into_value());
        assert_eq!(plain.value.as_deref(), Some("v2"));
        assert_eq!(read.clean(), None);
        Ok(())
    }

    /// With real grants: the reader's epoch is the fence of the last grant
    /// before it; a writer granted afterwards gets a greater fence, and
    /// its write makes the reader's read torn with exactly that fence.
    #[tokio::test]
    async fn validated_read_hash_with_real_grants_sees_the_next_writer() -> anyhow::Result<()> {
        let TestRedis {
            server: _server,
            client,
        } = TestRedis::start().await?;
        let hash = client.fenced_hash("report:data")?;
        let opts = client.options();

        let first = client.acquire("report", &opts).await?;
        assert!(
            hash.write(first.fence(), first.token(), "draft")
                .await?
                .is_accepted()
        );
        let epoch = first.fence();
        first.release().await?;
        let clean = hash.read_validated(epoch).await?;
        assert_eq!(clean.value().value.as_deref(), Some("draft"));
        assert!(clean.is_clean());

        let writer = client.acquire("report", &opts).await?;
        assert!(writer.fence() > epoch);
        assert!(
            hash.write(writer.fence(), writer.token(), "final")
                .await?
                .is_accepted()
        );
        let torn = hash.read_validated(epoch).await?;
        assert_eq!(torn_fence(&torn), writer.fence());
        assert_eq!(torn.value().holder, Some(holder_id(writer.token())));
        assert_eq!(
            hash.read().await?,
            torn.into_value(),
            "plain read: no verdict"
        );
        writer.release().await?;
        Ok(())
    }

    /// A slot view checks its own slot's fence: a later writer of slot 2
    /// tears slot 2's read only; slot 1 and the hash's own fields stay
    /// clean.
    #[tokio::test]
    async fn validated_read_hash_slot_views_check_their_own_slot() -> anyhow::Result<()> {
        let TestRedis {
            server: _server,
            client,
        } = TestRedis::start().await?;
        let hash = client.fenced_hash("parts")?;
        let epoch = Fence::new(EPOCH);
        assert!(
            hash.slot(1)
                .write(Fence::new(BEFORE), "p1", "one")
                .await?
                .is_accepted()
        );
        assert!(
            hash.slot(2)
                .write(Fence::new(LATER), "p2", "two")
                .await?
                .is_accepted()
        );

        let two = hash.slot(2).read_validated(epoch).await?;
        assert_eq!(torn_fence(&two), Fence::new(LATER));
        assert_eq!(two.value().value.as_deref(), Some("two"));
        assert_eq!(hash.slot(2).read().await?, two.into_value());

        let one = hash.slot(1).read_validated(epoch).await?;
        assert_eq!(one.clean().and_then(|s| s.value).as_deref(), Some("one"));
        assert_eq!(
            hash.read_validated(epoch).await?,
            ValidatedRead::Clean(HashState::default())
        );
        Ok(())
    }
}

#[cfg(feature = "etcd")]
mod etcd_key {
    use fencelock::{Fence, KeyState, ValidatedRead, holder_id};

    use super::{BEFORE, EPOCH, LATER, torn_fence};
    use crate::support::etcd::TestEtcd;

    /// The same on etcd: absent, lower and equal fences clean; a later
    /// writer's fence tears the read; the plain `read()` returns the torn
    /// state as is. Slot views check their own key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_validated_read_key_clean_torn_and_plain_read_control() -> anyhow::Result<()> {
        let t = TestEtcd::single().await?;
        let key = t.client.fenced_key("docs/1")?;
        let epoch = Fence::new(EPOCH);

        let absent = key.read_validated(epoch).await?;
        assert_eq!(absent, ValidatedRead::Clean(KeyState::default()));

        assert!(
            key.write(Fence::new(BEFORE), "w0", "old")
                .await?
                .is_accepted()
        );
        assert!(key.read_validated(epoch).await?.is_clean());
        assert!(key.write(epoch, "w1", "v1").await?.is_accepted());
        let clean = key
            .read_validated(epoch)
            .await?
            .clean()
            .expect("an equal fence is clean");
        assert_eq!(
            (clean.value.as_deref(), clean.fence, clean.holder),
            (Some("v1"), Some(epoch), Some(holder_id("w1")))
        );

        assert!(
            key.write(Fence::new(LATER), "w2", "v2")
                .await?
                .is_accepted()
        );
        let torn = key.read_validated(epoch).await?;
        assert_eq!(torn_fence(&torn), Fence::new(LATER));
        assert_eq!(torn.value().value.as_deref(), Some("v2"));
        assert!(key.read_validated(Fence::new(LATER)).await?.is_clean());
        // Negative control: the plain read, same state, no verdict.
        let plain = key.read().await?;
        assert_eq!(plain, torn.clone().into_value());
        assert_eq!(torn.clean(), None);

        // Slot views: slot 3's later writer tears slot 3 only.
        assert!(
            key.slot(3)
                .write(Fence::new(LATER), "p3", "three")
                .await?
                .is_accepted()
        );
        assert_eq!(
            torn_fence(&key.slot(3).read_validated(epoch).await?),
            Fence::new(LATER)
        );
        assert!(key.slot(4).read_validated(epoch).await?.is_clean());
        Ok(())
    }

    /// With real etcd grants (fences are create revisions): the next
    /// writer's fence is greater than the reader's epoch, and its held
    /// write tears the reader's read with exactly that fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_validated_read_key_with_real_grants_sees_the_next_writer() -> anyhow::Result<()> {
        let t = TestEtcd::single().await?;
        let key = t.client.fenced_key("reports/1")?;
        let opts = t.client.options();

        let first = t.client.acquire("report", &opts).await?;
        assert!(key.write_held(&first, "draft").await?.is_accepted());
        let epoch = first.fence();
        first.release().await?;
        assert!(key.read_validated(epoch).await?.is_clean());

        let writer = t.client.acquire("report", &opts).await?;
        assert!(writer.fence() > epoch);
        assert!(key.write_held(&writer, "final").await?.is_accepted());
        let torn = key.read_validated(epoch).await?;
        assert_eq!(torn_fence(&torn), writer.fence());
        assert_eq!(torn.value().value.as_deref(), Some("final"));
        assert_eq!(
            key.read().await?,
            torn.into_value(),
            "plain read: no verdict"
        );
        writer.release().await?;
        Ok(())
    }
}

#[cfg(feature = "postgres")]
mod postgres_rows {
    use fencelock::sqlx::{self, Executor};
    use fencelock::{Error, Fence, FencedTable, RowFence, SetClause, ValidatedRead, holder_id};

    use super::{BEFORE, EPOCH, LATER, torn_fence};
    use crate::support::postgres::{counter_table, pool, start_server, value};

    /// The reader's own SQL.
    const READ_V: &str = "SELECT v FROM counters WHERE id = 1";
    const REPEATABLE_READ: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ";

    fn set_v(v: i64) -> SetClause {
        SetClause::new().set("v", v)
    }

    fn row_fence(fence: u64, holder: &str) -> RowFence {
        let mut expected = RowFence::default();
        expected.fence = Some(Fence::new(fence));
        expected.holder = Some(holder_id(holder));
        expected
    }

    /// The seqlock pattern on a row: read `v` with your own SQL, then
    /// validate. A row never written under a lock, a lower and an equal
    /// fence are clean; a later writer's update tears it (`Torn` with its
    /// fence). Negative control: the plain `SELECT` returned the later
    /// writer's value and `read_fence` its fence, neither with a verdict.
    /// `FencedRow` gives the same answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_validated_read_row_clean_torn_and_plain_read_control() -> anyhow::Result<()> {
        let pg = start_server().await;
        let pool = pool(&pg.url(), 2).await?;
        let table = counter_table(&pool, "counters").await?;
        let epoch = Fence::new(EPOCH);

        // Never written under a lock: clean, fence absent.
        assert_eq!(value(&pool, "counters", 1).await?, 0);
        assert_eq!(
            table.read_validated(&pool, 1_i64, epoch).await?,
            ValidatedRead::Clean(Some(RowFence::default()))
        );

        // A writer before the epoch, then the epoch's own: clean.
        let before = table
            .update(&pool, 1_i64, Fence::new(BEFORE), "w0", &set_v(1))
            .await?;
        assert!(before.is_accepted());
        assert!(table.read_validated(&pool, 1_i64, epoch).await?.is_clean());
        assert!(
            table
                .update(&pool, 1_i64, epoch, "w1", &set_v(2))
                .await?
                .is_accepted()
        );
        assert_eq!(value(&pool, "counters", 1).await?, 2);
        assert_eq!(
            table.read_validated(&pool, 1_i64, epoch).await?,
            ValidatedRead::Clean(Some(row_fence(EPOCH, "w1")))
        );

        // A writer granted after the reader updates the row.
        assert!(
            table
                .update(&pool, 1_i64, Fence::new(LATER), "w2", &set_v(3))
                .await?
                .is_accepted()
        );
        // The reader reads (the later writer's value), then validates.
        let read_v = value(&pool, "counters", 1).await?;
        let check = table.read_validated(&pool, 1_i64, epoch).await?;
        assert_eq!(
            check,
            ValidatedRead::Torn {
                value: Some(row_fence(LATER, "w2")),
                fence: Fence::new(LATER),
            }
        );
        // Negative control: the plain read is the torn value, no warning;
        // the row's fence alone is not a verdict either.
        assert_eq!(read_v, 3);
        assert_eq!(
            table.read_fence(&pool, 1_i64).await?,
            row_fence(LATER, "w2")
        );
        assert!(
            table
                .read_validated(&pool, 1_i64, Fence::new(LATER))
                .await?
                .is_clean()
        );

        // The same through a row handle.
        let row = table.row(1_i64);
        assert_eq!(row.read_validated(&pool, epoch).await?, check);
        assert!(
            row.read_validated(table.pool(), Fence::new(LATER))
                .await?
                .is_clean()
        );
        Ok(())
    }

    /// A missing row is clean (`None`): nothing stored. A later writer that
    /// creates it (`upsert`) tears the read that found no row; a table
    /// without the fence columns is an error, not a clean read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_validated_read_missing_row_then_created_by_a_later_writer()
    -> anyhow::Result<()> {
        let pg = start_server().await;
        let pool = pool(&pg.url(), 2).await?;
        let table = counter_table(&pool, "counters").await?;
        let epoch = Fence::new(EPOCH);

        let found: Option<i64> = sqlx::query_scalar("SELECT v FROM counters WHERE id = 7")
            .fetch_optional(&pool)
            .await?;
        assert_eq!(found, None);
        assert_eq!(
            table.read_validated(&pool, 7_i64, epoch).await?,
            ValidatedRead::Clean(None)
        );

        assert!(
            table
                .upsert(&pool, 7_i64, Fence::new(LATER), "w2", &set_v(70))
                .await?
                .is_accepted()
        );
        let torn = table.read_validated(&pool, 7_i64, epoch).await?;
        assert_eq!(torn_fence(&torn), Fence::new(LATER));
        assert_eq!(torn.into_value(), Some(row_fence(LATER, "w2")));

        pool.execute("CREATE TABLE plain (id bigint PRIMARY KEY)")
            .await?;
        pool.execute("INSERT INTO plain VALUES (1)").await?;
        let plain = FencedTable::new(pool.clone(), "plain")?;
        assert!(matches!(
            plain.read_validated(&pool, 1_i64, epoch).await,
            Err(Error::MissingFenceColumns { .. })
        ));
        Ok(())
    }

    /// Where the validation runs. In a `REPEATABLE READ` transaction it
    /// sees the read's own snapshot: a later writer that commits between
    /// the read and the validation wrote nothing the reader saw, and the
    /// read is clean (the exact answer). In `READ COMMITTED` (Postgres's
    /// default) the validation sees that commit and calls the read torn
    /// (conservative). Either way, a writer that committed *before* the
    /// read is always caught.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_validated_read_in_a_transaction_checks_the_reads_snapshot()
    -> anyhow::Result<()> {
        let pg = start_server().await;
        let pool = pool(&pg.url(), 4).await?;
        let table = counter_table(&pool, "counters").await?;
        let epoch = Fence::new(EPOCH);
        assert!(
            table
                .update(&pool, 1_i64, epoch, "w1", &set_v(10))
                .await?
                .is_accepted()
        );

        // REPEATABLE READ: the read and the validation share a snapshot.
        let mut tx = pool.begin().await?;
        sqlx::query(REPEATABLE_READ).execute(&mut *tx).await?;
        let v: i64 = sqlx::query_scalar(READ_V).fetch_one(&mut *tx).await?;
        assert!(
            table
                .update(&pool, 1_i64, Fence::new(LATER), "w2", &set_v(20))
                .await?
                .is_accepted(),
            "a later writer commits after the read"
        );
        let check = table.read_validated(&mut *tx, 1_i64, epoch).await?;
        tx.commit().await?;
        assert_eq!(v, 10, "the read saw the epoch's writer");
        assert_eq!(
            check,
            ValidatedRead::Clean(Some(row_fence(EPOCH, "w1"))),
            "same snapshot: what was read is clean"
        );

        // READ COMMITTED: the validation sees the commit made after the read.
        let mut tx = pool.begin().await?;
        let v: i64 = sqlx::query_scalar(READ_V).fetch_one(&mut *tx).await?;
        assert!(
            table
                .update(&pool, 1_i64, Fence::new(LATER + 1), "w3", &set_v(30))
                .await?
                .is_accepted()
        );
        let row = table.row(1_i64);
        let check = row.read_validated(&mut *tx, Fence::new(LATER)).await?;
        tx.commit().await?;
        assert_eq!(v, 20);
        assert_eq!(torn_fence(&check), Fence::new(LATER + 1));

        // A writer before the read, validated in a REPEATABLE READ
        // transaction: torn, whatever the isolation.
        let mut tx = pool.begin().await?;
        sqlx::query(REPEATABLE_READ).execute(&mut *tx).await?;
        let v: i64 = sqlx::query_scalar(READ_V).fetch_one(&mut *tx).await?;
        let check = table.read_validated(&mut *tx, 1_i64, epoch).await?;
        tx.commit().await?;
        assert_eq!(v, 30);
        assert_eq!(torn_fence(&check), Fence::new(LATER + 1));
        Ok(())
    }
}
