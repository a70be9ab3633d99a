//! The pub/sub connection behind wake-ups: subscriptions, and the messages
//! decoded into [`Event`]s for the waiter registry (`crate::notify`).
//!
//! It is a second, RESP3 connection of the client: pushes arrive through a
//! callback, and the connection manager resubscribes by itself after a
//! reconnect.

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Value};

use super::conn::RedisConn;
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

/// The client's pub/sub connection.
#[derive(Clone)]
pub(crate) struct PubSub {
    conn: ConnectionManager,
    source: RedisConn,
}

impl std::fmt::Debug for PubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSub")
            .field("url", &self.source.url())
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
        let sender = move |push: PushInfo| -> std::result::Result<(), std::convert::Infallible> {
            if let Some(event) = decode(&push) {
                on_event(event);
            }
            Ok(())
        };
        let conn = source.connect_pubsub(sender).await?;
        Ok(PubSub {
            conn,
            source: source.clone(),
        })
    }

    /// Subscribes to `channel`; returns once the server confirmed it, so no
    /// message published afterwards can be missed.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<()> {
        self.conn
            .clone()
            .subscribe(channel)
            .await
            .map_err(|e| self.source.error(e))
    }

    /// Unsubscribes from `channel`.
    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<()> {
        self.conn
            .clone()
            .unsubscribe(channel)
            .await
            .map_err(|e| self.source.error(e))
    }

    /// Whether the connection answers a `PING` (a failed one makes the
    /// manager reconnect and resubscribe).
    pub(crate) async fn ping(&self) -> bool {
        redis::cmd("PING")
            .query_async::<Value>(&mut self.conn.clone())
            .await
            .is_ok()
    }
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
