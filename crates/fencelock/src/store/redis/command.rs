//! Plain commands and pipelines on a [`RedisConn`] (on a Cluster, routed by
//! key, or to one master), the masters of the deployment, and `SCAN` over
//! every master: what inspection, `top` and the audit read.

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{FromRedisValue, RedisError};

use super::conn::{Link, Node, RedisConn};
use super::errors::first_failure;
use crate::error::Result;

impl RedisConn {
    /// Makes sure the connection that serves `key` is live, before a call
    /// that is sent once (a revoke: sent again, it would depose the next
    /// holder). A connection that a server restart or a failover broke is
    /// only found out by using it, and the call that finds it fails: so a
    /// `PING` finds it instead, and is sent again while it fails that way
    /// (the connection manager reconnects meanwhile), three times at most.
    pub(crate) async fn ensure_live(&self, key: &str) -> Result<()> {
        let ping = redis::cmd("PING");
        let mut attempt = 0;
        loop {
            match self.plain::<redis::Value>(&ping, Some(key)).await {
                Ok(_) => return Ok(()),
                Err(e)
                    if attempt < 2
                        && (e.is_io_error() || e.is_connection_dropped() || e.is_timeout()) =>
                {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => return Err(self.map_error(e, &[key])),
            }
        }
    }

    /// Runs a plain command on `key` (used for reads such as `HMGET`).
    pub(crate) async fn cmd<T: FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> Result<T> {
        self.plain(cmd, Some(key))
            .await
            .map_err(|e| self.map_error(e, &[key]))
    }

    /// Runs a pipeline on one connection (on a Cluster, the master of
    /// `key`'s slot).
    pub(super) async fn pipeline<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        key: Option<&str>,
    ) -> std::result::Result<T, RedisError> {
        match &self.link {
            Link::Standalone { conn, .. } => pipe
                .query_async(&mut conn.clone())
                .await
                .map_err(first_failure),
            Link::Cluster { conn, .. } => {
                let route = match key {
                    Some(key) => {
                        SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master))
                    }
                    None => SingleNodeRoutingInfo::RandomPrimary,
                };
                let values = conn
                    .clone()
                    .route_pipeline(pipe.clone(), 0, pipe.len(), route)
                    .await?;
                // A command's error comes back as a value here, where a
                // plain pipeline fails with it: fail the same way, so that
                // callers see the error (a NOSCRIPT loads the script).
                let values = redis::Value::Array(values)
                    .extract_error()
                    .map_err(first_failure)?;
                T::from_redis_value(values).map_err(RedisError::from)
            }
            Link::Sentinel(link) => {
                link.on_master(move |mut conn| async move {
                    pipe.query_async(&mut conn).await.map_err(first_failure)
                })
                .await
            }
        }
    }

    /// The masters of the deployment: the one server, the master behind
    /// Sentinel, or every master of a Cluster (from `CLUSTER NODES`,
    /// failing ones left out).
    pub(crate) async fn masters(&self) -> Result<Vec<Node>> {
        let Link::Cluster { conn, .. } = &self.link else {
            let addr = match &self.link {
                Link::Standalone { client, .. } => client.get_connection_info().addr().to_string(),
                Link::Sentinel(link) => link
                    .current()
                    .client
                    .get_connection_info()
                    .addr()
                    .to_string(),
                Link::Cluster { .. } => String::new(),
            };
            return Ok(vec![Node { addr, route: None }]);
        };
        let text = self.cluster_nodes_on(conn).await?;
        Ok(cluster_masters(&text)
            .into_iter()
            .map(|(host, port)| Node {
                addr: format!("{host}:{port}"),
                route: Some(SingleNodeRoutingInfo::ByAddress { host, port }),
            })
            .collect())
    }

    /// `CLUSTER NODES` as one node of a Cluster sees it (empty off a
    /// Cluster).
    pub(super) async fn cluster_nodes(&self) -> Result<String> {
        match &self.link {
            Link::Cluster { conn, .. } => self.cluster_nodes_on(conn).await,
            _ => Ok(String::new()),
        }
    }

    async fn cluster_nodes_on(&self, conn: &ClusterConnection) -> Result<String> {
        conn.clone()
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .and_then(|v| String::from_redis_value(v).map_err(RedisError::from))
            .map_err(|e| self.map_error(e, &[]))
    }

    /// Runs a plain command on `node` (one of [`RedisConn::masters`]).
    pub(crate) async fn on_node<T: FromRedisValue>(
        &self,
        node: &Node,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        match (&self.link, &node.route) {
            (Link::Cluster { conn, .. }, Some(route)) => conn
                .clone()
                .route_command(cmd.clone(), RoutingInfo::SingleNode(route.clone()))
                .await
                .and_then(|v| T::from_redis_value(v).map_err(RedisError::from)),
            _ => self.plain(cmd, None).await,
        }
        .map_err(|e| self.map_error(e, &[]))
    }

    /// Runs a pipeline on `node` (keys of several slots are fine, command
    /// by command, as long as `node` serves them).
    pub(crate) async fn pipeline_on_node<T: FromRedisValue>(
        &self,
        node: &Node,
        pipe: &redis::Pipeline,
    ) -> Result<T> {
        match (&self.link, &node.route) {
            (Link::Cluster { conn, .. }, Some(route)) => conn
                .clone()
                .route_pipeline(pipe.clone(), 0, pipe.len(), route.clone())
                .await
                .and_then(|values| {
                    T::from_redis_value(redis::Value::Array(values)).map_err(RedisError::from)
                }),
            _ => self.pipeline(pipe, None).await,
        }
        .map_err(|e| self.map_error(e, &[]))
    }

    /// Every key matching `pattern` (of type `kind`, if given) on `node`,
    /// found with `SCAN` (never `KEYS`, which blocks the server).
    pub(crate) async fn scan_node(
        &self,
        node: &Node,
        pattern: &str,
        kind: Option<&str>,
    ) -> Result<Vec<String>> {
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            if let Some(kind) = kind {
                scan.arg("TYPE").arg(kind);
            }
            let (next, keys): (u64, Vec<String>) = self.on_node(node, &scan).await?;
            found.extend(keys);
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// Every key matching `pattern` (of type `kind`, if given), on every
    /// master.
    pub(crate) async fn scan(&self, pattern: &str, kind: Option<&str>) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for node in self.masters().await? {
            found.extend(self.scan_node(&node, pattern, kind).await?);
        }
        found.sort();
        found.dedup();
        Ok(found)
    }

    /// Sends `cmd` once (never again after a failure, so a call that is
    /// not safe to repeat is not repeated): on a Cluster routed as redis-rs
    /// routes it (by its first key), behind Sentinel to the current master
    /// (feature `testing`: raw calls).
    #[cfg(feature = "testing")]
    pub(crate) async fn send_once(&self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        use redis::aio::ConnectionLike;
        match &self.link {
            Link::Standalone { conn, .. } => conn.clone().req_packed_command(cmd).await,
            Link::Cluster { conn, .. } => conn.clone().req_packed_command(cmd).await,
            Link::Sentinel(link) => {
                link.once_on_master(
                    move |mut conn| async move { conn.req_packed_command(cmd).await },
                )
                .await
            }
        }
    }

    /// Sends `count` replies' worth of `pipe` (from `offset`) once, as
    /// [`RedisConn::send_once`] sends a command (on a Cluster, to the
    /// master of the slot of the pipeline's first key).
    #[cfg(feature = "testing")]
    pub(crate) async fn send_pipeline_once(
        &self,
        pipe: &redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        use redis::aio::ConnectionLike;
        match &self.link {
            Link::Standalone { conn, .. } => {
                conn.clone().req_packed_commands(pipe, offset, count).await
            }
            Link::Cluster { conn, .. } => {
                conn.clone().req_packed_commands(pipe, offset, count).await
            }
            Link::Sentinel(link) => {
                link.once_on_master(move |mut conn| async move {
                    conn.req_packed_commands(pipe, offset, count).await
                })
                .await
            }
        }
    }

    /// Every key matching `pattern`, of any type, on every master.
    #[cfg(feature = "testing")]
    pub(crate) async fn scan_any(&self, pattern: &str) -> Result<Vec<String>> {
        self.scan(pattern, None).await
    }

    /// Runs a plain command: on a Cluster, on the master of `key`'s slot
    /// (or any master without a key).
    pub(super) async fn plain<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        key: Option<&str>,
    ) -> std::result::Result<T, RedisError> {
        match &self.link {
            Link::Standalone { conn, .. } => cmd.query_async(&mut conn.clone()).await,
            Link::Cluster { conn, .. } => {
                let route = match key {
                    Some(key) => {
                        SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master))
                    }
                    None => SingleNodeRoutingInfo::RandomPrimary,
                };
                let value = conn
                    .clone()
                    .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await?;
                T::from_redis_value(value).map_err(RedisError::from)
            }
            Link::Sentinel(link) => {
                link.on_master(move |mut conn| async move { cmd.query_async(&mut conn).await })
                    .await
            }
        }
    }
}

/// The `host:port` of every master in a `CLUSTER NODES` reply that is not
/// failing.
fn cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_, addr, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let master = flags.split(',').any(|f| f == "master")
                && !flags
                    .split(',')
                    .any(|f| matches!(f, "fail" | "fail?" | "noaddr"));
            let addr = addr.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            master.then(|| (host.to_owned(), port))
        })
        .collect()
}
