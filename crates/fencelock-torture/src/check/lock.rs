//! C4–C7: what the lock did, from the workers' leases and the observer.

use std::collections::HashMap;

use super::index::{Index, Lease, Obs};
use super::verdict::{CheckResult, SLACK};
use crate::history::Released;

/// The intervals in which `lease` was valid by Redis's replies: from each
/// sample's time to the validity it reported; cut at `void` (a data loss).
pub(super) fn validity(lease: &Lease, void: Option<i64>) -> Vec<(i64, i64)> {
    lease
        .samples
        .iter()
        .map(|&(s, v)| (s, void.map_or(v, |w| v.min(w))))
        .filter(|&(s, v)| s < v)
        .collect()
}

/// Why C4 excuses an overlap across a restart that lost the data.
pub(super) const C4_DATA_LOSS: &str = "a restart without persistence lost the lock server's data: mutual exclusion is not promised across it (docs/design.md §9)";
/// Why C4 excuses an overlap that only a rolled-back renewal explains.
pub(super) const C4_RENEWAL_ROLLBACK: &str = "renewals are not waited for by the replicas (only grants are), so a failover may roll a lease back to its grant: across a failover a lease is promised only as far as its grant's own validity";
/// Why C6 excuses repeated counter fences across a restart.
const C6_DATA_LOSS: &str = "counter fences repeat after a restart that lost the counter (clock fences do not; docs/design.md §9)";
/// Why C6 excuses a lower fence observed after a failover.
const C6_ROLLBACK: &str = "a failover rolled the key back past a grant that never reached every replica (refused for lack of replica acknowledgements and released, or not waited for): the next grant's fence is still higher than every fence a holder was told";
/// Why C6 excuses repeated counter fences across a failover.
const C6_COUNTER_ROLLBACK: &str = "counter fences repeat when a failover loses a grant that was not waited for by every replica (clock fences do not)";
/// Why C7 excuses a key back after a failover.
const C7_ROLLBACK: &str = "a failover rolled back a release or an expiry the promoted replica had not received yet (releases are not waited for): the key is back as it was, not re-created by a renewal";

/// Why C4 excuses an overlap across a failover that may have lost a grant.
pub(super) fn c4_grant_rollback(index: &Index<'_>) -> String {
    let (wait, replicas) = index
        .history
        .header()
        .map_or((0, 0), |h| (h.wait_replicas, h.replicas));
    format!(
        "grants waited for {wait} of {replicas} replica(s): a failover may lose a granted lock, so mutual exclusion is not promised across one (LockOptions::wait_for_replicas with every replica promises it)"
    )
}

/// The intervals in which `lease` is promised valid when failovers may
/// roll back what no grant waited for: from a failover on, nothing if the
/// grants were not waited for by every replica; else every renewal sent
/// before a failover ended counts only as far as the grant's own validity.
pub(super) fn promised(index: &Index<'_>, lease: &Lease, void: Option<i64>) -> Vec<(i64, i64)> {
    let windows: Vec<(i64, i64)> = index
        .rollbacks
        .iter()
        .copied()
        .filter(|&(s, e)| e >= lease.invoked && s <= lease.cs_end())
        .collect();
    if windows.is_empty() {
        return validity(lease, void);
    }
    if !index.grants_replicated {
        let first = windows.iter().map(|w| w.0).min();
        let cut = match (void, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        return validity(lease, cut);
    }
    let granted = lease.samples.first().map_or(i64::MIN, |s| s.1);
    lease
        .samples
        .iter()
        .map(|&(t, v)| {
            // A validity beyond the grant's comes from a renewal sent about
            // a ttl before it ends.
            let renewed = v.saturating_sub(index.ttl_us);
            let v = if v > granted && windows.iter().any(|&(_, e)| renewed <= e) {
                granted
            } else {
                v
            };
            (t, void.map_or(v, |w| v.min(w)))
        })
        .filter(|&(s, v)| s < v)
        .collect()
}

/// The first data loss after `from`, if any.
pub(super) fn first_loss_after(index: &Index<'_>, from: i64) -> Option<i64> {
    index.data_loss.iter().copied().filter(|&w| w >= from).min()
}

/// The earlier of two optional moments.
pub(super) fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The earliest moment in `window` at which both `a` and `b` are valid.
fn both_valid(a: &[(i64, i64)], b: &[(i64, i64)], window: (i64, i64)) -> Option<i64> {
    let mut best: Option<i64> = None;
    for &(a0, a1) in a {
        for &(b0, b1) in b {
            let from = a0.max(b0).max(window.0);
            let to = a1.min(b1).min(window.1);
            if from < to {
                best = Some(best.map_or(from, |x: i64| x.min(from)));
            }
        }
    }
    best
}

/// C4: no two valid holders in their critical sections at once.
pub(super) fn c4(index: &Index<'_>) -> CheckResult {
    let r = CheckResult::new(
        "C4",
        "mutual exclusion among valid holders: no two workers in their critical sections while both leases were unexpired in the lock store (Redis or etcd)",
    );
    exclusion(index, r, |_, _| true)
}

/// A lease in a violation's message: its operation and fence (a
/// read-write lock's: its side, and a reader's epoch).
fn described(index: &Index<'_>, l: &Lease) -> String {
    match (index.rw, l.reader) {
        (false, _) => format!("{} (fence {})", l.op, l.fence),
        (true, true) => format!("reader {} (epoch {})", l.op, l.fence),
        (true, false) => format!("writer {} (fence {})", l.op, l.fence),
    }
}

/// C4's sweep, for the pairs of leases `conflict` says may not be valid
/// in their critical sections at once (C4: every pair; a read-write
/// lock's C10: a writer and a reader).
pub(super) fn exclusion(
    index: &Index<'_>,
    mut r: CheckResult,
    conflict: impl Fn(&Lease, &Lease) -> bool,
) -> CheckResult {
    let mut by_name: HashMap<&str, Vec<&Lease>> = HashMap::new();
    for l in &index.leases {
        by_name.entry(&l.name).or_default().push(l);
    }
    let mut names: Vec<&&str> = by_name.keys().collect();
    names.sort();
    for name in names {
        let leases = &by_name[*name];
        // Sorted by grant time: sweep with the critical sections still open.
        let mut open: Vec<&Lease> = Vec::new();
        for b in leases {
            r.checked += 1;
            open.retain(|a| a.cs_end() > b.granted);
            for a in &open {
                if a.worker == b.worker || !conflict(a, b) {
                    continue;
                }
                let window = (b.granted, a.cs_end().min(b.cs_end()));
                // A revoke ends a lease in the lock store before the
                // validity its holder computed: the holder is deposed
                // (told at its next renewal), the lock passes on, and the
                // revoke's seal refuses the deposed holder's writes at the
                // resource from the revoke on (C1 checks that). So a
                // deposed lease counts as valid only until the revoke was
                // sent; past it, its holder still in its critical section
                // is exactly what a revoke is for, not two valid holders.
                // Like a release, not an excuse: the lock store ended it.
                let (end_a, end_b) = (index.revoked_at(a), index.revoked_at(b));
                let Some(at) = both_valid(&validity(a, end_a), &validity(b, end_b), window) else {
                    continue;
                };
                let void_a = earliest(first_loss_after(index, a.granted), end_a);
                let void_b = earliest(first_loss_after(index, b.granted), end_b);
                if both_valid(&validity(a, void_a), &validity(b, void_b), window).is_none() {
                    r.excuse(C4_DATA_LOSS);
                    continue;
                }
                if both_valid(
                    &promised(index, a, void_a),
                    &promised(index, b, void_b),
                    window,
                )
                .is_none()
                {
                    if index.grants_replicated {
                        r.excuse(C4_RENEWAL_ROLLBACK);
                    } else {
                        r.excuse(&c4_grant_rollback(index));
                    }
                    continue;
                }
                let message = format!(
                    "{name}: {} and {} were both in their critical sections at {:.3} s with unexpired leases",
                    described(index, a),
                    described(index, b),
                    at as f64 / 1e6
                );
                r.violation(index, at, message, &[&a.op, &b.op], name);
            }
            open.push(b);
        }
    }
    r
}

/// Whether observation `o` shows `lease`'s own grant in the key.
fn shows(o: &Obs, lease: &Lease) -> bool {
    o.holder.as_deref() == Some(lease.holder.as_str()) && o.fence.is_none_or(|f| f == lease.fence)
}

/// When `worker` could first see something visible at `t`: after the
/// pause it was in, if any.
fn awake(index: &Index<'_>, worker: &str, t: i64) -> i64 {
    index
        .pauses
        .get(worker)
        .and_then(|ps| ps.iter().find(|&&(s, e)| s <= t && t <= e))
        .map_or(t, |&(_, e)| e)
}

/// C5: loss signals in time. Also returns the latencies (µs).
pub(super) fn c5(index: &Index<'_>) -> (CheckResult, Vec<i64>) {
    let mut r = CheckResult::new(
        "C5",
        "a worker that lost its lease got its loss signal within one renewal interval of the loss being observable",
    );
    let mut latencies = Vec::new();
    let allowed = index
        .renewal_us
        .saturating_add(i64::try_from(SLACK.as_micros()).unwrap_or(0));
    for lease in &index.leases {
        let Some(obs) = index.observed.get(&lease.name) else {
            continue;
        };
        let until = lease.cs_end();
        let from = obs.partition_point(|o| o.sent <= lease.granted);
        let Some(gone) = obs[from..]
            .iter()
            .take_while(|o| o.t < until)
            .find(|o| !shows(o, lease))
        else {
            continue;
        };
        // A pause that never ended (the run was interrupted) ends at
        // i64::MAX: the worker never woke to observe the loss.
        let observable = awake(index, &lease.worker, gone.t);
        if observable == i64::MAX {
            continue;
        }
        r.checked += 1;
        let deadline = observable.saturating_add(allowed);
        let released = lease.release_done.filter(|(_, o)| *o != Released::Released);
        let signal = match (lease.lost, released) {
            (Some(l), Some((rt, _))) => Some(l.min(rt)),
            (Some(l), None) => Some(l),
            (None, Some((rt, _))) => Some(rt),
            (None, None) => None,
        };
        if let Some(s) = signal {
            latencies.push(s.saturating_sub(observable));
        }
        let stopped_in_time =
            lease.release_invoked.is_some_and(|ri| ri <= deadline) && released.is_some();
        let in_time = signal.is_some_and(|s| s <= deadline) || stopped_in_time;
        if in_time {
            continue;
        }
        let what = match (signal, lease.release_done) {
            (Some(s), _) => format!(
                "its loss signal came {:.0} ms after the loss was observable (allowed {:.0} ms)",
                s.saturating_sub(observable) as f64 / 1e3,
                allowed as f64 / 1e3
            ),
            (None, Some((_, Released::Released))) => {
                "its release then reported success: it was never told".to_string()
            }
            (None, _) if index.end < deadline => continue,
            (None, _) => "it never got a loss signal".to_string(),
        };
        let message = format!(
            "{}: the lease of {} (fence {}) was gone from the lock store at {:.3} s; {what}",
            lease.name,
            lease.op,
            lease.fence,
            gone.t as f64 / 1e6
        );
        r.violation(index, deadline, message, &[&lease.op], &lease.name);
    }
    (r, latencies)
}

/// The fence of an observed holder: from the key, else from its grant.
fn fence_of(o: &Obs, grants: &HashMap<&str, u64>) -> Option<u64> {
    o.fence
        .or_else(|| grants.get(o.holder.as_deref()?).copied())
}

/// C6: fences strictly increase in grant order.
pub(super) fn c6(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new("C6", "fences strictly increasing in grant order per name");
    let grants: HashMap<&str, u64> = index
        .leases
        .iter()
        .map(|l| (l.holder.as_str(), l.fence))
        .collect();
    let op_of: HashMap<&str, &str> = index
        .leases
        .iter()
        .map(|l| (l.holder.as_str(), l.op.as_str()))
        .collect();
    // Redis's order, as the observer saw the holders change.
    let mut names: Vec<&String> = index.observed.keys().collect();
    names.sort();
    for name in names {
        let mut prev: Option<(&Obs, u64)> = None;
        for o in &index.observed[name] {
            if o.holder.is_none() {
                continue;
            }
            let Some(f) = fence_of(o, &grants) else {
                continue;
            };
            if let Some((p, pf)) = prev {
                if p.holder == o.holder && pf == f {
                    continue;
                }
                r.checked += 1;
                if f <= pf {
                    // Told *this* fence: an acquisition that retries keeps
                    // its token, so its holder id may have been refused one
                    // fence (and released it) before it was told another.
                    let told = p
                        .holder
                        .as_deref()
                        .and_then(|h| grants.get(h))
                        .is_some_and(|g| *g == pf);
                    if index.counter_mode && index.data_lost_between(p.sent, o.t) {
                        r.excuse(C6_DATA_LOSS);
                    } else if index.rollback_between(p.sent, o.t)
                        && (!told || !index.grants_replicated)
                    {
                        r.excuse(C6_ROLLBACK);
                    } else {
                        let ops: Vec<&str> = [p.holder.as_deref(), o.holder.as_deref()]
                            .into_iter()
                            .flatten()
                            .filter_map(|h| op_of.get(h).copied())
                            .collect();
                        let message = format!(
                            "{name}: the lock store held fence {pf} ({}) and then fence {f} ({}): the later grant has the lower fence",
                            ops.first().copied().unwrap_or("?"),
                            ops.get(1).copied().unwrap_or("?")
                        );
                        r.violation(index, o.t, message, &ops, name);
                    }
                }
            }
            prev = Some((o, f));
        }
    }
    // Real-time order: a grant acknowledged before another was asked for
    // has the lower fence.
    let mut by_name: HashMap<&str, Vec<&Lease>> = HashMap::new();
    for l in &index.leases {
        by_name.entry(&l.name).or_default().push(l);
    }
    for (name, leases) in by_name {
        let mut by_invoke = leases.clone();
        by_invoke.sort_by_key(|l| l.invoked);
        let mut done = 0;
        let mut max: Option<&Lease> = None;
        for b in by_invoke {
            while done < leases.len() && leases[done].granted < b.invoked {
                if max.is_none_or(|m| leases[done].fence > m.fence) {
                    max = Some(leases[done]);
                }
                done += 1;
            }
            r.checked += 1;
            let Some(a) = max else { continue };
            if b.fence > a.fence {
                continue;
            }
            if index.counter_mode && index.data_lost_between(a.granted, b.granted) {
                r.excuse(C6_DATA_LOSS);
                continue;
            }
            if index.counter_mode
                && !index.grants_replicated
                && index.rollback_between(a.granted, b.granted)
            {
                r.excuse(C6_COUNTER_ROLLBACK);
                continue;
            }
            let message = format!(
                "{name}: {} was granted fence {} after {} had been granted fence {}",
                b.op, b.fence, a.op, a.fence
            );
            r.violation(index, b.granted, message, &[&a.op, &b.op], name);
        }
    }
    r
}

/// C7: no key comes back after it ended.
pub(super) fn c7(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C7",
        "no lock key re-created by a renewal after release (no zombie renewals)",
    );
    let released: HashMap<(&str, &str), (i64, &str)> = index
        .leases
        .iter()
        .filter_map(|l| match l.release_done {
            Some((t, Released::Released)) => {
                Some(((l.name.as_str(), l.holder.as_str()), (t, l.op.as_str())))
            }
            _ => None,
        })
        .collect();
    let op_of: HashMap<&str, &str> = index
        .leases
        .iter()
        .map(|l| (l.holder.as_str(), l.op.as_str()))
        .collect();
    let mut names: Vec<&String> = index.observed.keys().collect();
    names.sort();
    for name in names {
        let mut ended: HashMap<(Option<&str>, Option<u64>), i64> = HashMap::new();
        let mut current: Option<(Option<&str>, Option<u64>)> = None;
        for o in &index.observed[name] {
            let value = (o.holder.as_deref(), o.fence);
            if let Some(c) = current
                && c != value
                && c.0.is_some()
            {
                ended.insert(c, o.t);
            }
            current = Some(value);
            let Some(holder) = o.holder.as_deref() else {
                continue;
            };
            r.checked += 1;
            let op = op_of.get(holder).copied().unwrap_or("?");
            if let Some(&gone) = ended.get(&value)
                && index.rollback_between(gone, o.t)
            {
                r.excuse(C7_ROLLBACK);
                ended.remove(&value);
            } else if let Some(&gone) = ended.get(&value) {
                let message = format!(
                    "{name}: the lock of {op} was gone from the lock store at {:.3} s and was back at {:.3} s (re-created)",
                    gone as f64 / 1e6,
                    o.t as f64 / 1e6
                );
                r.violation(index, o.t, message, &[op], name);
                ended.remove(&value);
            } else if let Some(&(t, _)) = released.get(&(name.as_str(), holder))
                && o.sent > t
                && index.rollback_between(t, o.t)
            {
                r.excuse(C7_ROLLBACK);
            } else if let Some(&(t, rop)) = released.get(&(name.as_str(), holder))
                && o.sent > t
            {
                let message = format!(
                    "{name}: the lock of {rop} was in the lock store at {:.3} s, after its release at {:.3} s (a zombie renewal)",
                    o.t as f64 / 1e6,
                    t as f64 / 1e6
                );
                r.violation(index, o.t, message, &[rop], name);
            }
        }
    }
    r
}
