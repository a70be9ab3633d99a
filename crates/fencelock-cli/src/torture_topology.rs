//! The topologies `fencelock torture` starts itself, as
//! [`fencelock_torture::Topology`] implementations.
//!
//! [`Single`]: one private redis-server for the locks (append-only file
//! with `appendfsync always`, `DEBUG` enabled) that the nemeses pause, kill
//! and restart, and a second private redis-server for the Redis resource
//! that no nemesis touches (its audit must survive the lock server's
//! faults). Both die with `fencelock` (see `private_redis`).
//!
//! [`Sentinel`] (`sentinel.rs`): one primary with two replicas watched by
//! three sentinels, and [`Cluster`] (`cluster.rs`): three masters with a
//! replica each. Their `lock_url` is the `redis+sentinel://` or
//! `redis+cluster://` URL; the node-level nemeses act on the current
//! primary of the lock key's shard ([`Topology::aim`]); `failover` makes a
//! replica the primary; the Redis resource is again a separate private
//! server no nemesis touches. Every data node persists to an append-only
//! file (`appendfsync always`, so `kill-restart` loses nothing), has
//! `DEBUG` enabled, replicates diskless without delay, and refuses writes
//! without a replica in sync (`min-replicas-to-write 1`,
//! `min-replicas-max-lag 1`, as `fencelock doctor` recommends). Every
//! process is a [`PrivateRedis`]: tied to this process by the parent-death
//! signal and killed when dropped. What the topologies share (bounded
//! queries, polling, the data nodes' arguments) is in `shared.rs`.
//!
//! [`Etcd`] (`etcd.rs`): a private 3-member etcd cluster for the locks
//! (`crate::private_etcd`), every member tied to this process the same
//! way; the nemeses pause, kill and restart the leader or a follower, and
//! move the leadership. The Redis resource is again a separate private
//! server.
//!
//! Failure detection (Sentinel's `down-after-milliseconds`, Cluster's
//! `cluster-node-timeout`) is 4 ttl, at least 1 s: longer than any pause
//! or stall a nemesis injects (at most 2.5 ttl), so only `failover` and
//! `kill-wipe` move a primary, and the history says when.

mod cluster;
mod etcd;
mod sentinel;
mod shared;

pub(crate) use cluster::Cluster;
pub(crate) use etcd::Etcd;
pub(crate) use sentinel::Sentinel;

use std::time::Duration;

use fencelock_torture::{Result, Topology};

use crate::private_redis::{Options, PrivateRedis};
use shared::failed;

/// One private redis-server for the locks, one for the resource.
#[derive(Debug)]
pub(crate) struct Single {
    locks: PrivateRedis,
    resource: PrivateRedis,
    paused: bool,
}

impl Single {
    /// Starts both servers.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let locks = PrivateRedis::start_with(Options {
            aof: true,
            debug: true,
        })
        .await?;
        let resource = PrivateRedis::start().await?;
        Ok(Single {
            locks,
            resource,
            paused: false,
        })
    }

    /// Stops both servers.
    pub(crate) async fn stop(self) {
        self.locks.stop().await;
        self.resource.stop().await;
    }
}

impl Topology for Single {
    fn name(&self) -> &str {
        "single"
    }

    fn lock_url(&self) -> &str {
        self.locks.url()
    }

    fn resource_url(&self) -> &str {
        self.resource.url()
    }

    fn controls_server(&self) -> bool {
        true
    }

    async fn pause(&mut self) -> Result<()> {
        self.locks.pause().map_err(|e| failed(&e))?;
        self.paused = true;
        Ok(())
    }

    async fn resume(&mut self) -> Result<()> {
        self.paused = false;
        self.locks.resume().map_err(|e| failed(&e))
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> Result<()> {
        self.paused = false;
        self.locks
            .restart(keep_data, down)
            .await
            .map_err(|e| failed(&e))
    }
}
