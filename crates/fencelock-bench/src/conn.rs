//! Plain connections for the references, of the same type as the lock
//! client's: a multiplexed connection to one server (over TLS for a
//! `rediss` URL), or a Cluster connection whose calls go to the master of
//! the key they name, so a reference `PING` reaches the node that serves the
//! measured lock.

use std::path::PathBuf;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, TlsCertificates, Value};

use crate::error::{Error, ErrorKind, Result};
use crate::url::RedisUrl;

/// The TLS files of `rediss` URLs (`--tls-ca`, `--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// The CA certificate (PEM) to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key (PEM), for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl Tls {
    fn certificates(&self) -> Result<Option<TlsCertificates>> {
        if self.ca.is_none() && self.client.is_none() {
            return Ok(None);
        }
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("cannot read {}: {e}", path.display()),
                )
            })
        };
        let root_cert = self.ca.as_ref().map(read).transpose()?;
        let client_tls = match &self.client {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            None => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// What kind of deployment a URL names, as the records show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One server (`redis://`, `unix://`).
    Standalone,
    /// One server over TLS (`rediss://`).
    Tls,
    /// A Redis Cluster (`redis+cluster://`, or a `redis://` seed of one).
    Cluster,
    /// A Redis Cluster over TLS.
    ClusterTls,
}

impl Topology {
    /// `standalone`, `tls`, `cluster` or `cluster+tls`.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Standalone => "standalone",
            Topology::Tls => "tls",
            Topology::Cluster => "cluster",
            Topology::ClusterTls => "cluster+tls",
        }
    }

    fn tls(self) -> bool {
        matches!(self, Topology::Tls | Topology::ClusterTls)
    }
}

/// How to open plain connections to the deployment under test.
#[derive(Debug, Clone)]
pub(crate) struct Opener {
    url: RedisUrl,
    tls: Tls,
    pub(crate) topology: Topology,
    /// Cluster seeds (`redis://` or `rediss://` URLs, credentials included).
    seeds: Vec<String>,
}

impl Opener {
    /// Finds out what `url` names (a plain seed of a Cluster is detected).
    pub(crate) async fn new(url: &RedisUrl, tls: &Tls) -> Result<Self> {
        let raw = url.raw();
        let cluster_scheme = ["redis+cluster://", "rediss+cluster://"]
            .iter()
            .find(|s| raw.starts_with(**s));
        let secure = raw.starts_with("rediss");
        let mut opener = Opener {
            url: url.clone(),
            tls: tls.clone(),
            topology: if secure {
                Topology::Tls
            } else {
                Topology::Standalone
            },
            seeds: Vec::new(),
        };
        if let Some(scheme) = cluster_scheme {
            let rest = &raw[scheme.len()..];
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), rest),
            };
            let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
            let plain = if secure { "rediss://" } else { "redis://" };
            opener.seeds = hosts
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("{plain}{auth}{h}"))
                .collect();
        } else {
            // A Cluster node given as a plain URL is a seed.
            let mut conn = opener.single().await?;
            let info: String = redis::cmd("INFO")
                .arg("cluster")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
                opener.seeds = vec![raw.to_string()];
            }
        }
        if !opener.seeds.is_empty() {
            opener.topology = if secure {
                Topology::ClusterTls
            } else {
                Topology::Cluster
            };
        }
        Ok(opener)
    }

    async fn single(&self) -> Result<MultiplexedConnection> {
        let info = self
            .url
            .raw()
            .into_connection_info()
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("bad Redis URL: {e}")))?;
        let client = match self.tls.certificates()? {
            Some(certs) if self.topology.tls() => redis::Client::build_with_tls(info, certs),
            _ => redis::Client::open(info),
        }
        .map_err(|e| Error::connecting(&self.url, e))?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| Error::connecting(&self.url, e))
    }

    /// A new plain connection of the client's type.
    pub(crate) async fn open(&self) -> Result<RefConn> {
        if self.seeds.is_empty() {
            return Ok(RefConn::Single(self.single().await?));
        }
        let mut builder = ClusterClientBuilder::new(self.seeds.clone());
        if let Some(certs) = self.tls.certificates()? {
            builder = builder.certs(certs);
        }
        let client = builder
            .build()
            .map_err(|e| Error::connecting(&self.url, e))?;
        Ok(RefConn::Cluster(
            client
                .get_async_connection()
                .await
                .map_err(|e| Error::connecting(&self.url, e))?,
        ))
    }

    /// How `redis-benchmark` reaches the server of `key` (host/port or
    /// socket, and TLS), or why it cannot.
    pub(crate) async fn benchmark_target(
        &self,
        conn: &mut RefConn,
        key: &str,
    ) -> std::result::Result<Vec<String>, &'static str> {
        let info = self
            .url
            .raw()
            .into_connection_info()
            .map_err(|_| "a URL redis-benchmark cannot use")?;
        if info.redis_settings().password().is_some() {
            // redis-benchmark takes a password only on its command line.
            return Err("a password (redis-benchmark takes it only as an argument)");
        }
        let mut args = Vec::new();
        match (&self.topology, info.addr()) {
            (Topology::Cluster | Topology::ClusterTls, _) => {
                // The node serving `key`: its side of our connection.
                let client: String = conn
                    .query(&redis::cmd("CLIENT").arg("INFO").clone(), key)
                    .await
                    .map_err(|_| "CLIENT INFO was refused")?;
                let laddr = client
                    .split(' ')
                    .find_map(|f| f.strip_prefix("laddr="))
                    .ok_or("CLIENT INFO has no laddr")?;
                let (host, port) = laddr.rsplit_once(':').ok_or("a laddr without port")?;
                args.extend(["-h".into(), host.into(), "-p".into(), port.into()]);
            }
            (_, redis::ConnectionAddr::Unix(path)) => {
                args.extend(["-s".into(), path.display().to_string()]);
            }
            (_, redis::ConnectionAddr::Tcp(host, port))
            | (_, redis::ConnectionAddr::TcpTls { host, port, .. }) => {
                args.extend(["-h".into(), host.clone(), "-p".into(), port.to_string()]);
            }
            _ => return Err("an address redis-benchmark cannot use"),
        }
        if self.topology.tls() {
            args.push("--tls".into());
            if let Some(ca) = &self.tls.ca {
                args.extend(["--cacert".into(), ca.display().to_string()]);
            }
            if let Some((cert, key)) = &self.tls.client {
                args.extend([
                    "--cert".into(),
                    cert.display().to_string(),
                    "--key".into(),
                    key.display().to_string(),
                ]);
            }
        }
        if let Some(user) = info.redis_settings().username() {
            args.extend(["--user".into(), user.to_string()]);
        }
        Ok(args)
    }
}

/// A plain connection of the client's type.
#[derive(Clone)]
pub(crate) enum RefConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl RefConn {
    /// Runs `cmd` on the server of `key` (on one server: that server).
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd, key: &str) -> Result<T> {
        match self {
            RefConn::Single(conn) => Ok(cmd.query_async(conn).await?),
            RefConn::Cluster(conn) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    key.as_bytes(),
                    SlotAddr::Master,
                ));
                let value = conn
                    .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await?;
                Ok(T::from_redis_value(value).map_err(redis::RedisError::from)?)
            }
        }
    }

    /// Runs a script invocation (`EVALSHA`, `SCRIPT LOAD` on `NOSCRIPT`).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &mut self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T> {
        Ok(match self {
            RefConn::Single(conn) => invocation.invoke_async(conn).await?,
            RefConn::Cluster(conn) => invocation.invoke_async(conn).await?,
        })
    }

    /// `INFO all` of every master, concatenated.
    pub(crate) async fn info_all_masters(&mut self) -> Result<String> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("all");
        match self {
            RefConn::Single(conn) => Ok(cmd.query_async(conn).await?),
            RefConn::Cluster(conn) => {
                let value = conn
                    .route_command(
                        cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await?;
                let mut out = String::new();
                collect_text(&value, &mut out);
                Ok(out)
            }
        }
    }
}

/// Every text in `value`, one after the other.
fn collect_text(value: &Value, out: &mut String) {
    match value {
        Value::BulkString(b) => {
            out.push_str(&String::from_utf8_lossy(b));
            out.push('\n');
        }
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => {
            out.push_str(text);
            out.push('\n');
        }
        Value::Array(items) | Value::Set(items) => {
            for item in items {
                collect_text(item, out);
            }
        }
        Value::Map(pairs) => {
            for (_, v) in pairs {
                collect_text(v, out);
            }
        }
        _ => {}
    }
}
