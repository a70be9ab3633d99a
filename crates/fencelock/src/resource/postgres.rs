//! Fenced Postgres rows (feature `postgres`): [`FencedTable`], [`SetClause`],
//! [`FencedRow`], [`RowFence`].
//!
//! The user-facing documentation (schema, the rule in SQL, which operation
//! to use, faults, SQL injection) is on [`FencedTable`], because this module
//! is not public; the types are re-exported at the crate root.

use std::fmt;

use sqlx::postgres::{PgArguments, PgConnection, PgPool, Postgres};
use sqlx::{Arguments, AssertSqlSafe, Encode, Executor, Row, SqlSafeStr, SqlStr, Type};

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::metrics::StatsHandle;
use crate::resource::{Fenced, WriteOutcome, check_holder};

/// The column that records the fence of the last accepted write (`bigint`).
pub const FENCE_COLUMN: &str = "lock_fence";

/// The column that records the holder token of the last accepted write
/// (`text`).
pub const HOLDER_COLUMN: &str = "lock_holder";

/// Longest identifier Postgres keeps (`NAMEDATALEN - 1`); longer names are
/// silently truncated by the server, so they are refused here.
const MAX_IDENT_LEN: usize = 63;

/// SQLSTATE `undefined_column`.
const UNDEFINED_COLUMN: &str = "42703";

/// A Postgres table whose rows are written only through the fence check
/// (feature `postgres`). Cheap to clone (the pool is shared).
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient, pool: sqlx::PgPool) -> Result<(), fencelock::Error> {
/// use fencelock::{FencedTable, SetClause};
///
/// let invoices = FencedTable::new(pool, "invoices")?;
/// invoices.add_fence_columns().await?; // once, or in your migrations
///
/// let lease = client.acquire("invoice:42", &client.options()).await?;
/// let outcome = invoices
///     .update(42_i64, lease.fence(), lease.token(), &SetClause::new().set("status", "closed"))
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
/// A write carrying fence `$f` from holder `$h` is accepted iff
///
/// ```sql
/// lock_fence IS NULL OR lock_fence < $f OR (lock_fence = $f AND lock_holder = $h)
/// ```
///
/// (DESIGN.md §2.4, [`fence_accepts`](crate::fence_accepts)). A row never
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
///
/// # Faults
///
/// Every operation is **one statement** (in autocommit, or inside your
/// transaction with the `*_in` variants): it is applied entirely or not at
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
/// transaction (the `*_in` variants take any connection, including
/// `&mut *tx`) if the read must see a consistent snapshot; otherwise the
/// registration is harmless to leave behind when you stop half-way — it only
/// blocks older fences.
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
/// # SQL injection
///
/// Table and column names are checked and always sent quoted (`"invoices"`),
/// so they are taken exactly as given: a table created without quotes has a
/// lowercase name. Values are always bound parameters ([`SetClause::set`],
/// [`SetClause::bind`]). The one exception is [`SetClause::set_sql`]: its
/// text is SQL and is sent as is, so it must come from your code, never from
/// user input. It takes sqlx's [`SqlSafeStr`] — a `&'static str` literal, or
/// [`AssertSqlSafe`](sqlx::AssertSqlSafe) where you have audited a built
/// string — and refers to values by `$1`, `$2`, … bound with
/// [`SetClause::bind`].
#[derive(Debug, Clone)]
pub struct FencedTable {
    pool: PgPool,
    /// The name as given (for messages).
    name: String,
    /// The quoted, possibly schema-qualified name as sent.
    quoted: String,
    key_name: String,
    key_quoted: String,
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
    /// The holder token of the last accepted write, if recorded.
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
        let quoted = quote_table(table)?;
        Ok(FencedTable {
            pool,
            name: table.to_owned(),
            quoted,
            key_name: "id".to_owned(),
            key_quoted: "\"id\"".to_owned(),
            stats: None,
        })
    }

    /// Uses `column` (a unique column, e.g. the primary key) to find rows
    /// instead of `id`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] as for [`FencedTable::new`].
    pub fn with_key_column(mut self, column: &str) -> Result<Self> {
        self.key_quoted = quote_ident(column)?;
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

    /// The pool this table uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A handle on one row, for code written against the [`Fenced`] trait.
    pub fn row<K>(&self, key: K) -> FencedRow<K> {
        FencedRow {
            table: self.clone(),
            key,
        }
    }

    /// The migration that adds the fence columns to this table:
    /// `ALTER TABLE "t" ADD COLUMN IF NOT EXISTS lock_fence bigint, ADD COLUMN
    /// IF NOT EXISTS lock_holder text`. Idempotent; a metadata-only change
    /// (it takes a brief `ACCESS EXCLUSIVE` lock but rewrites nothing).
    pub fn migration_sql(&self) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {FENCE_COLUMN} bigint, ADD COLUMN IF NOT EXISTS {HOLDER_COLUMN} text",
            self.quoted
        )
    }

    /// Runs [`FencedTable::migration_sql`].
    ///
    /// # Errors
    /// [`Error::Postgres`] (for example, the table does not exist).
    pub async fn add_fence_columns(&self) -> Result<()> {
        self.pool
            .execute(AssertSqlSafe(self.migration_sql()))
            .await
            .map_err(Error::Postgres)?;
        tracing::info!(table = %self.name, "fence columns present");
        Ok(())
    }

    /// One conditional `UPDATE` of the row whose key is `key`: applies `set`
    /// and records `fence` and `holder`, iff the fence rule accepts them.
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
    pub async fn update<K>(
        &self,
        key: K,
        fence: Fence,
        holder: &str,
        set: &SetClause,
    ) -> Result<WriteOutcome>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        let (assignments, args) = set.render()?;
        self.conditional_update(
            &self.pool,
            &key,
            fence,
            holder,
            &assignments,
            args,
            "update",
        )
        .await
    }

    /// [`FencedTable::update`] on `conn` — a connection or an open
    /// transaction (`&mut *tx`) — instead of the pool.
    ///
    /// # Errors
    /// As [`FencedTable::update`].
    pub async fn update_in<K>(
        &self,
        conn: &mut PgConnection,
        key: K,
        fence: Fence,
        holder: &str,
        set: &SetClause,
    ) -> Result<WriteOutcome>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        let (assignments, args) = set.render()?;
        self.conditional_update(conn, &key, fence, holder, &assignments, args, "update")
            .await
    }

    /// Records `fence` and `holder` on the row without changing anything
    /// else, under the same rule as [`FencedTable::update`]. Do this *before
    /// reading* in a read-modify-write computed in your code: once
    /// registered, a stale holder's write can no longer land between your
    /// read and your write.
    ///
    /// # Errors
    /// As [`FencedTable::update`].
    pub async fn register<K>(&self, key: K, fence: Fence, holder: &str) -> Result<WriteOutcome>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        self.conditional_update(
            &self.pool,
            &key,
            fence,
            holder,
            "",
            PgArguments::default(),
            "register",
        )
        .await
    }

    /// [`FencedTable::register`] on `conn` (a connection or transaction).
    ///
    /// # Errors
    /// As [`FencedTable::update`].
    pub async fn register_in<K>(
        &self,
        conn: &mut PgConnection,
        key: K,
        fence: Fence,
        holder: &str,
    ) -> Result<WriteOutcome>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        self.conditional_update(
            conn,
            &key,
            fence,
            holder,
            "",
            PgArguments::default(),
            "register",
        )
        .await
    }

    /// Inserts the row (key `key`, the columns of `values`, the fence and
    /// holder), or — if a row with that key exists — updates it with
    /// `values` iff the fence rule accepts `fence` and `holder`. One
    /// statement: `INSERT … ON CONFLICT (key) DO UPDATE … WHERE <rule>`.
    ///
    /// `values` must hold plain column values ([`SetClause::set`]) only:
    /// SQL expressions cannot be inserted. The key column needs a unique
    /// index or primary key. On a rejection the current fence and holder
    /// are read right after the statement, for the report only.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] if `values` holds SQL; otherwise as
    /// [`FencedTable::update`], except that a missing row is inserted.
    pub async fn upsert<K>(
        &self,
        key: K,
        fence: Fence,
        holder: &str,
        values: &SetClause,
    ) -> Result<WriteOutcome>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        self.upsert_on(&self.pool, &key, fence, holder, values)
            .await
    }

    /// [`FencedTable::upsert`] on `conn` (a connection or transaction). On a
    /// rejection, the current fence is read through the pool (the
    /// transaction's own uncommitted changes are not visible there).
    ///
    /// # Errors
    /// As [`FencedTable::upsert`].
    pub async fn upsert_in<K>(
        &self,
        conn: &mut PgConnection,
        key: K,
        fence: Fence,
        holder: &str,
        values: &SetClause,
    ) -> Result<WriteOutcome>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        self.upsert_on(conn, &key, fence, holder, values).await
    }

    #[tracing::instrument(name = "fenced_write", level = "debug", skip_all, fields(resource = %self.name, %fence, op = "upsert", outcome))]
    async fn upsert_on<'c, E, K>(
        &self,
        executor: E,
        key: &K,
        fence: Fence,
        holder: &str,
        values: &SetClause,
    ) -> Result<WriteOutcome>
    where
        E: Executor<'c, Database = Postgres>,
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        let fence_param = fence_param(fence)?;
        check_holder(holder)?;
        let (columns, mut args) = values.render_values()?;
        let n = args.len();
        let (p_key, p_fence, p_holder) = (n + 1, n + 2, n + 3);
        let mut insert_cols = vec![self.key_quoted.clone()];
        let mut insert_vals = vec![format!("${p_key}")];
        let mut updates = Vec::new();
        for (column, param) in &columns {
            insert_cols.push(column.clone());
            insert_vals.push(format!("${param}"));
            updates.push(format!("{column} = EXCLUDED.{column}"));
        }
        insert_cols.extend([FENCE_COLUMN.to_owned(), HOLDER_COLUMN.to_owned()]);
        insert_vals.extend([format!("${p_fence}"), format!("${p_holder}")]);
        updates.extend([
            format!("{FENCE_COLUMN} = EXCLUDED.{FENCE_COLUMN}"),
            format!("{HOLDER_COLUMN} = EXCLUDED.{HOLDER_COLUMN}"),
        ]);
        // ON CONFLICT DO UPDATE locks the existing row and checks the rule on
        // its newest version.
        let sql = format!(
            "INSERT INTO {table} AS fencelock_row ({cols}) VALUES ({vals}) \
             ON CONFLICT ({key}) DO UPDATE SET {updates} \
             WHERE fencelock_row.{FENCE_COLUMN} IS NULL \
                OR fencelock_row.{FENCE_COLUMN} < EXCLUDED.{FENCE_COLUMN} \
                OR (fencelock_row.{FENCE_COLUMN} = EXCLUDED.{FENCE_COLUMN} \
                    AND fencelock_row.{HOLDER_COLUMN} = EXCLUDED.{HOLDER_COLUMN}) \
             RETURNING 1",
            table = self.quoted,
            cols = insert_cols.join(", "),
            vals = insert_vals.join(", "),
            key = self.key_quoted,
            updates = updates.join(", "),
        );
        add_arg(&mut args, key)?;
        add_arg(&mut args, fence_param)?;
        add_arg(&mut args, holder)?;
        // Identifiers are checked and quoted, values are bound: the only SQL
        // text here is ours.
        let written = match sqlx::query_with(AssertSqlSafe(sql), args)
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
        let current = match self.read_on(&self.pool, key).await {
            Ok(current) => current,
            Err(Error::RowNotFound { .. }) => RowFence::default(),
            Err(other) => return Err(other),
        };
        Ok(self.rejected(key, fence, "upsert", current))
    }

    /// The fence and holder recorded on the row whose key is `key`.
    ///
    /// # Errors
    /// [`Error::RowNotFound`], [`Error::MissingFenceColumns`],
    /// [`Error::Postgres`].
    pub async fn read_fence<K>(&self, key: K) -> Result<RowFence>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        self.read_on(&self.pool, &key).await
    }

    /// [`FencedTable::read_fence`] on `conn` (a connection or transaction).
    ///
    /// # Errors
    /// As [`FencedTable::read_fence`].
    pub async fn read_fence_in<K>(&self, conn: &mut PgConnection, key: K) -> Result<RowFence>
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        self.read_on(conn, &key).await
    }

    async fn read_on<'c, E, K>(&self, executor: E, key: &K) -> Result<RowFence>
    where
        E: Executor<'c, Database = Postgres>,
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        let sql = format!(
            "SELECT {FENCE_COLUMN}, {HOLDER_COLUMN} FROM {} WHERE {} = $1",
            self.quoted, self.key_quoted
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(key)
            .fetch_optional(executor)
            .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => return Err(self.classify(e).await),
        };
        let Some(row) = row else {
            return Err(self.not_found(key));
        };
        let fence: Option<i64> = row.try_get(0).map_err(Error::Postgres)?;
        let holder: Option<String> = row.try_get(1).map_err(Error::Postgres)?;
        Ok(RowFence {
            fence: stored_fence(fence)?,
            holder,
        })
    }

    /// The statement behind `update` and `register`: lock the row, decide,
    /// update, and report what was found — one statement.
    #[allow(clippy::too_many_arguments)]
    #[tracing::instrument(name = "fenced_write", level = "debug", skip_all, fields(resource = %self.name, %fence, op = op, outcome))]
    async fn conditional_update<'c, E, K>(
        &self,
        executor: E,
        key: &K,
        fence: Fence,
        holder: &str,
        assignments: &str,
        mut args: PgArguments,
        op: &'static str,
    ) -> Result<WriteOutcome>
    where
        E: Executor<'c, Database = Postgres>,
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
    {
        let fence_param = fence_param(fence)?;
        check_holder(holder)?;
        let n = args.len();
        let (p_key, p_fence, p_holder) = (n + 1, n + 2, n + 3);
        let set = if assignments.is_empty() {
            String::new()
        } else {
            format!("{assignments}, ")
        };
        // `fencelock_cur` locks the row and reads the fence it holds *now*
        // (in READ COMMITTED, FOR UPDATE waits for a concurrent writer and
        // returns the newest version), so the decision, the update and the
        // report all use the same, locked state. No row: `found = 0`.
        let sql = format!(
            "WITH fencelock_cur AS ( \
                 SELECT {FENCE_COLUMN} AS fencelock_fence, {HOLDER_COLUMN} AS fencelock_holder \
                 FROM {table} WHERE {key} = ${p_key} FOR UPDATE \
             ), fencelock_upd AS ( \
                 UPDATE {table} SET {set}{FENCE_COLUMN} = ${p_fence}, {HOLDER_COLUMN} = ${p_holder} \
                 FROM fencelock_cur \
                 WHERE {table}.{key} = ${p_key} \
                   AND (fencelock_fence IS NULL OR fencelock_fence < ${p_fence} \
                        OR (fencelock_fence = ${p_fence} AND fencelock_holder = ${p_holder})) \
                 RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM fencelock_upd) AS updated, \
                    (SELECT count(*) FROM fencelock_cur) AS found, \
                    (SELECT fencelock_fence FROM fencelock_cur) AS fence, \
                    (SELECT fencelock_holder FROM fencelock_cur) AS holder",
            table = self.quoted,
            key = self.key_quoted,
        );
        add_arg(&mut args, key)?;
        add_arg(&mut args, fence_param)?;
        add_arg(&mut args, holder)?;
        // Identifiers are checked and quoted, values are bound; the caller's
        // assignments came in as `SqlSafeStr` (see "SQL injection" on
        // `FencedTable`).
        let row = match sqlx::query_with(AssertSqlSafe(sql), args)
            .fetch_one(executor)
            .await
        {
            Ok(row) => row,
            Err(e) => return Err(self.classify(e).await),
        };
        let updated: i64 = row.try_get("updated").map_err(Error::Postgres)?;
        let found: i64 = row.try_get("found").map_err(Error::Postgres)?;
        if updated == 1 {
            crate::metrics::fenced_write(self.stats.as_ref(), &self.name, true);
            tracing::debug!(table = %self.name, key = ?key, %fence, op, "fenced write accepted");
            return Ok(WriteOutcome::Accepted);
        }
        if found == 0 {
            return Err(self.not_found(key));
        }
        let current = RowFence {
            fence: stored_fence(row.try_get("fence").map_err(Error::Postgres)?)?,
            holder: row.try_get("holder").map_err(Error::Postgres)?,
        };
        Ok(self.rejected(key, fence, op, current))
    }

    fn rejected<K: fmt::Debug>(
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

    fn not_found<K: fmt::Debug>(&self, key: &K) -> Error {
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
        Error::Postgres(e)
    }

    /// Whether the table has both fence columns (from the catalog; a
    /// missing table counts as "no").
    async fn has_fence_columns(&self) -> Result<bool> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_catalog.pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname IN ($2, $3) \
               AND attnum > 0 AND NOT attisdropped",
        )
        .bind(&self.quoted)
        .bind(FENCE_COLUMN)
        .bind(HOLDER_COLUMN)
        .fetch_one(&self.pool)
        .await
        .map_err(Error::Postgres)?;
        Ok(count == 2)
    }
}

/// One row of a [`FencedTable`], for code written against [`Fenced`]
/// (`write` = the [`SetClause`] of a conditional `UPDATE`). Created by
/// [`FencedTable::row`].
#[derive(Debug, Clone)]
pub struct FencedRow<K> {
    table: FencedTable,
    key: K,
}

impl<K> FencedRow<K> {
    /// The row's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The table.
    pub fn table(&self) -> &FencedTable {
        &self.table
    }
}

impl<K> Fenced for FencedRow<K>
where
    K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug,
{
    /// The assignments of the conditional `UPDATE`.
    type Write = SetClause;

    /// [`FencedTable::update`] of this row.
    fn fenced_write(
        &self,
        fence: Fence,
        holder: &str,
        set: &SetClause,
    ) -> impl Future<Output = Result<WriteOutcome>> + Send {
        self.table.update(&self.key, fence, holder, set)
    }
}

/// The `SET` part of a fenced `UPDATE` (or the values of an upsert):
/// column assignments with bound values, and, for computed updates,
/// trusted SQL.
///
/// ```
/// use fencelock::SetClause;
///
/// // status = $1 (bound), closed_by = $2 (bound)
/// let close = SetClause::new().set("status", "closed").set("closed_by", "worker-b");
/// // a computed update: one statement, no lost increment
/// let increment = SetClause::new().set_sql("v = v + 1");
/// // computed, with a bound value: total = total + $1
/// let add = SetClause::new().set_sql("total = total + $1").bind(250_i64);
/// # let _ = (close, increment, add);
/// ```
///
/// `$N` in [`SetClause::set_sql`] text refers to the N-th value bound in this
/// clause, counting the values of [`SetClause::set`] too, in call order.
/// Mistakes (a bad column name, a `$N` beyond the bound values, a value that
/// cannot be encoded) are reported by the operation that uses the clause,
/// before anything is sent.
#[derive(Clone, Default)]
pub struct SetClause {
    parts: Vec<Part>,
    args: PgArguments,
    /// The first mistake made while building, reported on use.
    error: Option<Deferred>,
}

#[derive(Debug, Clone)]
enum Part {
    /// `"column" = $param`.
    Value { column: String, param: usize },
    /// Caller's SQL, sent as is.
    Sql(SqlStr),
}

#[derive(Debug, Clone)]
enum Deferred {
    Name { name: String, reason: &'static str },
    Option(String),
}

impl fmt::Debug for SetClause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetClause")
            .field("parts", &self.parts)
            .field("bound_values", &self.args.len())
            .field("error", &self.error)
            .finish()
    }
}

impl SetClause {
    /// An empty clause.
    pub fn new() -> Self {
        SetClause::default()
    }

    /// Adds `"column" = $N` with `value` bound as `$N`. The column name is
    /// checked and quoted; it may not be a fence column (fencelock sets
    /// those).
    pub fn set<'t, T>(mut self, column: &str, value: T) -> Self
    where
        T: Encode<'t, Postgres> + Type<Postgres>,
    {
        if self.error.is_some() {
            return self;
        }
        if column == FENCE_COLUMN || column == HOLDER_COLUMN {
            self.error = Some(Deferred::Option(format!(
                "column {column} is set by fencelock from the fence and holder"
            )));
            return self;
        }
        let column = match quote_ident(column) {
            Ok(quoted) => quoted,
            Err(Error::InvalidName { name, reason }) => {
                self.error = Some(Deferred::Name { name, reason });
                return self;
            }
            Err(other) => {
                self.error = Some(Deferred::Option(other.to_string()));
                return self;
            }
        };
        self = self.bind(value);
        if self.error.is_none() {
            let param = self.args.len();
            self.parts.push(Part::Value { column, param });
        }
        self
    }

    /// Adds assignments written in SQL, e.g. `"v = v + 1"` or `"total =
    /// total + $1"`, separated from the others by a comma.
    ///
    /// **The text is sent as SQL.** It must be written by you, never built
    /// from user input; bind values with [`SetClause::bind`] and refer to
    /// them as `$1`, `$2`, … That is why it takes [`SqlSafeStr`]: a string
    /// literal, or [`AssertSqlSafe`](sqlx::AssertSqlSafe) around a string
    /// you have audited. A `$N` inside a string literal counts as a
    /// placeholder too; bind such text as a value instead.
    pub fn set_sql(mut self, assignments: impl SqlSafeStr) -> Self {
        self.parts.push(Part::Sql(assignments.into_sql_str()));
        self
    }

    /// Binds `value` as the next `$N` for [`SetClause::set_sql`] text.
    pub fn bind<'t, T>(mut self, value: T) -> Self
    where
        T: Encode<'t, Postgres> + Type<Postgres>,
    {
        if self.error.is_none()
            && let Err(e) = self.args.add(value)
        {
            self.error = Some(Deferred::Option(format!(
                "value ${} of the SET clause cannot be encoded: {e}",
                self.args.len() + 1
            )));
        }
        self
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    fn check(&self) -> Result<()> {
        match &self.error {
            Some(Deferred::Name { name, reason }) => Err(Error::InvalidName {
                name: name.clone(),
                reason,
            }),
            Some(Deferred::Option(message)) => Err(Error::InvalidOption(message.clone())),
            None if self.parts.is_empty() => Err(Error::InvalidOption(
                "the SET clause is empty: set at least one column (or use register to record only the fence)".into(),
            )),
            None => Ok(()),
        }
    }

    /// The assignments as SQL and a copy of the bound values.
    fn render(&self) -> Result<(String, PgArguments)> {
        self.check()?;
        let bound = self.args.len();
        let mut sql = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            match part {
                Part::Value { column, param } => sql.push(format!("{column} = ${param}")),
                Part::Sql(text) => {
                    let text = text.as_str().trim();
                    if text.is_empty() {
                        return Err(Error::InvalidOption(
                            "an SQL assignment of the SET clause is empty".into(),
                        ));
                    }
                    if let Some(n) = placeholders(text).find(|n| *n == 0 || *n > bound) {
                        return Err(Error::InvalidOption(format!(
                            "the SET clause {text:?} refers to ${n}, but {bound} value(s) are bound"
                        )));
                    }
                    sql.push(text.to_owned());
                }
            }
        }
        Ok((sql.join(", "), self.args.clone()))
    }

    /// The (quoted column, parameter number) pairs, if the clause holds
    /// plain values only.
    fn render_values(&self) -> Result<(Vec<(String, usize)>, PgArguments)> {
        self.check()?;
        let mut columns = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            match part {
                Part::Value { column, param } => columns.push((column.clone(), *param)),
                Part::Sql(_) => {
                    return Err(Error::InvalidOption(
                        "an upsert takes plain column values (SetClause::set) only: SQL expressions cannot be inserted".into(),
                    ));
                }
            }
        }
        Ok((columns, self.args.clone()))
    }
}

/// Every `$N` in `sql` (N parsed; an overflowing N counts as 0).
fn placeholders(sql: &str) -> impl Iterator<Item = usize> + '_ {
    sql.match_indices('$').filter_map(move |(i, _)| {
        let digits: &str = {
            let rest = &sql[i + 1..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            &rest[..end]
        };
        (!digits.is_empty()).then(|| digits.parse().unwrap_or(0))
    })
}

fn add_arg<'t, T>(args: &mut PgArguments, value: T) -> Result<()>
where
    T: Encode<'t, Postgres> + Type<Postgres>,
{
    args.add(value)
        .map_err(|e| Error::Postgres(sqlx::Error::Encode(e)))
}

fn fence_param(fence: Fence) -> Result<i64> {
    i64::try_from(fence.get()).map_err(|_| {
        Error::InvalidOption(format!(
            "fence {fence} does not fit the bigint column {FENCE_COLUMN} (at most {})",
            i64::MAX
        ))
    })
}

fn stored_fence(raw: Option<i64>) -> Result<Option<Fence>> {
    raw.map(|v| {
        u64::try_from(v).map(Fence::new).map_err(|_| {
            Error::Postgres(sqlx::Error::ColumnDecode {
                index: FENCE_COLUMN.to_owned(),
                source: format!("{FENCE_COLUMN} holds {v}, which is not a fence (fences are >= 0)")
                    .into(),
            })
        })
    })
    .transpose()
}

/// `"part"` for one identifier, after checking it.
fn quote_ident(name: &str) -> Result<String> {
    let reject = |reason| {
        Err(Error::InvalidName {
            name: name.chars().take(64).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return reject("an SQL identifier is empty");
    }
    if name.len() > MAX_IDENT_LEN {
        return reject("an SQL identifier is longer than 63 bytes (Postgres would truncate it)");
    }
    if name.contains('"') {
        return reject("an SQL identifier contains a double quote");
    }
    if name.chars().any(char::is_control) {
        return reject("an SQL identifier contains a control character");
    }
    Ok(format!("\"{name}\""))
}

/// `"table"` or `"schema"."table"`.
fn quote_table(table: &str) -> Result<String> {
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 {
        return Err(Error::InvalidName {
            name: table.chars().take(64).collect(),
            reason: "a table name has at most two parts: schema.table",
        });
    }
    let quoted: Result<Vec<String>> = parts.into_iter().map(quote_ident).collect();
    Ok(quoted?.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        assert_eq!(quote_table("invoices").ok(), Some("\"invoices\"".into()));
        assert_eq!(
            quote_table("billing.Invoices").ok(),
            Some("\"billing\".\"Invoices\"".into())
        );
        for bad in [
            "",
            "a.b.c",
            ".t",
            "t\"; DROP TABLE x; --",
            "t\n",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(quote_table(bad), Err(Error::InvalidName { .. })),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn placeholders_are_found() {
        let found: Vec<usize> = placeholders("a = $1 + $23, b = '$' || $x").collect();
        assert_eq!(found, vec![1, 23]);
    }

    #[test]
    fn set_clause_renders_in_bind_order() {
        let set = SetClause::new()
            .set("status", "closed")
            .set_sql("total = total + $2")
            .bind(5_i64);
        let (sql, args) = set.render().expect("valid clause");
        assert_eq!(sql, "\"status\" = $1, total = total + $2");
        assert_eq!(args.len(), 2);
    }

    #[test]
    fn set_clause_mistakes_are_reported_on_use() {
        let unbound = SetClause::new().set_sql("v = $1");
        assert!(matches!(unbound.render(), Err(Error::InvalidOption(_))));
        let bad_column = SetClause::new().set("a\"b", 1_i64);
        assert!(matches!(
            bad_column.render(),
            Err(Error::InvalidName { .. })
        ));
        let fence_column = SetClause::new().set(FENCE_COLUMN, 1_i64);
        assert!(matches!(
            fence_column.render(),
            Err(Error::InvalidOption(_))
        ));
        assert!(matches!(
            SetClause::new().render(),
            Err(Error::InvalidOption(_))
        ));
        let sql_in_upsert = SetClause::new().set_sql("v = v + 1");
        assert!(matches!(
            sql_in_upsert.render_values(),
            Err(Error::InvalidOption(_))
        ));
    }

    #[test]
    fn fences_above_bigint_are_refused() {
        assert_eq!(
            fence_param(Fence::new(i64::MAX as u64)).ok(),
            Some(i64::MAX)
        );
        assert!(matches!(
            fence_param(Fence::new(i64::MAX as u64 + 1)),
            Err(Error::InvalidOption(_))
        ));
        assert!(stored_fence(Some(-1)).is_err());
        assert_eq!(stored_fence(Some(7)).ok(), Some(Some(Fence::new(7))));
    }
}
