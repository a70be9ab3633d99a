//! The checkers: C1–C7, run on a [`History`] (at the end of a run, during
//! one to stop early, or on a saved `--history` file).
//!
//! | id | rule | evidence |
//! |---|---|---|
//! | C1 | no write accepted with a fence lower than an already accepted one (per resource) | the resource's audit |
//! | C2 | no two different holders accepted with the same fence | the audit |
//! | C3 | no acknowledged write lost: every acknowledged write is in the audit, no accepted write overwrote an increment it had not read, and the counter equals the accepted increments | the workers' acknowledgements, the audit, the final state |
//! | C4 | mutual exclusion among valid holders: no two workers in their critical sections at once while both held leases Redis had not let expire | the workers' critical sections and lease validity (from Redis's replies: sent time + ttl − drift) |
//! | C5 | a worker whose lease was lost got its loss signal within one renewal interval (+ [`SLACK`]) of the loss being observable | the observer (the key gone or taken), worker pauses, the workers' loss signals and releases |
//! | C6 | fences strictly increasing in grant order per name (clock mode: also across restarts without persistence) | the observer's order of holders, and real-time order of grants |
//! | C7 | no lock key re-created after it ended (no zombie renewals) | the observer |
//!
//! Every checker counts what it checked, its violations, and what it
//! excused: only what docs/design.md §9 does not promise — mutual exclusion
//! across a restart that lost the lock server's data (C4), and counter-mode
//! fences across such a restart (C6). The first violation comes with the
//! surrounding history.
//!
//! On a replicated topology (Sentinel, Cluster) a failover (`failover`, and
//! `kill-wipe` of the primary, which a replica replaces) promotes a replica
//! that may lack the primary's last writes. What the workers waited for is
//! on every replica: their grants, when they wait for every replica of the
//! shard (the default). What nobody waited for may be rolled back: renewals
//! and releases always, grants too when the workers wait for fewer
//! replicas. So across a failover window the checkers excuse — and say so
//! in the result's notes — exactly what such a rollback explains:
//!
//! - C4: an overlap that disappears when each lease is taken as valid only
//!   as far as the writes that survive promise (its grant's own validity;
//!   nothing, from the failover on, when the grant itself was not waited
//!   for by every replica);
//! - C6: a lower fence observed after a failover, when the higher one
//!   belonged to a grant nobody was told of (a grant refused for lack of
//!   replica acknowledgements, released again) or, without the wait for
//!   every replica, a rolled-back grant; counter fences that repeat after a
//!   rolled-back grant (without that wait);
//! - C7: a released or expired key that is back after a failover (the
//!   release or expiry was rolled back; no renewal re-created it).
//!
//! C1–C3 (the resource, which no nemesis touches) are never excused.

mod lock;
mod resource;

use std::collections::HashMap;

use crate::history::{Entry, Event, History, Outcome, Released};

/// How much later than one renewal interval a loss signal may come (C5):
/// scheduling on a loaded machine, and reconnecting after a restart.
pub const SLACK: std::time::Duration = std::time::Duration::from_millis(150);

/// One checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// `C1` … `C7`.
    pub id: &'static str,
    /// The rule, in words.
    pub rule: &'static str,
    /// How many items (writes, leases, grants …) it checked.
    pub checked: u64,
    /// How many broke the rule.
    pub violations: u64,
    /// How many broke it where the design promises nothing (see the module
    /// docs), not counted as violations.
    pub excused: u64,
    /// Why what was excused is not promised, one sentence per reason.
    pub notes: Vec<String>,
    /// The first violation, if any.
    pub first: Option<Violation>,
}

/// A violation with its surrounding history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// When it happened (µs since the start of the run).
    pub at: i64,
    /// What is wrong.
    pub message: String,
    /// The events around it (JSON lines).
    pub context: Vec<String>,
}

impl CheckResult {
    fn new(id: &'static str, rule: &'static str) -> Self {
        CheckResult {
            id,
            rule,
            checked: 0,
            violations: 0,
            excused: 0,
            notes: Vec::new(),
            first: None,
        }
    }

    /// Records an excused breach and why it is not promised.
    fn excuse(&mut self, why: &str) {
        self.excused += 1;
        if !self.notes.iter().any(|n| n == why) {
            self.notes.push(why.to_string());
        }
    }

    /// Records a violation; keeps the earliest.
    fn violation(&mut self, index: &Index<'_>, at: i64, message: String, ops: &[&str], name: &str) {
        self.violations += 1;
        if self.first.as_ref().is_none_or(|f| at < f.at) {
            self.first = Some(Violation {
                at,
                message,
                context: index.context(ops, name, at),
            });
        }
    }

    /// Whether the rule held.
    pub fn passed(&self) -> bool {
        self.violations == 0
    }
}

/// One lease cycle of a worker, as the history tells it.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) op: String,
    pub(crate) worker: String,
    pub(crate) name: String,
    pub(crate) fence: u64,
    pub(crate) holder: String,
    pub(crate) invoked: i64,
    pub(crate) granted: i64,
    /// (time, valid until) from every event that carries validity.
    pub(crate) samples: Vec<(i64, i64)>,
    pub(crate) release_invoked: Option<i64>,
    pub(crate) release_done: Option<(i64, Released)>,
    pub(crate) lost: Option<i64>,
    /// The last event of the cycle.
    pub(crate) last: i64,
}

impl Lease {
    /// The end of the critical section: the release, or the cycle's last
    /// event.
    pub(crate) fn cs_end(&self) -> i64 {
        self.release_invoked.unwrap_or(self.last)
    }
}

/// An observation of a lock key.
#[derive(Debug, Clone)]
pub(crate) struct Obs {
    pub(crate) t: i64,
    pub(crate) sent: i64,
    pub(crate) holder: Option<String>,
    pub(crate) fence: Option<u64>,
}

/// An accepted write in the audit.
#[derive(Debug, Clone)]
pub(crate) struct AuditRow {
    pub(crate) seq: u64,
    pub(crate) op: String,
    pub(crate) fence: u64,
    pub(crate) holder: String,
    pub(crate) read: i64,
    pub(crate) before: i64,
    pub(crate) after: i64,
}

/// A write invocation and its outcome.
#[derive(Debug, Clone)]
pub(crate) struct WriteRec {
    pub(crate) name: String,
    pub(crate) invoked: i64,
    pub(crate) done: Option<(i64, Outcome)>,
}

/// The history, indexed for the checkers.
#[derive(Debug)]
pub(crate) struct Index<'a> {
    pub(crate) history: &'a History,
    pub(crate) leases: Vec<Lease>,
    pub(crate) observed: HashMap<String, Vec<Obs>>,
    pub(crate) audit: HashMap<String, Vec<AuditRow>>,
    pub(crate) finals: HashMap<String, i64>,
    pub(crate) writes: HashMap<String, WriteRec>,
    /// Start times of nemeses that lost the lock server's data.
    pub(crate) data_loss: Vec<i64>,
    /// Failover windows (start, end) of a replicated topology: what no
    /// grant waited for may be rolled back in them.
    pub(crate) rollbacks: Vec<(i64, i64)>,
    /// Whether every grant was acknowledged by every replica of its shard
    /// before use (so a failover cannot lose it).
    pub(crate) grants_replicated: bool,
    /// The lease ttl (µs).
    pub(crate) ttl_us: i64,
    /// Pauses of each worker: (SIGSTOP, SIGCONT).
    pub(crate) pauses: HashMap<String, Vec<(i64, i64)>>,
    /// The last event's time.
    pub(crate) end: i64,
    pub(crate) renewal_us: i64,
    pub(crate) counter_mode: bool,
}

impl<'a> Index<'a> {
    pub(crate) fn new(history: &'a History) -> Self {
        let header = history.header();
        let mut leases: Vec<Lease> = Vec::new();
        let mut by_op: HashMap<String, usize> = HashMap::new();
        let mut invoked: HashMap<String, i64> = HashMap::new();
        let mut observed: HashMap<String, Vec<Obs>> = HashMap::new();
        let mut audit: HashMap<String, Vec<AuditRow>> = HashMap::new();
        let mut finals = HashMap::new();
        let mut writes: HashMap<String, WriteRec> = HashMap::new();
        let mut data_loss = Vec::new();
        let mut rollbacks = Vec::new();
        let mut open_rollback: Option<(String, i64)> = None;
        let mut pauses: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
        let mut open_pauses: HashMap<String, i64> = HashMap::new();
        let mut end = 0;
        for ev in &history.events {
            end = end.max(ev.t);
            if let Some(op) = ev.op()
                && let Some(&i) = by_op.get(op)
            {
                leases[i].last = leases[i].last.max(ev.t);
            }
            match &ev.e {
                Entry::Acquire { op, .. } => {
                    invoked.insert(op.clone(), ev.t);
                }
                Entry::Granted {
                    op,
                    name,
                    fence,
                    holder,
                    valid_until,
                } => {
                    by_op.insert(op.clone(), leases.len());
                    leases.push(Lease {
                        op: op.clone(),
                        worker: ev.p.clone(),
                        name: name.clone(),
                        fence: *fence,
                        holder: holder.clone(),
                        invoked: invoked.get(op).copied().unwrap_or(ev.t),
                        granted: ev.t,
                        samples: vec![(ev.t, *valid_until)],
                        release_invoked: None,
                        release_done: None,
                        lost: None,
                        last: ev.t,
                    });
                }
                Entry::Register {
                    op, valid_until, ..
                }
                | Entry::Read {
                    op, valid_until, ..
                }
                | Entry::Write {
                    op, valid_until, ..
                } => {
                    if let Some(&i) = by_op.get(op) {
                        leases[i].samples.push((ev.t, *valid_until));
                    }
                    if let Entry::Write { .. } = &ev.e
                        && let Some(&i) = by_op.get(op)
                    {
                        writes.insert(
                            op.clone(),
                            WriteRec {
                                name: leases[i].name.clone(),
                                invoked: ev.t,
                                done: None,
                            },
                        );
                    }
                }
                Entry::Written { op, outcome } => {
                    if let Some(w) = writes.get_mut(op) {
                        w.done = Some((ev.t, *outcome));
                    }
                }
                Entry::Release { op, valid_until } => {
                    if let Some(&i) = by_op.get(op) {
                        leases[i].samples.push((ev.t, *valid_until));
                        leases[i].release_invoked = Some(ev.t);
                    }
                }
                Entry::ReleaseDone { op, outcome } => {
                    if let Some(&i) = by_op.get(op) {
                        leases[i].release_done = Some((ev.t, *outcome));
                    }
                }
                Entry::Lost { op, .. } => {
                    if let Some(&i) = by_op.get(op) {
                        leases[i].lost.get_or_insert(ev.t);
                    }
                }
                Entry::Observed {
                    name,
                    holder,
                    fence,
                    sent,
                } => observed.entry(name.clone()).or_default().push(Obs {
                    t: ev.t,
                    sent: *sent,
                    holder: holder.clone(),
                    fence: *fence,
                }),
                Entry::Audit {
                    name,
                    seq,
                    op,
                    fence,
                    holder,
                    read,
                    before,
                    after,
                    ..
                } => audit.entry(name.clone()).or_default().push(AuditRow {
                    seq: *seq,
                    op: op.clone(),
                    fence: *fence,
                    holder: holder.clone(),
                    read: *read,
                    before: *before,
                    after: *after,
                }),
                Entry::Final { name, value, .. } => {
                    finals.insert(name.clone(), *value);
                }
                Entry::NemesisStart {
                    kind,
                    target,
                    data_loss: lost,
                    rollback,
                    ..
                } => {
                    if *lost {
                        data_loss.push(ev.t);
                    }
                    if *rollback {
                        open_rollback = Some((kind.clone(), ev.t));
                    }
                    if kind == "pause-worker"
                        && let Some(w) = target
                    {
                        open_pauses.insert(w.clone(), ev.t);
                    }
                }
                Entry::NemesisEnd { kind, target, .. } => {
                    if let Some((k, start)) = &open_rollback
                        && k == kind
                    {
                        rollbacks.push((*start, ev.t));
                        open_rollback = None;
                    }
                    if kind == "pause-worker"
                        && let Some(w) = target
                        && let Some(start) = open_pauses.remove(w)
                    {
                        pauses.entry(w.clone()).or_default().push((start, ev.t));
                    }
                }
                _ => {}
            }
        }
        for (w, start) in open_pauses {
            pauses.entry(w).or_default().push((start, i64::MAX));
        }
        if let Some((_, start)) = open_rollback {
            rollbacks.push((start, i64::MAX));
        }
        for rows in audit.values_mut() {
            rows.sort_by_key(|r| r.seq);
        }
        for obs in observed.values_mut() {
            obs.sort_by_key(|o| o.t);
        }
        leases.sort_by_key(|l| l.granted);
        let renewal_us =
            header.map_or(100_000, |h| i64::try_from(h.renewal_ms).unwrap_or(0) * 1000);
        Index {
            history,
            leases,
            observed,
            audit,
            finals,
            writes,
            data_loss,
            rollbacks,
            grants_replicated: header.is_some_and(|h| h.wait_replicas >= h.replicas),
            ttl_us: header.map_or(300_000, |h| i64::try_from(h.ttl_ms).unwrap_or(0) * 1000),
            pauses,
            end,
            renewal_us,
            counter_mode: header.is_some_and(|h| h.fence_mode == "counter"),
        }
    }

    /// Whether a data-losing restart started in `[from, to]`.
    pub(crate) fn data_lost_between(&self, from: i64, to: i64) -> bool {
        self.data_loss.iter().any(|&w| w >= from && w <= to)
    }

    /// Whether a failover window overlaps `[from, to]`.
    pub(crate) fn rollback_between(&self, from: i64, to: i64) -> bool {
        self.rollbacks.iter().any(|&(s, e)| s <= to && e >= from)
    }

    /// The events around `at`: those of `ops`, and the nemeses and
    /// observations of `name` near it, at most 30 lines in time order.
    pub(crate) fn context(&self, ops: &[&str], name: &str, at: i64) -> Vec<String> {
        let window = 4 * self.renewal_us.max(50_000);
        let mut picked: Vec<&Event> = self
            .history
            .events
            .iter()
            .filter(|e| match &e.e {
                Entry::NemesisStart { .. } | Entry::NemesisEnd { .. } => {
                    e.t >= at - window && e.t <= at + window
                }
                Entry::Observed { name: n, .. } => {
                    n == name && e.t >= at - window && e.t <= at + window / 2
                }
                Entry::Audit { op, .. } => ops.contains(&op.as_str()),
                _ => e.op().is_some_and(|op| ops.contains(&op)),
            })
            .collect();
        picked.sort_by_key(|e| e.t);
        if picked.len() > 30 {
            // Keep the 30 closest to `at`.
            let pos = picked.partition_point(|e| e.t < at);
            let from = pos.saturating_sub(15).min(picked.len() - 30);
            picked = picked[from..from + 30].to_vec();
        }
        picked.iter().map(|e| e.to_line()).collect()
    }
}

/// Runs C1–C7 on `history`.
pub fn check(history: &History) -> Vec<CheckResult> {
    let index = Index::new(history);
    vec![
        resource::c1(&index),
        resource::c2(&index),
        resource::c3(&index),
        lock::c4(&index),
        lock::c5(&index).0,
        lock::c6(&index),
        lock::c7(&index),
    ]
}

/// Loss-signal latencies (signal − observable, µs; negative when the holder
/// knew first), for the figures.
pub(crate) fn loss_latencies(history: &History) -> Vec<i64> {
    lock::c5(&Index::new(history)).1
}

#[cfg(test)]
mod tests;
