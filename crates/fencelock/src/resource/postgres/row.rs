//! [`FencedRow`]: one row of a [`FencedTable`] behind the [`Fenced`] trait.

use sqlx::postgres::PgExecutor;

use super::{FencedTable, RowFence, RowKey, SetClause};
use crate::error::Result;
use crate::fence::Fence;
use crate::resource::{Fenced, ValidatedRead, WriteOutcome};

/// One row of a [`FencedTable`], for code written against [`Fenced`]
/// (`write` = the [`SetClause`] of a conditional `UPDATE`, run on the
/// table's pool). Created by [`FencedTable::row`].
#[derive(Debug, Clone)]
pub struct FencedRow<K> {
    table: FencedTable,
    key: K,
}

impl FencedTable {
    /// A handle on one row, for code written against the [`Fenced`] trait
    /// (its writes run on the table's pool).
    pub fn row<K>(&self, key: K) -> FencedRow<K> {
        FencedRow {
            table: self.clone(),
            key,
        }
    }
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

impl<K: RowKey> FencedRow<K> {
    /// [`FencedTable::read_validated`] of this row, on `executor` (`&pool`,
    /// `&mut *conn` or `&mut *tx`: the transaction of your read, see
    /// "Validated reads" on [`FencedTable`]); call it after reading your
    /// columns.
    ///
    /// # Errors
    /// As [`FencedTable::read_validated`].
    pub async fn read_validated<'c>(
        &self,
        executor: impl PgExecutor<'c>,
        epoch: Fence,
    ) -> Result<ValidatedRead<Option<RowFence>>> {
        self.table.read_validated(executor, &self.key, epoch).await
    }
}

impl<K: RowKey> Fenced for FencedRow<K> {
    /// The assignments of the conditional `UPDATE`.
    type Write = SetClause;

    /// [`FencedTable::update`] of this row, on the table's pool.
    fn fenced_write(
        &self,
        fence: Fence,
        holder: &str,
        set: &SetClause,
    ) -> impl Future<Output = Result<WriteOutcome>> + Send {
        self.table
            .update(self.table.pool(), &self.key, fence, holder, set)
    }
}
