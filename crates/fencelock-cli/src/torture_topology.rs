//! The topologies `fencelock torture` starts itself, as
//! [`fencelock_torture::Topology`] implementations.
//!
//! [`Single`]: one private redis-server for the locks (append-only file
//! with `appendfsync always`, `DEBUG` enabled) that the nemeses pause, kill
//! and restart, and a second private redis-server for the Redis resource
//! that no nemesis touches (its audit must survive the lock server's
//! faults). Both die with `fencelock` (see `private_redis`).
//!
//! Sentinel and Cluster topologies go next to it: a type that starts them
//! (as the testkit's `RedisSentinel` / `RedisCluster` do, with every process
//! tied to this one by the parent-death signal), returns the
//! `redis+sentinel://` / `redis+cluster://` URL as `lock_url`, acts on the
//! current primary (of the lock's shard) in `pause`/`resume`/`restart`, and
//! implements `failover`; `--topology` in `torture.rs` picks it.

use std::time::Duration;

use fencelock_torture::{Error, ErrorKind, Result, Topology};

use crate::private_redis::{Options, PrivateRedis};

/// One private redis-server for the locks, one for the resource.
#[derive(Debug)]
pub(crate) struct Single {
    locks: PrivateRedis,
    resource: PrivateRedis,
    paused: bool,
}

fn failed(e: &anyhow::Error) -> Error {
    Error::new(ErrorKind::Failed, crate::exit::one_line(e))
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
