//! The keeper: background renewal and the deadline watchdog of every lease
//! of one client, in one task.
//!
//! A client has one [`Keeper`]: a registry of its held leases ordered by when
//! each next needs attention, and one task that sleeps until then. A lease
//! costs an entry in the registry, not a task: taking and releasing a lock
//! touch the registry under a short mutex and wake nobody (the keeper is
//! woken only when a new lease needs it sooner than it planned to wake).
//!
//! On each wake-up the keeper
//! - declares lost, at once, every lease whose local monotonic deadline has
//!   passed before a renewal succeeded (Redis paused or unreachable, or this
//!   process stalled), also while its renewal is still in flight;
//! - renews every lease that is due, and with them every lease due within a
//!   short slack ([`slack`]: an eighth of its interval, at most 25 ms), so
//!   renewals that fall due together travel together: one compare-and-pexpire
//!   script call per batch of up to [`MAX_BATCH`] leases of one ttl (of one
//!   slot on a Cluster), instead of one call per lease.
//!
//! A batch is sent by a task of its own and never awaited by the keeper, so a
//! slow batch (a paused Cluster node) delays neither the other batches nor
//! any loss signal. When a batch's reply arrives, each lease moves its
//! deadline forward (from when the batch was *sent*), or is declared lost when
//! Redis says it is no longer ours, or retries soon after a transient error.
//!
//! Every renewal sent records how late it was against its schedule (the
//! renewal lag: event-loop stalls, blocking calls, pauses of the process) into
//! `fencelock_renewal_lag_seconds` and the client's stats, and warns once per
//! lease when the lag exceeds a third of the ttl, with a suggested ttl.
//!
//! No renewal is sent after a release: the release (or the drop of the
//! guard) takes the lease out of the registry, and if a renewal of it is in
//! flight, waits for that batch's reply before it sends its own call.
//!
//! The keeper task holds the registry only weakly: it ends once the client
//! and every lease taken through it are gone. It runs on the runtime of the
//! lease that started it; if that runtime shuts down, the next lease starts
//! it again on its own.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use super::state::LeaseState;
use crate::engine::Granted;
use crate::error::{Error, LossReason, Result};
use crate::options::Replication;
use crate::store::Checked;
use crate::store::redis::BatchGroup;

/// Most leases renewed by one script call (a bigger batch would hold Redis
/// for longer than a millisecond).
pub(crate) const MAX_BATCH: usize = 256;

/// The longest that a renewal is sent ahead of its schedule to travel with
/// others.
const MAX_SLACK: Duration = Duration::from_millis(25);

/// How far ahead of its schedule a renewal every `interval` may be sent to
/// join a batch.
pub(crate) fn slack(interval: Duration) -> Duration {
    (interval / 8).min(MAX_SLACK)
}

/// Delay before retrying a renewal that failed with a transient error.
fn retry_delay(interval: Duration) -> Duration {
    (interval / 4).max(Duration::from_millis(5))
}

/// The keeper of one client's leases (see the module docs).
#[derive(Debug)]
pub(crate) struct Keeper {
    registry: Mutex<Registry>,
    /// Wakes the keeper task: a lease needs it sooner than it planned, a
    /// batch reply was applied, or the keeper is gone.
    wake: Arc<Notify>,
    /// Notified after a batch reply was applied (a release waits on it).
    settled: Notify,
    /// The keeper task, started with the first lease (again if its runtime
    /// shut down).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    leases: HashMap<u64, Entry, foldhash::fast::RandomState>,
    /// `(when, lease id)`: when each lease next needs the keeper.
    timers: BTreeSet<(Instant, u64)>,
    /// When the keeper task wakes by itself next (`None`: only when woken).
    sleeping_until: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    state: Arc<LeaseState>,
    /// Renewal interval (`None`: renewal off, only the deadline is watched).
    interval: Option<Duration>,
    /// When the next renewal is due (`None`: none is).
    due: Option<Instant>,
    /// Its key in `timers`, if it has one.
    timer: Option<Instant>,
    /// A batch renewing it has been sent and has not replied yet.
    in_flight: bool,
    /// Released (or lost) while in flight: removed when the batch replies.
    closing: bool,
    /// A renewal refused for a configuration reason was logged.
    warned: bool,
}

impl Registry {
    /// Files lease `id` under the next moment it needs the keeper: its
    /// deadline, or its next renewal if that comes first and none is in
    /// flight.
    fn reschedule(&mut self, id: u64) {
        let Some(e) = self.leases.get_mut(&id) else {
            return;
        };
        let deadline = e.state.deadline();
        let at = match (e.due, e.in_flight) {
            (Some(due), false) => due.min(deadline),
            _ => deadline,
        };
        if let Some(old) = e.timer.replace(at) {
            self.timers.remove(&(old, id));
        }
        self.timers.insert((at, id));
    }

    fn unschedule(&mut self, id: u64) {
        if let Some(old) = self.leases.get_mut(&id).and_then(|e| e.timer.take()) {
            self.timers.remove(&(old, id));
        }
    }

    fn remove(&mut self, id: u64) {
        self.unschedule(id);
        self.leases.remove(&id);
    }
}

/// A batch of leases renewed by one script call.
type Batch = Vec<(u64, Arc<LeaseState>)>;

impl Keeper {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Keeper {
            registry: Mutex::new(Registry::default()),
            wake: Arc::new(Notify::new()),
            settled: Notify::new(),
            task: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes over a new lease granted at `started`; returns its id.
    ///
    /// `renew_now`: the lease was handed over for less than its ttl; the
    /// first renewal brings it to the full ttl at once (even with renewal
    /// off, the lease is owed its ttl once).
    pub(crate) fn register(
        self: &Arc<Self>,
        state: Arc<LeaseState>,
        started: Instant,
        interval: Option<Duration>,
        renew_now: bool,
    ) -> u64 {
        let due = if renew_now {
            Some(Instant::now())
        } else {
            interval.map(|i| started + i)
        };
        let (id, sooner) = {
            let mut reg = self.lock();
            let id = reg.next_id;
            reg.next_id += 1;
            reg.leases.insert(
                id,
                Entry {
                    state,
                    interval,
                    due,
                    timer: None,
                    in_flight: false,
                    closing: false,
                    warned: false,
                },
            );
            reg.reschedule(id);
            let at = reg.leases.get(&id).and_then(|e| e.timer);
            let sooner = match (at, reg.sleeping_until) {
                (Some(at), Some(until)) => at < until,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if sooner {
                reg.sleeping_until = at;
            }
            (id, sooner)
        };
        self.ensure_task();
        if sooner {
            self.wake.notify_one();
        }
        id
    }

    /// Starts the keeper task unless it runs.
    fn ensure_task(self: &Arc<Self>) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // A new task plans from scratch.
        self.lock().sleeping_until = None;
        *task = Some(runtime.spawn(run(Arc::downgrade(self), self.wake.clone())));
    }

    /// Stops looking after lease `id` at once; a renewal of it in flight
    /// still completes (see [`Keeper::close`]).
    pub(crate) fn stop(&self, id: u64) {
        let mut reg = self.lock();
        match reg.leases.get_mut(&id) {
            Some(e) if e.in_flight => {
                e.closing = true;
                reg.unschedule(id);
            }
            Some(_) => reg.remove(id),
            None => {}
        }
    }

    /// Stops looking after lease `id` and waits until no renewal of it is in
    /// flight: after this returns, no renewal of it reaches Redis.
    pub(crate) async fn close(&self, id: u64) {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            {
                let mut reg = self.lock();
                match reg.leases.get_mut(&id) {
                    None => return,
                    Some(e) if !e.in_flight => {
                        reg.remove(id);
                        return;
                    }
                    Some(e) => {
                        e.closing = true;
                        reg.unschedule(id);
                    }
                }
                // Enabled under the registry's lock: a batch settles (and
                // notifies) only after taking it, so its reply is not missed.
                // The common case, no renewal in flight, never waits.
                settled.as_mut().enable();
            }
            settled.await;
        }
    }

    /// One wake-up at `now`: declares lost the leases past their deadline,
    /// sends the batches of the leases due (or due within their slack), and
    /// returns when the keeper must wake next.
    fn tick(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        // One batch per script call: leases of one slot, one ttl, and
        // waiting for the same replicas.
        let mut batches: HashMap<(BatchGroup, Duration, Option<Replication>), Batch> =
            HashMap::new();
        let mut reg = self.lock();
        let horizon = now + MAX_SLACK;
        let candidates: Vec<(Instant, u64)> =
            reg.timers.range(..=(horizon, u64::MAX)).copied().collect();
        for (at, id) in candidates {
            let Some(e) = reg.leases.get_mut(&id) else {
                continue;
            };
            if now >= e.state.deadline() {
                e.state.mark_lost(LossReason::DeadlinePassed);
                if e.in_flight {
                    e.closing = true;
                    reg.unschedule(id);
                } else {
                    reg.remove(id);
                }
                continue;
            }
            let due = match (e.in_flight, e.due) {
                (false, Some(due)) => {
                    let every = e.interval.unwrap_or(e.state.grant.ttl / 3);
                    (due <= now + slack(every)).then_some(due)
                }
                _ => None,
            };
            let Some(due) = due else {
                // Woken for a deadline that a manual extend has moved.
                if at <= now {
                    reg.reschedule(id);
                }
                continue;
            };
            e.in_flight = true;
            let state = e.state.clone();
            reg.reschedule(id);
            state.metrics.renewal_lag(
                &state.grant.name,
                now.saturating_duration_since(due),
                state.grant.ttl,
            );
            let group = (
                state.engine.batch_group(&state.grant),
                state.grant.ttl,
                state.grant.replication(),
            );
            batches.entry(group).or_default().push((id, state));
        }
        // With no lease left, the wake-up planned before stays planned (if
        // it is still ahead): a lease registered meanwhile whose time comes
        // later then needs no wake-up of its own, and a client that takes
        // and releases locks one after another wakes its keeper about once
        // per renewal interval, not once per lease. An early wake-up finds
        // nothing to do and plans again.
        let next = match reg.timers.first() {
            Some((at, _)) => Some(*at),
            None => reg.sleeping_until.filter(|until| *until > now),
        };
        reg.sleeping_until = next;
        drop(reg);
        for ((_, ttl, _), mut batch) in batches {
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(MAX_BATCH));
                tokio::spawn(renew_batch(self.clone(), ttl, batch));
                batch = rest;
            }
        }
        next
    }

    /// Applies the reply of a batch sent at `sent`.
    fn settle(&self, batch: &Batch, sent: Instant, reply: Result<Vec<Checked>>) {
        let now = Instant::now();
        let reply = match reply {
            Ok(codes) if codes.len() == batch.len() => Ok(codes),
            Ok(codes) => Err(Error::UnexpectedReply(format!(
                "a batched renewal of {} leases returned {} codes",
                batch.len(),
                codes.len()
            ))),
            Err(e) => Err(e),
        };
        {
            let mut reg = self.lock();
            for (i, (id, state)) in batch.iter().enumerate() {
                let outcome = match &reply {
                    Ok(codes) => Ok(codes[i]),
                    Err(e) => Err(e),
                };
                state.metrics.renewal(matches!(outcome, Ok(Checked::Done)));
                let Some(e) = reg.leases.get_mut(id) else {
                    continue;
                };
                if e.closing {
                    reg.remove(*id);
                    continue;
                }
                e.in_flight = false;
                match outcome {
                    Ok(Checked::Done) => {
                        state.renewed(sent);
                        e.due = e.interval.map(|i| now + i);
                        reg.reschedule(*id);
                    }
                    Ok(Checked::NotOurs(reason)) => {
                        state.mark_lost(reason);
                        reg.remove(*id);
                    }
                    Err(err) => {
                        if err.is_config() && !e.warned {
                            // A missing permission (PEXPIRE) or a key of the
                            // wrong type will not cure itself: the lease will
                            // be lost at its deadline, and this says why.
                            e.warned = true;
                            tracing::warn!(lock = %state.grant.name, error = %err, "renewal refused; the lease will be lost at its deadline");
                        } else if matches!(err, Error::RenewalNotReplicated { .. }) && !e.warned {
                            // Replicas that lag or are gone may not come
                            // back before the deadline: say so once.
                            e.warned = true;
                            tracing::warn!(lock = %state.grant.name, error = %err, "renewal not replicated; retrying until the deadline");
                        } else {
                            tracing::debug!(lock = %state.grant.name, error = %err, "renewal failed; retrying until the deadline");
                        }
                        let every = e.interval.unwrap_or(state.grant.ttl / 3);
                        e.due = Some(now + retry_delay(every));
                        reg.reschedule(*id);
                    }
                }
            }
        }
        self.settled.notify_waiters();
        self.wake.notify_one();
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // The task holds the registry weakly: woken, it finds it gone and
        // ends.
        self.wake.notify_one();
    }
}

/// The keeper task: ticks whenever the earliest lease needs it or it is
/// woken, until the keeper is gone.
async fn run(keeper: Weak<Keeper>, wake: Arc<Notify>) {
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let next = match keeper.upgrade() {
            Some(keeper) => keeper.tick(Instant::now()),
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = &mut woken => {}
                    () = sleep_until(at) => {}
                }
            }
            None => woken.await,
        }
    }
}

/// Renews one batch (one script call) and applies the reply.
async fn renew_batch(keeper: Arc<Keeper>, ttl: Duration, batch: Batch) {
    let Some((_, first)) = batch.first() else {
        return;
    };
    let engine = first.engine.clone();
    let leases: Vec<&Granted> = batch.iter().map(|(_, s)| &s.grant).collect();
    let sent = Instant::now();
    let reply = engine.renew_many(&leases, ttl).await;
    drop(leases);
    keeper.settle(&batch, sent, reply);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_join_a_batch_at_most_an_eighth_of_their_interval_early() {
        assert_eq!(slack(Duration::from_millis(80)), Duration::from_millis(10));
        // Long intervals: at most 25 ms early.
        assert_eq!(slack(Duration::from_secs(10)), MAX_SLACK);
        assert_eq!(
            retry_delay(Duration::from_millis(8)),
            Duration::from_millis(5)
        );
        assert_eq!(retry_delay(Duration::from_secs(4)), Duration::from_secs(1));
    }
}
