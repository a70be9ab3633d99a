//! The history, indexed for the checkers: every lease cycle, observation,
//! audited write and nemesis window of a [`History`], found by name or
//! operation.
//!
//! Below `check` and its checkers (`lock`, `resource`) alike: `check`
//! builds the index, the checkers read it, and neither imports the other
//! for it.

use std::collections::HashMap;

use crate::history::{Entry, Event, History, Outcome, Released};

/// One lease cycle of a worker, as the history tells it.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) op: String,
    pub(crate) worker: String,
    pub(crate) name: String,
    pub(crate) fence: u64,
    pub(crate) holder: String,
    /// A read-write lock's reader (its `fence` is its write epoch).
    pub(crate) reader: bool,
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

/// An accepted write in the audit, or a revoke's seal.
#[derive(Debug, Clone)]
pub(crate) struct AuditRow {
    pub(crate) seq: u64,
    /// A seal: the holder is [`fencelock::REVOKED_HOLDER`], which no
    /// holder id equals; its value is unchanged.
    pub(crate) seal: bool,
    pub(crate) op: String,
    pub(crate) fence: u64,
    pub(crate) holder: String,
    pub(crate) read: i64,
    pub(crate) before: i64,
    pub(crate) after: i64,
}

/// A revoke that returned: from `t` on, no write with a fence up to
/// `fence` may be accepted (if it `holds`).
#[derive(Debug, Clone)]
pub(crate) struct RevokeRec {
    pub(crate) t: i64,
    pub(crate) sent: i64,
    pub(crate) name: String,
    pub(crate) fence: Option<u64>,
    pub(crate) deposed: Option<String>,
    /// Whether the revoke returned without an error: it then promises
    /// that the deposed holder's writes are refused from `t` on.
    pub(crate) holds: bool,
    /// Whether it sealed the resource (its seal accepted by `t`).
    pub(crate) sealed: bool,
}

/// A read-write lock reader's validated read.
#[derive(Debug, Clone)]
pub(crate) struct ReadRec {
    pub(crate) op: String,
    /// When it returned.
    pub(crate) t: i64,
    /// When it was sent.
    pub(crate) sent: i64,
    pub(crate) epoch: u64,
    pub(crate) value: i64,
    /// The stored fence it read, if any.
    pub(crate) fence: Option<u64>,
    /// Whether the reader reported it clean.
    pub(crate) clean: bool,
    /// The reader's lease validity when it was sent.
    pub(crate) valid_until: i64,
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
    /// A read-write lock's validated reads, in time order.
    pub(crate) reads: Vec<ReadRec>,
    /// Whether this is a read-write lock's history: a revoke deposes every
    /// holder of its name (the writer or all readers), not only the one it
    /// names.
    pub(crate) rw: bool,
    /// The revokes, in time order.
    pub(crate) revokes: Vec<RevokeRec>,
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
        let mut revokes: Vec<RevokeRec> = Vec::new();
        let mut reads: Vec<ReadRec> = Vec::new();
        // The revoke nemesis pauses workers too: from its start, the holder
        // until the revoke returned, the others until its end.
        let mut revoke_start: Option<i64> = None;
        let mut revoke_paused: Vec<String> = Vec::new();
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
                    access,
                    ..
                } => {
                    by_op.insert(op.clone(), leases.len());
                    leases.push(Lease {
                        op: op.clone(),
                        worker: ev.p.clone(),
                        name: name.clone(),
                        fence: *fence,
                        holder: holder.clone(),
                        reader: access.as_deref() == Some("read"),
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
                Entry::ValidatedRead {
                    op,
                    epoch,
                    sent,
                    value,
                    fence,
                    clean,
                    valid_until,
                } => {
                    if let Some(&i) = by_op.get(op) {
                        leases[i].samples.push((*sent, *valid_until));
                    }
                    reads.push(ReadRec {
                        op: op.clone(),
                        t: ev.t,
                        sent: *sent,
                        epoch: *epoch,
                        value: *value,
                        fence: *fence,
                        clean: *clean,
                        valid_until: *valid_until,
                    });
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
                    ..
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
                    seal: holder == fencelock::REVOKED_HOLDER,
                    op: op.clone(),
                    fence: *fence,
                    holder: holder.clone(),
                    read: *read,
                    before: *before,
                    after: *after,
                }),
                Entry::Revoke {
                    name,
                    sent,
                    fence,
                    deposed,
                    worker,
                    paused,
                    error,
                    sealed,
                    ..
                } => {
                    revokes.push(RevokeRec {
                        t: ev.t,
                        sent: *sent,
                        name: name.clone(),
                        fence: *fence,
                        deposed: deposed.clone(),
                        holds: error.is_none() && fence.is_some(),
                        sealed: *sealed == Some(Outcome::Accepted),
                    });
                    let start = revoke_start.unwrap_or(*sent);
                    if let Some(w) = worker {
                        pauses.entry(w.clone()).or_default().push((start, ev.t));
                    }
                    revoke_paused.clone_from(paused);
                }
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
                    if kind == "revoke" {
                        revoke_start = Some(ev.t);
                        revoke_paused.clear();
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
                    if kind == "revoke"
                        && let Some(start) = revoke_start.take()
                    {
                        for w in revoke_paused.drain(..) {
                            pauses.entry(w).or_default().push((start, ev.t));
                        }
                    }
                }
                _ => {}
            }
        }
        for (w, start) in open_pauses {
            pauses.entry(w).or_default().push((start, i64::MAX));
        }
        if let Some(start) = revoke_start {
            for w in revoke_paused {
                pauses.entry(w).or_default().push((start, i64::MAX));
            }
        }
        for ps in pauses.values_mut() {
            ps.sort_unstable();
        }
        revokes.sort_by_key(|r| r.t);
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
            reads,
            rw: header.is_some_and(|h| h.rwlock_reads.is_some()),
            revokes,
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

    /// When a revoke took `lease` from the lock store: the sending of the
    /// first revoke that deposed its holder (the lock can have been gone
    /// from then on).
    ///
    /// A read-write lock's revoke deposes every holder of its name (the
    /// writer or all readers) while naming one: there, the first revoke of
    /// the lease's name that returned without an error after the lease was
    /// asked for and was sent before its critical section ended (one whose
    /// grant may have come after the revoke is then not counted valid
    /// beyond the revoke either, which only asks less of it).
    pub(crate) fn revoked_at(&self, lease: &Lease) -> Option<i64> {
        if self.rw {
            return self
                .revokes
                .iter()
                .filter(|r| {
                    r.name == lease.name
                        && r.holds
                        && r.t >= lease.invoked
                        && r.sent <= lease.cs_end()
                })
                .map(|r| r.sent)
                .min();
        }
        self.revokes
            .iter()
            .filter(|r| r.name == lease.name && r.deposed.as_deref() == Some(lease.holder.as_str()))
            .map(|r| r.sent)
            .min()
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
                Entry::Observed { name: n, .. } | Entry::ObservedHolders { name: n, .. } => {
                    n == name && e.t >= at - window && e.t <= at + window / 2
                }
                Entry::Revoke { name: n, .. } => n == name && e.t >= at - window && e.t <= at,
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
