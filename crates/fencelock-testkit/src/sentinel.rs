//! A real Redis Sentinel setup for tests: [`RedisSentinel`], one primary,
//! two replicas and three sentinels (by default) on free loopback ports,
//! each a [`RedisServer`] in its own directory under the setup's temporary
//! directory, started by `fencelock_servers::SentinelSetup`.
//!
//! The data nodes start with `--repl-diskless-sync-delay 0` and a writable
//! `redis.conf` holding their role (`replicaof`), which Sentinel rewrites on
//! a fail-over, so a restarted node comes back in its current role. The
//! sentinels monitor the primary with quorum 2, `down-after-milliseconds
//! 1000` and `failover-timeout 3000`, each from a writable
//! `sentinel.conf`. [`RedisSentinel::start`] returns once every sentinel
//! reports `SENTINEL CKQUORUM` OK, knows the other sentinels and both
//! replicas, and both replicas' links are up (about 2–3 s: sentinels find
//! each other through hello messages sent every 2 s).
//!
//! Data nodes and sentinels are addressed by index ([`SentinelNode`]),
//! which never changes; which data node is the primary does
//! ([`RedisSentinel::primary`] asks a sentinel).
//!
//! ```no_run
//! use fencelock_testkit::{RedisSentinel, SentinelNode};
//!
//! let sentinel = RedisSentinel::start();
//! let url = sentinel.url(); // redis+sentinel://127.0.0.1:P,…/fencelock
//! let old = sentinel.primary();
//! let new = sentinel.failover(); // SENTINEL FAILOVER, waits for the switch
//! assert_ne!(old, new);
//! // A frozen primary is replaced after down-after-milliseconds:
//! let _paused = sentinel.pause_guard(SentinelNode::Data(new));
//! let newer = sentinel.wait_new_primary(new);
//! # let _ = (url, newer);
//! ```
//!
//! A resumed old primary stays a master until a sentinel converts it,
//! which took about 10 s on Redis 7.0 (see `min-replicas-to-write` in
//! [`RedisSentinelConfig::data`] to make it refuse writes meanwhile).

use std::fmt::Write as _;
use std::time::Duration;

use redis::Value;
use tempfile::TempDir;

use fencelock_servers::redis_admin::info_field;
use fencelock_servers::wait::poll_until;

use crate::process::process_alive;
use crate::redis_server::{RedisConfig, RedisServer, servers_config};
use crate::server_process::{PausedGuard, panic_message};

/// How long [`RedisSentinel::start`] may wait for quorum and replicas.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a fail-over or a return to health may take.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one command sent while polling.
const POLL_CMD_TIMEOUT: Duration = Duration::from_secs(1);

/// How to start a [`RedisSentinel`]: `fencelock_servers::SentinelConfig`
/// with the testkit's [`RedisConfig`] for the data nodes. The default:
/// master name `fencelock`, 2 replicas, 3 sentinels, quorum 2,
/// `down-after-milliseconds 1000`, `failover-timeout 3000`. TLS is not
/// supported (the start panics).
pub type RedisSentinelConfig = fencelock_servers::SentinelConfig<RedisConfig>;

/// A process of a [`RedisSentinel`] setup, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentinelNode {
    /// Data node `i` (0 is the first primary).
    Data(usize),
    /// Sentinel `i`.
    Sentinel(usize),
}

/// A primary with replicas, monitored by sentinels, on `127.0.0.1`.
/// Dropping it kills every process and removes the directory.
#[derive(Debug)]
pub struct RedisSentinel {
    /// Dropped (killed) first, so no sentinel reacts to the data nodes
    /// going away.
    sentinels: Vec<RedisServer>,
    data: Vec<RedisServer>,
    config: RedisSentinelConfig,
    dir: TempDir,
}

impl RedisSentinel {
    /// Starts a setup with [`RedisSentinelConfig::default`] and waits until
    /// it is ready.
    ///
    /// # Panics
    ///
    /// See [`RedisSentinel::start_with`].
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_with(RedisSentinelConfig::default())
    }

    /// Starts the primary, its replicas and the sentinels, and waits (up to
    /// 20 s) until every sentinel reports quorum (`SENTINEL CKQUORUM`) and
    /// knows every other sentinel and every replica, and every replica's
    /// link is up.
    ///
    /// # Panics
    ///
    /// Panics on a configuration the testkit cannot run (TLS, no replica,
    /// a quorum larger than the sentinels), if a process fails to start, or
    /// if the setup is not ready in time; the message includes the tail of
    /// every log.
    pub fn start_with(config: RedisSentinelConfig) -> RedisSentinel {
        let servers = config.clone().map_data(|data| servers_config(&data));
        let started = fencelock_servers::SentinelSetup::start(servers)
            .unwrap_or_else(|error| panic!("{}", panic_message(&error)));
        let parts = started.into_parts();
        let setup = RedisSentinel {
            sentinels: parts
                .sentinels
                .into_iter()
                .map(RedisServer::from_inner)
                .collect(),
            data: parts
                .data
                .into_iter()
                .map(RedisServer::from_inner)
                .collect(),
            config,
            dir: parts.dir,
        };
        setup.wait_until("the sentinels to reach quorum", READY_TIMEOUT, |s| {
            s.healthy_status(None).map(|_| ())
        });
        setup
    }

    /// The configuration the setup was started with.
    pub fn config(&self) -> &RedisSentinelConfig {
        &self.config
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        &self.config.master_name
    }

    /// `"127.0.0.1:PORT"` of every sentinel, by index.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// `redis://127.0.0.1:PORT/` of every sentinel, by index.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// `redis+sentinel://127.0.0.1:S0,127.0.0.1:S1,127.0.0.1:S2/MASTER`
    /// (the data nodes' password, if any, is not in it).
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/{}",
            self.sentinel_addrs().join(","),
            self.config.master_name
        )
    }

    /// The setup's directory (`data-N-…` and `sentinel-N-…` directories).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Every data node, by index.
    pub fn data_nodes(&self) -> &[RedisServer] {
        &self.data
    }

    /// Every sentinel, by index.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Data node `index`.
    ///
    /// # Panics
    ///
    /// Panics if `index` is out of range.
    pub fn data_node(&self, index: usize) -> &RedisServer {
        &self.data[index]
    }

    /// Sentinel `index`.
    ///
    /// # Panics
    ///
    /// Panics if `index` is out of range.
    pub fn sentinel(&self, index: usize) -> &RedisServer {
        &self.sentinels[index]
    }

    /// The process `node`.
    ///
    /// # Panics
    ///
    /// Panics if its index is out of range.
    pub fn server(&self, node: SentinelNode) -> &RedisServer {
        match node {
            SentinelNode::Data(index) => &self.data[index],
            SentinelNode::Sentinel(index) => &self.sentinels[index],
        }
    }

    /// The process `node`, mutably.
    ///
    /// # Panics
    ///
    /// Panics if its index is out of range.
    pub fn server_mut(&mut self, node: SentinelNode) -> &mut RedisServer {
        match node {
            SentinelNode::Data(index) => &mut self.data[index],
            SentinelNode::Sentinel(index) => &mut self.sentinels[index],
        }
    }

    /// The process ids of every data node and every sentinel.
    pub fn pids(&self) -> Vec<u32> {
        self.data
            .iter()
            .chain(&self.sentinels)
            .map(RedisServer::pid)
            .collect()
    }

    /// The index of the current primary, as the first answering sentinel
    /// reports it (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// # Panics
    ///
    /// Panics if no sentinel answers, or it names an address that is not a
    /// data node of this setup.
    pub fn primary(&self) -> usize {
        let mut errors = Vec::new();
        for index in self.answering_sentinels() {
            match self.primary_of(index) {
                Ok(primary) => return primary,
                Err(error) => errors.push(error),
            }
        }
        panic!(
            "no sentinel reported the primary: {errors:?}{}",
            self.logs_report()
        )
    }

    /// The current primary's data node ([`RedisSentinel::primary`]).
    pub fn primary_node(&self) -> &RedisServer {
        &self.data[self.primary()]
    }

    /// The data nodes that are not the current primary.
    pub fn replicas(&self) -> Vec<usize> {
        let primary = self.primary();
        (0..self.data.len()).filter(|&i| i != primary).collect()
    }

    /// Freezes `node` with SIGSTOP (see [`RedisServer::pause`]).
    pub fn pause(&self, node: SentinelNode) {
        self.server(node).pause();
    }

    /// Resumes `node` (SIGCONT).
    pub fn resume(&self, node: SentinelNode) {
        self.server(node).resume();
    }

    /// Pauses `node` until the guard is dropped.
    pub fn pause_guard(&self, node: SentinelNode) -> PausedGuard<'_, RedisServer> {
        self.server(node).pause_guard()
    }

    /// Kills `node` with SIGKILL.
    pub fn kill(&mut self, node: SentinelNode) {
        self.server_mut(node).kill();
    }

    /// Restarts `node` on the same port and directory, from its (possibly
    /// rewritten) config file, and waits until it answers `PING`. It does
    /// not wait for the sentinels; call [`RedisSentinel::wait_healthy`] for
    /// that.
    ///
    /// # Panics
    ///
    /// See [`RedisServer::restart`].
    pub fn restart(&mut self, node: SentinelNode) {
        self.server_mut(node).restart();
    }

    /// `SENTINEL FAILOVER` on the first answering sentinel, then waits (up
    /// to 20 s) until every answering sentinel reports a new primary, it
    /// answers `ROLE` as master, and the setup is healthy again except for
    /// the old primary (see [`RedisSentinel::wait_healthy`]). Returns the
    /// new primary's index. Takes about 2.5 s.
    ///
    /// The old primary is left as Sentinel leaves it: still a master until
    /// a sentinel converts it to a replica of the new primary, about 10 s
    /// later on Redis 7.0. Call [`RedisSentinel::wait_healthy`] to wait for
    /// that too.
    ///
    /// # Panics
    ///
    /// Panics if the command fails or the switch does not complete in time;
    /// the message includes the tail of every log.
    pub fn failover(&self) -> usize {
        let old = self.primary();
        let sentinel = self
            .answering_sentinels()
            .first()
            .copied()
            .unwrap_or_else(|| panic!("no sentinel answers{}", self.logs_report()));
        if let Err(error) =
            self.sentinels[sentinel].try_cmd(&["SENTINEL", "FAILOVER", &self.config.master_name])
        {
            panic!(
                "SENTINEL FAILOVER on sentinel {sentinel} failed: {error}{}",
                self.logs_report()
            );
        }
        let new = self.wait_new_primary(old);
        self.wait_until(
            &format!("the setup to be healthy after the fail-over from {old} to {new}"),
            FAILOVER_TIMEOUT,
            |s| match s.healthy_status(Some(old))? {
                primary if primary == new => Ok(()),
                primary => Err(format!("the primary moved on to {primary}")),
            },
        );
        new
    }

    /// Waits (up to 20 s) until every answering sentinel reports the same
    /// primary other than `old`, and that data node answers `ROLE` as
    /// master; returns its index. Use it after pausing or killing the
    /// primary (the sentinels act after `down-after-milliseconds`).
    ///
    /// # Panics
    ///
    /// Panics if that does not happen in time; the message includes the
    /// tail of every log.
    pub fn wait_new_primary(&self, old: usize) -> usize {
        self.wait_until(
            &format!("the sentinels to promote a new primary instead of {old}"),
            FAILOVER_TIMEOUT,
            |s| {
                let primary = s.agreed_primary()?;
                if primary == old {
                    return Err(format!("the sentinels still report {old}"));
                }
                if s.role(primary)? != "master" {
                    return Err(format!(
                        "data node {primary} does not answer ROLE as master"
                    ));
                }
                Ok(primary)
            },
        )
    }

    /// Waits (up to 20 s) until the setup is healthy as far as its
    /// answering processes go: every answering sentinel reports the same
    /// primary, quorum (`SENTINEL CKQUORUM`), every other sentinel, and
    /// every answering replica without a down flag; the primary answers
    /// `ROLE` as master, and every other answering data node is its
    /// replica with its link up. Returns the primary's index.
    ///
    /// # Panics
    ///
    /// Panics if that does not happen in time; the message includes the
    /// tail of every log.
    pub fn wait_healthy(&self) -> usize {
        self.wait_until("the setup to be healthy", FAILOVER_TIMEOUT, |s| {
            s.healthy_status(None)
        })
    }

    // ----- internals -----

    fn answering(server: &RedisServer) -> bool {
        process_alive(server.pid()) && !server.is_paused()
    }

    fn answering_sentinels(&self) -> Vec<usize> {
        (0..self.sentinels.len())
            .filter(|&i| Self::answering(&self.sentinels[i]))
            .collect()
    }

    fn answering_data(&self) -> Vec<usize> {
        (0..self.data.len())
            .filter(|&i| Self::answering(&self.data[i]))
            .collect()
    }

    fn command(&self, server: &RedisServer, what: &str, args: &[&str]) -> Result<Value, String> {
        server
            .try_cmd_timeout(args, POLL_CMD_TIMEOUT)
            .map_err(|e| format!("{args:?} on {what}: {e}"))
    }

    /// The data node sentinel `index` reports as primary.
    fn primary_of(&self, index: usize) -> Result<usize, String> {
        let what = format!("sentinel {index}");
        let reply = self.command(
            &self.sentinels[index],
            &what,
            &[
                "SENTINEL",
                "GET-MASTER-ADDR-BY-NAME",
                &self.config.master_name,
            ],
        )?;
        let (host, port): (String, u16) =
            redis::from_redis_value(reply).map_err(|e| format!("{what}: {e}"))?;
        self.data
            .iter()
            .position(|node| node.port() == port)
            .ok_or_else(|| format!("{what} reports {host}:{port}, not a data node"))
    }

    /// The primary every answering sentinel reports, if they agree.
    fn agreed_primary(&self) -> Result<usize, String> {
        let mut agreed = None;
        for index in self.answering_sentinels() {
            let primary = self.primary_of(index)?;
            match agreed {
                None => agreed = Some(primary),
                Some(other) if other != primary => {
                    return Err(format!(
                        "sentinels disagree on the primary: {other} and {primary} (sentinel {index})"
                    ));
                }
                Some(_) => {}
            }
        }
        agreed.ok_or_else(|| "no sentinel answers".to_owned())
    }

    /// The first element of `ROLE` on data node `index`.
    fn role(&self, index: usize) -> Result<String, String> {
        let what = format!("data node {index}");
        let reply = self.command(&self.data[index], &what, &["ROLE"])?;
        match reply {
            Value::Array(items) => items
                .into_iter()
                .next()
                .and_then(|role| redis::from_redis_value::<String>(role).ok())
                .ok_or_else(|| format!("{what}: empty ROLE reply")),
            other => Err(format!("{what}: unexpected ROLE reply {other:?}")),
        }
    }

    /// `Ok(primary)` if the setup is healthy (see
    /// [`RedisSentinel::wait_healthy`]), leaving out data node `skip`.
    fn healthy_status(&self, skip: Option<usize>) -> Result<usize, String> {
        let primary = self.agreed_primary()?;
        let name = self.config.master_name.as_str();
        if self.role(primary)? != "master" {
            return Err(format!(
                "data node {primary} does not answer ROLE as master"
            ));
        }
        let replicas: Vec<usize> = self
            .answering_data()
            .into_iter()
            .filter(|&i| i != primary && Some(i) != skip)
            .collect();
        let primary_port = self.data[primary].port().to_string();
        for &replica in &replicas {
            let what = format!("data node {replica}");
            let info: String = redis::from_redis_value(self.command(
                &self.data[replica],
                &what,
                &["INFO", "replication"],
            )?)
            .map_err(|e| e.to_string())?;
            let (port, link) = (
                info_field(&info, "master_port"),
                info_field(&info, "master_link_status"),
            );
            if port != Some(primary_port.as_str()) || link != Some("up") {
                return Err(format!(
                    "{what}: master_port {port:?}, master_link_status {link:?} (primary is {primary} on {primary_port})"
                ));
            }
        }
        for index in self.answering_sentinels() {
            let what = format!("sentinel {index}");
            let sentinel = &self.sentinels[index];
            self.command(sentinel, &what, &["SENTINEL", "CKQUORUM", name])?;
            let master: Vec<String> = redis::from_redis_value(self.command(
                sentinel,
                &what,
                &["SENTINEL", "MASTER", name],
            )?)
            .map_err(|e| format!("{what}: {e}"))?;
            let field = |key: &str| {
                master
                    .chunks(2)
                    .find(|pair| pair[0] == key)
                    .and_then(|pair| pair.get(1))
                    .map(String::as_str)
            };
            let others = (self.sentinels.len() - 1).to_string();
            if field("flags") != Some("master") || field("num-other-sentinels") != Some(&others) {
                return Err(format!(
                    "{what}: flags {:?}, num-other-sentinels {:?} (expected {others})",
                    field("flags"),
                    field("num-other-sentinels")
                ));
            }
            let known: Vec<Vec<String>> = redis::from_redis_value(self.command(
                sentinel,
                &what,
                &["SENTINEL", "REPLICAS", name],
            )?)
            .map_err(|e| format!("{what}: {e}"))?;
            for &replica in &replicas {
                let port = self.data[replica].port().to_string();
                let flags = known.iter().find_map(|fields| {
                    let get = |key: &str| {
                        fields
                            .chunks(2)
                            .find(|pair| pair[0] == key)
                            .and_then(|pair| pair.get(1))
                    };
                    (get("port") == Some(&port)).then(|| get("flags").cloned())
                });
                if flags != Some(Some("slave".to_owned())) {
                    return Err(format!(
                        "{what} knows data node {replica} with flags {flags:?}"
                    ));
                }
            }
        }
        Ok(primary)
    }

    /// Polls `check` until it returns `Ok` or `timeout` passes; then panics
    /// with `what`, the last error and the tail of every log.
    fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> Result<T, String>,
    ) -> T {
        poll_until(timeout, || check(self)).unwrap_or_else(|error| {
            panic!(
                "timed out after {timeout:?} waiting for {what}: {error}{}",
                self.logs_report()
            )
        })
    }

    /// The tail of every process' log, for a panic message.
    fn logs_report(&self) -> String {
        let mut report = String::new();
        let named = self
            .data
            .iter()
            .enumerate()
            .map(|(i, node)| (format!("data node {i}"), node))
            .chain(
                self.sentinels
                    .iter()
                    .enumerate()
                    .map(|(i, node)| (format!("sentinel {i}"), node)),
            );
        for (name, node) in named {
            let _ = write!(
                report,
                "\n--- {name} ({}, pid {}) log (tail) ---\n{}",
                node.addr(),
                node.pid(),
                node.log_tail()
            );
        }
        report
    }
}
