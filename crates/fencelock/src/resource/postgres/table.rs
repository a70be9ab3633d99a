//! [`FencedTable`] (with the user-facing documentation of the Postgres
//! resource), its operations, and [`RowFence`].

use sqlx::postgres::{PgArguments, PgExecutor, PgPool};
use sqlx::{AssertSqlSafe, Executor, Row};

use super::ident::{quote_ident, quote_table};
use super::sql::{COUNT_FENCE_COLUMNS, Rule, TableSql, bind_row_params, fence_param, stored_fence};
use super::{FENCE_COLUMN, HOLDER_COLUMN, RowKey, SetClause};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::metrics::StatsHandle;
use crate::resource::{ValidatedRead, WriteOutcome, check_holder};

/// SQLSTATE `undefined_column`.
const UNDEFINED_COLUMN: &str = "42703";

/// A Postgres table whose rows are written only through the fence check
/// (feature `postgres`). Cheap to clone (the pool is shared).
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient, pool: sqlx::PgPool) -> Result<(), fencelock::Error> {
/// use fencelock::{FencedTable, SetClause};
///
/// let invoices = FencedTable::new(pool.clone(), "invoices")?;
/// invoices.add_fence_columns().await?; // once, or in your migrations
///
/// let lease = client.acquire("invoice:42", &client.options()).await?;
/// let close = SetClause::new().set("status", "closed");
/// let outcome = invoices
///     .update(&pool, 42_i64, lease.fence(), lease.token(), &close)
///     .await?;
/// if !outcome.is_accepted() {
///     // a newer holder exists: stop, do not retry the write
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
///
/// # Schema
///
/// A fenced table has a unique key column (default `id`) and two columns
/// that record the last accepted write: [`FENCE_COLUMN`] (`lock_fence
/// bigint`) and [`HOLDER_COLUMN`] (`lock_holder text`). Add them to an
/// existing table with [`FencedTable::add_fence_columns`], or with this SQL in
/// your own migrations (a metadata-only change: no table rewrite, existing
/// rows get NULL):
///
/// ```sql
/// ALTER TABLE invoices
///     ADD COLUMN IF NOT EXISTS lock_fence bigint,
///     ADD COLUMN IF NOT EXISTS lock_holder text;
/// ```
///
/// **Why `bigint`:** fences are `u64`, `bigint` is `i64`. `numeric(20,0)`
/// would hold every `u64`, but is slower to compare, needs a decimal type in
/// every client, and buys nothing in practice: clock fences are Redis server
/// time in µs (≈ 1.8 × 10¹⁵ in 2026; `i64::MAX` is reached in the year
/// 294 000) and counter fences count grants. A fence above `i64::MAX` is
/// refused with [`Error::InvalidOption`] before anything is sent, never
/// wrapped.
///
/// # The rule, in SQL
///
/// A write carrying fence `$f` from the holder whose public id is `$h`
/// ([`holder_id`](crate::holder_id) of the token the write presents) is
/// accepted iff
///
/// ```sql
/// lock_fence IS NULL OR lock_fence < $f OR (lock_fence = $f AND lock_holder = $h)
/// ```
///
/// (docs/design.md §2.4, [`fence_accepts`](crate::fence_accepts)). A row never
/// written under a lock (`lock_fence IS NULL`) accepts any fence; an equal
/// fence with an unknown (NULL) holder is refused. An accepted write sets
/// `lock_fence = $f, lock_holder = $h` in the same statement.
///
/// # Operations, and which to use
///
/// - [`FencedTable::update`]: one conditional `UPDATE` of an existing row.
///   The caller's [`SetClause`] may compute new values from old ones
///   (`SET v = v + 1`), so a read-modify-write that fits in SQL is one atomic
///   statement and cannot lose an update. **Prefer this.**
/// - [`FencedTable::register`] then read then [`FencedTable::update`]: for a
///   read-modify-write whose new value is computed in your code. Registering
///   records your fence on the row before you read; a stale holder's write
///   can then no longer land between your read and your write (without it,
///   that write is accepted — its fence is still the newest the row has seen
///   — and then overwritten by a value computed from a stale read: a lost
///   update). If the register is rejected, a newer holder exists: stop.
/// - [`FencedTable::upsert`]: insert the row, or update it under the rule if
///   it exists (`INSERT … ON CONFLICT (key) DO UPDATE … WHERE <rule>`), for
///   rows that may not exist yet.
/// - [`FencedTable::read_fence`]: the fence and holder a row records.
/// - [`FencedTable::read_validated`]: for a reader of a fenced read-write
///   lock, after reading the row with your own SQL: was what you read
///   written by a writer granted after your read lease? See "Validated
///   reads" below.
///
/// # Pool, connection or transaction
///
/// Like sqlx's own `query(…).execute(…)`, every operation takes the
/// executor to run on as its first argument: the pool (`&pool`, or
/// [`table.pool()`](FencedTable::pool)), a connection (`&mut conn` for a
/// [`PgConnection`](sqlx::PgConnection), `&mut *conn` for a pooled one) or
/// an open transaction (`&mut *tx`). The executor must reach the database
/// of the table's pool, which fencelock itself uses only for
/// [`FencedTable::add_fence_columns`], the [`Fenced`](crate::Fenced) trait
/// ([`FencedRow`](crate::FencedRow)), telling a missing fence column apart from your own typo
/// (the statement's connection may be in an aborted transaction), and
/// reading the current fence after a rejected [`FencedTable::upsert`].
///
/// ```no_run
/// # async fn demo(invoices: fencelock::FencedTable, pool: sqlx::PgPool, lease: fencelock::Lease)
/// # -> Result<(), fencelock::Error> {
/// use fencelock::{Error, SetClause};
///
/// // Read-modify-write computed in Rust, in one transaction.
/// let mut tx = pool.begin().await.map_err(Error::from)?;
/// if !invoices.register(&mut *tx, 42_i64, lease.fence(), lease.token()).await?.is_accepted() {
///     return Ok(()); // a newer holder exists: stop (dropping `tx` rolls back)
/// }
/// let total: i64 = sqlx::query_scalar("SELECT total FROM invoices WHERE id = 42")
///     .fetch_one(&mut *tx)
///     .await
///     .map_err(Error::from)?;
/// let outcome = invoices
///     .update(&mut *tx, 42_i64, lease.fence(), lease.token(), &SetClause::new().set("total", total * 2))
///     .await?;
/// if outcome.is_accepted() {
///     tx.commit().await.map_err(Error::from)?;
/// }
/// # Ok(()) }
/// ```
///
/// # Faults
///
/// Every operation is **one statement** (in autocommit on the pool or a
/// connection, or inside your transaction): it is applied entirely or not at
/// all, never in part. If the connection fails, the call returns
/// [`Error::Postgres`] with [`Error::is_connection`] true — never a silent
/// "accepted". When the backend died mid-statement (or mid-transaction), the
/// server rolled the work back. When only the reply was lost, the statement
/// may have committed: as with any database call, the error does not say
/// which. Retrying with the same fence and holder is allowed by the rule
/// (the same holder may write again), which makes plain values idempotent;
/// a computed update such as `v = v + 1` may then apply twice, so check the
/// row first or make the change idempotent. The same holds when a call's
/// future is dropped (a timeout) after the statement was sent. fencelock
/// sets no statement timeout of its own: use Postgres's `statement_timeout`
/// or `tokio::time::timeout`.
///
/// Between `register` and the final `update` your own code runs. Use a
/// transaction (pass `&mut *tx`, as above) if the read must see a
/// consistent snapshot; otherwise the registration is harmless to leave
/// behind when you stop half-way — it only blocks older fences.
///
/// # Validated reads (a read-write lock's readers)
///
/// A reader does not write, so nothing refuses it; instead it validates,
/// seqlock style, what it read. Its lease's fence is its *write epoch*
/// (the last fence issued for the name when the read lease was granted),
/// and every writer granted after it has a greater fence. Read your
/// columns with your own SQL first, then call
/// [`FencedTable::read_validated`] with the epoch: it reads the row's
/// `lock_fence` and `lock_holder` and applies
/// [`read_is_clean`](crate::read_is_clean). Fences on a row only grow, so
/// if the fence read *after* your read is absent or at most your epoch, no
/// later writer had written the row before your read either: the read is
/// [`ValidatedRead::Clean`]. A greater fence is [`ValidatedRead::Torn`]:
/// discard what you read (read again under a new read lease).
///
/// - **Order:** validate after the read, never before (a check made before
///   proves nothing about a write that lands in between).
/// - **Same transaction or not:** in a `REPEATABLE READ` or `SERIALIZABLE`
///   transaction (`&mut *tx` for both), the validation sees the read's own
///   snapshot and checks exactly what was read. In `READ COMMITTED`
///   (Postgres's default) or on the pool, it sees a later snapshot: a
///   writer that committed after your read makes it torn too (conservative,
///   never wrong the other way).
/// - **What it covers:** the row whose fence it reads. Data read from other
///   rows is covered only if every writer records its fence on this row in
///   the same transaction as its writes ([`FencedTable::register`] or
///   [`FencedTable::update`] inside that transaction). Writes that bypass
///   the fence columns are not seen.
///
/// ```no_run
/// # async fn demo(invoices: fencelock::FencedTable, pool: sqlx::PgPool, reader: fencelock::Lease)
/// # -> Result<(), fencelock::Error> {
/// use fencelock::{Error, ValidatedRead};
///
/// let mut tx = pool.begin().await.map_err(Error::from)?;
/// sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
///     .execute(&mut *tx)
///     .await
///     .map_err(Error::from)?;
/// // 1. Read your data.
/// let total: i64 = sqlx::query_scalar("SELECT total FROM invoices WHERE id = 42")
///     .fetch_one(&mut *tx)
///     .await
///     .map_err(Error::from)?;
/// // 2. Then validate it against the read lease's epoch.
/// match invoices.read_validated(&mut *tx, 42_i64, reader.fence()).await? {
///     ValidatedRead::Clean(_) => { /* use `total` */ }
///     _ => { /* torn: a later writer wrote the row; discard `total` */ }
/// }
/// tx.commit().await.map_err(Error::from)?;
/// # let _ = total;
/// # Ok(()) }
/// ```
///
/// # Missing row vs stale fence
///
/// `update` and `register` lock the row (`SELECT … FOR UPDATE` in a CTE) and
/// update it in the same statement, and report what they found, so "no such
/// row" ([`Error::RowNotFound`]) and "stale" ([`WriteOutcome::Rejected`] with
/// the row's current fence and holder) are told apart atomically, without a
/// second query that could race. A table without the fence columns gives
/// [`Error::MissingFenceColumns`] naming the table.
///
/// # Per-slot fencing (a semaphore's permits)
///
/// A semaphore's permits each hold a slot `0..N` and a fence of their own,
/// and live permits' fences interleave, so they cannot share one row's
/// fence. Keep **one row per slot**, each with its own `lock_fence` and
/// `lock_holder`: the key column identifies the slot's row, and nothing
/// else is needed. Either the slot *is* the key (a table of partitions
/// keyed by slot), or a unique text key names the resource and the slot
/// together, the slot last (`orders/3`: a slot has no `/`, so
/// `"{resource}/{slot}"` never names two rows for one slot, nor one row for
/// two, and slot 1 and slot 11 stay apart). Write a slot's row only with
/// the fence of a permit granted for that slot: a stale permit of the same
/// slot is then refused, while permits of other slots, writing other rows,
/// are not affected. It does not serialize two live permits writing the
/// same row (see "Per-slot fencing" on [`FencedHash`](crate::FencedHash)).
///
/// Use `bigint` for a slot column (a slot is a `u32`, which Postgres's
/// `integer` cannot hold whole) and bind `i64::from(slot)`. A key of two
/// columns (`PRIMARY KEY (partition, slot)`) is not supported: a fenced
/// table finds its rows by one key column.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, slot: u32, fence: fencelock::Fence, token: &str)
/// # -> Result<(), fencelock::Error> {
/// use fencelock::{FencedTable, SetClause};
///
/// // CREATE TABLE partitions (slot bigint PRIMARY KEY, cursor bigint, ...)
/// let partitions = FencedTable::new(pool.clone(), "partitions")?.with_key_column("slot")?;
/// partitions.add_fence_columns().await?;
///
/// // `slot`, `fence` and `token` come from this worker's permit.
/// let advance = SetClause::new().set_sql("cursor = cursor + 1");
/// let outcome = partitions
///     .update(&pool, i64::from(slot), fence, token, &advance)
///     .await?;
/// if !outcome.is_accepted() {
///     // a newer permit of this slot wrote: this one is stale, stop
/// }
///
/// // Many resources in one table: a text key with the slot last.
/// let orders = FencedTable::new(pool.clone(), "slot_state")?;
/// let key = format!("orders/{slot}");
/// orders
///     .upsert(&pool, key.as_str(), fence, token, &SetClause::new().set("state", "open"))
///     .await?;
/// # Ok(()) }
/// ```
///
/// # SQL injection
///
/// Table and column names are checked and always sent quoted (`"invoices"`),
/// so they are taken exactly as given: a table created without quotes has a
/// lowercase name. Values are always bound parameters ([`SetClause::set`],
/// [`SetClause::bind`]), keys too ([`RowKey`]). The one exception is
/// [`SetClause::set_sql`]: its text is SQL and is sent as is, so it must
/// come from your code, never from user input. It takes sqlx's
/// [`SqlSafeStr`](sqlx::SqlSafeStr) — a `&'static str` literal, or
/// [`AssertSqlSafe`] where you have audited a built string — and refers to
/// values by `$1`, `$2`, … bound with [`SetClause::bind`].
#[derive(Debug, Clone)]
pub struct FencedTable {
    pool: PgPool,
    /// The name as given (for messages).
    name: String,
    /// The key column as given (for messages).
    key_name: String,
    /// The quoted names and the statements built from them.
    sql: TableSql,
    /// Stats counting this table's writes (see [`FencedTable::with_stats`]).
    stats: Option<StatsHandle>,
}

/// The fence and holder a row records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RowFence {
    /// The fence of the last accepted write; `None` if the row was never
    /// written under a lock.
    pub fence: Option<Fence>,
    /// The public holder id ([`holder_id`](crate::holder_id)) of the last
    /// accepted write, if recorded.
    pub holder: Option<String>,
}

impl FencedTable {
    /// A fenced view of `table` (`name` or `schema.name`, taken exactly as
    /// given and quoted) with key column `id`. Nothing is sent.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty or over-long part, a double quote
    /// or a control character.
    pub fn new(pool: PgPool, table: &str) -> Result<Self> {
        Ok(FencedTable {
            pool,
            name: table.to_owned(),
            key_name: "id".to_owned(),
            sql: TableSql {
                table: quote_table(table)?,
                key: "\"id\"".to_owned(),
            },
            stats: None,
        })
    }

    /// Uses `column` (a unique column, e.g. the primary key) to find rows
    /// instead of `id`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] as for [`FencedTable::new`].
    pub fn with_key_column(mut self, column: &str) -> Result<Self> {
        self.sql.key = quote_ident(column)?;
        self.key_name = column.to_owned();
        Ok(self)
    }

    /// Counts this table's fenced writes in `stats` (e.g.
    /// [`LockClient::stats_handle`](crate::LockClient::stats_handle)) as well
    /// as through the `metrics` facade. The `resource` label is the table
    /// name as given.
    pub fn with_stats(mut self, stats: StatsHandle) -> Self {
        self.stats = Some(stats);
        self
    }

    /// The table name as given.
    pub fn table(&self) -> &str {
        &self.name
    }

    /// The key column as given.
    pub fn key_column(&self) -> &str {
        &self.key_name
    }

    /// The pool this table was created with (see "Pool, connection or
    /// transaction" above for what fencelock uses it for).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The migration that adds the fence columns to this table:
    /// `ALTER TABLE "t" ADD COLUMN IF NOT EXISTS lock_fence bigint, ADD COLUMN
    /// IF NOT EXISTS lock_holder text`. Idempotent; a metadata-only change
    /// (it takes a brief `ACCESS EXCLUSIVE` lock but rewrites nothing).
    pub fn migration_sql(&self) -> String {
        self.sql.migration()
    }

    /// Runs [`FencedTable::migration_sql`] on the table's pool.
    ///
    /// # Errors
    /// [`Error::Postgres`] (for example, the table does not exist).
    pub async fn add_fence_columns(&self) -> Result<()> {
        self.pool
            .execute(AssertSqlSafe(self.migration_sql()))
            .await
            .map_err(Error::from)?;
        tracing::info!(table = %self.name, "fence columns present");
        Ok(())
    }

    /// One conditional `UPDATE`, on `executor` (`&pool`, `&mut *conn` or
    /// `&mut *tx`), of the row whose key is `key`: applies `set` and
    /// records `fence` and `holder`, iff the fence rule accepts them.
    ///
    /// `set` may compute from the row's current values
    /// (`SetClause::new().set_sql("v = v + 1")`): such a read-modify-write is
    /// one atomic statement and loses no update to a stale holder.
    ///
    /// # Errors
    /// [`Error::RowNotFound`] if there is no such row;
    /// [`Error::MissingFenceColumns`] if the table lacks the fence columns;
    /// [`Error::InvalidOption`] for an empty holder, an empty or malformed
    /// `set`, or a fence above `i64::MAX`; [`Error::Postgres`] for anything
    /// the database or the connection reports (nothing was written in part;
    /// see "Faults" on [`FencedTable`] for lost connections). A stale fence
    /// is [`WriteOutcome::Rejected`], not an error.
    pub async fn update<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        key: impl RowKey,
        fence: Fence,
        holder: &str,
        set: &SetClause,
    ) -> Result<WriteOutcome> {
        let (assignments, args) = set.render()?;
        check_holder(holder)?;
        self.conditional_update(
            executor,
            &key,
            fence,
            Some(holder),
            &assignments,
            args,
            "update",
        )
        .await
    }

    /// Records `fence` and `holder` on the row, on `executor` (`&pool`,
    /// `&mut *conn` or `&mut *tx`), without changing anything else, under
    /// the same rule as [`FencedTable::update`]. Do this *before reading* in
    /// a read-modify-write computed in your code: once registered, a stale
    /// holder's write can no longer land between your read and your write.
    ///
    /// # Errors
    /// As [`FencedTable::update`].
    pub async fn register<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        key: impl RowKey,
        fence: Fence,
        holder: &str,
    ) -> Result<WriteOutcome> {
        check_holder(holder)?;
        let no_values = PgArguments::default();
        self.conditional_update(
            executor,
            &key,
            fence,
            Some(holder),
            "",
            no_values,
            "register",
        )
        .await
    }

    /// Seals the row at `fence`, on `executor` (`&pool`, `&mut *conn` or
    /// `&mut *tx`): records `fence` with the holder
    /// [`REVOKED_HOLDER`](crate::REVOKED_HOLDER), unless a greater fence is
    /// recorded already, so that every write with a fence up to `fence` is
    /// refused from then on and every greater one accepted. A revoke
    /// ([`LockClient::revoke`](crate::LockClient::revoke)) seals its
    /// resources at its revocation fence; an equal fence recorded by a
    /// holder is sealed too (that holder is the one revoked).
    ///
    /// # Errors
    /// As [`FencedTable::update`]. A greater fence recorded already is
    /// [`WriteOutcome::Rejected`] (the row is sealed by it as well).
    pub async fn seal<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        key: impl RowKey,
        fence: Fence,
    ) -> Result<WriteOutcome> {
        let no_values = PgArguments::default();
        self.conditional_update(executor, &key, fence, None, "", no_values, "seal")
            .await
    }

    /// Inserts the row, on `executor` (`&pool`, `&mut *conn` or `&mut
    /// *tx`), with key `key`, the columns of `values`, the fence and the
    /// holder — or, if a row with that key exists, updates it with `values`
    /// iff the fence rule accepts `fence` and `holder`. One statement:
    /// `INSERT … ON CONFLICT (key) DO UPDATE … WHERE <rule>`.
    ///
    /// `values` must hold plain column values ([`SetClause::set`]) only:
    /// SQL expressions cannot be inserted. The key column needs a unique
    /// index or primary key. On a rejection the current fence and holder
    /// are read right after the statement, for the report only, through the
    /// table's pool (so inside a transaction, its own uncommitted changes
    /// are not visible there).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] if `values` holds SQL; otherwise as
    /// [`FencedTable::update`], except that a missing row is inserted.
    #[tracing::instrument(name = "fenced_write", level = "debug", skip_all, fields(resource = %self.name, %fence, op = "upsert", outcome))]
    pub async fn upsert<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        key: impl RowKey,
        fence: Fence,
        holder: &str,
        values: &SetClause,
    ) -> Result<WriteOutcome> {
        let fence_param = fence_param(fence)?;
        check_holder(holder)?;
        let (columns, mut args) = values.render_values()?;
        let params = bind_row_params(&mut args, &key, fence_param, Some(holder))?;
        let statement = self.sql.upsert(&columns, params);
        // Identifiers are checked and quoted, values are bound: the only SQL
        // text here is ours.
        let written = match sqlx::query_with(AssertSqlSafe(statement), args)
            .execute(executor)
            .await
        {
            Ok(done) => done.rows_affected(),
            Err(e) => return Err(self.classify(e).await),
        };
        if written == 1 {
            crate::metrics::fenced_write(self.stats.as_ref(), &self.name, true);
            tracing::debug!(table = %self.name, key = ?key, %fence, "fenced upsert accepted");
            return Ok(WriteOutcome::Accepted);
        }
        // The row exists (the insert conflicted) and the rule refused us.
        let current = match self.read_fence(&self.pool, &key).await {
            Ok(current) => current,
            Err(Error::RowNotFound { .. }) => RowFence::default(),
            Err(other) => return Err(other),
        };
        Ok(self.rejected(&key, fence, "upsert", current))
    }

    /// The fence and holder recorded on the row whose key is `key`, read on
    /// `executor` (`&pool`, `&mut *conn` or `&mut *tx`).
    ///
    /// # Errors
    /// [`Error::RowNotFound`], [`Error::MissingFenceColumns`],
    /// [`Error::Postgres`].
    pub async fn read_fence<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        key: impl RowKey,
    ) -> Result<RowFence> {
        let row = sqlx::query(AssertSqlSafe(self.sql.read()))
            .bind(&key)
            .fetch_optional(executor)
            .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => return Err(self.classify(e).await),
        };
        let Some(row) = row else {
            return Err(self.not_found(&key));
        };
        let fence: Option<i64> = row.try_get(0).map_err(Error::from)?;
        let holder: Option<String> = row.try_get(1).map_err(Error::from)?;
        Ok(RowFence {
            fence: stored_fence(fence)?,
            holder,
        })
    }

    /// Validates a read of the row whose key is `key` against a reader's
    /// write epoch (`epoch`: a read lease's
    /// [`fence`](crate::LeaseHandle::fence)): reads the row's fence and
    /// holder on `executor` (`&pool`, `&mut *conn` or `&mut *tx`), as
    /// [`FencedTable::read_fence`] does, and applies
    /// [`read_is_clean`](crate::read_is_clean). Call it **after** reading
    /// your own columns (see "Validated reads" on [`FencedTable`]).
    ///
    /// The value is the row's [`RowFence`], or `None` if there is no such
    /// row. A missing row is clean (nothing stored, like an absent Redis
    /// hash or etcd key), not [`Error::RowNotFound`]: "no row as of my
    /// epoch" is a read a reader may need to validate too, and a later
    /// writer that creates the row ([`FencedTable::upsert`]) makes it
    /// [`ValidatedRead::Torn`]. Fenced writes never delete a row; a row
    /// deleted outside them reads as `None`.
    ///
    /// # Errors
    /// [`Error::MissingFenceColumns`], [`Error::Postgres`]. A torn read is
    /// not an error.
    pub async fn read_validated<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        key: impl RowKey,
        epoch: Fence,
    ) -> Result<ValidatedRead<Option<RowFence>>> {
        let row = match self.read_fence(executor, &key).await {
            Ok(row) => Some(row),
            Err(Error::RowNotFound { .. }) => None,
            Err(other) => return Err(other),
        };
        let stored = row.as_ref().and_then(|row| row.fence);
        Ok(ValidatedRead::check(row, stored, epoch))
    }

    /// The statement behind `update`, `register` and `seal` (`holder`
    /// `None`): lock the row, decide, update, and report what was found —
    /// one statement.
    #[allow(clippy::too_many_arguments)]
    #[tracing::instrument(name = "fenced_write", level = "debug", skip_all, fields(resource = %self.name, %fence, op = op, outcome))]
    async fn conditional_update<'c, K: RowKey>(
        &self,
        executor: impl PgExecutor<'c>,
        key: &K,
        fence: Fence,
        holder: Option<&str>,
        assignments: &str,
        mut args: PgArguments,
        op: &'static str,
    ) -> Result<WriteOutcome> {
        let fence_param = fence_param(fence)?;
        let params = bind_row_params(&mut args, key, fence_param, holder)?;
        let rule = if holder.is_some() {
            Rule::Fence
        } else {
            Rule::Seal
        };
        let statement = self.sql.conditional_update(assignments, params, rule);
        // Identifiers are checked and quoted, values are bound; the caller's
        // assignments came in as `SqlSafeStr` (see "SQL injection" on
        // `FencedTable`).
        let row = match sqlx::query_with(AssertSqlSafe(statement), args)
            .fetch_one(executor)
            .await
        {
            Ok(row) => row,
            Err(e) => return Err(self.classify(e).await),
        };
        let updated: i64 = row.try_get("updated").map_err(Error::from)?;
        let found: i64 = row.try_get("found").map_err(Error::from)?;
        if updated == 1 {
            crate::metrics::fenced_write(self.stats.as_ref(), &self.name, true);
            tracing::debug!(table = %self.name, key = ?key, %fence, op, "fenced write accepted");
            return Ok(WriteOutcome::Accepted);
        }
        if found == 0 {
            return Err(self.not_found(key));
        }
        let current = RowFence {
            fence: stored_fence(row.try_get("fence").map_err(Error::from)?)?,
            holder: row.try_get("holder").map_err(Error::from)?,
        };
        Ok(self.rejected(key, fence, op, current))
    }

    fn rejected<K: RowKey>(
        &self,
        key: &K,
        fence: Fence,
        op: &'static str,
        current: RowFence,
    ) -> WriteOutcome {
        crate::metrics::fenced_write(self.stats.as_ref(), &self.name, false);
        tracing::warn!(
            table = %self.name, key = ?key, %fence, current = ?current.fence, op,
            "fenced write rejected as stale: a holder outlived its lease"
        );
        WriteOutcome::Rejected {
            current_fence: current.fence,
            current_holder: current.holder,
        }
    }

    fn not_found<K: RowKey>(&self, key: &K) -> Error {
        Error::RowNotFound {
            table: self.name.clone(),
            key_column: self.key_name.clone(),
            key: format!("{key:?}"),
        }
    }

    /// Maps a failed statement to an error: `undefined_column` on a table
    /// that lacks a fence column becomes [`Error::MissingFenceColumns`]; all
    /// else is [`Error::Postgres`]. The columns are checked on the pool, as
    /// the statement's own connection may be in an aborted transaction.
    async fn classify(&self, e: sqlx::Error) -> Error {
        let undefined_column = matches!(&e, sqlx::Error::Database(db)
            if db.code().as_deref() == Some(UNDEFINED_COLUMN));
        if undefined_column && !self.has_fence_columns().await.unwrap_or(true) {
            return Error::MissingFenceColumns {
                table: self.name.clone(),
            };
        }
        Error::from(e)
    }

    /// Whether the table has both fence columns (from the catalog; a
    /// missing table counts as "no").
    async fn has_fence_columns(&self) -> Result<bool> {
        let count: i64 = sqlx::query_scalar(COUNT_FENCE_COLUMNS)
            .bind(&self.sql.table)
            .bind(FENCE_COLUMN)
            .bind(HOLDER_COLUMN)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::from)?;
        Ok(count == 2)
    }
}
