//! A master found through Sentinel, and followed across failovers.
//!
//! redis-rs resolves the master once — it asks the sentinels, then checks
//! `ROLE` on the node it was pointed to — but an open connection does not
//! follow a failover (redis-rs #1438). A [`SentinelLink`] keeps a connection
//! to the current master and resolves again when a call fails the way a
//! failover explains: the connection broke or timed out, or the node answers
//! `READONLY` (it became a replica), `MASTERDOWN`, or `NOREPLICAS` (a cut-off
//! old primary with `min-replicas-to-write`). One task resolves at a time;
//! the others use its result. The caller then retries the call once: every
//! fencelock call is safe to repeat (a grant with the same token returns the
//! same fence, release and extend compare the stored value first).

use std::sync::RwLock;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, RedisError, RedisResult, TlsCertificates, TlsMode};

use super::conn::{ConnSettings, manager_config};
use super::target::SentinelTarget;

/// The current master: its client (to open more connections to it) and a
/// multiplexed connection, numbered so a task knows whether someone
/// resolved again since it failed.
#[derive(Clone)]
pub(crate) struct Master {
    pub(crate) client: redis::Client,
    pub(crate) conn: ConnectionManager,
    pub(crate) generation: u64,
}

/// The connection to whichever node the sentinels say is the master.
pub(crate) struct SentinelLink {
    resolver: tokio::sync::Mutex<SentinelClient>,
    current: RwLock<Master>,
    settings: ConnSettings,
}

impl std::fmt::Debug for SentinelLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelLink")
            .field("generation", &self.current().generation)
            .finish_non_exhaustive()
    }
}

impl SentinelLink {
    /// Resolves the master of `target` and connects to it.
    pub(crate) async fn connect(
        target: &SentinelTarget,
        certs: Option<TlsCertificates>,
        settings: &ConnSettings,
    ) -> RedisResult<Self> {
        let nodes = &target.nodes;
        let addrs = nodes.addrs.iter().map(|(host, port)| {
            if nodes.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let mut builder =
            SentinelClientBuilder::new(addrs, &target.master, SentinelServerType::Master)?
                .set_client_to_redis_db(nodes.db);
        if let Some(user) = &nodes.user {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &nodes.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(user) = &target.sentinel_user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = &target.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if nodes.tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certs) = certs {
                builder = builder
                    .set_client_to_redis_certificates(certs.clone())
                    .set_client_to_sentinel_certificates(certs);
            }
        }
        let mut resolver = builder.build()?;
        let master = resolve(&mut resolver, settings, 0).await?;
        Ok(SentinelLink {
            resolver: tokio::sync::Mutex::new(resolver),
            current: RwLock::new(master),
            settings: settings.clone(),
        })
    }

    /// The current master.
    pub(crate) fn current(&self) -> Master {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the sentinels again, unless another task already did since
    /// generation `seen` failed, and switches to the master they name.
    pub(crate) async fn follow(&self, seen: u64) -> RedisResult<()> {
        let mut resolver = self.resolver.lock().await;
        if self.current().generation != seen {
            return Ok(());
        }
        let master = resolve(&mut resolver, &self.settings, seen + 1).await?;
        tracing::info!(
            master = %master.client.get_connection_info().addr(),
            "following a Redis failover: reconnected to the master the sentinels name"
        );
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = master;
        Ok(())
    }
}

/// Asks the sentinels for the master (redis-rs checks `ROLE` on it) and
/// connects, within the connect timeout for each step.
async fn resolve(
    resolver: &mut SentinelClient,
    settings: &ConnSettings,
    generation: u64,
) -> RedisResult<Master> {
    // Every sentinel may be asked in turn, each with its own connect timeout.
    let limit = settings.connect_timeout.saturating_mul(4) + Duration::from_millis(500);
    let timed_out =
        || RedisError::from((redis::ErrorKind::Io, "no sentinel named a master in time"));
    let client = tokio::time::timeout(limit, resolver.async_get_client())
        .await
        .map_err(|_| timed_out())??;
    let conn = ConnectionManager::new_with_config(client.clone(), manager_config(settings)).await?;
    Ok(Master {
        client,
        conn,
        generation,
    })
}

/// Whether `e` may mean the master moved: the connection broke or timed
/// out, or the node no longer accepts writes as a master.
pub(crate) fn failover_suspect(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.code(),
            Some("READONLY" | "MASTERDOWN" | "NOREPLICAS" | "LOADING")
        )
}
