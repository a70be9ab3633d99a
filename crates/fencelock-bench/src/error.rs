//! The one error type of the engine, and what it keeps out of its message.

use std::fmt;

use crate::url::RedisUrl;

/// A failed bench run: what kind of failure, and a one-line message.
///
/// The message never contains the Redis password: the engine names the
/// server only by its redacted URL, and [`crate::run`] scrubs the URL and the
/// password out of the text of every underlying error (which is why the
/// error keeps no [`source`](std::error::Error::source): those errors may
/// name the raw URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// What kind of failure an [`Error`] is, for choosing an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The URL or another input was rejected before anything was measured.
    InvalidInput,
    /// Redis refused the credentials.
    Auth,
    /// Redis could not be reached, or a connection to it broke.
    Unreachable,
    /// A measurement failed otherwise: the lock library reported an error, a
    /// floor script misbehaved, a worker panicked.
    Failed,
}

/// The engine's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The one-line message (also the `Display` form).
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into().replace('\n', " "),
        }
    }

    /// A failed measurement with `message`.
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Failed, message)
    }

    /// An error from connecting to Redis: credentials refused, a URL this
    /// build cannot use, or else an unreachable server (as the library
    /// classifies its own connection errors).
    pub(crate) fn connecting(url: &RedisUrl, e: redis::RedisError) -> Self {
        let kind = if is_auth(&e) {
            ErrorKind::Auth
        } else if e.kind() == redis::ErrorKind::InvalidClientConfig {
            ErrorKind::InvalidInput
        } else {
            ErrorKind::Unreachable
        };
        Error::new(kind, format!("cannot connect to {url}: {e}"))
    }

    /// The error as shown: every trace of `url`'s password removed from its
    /// message, and a connection error that does not name the server yet
    /// (a refusal on an open connection) naming it.
    pub(crate) fn shown_for(self, url: &RedisUrl) -> Self {
        let message = url.scrub(&self.message);
        let message = match self.kind {
            ErrorKind::Auth | ErrorKind::Unreachable if !message.contains(url.shown()) => {
                format!("Redis at {url}: {message}")
            }
            _ => message,
        };
        Error::new(self.kind, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

fn is_auth(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// Errors on an open connection: a broken connection is `Unreachable`.
impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        let kind = if is_auth(&e) {
            ErrorKind::Auth
        } else if e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_timeout()
        {
            ErrorKind::Unreachable
        } else {
            ErrorKind::Failed
        };
        Error::new(kind, e.to_string())
    }
}

impl From<fencelock::Error> for Error {
    fn from(e: fencelock::Error) -> Self {
        let kind = match &e {
            fencelock::Error::Auth { .. } => ErrorKind::Auth,
            e if e.is_connection() => ErrorKind::Unreachable,
            e if e.is_invalid_input() => ErrorKind::InvalidInput,
            _ => ErrorKind::Failed,
        };
        Error::new(kind, e.to_string())
    }
}

/// Runtimes and threads that could not be started.
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::failed(format!("cannot start a bench runtime: {e}"))
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::failed(format!("a bench task failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_errors_keep_the_kind_drop_the_password_and_name_the_server() {
        let url = RedisUrl::new("unix:///run/redis.sock?pass=hunter2");
        let e = Error::new(
            ErrorKind::Auth,
            "refused for unix:///run/redis.sock?pass=hunter2",
        )
        .shown_for(&url);
        assert_eq!(e.kind(), ErrorKind::Auth);
        assert_eq!(e.to_string(), "refused for unix:///run/redis.sock?pass=***");
        let e = Error::new(ErrorKind::Auth, "NOAUTH: Authentication required.").shown_for(&url);
        assert_eq!(
            e.to_string(),
            "Redis at unix:///run/redis.sock?pass=***: NOAUTH: Authentication required."
        );
        let e = Error::failed("a floor grant was refused").shown_for(&url);
        assert_eq!(e.to_string(), "a floor grant was refused");
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(Error::failed("a\nb").message(), "a b");
    }
}
