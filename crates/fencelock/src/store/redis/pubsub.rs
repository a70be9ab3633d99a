//! The pub/sub connection behind wake-ups: subscriptions, and the messages
//! decoded into [`Event`]s for the waiter registry (`engine::redis::wakeups`).
//!
//! It is a second, RESP3 connection of the client; pushes arrive through a
//! callback. On one server it is a connection manager that resubscribes by
//! itself after a reconnect. On a Cluster it is a cluster connection using
//! sharded pub/sub (`SSUBSCRIBE`; a wake channel carries its lock's hash
//! tag, so it lives on the lock's shard), which resubscribes by itself when
//! slots move. Behind Sentinel it follows the master: when the connection
//! stays down, [`PubSub::ping`] asks the sentinels again and subscribes
//! anew on the master they name (a replica would also deliver messages
//! published on the master, but a dead node delivers nothing).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use redis::aio::{AsyncPushSender, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};

use super::conn::{Link, RedisConn};
use super::connect::{cluster_client, connect_error};
use super::manager_config;
use super::wire::Wake;
use crate::error::Result;

/// What the pub/sub connection reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A release woke a waiter of this client.
    Wake(Wake),
    /// The connection dropped: wake-ups may have been lost meanwhile.
    Disconnected,
}

/// The client's pub/sub connection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct PubSub {
    inner: Arc<Inner>,
}

struct Inner {
    source: RedisConn,
    sender: Arc<dyn AsyncPushSender>,
    link: Mutex<PubLink>,
    /// Subscribed channels, to subscribe again on a new master.
    channels: Mutex<BTreeSet<String>>,
}

#[derive(Clone)]
enum PubLink {
    /// One server, or the master found through Sentinel (`generation` as
    /// in `super::sentinel`).
    Manager {
        conn: ConnectionManager,
        generation: u64,
    },
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for PubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSub")
            .field("url", &self.inner.source.url())
            .finish_non_exhaustive()
    }
}

impl PubSub {
    /// Opens the pub/sub connection of `source`'s deployment; every event is
    /// passed to `on_event` (on the connection's reader: keep it short).
    pub(crate) async fn connect(
        source: &RedisConn,
        on_event: impl Fn(Event) + Send + Sync + 'static,
    ) -> Result<Self> {
        let sender: Arc<dyn AsyncPushSender> = Arc::new(
            move |push: PushInfo| -> std::result::Result<(), std::convert::Infallible> {
                if let Some(event) = decode(&push) {
                    on_event(event);
                }
                Ok(())
            },
        );
        let link = open(source, &sender).await?;
        Ok(PubSub {
            inner: Arc::new(Inner {
                source: source.clone(),
                sender,
                link: Mutex::new(link),
                channels: Mutex::new(BTreeSet::new()),
            }),
        })
    }

    fn link(&self) -> PubLink {
        self.inner
            .link
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes to `channel`; returns once the server confirmed it, so no
    /// message published afterwards can be missed.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<()> {
        match self.link() {
            PubLink::Manager { mut conn, .. } => conn.subscribe(channel).await,
            PubLink::Cluster(mut conn) => conn.ssubscribe(channel).await,
        }
        .map_err(|e| self.inner.source.error(e))?;
        self.channels().insert(channel.to_owned());
        Ok(())
    }

    /// Unsubscribes from `channel`.
    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<()> {
        self.channels().remove(channel);
        match self.link() {
            PubLink::Manager { mut conn, .. } => conn.unsubscribe(channel).await,
            PubLink::Cluster(mut conn) => conn.sunsubscribe(channel).await,
        }
        .map_err(|e| self.inner.source.error(e))
    }

    /// Whether the connection answers a `PING`. A failed one makes the
    /// connection reconnect and resubscribe; behind Sentinel it also asks
    /// the sentinels again and moves to the master they name.
    pub(crate) async fn ping(&self) -> bool {
        let ping = redis::cmd("PING");
        let ok = match self.link() {
            PubLink::Manager { mut conn, .. } => ping.query_async::<Value>(&mut conn).await.is_ok(),
            PubLink::Cluster(mut conn) => ping.query_async::<Value>(&mut conn).await.is_ok(),
        };
        if !ok {
            self.follow_master().await;
        }
        ok
    }

    /// Behind Sentinel: if the master moved (or may have), subscribes anew
    /// on the master the sentinels name now.
    async fn follow_master(&self) {
        let (Link::Sentinel(link), PubLink::Manager { generation, .. }) =
            (&self.inner.source.link, self.link())
        else {
            return;
        };
        let master = link.current();
        if master.generation == generation && link.follow(generation).await.is_err() {
            return;
        }
        let master = link.current();
        if master.generation == generation {
            return;
        }
        let Ok(conn) = manager(&self.inner.source, master.client, &self.inner.sender).await else {
            return;
        };
        let channels: Vec<String> = self.channels().iter().cloned().collect();
        for channel in channels {
            // A lost subscription is recovered by the waiters' own retries.
            let _ = conn.clone().subscribe(&channel).await;
        }
        *self.inner.link.lock().unwrap_or_else(|p| p.into_inner()) = PubLink::Manager {
            conn,
            generation: master.generation,
        };
    }
}

/// Opens the pub/sub link for `source`'s deployment.
async fn open(source: &RedisConn, sender: &Arc<dyn AsyncPushSender>) -> Result<PubLink> {
    match &source.link {
        Link::Standalone { client, .. } => Ok(PubLink::Manager {
            conn: manager(source, client.as_ref().clone(), sender).await?,
            generation: 0,
        }),
        Link::Sentinel(link) => {
            let master = link.current();
            Ok(PubLink::Manager {
                conn: manager(source, master.client, sender).await?,
                generation: master.generation,
            })
        }
        Link::Cluster { nodes, .. } => {
            let client = cluster_client(
                nodes,
                source.certs.clone(),
                &source.settings,
                Some(sender.clone()),
            )
            .map_err(|e| connect_error(source.url(), 0, e))?;
            let conn = client
                .get_async_connection()
                .await
                .map_err(|e| connect_error(source.url(), 0, e))?;
            Ok(PubLink::Cluster(conn))
        }
    }
}

/// A RESP3 connection manager to the server of `client`, its pushes going
/// to `sender`, resubscribing by itself after a reconnect.
async fn manager(
    source: &RedisConn,
    client: redis::Client,
    sender: &Arc<dyn AsyncPushSender>,
) -> Result<ConnectionManager> {
    let info = client.get_connection_info().clone();
    let redis_settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let db = redis_settings.db();
    let client = redis::Client::open(info.set_redis_settings(redis_settings))
        .map_err(|e| connect_error(source.url(), db, e))?;
    let config = manager_config(&source.settings)
        .set_push_sender(sender.clone())
        .set_automatic_resubscription();
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| connect_error(source.url(), db, e))
}

/// A push message as an [`Event`], if it is one.
fn decode(push: &PushInfo) -> Option<Event> {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            let payload = match push.data.get(1) {
                Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok()?,
                _ => return None,
            };
            Wake::parse(payload).map(Event::Wake)
        }
        PushKind::Disconnection => Some(Event::Disconnected),
        _ => None,
    }
}
