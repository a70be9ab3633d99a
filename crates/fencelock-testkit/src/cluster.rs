//! A real Redis Cluster for tests: [`RedisCluster`], 3 masters and 3
//! replicas (by default) on free loopback ports, each a [`RedisServer`] in
//! its own directory under the cluster's temporary directory.
//!
//! Every node is started with `--cluster-enabled yes
//! --cluster-node-timeout 2000 --repl-diskless-sync-delay 0` (and a few
//! settings that make fail-overs quick and deterministic, see
//! [`RedisClusterConfig`]), on a port whose cluster bus port (`port +
//! 10000`) is free too; the cluster is created by
//! `fencelock_servers::ClusterSetup` (the `CLUSTER` commands `redis-cli
//! --cluster create … --cluster-replicas 1` sends). [`RedisCluster::start`]
//! returns once every node reports `cluster_state:ok`, all nodes agree on
//! the roles and slots, and every replica's link to its master is up (about
//! 2–3 s).
//!
//! Nodes are addressed by their index (`0..len()`), which never changes;
//! their roles do. Role queries ([`RedisCluster::masters`],
//! [`RedisCluster::owner_of_key`], …) ask the first node that answers
//! (paused and killed nodes are skipped), so right after a fault they may
//! report what that node believes. The waits ([`RedisCluster::failover`],
//! [`RedisCluster::wait_replaced`], [`RedisCluster::wait_healthy`]) return
//! only once every answering node agrees.
//!
//! ```no_run
//! use fencelock_testkit::RedisCluster;
//!
//! let mut cluster = RedisCluster::start();
//! let owner = cluster.owner_of_key("lock:{job}");
//! cluster.node(owner).cmd(&["SET", "lock:{job}", "1"]);
//! let replica = cluster.replicas_of(owner)[0];
//! cluster.failover(replica); // CLUSTER FAILOVER: the replica is now master
//! assert_eq!(cluster.owner_of_key("lock:{job}"), replica);
//! cluster.kill(replica); // its old master takes over again
//! assert_eq!(cluster.wait_replaced(replica), owner);
//! # let _ = cluster.cluster_url();
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use fencelock_servers::ClusterSetup;
use fencelock_servers::redis_admin::info_field;
use fencelock_servers::run::run_with_timeout;
use fencelock_servers::wait::poll_until;

use crate::process::process_alive;
use crate::redis_server::{RedisConfig, RedisServer, redis_cli_bin, servers_config};
use crate::server_process::{PausedGuard, panic_message};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = fencelock_servers::cluster::SLOTS;

/// How long [`RedisCluster::start`] may take from a created cluster to one
/// whose nodes all agree.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fail-over, a replacement or a return to health may take.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one command sent while polling (a paused node must not hold
/// up a poll).
const POLL_CMD_TIMEOUT: Duration = Duration::from_secs(1);
/// Default timeout of [`RedisCluster::cli`].
const CLI_TIMEOUT: Duration = Duration::from_secs(10);

/// How to start a [`RedisCluster`]: `fencelock_servers::ClusterConfig`
/// with the testkit's [`RedisConfig`] for the nodes.
/// `RedisClusterConfig::default()` is 3 masters with 1 replica each and a
/// node timeout of 2 s. Password and TLS are not supported for clusters
/// (the start panics).
pub type RedisClusterConfig = fencelock_servers::ClusterConfig<RedisConfig>;

/// How [`RedisCluster::failover_with`] asks a replica to take over
/// (`CLUSTER FAILOVER [FORCE|TAKEOVER]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailoverMode {
    /// Coordinated with the master, no write is lost; the master must be
    /// reachable.
    #[default]
    Default,
    /// `FORCE`: without the master's agreement (it may be down), but with
    /// an election among the masters.
    Force,
    /// `TAKEOVER`: without the master and without an election.
    Takeover,
}

/// A Redis Cluster of [`RedisServer`] nodes on `127.0.0.1`. Dropping it
/// kills every node and removes the cluster's directory.
#[derive(Debug)]
pub struct RedisCluster {
    /// Dropped (killed) before `dir` is removed.
    nodes: Vec<RedisServer>,
    /// Node ids (`CLUSTER MYID`), by index; stable across restarts
    /// (`nodes.conf` is kept).
    ids: Vec<String>,
    config: RedisClusterConfig,
    dir: TempDir,
}

impl RedisCluster {
    /// Starts a cluster with [`RedisClusterConfig::default`] (3 masters, 3
    /// replicas) and waits until it is ready.
    ///
    /// # Panics
    ///
    /// See [`RedisCluster::start_with`].
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(RedisClusterConfig::default())
    }

    /// Starts `masters × (1 + replicas_per_master)` nodes, creates the
    /// cluster (`fencelock_servers::ClusterSetup`), and waits (up to 30 s)
    /// until every node reports `cluster_state:ok`, all agree on the roles
    /// and slots, and every replica's link is up.
    ///
    /// # Panics
    ///
    /// Panics if fewer than 3 masters are asked for, if a password or TLS
    /// is configured, if a node fails, or if the cluster is
    /// not ready in time; the message includes the tail of every node's
    /// log.
    pub fn start_with(config: RedisClusterConfig) -> RedisCluster {
        let servers = config.clone().map_node(|node| servers_config(&node));
        let started = ClusterSetup::start(servers)
            .unwrap_or_else(|error| panic!("{}", panic_message(&error)));
        let parts = started.into_parts();
        let cluster = RedisCluster {
            nodes: parts
                .nodes
                .into_iter()
                .map(RedisServer::from_inner)
                .collect(),
            ids: parts.ids,
            config,
            dir: parts.dir,
        };
        cluster.wait_until("the new cluster to be ready", READY_TIMEOUT, |c| {
            c.healthy_status()?;
            let masters = c.view()?.masters().len();
            if masters != c.config.masters {
                return Err(format!(
                    "{masters} masters own slots, expected {}",
                    c.config.masters
                ));
            }
            Ok(())
        });
        cluster
    }

    /// The configuration the cluster was started with.
    pub fn config(&self) -> &RedisClusterConfig {
        &self.config
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: a cluster has at least 3 nodes (for clippy's
    /// `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node, by index.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `index`, for commands ([`RedisServer::cmd`]), its URL, port,
    /// pid, log and directory.
    ///
    /// # Panics
    ///
    /// Panics if `index` is out of range.
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// Node `index`, mutably (its own [`RedisServer::kill`] and
    /// [`RedisServer::restart`] do not wait for the cluster; prefer
    /// [`RedisCluster::kill`] and [`RedisCluster::restart`]).
    ///
    /// # Panics
    ///
    /// Panics if `index` is out of range.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The cluster node id of node `index` (`CLUSTER MYID`).
    pub fn node_id(&self, index: usize) -> &str {
        &self.ids[index]
    }

    /// The index of the node with cluster node id `id`.
    pub fn index_of_id(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|known| known == id)
    }

    /// The cluster's directory (one `node-N-…` directory per node).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `redis://127.0.0.1:PORT/` of every node, by index: seed URLs for a
    /// cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `redis+cluster://127.0.0.1:P0,127.0.0.1:P1,…`: every node as one
    /// seed-list URL.
    pub fn cluster_url(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// The process ids of every node's current process, by index.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(RedisServer::pid).collect()
    }

    /// The masters (nodes that own slots), as seen by the first node that
    /// answers; a killed master is listed until a replica took over.
    ///
    /// # Panics
    ///
    /// Panics if no node answers `CLUSTER NODES`.
    pub fn masters(&self) -> Vec<usize> {
        self.view_or_panic().masters()
    }

    /// The replicas, as seen by the first node that answers.
    ///
    /// # Panics
    ///
    /// Panics if no node answers `CLUSTER NODES`.
    pub fn replicas(&self) -> Vec<usize> {
        self.view_or_panic().replicas()
    }

    /// The replicas of `master`, as seen by the first node that answers.
    ///
    /// # Panics
    ///
    /// Panics if no node answers `CLUSTER NODES`.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        self.view_or_panic().replicas_of(&self.ids[master])
    }

    /// The master of `replica` (`None` if it is a master), as seen by the
    /// first node that answers.
    ///
    /// # Panics
    ///
    /// Panics if no node answers `CLUSTER NODES`.
    pub fn master_of(&self, replica: usize) -> Option<usize> {
        self.view_or_panic().master_of(&self.ids[replica])
    }

    /// The hash slot of `key` (CRC16 of the key, or of its `{hash tag}`,
    /// modulo 16384), as `CLUSTER KEYSLOT` computes it.
    pub fn slot_of_key(key: &str) -> u16 {
        key_slot(key.as_bytes())
    }

    /// The master that owns `slot`, as seen by the first node that answers.
    ///
    /// # Panics
    ///
    /// Panics if no node answers or no master owns the slot.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let view = self.view_or_panic();
        view.owner_of_slot(slot)
            .unwrap_or_else(|| panic!("no master owns slot {slot}:\n{}", view.raw))
    }

    /// The master that owns `key`'s slot; keys with the same `{hash tag}`
    /// share it.
    ///
    /// # Panics
    ///
    /// See [`RedisCluster::owner_of_slot`].
    pub fn owner_of_key(&self, key: &str) -> usize {
        self.owner_of_slot(RedisCluster::slot_of_key(key))
    }

    /// Freezes node `index` with SIGSTOP (see [`RedisServer::pause`]).
    pub fn pause(&self, index: usize) {
        self.nodes[index].pause();
    }

    /// Resumes node `index` (SIGCONT).
    pub fn resume(&self, index: usize) {
        self.nodes[index].resume();
    }

    /// Pauses node `index` until the guard is dropped.
    pub fn pause_guard(&self, index: usize) -> PausedGuard<'_, RedisServer> {
        self.nodes[index].pause_guard()
    }

    /// Kills node `index` with SIGKILL. The others notice after the node
    /// timeout; a killed master's replica then takes over (see
    /// [`RedisCluster::wait_replaced`]).
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Restarts node `index` (killing it first if it runs) on the same port
    /// and directory — its `nodes.conf` keeps its id and view — then waits
    /// until the cluster is healthy again ([`RedisCluster::wait_healthy`]).
    /// A master that was replaced in the meantime rejoins as a replica of
    /// its replacement. Data survives only as far as the node's
    /// persistence saved it.
    ///
    /// # Panics
    ///
    /// Panics if the node cannot be restarted, or the cluster is not
    /// healthy within 20 s.
    pub fn restart(&mut self, index: usize) {
        self.nodes[index].restart();
        self.wait_healthy();
    }

    /// `CLUSTER FAILOVER` on `replica`, then waits until it is a master, its
    /// old master (if it answers) is its replica, and the cluster is
    /// healthy.
    ///
    /// # Panics
    ///
    /// See [`RedisCluster::failover_with`].
    pub fn failover(&self, replica: usize) {
        self.failover_with(replica, FailoverMode::Default);
    }

    /// `CLUSTER FAILOVER [FORCE|TAKEOVER]` on `replica`, then waits (up to
    /// 20 s) until every answering node sees it as a master that owns its
    /// old master's slots, the old master (if it answers) is its replica,
    /// and the cluster is healthy ([`RedisCluster::wait_healthy`]).
    ///
    /// # Panics
    ///
    /// Panics if `replica` is not a replica, the command fails, or the roles
    /// have not swapped in time; the message includes the tails of both
    /// nodes' logs.
    pub fn failover_with(&self, replica: usize, mode: FailoverMode) {
        let master = self.master_of(replica).unwrap_or_else(|| {
            panic!(
                "node {replica} is not a replica: fail over one of the replicas {:?} of a master",
                self.replicas()
            )
        });
        let mut args = vec!["CLUSTER", "FAILOVER"];
        match mode {
            FailoverMode::Default => {}
            FailoverMode::Force => args.push("FORCE"),
            FailoverMode::Takeover => args.push("TAKEOVER"),
        }
        if let Err(error) = self.nodes[replica].try_cmd(&args) {
            panic!(
                "{args:?} on node {replica} failed: {error}{}",
                self.logs_report(&[replica, master])
            );
        }
        self.wait_until(
            &format!("replica {replica} to replace master {master} ({mode:?} fail-over)"),
            FAILOVER_TIMEOUT,
            |c| {
                c.check_promoted(replica, master)?;
                c.healthy_status()
            },
        );
    }

    /// Waits (up to 20 s) until a replica of `master` — typically killed or
    /// paused — has taken over: every answering node sees it as a master
    /// that owns slots, and the cluster is healthy. Returns its index.
    ///
    /// # Panics
    ///
    /// Panics if `master` has no replica or none took over in time; the
    /// message includes the tail of every node's log.
    pub fn wait_replaced(&self, master: usize) -> usize {
        let candidates = self.replicas_of(master);
        assert!(
            !candidates.is_empty(),
            "node {master} has no replica that could replace it"
        );
        self.wait_until(
            &format!("a replica {candidates:?} to replace master {master}"),
            FAILOVER_TIMEOUT,
            |c| {
                let promoted = candidates
                    .iter()
                    .copied()
                    .find(|&candidate| c.check_promoted(candidate, master).is_ok())
                    .ok_or_else(|| format!("no replica of {master} is a master yet"))?;
                c.healthy_status()?;
                Ok(promoted)
            },
        )
    }

    /// Waits (up to 20 s) until the cluster is healthy as far as its
    /// answering nodes go: each reports `cluster_state:ok` with every slot
    /// served, none sees another answering node as failing, all agree on
    /// the roles and slots, and each answering replica's link to its master
    /// is up. Paused and killed nodes are left out.
    ///
    /// # Panics
    ///
    /// Panics if that does not happen in time; the message includes the
    /// tail of every node's log.
    pub fn wait_healthy(&self) {
        self.wait_until("the cluster to be healthy", FAILOVER_TIMEOUT, |c| {
            c.healthy_status()
        });
    }

    /// `CLUSTER SETSLOT slot IMPORTING <source's id>` on `node`.
    ///
    /// # Panics
    ///
    /// Panics if the command fails.
    pub fn setslot_importing(&self, node: usize, slot: u16, source: usize) {
        self.nodes[node].cmd(&[
            "CLUSTER",
            "SETSLOT",
            &slot.to_string(),
            "IMPORTING",
            &self.ids[source],
        ]);
    }

    /// `CLUSTER SETSLOT slot MIGRATING <target's id>` on `node`.
    ///
    /// # Panics
    ///
    /// Panics if the command fails.
    pub fn setslot_migrating(&self, node: usize, slot: u16, target: usize) {
        self.nodes[node].cmd(&[
            "CLUSTER",
            "SETSLOT",
            &slot.to_string(),
            "MIGRATING",
            &self.ids[target],
        ]);
    }

    /// `CLUSTER SETSLOT slot NODE <owner's id>` on `node`.
    ///
    /// # Panics
    ///
    /// Panics if the command fails.
    pub fn setslot_node(&self, node: usize, slot: u16, owner: usize) {
        self.nodes[node].cmd(&[
            "CLUSTER",
            "SETSLOT",
            &slot.to_string(),
            "NODE",
            &self.ids[owner],
        ]);
    }

    /// `CLUSTER SETSLOT slot STABLE` on `node` (clears IMPORTING/MIGRATING).
    ///
    /// # Panics
    ///
    /// Panics if the command fails.
    pub fn setslot_stable(&self, node: usize, slot: u16) {
        self.nodes[node].cmd(&["CLUSTER", "SETSLOT", &slot.to_string(), "STABLE"]);
    }

    /// Up to `count` keys of `slot` stored on `node`
    /// (`CLUSTER GETKEYSINSLOT`).
    ///
    /// # Panics
    ///
    /// Panics if the command fails.
    pub fn keys_in_slot(&self, node: usize, slot: u16, count: usize) -> Vec<String> {
        self.nodes[node].query(&[
            "CLUSTER",
            "GETKEYSINSLOT",
            &slot.to_string(),
            &count.to_string(),
        ])
    }

    /// Moves `keys` from node `from` to node `to` with one
    /// `MIGRATE 127.0.0.1 <port> "" 0 5000 KEYS …` (a key missing on `from`
    /// is skipped by Redis). Does nothing for an empty list.
    ///
    /// # Panics
    ///
    /// Panics if the command fails.
    pub fn migrate_keys(&self, from: usize, to: usize, keys: &[&str]) {
        if keys.is_empty() {
            return;
        }
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend_from_slice(keys);
        self.nodes[from].cmd(&args);
    }

    /// Moves `slot` and its keys to master `to`, the way `redis-cli
    /// --cluster reshard` does: IMPORTING on `to`, MIGRATING on the owner,
    /// `MIGRATE` of every key, then `SETSLOT … NODE to` on both and on every
    /// other master. Waits until every answering node sees `to` as the
    /// owner. Does nothing if `to` owns the slot already.
    ///
    /// # Panics
    ///
    /// Panics if a step fails or the nodes do not agree within 20 s.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        let from = self.owner_of_slot(slot);
        if from == to {
            return;
        }
        self.setslot_importing(to, slot, from);
        self.setslot_migrating(from, slot, to);
        loop {
            let keys = self.keys_in_slot(from, slot, 100);
            if keys.is_empty() {
                break;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.migrate_keys(from, to, &keys);
        }
        self.setslot_node(to, slot, to);
        self.setslot_node(from, slot, to);
        for master in self.masters() {
            if master != from && master != to && self.is_answering(master) {
                self.setslot_node(master, slot, to);
            }
        }
        self.wait_until(
            &format!("every node to see slot {slot} on node {to}"),
            FAILOVER_TIMEOUT,
            |c| {
                for index in c.answering() {
                    let view = c.view_of(index)?;
                    if view.owner_of_slot(slot) != Some(to) {
                        return Err(format!(
                            "node {index} sees slot {slot} on {:?}",
                            view.owner_of_slot(slot)
                        ));
                    }
                }
                Ok(())
            },
        );
    }

    /// Runs `redis-cli -h 127.0.0.1 -p <port of node> ARGS…` with a 10 s
    /// timeout (a paused node would make it hang; it is killed then) and
    /// returns its output, or the error with its output.
    pub fn cli(&self, node: usize, args: &[&str]) -> Result<String, String> {
        self.cli_timeout(node, args, CLI_TIMEOUT)
    }

    /// [`RedisCluster::cli`] with a given timeout.
    pub fn cli_timeout(
        &self,
        node: usize,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String, String> {
        let mut command = Command::new(redis_cli_bin());
        command
            .args(["-h", "127.0.0.1", "-p"])
            .arg(self.nodes[node].port().to_string())
            .args(args);
        run_with_timeout(command, timeout)
    }

    // ----- internals -----

    fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Whether node `index` runs and is not paused.
    fn is_answering(&self, index: usize) -> bool {
        let node = &self.nodes[index];
        process_alive(node.pid()) && !node.is_paused()
    }

    /// The nodes that run and are not paused.
    fn answering(&self) -> Vec<usize> {
        self.all()
            .into_iter()
            .filter(|&index| self.is_answering(index))
            .collect()
    }

    /// A command on node `index` with a short timeout, as text.
    fn text(&self, index: usize, args: &[&str]) -> Result<String, String> {
        let value = self.nodes[index]
            .try_cmd_timeout(args, POLL_CMD_TIMEOUT)
            .map_err(|e| format!("{args:?} on node {index}: {e}"))?;
        redis::from_redis_value(value).map_err(|e| format!("{args:?} on node {index}: {e}"))
    }

    /// Node `index`'s view (`CLUSTER NODES`).
    fn view_of(&self, index: usize) -> Result<View, String> {
        let raw = self.text(index, &["CLUSTER", "NODES"])?;
        Ok(View::parse(&raw, &self.ids))
    }

    /// The view of the first answering node.
    fn view(&self) -> Result<View, String> {
        let mut errors = Vec::new();
        for index in self.answering() {
            match self.view_of(index) {
                Ok(view) => return Ok(view),
                Err(error) => errors.push(error),
            }
        }
        Err(format!("no node answered CLUSTER NODES: {errors:?}"))
    }

    fn view_or_panic(&self) -> View {
        self.view()
            .unwrap_or_else(|error| panic!("{error}{}", self.logs_report(&self.all())))
    }

    /// `Ok` if every answering node sees `replica` as a master owning slots
    /// and `old_master`, if it answers, sees itself as `replica`'s replica.
    fn check_promoted(&self, replica: usize, old_master: usize) -> Result<(), String> {
        for index in self.answering() {
            let view = self.view_of(index)?;
            if !view.masters().contains(&replica) {
                return Err(format!(
                    "node {index} does not see node {replica} as a master"
                ));
            }
        }
        if self.is_answering(old_master) {
            let view = self.view_of(old_master)?;
            if view.master_of(&self.ids[old_master]) != Some(replica) {
                return Err(format!(
                    "node {old_master} is not yet a replica of node {replica}"
                ));
            }
        }
        Ok(())
    }

    /// `Ok` if the cluster is healthy (see [`RedisCluster::wait_healthy`]).
    fn healthy_status(&self) -> Result<(), String> {
        let answering = self.answering();
        if answering.is_empty() {
            return Err("no node answers".to_owned());
        }
        let mut first: Option<(usize, Vec<Role>)> = None;
        for &index in &answering {
            let info = self.text(index, &["CLUSTER", "INFO"])?;
            for (field, expected) in [("cluster_state", "ok"), ("cluster_slots_ok", "16384")] {
                let value = info_field(&info, field);
                if value != Some(expected) {
                    return Err(format!("node {index}: {field} is {value:?}"));
                }
            }
            let view = self.view_of(index)?;
            for &other in &answering {
                let flags = view.flags_of(&self.ids[other]);
                if let Some(bad) = flags
                    .iter()
                    .find(|f| matches!(f.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
                {
                    return Err(format!("node {index} sees node {other} as {bad}"));
                }
            }
            let roles: Vec<Role> = answering.iter().map(|&n| view.role(&self.ids[n])).collect();
            match &first {
                None => first = Some((index, roles)),
                Some((first_index, first_roles)) if *first_roles != roles => {
                    return Err(format!(
                        "nodes {first_index} and {index} disagree on the roles: {first_roles:?} vs {roles:?}"
                    ));
                }
                Some(_) => {}
            }
            if view.master_of(&self.ids[index]).is_some() {
                let replication = self.text(index, &["INFO", "replication"])?;
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica {index}: master_link_status is {link:?}"));
                }
            }
        }
        Ok(())
    }

    /// Polls `check` until it returns `Ok` or `timeout` passes; then panics
    /// with `what`, the last error and the tail of every node's log.
    fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> Result<T, String>,
    ) -> T {
        poll_until(timeout, || check(self)).unwrap_or_else(|error| {
            panic!(
                "timed out after {timeout:?} waiting for {what}: {error}{}",
                self.logs_report(&self.all())
            )
        })
    }

    /// The tail of the logs of `indexes`, for a panic message.
    fn logs_report(&self, indexes: &[usize]) -> String {
        let mut report = String::new();
        for &index in indexes {
            let node = &self.nodes[index];
            let _ = write!(
                report,
                "\n--- node {index} ({}, id {}, pid {}) redis.log (tail) ---\n{}",
                node.addr(),
                self.ids[index],
                node.pid(),
                node.log_tail()
            );
        }
        report
    }
}

/// A node's role in a [`View`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// A master and the slot ranges it owns.
    Master(Vec<(u16, u16)>),
    /// A replica of the node with this id.
    Replica(String),
    /// Not in the view.
    Unknown,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    flags: Vec<String>,
    master_id: Option<String>,
    slots: Vec<(u16, u16)>,
}

/// One node's `CLUSTER NODES`, with node ids mapped to the testkit's
/// indexes.
#[derive(Debug, Clone)]
struct View {
    lines: BTreeMap<String, NodeLine>,
    /// Node ids by index.
    ids: Vec<String>,
    raw: String,
}

impl View {
    fn parse(raw: &str, ids: &[String]) -> View {
        let mut lines = BTreeMap::new();
        for line in raw.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                continue;
            }
            let slots = fields[8..]
                .iter()
                .filter(|entry| !entry.starts_with('['))
                .filter_map(|entry| match entry.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => entry.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            let node = NodeLine {
                id: fields[0].to_owned(),
                flags: fields[2].split(',').map(str::to_owned).collect(),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            };
            lines.insert(node.id.clone(), node);
        }
        View {
            lines,
            ids: ids.to_vec(),
            raw: raw.to_owned(),
        }
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|known| known == id)
    }

    fn role(&self, id: &str) -> Role {
        match self.lines.get(id) {
            Some(line) if line.flags.iter().any(|f| f == "slave") => {
                Role::Replica(line.master_id.clone().unwrap_or_default())
            }
            Some(line) if line.flags.iter().any(|f| f == "master") => {
                Role::Master(line.slots.clone())
            }
            _ => Role::Unknown,
        }
    }

    fn flags_of(&self, id: &str) -> Vec<String> {
        self.lines
            .get(id)
            .map(|line| line.flags.clone())
            .unwrap_or_default()
    }

    /// Masters that own at least one slot, by index.
    fn masters(&self) -> Vec<usize> {
        self.indexes(|line| line.flags.iter().any(|f| f == "master") && !line.slots.is_empty())
    }

    fn replicas(&self) -> Vec<usize> {
        self.indexes(|line| line.flags.iter().any(|f| f == "slave"))
    }

    fn replicas_of(&self, master_id: &str) -> Vec<usize> {
        self.indexes(|line| {
            line.flags.iter().any(|f| f == "slave") && line.master_id.as_deref() == Some(master_id)
        })
    }

    fn master_of(&self, id: &str) -> Option<usize> {
        match self.role(id) {
            Role::Replica(master) => self.index(&master),
            _ => None,
        }
    }

    fn owner_of_slot(&self, slot: u16) -> Option<usize> {
        self.lines
            .values()
            .filter(|line| line.flags.iter().any(|f| f == "master"))
            .find(|line| line.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .and_then(|line| self.index(&line.id))
    }

    fn indexes(&self, keep: impl Fn(&NodeLine) -> bool) -> Vec<usize> {
        let mut indexes: Vec<usize> = self
            .lines
            .values()
            .filter(|line| keep(line))
            .filter_map(|line| self.index(&line.id))
            .collect();
        indexes.sort_unstable();
        indexes
    }
}

/// The hash slot of `key`: CRC16/XMODEM of the key, or of the part between
/// the first `{` and the next `}` if that is not empty, modulo 16384.
fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16_xmodem(hashed) % SLOTS
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from CLUSTER KEYSLOT on redis 7.0.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"lock:{job}"), key_slot(b"job"));
        assert_eq!(key_slot(b"lock:{job}"), key_slot(b"lock:{job}:fence"));
        // An empty tag hashes the whole key.
        assert_eq!(key_slot(b"{}x"), crc16_xmodem(b"{}x") % SLOTS);
        assert_eq!(key_slot(b"a{b}{c}"), key_slot(b"b"));
    }

    #[test]
    fn parses_cluster_nodes() {
        let ids = vec!["a".repeat(40), "b".repeat(40), "c".repeat(40)];
        let raw = format!(
            "{a} 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461->-{b}]\n\
             {b} 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-16383\n\
             {c} 127.0.0.1:7002@17002 slave {a} 0 0 1 connected\n",
            a = ids[0],
            b = ids[1],
            c = ids[2]
        );
        let view = View::parse(&raw, &ids);
        assert_eq!(view.masters(), [0, 1]);
        assert_eq!(view.replicas(), [2]);
        assert_eq!(view.replicas_of(&ids[0]), [2]);
        assert_eq!(view.master_of(&ids[2]), Some(0));
        assert_eq!(view.owner_of_slot(0), Some(0));
        assert_eq!(view.owner_of_slot(5461), Some(1));
        assert_eq!(view.role(&ids[1]), Role::Master(vec![(5461, 16383)]));
        assert_eq!(
            info_field("cluster_state:ok\r\nx:1", "cluster_state"),
            Some("ok")
        );
    }
}
