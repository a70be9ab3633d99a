//! What an audit is: rows ([`Check`]) with a [`Status`] each, for one URL
//! ([`Audit`]), and a reading that a missing permission turned into a row
//! instead of an error.

use std::fmt;

use crate::error::{Error, Result};

/// How a check came out. Ordered from best to worst, so the worst of several
/// is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// The deployment provides what fencelock assumes.
    Ok,
    /// Locks work and stay safe as far as fencelock can tell, but a
    /// guarantee is weaker than it could be, a feature is degraded, or the
    /// check could not be read.
    Warn,
    /// A guarantee fencelock documents does not hold here, or locks cannot
    /// work at all.
    Fail,
}

impl Status {
    /// `OK`, `WARN` or `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of an [`Audit`]: what was checked, how it came out, what was
/// found and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub(super) name: String,
    pub(super) status: Status,
    pub(super) found: String,
    pub(super) fix: Option<String>,
}

impl Check {
    pub(crate) fn ok(name: &str, found: impl Into<String>) -> Self {
        Check {
            name: name.to_owned(),
            status: Status::Ok,
            found: found.into(),
            fix: None,
        }
    }

    pub(crate) fn warn(name: &str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Check::ok(name, found)
        }
    }

    pub(crate) fn fail(name: &str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            status: Status::Fail,
            ..Check::warn(name, found, fix)
        }
    }

    /// The same check, named for one node of a multi-node deployment.
    pub(super) fn at(mut self, node: &str) -> Self {
        self.name = format!("{}@{node}", self.name);
        self
    }

    /// The check's name (`version`, `role`, … see the module docs); a check
    /// of one node of a multi-node deployment is named `CHECK@HOST:PORT`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it came out.
    pub fn status(&self) -> Status {
        self.status
    }

    /// What was found, in a sentence (never a password).
    pub fn found(&self) -> &str {
        &self.found
    }

    /// What to change, for a WARN or a FAIL.
    pub fn fix(&self) -> Option<&str> {
        self.fix.as_deref()
    }
}

/// The result of [`LockClient::audit`](crate::LockClient::audit): one
/// [`Check`] per row, in a fixed order.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::{LockClient, audit::Status};
///
/// let client = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let audit = client.audit().await?;
/// for check in audit.checks().iter().filter(|c| c.status() != Status::Ok) {
///     eprintln!("{} {}: {} ({})", check.status(), check.name(), check.found(), check.fix().unwrap_or(""));
/// }
/// if audit.worst() == Status::Fail {
///     // refuse to start
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Audit {
    url: String,
    checks: Vec<Check>,
}

impl Audit {
    pub(super) fn new(url: &str, checks: Vec<Check>) -> Self {
        Audit {
            url: url.to_owned(),
            checks,
        }
    }

    /// The audited URL, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every row, in order.
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// The row named `name`, if the audit has one.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The worst status of all rows ([`Status::Ok`] if there are none).
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }
}

/// A reply, or the permission the user lacks to get it.
pub(super) enum Reading<T> {
    Got(T),
    Refused(Error),
}

/// Keeps a refusal (a missing permission) as a [`Reading`]; any other error
/// ends the audit.
pub(super) fn reading<T>(result: Result<T>) -> Result<Reading<T>> {
    match result {
        Ok(value) => Ok(Reading::Got(value)),
        Err(e @ Error::NoPermission { .. }) => Ok(Reading::Refused(e)),
        Err(e) => Err(e),
    }
}
