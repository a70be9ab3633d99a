//! The statements of a fenced table, as text: checked, quoted identifiers
//! and `$N` placeholders only — every value is bound. The acceptance rule is
//! rendered in one place, [`rule_sql`], and every statement that writes
//! uses it.

use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Encode, Postgres, Type};

use super::{FENCE_COLUMN, HOLDER_COLUMN, RowKey};
use crate::error::{Error, Result};
use crate::fence::Fence;

/// Counts the fence columns of a table (`$1`: its quoted name) in the
/// catalog; a missing table counts none.
pub(super) const COUNT_FENCE_COLUMNS: &str = "SELECT count(*) FROM pg_catalog.pg_attribute \
     WHERE attrelid = to_regclass($1) AND attname IN ($2, $3) \
       AND attnum > 0 AND NOT attisdropped";

/// The parameter numbers of the key, the fence and the holder. They follow
/// the values of the caller's [`SetClause`](super::SetClause), which are
/// `$1` … `$n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Params {
    pub(super) key: usize,
    pub(super) fence: usize,
    pub(super) holder: usize,
}

/// The acceptance rule of docs/design.md §2.4 as an SQL condition, in
/// parentheses: `(F IS NULL OR F < $f OR (F = $f AND H = $h))`, where `F`
/// and `H` are the stored fence and holder as the statement names them, and
/// `$f`, `$h` the parameters of the write's fence and holder.
pub(super) fn rule_sql(stored_fence: &str, stored_holder: &str, params: Params) -> String {
    rule_of(Rule::Fence, stored_fence, stored_holder, params)
}

/// Which rule a conditional update checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// The fence rule ([`rule_sql`]).
    Fence,
    /// A revoke's seal: `(F IS NULL OR F <= $f)`, an equal fence from any
    /// holder included (that holder is the one revoked).
    Seal,
}

/// `rule` as an SQL condition, in parentheses (see [`rule_sql`]).
pub(super) fn rule_of(
    rule: Rule,
    stored_fence: &str,
    stored_holder: &str,
    params: Params,
) -> String {
    if rule == Rule::Seal {
        return format!(
            "({stored_fence} IS NULL OR {stored_fence} <= ${})",
            params.fence
        );
    }
    let (f, h) = (params.fence, params.holder);
    format!(
        "({stored_fence} IS NULL OR {stored_fence} < ${f} \
         OR ({stored_fence} = ${f} AND {stored_holder} = ${h}))"
    )
}

/// The statement texts of one table.
#[derive(Debug, Clone)]
pub(super) struct TableSql {
    /// The quoted, possibly schema-qualified table name.
    pub(super) table: String,
    /// The quoted key column.
    pub(super) key: String,
}

impl TableSql {
    /// Adds the fence columns; idempotent.
    pub(super) fn migration(&self) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {FENCE_COLUMN} bigint, ADD COLUMN IF NOT EXISTS {HOLDER_COLUMN} text",
            self.table
        )
    }

    /// Reads the fence and holder of the row whose key is `$1`.
    pub(super) fn read(&self) -> String {
        format!(
            "SELECT {FENCE_COLUMN}, {HOLDER_COLUMN} FROM {} WHERE {} = $1",
            self.table, self.key
        )
    }

    /// The statement behind `update` and `register`: lock the row, decide,
    /// update (`assignments`, possibly empty, then the fence and holder),
    /// and report what was found — columns `updated`, `found`, `fence`,
    /// `holder`.
    pub(super) fn conditional_update(&self, assignments: &str, p: Params, rule: Rule) -> String {
        let set = if assignments.is_empty() {
            String::new()
        } else {
            format!("{assignments}, ")
        };
        let rule = rule_of(rule, "fencelock_fence", "fencelock_holder", p);
        // `fencelock_cur` locks the row and reads the fence it holds *now*
        // (in READ COMMITTED, FOR UPDATE waits for a concurrent writer and
        // returns the newest version), so the decision, the update and the
        // report all use the same, locked state. No row: `found = 0`.
        format!(
            "WITH fencelock_cur AS ( \
                 SELECT {FENCE_COLUMN} AS fencelock_fence, {HOLDER_COLUMN} AS fencelock_holder \
                 FROM {table} WHERE {key} = ${p_key} FOR UPDATE \
             ), fencelock_upd AS ( \
                 UPDATE {table} SET {set}{FENCE_COLUMN} = ${p_fence}, {HOLDER_COLUMN} = ${p_holder} \
                 FROM fencelock_cur \
                 WHERE {table}.{key} = ${p_key} AND {rule} \
                 RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM fencelock_upd) AS updated, \
                    (SELECT count(*) FROM fencelock_cur) AS found, \
                    (SELECT fencelock_fence FROM fencelock_cur) AS fence, \
                    (SELECT fencelock_holder FROM fencelock_cur) AS holder",
            table = self.table,
            key = self.key,
            p_key = p.key,
            p_fence = p.fence,
            p_holder = p.holder,
        )
    }

    /// `INSERT … ON CONFLICT (key) DO UPDATE … WHERE <rule> RETURNING 1`:
    /// inserts the row with `columns` (quoted column, parameter number), the
    /// fence and the holder, or updates an existing row under the rule. One
    /// row is returned iff the write was applied.
    pub(super) fn upsert(&self, columns: &[(String, usize)], p: Params) -> String {
        let mut insert_cols = vec![self.key.clone()];
        let mut insert_vals = vec![format!("${}", p.key)];
        let mut updates = Vec::new();
        for (column, param) in columns {
            insert_cols.push(column.clone());
            insert_vals.push(format!("${param}"));
            updates.push(format!("{column} = EXCLUDED.{column}"));
        }
        insert_cols.extend([FENCE_COLUMN.to_owned(), HOLDER_COLUMN.to_owned()]);
        insert_vals.extend([format!("${}", p.fence), format!("${}", p.holder)]);
        updates.extend([
            format!("{FENCE_COLUMN} = EXCLUDED.{FENCE_COLUMN}"),
            format!("{HOLDER_COLUMN} = EXCLUDED.{HOLDER_COLUMN}"),
        ]);
        let rule = rule_sql(
            &format!("fencelock_row.{FENCE_COLUMN}"),
            &format!("fencelock_row.{HOLDER_COLUMN}"),
            p,
        );
        // ON CONFLICT DO UPDATE locks the existing row and checks the rule on
        // its newest version.
        format!(
            "INSERT INTO {table} AS fencelock_row ({cols}) VALUES ({vals}) \
             ON CONFLICT ({key}) DO UPDATE SET {updates} \
             WHERE {rule} \
             RETURNING 1",
            table = self.table,
            cols = insert_cols.join(", "),
            vals = insert_vals.join(", "),
            key = self.key,
            updates = updates.join(", "),
        )
    }
}

/// Binds the key, the fence and the holder's public id (from its token; a
/// seal's [`REVOKED_HOLDER`](crate::holder::REVOKED_HOLDER)) after the values
/// already in `args`, and returns their parameter numbers.
///
/// # Errors
/// [`Error::Postgres`] if the key cannot be encoded.
pub(super) fn bind_row_params<K: RowKey>(
    args: &mut PgArguments,
    key: &K,
    fence: i64,
    holder: Option<&str>,
) -> Result<Params> {
    let n = args.len();
    add_arg(args, key)?;
    add_arg(args, fence)?;
    add_arg(
        args,
        holder.map_or_else(
            || crate::holder::REVOKED_HOLDER.to_owned(),
            crate::holder::holder_id,
        ),
    )?;
    Ok(Params {
        key: n + 1,
        fence: n + 2,
        holder: n + 3,
    })
}

fn add_arg<'t, T>(args: &mut PgArguments, value: T) -> Result<()>
where
    T: Encode<'t, Postgres> + Type<Postgres>,
{
    args.add(value)
        .map_err(|e| Error::from(sqlx::Error::Encode(e)))
}

/// `fence` as the `bigint` the fence column holds.
///
/// # Errors
/// [`Error::InvalidOption`] above `i64::MAX`: refused, never wrapped.
pub(super) fn fence_param(fence: Fence) -> Result<i64> {
    i64::try_from(fence.get()).map_err(|_| {
        Error::InvalidOption(format!(
            "fence {fence} does not fit the bigint column {FENCE_COLUMN} (at most {})",
            i64::MAX
        ))
    })
}

/// The fence a row records, from its `bigint` column.
///
/// # Errors
/// [`Error::Postgres`] (a column decode error) for a negative value.
pub(super) fn stored_fence(raw: Option<i64>) -> Result<Option<Fence>> {
    raw.map(|v| {
        u64::try_from(v).map(Fence::new).map_err(|_| {
            Error::from(sqlx::Error::ColumnDecode {
                index: FENCE_COLUMN.to_owned(),
                source: format!("{FENCE_COLUMN} holds {v}, which is not a fence (fences are >= 0)")
                    .into(),
            })
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invoices() -> TableSql {
        TableSql {
            table: "\"invoices\"".into(),
            key: "\"id\"".into(),
        }
    }

    #[test]
    fn the_rule_renders_as_documented() {
        let p = Params {
            key: 1,
            fence: 2,
            holder: 3,
        };
        assert_eq!(
            rule_sql(FENCE_COLUMN, HOLDER_COLUMN, p),
            "(lock_fence IS NULL OR lock_fence < $2 OR (lock_fence = $2 AND lock_holder = $3))"
        );
    }

    #[test]
    fn every_write_statement_checks_the_rule_with_its_own_parameters() {
        let mut args = PgArguments::default();
        add_arg(&mut args, "closed").expect("encode");
        let p = bind_row_params(&mut args, &42_i64, 7, Some("h")).expect("encode");
        assert_eq!((p.key, p.fence, p.holder, args.len()), (2, 3, 4, 4));
        let update = invoices().conditional_update("\"status\" = $1", p, Rule::Fence);
        assert!(
            update.contains(&rule_sql("fencelock_fence", "fencelock_holder", p)),
            "{update}"
        );
        assert!(update.contains("SET \"status\" = $1, lock_fence = $3, lock_holder = $4"));
        let register = invoices().conditional_update("", p, Rule::Fence);
        assert!(
            register.contains("SET lock_fence = $3, lock_holder = $4"),
            "{register}"
        );
        let upsert = invoices().upsert(&[("\"status\"".into(), 1)], p);
        assert!(
            upsert.contains(&rule_sql(
                "fencelock_row.lock_fence",
                "fencelock_row.lock_holder",
                p
            )),
            "{upsert}"
        );
        assert!(
            upsert
                .contains("(\"id\", \"status\", lock_fence, lock_holder) VALUES ($2, $1, $3, $4)"),
            "{upsert}"
        );
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
