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
//! - [`Remote`] (here): a deployment given with `--redis URL` (or an etcd
//!   cluster given with `--url etcd://…`). No server control: only
//!   client-side nemeses.
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
//! - the private etcd cluster of `--topology etcd` (in the CLI too): three
//!   members; its `lock_url` is the `etcd://` URL of all three,
//!   [`Topology::aim`] picks the leader or a follower, and
//!   [`Topology::failover`] moves the Raft leadership.
//!
//! What a topology cannot do is refused before the run starts, with the
//! reason ([`Topology::refusal`]; [`Shape`] for deciding before any server
//! starts).

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::nemesis::NemesisKind;

/// The servers of a run. Methods that act on processes are only called when
/// [`Topology::controls_server`] is true.
#[allow(async_fn_in_trait)]
pub trait Topology {
    /// A short name for reports and the history (`single`, `sentinel`,
    /// `cluster`, `etcd`, `remote`).
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

    /// The node the last [`Topology::aim`] chose, in words for the history
    /// (`member m1 (leader) 127.0.0.1:2379`).
    fn aimed(&self) -> String {
        "the lock server".to_string()
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

    /// Whether the locks live on etcd (by default: whether
    /// [`Topology::lock_url`] is an `etcd://` or `etcds://` URL).
    fn etcd(&self) -> bool {
        is_etcd_url(self.lock_url())
    }

    /// What decides which nemeses and controls this topology can run.
    fn shape(&self) -> Shape<'_> {
        Shape {
            name: self.name(),
            etcd: self.etcd(),
            controls_server: self.controls_server(),
            replicas: self.replicas(),
            proxyable: self.proxyable(),
        }
    }

    /// Why `kind` cannot be injected here, or `None` if it can
    /// ([`refusal`] of this topology's [`Topology::shape`]).
    fn refusal(&self, kind: NemesisKind) -> Option<String> {
        refusal(kind, &self.shape())
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

    /// Makes a replica of the aimed primary the primary (Sentinel, Cluster;
    /// on etcd: moves the Raft leadership to another member) and returns
    /// once the new primary takes writes; returns what happened, in words
    /// (`127.0.0.1:7001 -> 127.0.0.1:7004`).
    fn failover(&mut self) -> impl Future<Output = Result<String>> {
        async { Err(Error::usage("this topology has no failover")) }
    }
}

/// What decides which nemeses and controls a topology can run: what
/// [`Topology::shape`] says, known before any server starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape<'a> {
    /// The topology's name (`single`, `sentinel`, `cluster`, `etcd`,
    /// `remote`).
    pub name: &'a str,
    /// Whether the locks live on etcd (`etcd://`, `etcds://`) instead of
    /// Redis.
    pub etcd: bool,
    /// Whether the engine may stop, kill and restart the lock servers.
    pub controls_server: bool,
    /// Replicas per shard that a grant can wait for (Redis replication;
    /// 0 on etcd, whose grants are committed by a quorum before the reply).
    pub replicas: u32,
    /// Whether the fault proxy can stand between the workers and the lock
    /// servers.
    pub proxyable: bool,
}

/// Whether `url` names etcd (`etcd://`, `etcds://`) rather than Redis.
pub fn is_etcd_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    scheme.eq_ignore_ascii_case("etcd") || scheme.eq_ignore_ascii_case("etcds")
}

/// Why `kind` cannot be injected on a topology of `shape`, or `None` if it
/// can. What [`Topology::refusal`] says, for deciding before any server is
/// started.
pub fn refusal(kind: NemesisKind, shape: &Shape<'_>) -> Option<String> {
    let name = shape.name;
    if shape.etcd
        && let Some(why) = not_on_etcd(kind)
    {
        return Some(format!("{}: {why}", kind.name()));
    }
    if kind.needs_server_control() && !shape.controls_server {
        let (servers, flag) = if shape.etcd {
            ("the etcd members", "--url")
        } else {
            ("the Redis server", "--redis")
        };
        return Some(format!(
            "{}: needs control of {servers}, which a deployment given with {flag} never gives",
            kind.name()
        ));
    }
    // etcd's leader change needs no replicas of Redis's kind: every member
    // holds every committed grant.
    if kind == NemesisKind::Failover && shape.replicas == 0 && !shape.etcd {
        return Some(format!(
            "{}: needs replicas to promote (--topology sentinel or cluster); the {name} topology has none",
            kind.name()
        ));
    }
    if kind.needs_proxy() && !shape.proxyable {
        return Some(format!(
            "{}: the fault proxy cannot stand between the workers and a {name} topology (a Sentinel or a Cluster hands its clients the nodes' own addresses, which bypass the proxy; TLS and Unix sockets cannot be proxied)",
            kind.name()
        ));
    }
    // Without the proxy, a worker's connections are found by the one
    // server's address; a given Sentinel or Cluster has several, a TLS or
    // Unix-socket URL none the tool can reach at that level.
    if kind == NemesisKind::ClientKill && !shape.controls_server && !shape.proxyable {
        return Some(format!(
            "{}: finds a worker's connections at the fault proxy, or at the one server of a plain redis:// URL; a deployment given with --redis as a Sentinel, Cluster, TLS or Unix-socket URL offers neither",
            kind.name()
        ));
    }
    None
}

/// Whether `url` is one the fault proxy can stand in for: a plain
/// `redis://` or `etcd://` URL (not TLS, not a Unix socket, not Sentinel or
/// Cluster, whose clients are handed the nodes' own addresses).
pub(crate) fn proxyable_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    scheme.eq_ignore_ascii_case("redis") || scheme.eq_ignore_ascii_case("etcd")
}

/// Whether `url` names a replicated Redis deployment by its form:
/// `redis+sentinel://`, `redis+cluster://` (and their TLS forms).
fn replicated_url(url: &str) -> bool {
    let scheme = url
        .split_once("://")
        .map_or(String::new(), |(s, _)| s.to_ascii_lowercase());
    matches!(
        scheme.as_str(),
        "redis+sentinel" | "rediss+sentinel" | "redis+cluster" | "rediss+cluster"
    )
}

/// Why a nemesis has no meaning on etcd, if it has none.
fn not_on_etcd(kind: NemesisKind) -> Option<&'static str> {
    match kind {
        NemesisKind::DebugSleep => Some(
            "DEBUG SLEEP is a Redis command; etcd has none like it (pause-server stalls an etcd member instead)",
        ),
        NemesisKind::ClientPause => Some(
            "CLIENT PAUSE is a Redis command; etcd has none like it (pause-server stalls an etcd member instead)",
        ),
        NemesisKind::ScriptFlush => {
            Some("SCRIPT FLUSH drops Redis's script cache; the etcd backend runs no scripts")
        }
        NemesisKind::KillWipe => Some(
            "a restart without data is a Redis without persistence; an etcd member that lost its data cannot rejoin its cluster as the same member (Raft), so etcd has no such failure (kill-restart kills a member and restarts it with its data)",
        ),
        NemesisKind::ClientKill => Some(
            "CLIENT KILL is a Redis command; etcd cannot be told to drop a client's gRPC connection (proxy-reset resets a worker's connections at the fault proxy instead)",
        ),
        _ => None,
    }
}

/// A deployment the user gave (`--redis URL`, `--url etcd://…`):
/// client-side nemeses only. On etcd the Redis resource cannot live on the
/// lock servers: give it its own Redis with [`Remote::with_resource`].
#[derive(Debug, Clone)]
pub struct Remote {
    url: String,
    resource: Option<String>,
    replicas: u32,
}

impl Remote {
    /// The deployment at `url` (locks and the Redis resource both live there,
    /// under the run's prefix).
    pub fn new(url: impl Into<String>) -> Self {
        Remote {
            url: url.into(),
            resource: None,
            replicas: 0,
        }
    }

    /// Keeps the Redis resource on the Redis at `url` instead of the lock
    /// deployment (needed when the locks live on etcd).
    pub fn with_resource(mut self, url: impl Into<String>) -> Self {
        self.resource = Some(url.into());
        self
    }

    /// Says that each shard of the deployment has `replicas` replicas: the
    /// workers then wait for them on every grant (unless
    /// [`crate::Config::replicas`] says fewer), and so do the audited
    /// resource's writes when it lives on this deployment.
    pub fn with_replicas(mut self, replicas: u32) -> Self {
        self.replicas = replicas;
        self
    }

    /// For a `redis+sentinel://` or `redis+cluster://` URL: asks the
    /// deployment how many replicas the shards of the lock `names` have
    /// (`INFO replication` on each one's master, the fewest), as
    /// [`Remote::with_replicas`] would be told. Other URLs are left as
    /// they are.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Unreachable`] when the deployment cannot be
    /// reached or answers with an error.
    pub async fn with_replicas_found(
        mut self,
        tls: &crate::conn::Tls,
        names: &[String],
    ) -> Result<Self> {
        if !replicated_url(&self.url) {
            return Ok(self);
        }
        let (_client, conn) = crate::conn::raw(&self.url, tls).await?;
        let mut fewest: Option<u32> = None;
        for name in names {
            // The lock keys of `name` carry the hash tag {name}.
            let info: String = conn
                .query(
                    &format!("{{{name}}}"),
                    redis::cmd("INFO").arg("replication"),
                )
                .await
                .map_err(|e| Error::new(crate::ErrorKind::Unreachable, e.to_string()))?;
            let n = info
                .lines()
                .find_map(|l| l.strip_prefix("connected_slaves:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            fewest = Some(fewest.map_or(n, |f| f.min(n)));
        }
        self.replicas = fewest.unwrap_or(0);
        Ok(self)
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
        self.resource.as_deref().unwrap_or(&self.url)
    }

    fn controls_server(&self) -> bool {
        false
    }

    fn replicas(&self) -> u32 {
        self.replicas
    }

    fn proxyable(&self) -> bool {
        proxyable_url(&self.url)
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
    Error::usage("a deployment given with --redis or --url is never paused, killed or restarted")
}

#[cfg(test)]
mod tests {
    use super::{Shape, is_etcd_url, refusal};
    use crate::config::Variant;
    use crate::nemesis::NemesisKind;

    const ETCD: Shape<'static> = Shape {
        name: "etcd",
        etcd: true,
        controls_server: true,
        replicas: 0,
        proxyable: true,
    };

    #[test]
    fn etcd_urls_are_told_from_redis_urls() {
        assert!(is_etcd_url("etcd://127.0.0.1:2379"));
        assert!(is_etcd_url("ETCDS://h"));
        assert!(!is_etcd_url("redis://127.0.0.1:6379"));
        assert!(!is_etcd_url("redis+sentinel://h/m"));
    }

    #[test]
    fn etcd_refuses_what_only_redis_has_and_runs_the_rest() {
        for kind in [
            NemesisKind::DebugSleep,
            NemesisKind::ClientPause,
            NemesisKind::ScriptFlush,
            NemesisKind::KillWipe,
            NemesisKind::ClientKill,
        ] {
            let why = refusal(kind, &ETCD).expect("refused");
            assert!(why.starts_with(kind.name()), "{why}");
        }
        for kind in [
            NemesisKind::PauseServer,
            NemesisKind::KillRestart,
            NemesisKind::Failover,
            NemesisKind::PauseWorker,
            NemesisKind::ProxyDelay,
            NemesisKind::ProxyReset,
        ] {
            assert_eq!(refusal(kind, &ETCD), None, "{}", kind.name());
        }
        let remote = Shape {
            name: "remote",
            controls_server: false,
            ..ETCD
        };
        assert!(
            refusal(NemesisKind::PauseServer, &remote).is_some_and(|w| w.contains("etcd members"))
        );
    }

    /// A given Sentinel or Cluster (no server control, no proxy) runs
    /// pause-worker and revoke only: client-kill and the proxy need one
    /// plain server.
    #[test]
    fn a_given_sentinel_or_cluster_runs_pause_worker_and_revoke_only() {
        let remote = Shape {
            name: "remote",
            etcd: false,
            controls_server: false,
            replicas: 2,
            proxyable: false,
        };
        let runnable: Vec<NemesisKind> = NemesisKind::ALL
            .into_iter()
            .filter(|k| refusal(*k, &remote).is_none())
            .collect();
        assert_eq!(runnable, [NemesisKind::PauseWorker, NemesisKind::Revoke]);
        assert!(super::proxyable_url("redis://u:p@h:1/0"));
        assert!(!super::proxyable_url("redis+sentinel://h:1/m"));
        assert!(!super::proxyable_url("rediss://h:1"));
    }

    #[test]
    fn on_etcd_only_the_resource_controls_run() {
        let runnable: Vec<Variant> = Variant::ALL
            .into_iter()
            .filter(|v| v.refusal(&ETCD).is_none())
            .collect();
        assert_eq!(
            runnable,
            [Variant::WriteOnlyCheck, Variant::RevokeWithoutSeal]
        );
        assert_eq!(Variant::GeCheck.unsupported(&ETCD), None);
        assert!(Variant::UncheckedRelease.unsupported(&ETCD).is_some());
    }
}
