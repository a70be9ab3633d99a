//! The observer: reads the lock keys every 2 ms on a client of its own
//! (straight to the lock server, never through the proxy) and records every
//! change of holder as an `observed` event: Redis's own view of who holds
//! each name, in Redis's order. The checkers use it for the grant order
//! (C6), resurrected keys (C7) and the moment a loss became visible (C5).
//!
//! It reads through fencelock's own `LockClient::inspect` (one atomic
//! script per name), so it follows the primary wherever the workers do: a
//! single server, the master Sentinel names (across failovers), the master
//! of each key's slot on a Cluster.
//!
//! On a semaphore (`--primitive semaphore`) it records each slot apart: a
//! change of a slot's holder is an `observed` event with the slot, so the
//! checkers see every slot as a lock of its own.
//!
//! On a read-write lock (`--primitive rwlock`) it records every holder of
//! a name at once: a change of the writer or of the set of readers is an
//! `observed_holders` event with all of them (the checkers follow each
//! holder apart, and the writer alone).
//!
//! It runs on a thread of its own so that the coordinator's work does not
//! delay its polls; it stops when told, or when the run's channel closes.

use std::time::Duration;

use fencelock::{KeyLayout, LockClient, LockState};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::clock::RunClock;
use crate::conn::Tls;
use crate::error::{Error, Result};
use crate::history::{Entry, Event, Holding};

/// How often the lock keys are read.
pub(crate) const POLL: Duration = Duration::from_millis(2);

/// A running observer.
#[derive(Debug)]
pub(crate) struct Observer {
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What one poll found for a name: holder id and fence, or absent.
type Seen = Option<(String, Option<u64>)>;

/// What kind of lock the observer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    /// One holder per name.
    Mutex,
    /// One holder per slot of a semaphore of this many permits.
    Semaphore(u32),
    /// The writer or the readers of a read-write lock.
    RwLock,
}

impl Observer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        url: &str,
        tls: &Tls,
        prefix: &str,
        layout: KeyLayout,
        names: &[String],
        watched: Watched,
        clock: RunClock,
        events: UnboundedSender<Event>,
    ) -> Result<Self> {
        for name in names {
            fencelock::LockKeys::new(prefix, layout, name)
                .map_err(|e| Error::usage(e.to_string()))?;
        }
        let (url, prefix, names) = (url.to_string(), prefix.to_string(), names.to_vec());
        let tls = tls.clone();
        let stop = CancellationToken::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("torture-observer".into())
                .spawn(move || {
                    runtime.block_on(observe(
                        url, tls, prefix, names, layout, watched, clock, events, stop,
                    ));
                })
                .map_err(|e| Error::failed(format!("cannot start the observer thread: {e}")))?
        };
        Ok(Observer {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// What `inspect` says, as the observer records it. The guide layout's
/// value holds no fence (inspect would give the last one issued, which is
/// not necessarily the holder's).
fn seen(state: LockState, layout: KeyLayout) -> Seen {
    match state {
        LockState::Held { holder, fence, .. } => Some((
            holder,
            match layout {
                KeyLayout::Guide => None,
                _ => fence.map(|f| f.get()),
            },
        )),
        _ => None,
    }
}

/// What `inspect` says of each slot of a semaphore of `permits`.
fn seen_slots(state: LockState, permits: u32) -> Vec<Seen> {
    let mut slots: Vec<Seen> = vec![None; permits as usize];
    if let LockState::Semaphore { holders, .. } = state {
        for h in holders {
            if let Some(s) = slots.get_mut(h.slot as usize) {
                *s = Some((h.holder, h.fence.map(|f| f.get())));
            }
        }
    }
    slots
}

/// Every holder of a read-write lock as `inspect` says, sorted (a mutex's
/// holder where the store shows a plain lock).
fn seen_holders(state: LockState, layout: KeyLayout) -> Vec<Holding> {
    let mut out: Vec<Holding> = match state {
        LockState::RwLock {
            writer, readers, ..
        } => writer
            .into_iter()
            .map(|w| (w, "write"))
            .chain(readers.into_iter().map(|r| (r, "read")))
            .map(|(h, access)| Holding {
                holder: h.holder,
                fence: h.fence.map(|f| f.get()),
                access: Some(access.to_string()),
            })
            .collect(),
        state => seen(state, layout)
            .map(|(holder, fence)| Holding {
                holder,
                fence,
                access: None,
            })
            .into_iter()
            .collect(),
    };
    out.sort_by(|a, b| a.holder.cmp(&b.holder));
    out
}

/// A client for the observer, retried until it connects or the run stops.
async fn client(
    url: &str,
    tls: &Tls,
    prefix: &str,
    stop: &CancellationToken,
) -> Option<LockClient> {
    loop {
        let connect = tls
            .builder(url)
            .prefix(prefix)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_secs(5))
            .connect();
        tokio::select! {
            () = stop.cancelled() => return None,
            c = connect => if let Ok(c) = c { return Some(c) },
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn observe(
    url: String,
    tls: Tls,
    prefix: String,
    names: Vec<String>,
    layout: KeyLayout,
    watched: Watched,
    clock: RunClock,
    events: UnboundedSender<Event>,
    stop: CancellationToken,
) {
    let Some(client) = client(&url, &tls, &prefix, &stop).await else {
        return;
    };
    // Per name, per slot (one for a mutex).
    let width = match watched {
        Watched::Semaphore(p) => p as usize,
        _ => 1,
    };
    let mut last: Vec<Vec<Option<Seen>>> = vec![vec![None; width]; names.len()];
    // Per name: a read-write lock's holders last recorded.
    let mut last_rw: Vec<Option<Vec<Holding>>> = vec![None; names.len()];
    while !stop.is_cancelled() {
        for (i, name) in names.iter().enumerate() {
            let sent = clock.now();
            let reply = tokio::select! {
                () = stop.cancelled() => return,
                r = client.inspect(name, layout) => r,
            };
            let t = clock.now();
            let Ok(state) = reply else {
                // Unreachable for now (a paused or failed-over server): the
                // next poll tries again.
                continue;
            };
            if watched == Watched::RwLock {
                let holders = seen_holders(state, layout);
                if last_rw[i].as_ref() == Some(&holders) {
                    continue;
                }
                last_rw[i] = Some(holders.clone());
                let event = Event {
                    t,
                    p: "observer".into(),
                    e: Entry::ObservedHolders {
                        name: name.clone(),
                        holders,
                        sent,
                    },
                };
                if events.send(event).is_err() {
                    return;
                }
                continue;
            }
            let now: Vec<(Option<u32>, Seen)> = match watched {
                Watched::Semaphore(p) => (0u32..)
                    .zip(seen_slots(state, p))
                    .map(|(s, seen)| (Some(s), seen))
                    .collect(),
                _ => vec![(None, seen(state, layout))],
            };
            for (k, (slot, seen)) in now.into_iter().enumerate() {
                if last[i][k].as_ref() == Some(&seen) {
                    continue;
                }
                let (holder, fence) = match &seen {
                    Some((h, f)) => (Some(h.clone()), *f),
                    None => (None, None),
                };
                let event = Event {
                    t,
                    p: "observer".into(),
                    e: Entry::Observed {
                        name: name.clone(),
                        holder,
                        fence,
                        sent,
                        slot,
                    },
                };
                if events.send(event).is_err() {
                    return;
                }
                last[i][k] = Some(seen);
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
