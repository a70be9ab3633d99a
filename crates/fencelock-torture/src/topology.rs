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
//! - the replicated topologies of `fencelock torture --topology sentinel`
//!   and `--topology cluster` (in the CLI too): their `lock_url` is the
//!   `redis+sentinel://` or `redis+cluster://` URL, [`Topology::aim`]
//!   points the node-level calls at the current primary of a lock key's
//!   shard, [`Topology::replicas`] says how many replicas each shard has
//!   (the workers wait for all of them on every grant), and
//!   [`Topology::failover`] makes another node the primary.
//!
//! What a topology cannot do is refused before the run starts, with the
//! reason ([`Topology::refusal`]).

use std::future::Future;
use std::time::Duration;

use crate::config::NemesisKind;
use crate::error::{Error, Result};

/// The servers of a run. Methods that act on processes are only called when
/// [`Topology::controls_server`] is true.
#[allow(async_fn_in_trait)]
pub trait Topology {
    /// A short name for reports and the history (`single`, `sentinel`,
    /// `cluster`, `remote`).
    fn name(&self) -> &str;

    /// The URL of the lock server, password included (workers connect to it
    /// through the proxy; the observer directly). Never shown.
    fn lock_url(&self) -> &str;

    /// Where administrative commands go: the node the last
    /// [`Topology::aim`] chose (the lock server itself on a single server).
    fn admin_url(&self) -> &str {
        self.lock_url()
    }

    /// Points the node-level calls that follow (`pause`, `resume`,
    /// `restart`, `failover`, [`Topology::admin_url`]) at the current
    /// primary of the shard that holds `key` (a lock key of the run). A
    /// single server has nothing to choose.
    fn aim(&mut self, key: &str) -> impl Future<Output = Result<()>> {
        let _ = key;
        async { Ok(()) }
    }

    /// How many replicas each shard's primary has (0: no replication). On a
    /// replicated topology the workers wait for all of them on every grant
    /// (`LockOptions::wait_for_replicas`), a `failover` is possible, and a
    /// `kill-wipe` of the primary loses no acknowledged grant.
    fn replicas(&self) -> u32 {
        0
    }

    /// Whether every lock operation reaches Redis at the one address of
    /// [`Topology::lock_url`], so the fault proxy can stand in for it. A
    /// Sentinel or a Cluster hands the clients its nodes' addresses, which
    /// bypass a proxy.
    fn proxyable(&self) -> bool {
        true
    }

    /// The URL of the Redis that holds the Redis resource. A topology with
    /// server-side nemeses gives a separate server that no nemesis touches,
    /// so that its audit survives the faults of the lock server.
    fn resource_url(&self) -> &str;

    /// Whether the engine may stop, kill and restart the lock server and
    /// send it administrative commands.
    fn controls_server(&self) -> bool;

    /// Why `kind` cannot be injected here, or `None` if it can
    /// ([`refusal`] of this topology's name, server control, replicas and
    /// proxy).
    fn refusal(&self, kind: NemesisKind) -> Option<String> {
        refusal(
            kind,
            self.name(),
            self.controls_server(),
            self.replicas(),
            self.proxyable(),
        )
    }

    /// Whether `kind` can be injected here.
    fn supports(&self, kind: NemesisKind) -> bool {
        self.refusal(kind).is_none()
    }

    /// SIGSTOP the lock server.
    fn pause(&mut self) -> impl Future<Output = Result<()>>;

    /// SIGCONT the lock server.
    fn resume(&mut self) -> impl Future<Output = Result<()>>;

    /// kill -9 the lock server, wait `down`, and start it again on the same
    /// port, with its data (`keep_data`) or empty (as a Redis without
    /// persistence would come back); returns once it answers. On a
    /// replicated topology the restart without data is a crash of the
    /// primary instead: it stays down until a replica has replaced it, then
    /// comes back empty as a replica; see the implementations.
    fn restart(&mut self, keep_data: bool, down: Duration) -> impl Future<Output = Result<()>>;

    /// Makes a replica of the aimed primary the primary (Sentinel, Cluster)
    /// and returns once the new primary takes writes; returns what happened,
    /// in words (`127.0.0.1:7001 -> 127.0.0.1:7004`).
    fn failover(&mut self) -> impl Future<Output = Result<String>> {
        async { Err(Error::usage("this topology has no failover")) }
    }
}

/// Why `kind` cannot be injected on a topology called `name` that gives
/// control of its servers (`controls_server`) or not, has `replicas`
/// replicas per shard, and can (`proxyable`) or cannot have the fault proxy
/// in front; `None` if it can. What [`Topology::refusal`] says by default,
/// for deciding before any server is started.
pub fn refusal(
    kind: NemesisKind,
    name: &str,
    controls_server: bool,
    replicas: u32,
    proxyable: bool,
) -> Option<String> {
    if kind.needs_server_control() && !controls_server {
        return Some(format!(
            "{}: needs control of the Redis server, which a deployment given with --redis never gives",
            kind.name()
        ));
    }
    if kind == NemesisKind::Failover && replicas == 0 {
        return Some(format!(
            "{}: needs replicas to promote (--topology sentinel or cluster); the {name} topology has none",
            kind.name()
        ));
    }
    if kind.needs_proxy() && !proxyable {
        return Some(format!(
            "{}: the fault proxy cannot stand between the workers and a {name} topology (its clients are handed the nodes' own addresses, which bypass the proxy)",
            kind.name()
        ));
    }
    None
}

/// A deployment the user gave (`--redis URL`): client-side nemeses only.
#[derive(Debug, Clone)]
pub struct Remote {
    url: String,
    replicas: u32,
}

impl Remote {
    /// The deployment at `url` (locks and the Redis resource both live there,
    /// under the run's prefix).
    pub fn new(url: impl Into<String>) -> Self {
        Remote {
            url: url.into(),
            replicas: 0,
        }
    }

    /// Says that each shard of the deployment has `replicas` replicas: the
    /// workers then wait for them on every grant (unless
    /// [`crate::Config::replicas`] says fewer).
    pub fn with_replicas(mut self, replicas: u32) -> Self {
        self.replicas = replicas;
        self
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

    fn replicas(&self) -> u32 {
        self.replicas
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
