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
//! signal and killed when dropped.
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

pub(crate) use cluster::Cluster;
pub(crate) use etcd::Etcd;
pub(crate) use sentinel::Sentinel;

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

/// An engine error from a message.
fn failure(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Failed, message)
}

/// How long a failover, a replacement or a return to health may take.
const SETTLE: Duration = Duration::from_secs(30);

/// The failure detection of a replicated topology: 4 ttl, at least 1 s.
fn detection(ttl: Duration) -> Duration {
    (ttl * 4).max(Duration::from_secs(1))
}

/// What every data node of a replicated topology runs with (see the
/// module docs).
fn data_args() -> Vec<String> {
    [
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        "1",
    ]
    .iter()
    .map(|a| (*a).to_string())
    .collect()
}

/// One command to one node, bounded (connect 1 s, reply 2 s): a paused
/// node fails it instead of holding it up.
async fn query<T: redis::FromRedisValue>(
    url: &str,
    cmd: &redis::Cmd,
) -> std::result::Result<T, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    cmd.query_async(&mut conn)
        .await
        .map_err(|e| format!("{url}: {e}"))
}

/// Polls `check` every 50 ms until it returns `Ok`, for at most `limit`;
/// then fails with `what` and the last error.
async fn poll<T>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> std::result::Result<T, String>,
) -> Result<T> {
    let give_up = tokio::time::Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= give_up => {
                return Err(failure(format!(
                    "timed out after {limit:?} waiting for {what}: {e}"
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The value of `field` in `INFO` text.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Whether the node at `url` has `n` replicas in sync (`INFO
/// replication`: `slaveN:…,state=online`).
async fn online_replicas(url: &str) -> std::result::Result<usize, String> {
    let info: String = query(url, redis::cmd("INFO").arg("replication")).await?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count())
}

/// A write the node at `url` must take: `DEL` of a key nobody uses
/// (`NOREPLICAS` while no replica is in sync, `READONLY` on a replica,
/// `MOVED` on a Cluster node that does not serve `key`'s slot).
async fn takes_writes(url: &str, key: &str) -> std::result::Result<(), String> {
    query::<i64>(url, redis::cmd("DEL").arg(key))
        .await
        .map(|_| ())
}

impl Single {
    /// Starts both servers.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let locks = PrivateRedis::start_with(Options {
            aof: true,
            debug: true,
            ..Options::default()
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
