//! sqlx's errors as fencelock's [`Error::Postgres`]: whether the connection
//! failed (not the statement) and whether a retry may cure it are decided
//! here, once, from the error and its SQLSTATE.

use crate::error::{DriverError, Error};

impl From<sqlx::Error> for Error {
    /// Any error of the Postgres client as [`Error::Postgres`], with its
    /// SQLSTATE as [`DriverError::code`]; `?` on an sqlx call (a
    /// transaction's `begin` or `commit`, say) in a function that returns
    /// fencelock's error uses it.
    fn from(e: sqlx::Error) -> Self {
        let message = e.to_string();
        let code = match &e {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        let (transient, connection) = (is_transient(&e), is_connection(&e));
        let error = DriverError::new(e, message, code);
        Error::Postgres(if transient {
            error.transient(connection)
        } else {
            error
        })
    }
}

/// Postgres failures where the connection (not the statement) failed:
/// I/O errors, pool timeouts, and SQLSTATE class 08 (connection exception)
/// and 57P01–57P03 (the server is shutting down, the backend was terminated,
/// or the server cannot accept connections yet).
fn is_connection(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// Postgres failures that a retry may cure: connection failures, and
/// serialization failures / deadlocks (40001, 40P01) and too many connections
/// (53300).
fn is_transient(e: &sqlx::Error) -> bool {
    is_connection(e)
        || matches!(e, sqlx::Error::Database(db) if db
            .code()
            .is_some_and(|code| matches!(&*code, "40001" | "40P01" | "53300")))
}
