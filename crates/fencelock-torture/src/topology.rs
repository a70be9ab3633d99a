//! Where the locks live: the [`Topology`] trait, the one seam between the
//! engine and the servers.
//!
//! The engine needs from a topology the URLs (locks, and the Redis
//! resource), and — for server-side nemeses — control of the server that
//! holds the locks: pause, resume, kill, restart with or without its data.
//! Administrative commands (`DEBUG SLEEP`, `CLIENT PAUSE`, `SCRIPT FLUSH`,
//! `CLIENT KILL`) the engine sends itself on [`Topology::admin_url`].
//!
//! Implementations:
//!
//! - [`Remote`] (here): a deployment given with `--redis URL`. No server
//!   control: only client-side nemeses.
//! - the single private redis-server of `fencelock torture` (in the CLI,
//!   which owns the processes it starts: `fencelock-cli/src/torture_topology.rs`).
//!
//! Sentinel and Cluster plug in as further implementations in the CLI: their
//! `lock_url` is the `redis+sentinel://` or `redis+cluster://` URL, the
//! node-level calls act on the current primary (of the lock's shard), and
//! [`Topology::failover`] (a default method that refuses) triggers a
//! failover; the engine then offers [`crate::NemesisKind`]s that need it.

use std::future::Future;
use std::time::Duration;

use crate::config::NemesisKind;
use crate::error::{Error, Result};

/// The servers of a run. Methods that act on processes are only called when
/// [`Topology::controls_server`] is true.
#[allow(async_fn_in_trait)]
pub trait Topology {
    /// A short name for reports and the history (`single`, `remote`).
    fn name(&self) -> &str;

    /// The URL of the lock server, password included (workers connect to it
    /// through the proxy; the observer directly). Never shown.
    fn lock_url(&self) -> &str;

    /// Where administrative commands go (the current primary).
    fn admin_url(&self) -> &str {
        self.lock_url()
    }

    /// The URL of the Redis that holds the Redis resource. A topology with
    /// server-side nemeses gives a separate server that no nemesis touches,
    /// so that its audit survives the faults of the lock server.
    fn resource_url(&self) -> &str;

    /// Whether the engine may stop, kill and restart the lock server and
    /// send it administrative commands.
    fn controls_server(&self) -> bool;

    /// Whether `kind` can be injected here.
    fn supports(&self, kind: NemesisKind) -> bool {
        self.controls_server() || !kind.needs_server_control()
    }

    /// SIGSTOP the lock server.
    fn pause(&mut self) -> impl Future<Output = Result<()>>;

    /// SIGCONT the lock server.
    fn resume(&mut self) -> impl Future<Output = Result<()>>;

    /// kill -9 the lock server, wait `down`, and start it again on the same
    /// port, with its data (`keep_data`) or empty (as a Redis without
    /// persistence would come back); returns once it answers.
    fn restart(&mut self, keep_data: bool, down: Duration) -> impl Future<Output = Result<()>>;

    /// Makes another node the primary (Sentinel, Cluster).
    fn failover(&mut self) -> impl Future<Output = Result<()>> {
        async { Err(Error::usage("this topology has no failover")) }
    }
}

/// A deployment the user gave (`--redis URL`): client-side nemeses only.
#[derive(Debug, Clone)]
pub struct Remote {
    url: String,
}

impl Remote {
    /// The deployment at `url` (locks and the Redis resource both live there,
    /// under the run's prefix).
    pub fn new(url: impl Into<String>) -> Self {
        Remote { url: url.into() }
    }
}

impl Topology for Remote {
    fn name(&self) -> &str {
        "remote"
    }

    fn lock_url(&self) -> &str {
        &self.url
    }

    fn resource_url(&self) -> &str {
        &self.url
    }

    fn controls_server(&self) -> bool {
        false
    }

    async fn pause(&mut self) -> Result<()> {
        Err(refused())
    }

    async fn resume(&mut self) -> Result<()> {
        Err(refused())
    }

    async fn restart(&mut self, _keep_data: bool, _down: Duration) -> Result<()> {
        Err(refused())
    }
}

fn refused() -> Error {
    Error::usage("a deployment given with --redis is never paused, killed or restarted")
}
