//! [`RedisConn`], the one connection type the rest of the library talks to
//! Redis through, whatever the deployment.
//!
//! A client has one multiplexed, auto-reconnecting connection for its calls
//! and, once a waiter needs it, one pub/sub connection (`super::pubsub`).
//! Which kind of deployment is behind them is the business of this file and
//! its siblings only: [`Link`] has a variant per deployment — one server, a
//! Sentinel-monitored master (`super::sentinel`, followed across
//! failovers), a Cluster (the cluster client routes each call by its first
//! key and handles `MOVED`, `ASK` and `TRYAGAIN`). The connection is split
//! by what it does:
//!
//! | file | does |
//! |---|---|
//! | `conn.rs` | the connection, its deployment and its errors: client errors mapped to [`Error`] variants that name the URL without its password |
//! | `connect.rs` | connecting (one server, a Cluster, or a Cluster found behind a single URL) and the connect-time checks |
//! | `invoke.rs` | script calls by SHA, reloaded transparently on `NOSCRIPT`; a call and its `WAIT` for replicas in one pipeline |
//! | `command.rs` | plain commands and pipelines, per master, and scans; raw calls sent once (feature `testing`) |

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{RedisError, TlsCertificates};

use super::errors::{self, driver_error, is_transient};
use super::ops::Publish;
use super::sentinel::SentinelLink;
use super::target::Nodes;
use crate::error::Error;
use crate::store::{ConnSettings, tls};

/// A master of the deployment, for work done per node (scans, audits).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// `host:port`, for messages and row names.
    pub(crate) addr: String,
    /// How a Cluster routes to it (`None`: the one master).
    pub(super) route: Option<SingleNodeRoutingInfo>,
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
    pub(super) url: String,
    pub(super) settings: ConnSettings,
    /// The TLS certificates read from the settings' files, if any.
    pub(super) certs: Option<TlsCertificates>,
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

    /// The error of one item of a batch (lock key `key`) that the batch
    /// script reported as `text` (`CODE detail`), as the item's own call
    /// would report it.
    pub(super) fn item_error(&self, text: &str, key: &str) -> Error {
        let (code, detail) = text.split_once(' ').unwrap_or((text, ""));
        if let Some(error) = errors::classify(code, detail, &[key]) {
            return error;
        }
        // Typed by its code, as the item's own call would be: `NOREPLICAS`
        // or `READONLY` stay refusals for now.
        match errors::from_wire(errors::without_script_internals(text)) {
            Some(e) => self.map_error(e, &[key]),
            None => Error::Redis(driver_error(RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "a script call failed",
                errors::without_script_internals(text).to_owned(),
            )))),
        }
    }

    /// The typed error of a failed call on `keys`.
    pub(super) fn map_error(&self, e: RedisError, keys: &[&str]) -> Error {
        if let Some(error) = errors::classify_reply(&e, keys) {
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
