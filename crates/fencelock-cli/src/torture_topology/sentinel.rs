//! `--topology sentinel`: one primary, two replicas, three sentinels
//! (quorum 2), all private (a `fencelock_servers::SentinelSetup`, ready
//! once every sentinel has quorum and knows both replicas and the other
//! sentinels, and both replicas are in sync), and the resource's own
//! server.
//!
//! - `aim`: the primary the sentinels name (`SENTINEL
//!   GET-MASTER-ADDR-BY-NAME`).
//! - `restart` with data: kill -9 and restart the primary within the ttl,
//!   before the sentinels notice (it comes back as the primary, with its
//!   append-only file).
//! - `restart` without data (`kill-wipe`): a crash. The primary stays down
//!   until the sentinels have promoted a replica that takes writes, then
//!   comes back empty as a replica of it; done once both replicas are in
//!   sync again. No grant is lost: every grant waited for both replicas.
//! - `failover`: `SENTINEL FAILOVER`; once every sentinel names the new
//!   primary, the old one is made a replica of it at once (`REPLICAOF`,
//!   `CONFIG REWRITE`). Sentinel would convert it only about 10 s later,
//!   and meanwhile the new primary has one replica, so no grant waiting
//!   for two could be acknowledged. Done once the new primary takes writes
//!   with both replicas in sync.

use std::time::Duration;

use fencelock_torture::{Result, Topology};

use super::shared::{
    Aimed, SETTLE, data_node, detection, failed, failure, info_field, online_replicas, poll, query,
    takes_writes,
};
use anyhow::Context;
use fencelock_servers::{SentinelConfig, SentinelSetup};

use crate::private_redis::{PrivateRedis, redis_error, start_blocking};

/// The name the sentinels monitor the primary under.
const MASTER: &str = "fencelock";
/// A key no lock uses, for write probes.
const PROBE: &str = "fencelock-torture-probe";

/// The Sentinel topology.
#[derive(Debug)]
pub(crate) struct Sentinel {
    data: Aimed,
    sentinels: Vec<PrivateRedis>,
    resource: PrivateRedis,
    lock_url: String,
    /// The set-up's directory, which holds the nodes': removed last.
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts the data nodes, the sentinels and the resource's server;
    /// returns once every sentinel has quorum and knows both replicas and
    /// the other sentinels, and both replicas are in sync.
    pub(crate) async fn start(ttl: Duration) -> anyhow::Result<Self> {
        let data = data_node();
        let config = SentinelConfig {
            master_name: MASTER.to_string(),
            replicas: 2,
            sentinels: 3,
            quorum: 2,
            down_after: detection(ttl),
            failover_timeout: Duration::from_millis(2000),
            dir_in: data.dir_in.clone(),
            data,
            sentinel_conf_lines: Vec::new(),
        };
        let setup = start_blocking(move || SentinelSetup::start(config))
            .await?
            .map_err(redis_error)
            .context("cannot start the Sentinel")?;
        let lock_url = setup.url();
        let parts = setup.into_parts();
        let data: Vec<PrivateRedis> = parts
            .data
            .into_iter()
            .map(PrivateRedis::from_server)
            .collect();
        let sentinels = parts
            .sentinels
            .into_iter()
            .map(PrivateRedis::from_server)
            .collect();
        let resource = PrivateRedis::start().await?;
        Ok(Sentinel {
            data: Aimed::new(data),
            sentinels,
            resource,
            lock_url,
            _dir: parts.dir,
        })
    }

    /// Stops every process, the sentinels first (so that none reacts).
    pub(crate) async fn stop(self) {
        for s in self.sentinels {
            s.stop().await;
        }
        self.data.stop().await;
        self.resource.stop().await;
    }

    /// The data node every answering sentinel names as the primary.
    async fn named_primary(&self) -> std::result::Result<usize, String> {
        let mut agreed = None;
        for s in &self.sentinels {
            let (_, port): (String, u16) = query(
                s.url(),
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER),
            )
            .await?;
            let node = self
                .data
                .iter()
                .position(|d| d.port() == port)
                .ok_or_else(|| format!("sentinel {} names port {port}", s.addr()))?;
            match agreed {
                Some(a) if a != node => {
                    return Err(format!("the sentinels name {a} and {node}"));
                }
                _ => agreed = Some(node),
            }
        }
        agreed.ok_or_else(|| "no sentinel".to_string())
    }

    /// Waits until the sentinels name a primary other than `old` that
    /// answers `ROLE` as master; returns it.
    async fn promoted(&self, old: usize) -> Result<usize> {
        poll("the sentinels to promote a replica", SETTLE, async || {
            let node = self.named_primary().await?;
            if node == old {
                return Err(format!("the sentinels still name data node {old}"));
            }
            let role: Vec<redis::Value> = query(self.data[node].url(), &redis::cmd("ROLE")).await?;
            match role.first() {
                Some(redis::Value::BulkString(r)) if r == b"master" => Ok(node),
                _ => Err(format!("data node {node} is not a master yet")),
            }
        })
        .await
    }

    /// Waits until `node` takes writes with both replicas in sync.
    async fn settled(&self, node: usize) -> Result<()> {
        let url = self.data[node].url();
        poll(
            "the new primary to take writes with 2 replicas in sync",
            SETTLE,
            async || {
                takes_writes(url, PROBE).await?;
                match online_replicas(url).await? {
                    2 => Ok(()),
                    n => Err(format!("{n} replica(s) in sync")),
                }
            },
        )
        .await
    }
}

impl Topology for Sentinel {
    fn name(&self) -> &str {
        "sentinel"
    }

    fn lock_url(&self) -> &str {
        &self.lock_url
    }

    fn admin_url(&self) -> &str {
        &self.data.admin
    }

    fn resource_url(&self) -> &str {
        self.resource.url()
    }

    fn controls_server(&self) -> bool {
        true
    }

    fn replicas(&self) -> u32 {
        2
    }

    fn proxyable(&self) -> bool {
        false
    }

    async fn aim(&mut self, _key: &str) -> Result<()> {
        let node = self.named_primary().await.map_err(failure)?;
        self.data.point(node);
        Ok(())
    }

    async fn pause(&mut self) -> Result<()> {
        self.data.pause()
    }

    async fn resume(&mut self) -> Result<()> {
        self.data.resume()
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> Result<()> {
        if keep_data {
            return self.data.restart_with_data(down).await;
        }
        let old = self.data.primary;
        self.data.paused = None;
        self.data[old].kill().await;
        let new = self.promoted(old).await?;
        self.data.point(new);
        let new_port = self.data[new].port();
        let replicaof = [
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            new_port.to_string(),
        ];
        self.data[old]
            .start_again(false, &replicaof)
            .await
            .map_err(|e| failed(&e))?;
        // Its role in its own redis.conf, for a later restart.
        let _ = query::<String>(self.data[old].url(), redis::cmd("CONFIG").arg("REWRITE")).await;
        self.settled(new).await
    }

    async fn failover(&mut self) -> Result<String> {
        let old = self.data.primary;
        let mut refused = None;
        for s in &self.sentinels {
            match query::<String>(s.url(), redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER)).await
            {
                Ok(_) => {
                    refused = None;
                    break;
                }
                Err(e) => refused = Some(e),
            }
        }
        if let Some(e) = refused {
            return Err(failure(format!("SENTINEL FAILOVER: {e}")));
        }
        let new = self.promoted(old).await?;
        self.data.point(new);
        // What Sentinel does about 10 s later: the old primary follows the
        // new one.
        let old_url = self.data[old].url().to_string();
        let new_port = self.data[new].port();
        poll("the old primary to become a replica", SETTLE, async || {
            let info: String = query(&old_url, redis::cmd("INFO").arg("replication")).await?;
            if info_field(&info, "role") == Some("slave")
                && info_field(&info, "master_port") == Some(new_port.to_string().as_str())
            {
                return Ok(());
            }
            query::<String>(
                &old_url,
                redis::cmd("REPLICAOF").arg("127.0.0.1").arg(new_port),
            )
            .await?;
            let _ = query::<String>(&old_url, redis::cmd("CONFIG").arg("REWRITE")).await;
            Err("converted it, checking again".to_string())
        })
        .await?;
        self.settled(new).await?;
        Ok(format!(
            "{} -> {}",
            self.data[old].addr(),
            self.data[new].addr()
        ))
    }
}
