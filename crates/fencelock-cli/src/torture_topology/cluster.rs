//! `--topology cluster`: three masters with a replica each, all private
//! (a `fencelock_servers::ClusterSetup`, created with `CLUSTER
//! ADDSLOTSRANGE`, `CLUSTER MEET` and `CLUSTER REPLICATE` as `redis-cli
//! --cluster create` does, ready once every node reports
//! `cluster_state:ok` and every master has its replica in sync), and the
//! resource's own server.
//!
//! - `aim`: the master of the lock key's slot (`CLUSTER KEYSLOT`, `CLUSTER
//!   SLOTS`).
//! - `restart` with data: kill -9 and restart that master within the ttl,
//!   before the cluster notices (it comes back as the master, with its
//!   append-only file and its `nodes.conf`).
//! - `restart` without data (`kill-wipe`): a crash. The master stays down
//!   until its replica has taken over its slots and takes writes, then
//!   comes back with its `nodes.conf` but no data, and rejoins as the new
//!   master's replica; done once it is in sync. No grant is lost: every
//!   grant waited for the replica.
//! - `failover`: `CLUSTER FAILOVER` on the master's replica (coordinated:
//!   the master stops taking writes until the replica has caught up; it
//!   becomes the replica). Done once every node agrees and the new master
//!   takes writes with its replica in sync.

use std::time::Duration;

use fencelock_torture::{Result, Topology};

use super::shared::{
    Aimed, SETTLE, data_node, detection, failed, failure, online_replicas, poll, query,
    takes_writes,
};
use anyhow::Context;
use fencelock_servers::{ClusterConfig, ClusterSetup};

use crate::private_redis::{PrivateRedis, redis_error, start_blocking};

/// Masters, each with one replica.
const MASTERS: usize = 3;

/// The Cluster topology.
#[derive(Debug)]
pub(crate) struct Cluster {
    nodes: Aimed,
    ids: Vec<String>,
    resource: PrivateRedis,
    lock_url: String,
    /// The key the node-level calls were aimed by.
    key: String,
    /// The cluster's directory, which holds the nodes': removed last.
    _dir: tempfile::TempDir,
}

/// A write probe in `key`'s slot: a key with the same hash tag.
fn probe_key(key: &str) -> String {
    let tag = key
        .find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    format!("fencelock-torture-probe{{{tag}}}")
}

impl Cluster {
    /// Starts the nodes and the resource's server, creates the cluster;
    /// returns once every node reports `cluster_state:ok` and every master
    /// has its replica in sync.
    pub(crate) async fn start(ttl: Duration) -> anyhow::Result<Self> {
        let node = data_node();
        let config = ClusterConfig {
            masters: MASTERS,
            replicas_per_master: 1,
            node_timeout: detection(ttl),
            dir_in: node.dir_in.clone(),
            node,
        };
        let setup = start_blocking(move || ClusterSetup::start(config))
            .await?
            .map_err(redis_error)
            .context("cannot create the Cluster")?;
        let lock_url = setup.url();
        let parts = setup.into_parts();
        let nodes: Vec<PrivateRedis> = parts
            .nodes
            .into_iter()
            .map(PrivateRedis::from_server)
            .collect();
        let resource = PrivateRedis::start().await?;
        Ok(Cluster {
            nodes: Aimed::new(nodes),
            ids: parts.ids,
            resource,
            lock_url,
            key: String::new(),
            _dir: parts.dir,
        })
    }

    /// Stops every process.
    pub(crate) async fn stop(self) {
        self.nodes.stop().await;
        self.resource.stop().await;
    }

    /// The node serving `slot`, as the first answering node (not `skip`)
    /// sees it.
    async fn owner(&self, slot: i64, skip: Option<usize>) -> std::result::Result<usize, String> {
        let mut last = String::from("no node answers");
        for (i, n) in self.nodes.iter().enumerate() {
            if Some(i) == skip || self.nodes.paused == Some(i) {
                continue;
            }
            let slots: Vec<redis::Value> =
                match query(n.url(), redis::cmd("CLUSTER").arg("SLOTS")).await {
                    Ok(v) => v,
                    Err(e) => {
                        last = e;
                        continue;
                    }
                };
            // [[from, to, [ip, port, id, …], replicas…], …]
            let int = |v: Option<&redis::Value>| match v {
                Some(redis::Value::Int(i)) => Some(*i),
                _ => None,
            };
            for range in &slots {
                let redis::Value::Array(items) = range else {
                    continue;
                };
                let (Some(from), Some(to)) = (int(items.first()), int(items.get(1))) else {
                    continue;
                };
                if slot < from || slot > to {
                    continue;
                }
                let Some(redis::Value::Array(master)) = items.get(2) else {
                    continue;
                };
                if let Some(node) = int(master.get(1))
                    .and_then(|p| self.nodes.iter().position(|n| i64::from(n.port()) == p))
                {
                    return Ok(node);
                }
            }
            last = format!("{} serves slot {slot} from no known node", n.addr());
        }
        Err(last)
    }

    /// The replica of `master`, as `master` (or else another node) sees it.
    async fn replica_of(&self, master: usize) -> std::result::Result<usize, String> {
        let id = &self.ids[master];
        for (i, n) in self.nodes.iter().enumerate() {
            if self.nodes.paused == Some(i) {
                continue;
            }
            let Ok(text) = query::<String>(n.url(), redis::cmd("CLUSTER").arg("NODES")).await
            else {
                continue;
            };
            for line in text.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() > 3
                    && f[3] == id
                    && f[2].contains("slave")
                    && !f[2].contains("fail")
                    && let Some(r) = self.ids.iter().position(|x| x == f[0])
                {
                    return Ok(r);
                }
            }
        }
        Err(format!("no replica of {} found", self.nodes[master].addr()))
    }

    /// Waits until every answering node sees `node` serving `slot`, and it
    /// takes writes there with its replica in sync.
    async fn settled(&self, node: usize, slot: i64) -> Result<()> {
        let url = self.nodes[node].url();
        let probe = probe_key(&self.key);
        poll(
            "the new master to serve the slot and take writes with its replica in sync",
            SETTLE,
            async || {
                for (i, _) in self.nodes.iter().enumerate() {
                    if Some(i) == self.nodes.paused {
                        continue;
                    }
                    let owner = self.owner(slot, None).await?;
                    if owner != node {
                        return Err(format!("node {i} sees another owner"));
                    }
                }
                takes_writes(url, &probe).await?;
                match online_replicas(url).await? {
                    1 => Ok(()),
                    n => Err(format!("{n} replicas in sync")),
                }
            },
        )
        .await
    }

    async fn slot(&self) -> std::result::Result<i64, String> {
        let mut last = String::from("no node answers");
        for (i, n) in self.nodes.iter().enumerate() {
            if self.nodes.paused == Some(i) {
                continue;
            }
            match query(n.url(), redis::cmd("CLUSTER").arg("KEYSLOT").arg(&self.key)).await {
                Ok(slot) => return Ok(slot),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

impl Topology for Cluster {
    fn name(&self) -> &str {
        "cluster"
    }

    fn lock_url(&self) -> &str {
        &self.lock_url
    }

    fn admin_url(&self) -> &str {
        &self.nodes.admin
    }

    fn resource_url(&self) -> &str {
        self.resource.url()
    }

    fn controls_server(&self) -> bool {
        true
    }

    fn replicas(&self) -> u32 {
        1
    }

    fn proxyable(&self) -> bool {
        false
    }

    async fn aim(&mut self, key: &str) -> Result<()> {
        self.key = key.to_string();
        let slot = self.slot().await.map_err(failure)?;
        let node = self.owner(slot, None).await.map_err(failure)?;
        self.nodes.point(node);
        Ok(())
    }

    async fn pause(&mut self) -> Result<()> {
        self.nodes.pause()
    }

    async fn resume(&mut self) -> Result<()> {
        self.nodes.resume()
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> Result<()> {
        if keep_data {
            return self.nodes.restart_with_data(down).await;
        }
        let old = self.nodes.primary;
        self.nodes.paused = None;
        let slot = self.slot().await.map_err(failure)?;
        let replica = self.replica_of(old).await.map_err(failure)?;
        self.nodes[old].kill().await;
        // It takes writes only once a replica is in sync again
        // (min-replicas-to-write): that is the old master, restarted below.
        poll("the replica to take over", SETTLE, async || {
            match self.owner(slot, Some(old)).await? {
                owner if owner == replica => Ok(()),
                _ => Err("the replica does not serve the slot yet".into()),
            }
        })
        .await?;
        self.nodes.point(replica);
        self.nodes[old]
            .start_again(false, &[])
            .await
            .map_err(|e| failed(&e))?;
        self.settled(replica, slot).await
    }

    async fn failover(&mut self) -> Result<String> {
        let old = self.nodes.primary;
        let slot = self.slot().await.map_err(failure)?;
        let replica = self.replica_of(old).await.map_err(failure)?;
        query::<String>(
            self.nodes[replica].url(),
            redis::cmd("CLUSTER").arg("FAILOVER"),
        )
        .await
        .map_err(|e| failure(format!("CLUSTER FAILOVER: {e}")))?;
        self.nodes.point(replica);
        self.settled(replica, slot).await?;
        Ok(format!(
            "{} -> {}",
            self.nodes[old].addr(),
            self.nodes[replica].addr()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::probe_key;

    #[test]
    fn the_probe_shares_the_lock_keys_slot() {
        assert_eq!(
            probe_key("torture:ab12:{t0}"),
            "fencelock-torture-probe{t0}"
        );
        assert_eq!(probe_key("plain"), "fencelock-torture-probe{plain}");
    }
}
