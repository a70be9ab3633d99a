//! [`DriverError`]: the error of a client library (redis-rs, etcd-client,
//! sqlx), converted where it happens, with what is known of it then.

/// An error of a client library fencelock talks through (redis-rs for
/// Redis, etcd-client for etcd, sqlx for Postgres), as carried by
/// [`Error::Redis`](crate::Error::Redis), [`Error::Unreachable`](crate::Error::Unreachable), [`Error::Auth`](crate::Error::Auth), `Error::Etcd`
/// and `Error::Postgres`.
///
/// Its text is the library's message (for Redis, without the script
/// internals that a failed script call adds); [`DriverError::code`] is the
/// server's error code; and `source()` is the library's own error, for
/// whoever needs more of it:
///
/// ```
/// use std::error::Error as _;
///
/// /// The redis-rs error kind behind `e`, if redis-rs reported it.
/// fn redis_kind(e: &fencelock::DriverError) -> Option<redis::ErrorKind> {
///     let redis = e.source()?.downcast_ref::<redis::RedisError>()?;
///     Some(redis.kind())
/// }
/// ```
///
/// (The downcast finds the type when your crate uses the same version of
/// the library as fencelock; `fencelock::sqlx` re-exports fencelock's sqlx.)
#[derive(Debug)]
pub struct DriverError {
    message: String,
    code: Option<String>,
    /// A retry may cure it.
    pub(super) transient: bool,
    /// The connection failed, not the request.
    pub(super) connection: bool,
    /// Credentials, roles or the deployment must be fixed.
    pub(super) config: bool,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl DriverError {
    /// Wraps `source`, shown as `message`, with what the converting layer
    /// knows of it.
    pub(crate) fn new(
        source: impl std::error::Error + Send + Sync + 'static,
        message: String,
        code: Option<String>,
    ) -> Self {
        DriverError {
            message,
            code,
            transient: false,
            connection: false,
            config: false,
            source: Box::new(source),
        }
    }

    /// Marks the failure as one a retry may cure; `connection`: the
    /// connection failed, not the request.
    pub(crate) fn transient(mut self, connection: bool) -> Self {
        self.transient = true;
        self.connection = connection;
        self
    }

    /// Marks the failure as one that credentials, roles or the deployment
    /// must fix.
    #[cfg(feature = "etcd")]
    pub(crate) fn needs_config(mut self) -> Self {
        self.config = true;
        self
    }

    /// The server's error code, when it sent one: the Redis error code
    /// (`READONLY`, `NOSCRIPT`, `WRONGPASS`, …), the Postgres SQLSTATE
    /// (`40001`, …), or the name of etcd's gRPC status code
    /// (`Unavailable`, …).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// Whether the converting layer judged the failure one that a credential,
    /// role or deployment fix must cure (etcd's refused users and roles).
    #[cfg(feature = "etcd")]
    pub(crate) fn is_config(&self) -> bool {
        self.config
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
