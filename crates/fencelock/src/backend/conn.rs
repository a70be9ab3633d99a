//! The connection seam: [`RedisConn`], the one connection type the rest of
//! the library talks to Redis through, whatever the deployment.
//!
//! A client has one multiplexed, auto-reconnecting connection for its calls
//! and, once a waiter needs it, one pub/sub connection (`super::pubsub`).
//! Which kind of deployment is behind them is this module's business only:
//! [`Link`] has a variant per deployment — one server, a Sentinel-monitored
//! master (`super::sentinel`, followed across failovers), a Cluster (the
//! cluster client routes each call by its first key and handles `MOVED`,
//! `ASK` and `TRYAGAIN`) — and every call goes through [`RedisConn::run`] (a
//! typed script call, by SHA, reloaded transparently on `NOSCRIPT`) or
//! [`RedisConn::cmd`] (a plain command), which map client errors to
//! [`Error`] variants that name the URL without its password.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionAddr, FromRedisValue, IntoConnectionInfo, RedisError, TlsCertificates};

use super::coalesce::Coalescer;
use super::ops::{
    Checked, Grant, GrantItem, GrantReply, Publish, Release, ReleaseItem, ScriptCall,
};
use super::sentinel::SentinelLink;
use super::target::{Nodes, Target};
use super::tls::{self, TlsFiles};
use super::url::{redact, redact_url_in};
use super::{audit, errors};
use super::errors::{driver_error, is_transient};
use crate::error::{Error, Result};

/// Connection settings chosen by the client builder.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// TLS files for `rediss` URLs (TLS for sentinels and data nodes alike).
    pub(crate) tls: TlsFiles,
}

impl Default for ConnSettings {
    /// 2 s to connect, 5 s for any reply, the system's TLS roots.
    fn default() -> Self {
        ConnSettings {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            tls: TlsFiles::default(),
        }
    }
}

/// A master of the deployment, for work done per node (scans, audits).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// `host:port`, for messages and row names.
    pub(crate) addr: String,
    /// How a Cluster routes to it (`None`: the one master).
    route: Option<SingleNodeRoutingInfo>,
}

/// How a [`RedisConn`] reaches its Redis: one variant per kind of
/// deployment.
#[derive(Clone)]
pub(super) enum Link {
    /// One server.
    Standalone {
        conn: ConnectionManager,
        /// Kept to open the pub/sub connection when first needed.
        client: Arc<redis::Client>,
    },
    /// The master a set of sentinels names, followed across failovers.
    Sentinel(Arc<SentinelLink>),
    /// A Redis Cluster.
    Cluster {
        conn: ClusterConnection,
        /// Kept to open the pub/sub connection (RESP3, sharded).
        nodes: Arc<Nodes>,
    },
}

/// A multiplexed, auto-reconnecting connection to one Redis deployment.
#[derive(Clone)]
pub(crate) struct RedisConn {
    pub(super) link: Link,
    /// The URL without its password, for error messages.
    url: String,
    pub(super) settings: ConnSettings,
    /// The TLS certificates read from the settings' files, if any.
    pub(super) certs: Option<TlsCertificates>,
    /// Batches the concurrent grants and releases of the client (shared by
    /// every clone).
    coalescer: Arc<Coalescer>,
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConn")
            .field("url", &self.url)
            .field("topology", &self.topology())
            .finish()
    }
}

/// The kind of deployment a client is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topology {
    Standalone,
    Sentinel,
    Cluster,
}

impl RedisConn {
    /// Connects to the deployment `url` names, failing fast with an error
    /// that names the URL (without its password).
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        tls::install_provider();
        let shown = redact(url);
        let target = Target::parse(url)?;
        let certs = settings.tls.certificates()?;
        let link = match &target {
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
            coalescer: Coalescer::new(),
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
            && let Some(warning) = audit::eviction_warning(&text)
        {
            tracing::warn!(url = %self.url, "{warning}");
            crate::metrics::deployment_warning("evicting_maxmemory_policy");
        }
    }

    /// The kind of deployment behind this connection.
    pub(crate) fn topology(&self) -> Topology {
        match self.link {
            Link::Standalone { .. } => Topology::Standalone,
            Link::Sentinel(_) => Topology::Sentinel,
            Link::Cluster { .. } => Topology::Cluster,
        }
    }

    /// Maps a client error on the pub/sub connection.
    pub(super) fn error(&self, e: RedisError) -> Error {
        self.map_error(e, &[])
    }

    /// The URL without its password.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The command that publishes wake-ups on this deployment: sharded
    /// pub/sub on a Cluster, where the wake channel shares the lock's slot.
    pub(crate) fn publish(&self) -> Publish {
        match self.link {
            Link::Cluster { .. } => Publish::SPublish,
            _ => Publish::Publish,
        }
    }

    /// The Cluster slot of `key` (`None` off a Cluster, where any keys may
    /// share a script).
    pub(crate) fn batch_group(&self, key: &str) -> Option<redis::cluster_routing::Slot> {
        match self.link {
            Link::Cluster { .. } => Some(redis::cluster_routing::Slot::for_key(key)),
            _ => None,
        }
    }

    /// Runs a script call and decodes its reply.
    pub(crate) async fn run<C: ScriptCall>(&self, call: &C) -> Result<C::Reply> {
        self.invoke(call)
            .await
            .map_err(|e| self.map_error(e, &call.keys()))
    }

    /// One grant attempt: batched with the client's concurrent grants of
    /// its slot when it is of the kind a batch settles, alone (at once)
    /// otherwise (see `super::coalesce`).
    pub(crate) async fn grant(&self, call: &Grant<'_>) -> Result<GrantReply> {
        if !call.batchable() {
            return self.run(call).await;
        }
        self.coalescer
            .grants
            .call(
                self,
                self.batch_group(&call.keys.lock),
                || GrantItem::from(call),
                || self.run(call),
            )
            .await
    }

    /// One release: batched with the client's concurrent releases of its
    /// slot (see `super::coalesce`).
    pub(crate) async fn release(&self, call: &Release<'_>) -> Result<Checked> {
        self.coalescer
            .releases
            .call(
                self,
                self.batch_group(call.lock),
                || ReleaseItem::from(call),
                || self.run(call),
            )
            .await
    }

    /// Makes batched grants run `fault`'s broken script (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub(crate) fn break_batched_grants(&self, fault: Option<super::coalesce::BatchFault>) {
        self.coalescer.break_grants(fault);
    }

    /// The client's coalescer.
    pub(super) fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    /// The error of one item of a batch (lock key `key`) that the batch
    /// script reported as `text` (`CODE detail`), as the item's own call
    /// would report it.
    pub(super) fn item_error(&self, text: &str, key: &str) -> Error {
        let (code, detail) = text.split_once(' ').unwrap_or((text, ""));
        errors::classify(code, detail, &[key]).unwrap_or_else(|| {
            Error::Redis(driver_error(RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "a script call failed",
                errors::without_script_internals(text).to_owned(),
            ))))
        })
    }

    /// Runs a script call and decodes its reply, leaving errors as the
    /// client library gives them.
    pub(super) async fn invoke<C: ScriptCall>(
        &self,
        call: &C,
    ) -> std::result::Result<C::Reply, RedisError> {
        let (cmd, script) = (evalsha(call), &call.script().script);
        // The key a call sent behind a PING is routed by (on a Cluster).
        let behind_ping = if call.wake_first() {
            call.keys().first().copied()
        } else {
            None
        };
        let sent = Sent {
            cmd: &cmd,
            script,
            behind_ping,
        };
        let reply =
            match &self.link {
                Link::Standalone { conn, .. } => evalsha_on(&mut conn.clone(), sent).await,
                Link::Cluster { conn, .. } => evalsha_on(&mut conn.clone(), sent).await,
                // Boxed: following a failover makes this future several times
                // larger than the others, and every call would carry its size.
                Link::Sentinel(link) => {
                    Box::pin(link.on_master(move |mut conn| async move {
                        evalsha_on(&mut conn, sent).await
                    }))
                    .await
                }
            }?;
        Ok(C::Reply::from_redis_value(reply)?)
    }

    /// Runs a plain command on `key` (used for reads such as `HMGET`).
    pub(crate) async fn cmd<T: FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> Result<T> {
        self.plain(cmd, Some(key))
            .await
            .map_err(|e| self.map_error(e, &[key]))
    }

    /// Runs a script call and then `WAIT replicas timeout` in one pipeline
    /// on one connection, so the `WAIT` covers exactly the call's writes;
    /// returns the reply and how many replicas acknowledged. Behind
    /// Sentinel a failover retries both together on the new master (a
    /// `WAIT` on another connection than the write's would count nothing).
    pub(crate) async fn run_replicated<C: ScriptCall>(
        &self,
        call: &C,
        replicas: u32,
        timeout: Duration,
    ) -> Result<(C::Reply, u32)> {
        let keys = call.keys();
        let lua = call.script();
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(lua.script.get_hash())
            .arg(keys.len())
            .arg(&keys)
            .arg(call);
        // WAIT 0 would wait forever: at least 1 ms.
        pipe.cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis().max(1));
        let route = keys.first().copied();
        let replied = match self.pipeline(&pipe, route).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(lua.source);
                self.plain::<String>(&load, route)
                    .await
                    .map_err(|e| self.map_error(e, &keys))?;
                self.pipeline(&pipe, route).await
            }
            replied => replied,
        };
        let (reply, acked): (redis::Value, i64) = replied.map_err(|e| self.map_error(e, &keys))?;
        let reply =
            C::Reply::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
        Ok((reply, u32::try_from(acked).unwrap_or(0)))
    }

    /// Runs a pipeline on one connection (on a Cluster, the master of
    /// `key`'s slot).
    async fn pipeline<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        key: Option<&str>,
    ) -> std::result::Result<T, RedisError> {
        match &self.link {
            Link::Standalone { conn, .. } => pipe.query_async(&mut conn.clone()).await,
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
                let values = redis::Value::Array(values).extract_error()?;
                T::from_redis_value(values).map_err(RedisError::from)
            }
            Link::Sentinel(link) => {
                link.on_master(move |mut conn| async move { pipe.query_async(&mut conn).await })
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
        let text: String = conn
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .and_then(|v| String::from_redis_value(v).map_err(RedisError::from))
            .map_err(|e| self.map_error(e, &[]))?;
        Ok(cluster_masters(&text)
            .into_iter()
            .map(|(host, port)| Node {
                addr: format!("{host}:{port}"),
                route: Some(SingleNodeRoutingInfo::ByAddress { host, port }),
            })
            .collect())
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

    /// Every key matching `pattern` whose type is `kind` on `node`, found
    /// with `SCAN` (never `KEYS`, which blocks the server).
    pub(crate) async fn scan_node(
        &self,
        node: &Node,
        pattern: &str,
        kind: &str,
    ) -> Result<Vec<String>> {
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .arg("TYPE")
                .arg(kind);
            let (next, keys): (u64, Vec<String>) = self.on_node(node, &scan).await?;
            found.extend(keys);
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// Every key matching `pattern` whose type is `kind`, on every master.
    pub(crate) async fn scan(&self, pattern: &str, kind: &str) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for node in self.masters().await? {
            found.extend(self.scan_node(&node, pattern, kind).await?);
        }
        found.sort();
        found.dedup();
        Ok(found)
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

    /// The typed error of a failed call on `keys`.
    pub(super) fn map_error(&self, e: RedisError, keys: &[&str]) -> Error {
        if let (Some(code), Some(detail)) = (e.code(), e.detail())
            && let Some(error) = errors::classify(code, detail, keys)
        {
            return error;
        }
        if e.code() == Some("READONLY") && self.topology() == Topology::Standalone {
            return Error::Config {
                url: self.url.clone(),
                detail: "the server is a read-only replica: point the URL at the master (or use a redis+sentinel:// URL)".into(),
            };
        }
        if e.kind() == redis::ErrorKind::AuthenticationFailed
            || e.code() == Some("NOAUTH")
            || e.code() == Some("WRONGPASS")
        {
            return Error::Auth {
                url: self.url.clone(),
                source: driver_error(e),
            };
        }
        if let Some(detail) = tls::problem(&e.to_string()) {
            return Error::Tls {
                url: self.url.clone(),
                detail,
            };
        }
        if is_transient(&e) {
            return Error::Unreachable {
                url: self.url.clone(),
                source: driver_error(e),
            };
        }
        Error::Redis(driver_error(e))
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
    if cluster_info.is_some_and(|i| audit::info_field(&i, "cluster_enabled") == Some("1")) {
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

/// The script invocation (by SHA, `NOSCRIPT` reloads) of `call`, for
/// raw calls of the testing surface.
#[cfg(feature = "testing")]
pub(crate) fn invocation<C: ScriptCall>(call: &C) -> redis::ScriptInvocation<'static> {
    let mut invocation = call.script().script.prepare_invoke();
    for key in call.keys() {
        invocation.key(key);
    }
    invocation.arg(call);
    invocation
}

/// The `EVALSHA` command of `call`, its arguments written straight into
/// the command (a `ScriptInvocation` allocates each one on its own first,
/// then copies them all into a command like this one).
fn evalsha<C: ScriptCall>(call: &C) -> redis::Cmd {
    let keys = call.keys();
    let mut cmd = redis::Cmd::with_capacity(16, 128);
    cmd.arg("EVALSHA")
        .arg(call.script().script.get_hash())
        .arg(keys.len());
    for key in keys {
        cmd.arg(key);
    }
    cmd.arg(call);
    cmd
}

/// Whether `e` says that the server does not have the script.
fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A connection that script calls are sent on.
trait SendCmd: redis::aio::ConnectionLike {
    /// Sends `cmd`; a server error in the reply is an `Err`.
    fn send<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl std::future::Future<Output = std::result::Result<redis::Value, RedisError>> + Send + 'a;

    /// Sends `PING` and `cmd` in one write, to the node of `key`, and
    /// returns `cmd`'s reply (see `Release::wake_first`).
    fn send_behind_ping<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
        key: &'a str,
    ) -> impl std::future::Future<Output = std::result::Result<redis::Value, RedisError>> + Send + 'a;
}

/// `PING`, then `cmd`: a pipeline whose second reply is the one wanted.
fn behind_ping(cmd: &redis::Cmd) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("PING").add_command(cmd.clone());
    pipe
}

/// The one reply asked of a pipeline, its server error as an `Err`.
fn only_reply(values: Vec<redis::Value>) -> std::result::Result<redis::Value, RedisError> {
    values
        .into_iter()
        .next()
        .ok_or_else(|| RedisError::from((redis::ErrorKind::Client, "no reply")))?
        .extract_error()
}

impl SendCmd for ConnectionManager {
    /// With the manager's own `send_packed_command`: going through its
    /// `ConnectionLike` implementation, as `query_async` does, boxes a
    /// future of 1.3 KB for each call, too large for the allocator's
    /// per-thread cache (measured: about one large allocation per lock
    /// cycle, and with it a consolidation of the allocator's free lists).
    async fn send(&mut self, cmd: &redis::Cmd) -> std::result::Result<redis::Value, RedisError> {
        self.send_packed_command(cmd).await?.extract_error()
    }

    async fn send_behind_ping(
        &mut self,
        cmd: &redis::Cmd,
        _key: &str,
    ) -> std::result::Result<redis::Value, RedisError> {
        only_reply(self.send_packed_commands(&behind_ping(cmd), 1, 1).await?)
    }
}

impl SendCmd for ClusterConnection {
    async fn send(&mut self, cmd: &redis::Cmd) -> std::result::Result<redis::Value, RedisError> {
        cmd.query_async(self).await
    }

    async fn send_behind_ping(
        &mut self,
        cmd: &redis::Cmd,
        key: &str,
    ) -> std::result::Result<redis::Value, RedisError> {
        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
        only_reply(self.route_pipeline(behind_ping(cmd), 1, 1, route).await?)
    }
}

/// One script call as sent: its `EVALSHA` command, its script, and the key
/// to route by if it goes behind a `PING`.
#[derive(Clone, Copy)]
struct Sent<'a> {
    cmd: &'a redis::Cmd,
    script: &'a redis::Script,
    behind_ping: Option<&'a str>,
}

/// Runs `sent` on `conn`, loading the script first if the server does not
/// have it.
async fn evalsha_on(
    conn: &mut impl SendCmd,
    sent: Sent<'_>,
) -> std::result::Result<redis::Value, RedisError> {
    let reply = match sent.behind_ping {
        Some(key) => conn.send_behind_ping(sent.cmd, key).await,
        None => conn.send(sent.cmd).await,
    };
    match reply {
        Err(e) if is_noscript(&e) => {
            sent.script.load_async(conn).await?;
            conn.send(sent.cmd).await
        }
        reply => reply,
    }
}

/// How the connection managers of a client connect and reconnect.
pub(super) fn manager_config(settings: &ConnSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        // Reconnects happen in the background after a failed command; keep
        // them quick so a restarted Redis is found again promptly.
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
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
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
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
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencelock_testkit::RedisServer;

    use super::*;
    use crate::backend::ops::{Checked, Grant, GrantReply, Mint, PassOn, Release};
    use crate::backend::wire::{QueueMember, Wake, wake_channel};
    use crate::keys::{KeyLayout, LockKeys};
    use crate::options::{LockOptions, WaitMode};

    /// The release script wakes a waiter with whichever publish command it is
    /// given: `SPUBLISH` (sharded pub/sub, for Cluster) reaches a connection
    /// subscribed with `SSUBSCRIBE` to the waiter's channel, which shares the
    /// lock's hash slot.
    #[tokio::test]
    async fn the_release_script_wakes_over_sharded_pub_sub() -> Result<()> {
        let server = RedisServer::start();
        let settings = ConnSettings::default();
        let conn = RedisConn::connect(&server.url(), &settings).await?;
        let keys = LockKeys::new("lock:", KeyLayout::HashTagged, "job")?;
        let channel = wake_channel(&keys, "ghostclient");
        let mut sub = redis::Client::open(server.url())
            .and_then(|c| c.get_connection())
            .map_err(|e| Error::Redis(driver_error(e)))?;
        sub.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| Error::Redis(driver_error(e)))?;
        sub.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&channel).get_packed_command())
            .map_err(|e| Error::Redis(driver_error(e)))?;
        let confirmed = sub.recv_response().map_err(|e| Error::Redis(driver_error(e)))?;
        assert!(
            format!("{confirmed:?}").contains("ssubscribe"),
            "{confirmed:?}"
        );

        let opts = LockOptions::default();
        let mint = Mint::new(&opts);
        let granted = conn
            .run(&Grant {
                keys: &keys,
                mint,
                token: "holder",
                ttl: opts.ttl_value(),
                wait_mode: WaitMode::Notify,
                member: None,
                waiter_lease: opts.waiter_lease_value(),
                queued: false,
            })
            .await?;
        let GrantReply::Granted(fence) = granted else {
            panic!("the first grant was refused: {granted:?}");
        };
        // A young notify waiter (arrival far in the future): woken, not handed.
        let member = QueueMember {
            client: "ghostclient".into(),
            waiter: 7,
            mode: WaitMode::Notify,
            ttl: Duration::from_secs(10),
            handover: Duration::from_millis(100),
            token: "0b5e7a9c-0000-4000-8000-000000000001".into(),
        }
        .to_string();
        server.cmd(&["ZADD", &keys.queue, "99999999999999999", &member]);
        server.cmd(&["ZADD", &keys.waiters, "99999999999999", &member]);
        let value = crate::backend::wire::lock_value("holder", fence, KeyLayout::HashTagged);
        let released = conn
            .run(&Release {
                lock: &keys.lock,
                mint,
                pass_on: PassOn {
                    publish: Publish::SPublish,
                },
                value: &value,
                // Sent behind a PING: the reply taken is the script's.
                wake_first: true,
            })
            .await?;
        assert_eq!(released, Checked::Done);
        let message = sub.recv_response().map_err(|e| Error::Redis(driver_error(e)))?;
        let text = format!("{message:?}");
        assert!(
            text.contains("smessage")
                && text.contains(&channel)
                && text.contains(&format!("{:?}", Wake::Retry { waiter: 7 }.to_string())),
            "{text}"
        );
        Ok(())
    }
}
