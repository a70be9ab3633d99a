//! What the topologies of `fencelock torture` share: engine errors, how
//! long a topology may take to settle, the data nodes' arguments, and
//! bounded queries and polls of one node.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use fencelock_torture::{Error, ErrorKind, Result};

use fencelock_servers::RedisConfig;

use crate::private_redis::{Options, PrivateRedis};

pub(super) use fencelock_servers::redis_admin::info_field;

/// An engine error from a failed private server.
pub(super) fn failed(e: &anyhow::Error) -> Error {
    Error::new(ErrorKind::Failed, crate::exit::one_line(e))
}

/// An engine error from a message.
pub(super) fn failure(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Failed, message)
}

/// How long a failover, a replacement or a return to health may take.
pub(super) const SETTLE: Duration = Duration::from_secs(30);

/// The failure detection of a replicated topology: 4 ttl, at least 1 s.
pub(super) fn detection(ttl: Duration) -> Duration {
    (ttl * 4).max(Duration::from_secs(1))
}

/// How every data node of a replicated topology runs (see
/// `torture_topology`): an append-only file, `DEBUG`, and no write without
/// a replica in sync (`fencelock-servers` adds diskless replication
/// without delay to every node of a Sentinel set-up or a Cluster).
pub(super) fn data_node() -> RedisConfig {
    Options {
        aof: true,
        debug: true,
    }
    .config()
    .with_args([
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        "1",
    ])
}

/// One command to one node, bounded (connect 1 s, reply 2 s): a paused
/// node fails it instead of holding it up.
pub(super) async fn query<T: redis::FromRedisValue>(
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
pub(super) async fn poll<T>(
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

/// Whether the node at `url` has `n` replicas in sync (`INFO
/// replication`: `slaveN:…,state=online`).
pub(super) async fn online_replicas(url: &str) -> std::result::Result<usize, String> {
    let info: String = query(url, redis::cmd("INFO").arg("replication")).await?;
    Ok(fencelock_servers::redis_admin::online_replicas(&info))
}

/// A write the node at `url` must take: `DEL` of a key nobody uses
/// (`NOREPLICAS` while no replica is in sync, `READONLY` on a replica,
/// `MOVED` on a Cluster node that does not serve `key`'s slot).
pub(super) async fn takes_writes(url: &str, key: &str) -> std::result::Result<(), String> {
    query::<i64>(url, redis::cmd("DEL").arg(key))
        .await
        .map(|_| ())
}

/// The data nodes of a replicated topology and the one its node-level
/// calls act on (`aim`): pausing, resuming and a restart with data are the
/// same on a Sentinel's primary and on a Cluster's master. Indexes like the
/// nodes it holds.
#[derive(Debug)]
pub(super) struct Aimed {
    nodes: Vec<PrivateRedis>,
    /// The node the node-level calls act on.
    pub(super) primary: usize,
    /// Its URL: the topology's admin URL.
    pub(super) admin: String,
    /// The node a `pause` froze, until `resume`.
    pub(super) paused: Option<usize>,
}

impl Aimed {
    /// `nodes`, aimed at the first.
    pub(super) fn new(nodes: Vec<PrivateRedis>) -> Self {
        let admin = nodes
            .first()
            .map(|n| n.url().to_string())
            .unwrap_or_default();
        Aimed {
            nodes,
            primary: 0,
            admin,
            paused: None,
        }
    }

    /// Aims the node-level calls at `node`.
    pub(super) fn point(&mut self, node: usize) {
        self.primary = node;
        self.admin = self.nodes[node].url().to_string();
    }

    /// SIGSTOP of the aimed node.
    pub(super) fn pause(&mut self) -> Result<()> {
        self.nodes[self.primary].pause().map_err(|e| failed(&e))?;
        self.paused = Some(self.primary);
        Ok(())
    }

    /// SIGCONT of the node `pause` froze.
    pub(super) fn resume(&mut self) -> Result<()> {
        match self.paused.take() {
            Some(node) => self.nodes[node].resume().map_err(|e| failed(&e)),
            None => Ok(()),
        }
    }

    /// kill -9 of the aimed node, and `down` later the same node again
    /// with its data, before the others notice.
    pub(super) async fn restart_with_data(&mut self, down: Duration) -> Result<()> {
        self.paused = None;
        self.nodes[self.primary]
            .restart(true, down)
            .await
            .map_err(|e| failed(&e))
    }

    /// Stops every node and waits for them.
    pub(super) async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
    }
}

impl Deref for Aimed {
    type Target = [PrivateRedis];

    fn deref(&self) -> &[PrivateRedis] {
        &self.nodes
    }
}

impl DerefMut for Aimed {
    fn deref_mut(&mut self) -> &mut [PrivateRedis] {
        &mut self.nodes
    }
}
