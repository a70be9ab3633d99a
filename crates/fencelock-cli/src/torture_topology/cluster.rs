//! `--topology cluster`: three masters with a replica each, all private,
//! created with `CLUSTER ADDSLOTSRANGE`, `CLUSTER MEET` and `CLUSTER
//! REPLICATE` (as `redis-cli --cluster create` does), and the resource's
//! own server.
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

use super::{
    SETTLE, data_args, detection, failed, failure, info_field, online_replicas, poll, query,
    takes_writes,
};
use crate::private_redis::{Options, PrivateRedis};

/// Masters, each with one replica.
const MASTERS: usize = 3;
/// The slot ranges of the masters.
const RANGES: [(u16, u16); MASTERS] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// The Cluster topology.
#[derive(Debug)]
pub(crate) struct Cluster {
    nodes: Vec<PrivateRedis>,
    ids: Vec<String>,
    resource: PrivateRedis,
    lock_url: String,
    /// The node the node-level calls act on, and the key it was aimed by.
    primary: usize,
    key: String,
    admin: String,
    paused: Option<usize>,
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
        let mut args = data_args();
        args.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &detection(ttl).as_millis().to_string(),
                // A replica may always take over, however long it was cut
                // off; replicas stay with their masters.
                "--cluster-replica-validity-factor",
                "0",
                "--cluster-allow-replica-migration",
                "no",
            ]
            .iter()
            .map(|a| (*a).to_string()),
        );
        let mut nodes = Vec::new();
        for i in 0..MASTERS * 2 {
            nodes.push(
                PrivateRedis::start_with(Options {
                    aof: true,
                    debug: true,
                    args: args.clone(),
                    cluster_bus: true,
                    ..Options::default()
                })
                .await
                .map_err(|e| e.context(format!("cannot start node {i} of the Cluster")))?,
            );
        }
        let mut ids = Vec::new();
        for n in &nodes {
            ids.push(
                query::<String>(n.url(), redis::cmd("CLUSTER").arg("MYID"))
                    .await
                    .map_err(|e| anyhow::anyhow!("CLUSTER MYID: {e}"))?,
            );
        }
        let lock_url = format!(
            "redis+cluster://{}",
            nodes
                .iter()
                .map(PrivateRedis::addr)
                .collect::<Vec<_>>()
                .join(",")
        );
        let resource = PrivateRedis::start().await?;
        let admin = nodes[0].url().to_string();
        let cluster = Cluster {
            nodes,
            ids,
            resource,
            lock_url,
            primary: 0,
            key: String::new(),
            admin,
            paused: None,
        };
        cluster
            .create()
            .await
            .map_err(|e| anyhow::anyhow!("cannot create the Cluster: {e}"))?;
        Ok(cluster)
    }

    /// What `redis-cli --cluster create --cluster-replicas 1` does: slots
    /// to the masters, distinct config epochs, every node meets the first,
    /// each replica follows its master.
    async fn create(&self) -> Result<()> {
        let run = async |url: &str, cmd: &redis::Cmd| -> Result<()> {
            query::<redis::Value>(url, cmd)
                .await
                .map(|_| ())
                .map_err(failure)
        };
        for (i, n) in self.nodes.iter().enumerate() {
            run(
                n.url(),
                redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1),
            )
            .await?;
        }
        for (m, (from, to)) in RANGES.iter().enumerate() {
            run(
                self.nodes[m].url(),
                redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(from).arg(to),
            )
            .await?;
        }
        let first = self.nodes[0].port();
        for n in &self.nodes[1..] {
            run(
                n.url(),
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(first),
            )
            .await?;
        }
        let all = self.nodes.len().to_string();
        poll("every node to know every other", SETTLE, async || {
            for n in &self.nodes {
                let info: String = query(n.url(), redis::cmd("CLUSTER").arg("INFO")).await?;
                if info_field(&info, "cluster_known_nodes") != Some(all.as_str()) {
                    return Err(format!("{} does not know every node yet", n.addr()));
                }
            }
            Ok(())
        })
        .await?;
        for r in MASTERS..self.nodes.len() {
            let master = &self.ids[r - MASTERS];
            poll("a replica to follow its master", SETTLE, async || {
                query::<String>(
                    self.nodes[r].url(),
                    redis::cmd("CLUSTER").arg("REPLICATE").arg(master),
                )
                .await
            })
            .await?;
        }
        poll("the Cluster to be ready", SETTLE, async || {
            self.healthy().await
        })
        .await
    }

    /// `Ok` when every running node reports `cluster_state:ok` and every
    /// master has its replica in sync.
    async fn healthy(&self) -> std::result::Result<(), String> {
        let mut masters = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            if self.paused == Some(i) {
                continue;
            }
            let info: String = query(n.url(), redis::cmd("CLUSTER").arg("INFO")).await?;
            if info_field(&info, "cluster_state") != Some("ok") {
                return Err(format!("{}: cluster_state is not ok", n.addr()));
            }
            let repl: String = query(n.url(), redis::cmd("INFO").arg("replication")).await?;
            if info_field(&repl, "role") == Some("master") {
                masters += 1;
                if online_replicas(n.url()).await? != 1 {
                    return Err(format!("master {} has no replica in sync", n.addr()));
                }
            }
        }
        if masters != MASTERS {
            return Err(format!("{masters} masters, not {MASTERS}"));
        }
        Ok(())
    }

    /// Stops every process.
    pub(crate) async fn stop(self) {
        for n in self.nodes {
            n.stop().await;
        }
        self.resource.stop().await;
    }

    /// The node serving `slot`, as the first answering node (not `skip`)
    /// sees it.
    async fn owner(&self, slot: i64, skip: Option<usize>) -> std::result::Result<usize, String> {
        let mut last = String::from("no node answers");
        for (i, n) in self.nodes.iter().enumerate() {
            if Some(i) == skip || self.paused == Some(i) {
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
            if self.paused == Some(i) {
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
                    if Some(i) == self.paused {
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
            if self.paused == Some(i) {
                continue;
            }
            match query(n.url(), redis::cmd("CLUSTER").arg("KEYSLOT").arg(&self.key)).await {
                Ok(slot) => return Ok(slot),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn point(&mut self, node: usize) {
        self.primary = node;
        self.admin = self.nodes[node].url().to_string();
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
        &self.admin
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
        self.point(node);
        Ok(())
    }

    async fn pause(&mut self) -> Result<()> {
        self.nodes[self.primary].pause().map_err(|e| failed(&e))?;
        self.paused = Some(self.primary);
        Ok(())
    }

    async fn resume(&mut self) -> Result<()> {
        match self.paused.take() {
            Some(node) => self.nodes[node].resume().map_err(|e| failed(&e)),
            None => Ok(()),
        }
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> Result<()> {
        let old = self.primary;
        self.paused = None;
        if keep_data {
            return self.nodes[old]
                .restart(true, down)
                .await
                .map_err(|e| failed(&e));
        }
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
        self.point(replica);
        self.nodes[old]
            .start_again(false, &[])
            .await
            .map_err(|e| failed(&e))?;
        self.settled(replica, slot).await
    }

    async fn failover(&mut self) -> Result<String> {
        let old = self.primary;
        let slot = self.slot().await.map_err(failure)?;
        let replica = self.replica_of(old).await.map_err(failure)?;
        query::<String>(
            self.nodes[replica].url(),
            redis::cmd("CLUSTER").arg("FAILOVER"),
        )
        .await
        .map_err(|e| failure(format!("CLUSTER FAILOVER: {e}")))?;
        self.point(replica);
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
