//! A master found through Sentinel, and followed across failovers.
//!
//! redis-rs resolves the master once — it asks the sentinels, then checks
//! `ROLE` on the node it was pointed to — but an open connection does not
//! follow a failover (redis-rs #1438). A [`SentinelLink`] keeps a connection
//! to the current master and resolves again
//!
//! - when the sentinels announce `+switch-master` for it: a watcher task
//!   stays subscribed on one sentinel (and, each time it subscribes, asks
//!   which master they name, so a failover missed meanwhile is caught up).
//!   This matters most in split brain: a frozen old primary that resumes is
//!   still a writable master until the sentinels demote it (about 10 s
//!   measured), and a client that only reacts to errors would keep granting
//!   there;
//! - when a call fails the way a failover explains: the connection broke or
//!   timed out, or the node answers `READONLY` (it became a replica),
//!   `MASTERDOWN`, or `NOREPLICAS` (a cut-off old primary with
//!   `min-replicas-to-write`). The caller then retries the call once: every
//!   fencelock call is safe to repeat (a grant with the same token returns
//!   the same fence, release and extend compare the stored value first).
//!
//! One task resolves at a time; the others use its result.

use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, RedisError, RedisResult, TlsCertificates, TlsMode};

use super::manager_config;
use super::target::SentinelTarget;
use crate::store::ConnSettings;

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
    master_name: String,
    /// Stops the `+switch-master` watcher when the link goes away.
    stop: CancellationToken,
}

impl Drop for SentinelLink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for SentinelLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelLink")
            .field("generation", &self.current().generation)
            .finish_non_exhaustive()
    }
}

impl SentinelLink {
    /// Resolves the master of `target`, connects to it, and starts watching
    /// the sentinels for failovers.
    pub(crate) async fn connect(
        target: &SentinelTarget,
        certs: Option<TlsCertificates>,
        settings: &ConnSettings,
    ) -> RedisResult<Arc<Self>> {
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
        let link = Arc::new(SentinelLink {
            resolver: tokio::sync::Mutex::new(resolver),
            current: RwLock::new(master),
            settings: settings.clone(),
            master_name: target.master.clone(),
            stop: CancellationToken::new(),
        });
        tokio::spawn(watch(Arc::downgrade(&link), link.stop.clone()));
        Ok(link)
    }

    /// The current master.
    pub(crate) fn current(&self) -> Master {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs `op` on the current master's connection; when it fails the way
    /// a failover explains, follows the master and runs it once more (every
    /// fencelock call is safe to repeat). If following fails, the first
    /// error stands.
    pub(crate) async fn on_master<T, F, Fut>(&self, op: F) -> RedisResult<T>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let master = self.current();
        match op(master.conn).await {
            Err(e) if failover_suspect(&e) => {
                if self.follow(master.generation).await.is_err() {
                    Err(e)
                } else {
                    op(self.current().conn).await
                }
            }
            reply => reply,
        }
    }

    /// Runs `op` once on the current master; when it fails the way a
    /// failover explains, asks the sentinels again for the next call but
    /// returns the failure: for raw calls that are not safe to repeat
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub(crate) async fn once_on_master<T, F, Fut>(&self, op: F) -> RedisResult<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let master = self.current();
        let reply = op(master.conn).await;
        if let Err(e) = &reply
            && failover_suspect(e)
        {
            let _ = self.follow(master.generation).await;
        }
        reply
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
    /// The replicas the sentinels list for the master (`SENTINEL
    /// REPLICAS`), each a map of its fields (`ip`, `port`, `flags`, …).
    pub(crate) async fn replicas(
        &self,
    ) -> RedisResult<Vec<std::collections::HashMap<String, String>>> {
        let sentinel = self
            .resolver
            .lock()
            .await
            .async_get_sentinel_client()
            .await?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.response_timeout));
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&self.master_name)
            .query_async(&mut conn)
            .await
    }
}

/// The watcher: subscribed to `+switch-master` on one sentinel at a time,
/// following the master when the sentinels announce a new one for ours.
async fn watch(link: Weak<SentinelLink>, stop: CancellationToken) {
    loop {
        let Some(strong) = link.upgrade() else { return };
        let name = strong.master_name.clone();
        let sentinel = strong
            .resolver
            .lock()
            .await
            .async_get_sentinel_client()
            .await;
        drop(strong);
        if let Ok(sentinel) = sentinel
            && let Ok(mut pubsub) = sentinel.get_async_pubsub().await
            && pubsub.subscribe("+switch-master").await.is_ok()
        {
            // A failover while no sentinel was watched: catch up now.
            if let Some(strong) = link.upgrade() {
                strong.follow_if_moved(&sentinel).await;
            }
            let mut messages = pubsub.on_message();
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    message = messages.next() => message,
                };
                let Some(message) = message else { break };
                // "<master name> <old ip> <old port> <new ip> <new port>"
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split(' ').next() == Some(name.as_str())
                    && let Some(strong) = link.upgrade()
                {
                    let seen = strong.current().generation;
                    if strong.follow(seen).await.is_err() {
                        tracing::debug!(
                            "the sentinels announced a failover, but no master answered yet"
                        );
                    }
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

impl SentinelLink {
    /// Follows the master if `sentinel` names another one than ours.
    async fn follow_if_moved(&self, sentinel: &redis::Client) {
        let Ok(mut con) = sentinel.get_multiplexed_async_connection().await else {
            return;
        };
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master_name)
            .query_async(&mut con)
            .await
            .ok();
        let master = self.current();
        let ours = master.client.get_connection_info().addr().to_string();
        if let Some((host, port)) = named
            && !ours.ends_with(&format!("{host}:{port}"))
        {
            let _ = self.follow(master.generation).await;
        }
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
fn failover_suspect(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || super::errors::is_refused_for_now(e.code())
}
