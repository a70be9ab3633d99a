//! The replicas a failover could promote: the ones the sentinels list for
//! their master, or every Cluster node flagged `slave`; and a connection of
//! its own to one of them, with the deployment's credentials and TLS, for
//! reads that must run on that node (its `INFO`, its clock).

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, FromRedisValue, IntoConnectionInfo};

use super::conn::{Link, RedisConn};
use super::errors::{self, driver_error};
use crate::error::{Error, Result};

/// A replica as the sentinels or the Cluster list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replica {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The sentinels or the Cluster flag it down or disconnected.
    pub(crate) down: bool,
}

impl Replica {
    /// `host:port`, for messages and row names.
    pub(crate) fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A connection to one replica.
pub(crate) struct ReplicaConn {
    conn: MultiplexedConnection,
    addr: String,
}

impl RedisConn {
    /// The replicas of the deployment's masters: those the sentinels list,
    /// or a Cluster's replica nodes. One server has none that a failover
    /// could promote (nothing promotes them), so none are listed.
    pub(crate) async fn replicas(&self) -> Result<Vec<Replica>> {
        match &self.link {
            Link::Standalone { .. } => Ok(Vec::new()),
            Link::Sentinel(link) => {
                let listed: Vec<std::collections::HashMap<String, String>> =
                    link.replicas().await.map_err(|e| self.map_error(e, &[]))?;
                Ok(listed.iter().filter_map(sentinel_replica).collect())
            }
            Link::Cluster { .. } => {
                let text = self.cluster_nodes().await?;
                Ok(cluster_replicas(&text))
            }
        }
    }

    /// Connects to `replica` with the deployment's credentials, database
    /// and TLS, within the connect timeout; every reply within the response
    /// timeout.
    pub(crate) async fn connect_replica(&self, replica: &Replica) -> Result<ReplicaConn> {
        let addr = replica.addr();
        let template = match &self.link {
            Link::Sentinel(link) => link.current().client.get_connection_info().clone(),
            Link::Cluster { nodes, .. } => {
                let scheme = if nodes.tls { "rediss" } else { "redis" };
                let mut info = format!("{scheme}://127.0.0.1:1")
                    .into_connection_info()
                    .map_err(|e| replica_error(&addr, e))?;
                let mut settings = info.redis_settings().clone();
                if let Some(user) = &nodes.user {
                    settings = settings.set_username(user);
                }
                if let Some(password) = &nodes.password {
                    settings = settings.set_password(password);
                }
                info = info.set_redis_settings(settings);
                info
            }
            Link::Standalone { client, .. } => client.get_connection_info().clone(),
        };
        let tcp = match template.addr() {
            ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                host: replica.host.clone(),
                port: replica.port,
                insecure: false,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(replica.host.clone(), replica.port),
        };
        let info = template.set_addr(tcp);
        let client = match self.certs.clone() {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        }
        .map_err(|e| replica_error(&addr, e))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.response_timeout));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| replica_error(&addr, e))?;
        Ok(ReplicaConn { conn, addr })
    }
}

impl ReplicaConn {
    /// Runs `cmd` on the replica.
    pub(crate) async fn cmd<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        cmd.query_async(&mut self.conn.clone())
            .await
            .map_err(|e| replica_error(&self.addr, e))
    }
}

/// An error of the replica at `addr`: a refusal named as everywhere else,
/// anything else as that node being unreachable.
fn replica_error(addr: &str, e: redis::RedisError) -> Error {
    if let Some(error) = errors::classify_reply(&e, &[]) {
        return error;
    }
    Error::Unreachable {
        url: format!("replica {addr}"),
        source: driver_error(e),
    }
}

/// One entry of `SENTINEL REPLICAS`: its `ip`, `port` and `flags`.
fn sentinel_replica(fields: &std::collections::HashMap<String, String>) -> Option<Replica> {
    let host = fields.get("ip")?.clone();
    let port = fields.get("port")?.parse().ok()?;
    let down = fields.get("flags").is_some_and(|flags| {
        flags
            .split(',')
            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
    });
    Some(Replica { host, port, down })
}

/// The replica nodes of `CLUSTER NODES` text.
pub(super) fn cluster_replicas(nodes: &str) -> Vec<Replica> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_, addr, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"slave") || flags.contains(&"noaddr") {
                return None;
            }
            let addr = addr.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some(Replica {
                host: host.to_owned(),
                port: port.parse().ok()?,
                down: flags.iter().any(|f| matches!(*f, "fail" | "fail?")),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_replicas_are_the_slave_nodes_with_an_address() {
        let text = "\
a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b 127.0.0.1:7003@17003 slave a 0 0 1 connected
c 127.0.0.1:7004@17004 slave,fail a 0 0 1 connected
d :0@0 slave,noaddr a 0 0 1 disconnected
";
        assert_eq!(
            cluster_replicas(text),
            vec![
                Replica {
                    host: "127.0.0.1".into(),
                    port: 7003,
                    down: false
                },
                Replica {
                    host: "127.0.0.1".into(),
                    port: 7004,
                    down: true
                },
            ]
        );
    }

    #[test]
    fn a_sentinel_entry_down_or_disconnected_is_down() {
        let entry = |flags: &str| {
            [("ip", "10.0.0.2"), ("port", "6380"), ("flags", flags)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        assert_eq!(
            sentinel_replica(&entry("slave")).map(|r| r.down),
            Some(false)
        );
        assert_eq!(
            sentinel_replica(&entry("s_down,slave,disconnected")).map(|r| r.down),
            Some(true)
        );
        assert!(sentinel_replica(&std::collections::HashMap::new()).is_none());
    }
}
