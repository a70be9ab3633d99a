//! Fenced Postgres rows (feature `postgres`): [`FencedTable`], [`SetClause`],
//! [`FencedRow`], [`RowFence`], [`RowKey`].
//!
//! The user-facing documentation (schema, the rule in SQL, which operation
//! to use, pools and transactions, faults, SQL injection) is on
//! [`FencedTable`], because this module is not public; the types are
//! re-exported at the crate root.
//!
//! | file | holds |
//! |---|---|
//! | `table.rs` | [`FencedTable`] and its operations, [`RowFence`] |
//! | `row.rs` | [`FencedRow`], the [`Fenced`](crate::Fenced) trait on one row |
//! | `set_clause.rs` | [`SetClause`] and the check of its `$N` placeholders |
//! | `sql.rs` | the statement texts, the acceptance rule in SQL (once), fence ↔ `bigint` |
//! | `ident.rs` | identifier checking and quoting |
//! | `errors.rs` | sqlx's errors as [`Error::Postgres`](crate::Error::Postgres), classified once |

use std::fmt;

use sqlx::{Encode, Postgres, Type};

mod errors;
mod ident;
mod row;
mod set_clause;
mod sql;
mod table;

pub use row::FencedRow;
pub use set_clause::SetClause;
pub use table::{FencedTable, RowFence};

/// The column that records the fence of the last accepted write (`bigint`).
pub const FENCE_COLUMN: &str = "lock_fence";

/// The column that records the public holder id
/// ([`holder_id`](crate::holder_id) of the token) of the last accepted write
/// (`text`); never the token itself.
pub const HOLDER_COLUMN: &str = "lock_holder";

/// A key that finds a row of a [`FencedTable`]: any value sqlx can bind as
/// a Postgres parameter (`i64`, `&str`, `String`, a reference to one, …)
/// that may cross tasks (`Send + Sync`) and can be named in an error
/// ([`Error::RowNotFound`](crate::Error::RowNotFound) shows its `Debug`
/// form).
///
/// Implemented for every such type: there is nothing to implement, and the
/// trait only names the bound that every [`FencedTable`] operation and
/// [`FencedRow`] put on their key.
///
/// ```
/// fn takes_key(_key: impl fencelock::RowKey) {}
///
/// takes_key(42_i64);
/// takes_key("INV-42");
/// takes_key(String::from("INV-42"));
/// ```
pub trait RowKey: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug {}

impl<K> RowKey for K where
    K: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send + Sync + fmt::Debug
{
}
