//! The negative controls' own Redis connection, on the topology the lock
//! URL names: their lock is deliberately not fencelock's, so it cannot use
//! fencelock's connection either.
//!
//! - `redis://`, `rediss://`, `unix://`: a reconnecting
//!   [`ConnectionManager`];
//! - `redis+cluster://[user:password@]h:p[,h:p…]`: redis-rs's cluster
//!   connection (it follows `MOVED` and `ASK`);
//! - `redis+sentinel://[user:password@]h:p[,h:p…]/MASTER[?db=N]`: the
//!   master the sentinels name, asked again after any failed call (no TLS;
//!   the sentinels themselves without a password).
//!
//! A plain `redis://` URL of a Cluster node is not detected here (fencelock
//! itself does detect it): give the controls a `redis+cluster://` URL.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, Pipeline, RedisConnectionInfo, RedisFuture, Value};

use crate::error::{Error, Result};

/// A connection to the lock server of any topology.
#[derive(Clone)]
pub(crate) enum AnyConn {
    /// One server.
    Single(ConnectionManager),
    /// A Cluster.
    Cluster(ClusterConnection),
    /// The master behind Sentinel.
    Sentinel(Arc<SentinelConn>),
}

impl std::fmt::Debug for AnyConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AnyConn::Single(_) => "AnyConn::Single",
            AnyConn::Cluster(_) => "AnyConn::Cluster",
            AnyConn::Sentinel(_) => "AnyConn::Sentinel",
        })
    }
}

/// The master behind Sentinel, resolved again after a failed call.
pub(crate) struct SentinelConn {
    resolver: tokio::sync::Mutex<SentinelClient>,
    current: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

/// `[user:password@]hosts[/path][?query]` of a URL after its scheme.
struct Parts<'a> {
    user: Option<&'a str>,
    password: Option<&'a str>,
    hosts: Vec<&'a str>,
    path: &'a str,
    query: &'a str,
}

fn parts(rest: &str) -> Parts<'_> {
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((a, h)) => (Some(a), h),
        None => (None, authority),
    };
    let (user, password) = match auth.map(|a| a.split_once(':')) {
        Some(Some((u, p))) => ((!u.is_empty()).then_some(u), Some(p)),
        Some(None) => (None, auth),
        None => (None, None),
    };
    Parts {
        user,
        password,
        hosts: hosts.split(',').filter(|h| !h.is_empty()).collect(),
        path,
        query,
    }
}

impl AnyConn {
    /// Connects to the lock server `url` names.
    pub(crate) async fn open(url: &str) -> Result<Self> {
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let p = parts(rest);
            let auth = match (p.user, p.password) {
                (Some(u), Some(pw)) => format!("{u}:{pw}@"),
                (None, Some(pw)) => format!(":{pw}@"),
                _ => String::new(),
            };
            let seeds: Vec<String> = p
                .hosts
                .iter()
                .map(|h| format!("redis://{auth}{h}"))
                .collect();
            let client = redis::cluster::ClusterClientBuilder::new(seeds)
                .connection_timeout(std::time::Duration::from_secs(2))
                .response_timeout(std::time::Duration::from_secs(2))
                .build()
                .map_err(|e| Error::redis(url, &e))?;
            let conn = client
                .get_async_connection()
                .await
                .map_err(|e| Error::redis(url, &e))?;
            return Ok(AnyConn::Cluster(conn));
        }
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let p = parts(rest);
            let master = p.path.trim_matches('/');
            let mut info = RedisConnectionInfo::default();
            if let Some(u) = p.user {
                info = info.set_username(u);
            }
            if let Some(pw) = p.password {
                info = info.set_password(pw);
            }
            if let Some(db) = p
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("db="))
                .and_then(|db| db.parse().ok())
            {
                info = info.set_db(db);
            }
            let sentinels: Vec<String> = p.hosts.iter().map(|h| format!("redis://{h}")).collect();
            let resolver = SentinelClient::build(
                sentinels,
                master,
                Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(info)),
                SentinelServerType::Master,
            )
            .map_err(|e| Error::redis(url, &e))?;
            let conn = SentinelConn {
                resolver: tokio::sync::Mutex::new(resolver),
                current: tokio::sync::Mutex::new(None),
            };
            conn.get().await.map_err(|e| Error::redis(url, &e))?;
            return Ok(AnyConn::Sentinel(Arc::new(conn)));
        }
        Ok(AnyConn::Single(crate::resource::redis_manager(url).await?))
    }
}

impl SentinelConn {
    /// The current master's connection, resolved if there is none.
    async fn get(&self) -> redis::RedisResult<MultiplexedConnection> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref() {
            return Ok(c.clone());
        }
        let conn = self.resolver.lock().await.get_async_connection().await?;
        *current = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the connection after a failed call: the next call asks the
    /// sentinels again.
    async fn forget(&self) {
        *self.current.lock().await = None;
    }
}

impl ConnectionLike for AnyConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConn::Single(c) => c.req_packed_command(cmd),
            AnyConn::Cluster(c) => c.req_packed_command(cmd),
            AnyConn::Sentinel(s) => Box::pin(async move {
                let mut conn = s.get().await?;
                let reply = conn.req_packed_command(cmd).await;
                if reply.is_err() {
                    s.forget().await;
                }
                reply
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AnyConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConn::Sentinel(s) => Box::pin(async move {
                let mut conn = s.get().await?;
                let reply = conn.req_packed_commands(pipeline, offset, count).await;
                if reply.is_err() {
                    s.forget().await;
                }
                reply
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConn::Single(c) => c.get_db(),
            AnyConn::Cluster(c) => c.get_db(),
            AnyConn::Sentinel(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parts() {
        let p = parts("u:pw@127.0.0.1:1,127.0.0.1:2/mymaster?db=3");
        assert_eq!((p.user, p.password), (Some("u"), Some("pw")));
        assert_eq!(p.hosts, vec!["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!((p.path, p.query), ("mymaster", "db=3"));
        let p = parts("127.0.0.1:7000,127.0.0.1:7001");
        assert_eq!((p.user, p.password), (None, None));
        assert_eq!(p.hosts.len(), 2);
    }
}
