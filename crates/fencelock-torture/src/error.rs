//! The one error type of the engine.

use std::fmt;

/// A torture run that could not be carried out (a violation found by the
/// checkers is not an error: it is in the [`crate::Report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// What kind of failure an [`Error`] is, for choosing an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration was refused before anything ran (a nemesis the
    /// topology cannot inject, a bad option).
    Usage,
    /// A server could not be reached.
    Unreachable,
    /// A server refused us for a reason retrying cannot fix: refused
    /// credentials, a missing permission, a TLS setting it rejects.
    Config,
    /// A history file could not be read or parsed.
    History,
    /// Anything else: a worker could not be started, a process misbehaved.
    Failed,
}

/// The engine's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with a one-line `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into().replace('\n', " "),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The one-line message (also the `Display` form).
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Usage, message)
    }

    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Failed, message)
    }

    /// A lock client that could not connect: [`ErrorKind::Config`] when
    /// the deployment refused us (credentials, permissions, TLS), else
    /// [`ErrorKind::Unreachable`].
    pub(crate) fn connect(e: &fencelock::Error) -> Self {
        let kind = if e.is_config() {
            ErrorKind::Config
        } else {
            ErrorKind::Unreachable
        };
        Error::new(kind, e.to_string())
    }

    /// A connection error, with the URL shown without its password.
    pub(crate) fn redis(url: &str, e: &redis::RedisError) -> Self {
        let shown = fencelock::redact_url(url);
        Error::new(
            ErrorKind::Unreachable,
            format!(
                "Redis at {shown}: {}",
                fencelock::redact_url_in(&e.to_string(), url)
            ),
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::failed(e.to_string())
    }
}
