//! The one error type of the library, and what a caller can do about each
//! error ([`Retry`], from which every predicate derives).
//!
//! The errors of the client libraries fencelock talks through (redis-rs,
//! etcd-client, sqlx) are converted where they happen, in the store and the
//! resources, into a [`DriverError`] that keeps their message, their code
//! and the original error as its `source()`, and knows already whether the
//! failure may pass. So this module names no dependency's error type and
//! needs nothing from the layers above it.

use std::time::Duration;

use crate::fence::Fence;

mod driver;

pub use driver::DriverError;

/// Everything that can go wrong when taking, keeping or using a lock.
///
/// Use [`Error::retry`] and the predicates ([`Error::is_retryable`],
/// [`Error::is_contended`], [`Error::is_lost`], …) rather than matching
/// variants where you can: the enum is `#[non_exhaustive]` and grows with
/// new backends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock or resource name was rejected before anything was sent.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (possibly truncated for display).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An option (ttl, renewal interval, fence, URL, …) was rejected before
    /// anything was sent.
    #[error("invalid option: {0}")]
    InvalidOption(String),

    /// `try_acquire` (or `acquire` with a wait of zero) found the lock held.
    #[error("lock {name:?} is held by another holder{}", lease_left(remaining))]
    Contended {
        /// The lock name.
        name: String,
        /// The current holder's remaining lease as reported by Redis, if known.
        remaining: Option<Duration>,
    },

    /// `acquire` waited for its whole wait deadline without getting the lock.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// A grant arrived with too little validity left to be useful (the reply
    /// took most of the ttl). The grant was released again.
    #[error("lock {name:?} was granted too late: the reply took {elapsed:?} of a {ttl:?} lease")]
    GrantTooLate {
        /// The lock name.
        name: String,
        /// Time from sending the grant request to receiving its reply.
        elapsed: Duration,
        /// The requested lease ttl.
        ttl: Duration,
    },

    /// A grant was acknowledged by fewer replicas than
    /// [`LockOptions::wait_for_replicas`](crate::LockOptions::wait_for_replicas)
    /// asked for, in time. The grant was released again.
    #[error(
        "lock {name:?} was granted but only {acked} of {wanted} replicas acknowledged it in time; it was released again (a failover could have lost it)"
    )]
    NotReplicated {
        /// The lock name.
        name: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// A renewal (with [`LockOptions::wait_for_replicas`](crate::LockOptions::wait_for_replicas))
    /// was applied on the primary but acknowledged by fewer replicas than
    /// asked for, in time: the lease keeps its earlier deadline, since a
    /// failover now could lose the renewal and expire the lock on the new
    /// primary before the later one. The keeper retries until then.
    #[error(
        "the renewal of lock {name:?} was applied on the primary, but only {acked} of {wanted} replicas acknowledged it in time: the lease keeps its earlier deadline (a failover could lose the renewal)"
    )]
    RenewalNotReplicated {
        /// The lock name.
        name: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// A fenced write was applied on the primary but acknowledged by fewer
    /// replicas than asked for, in time: a failover now could lose it.
    /// Writing again with the same fence and holder is accepted.
    #[error(
        "the write to {resource:?} was applied on the primary, but only {acked} of {wanted} replicas acknowledged it in time: a failover now could lose it"
    )]
    WriteNotReplicated {
        /// The resource key.
        resource: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// A revoke took the lock away (or found it free) and minted its
    /// revocation fence, but could not seal one of the resources: until it
    /// is sealed at `fence` (a seal is idempotent: `seal(fence)` on it
    /// again), that resource may still accept the deposed holder's writes.
    /// The other resources were sealed or tried; the error names the first
    /// that failed.
    #[error(
        "lock {name:?} was revoked (revocation fence {fence}), but resource {resource:?} was not sealed: {source}; until it is sealed at fence {fence}, it may still accept the deposed holder's writes"
    )]
    RevokeIncomplete {
        /// The lock name.
        name: String,
        /// The revocation fence.
        fence: Fence,
        /// The resource that was not sealed.
        resource: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// A revoke was applied on the primary and its resources were sealed,
    /// but fewer replicas than asked for acknowledged it in time: a
    /// failover now could give the deposed holder its lock back (its writes
    /// stay refused at the sealed resources).
    #[error(
        "lock {name:?} was revoked on the primary (revocation fence {fence}) and its resources were sealed, but only {acked} of {wanted} replicas acknowledged the revoke in time: a failover now could give the deposed holder its lock back (its writes stay refused at the sealed resources)"
    )]
    RevokeNotReplicated {
        /// The lock name.
        name: String,
        /// The revocation fence.
        fence: Fence,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// The lease was lost while the holder still worked: renewal failed, the
    /// local deadline passed, or the lock was no longer ours at release.
    #[error("lock {name:?} (fence {fence}) was lost while held: {reason}")]
    LockLost {
        /// The lock name.
        name: String,
        /// The fence of the lost lease; writes carrying it may be rejected.
        fence: Fence,
        /// What revealed the loss.
        reason: LossReason,
    },

    /// The name is in use as another kind of lock: a mutex, a semaphore
    /// or a read-write lock asked for a name held as one of the others.
    /// One name is one kind while it has holders. Nothing was changed.
    #[error(
        "lock {name:?} is held as a {held}, but was asked for as a {asked}; nothing was changed - one name is one kind of lock: give the {asked} another name"
    )]
    KindConflict {
        /// The lock name.
        name: String,
        /// The kind it is held as: `"mutex"`, `"semaphore"` or
        /// `"read-write lock"`.
        held: &'static str,
        /// The kind asked for.
        asked: &'static str,
    },

    /// A semaphore was asked for with another permit count than the one its
    /// holders use. Nothing was changed; once the last holder is gone, the
    /// next grant sets the count.
    #[error(
        "semaphore {name:?} has {held} permits while it has holders, but was asked for with {asked}; nothing was changed - use one permit count for a name everywhere"
    )]
    PermitsConflict {
        /// The semaphore's name.
        name: String,
        /// The count its holders use.
        held: u32,
        /// The count asked for.
        asked: u32,
    },

    /// A key that fencelock uses holds a value of another Redis type (or a
    /// fence key holds a non-integer). Nothing was overwritten.
    #[error(
        "key {key:?} holds data fencelock did not write ({detail}); nothing was changed - remove or rename it, or choose another prefix"
    )]
    WrongType {
        /// The offending key.
        key: String,
        /// The server's message.
        detail: String,
    },

    /// The Redis user lacks a permission fencelock needs (its ACL rule).
    #[error(
        "the Redis user may not {detail}: add {fix} to its ACL rule (the README's \"Redis permissions\" lists what fencelock needs)"
    )]
    NoPermission {
        /// What it may not do, e.g. "run the command TIME".
        detail: String,
        /// What to add to the user's ACL rule, e.g. "+time".
        fix: String,
    },

    /// A TLS connection to Redis (or etcd) could not be set up: the
    /// server's certificate is not trusted, not valid for the host or
    /// expired, a client certificate is required, or the port does not
    /// speak TLS.
    #[error("TLS with {url} failed: {detail}")]
    Tls {
        /// The URL, with any password removed.
        url: String,
        /// What failed and what to do.
        detail: String,
    },

    /// The Redis deployment cannot be used as configured (for example, the
    /// URL names a database the server does not have).
    #[error("Redis at {url} cannot be used as configured: {detail}")]
    Config {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong.
        detail: String,
    },

    /// Redis could not be reached (connection refused, timed out, dropped),
    /// or it answered that it takes no writes for now: a replica
    /// (`READONLY`, an old master demoted by a failover), a replica cut off
    /// from its master (`MASTERDOWN`), a server loading its data
    /// (`LOADING`), a master with too few good replicas under
    /// `min-replicas-to-write` (`NOREPLICAS`). Then [`DriverError::code`] is
    /// that code. Either may pass: a waiting `acquire` keeps waiting.
    #[error("{}", unreachable(url, source))]
    Unreachable {
        /// The URL, with any password removed.
        url: String,
        /// The Redis client's error.
        #[source]
        source: DriverError,
    },

    /// Redis refused the credentials.
    #[error("Redis at {url} refused authentication: {source}")]
    Auth {
        /// The URL, with any password removed.
        url: String,
        /// The Redis client's error.
        #[source]
        source: DriverError,
    },

    /// etcd could not be reached, had no leader, refused a request or failed
    /// it (feature `etcd`). [`Error::is_connection`] is true for an outage
    /// that may pass (unreachable, no leader, timed out, leader changed),
    /// [`Error::is_config`] for refused credentials or roles.
    #[cfg(feature = "etcd")]
    #[error("etcd at {url}: {detail}")]
    Etcd {
        /// The URL, with any password removed.
        url: String,
        /// What failed, and what to do.
        detail: String,
        /// The etcd client's error (its gRPC status name as
        /// [`DriverError::code`]).
        #[source]
        source: DriverError,
    },

    /// Any other error reported by Redis or the client ([`DriverError::code`]
    /// is the Redis error code, such as `READONLY`).
    #[error("Redis error: {0}")]
    Redis(#[source] DriverError),

    /// Redis answered a script with a reply of an unexpected shape.
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(String),

    /// A fenced table lacks the `lock_fence` / `lock_holder` columns. Nothing
    /// was written.
    #[error(
        "table {table} has no lock_fence/lock_holder columns, so it cannot check fences: run the migration first (FencedTable::add_fence_columns, or `ALTER TABLE {table} ADD COLUMN IF NOT EXISTS lock_fence bigint, ADD COLUMN IF NOT EXISTS lock_holder text`)"
    )]
    MissingFenceColumns {
        /// The table name, as given.
        table: String,
    },

    /// A fenced update or registration named a row that does not exist.
    /// Nothing was written; use an insert-or-update (`upsert`) for rows that
    /// may not exist yet.
    #[error("no row with {key_column} = {key} in table {table}; nothing was written")]
    RowNotFound {
        /// The table.
        table: String,
        /// The key column.
        key_column: String,
        /// The key that was looked up, as shown by its `Debug` form.
        key: String,
    },

    /// Any error reported by Postgres or the Postgres client (connection
    /// lost, statement failed, ...). Fenced statements are atomic: nothing was
    /// written in part. A statement that failed in the database wrote
    /// nothing; after a lost connection ([`Error::is_connection`]) the
    /// outcome is unknown, as with any database call whose reply is lost.
    /// [`DriverError::code`] is the SQLSTATE, when the database sent one.
    #[cfg(feature = "postgres")]
    #[error("Postgres error: {0}")]
    Postgres(#[source] DriverError),
}

/// Why a lease was declared lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Renewal found the lock expired (absent) in the store: the Redis key,
    /// or the etcd lease.
    Expired,
    /// Renewal or release found another holder's token in the lock (on
    /// etcd: the holder's key deleted or re-created while its lease lived).
    TakenOver,
    /// The local monotonic deadline passed before a renewal succeeded
    /// (the store slow or unreachable, or this process was paused).
    DeadlinePassed,
}

fn unreachable(url: &str, source: &DriverError) -> String {
    match source.code() {
        Some(_) => format!("Redis at {url} refuses writes for now: {source}"),
        None => format!("cannot reach Redis at {url}: {source}"),
    }
}

fn lease_left(remaining: &Option<Duration>) -> String {
    match remaining {
        Some(r) => format!(" (its lease ends in {} ms)", r.as_millis()),
        None => String::new(),
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::Expired => "the lock expired in the store",
            LossReason::TakenOver => "another holder took the lock",
            LossReason::DeadlinePassed => "the lease deadline passed before renewal succeeded",
        })
    }
}

/// What a caller can do about an [`Error`]: the one classification that
/// [`Error::is_retryable`] and the acquire loop's decisions derive from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retry {
    /// Retrying cannot help: the input, the configuration or the data must
    /// change first, or the lease is gone.
    Never,
    /// The lock is held by someone else: try again when it may be free,
    /// after `remaining` (the holder's time left) if it is known.
    WhenFree {
        /// The holder's remaining lease, as the store reported it.
        remaining: Option<Duration>,
    },
    /// A fault that may pass (the store unreachable, loading or failing
    /// over, a reply that came too late, too few replicas in time): try
    /// again after a backoff.
    AfterBackoff,
}

/// What an error is, beyond what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    InvalidInput,
    Contention,
    Loss,
    ResourceSetup,
    Other,
}

/// Everything the predicates tell, from one look at the variant.
#[derive(Debug, Clone, Copy)]
struct Class {
    retry: Retry,
    kind: Kind,
    /// The connection failed (not the request).
    connection: bool,
    /// The deployment or the data must be fixed.
    config: bool,
}

impl Class {
    const fn of(kind: Kind, retry: Retry) -> Self {
        Class {
            retry,
            kind,
            connection: false,
            config: false,
        }
    }

    const fn config() -> Self {
        Class {
            config: true,
            ..Class::of(Kind::Other, Retry::Never)
        }
    }

    /// A driver's error: its own flags say whether it may pass.
    fn driver(e: &DriverError) -> Self {
        Class {
            retry: if e.transient {
                Retry::AfterBackoff
            } else {
                Retry::Never
            },
            kind: Kind::Other,
            connection: e.connection,
            config: e.config,
        }
    }
}

impl Error {
    /// [`Error::InvalidName`] for `text`, shown by its first 64 characters
    /// (a huge name is not repeated back whole).
    pub(crate) fn invalid_name(text: &str, reason: &'static str) -> Error {
        Error::InvalidName {
            name: text.chars().take(64).collect(),
            reason,
        }
    }

    /// What to do about this error (see [`Retry`]).
    pub fn retry(&self) -> Retry {
        self.class().retry
    }

    /// The one match over the variants that every predicate reads.
    fn class(&self) -> Class {
        match self {
            Error::InvalidName { .. } | Error::InvalidOption(_) => {
                Class::of(Kind::InvalidInput, Retry::Never)
            }
            Error::Contended { remaining, .. } => Class::of(
                Kind::Contention,
                Retry::WhenFree {
                    remaining: *remaining,
                },
            ),
            Error::Timeout { .. } => {
                Class::of(Kind::Contention, Retry::WhenFree { remaining: None })
            }
            Error::RevokeIncomplete { source, .. } => source.class(),
            Error::GrantTooLate { .. }
            | Error::RevokeNotReplicated { .. }
            | Error::NotReplicated { .. }
            | Error::RenewalNotReplicated { .. }
            | Error::WriteNotReplicated { .. } => Class::of(Kind::Other, Retry::AfterBackoff),
            Error::LockLost { .. } => Class::of(Kind::Loss, Retry::Never),
            Error::WrongType { .. }
            | Error::KindConflict { .. }
            | Error::PermitsConflict { .. }
            | Error::NoPermission { .. }
            | Error::Tls { .. }
            | Error::Config { .. } => Class::config(),
            Error::Unreachable { .. } => Class {
                connection: true,
                ..Class::of(Kind::Other, Retry::AfterBackoff)
            },
            Error::Auth { .. } => Class {
                connection: true,
                ..Class::config()
            },
            Error::Redis(e) => Class::driver(e),
            #[cfg(feature = "etcd")]
            Error::Etcd { source, .. } => Class::driver(source),
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => Class::driver(e),
            Error::MissingFenceColumns { .. } | Error::RowNotFound { .. } => {
                Class::of(Kind::ResourceSetup, Retry::Never)
            }
            Error::UnexpectedReply(_) => Class::of(Kind::Other, Retry::Never),
        }
    }

    /// True when trying again later may succeed: contention, timeouts, late
    /// grants and transient connection problems (Redis or Postgres; for
    /// Postgres also serialization failures and deadlocks). False for bad
    /// input, wrong key types, authentication failures, lost leases and
    /// resource setup errors. The same as `retry() != Retry::Never`.
    pub fn is_retryable(&self) -> bool {
        self.retry() != Retry::Never
    }

    /// True when the lock was held by someone else (`Contended` or `Timeout`).
    pub fn is_contended(&self) -> bool {
        self.class().kind == Kind::Contention
    }

    /// True when a lease this caller held was lost.
    pub fn is_lost(&self) -> bool {
        self.class().kind == Kind::Loss
    }

    /// True when the input was rejected before anything was sent.
    pub fn is_invalid_input(&self) -> bool {
        self.class().kind == Kind::InvalidInput
    }

    /// True when Redis could not be reached or refused the credentials, or
    /// the connection to Postgres failed or was lost (a fenced Postgres
    /// statement is atomic, but whether it committed before the loss is
    /// unknown).
    pub fn is_connection(&self) -> bool {
        self.class().connection
    }

    /// True when the deployment or the data must be fixed before retrying:
    /// refused credentials, a missing permission, a key that holds data
    /// fencelock did not write, a database that does not exist.
    pub fn is_config(&self) -> bool {
        self.class().config
    }

    /// True when a fenced resource is not set up for fencing or lacks the
    /// addressed record ([`Error::MissingFenceColumns`],
    /// [`Error::RowNotFound`]): fix the data or the schema, do not retry.
    pub fn is_resource_setup(&self) -> bool {
        self.class().kind == Kind::ResourceSetup
    }
}

/// Convenience alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
