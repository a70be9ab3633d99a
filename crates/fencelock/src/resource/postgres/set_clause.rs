//! [`SetClause`]: the `SET` part of a fenced `UPDATE` (or the values of an
//! upsert), and the `$N` placeholder check of its trusted SQL.

use std::fmt;

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::{Arguments, Encode, SqlSafeStr, SqlStr, Type};

use super::ident::quote_ident;
use super::{FENCE_COLUMN, HOLDER_COLUMN};
use crate::error::{Error, Result};

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
    pub(super) fn render(&self) -> Result<(String, PgArguments)> {
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
    pub(super) fn render_values(&self) -> Result<(Vec<(String, usize)>, PgArguments)> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
