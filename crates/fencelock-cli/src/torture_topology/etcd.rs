//! `--topology etcd`: a private 3-member etcd cluster for the locks
//! ([`PrivateEtcd`]) and the resource's own redis-server, which no nemesis
//! touches.
//!
//! - `aim`: the leader and a follower in turn (a pause or kill of the
//!   leader forces an election; of a follower, only the clients on it
//!   notice).
//! - `pause`: SIGSTOP the aimed member; `restart` (`kill-restart`): kill -9
//!   it, and start it again after `down` on its ports with its data
//!   directory; done once every member answers and names one leader.
//! - `failover`: a leader change: `MoveLeader` from the leader to the next
//!   member; done once every member names the new leader.
//!
//! Grants are committed by a quorum before etcd replies, so no nemesis
//! here rolls anything back: the checkers excuse nothing on etcd.

use std::time::Duration;

use fencelock_torture::{Result, Topology};

use super::shared::{SETTLE, failed, failure, poll};
use crate::private_etcd::PrivateEtcd;
use crate::private_redis::PrivateRedis;

/// The etcd topology.
#[derive(Debug)]
pub(crate) struct Etcd {
    cluster: PrivateEtcd,
    resource: PrivateRedis,
    lock_url: String,
    /// The member the node-level calls act on.
    aimed: usize,
    aimed_leader: bool,
    /// How many times `aim` was called: even calls pick the leader.
    aims: u64,
    paused: Option<usize>,
}

impl Etcd {
    /// Starts the members and the resource's server.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let cluster = PrivateEtcd::start().await?;
        let resource = PrivateRedis::start().await?;
        Ok(Etcd {
            lock_url: cluster.url(),
            cluster,
            resource,
            aimed: 0,
            aimed_leader: false,
            aims: 0,
            paused: None,
        })
    }

    /// Stops every process.
    pub(crate) async fn stop(self) {
        self.cluster.stop().await;
        self.resource.stop().await;
    }

    /// The leader, once the members agree on one.
    async fn leader(&self) -> Result<usize> {
        poll(
            "the etcd members to agree on a leader",
            SETTLE,
            async || self.cluster.leader().await,
        )
        .await
    }

    fn member(&self, i: usize) -> String {
        format!("member {} ({})", self.cluster.name(i), self.cluster.addr(i))
    }
}

impl Topology for Etcd {
    fn name(&self) -> &str {
        "etcd"
    }

    fn lock_url(&self) -> &str {
        &self.lock_url
    }

    fn resource_url(&self) -> &str {
        self.resource.url()
    }

    fn controls_server(&self) -> bool {
        true
    }

    fn etcd(&self) -> bool {
        true
    }

    fn aimed(&self) -> String {
        let role = if self.aimed_leader {
            "the leader"
        } else {
            "a follower"
        };
        format!("{}, {role}", self.member(self.aimed))
    }

    async fn aim(&mut self, _key: &str) -> Result<()> {
        let leader = self.leader().await?;
        let n = self.cluster.len();
        self.aimed_leader = self.aims.is_multiple_of(2);
        self.aimed = if self.aimed_leader {
            leader
        } else {
            // The two followers in turn.
            (leader + 1 + (self.aims / 2 % 2) as usize) % n
        };
        self.aims += 1;
        Ok(())
    }

    async fn pause(&mut self) -> Result<()> {
        self.cluster.pause(self.aimed).map_err(|e| failed(&e))?;
        self.paused = Some(self.aimed);
        Ok(())
    }

    async fn resume(&mut self) -> Result<()> {
        match self.paused.take() {
            Some(i) => self.cluster.resume(i).map_err(|e| failed(&e)),
            None => Ok(()),
        }
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> Result<()> {
        if !keep_data {
            // Refused before the run (`refusal`): never reached.
            return Err(failure("etcd members restart with their data only"));
        }
        self.paused = None;
        self.cluster.kill(self.aimed).await;
        tokio::time::sleep(down).await;
        self.cluster
            .start_again(self.aimed)
            .await
            .map_err(|e| failed(&e))
    }

    async fn failover(&mut self) -> Result<String> {
        let old = self.leader().await?;
        let new = (old + 1) % self.cluster.len();
        self.cluster.move_leader(old, new).await.map_err(failure)?;
        poll("the new etcd leader", SETTLE, async || {
            match self.cluster.leader().await? {
                l if l == new => Ok(()),
                l => Err(format!("the leader is {}", self.cluster.name(l))),
            }
        })
        .await?;
        Ok(format!("{} -> {}", self.member(old), self.member(new)))
    }
}
