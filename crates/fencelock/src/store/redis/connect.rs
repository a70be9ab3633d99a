//! Connecting a [`RedisConn`]: the URL parsed into its deployment, one
//! server (a Cluster node given this way is detected and used as a Cluster
//! seed), a Sentinel-monitored master or a Cluster; a `PING` so that a
//! server that needs a password or answers nothing fails at connect; and
//! connect errors as typed errors.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, TlsCertificates};

use super::conn::{Link, RedisConn};
use super::errors::{self, driver_error};
use super::sentinel::SentinelLink;
use super::target::{Nodes, Target};
use super::{info, manager_config};
use crate::error::{Error, Result};
use crate::store::url::{redact, redact_url_in};
use crate::store::{ConnSettings, tls};

impl RedisConn {
    /// Connects to the deployment `url` names, failing fast with an error
    /// that names the URL (without its password).
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        tls::install_provider();
        let target = Target::parse(url)?;
        // Boxed: the connect future nests deep (Sentinel, Cluster, TLS),
        // and every caller's future would otherwise carry its layout.
        match Box::pin(Self::connect_to(url, &target, settings)).await {
            Err(e) if e.is_connection() && !e.is_config() => {
                Err(plaintext_port(url, &target).await.unwrap_or(e))
            }
            other => other,
        }
    }

    async fn connect_to(url: &str, target: &Target, settings: &ConnSettings) -> Result<Self> {
        let shown = redact(url);
        let certs = settings.tls.certificates(&shown)?;
        let link = match target {
            Target::Single(single) => {
                connect_single(single, certs.clone(), settings, &shown).await?
            }
            Target::Sentinel(sentinel) => Link::Sentinel(
                SentinelLink::connect(sentinel, certs.clone(), settings)
                    .await
                    .map_err(|e| connect_error(&shown, sentinel.nodes.db, e))?,
            ),
            Target::Cluster(nodes) => {
                connect_cluster(nodes, certs.clone(), settings, &shown).await?
            }
        };
        let conn = RedisConn {
            link,
            url: shown,
            settings: settings.clone(),
            certs,
        };
        // A connection only opens a socket (and AUTHs if the URL has a
        // password): a server that requires a password, or one that accepts
        // TCP but answers nothing, would only fail at the first lock call.
        // One PING makes `connect` fail fast with the right error.
        conn.plain::<String>(&redis::cmd("PING"), None)
            .await
            .map_err(|e| connect_error(&conn.url, 0, e))?;
        conn.warn_about_eviction().await;
        Ok(conn)
    }

    /// Best effort: an ACL user without INFO still gets its locks.
    async fn warn_about_eviction(&self) {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        if let Ok(text) = self.plain::<String>(&info, None).await
            && let Some(warning) = info::eviction_warning(&text)
        {
            tracing::warn!(url = %self.url, "{warning}");
            crate::metrics::deployment_warning("evicting_maxmemory_policy");
        }
    }
}

/// How long [`plaintext_port`] waits for a plaintext reply.
const PLAIN_PROBE: std::time::Duration = std::time::Duration::from_millis(500);

/// After a TLS connection failed as an outage (a plaintext Redis reads the
/// TLS hello as the start of a command and waits for its end, so the
/// handshake times out): the error that says so, if one of the target's
/// addresses answers a plaintext `PING`.
async fn plaintext_port(url: &str, target: &Target) -> Option<Error> {
    let addrs = match target {
        Target::Single(single) => match single.as_str().into_connection_info().ok()?.addr() {
            ConnectionAddr::TcpTls { host, port, .. } => vec![(host.clone(), *port)],
            _ => return None,
        },
        Target::Sentinel(s) if s.nodes.tls => s.nodes.addrs.clone(),
        Target::Cluster(nodes) if nodes.tls => nodes.addrs.clone(),
        _ => return None,
    };
    for (host, port) in &addrs {
        if answers_plain_ping(host, *port).await {
            return Some(Error::Tls {
                url: redact(url),
                detail: format!(
                    "{host}:{port} does not speak TLS (it answered a plaintext PING): use the plain scheme (redis://, redis+sentinel://, redis+cluster://) or the server's TLS port"
                ),
            });
        }
    }
    None
}

/// Whether `host:port` answers `PING` in plaintext RESP (`+PONG`, or an
/// error such as `-NOAUTH`) within [`PLAIN_PROBE`].
async fn answers_plain_ping(host: &str, port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.ok()?;
        Some(matches!(first[0], b'+' | b'-'))
    };
    tokio::time::timeout(PLAIN_PROBE, probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// One server; a Cluster node given this way is detected (`INFO cluster`)
/// and connected to as a Cluster seed.
async fn connect_single(
    url: &str,
    certs: Option<TlsCertificates>,
    settings: &ConnSettings,
    shown: &str,
) -> Result<Link> {
    let bad_url = |e: RedisError| {
        Error::InvalidOption(format!(
            "bad Redis URL {shown}: {}",
            redact_url_in(&e.to_string(), url)
        ))
    };
    let info = url.into_connection_info().map_err(bad_url)?;
    let db = info.redis_settings().db();
    let client = match certs.clone() {
        Some(certs) => redis::Client::build_with_tls(info.clone(), certs),
        None => redis::Client::open(info.clone()),
    }
    .map_err(bad_url)?;
    let conn = ConnectionManager::new_with_config(client.clone(), manager_config(settings))
        .await
        .map_err(|e| connect_error(shown, db, e))?;
    let cluster_info: Option<String> = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn.clone())
        .await
        .ok();
    if cluster_info.is_some_and(|i| info::info_field(&i, "cluster_enabled") == Some("1")) {
        let nodes = seed_of(&info);
        tracing::debug!(url = %shown, "the server is a Cluster node: connecting to the Cluster");
        return connect_cluster(&nodes, certs, settings, shown).await;
    }
    Ok(Link::Standalone {
        conn,
        client: Arc::new(client),
    })
}

/// The seed `Nodes` of a single server's connection info.
fn seed_of(info: &redis::ConnectionInfo) -> Nodes {
    let (addr, tls) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => ((host.clone(), *port), false),
        ConnectionAddr::TcpTls { host, port, .. } => ((host.clone(), *port), true),
        // A Unix socket (or anything else) cannot be a Cluster seed: cluster
        // nodes announce TCP addresses, and the seed must be one of them.
        other => ((other.to_string(), 0), false),
    };
    let redis = info.redis_settings();
    Nodes {
        addrs: vec![addr],
        tls,
        user: redis.username().map(str::to_owned),
        password: redis.password().map(str::to_owned),
        db: 0,
    }
}

async fn connect_cluster(
    nodes: &Nodes,
    certs: Option<TlsCertificates>,
    settings: &ConnSettings,
    shown: &str,
) -> Result<Link> {
    let client = cluster_client(nodes, certs, settings, None)
        .map_err(|e| Error::InvalidOption(format!("bad Redis URL {shown}: {e}")))?;
    let conn = client
        .get_async_connection()
        .await
        .map_err(|e| connect_error(shown, 0, e))?;
    Ok(Link::Cluster {
        conn,
        nodes: Arc::new(nodes.clone()),
    })
}

/// A cluster client for `nodes`; with `push`, a RESP3 one whose pushes
/// (sharded pub/sub messages) go there.
pub(super) fn cluster_client(
    nodes: &Nodes,
    certs: Option<TlsCertificates>,
    settings: &ConnSettings,
    push: Option<Arc<dyn redis::aio::AsyncPushSender>>,
) -> std::result::Result<ClusterClient, RedisError> {
    let scheme = if nodes.tls { "rediss" } else { "redis" };
    let seeds: Vec<String> = nodes
        .addrs
        .iter()
        .map(|(host, port)| {
            if host.contains(':') {
                format!("{scheme}://[{host}]:{port}")
            } else {
                format!("{scheme}://{host}:{port}")
            }
        })
        .collect();
    let mut builder = ClusterClientBuilder::new(seeds)
        .connection_timeout(settings.connect_timeout)
        .response_timeout(settings.response_timeout);
    if let Some(user) = &nodes.user {
        builder = builder.username(user);
    }
    if let Some(password) = &nodes.password {
        builder = builder.password(password);
    }
    if let Some(certs) = certs {
        builder = builder.certs(certs);
    }
    if let Some(push) = push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push);
    }
    builder.build()
}

/// An error while connecting to `url` (shown without its password), whose
/// database number is `db`.
pub(super) fn connect_error(url: &str, db: i64, e: RedisError) -> Error {
    let text = e.to_string();
    if text.contains("DB index is out of range") {
        return Error::Config {
            url: url.to_string(),
            detail: format!(
                "the server has no database {db} (raise its `databases` setting, or use a lower number)"
            ),
        };
    }
    // A Cluster or Sentinel client wraps the node's refusal in an error of
    // its own ("failed to create initial connections", "no sentinel
    // answered"): its text still carries the server's code.
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("invalid username-password pair")
        || text.contains("AuthenticationFailed")
        || text.contains("Authentication required")
    {
        return Error::Auth {
            url: url.to_string(),
            source: driver_error(e),
        };
    }
    if let Some(detail) = tls::problem(&text) {
        return Error::Tls {
            url: url.to_string(),
            detail,
        };
    }
    if let Some(refused) = errors::refused_at_connect(&text) {
        return refused;
    }
    if let (Some(code), Some(detail)) = (e.code(), e.detail())
        && let Some(error) = errors::classify(code, detail, &[])
    {
        return error;
    }
    Error::Unreachable {
        url: url.to_string(),
        source: driver_error(e),
    }
}
