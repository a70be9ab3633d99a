//! [`Probe`]: a caller's readiness check of a freshly started server, for
//! servers the crate's own checks cannot reach (TLS): run until it returns
//! `Ok`, on a [`RedisTarget`] or an [`EtcdTarget`].

use std::path::PathBuf;
use std::sync::Arc;

/// A redis-server a [`Probe`] checks: its port, pid and directory.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    /// The port it listens on (TLS or plain).
    pub port: u16,
    /// Its process id.
    pub pid: u32,
    /// Its directory (whose `tls/` holds the TLS files).
    pub dir: PathBuf,
}

/// An etcd member a [`Probe`] checks: its client endpoint
/// (`http://127.0.0.1:PORT`, `https://` with TLS) and the cluster's
/// directory (whose `tls/` holds the TLS files).
#[derive(Debug, Clone)]
pub struct EtcdTarget {
    /// The member's client endpoint.
    pub endpoint: String,
    /// The cluster's directory.
    pub dir: PathBuf,
}

/// A readiness check of a server described by a `T`.
pub struct Probe<T>(Arc<ProbeFn<T>>);

/// The function of a [`Probe`].
type ProbeFn<T> = dyn Fn(&T) -> Result<(), String> + Send + Sync;

impl<T> Probe<T> {
    /// A probe from a function.
    pub fn new(probe: impl Fn(&T) -> Result<(), String> + Send + Sync + 'static) -> Self {
        Probe(Arc::new(probe))
    }

    /// Runs the probe.
    ///
    /// # Errors
    ///
    /// Why the server is not ready yet.
    pub fn check(&self, target: &T) -> Result<(), String> {
        (self.0)(target)
    }
}

impl<T> Clone for Probe<T> {
    fn clone(&self) -> Self {
        Probe(Arc::clone(&self.0))
    }
}

impl<T> std::fmt::Debug for Probe<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe(..)")
    }
}
