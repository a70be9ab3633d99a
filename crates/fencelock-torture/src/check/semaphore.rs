//! The checkers of a semaphore run (`--primitive semaphore --permits N`,
//! the header's `permits`).
//!
//! Each slot of a semaphore is a lock of its own with a resource of its
//! own: its holders one at a time, its fences from the name's one counter,
//! its partition of the resource fenced by its own (fence, holder) pair. So
//! C1–C7 are the mutex's checkers, unchanged, run on the history
//! partitioned by slot ([`by_slot`]: every grant, observation, audit entry
//! and final state of slot S of name T becomes one of the name `T[slot S]`).
//! Per slot, C4 is "one valid holder per slot" and C1–C3 the resource's
//! rules for that slot's partition.
//!
//! Two rules hold across the slots of a name, on the whole history:
//!
//! | id | rule | evidence |
//! |---|---|---|
//! | C8 | never more than N valid holders at once per name | the workers' critical sections and lease validity, as C4 computes them |
//! | C9 | no valid permit refused: a registration or write is refused as stale only once its permit may have ended | the workers' invocations (validity when sent) and their refusals |
//!
//! C8 excuses what C4 does (a restart that lost the data, a failover's
//! rollback); C9 excuses a refusal after a restart that lost the data (a
//! slot granted again while its old holder still counted its lease; in
//! counter mode every fence re-issued below the resource's) and one across
//! a failover window.

use std::collections::HashMap;

use super::index::{Index, Lease};
use super::lock::{
    self, C4_DATA_LOSS, C4_RENEWAL_ROLLBACK, c4_grant_rollback, earliest, first_loss_after,
    promised, validity,
};
use super::resource;
use super::verdict::CheckResult;
use crate::history::{Entry, Event, History, Outcome};

/// The name slot `slot` of `name` has in the partitioned history.
pub(crate) fn slot_name(name: &str, slot: u32) -> String {
    format!("{name}[slot {slot}]")
}

/// `history` with every slot as a name of its own: the grants,
/// observations, audit entries and final states that carry a slot are
/// renamed [`slot_name`]; everything else is kept as it is (an operation's
/// other events find their grant by the operation).
pub(crate) fn by_slot(history: &History) -> History {
    let events = history
        .events
        .iter()
        .map(|ev| {
            let mut ev = ev.clone();
            match &mut ev.e {
                Entry::Granted {
                    name,
                    slot: Some(s),
                    ..
                }
                | Entry::Observed {
                    name,
                    slot: Some(s),
                    ..
                }
                | Entry::Audit {
                    name,
                    slot: Some(s),
                    ..
                }
                | Entry::Final {
                    name,
                    slot: Some(s),
                    ..
                } => *name = slot_name(name, *s),
                _ => {}
            }
            ev
        })
        .collect();
    // Already in time order: kept as it is.
    History { events }
}

/// C1–C9 of a semaphore run with `permits` permits.
pub(super) fn check(history: &History, permits: u32) -> Vec<CheckResult> {
    let slotted = by_slot(history);
    let per_slot = Index::new(&slotted);
    let whole = Index::new(history);
    let mut out = vec![
        resource::c1(&per_slot),
        resource::c2(&per_slot),
        resource::c3(&per_slot),
        lock::c4(&per_slot),
        lock::c5(&per_slot).0,
        lock::c6(&per_slot),
        lock::c7(&per_slot),
    ];
    for r in &mut out {
        r.rule = per_slot_rule(r.id).unwrap_or(r.rule);
    }
    out.push(c8(&whole, permits));
    out.push(c9(&whole));
    out
}

/// Loss-signal latencies of a semaphore run (C5 per slot).
pub(super) fn loss_latencies(history: &History) -> Vec<i64> {
    let slotted = by_slot(history);
    lock::c5(&Index::new(&slotted)).1
}

/// The rule of C1–C7 as they read per slot.
fn per_slot_rule(id: &str) -> Option<&'static str> {
    Some(match id {
        "C1" => {
            "per slot: no write accepted in a slot with a fence lower than one already accepted in that slot"
        }
        "C2" => "per slot: no two different holders accepted in one slot with the same fence",
        "C3" => {
            "per slot: no acknowledged write lost: every acknowledged increment is in its slot's final counter"
        }
        "C4" => {
            "per slot: one valid holder per slot: no two workers in their critical sections in one slot while both permits were unexpired in the store"
        }
        "C5" => {
            "per slot: a worker that lost its permit got its loss signal within one renewal interval of the loss being observable"
        }
        "C6" => "per slot: fences strictly increasing in grant order in each slot",
        "C7" => "per slot: no slot re-created by a renewal after release (no zombie renewals)",
        _ => return None,
    })
}

/// A lease's intervals of validity within its critical section, merged.
fn in_section(lease: &Lease, intervals: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    let (from, to) = (lease.granted, lease.cs_end());
    let mut cut: Vec<(i64, i64)> = intervals
        .into_iter()
        .map(|(s, e)| (s.max(from), e.min(to)))
        .filter(|(s, e)| s < e)
        .collect();
    cut.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (s, e) in cut {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// One moment more than the permits were valid at once: when it began,
/// and the operations valid then.
#[derive(Debug, Clone)]
struct Excess {
    at: i64,
    ops: Vec<String>,
}

/// Every moment at which the count of valid holders in `leases` (each
/// valid over `valid(lease)`) rises above `permits`.
fn excesses(
    leases: &[&Lease],
    permits: u32,
    valid: impl Fn(&Lease) -> Vec<(i64, i64)>,
) -> Vec<Excess> {
    // (time, +1 start / -1 end, lease); ends first at equal times.
    let mut edges: Vec<(i64, i32, usize)> = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        for (s, e) in in_section(lease, valid(lease)) {
            edges.push((s, 1, i));
            edges.push((e, -1, i));
        }
    }
    edges.sort_unstable();
    let mut open: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    for (t, delta, i) in edges {
        if delta < 0 {
            open.retain(|&j| j != i);
            continue;
        }
        open.push(i);
        if open.len() == permits as usize + 1 {
            out.push(Excess {
                at: t,
                ops: open.iter().map(|&j| leases[j].op.clone()).collect(),
            });
        }
    }
    out
}

/// C8: never more than `permits` valid holders of one name at once.
pub(super) fn c8(index: &Index<'_>, permits: u32) -> CheckResult {
    let mut r = CheckResult::new(
        "C8",
        "never more valid holders than permits: at most N workers in their critical sections at once per name while their permits were unexpired in the store",
    );
    let mut by_name: HashMap<&str, Vec<&Lease>> = HashMap::new();
    for l in &index.leases {
        by_name.entry(&l.name).or_default().push(l);
    }
    let mut names: Vec<&&str> = by_name.keys().collect();
    names.sort();
    for name in names {
        let leases = &by_name[*name];
        r.checked += leases.len() as u64;
        let plain = excesses(leases, permits, |l| validity(l, index.revoked_at(l)));
        if plain.is_empty() {
            continue;
        }
        // As C4: a lease counts valid only until a restart lost the data,
        // and across a failover only as far as what survives promises.
        let void = |l: &Lease| earliest(first_loss_after(index, l.granted), index.revoked_at(l));
        let after_loss = excesses(leases, permits, |l| validity(l, void(l)));
        let strict = excesses(leases, permits, |l| promised(index, l, void(l)));
        for _ in strict.len()..after_loss.len() {
            if index.grants_replicated {
                r.excuse(C4_RENEWAL_ROLLBACK);
            } else {
                r.excuse(&c4_grant_rollback(index));
            }
        }
        for _ in after_loss.len()..plain.len() {
            r.excuse(C4_DATA_LOSS);
        }
        for e in strict {
            let ops: Vec<&str> = e.ops.iter().map(String::as_str).collect();
            let message = format!(
                "{name}: {} holders with unexpired permits were in their critical sections at {:.3} s, more than the {permits} permit(s): {}",
                ops.len(),
                e.at as f64 / 1e6,
                ops.join(", ")
            );
            r.violation(index, e.at, message, &ops, name);
        }
    }
    r
}

/// Why C9 excuses a refusal after a restart that lost the data.
const C9_DATA_LOSS: &str = "a restart without persistence lost the lock server's data: a slot can be granted again while its old holder still counts its permit (and counter fences repeat below the resource's), so a valid permit's refusal is not promised against across it (docs/design.md §9)";
/// Why C9 excuses a refusal across a failover.
const C9_ROLLBACK: &str = "a failover may roll back a permit's renewal (or its grant, when grants are not waited for by every replica), so its slot can be granted again while its holder still counts it";

/// C9: a valid permit is never refused. A registration or write refused
/// as stale although the permit was still valid, by its holder's own lower
/// bound, when the refusal came back: only another holder's fence at the
/// same (fence, holder) pair refuses it, and one of the same slot is
/// granted only once the permit ended.
pub(super) fn c9(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C9",
        "no valid permit refused: no registration or write refused as stale while its permit was still unexpired",
    );
    let lease_of: HashMap<&str, &Lease> = index.leases.iter().map(|l| (l.op.as_str(), l)).collect();
    // op -> (sent, valid until), for registrations and writes apart.
    let mut sent: [HashMap<&str, (i64, i64)>; 2] = [HashMap::new(), HashMap::new()];
    for ev in &index.history.events {
        match &ev.e {
            Entry::Register {
                op, valid_until, ..
            } => {
                sent[0].insert(op, (ev.t, *valid_until));
            }
            Entry::Write {
                op, valid_until, ..
            } => {
                sent[1].insert(op, (ev.t, *valid_until));
            }
            Entry::Registered { op, outcome } => {
                refused(
                    index,
                    &mut r,
                    ev,
                    op,
                    *outcome,
                    sent[0].get(op.as_str()),
                    &lease_of,
                    "registration",
                );
            }
            Entry::Written { op, outcome } => {
                refused(
                    index,
                    &mut r,
                    ev,
                    op,
                    *outcome,
                    sent[1].get(op.as_str()),
                    &lease_of,
                    "write",
                );
            }
            _ => {}
        }
    }
    r
}

/// C9 for one outcome `ev` of `op`'s registration or write.
#[allow(clippy::too_many_arguments)]
fn refused(
    index: &Index<'_>,
    r: &mut CheckResult,
    ev: &Event,
    op: &str,
    outcome: Outcome,
    sent: Option<&(i64, i64)>,
    lease_of: &HashMap<&str, &Lease>,
    what: &str,
) {
    let (Some(&(at, valid_until)), Some(lease)) = (sent, lease_of.get(op)) else {
        return;
    };
    r.checked += 1;
    if outcome != Outcome::Stale || ev.t >= valid_until {
        return;
    }
    // A revoke ended the lease in the lock store (a semaphore run has no
    // revokes; as in C4, not an excuse).
    if index.revoked_at(lease).is_some_and(|t| t <= ev.t) {
        return;
    }
    let lost = if index.counter_mode {
        index.data_loss.iter().any(|&w| w <= ev.t)
    } else {
        index.data_lost_between(lease.granted, ev.t)
    };
    if lost {
        r.excuse(C9_DATA_LOSS);
        return;
    }
    if index.rollback_between(lease.invoked, ev.t) {
        r.excuse(C9_ROLLBACK);
        return;
    }
    let message = format!(
        "{}: the {what} of {op} (fence {}) was refused as stale at {:.3} s (sent at {:.3} s) while its permit was valid until {:.3} s: a live permit refused",
        lease.name,
        lease.fence,
        ev.t as f64 / 1e6,
        at as f64 / 1e6,
        valid_until as f64 / 1e6
    );
    r.violation(index, ev.t, message, &[op], &lease.name);
}
