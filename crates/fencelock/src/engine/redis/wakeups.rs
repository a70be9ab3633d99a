//! Wake-ups for waiting acquisitions (the notify and fair wait modes): the
//! registry of a client's waiters and the routing of wake-ups to them.
//!
//! A client keeps ONE pub/sub connection ([`PubSub`]), opened when it first
//! waits, shared by all its waiters. Each waiter has a number; a queued
//! waiter is a member of the lock's wait queue (`store::redis::wire`), and
//! a release wakes the head by publishing on the channel of that lock and
//! client, saying whether it handed the lock over (and with which fence).
//! The client subscribes to that channel once per lock name it waits on, so
//! a release sends one message to one connection, however many wait.
//!
//! Messages can be lost (pub/sub is at-most-once, e.g. across a reconnect);
//! waiters never rely on them alone: they also retry when the holder's lease
//! runs out and every third of their waiter lease. After a disconnection all
//! waiters are woken to retry at once, and subscriptions are restored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::fence::Fence;
use crate::store::redis::wire::Wake;
use crate::store::redis::{Event, PubSub, RedisConn};

/// Channels kept subscribed with no waiter before idle ones are dropped.
const MAX_IDLE_CHANNELS: usize = 256;

/// Where a waiter is woken, and told the fence of a lock handed to it.
#[derive(Debug, Default)]
struct Slot {
    notify: Notify,
    handed: Mutex<Option<Fence>>,
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
    conn: PubSub,
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
    conn: PubSub,
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
            let ok = tokio::select! {
                () = stop.cancelled() => return,
                ok = conn.ping() => ok,
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
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    /// Opens the pub/sub connection.
    pub(crate) async fn connect(source: &RedisConn) -> Result<Self> {
        let state = Arc::new(Mutex::new(WakeState::default()));
        let dispatch = state.clone();
        let (lost_tx, lost_rx) = unbounded_channel();
        let conn = PubSub::connect(source, move |event| {
            if event == Event::Disconnected {
                let _ = lost_tx.send(());
            }
            deliver(&dispatch, event);
        })
        .await?;
        let stop = CancellationToken::new();
        tokio::spawn(restore(conn.clone(), state.clone(), lost_rx, stop.clone()));
        Ok(Wakeups { conn, state, stop })
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
        for c in idle {
            // Best effort: an extra subscription only costs a little memory.
            let _ = self.conn.unsubscribe(&c).await;
        }
        if subscribe {
            self.conn.subscribe(channel).await?;
        }
        let mut st = lock(&self.state);
        *st.channels.entry(channel.to_string()).or_insert(0) += 1;
        st.next_id += 1;
        let id = st.next_id;
        let slot = Arc::new(Slot::default());
        st.waiters.insert(id, slot.clone());
        Ok(Waiter {
            id,
            slot,
            channel: channel.to_string(),
            state: self.state.clone(),
        })
    }
}

/// Routes a pub/sub event to its waiter.
fn deliver(state: &Mutex<WakeState>, event: Event) {
    match event {
        Event::Wake(wake) => {
            if let Some(slot) = lock(state).waiters.get(&wake.waiter()) {
                if let Wake::HandedOver { fence, .. } = wake {
                    *slot.handed.lock().unwrap_or_else(|p| p.into_inner()) = Some(fence);
                }
                slot.notify.notify_one();
            }
        }
        Event::Disconnected => {
            // Wake-ups may have been lost while disconnected: everyone retries.
            for slot in lock(state).waiters.values() {
                slot.notify.notify_one();
            }
        }
    }
}

/// One waiting acquisition's registration. Dropping it unregisters.
#[derive(Debug)]
pub(crate) struct Waiter {
    id: u64,
    slot: Arc<Slot>,
    channel: String,
    state: Arc<Mutex<WakeState>>,
}

impl Waiter {
    /// This waiter's number within its client.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Completes when a release woke this waiter (or one already did since
    /// the last call), with the fence if the lock was handed over to it.
    pub(crate) async fn woken(&self) -> Option<Fence> {
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
