//! Wake-ups for waiting acquisitions (the notify and fair wait modes).
//!
//! A client keeps ONE pub/sub connection, opened when it first waits, shared
//! by all its waiters. Each waiter has an id; a queued waiter is the member
//! `CLIENT:WAITER:…` of a lock's wait queue, and a release wakes the head by
//! publishing `WAITER` on the channel `WAKE_PREFIX + CLIENT` of that lock, or
//! `WAITER FENCE` when it handed the lock over to that waiter.
//! The client subscribes to that channel once per lock name it waits on, so
//! a release sends one message to one connection, however many wait.
//!
//! Messages can be lost (pub/sub is at-most-once, e.g. across a reconnect);
//! waiters never rely on them alone: they also retry when the holder's lease
//! runs out and every third of their waiter lease. After a disconnection all
//! waiters are woken to retry at once, and subscriptions are restored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Value};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::redis::RedisConn;

/// Channels kept subscribed with no waiter before idle ones are dropped.
const MAX_IDLE_CHANNELS: usize = 256;

/// Where a waiter is woken, and told the fence of a lock handed to it.
#[derive(Debug, Default)]
struct Slot {
    notify: Notify,
    handed: Mutex<Option<u64>>,
}

#[derive(Debug, Default)]
struct WakeState {
    waiters: HashMap<u64, Arc<Slot>>,
    /// Subscribed channel -> number of registered waiters on it.
    channels: HashMap<String, usize>,
    next_id: u64,
}

fn lock(state: &Mutex<WakeState>) -> MutexGuard<'_, WakeState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The client's pub/sub connection and its waiters.
pub(crate) struct Wakeups {
    client_id: String,
    conn: ConnectionManager,
    source: RedisConn,
    state: Arc<Mutex<WakeState>>,
    /// Stops the reconnect task when the client goes away.
    stop: CancellationToken,
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Brings the pub/sub connection back after a disconnection. The connection
/// manager reconnects only a few times, and only when a command fails; a
/// subscription connection sends no commands, so without this it would stay
/// dead after Redis was down for more than a moment. Once a PING succeeds the
/// connection is back and resubscribed, and every waiter retries at once.
async fn restore(
    conn: ConnectionManager,
    state: Arc<Mutex<WakeState>>,
    mut lost: UnboundedReceiver<()>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            msg = lost.recv() => if msg.is_none() { return },
        }
        let mut delay = Duration::from_millis(50);
        loop {
            let mut c = conn.clone();
            let ping = redis::cmd("PING");
            let ok = tokio::select! {
                () = stop.cancelled() => return,
                r = ping.query_async::<Value>(&mut c) => r.is_ok(),
            };
            if ok {
                break;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(1));
        }
        for slot in lock(&state).waiters.values() {
            slot.notify.notify_one();
        }
    }
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    /// Opens the pub/sub connection.
    pub(crate) async fn connect(source: &RedisConn, client_id: String) -> Result<Self> {
        let state = Arc::new(Mutex::new(WakeState::default()));
        let dispatch = state.clone();
        let (lost_tx, lost_rx) = unbounded_channel();
        let sender = move |push: PushInfo| -> std::result::Result<(), std::convert::Infallible> {
            if push.kind == PushKind::Disconnection {
                let _ = lost_tx.send(());
            }
            deliver(&dispatch, push);
            Ok(())
        };
        let conn = source.connect_pubsub(sender).await?;
        let stop = CancellationToken::new();
        tokio::spawn(restore(conn.clone(), state.clone(), lost_rx, stop.clone()));
        Ok(Wakeups {
            client_id,
            conn,
            source: source.clone(),
            state,
            stop,
        })
    }

    /// Registers a waiter on `channel`, subscribing to it first if this
    /// client is not subscribed yet (the subscription is confirmed before
    /// this returns, so no wake-up sent after it can be missed).
    pub(crate) async fn register(&self, channel: &str) -> Result<Waiter> {
        let (subscribe, idle) = {
            let mut st = lock(&self.state);
            let subscribed = st.channels.contains_key(channel);
            let idle: Vec<String> = if !subscribed && st.channels.len() >= MAX_IDLE_CHANNELS {
                st.channels
                    .iter()
                    .filter(|(_, n)| **n == 0)
                    .map(|(c, _)| c.clone())
                    .collect()
            } else {
                Vec::new()
            };
            for c in &idle {
                st.channels.remove(c);
            }
            (!subscribed, idle)
        };
        let mut conn = self.conn.clone();
        for c in idle {
            // Best effort: an extra subscription only costs a little memory.
            let _ = conn.unsubscribe(&c).await;
        }
        if subscribe {
            conn.subscribe(channel)
                .await
                .map_err(|e| self.source.error(e))?;
        }
        let mut st = lock(&self.state);
        *st.channels.entry(channel.to_string()).or_insert(0) += 1;
        st.next_id += 1;
        let id = st.next_id;
        let slot = Arc::new(Slot::default());
        st.waiters.insert(id, slot.clone());
        Ok(Waiter {
            member: format!("{}:{id}", self.client_id),
            id,
            slot,
            channel: channel.to_string(),
            state: self.state.clone(),
        })
    }
}

/// Routes a push message to its waiter.
fn deliver(state: &Mutex<WakeState>, push: PushInfo) {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            // "WAITER" (wake up and retry) or "WAITER FENCE" (the lock was
            // handed over to this waiter with that fence).
            let payload = match push.data.get(1) {
                Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok(),
                _ => None,
            };
            let mut words = payload.unwrap_or_default().split(' ');
            let id = words.next().and_then(|w| w.parse::<u64>().ok());
            let fence = words.next().and_then(|w| w.parse::<u64>().ok());
            if let Some(id) = id
                && let Some(slot) = lock(state).waiters.get(&id)
            {
                if let Some(fence) = fence {
                    *slot.handed.lock().unwrap_or_else(|p| p.into_inner()) = Some(fence);
                }
                slot.notify.notify_one();
            }
        }
        PushKind::Disconnection => {
            // Wake-ups may have been lost while disconnected: everyone retries.
            for slot in lock(state).waiters.values() {
                slot.notify.notify_one();
            }
        }
        _ => {}
    }
}

/// One waiting acquisition's registration. Dropping it unregisters.
#[derive(Debug)]
pub(crate) struct Waiter {
    member: String,
    id: u64,
    slot: Arc<Slot>,
    channel: String,
    state: Arc<Mutex<WakeState>>,
}

impl Waiter {
    /// This waiter's id in the wait queue (`CLIENT:WAITER`); the queue
    /// member appends the wait mode, ttl, waiter lease and token to it.
    pub(crate) fn member(&self) -> &str {
        &self.member
    }

    /// Completes when a release woke this waiter (or one already did since
    /// the last call), with the fence if the lock was handed over to it.
    pub(crate) async fn woken(&self) -> Option<u64> {
        self.slot.notify.notified().await;
        self.slot
            .handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut st = lock(&self.state);
        st.waiters.remove(&self.id);
        if let Some(n) = st.channels.get_mut(&self.channel) {
            *n = n.saturating_sub(1);
        }
    }
}
