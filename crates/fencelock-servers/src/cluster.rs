//! A Redis Cluster: [`ClusterSetup`], masters with replicas on free
//! loopback ports (each port's cluster bus, `port + 10000`, free too), each
//! a [`RedisServer`] in its own directory under the cluster's temporary
//! directory, configured by [`ClusterConfig`].
//!
//! The cluster is made as `redis-cli --cluster create --cluster-replicas
//! R` makes it, with commands only (no `redis-cli` needed): distinct config
//! epochs, the slots split evenly over the first masters
//! ([`slot_ranges`]), every node meets the first, each other node
//! replicates a master (node `M + k` follows master `k mod M`).
//! [`ClusterSetup::start`] returns once every node reports
//! `cluster_state:ok`, the masters own every slot, and every master has
//! its replicas in sync.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::files::temp_dir;
use crate::redis_admin::{info_field, online_replicas};
use crate::redis_config::RedisConfig;
use crate::redis_server::RedisServer;
use crate::wait::poll_until;

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// How long each step of the creation may take.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one command sent while creating or polling.
const CMD_TIMEOUT: Duration = Duration::from_secs(2);

/// How to start a [`ClusterSetup`]. The default: 3 masters with a replica
/// each, a node timeout of 2 s.
///
/// `N` is how a node is described: a [`RedisConfig`] here; a caller with a
/// configuration of its own (the test kit's) maps it with
/// [`ClusterConfig::map_node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig<N = RedisConfig> {
    /// Number of masters (at least 3, as `redis-cli --cluster create`
    /// requires).
    pub masters: usize,
    /// Replicas per master (`--cluster-replicas`).
    pub replicas_per_master: usize,
    /// `cluster-node-timeout`: how long a node may be unreachable before it
    /// is considered failing (and a replica takes over).
    pub node_timeout: Duration,
    /// How every node is started: extra arguments, persistence, `DEBUG`. A
    /// password or TLS is refused.
    ///
    /// Added before these extra arguments (so they can override them):
    /// `--cluster-enabled yes`, `--cluster-config-file nodes.conf`,
    /// `--cluster-node-timeout`, `--repl-diskless-sync yes`,
    /// `--repl-diskless-sync-delay 0` (Debian's default of 5 s would delay
    /// every replica link), `--cluster-replica-validity-factor 0` (a replica
    /// always may take over, however long it was cut off), and
    /// `--cluster-allow-replica-migration no` (replicas stay with their
    /// masters).
    pub node: N,
    /// Where the cluster's directory is made (else the system's temporary
    /// directory).
    pub dir_in: Option<PathBuf>,
}

impl<N: Default> Default for ClusterConfig<N> {
    fn default() -> Self {
        ClusterConfig {
            masters: 3,
            replicas_per_master: 1,
            node_timeout: Duration::from_millis(2000),
            node: N::default(),
            dir_in: None,
        }
    }
}

impl<N> ClusterConfig<N> {
    /// The same cluster with every node described by `map(node)`.
    pub fn map_node<M>(self, map: impl FnOnce(N) -> M) -> ClusterConfig<M> {
        ClusterConfig {
            masters: self.masters,
            replicas_per_master: self.replicas_per_master,
            node_timeout: self.node_timeout,
            node: map(self.node),
            dir_in: self.dir_in,
        }
    }
}

/// A started cluster. Dropping it kills every node and removes the
/// directory.
#[derive(Debug)]
pub struct ClusterSetup {
    nodes: Vec<RedisServer>,
    ids: Vec<String>,
    config: ClusterConfig,
    dir: TempDir,
}

/// The processes of a [`ClusterSetup`], for callers that keep them their
/// own way ([`ClusterSetup::into_parts`]).
#[derive(Debug)]
pub struct ClusterParts {
    /// The nodes, by index (the first `masters` were made masters).
    pub nodes: Vec<RedisServer>,
    /// Their cluster node ids (`CLUSTER MYID`), by index.
    pub ids: Vec<String>,
    /// The cluster's directory, which holds theirs: drop it last.
    pub dir: TempDir,
}

impl ClusterSetup {
    /// Starts `masters × (1 + replicas_per_master)` nodes, creates the
    /// cluster and waits until it is ready (see the module docs).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for fewer than 3 masters, a password or TLS; the
    /// error of a node that fails to start; [`Error::Command`] for a
    /// creation command a node refuses; [`Error::Timeout`] if a step does
    /// not complete in time.
    pub fn start(config: ClusterConfig) -> Result<ClusterSetup> {
        if config.masters < 3 {
            return Err(Error::Config(format!(
                "a Redis Cluster needs at least 3 masters, not {}",
                config.masters
            )));
        }
        if config.node.password.is_some() || config.node.tls.is_some() {
            return Err(Error::Config(
                "a Redis Cluster with a password or TLS".to_owned(),
            ));
        }
        let dir = temp_dir("fencelock-cluster-", config.dir_in.as_deref())?;
        let total = config.masters * (1 + config.replicas_per_master);
        let nodes = (0..total)
            .map(|index| RedisServer::start(node_config(&config, dir.path(), index)))
            .collect::<Result<Vec<_>>>()?;
        let ids = nodes
            .iter()
            .map(|node| node.query::<String>(&["CLUSTER", "MYID"], CMD_TIMEOUT))
            .collect::<Result<Vec<_>>>()?;
        let cluster = ClusterSetup {
            nodes,
            ids,
            config,
            dir,
        };
        cluster.create()?;
        tracing::debug!(url = %cluster.url(), "Redis Cluster ready");
        Ok(cluster)
    }

    /// The configuration the cluster was started with.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Every node, by index.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node ids, by index.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The cluster's directory (one `node-N-…` directory per node).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis+cluster://127.0.0.1:P0,127.0.0.1:P1,…`.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// The processes, their ids and the directory, to keep apart.
    pub fn into_parts(self) -> ClusterParts {
        ClusterParts {
            nodes: self.nodes,
            ids: self.ids,
            dir: self.dir,
        }
    }

    /// What `redis-cli --cluster create` does (see the module docs).
    fn create(&self) -> Result<()> {
        let run = |index: usize, args: &[&str]| -> Result<()> {
            self.nodes[index].command(args, CMD_TIMEOUT).map(drop)
        };
        for index in 0..self.nodes.len() {
            run(
                index,
                &["CLUSTER", "SET-CONFIG-EPOCH", &(index + 1).to_string()],
            )?;
        }
        for (master, (from, to)) in slot_ranges(self.config.masters).into_iter().enumerate() {
            run(
                master,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &from.to_string(),
                    &to.to_string(),
                ],
            )?;
        }
        let first = self.nodes[0].port().to_string();
        for index in 1..self.nodes.len() {
            run(index, &["CLUSTER", "MEET", "127.0.0.1", &first])?;
        }
        let all = self.nodes.len().to_string();
        self.wait("every node to know every other", || {
            for node in &self.nodes {
                let info = self.info(node, &["CLUSTER", "INFO"])?;
                let known = info_field(&info, "cluster_known_nodes");
                if known != Some(all.as_str()) {
                    return Err(format!("{} knows {known:?} nodes", node.addr()));
                }
            }
            Ok(())
        })?;
        for replica in self.config.masters..self.nodes.len() {
            let master = &self.ids[replica % self.config.masters];
            self.wait("a replica to follow its master", || {
                self.info(&self.nodes[replica], &["CLUSTER", "REPLICATE", master])
                    .map(drop)
            })?;
        }
        self.wait("the Cluster to be ready", || self.ready())
    }

    /// `Ok` when every node reports `cluster_state:ok`, the masters own
    /// every slot and each has its replicas in sync.
    fn ready(&self) -> Result<(), String> {
        let mut masters = 0;
        for node in &self.nodes {
            let info = self.info(node, &["CLUSTER", "INFO"])?;
            for (field, expected) in [("cluster_state", "ok"), ("cluster_slots_ok", "16384")] {
                let value = info_field(&info, field);
                if value != Some(expected) {
                    return Err(format!("{}: {field} is {value:?}", node.addr()));
                }
            }
            let replication = self.info(node, &["INFO", "replication"])?;
            if info_field(&replication, "role") == Some("master") {
                masters += 1;
                let online = online_replicas(&replication);
                if online != self.config.replicas_per_master {
                    return Err(format!(
                        "master {} has {online} replica(s) in sync (log: {})",
                        node.addr(),
                        node.last_log_line()
                    ));
                }
            }
        }
        if masters != self.config.masters {
            return Err(format!("{masters} masters, not {}", self.config.masters));
        }
        Ok(())
    }

    fn info(&self, node: &RedisServer, args: &[&str]) -> Result<String, String> {
        node.query(args, CMD_TIMEOUT).map_err(|e| e.to_string())
    }

    fn wait(&self, what: &str, check: impl FnMut() -> Result<(), String>) -> Result<()> {
        poll_until(READY_TIMEOUT, check).map_err(|last| Error::Timeout {
            what: what.to_owned(),
            waited: READY_TIMEOUT,
            last,
        })
    }
}

/// The slot ranges of `masters` masters, as `redis-cli --cluster create`
/// splits them: 3 masters get 0-5460, 5461-10922 and 10923-16383.
pub fn slot_ranges(masters: usize) -> Vec<(u16, u16)> {
    let per_master = f64::from(SLOTS) / masters as f64;
    let mut ranges = Vec::with_capacity(masters);
    let (mut first, mut cursor) = (0u16, 0.0f64);
    for index in 0..masters {
        let mut last = (cursor + per_master - 1.0).round() as u16;
        if last >= SLOTS || index == masters - 1 {
            last = SLOTS - 1;
        }
        last = last.max(first);
        ranges.push((first, last));
        first = last.saturating_add(1);
        cursor += per_master;
    }
    ranges
}

/// Node `index`'s configuration: the cluster settings, then the caller's.
fn node_config(config: &ClusterConfig, dir: &Path, index: usize) -> RedisConfig {
    let mut node = config.node.clone();
    let timeout_ms = config.node_timeout.as_millis().to_string();
    let mut args: Vec<String> = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &timeout_ms,
        "--repl-diskless-sync",
        "yes",
        "--cluster-replica-validity-factor",
        "0",
        "--cluster-allow-replica-migration",
        "no",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    args.append(&mut node.args);
    node.args = args;
    node.cluster_bus = true;
    node.dir_in = Some(dir.to_owned());
    node.dir_prefix = format!("node-{index}-");
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_split_as_redis_cli_splits_them() {
        assert_eq!(slot_ranges(3), [(0, 5460), (5461, 10922), (10923, 16383)]);
        let four = slot_ranges(4);
        assert_eq!(four.first(), Some(&(0, 4095)));
        assert_eq!(four.last().map(|r| r.1), Some(16383));
        for pair in four.windows(2) {
            assert_eq!(pair[0].1 + 1, pair[1].0);
        }
    }
}
