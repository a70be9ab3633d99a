//! SQL identifiers: checked, then always sent quoted, so a table or column
//! name is taken exactly as given and can never carry SQL.

use crate::error::{Error, Result};

/// Longest identifier Postgres keeps (`NAMEDATALEN - 1`); longer names are
/// silently truncated by the server, so they are refused here.
const MAX_IDENT_LEN: usize = 63;

/// `"part"` for one identifier, after checking it.
///
/// # Errors
/// [`Error::InvalidName`] for an empty or over-long name, a double quote or
/// a control character.
pub(super) fn quote_ident(name: &str) -> Result<String> {
    let reject = |reason| Err(Error::invalid_name(name, reason));
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
///
/// # Errors
/// [`Error::InvalidName`] for more than two parts, or a part refused by
/// [`quote_ident`].
pub(super) fn quote_table(table: &str) -> Result<String> {
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 {
        return Err(Error::invalid_name(
            table,
            "a table name has at most two parts: schema.table",
        ));
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
}
