//! The store: everything that talks to the servers holding the locks, and
//! nothing else — I/O only, no lock semantics and no client-side policy.
//! Its callers (the engine, the resources, the audit) reach Redis and etcd
//! only through typed calls defined here.
//!
//! | module | concern |
//! |---|---|
//! | `redis` | the Redis store: typed script calls, the Lua scripts, the data kept in Redis, connections to one server, Sentinel and Cluster, pub/sub |
//! | `etcd` | the etcd store (feature `etcd`): the connection, keys, the grant transactions, the queue and its watch, keep-alive and release, `FencedKey`'s transactions |
//! | `tls` | the CA and client certificate of TLS URLs; what a failed handshake means |
//! | `url` | URLs without their credentials |
//!
//! It imports only the modules below it (errors, fences, keys, options,
//! metrics), never the engine, the lease or the client.

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod redis;
pub(crate) mod tls;
pub(crate) mod url;

use std::time::Duration;

use crate::error::LossReason;
use tls::TlsFiles;

pub use url::{redact, redact_url_in};

/// Connection settings chosen by the client builder.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// TLS files for `rediss` and `etcds` URLs (for sentinels and data
    /// nodes alike).
    pub(crate) tls: TlsFiles,
}

impl Default for ConnSettings {
    /// 2 s to connect, 5 s for any reply, the system's TLS roots.
    fn default() -> Self {
        ConnSettings {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            tls: TlsFiles::default(),
        }
    }
}

/// The reply of an ownership-checked call (release, extend, keep-alive),
/// on any store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The lock was ours; the call did its work.
    Done,
    /// The lock was not ours; nothing was changed.
    NotOurs(LossReason),
}

/// Whether `url` names an etcd cluster (`etcd://`, `etcds://`).
pub(crate) fn is_etcd_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("etcd://") || lower.starts_with("etcds://")
}
