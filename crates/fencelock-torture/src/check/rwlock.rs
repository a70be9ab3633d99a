//! The checkers of a read-write lock run (`--primitive rwlock`, the
//! header's `rwlock_reads`).
//!
//! Writers are a mutex's holders: their audited writes are judged by C1–C3
//! as a mutex's, and among the writers alone C4 (no two valid writers at
//! once) and C6 (fences strictly increasing in grant order; the observer's
//! order of writers, [`writers_only`]). Every holder, reader or writer, is
//! followed apart for C5 (loss signals) and C7 (no holder back after it
//! ended): [`by_holder`] turns the observer's sets of holders into one
//! stream per holder. Across the two sides:
//!
//! | id | rule | evidence |
//! |---|---|---|
//! | C10 | no writer in its critical section while a reader was in its own, both leases unexpired in the store | the workers' critical sections and lease validity, as C4 computes them |
//! | C11 | a validated read never reports a torn write as clean, and a read made while its lease was unexpired is clean | the readers' reads, the resource's audit in its order, the acknowledged writes and the revokes' seals |
//! | C12 | a reader's epoch is at least every writer's fence granted before the reader asked, and below every writer's fence asked for after the reader was granted | the grants in real-time order |
//!
//! C11 reads the audit as the resource's own order: the counter a reader
//! read was written by the accepted write whose `after` it is (the counter
//! only grows by one per accepted write, C3), so every audit entry up to
//! that one — writes and seals — had been applied when the read saw it. A
//! read reported clean must have seen a stored fence at most its epoch,
//! none of those entries may carry a fence above its epoch, and no write
//! acknowledged (or seal returned) before the read was sent may either. A
//! read that came back before its lease's validity ran out must be clean:
//! a fence above the epoch comes from a writer granted after the reader,
//! while the reader's lease was unexpired (excused as C4 excuses overlaps:
//! across a restart that lost the data or a failover; a revoke ends the
//! lease, as for C4).

use std::collections::{BTreeMap, HashMap};

use super::index::{Index, Lease, ReadRec};
use super::lock;
use super::resource;
use super::verdict::CheckResult;
use crate::history::{Entry, Event, History, Holding, Outcome};

/// The name a holder's stream has in [`by_holder`].
pub(crate) fn holder_name(name: &str, holder: &str) -> String {
    format!("{name}[{holder}]")
}

/// Whether a holding the observer recorded is a writer's (a plain holder,
/// where the store showed one, counts as one).
fn writes(h: &Holding) -> bool {
    h.access.as_deref() != Some("read")
}

/// `history` with the observer's sets of holders turned into `observed`
/// events, one stream per name for `pick`'s holder of each set (none:
/// absent), only where it changes.
fn observed_as(history: &History, pick: impl Fn(&[Holding]) -> Option<&Holding>) -> Vec<Event> {
    let mut last: HashMap<&str, Option<(String, Option<u64>)>> = HashMap::new();
    let mut out = Vec::new();
    for ev in &history.events {
        let Entry::ObservedHolders {
            name,
            holders,
            sent,
        } = &ev.e
        else {
            continue;
        };
        let now = pick(holders).map(|h| (h.holder.clone(), h.fence));
        if last.get(name.as_str()) == Some(&now) {
            continue;
        }
        last.insert(name, now.clone());
        out.push(Event {
            t: ev.t,
            p: ev.p.clone(),
            e: Entry::Observed {
                name: name.clone(),
                holder: now.as_ref().map(|n| n.0.clone()),
                fence: now.and_then(|n| n.1),
                sent: *sent,
                slot: None,
            },
        });
    }
    out
}

/// The writers' history: every grant of a reader (and its reads) left
/// out, and the observer's sets of holders as the writer alone (as a
/// mutex's key).
pub(crate) fn writers_only(history: &History) -> History {
    let readers: std::collections::HashSet<&str> = history
        .events
        .iter()
        .filter_map(|ev| match &ev.e {
            Entry::Granted { op, access, .. } if access.as_deref() == Some("read") => {
                Some(op.as_str())
            }
            _ => None,
        })
        .collect();
    let mut events: Vec<Event> = history
        .events
        .iter()
        .filter(|ev| {
            !matches!(ev.e, Entry::ObservedHolders { .. })
                && ev.op().is_none_or(|op| !readers.contains(op))
        })
        .cloned()
        .collect();
    events.extend(observed_as(history, |hs| hs.iter().find(|h| writes(h))));
    History::new(events)
}

/// `history` with every holder as a lock of its own: each grant renamed
/// [`holder_name`] of its holder, and the observer's sets of holders
/// turned into `observed` events of each holder's stream (the holder with
/// its fence when it appears, absent when it is gone).
pub(crate) fn by_holder(history: &History) -> History {
    let mut events = Vec::with_capacity(history.events.len());
    let mut last: HashMap<&str, BTreeMap<&str, Option<u64>>> = HashMap::new();
    for ev in &history.events {
        match &ev.e {
            Entry::Granted { name, holder, .. } => {
                let mut ev = ev.clone();
                if let Entry::Granted { name: n, .. } = &mut ev.e {
                    *n = holder_name(name, holder);
                }
                events.push(ev);
            }
            Entry::ObservedHolders {
                name,
                holders,
                sent,
            } => {
                let now: BTreeMap<&str, Option<u64>> = holders
                    .iter()
                    .map(|h| (h.holder.as_str(), h.fence))
                    .collect();
                let before = last.remove(name.as_str()).unwrap_or_default();
                let observed = |holder: &str, seen: Option<Option<u64>>| Event {
                    t: ev.t,
                    p: ev.p.clone(),
                    e: Entry::Observed {
                        name: holder_name(name, holder),
                        holder: seen.map(|_| holder.to_string()),
                        fence: seen.flatten(),
                        sent: *sent,
                        slot: None,
                    },
                };
                for (holder, fence) in &before {
                    match now.get(holder) {
                        None => events.push(observed(holder, None)),
                        Some(f) if f != fence => events.push(observed(holder, Some(*f))),
                        Some(_) => {}
                    }
                }
                for (holder, fence) in &now {
                    if !before.contains_key(holder) {
                        events.push(observed(holder, Some(*fence)));
                    }
                }
                last.insert(name, now);
            }
            _ => events.push(ev.clone()),
        }
    }
    // Already in time order: kept as it is.
    History { events }
}

/// C1–C7 of the writers and holders, C10–C12 of a read-write lock run.
pub(super) fn check(history: &History) -> Vec<CheckResult> {
    let whole = Index::new(history);
    let writers = writers_only(history);
    let writers = Index::new(&writers);
    let holders = by_holder(history);
    let holders = Index::new(&holders);
    let mut out = vec![
        resource::c1(&whole),
        resource::c2(&whole),
        resource::c3(&whole),
        lock::c4(&writers),
        lock::c5(&holders).0,
        lock::c6(&writers),
        lock::c7(&holders),
    ];
    for r in &mut out {
        r.rule = rule(r.id).unwrap_or(r.rule);
    }
    out.push(c10(&whole));
    out.push(c11(&whole));
    out.push(c12(&whole));
    out
}

/// Loss-signal latencies of a read-write lock run (C5 per holder).
pub(super) fn loss_latencies(history: &History) -> Vec<i64> {
    let holders = by_holder(history);
    lock::c5(&Index::new(&holders)).1
}

/// The rules of C1–C7 as they read on a read-write lock.
fn rule(id: &str) -> Option<&'static str> {
    Some(match id {
        "C1" => {
            "writers: no write accepted with a fence lower than an already accepted one (a revoke's seal included), nor at or below a revocation fence after its revoke returned"
        }
        "C2" => "writers: no two different holders accepted with the same fence",
        "C3" => {
            "writers: no acknowledged write lost: every acknowledged increment is in the final counter"
        }
        "C4" => {
            "writers: no two writers in their critical sections while both leases were unexpired in the store"
        }
        "C5" => {
            "per holder (reader or writer): a lost lease is signalled within one renewal interval of the loss being observable"
        }
        "C6" => "writers: fences strictly increasing in grant order per name",
        "C7" => "per holder (reader or writer): no holder back in the store after it ended",
        _ => return None,
    })
}

/// C10: no writer with a valid reader.
pub(super) fn c10(index: &Index<'_>) -> CheckResult {
    let r = CheckResult::new(
        "C10",
        "no writer in its critical section while a reader was in its own, both leases unexpired in the store",
    );
    lock::exclusion(index, r, |a, b| a.reader != b.reader)
}

/// Why C11 excuses a torn read while its lease was valid after a data loss.
const C11_DATA_LOSS: &str = "a restart without persistence lost the lock server's data: a writer can be granted while a reader still counts its lease (docs/design.md §9), so its read may be torn while the lease is unexpired";
/// Why C11 excuses a torn read while its lease was valid across a failover.
const C11_ROLLBACK: &str = "a failover may roll back a reader's renewal (or its grant, when grants are not waited for by every replica), so a writer can be granted while the reader still counts its lease";

/// One name's resource, for C11: the first audit entry that wrote each
/// counter value, the greatest fence up to each entry (seals included),
/// and the acknowledged writes by the time they were acknowledged.
struct Applied<'a> {
    /// counter value → position in `max_fence` of the first accepted write
    /// that wrote it.
    wrote: HashMap<i64, usize>,
    /// Per audit entry in order: (fence, op, audit seq) of the entry with
    /// the greatest fence up to and including it (seals included).
    max_fence: Vec<(u64, &'a str, u64)>,
    /// Every write acknowledged and every seal returned, by time: (when,
    /// fence, op) of the one with the greatest fence so far.
    acked: Vec<(i64, u64, &'a str)>,
}

impl<'a> Applied<'a> {
    fn of(index: &'a Index<'_>, name: &str, fences: &HashMap<&str, u64>) -> Self {
        let rows = index.audit.get(name).map_or(&[][..], Vec::as_slice);
        let mut wrote = HashMap::new();
        let mut max_fence = Vec::with_capacity(rows.len());
        let mut best: Option<(u64, &str, u64)> = None;
        for (i, row) in rows.iter().enumerate() {
            if !row.seal {
                wrote.entry(row.after).or_insert(i);
            }
            if best.is_none_or(|b| row.fence > b.0) {
                best = Some((row.fence, row.op.as_str(), row.seq));
            }
            max_fence.extend(best);
        }
        let mut acked: Vec<(i64, u64, &str)> = index
            .writes
            .iter()
            .filter(|(_, w)| w.name == name)
            .filter_map(|(op, w)| match w.done {
                Some((t, Outcome::Accepted)) => Some((t, *fences.get(op.as_str())?, op.as_str())),
                _ => None,
            })
            .chain(
                index
                    .revokes
                    .iter()
                    .filter(|r| r.name == name && r.sealed)
                    .filter_map(|r| Some((r.t, r.fence?, "a revoke's seal"))),
            )
            .collect();
        acked.sort_by_key(|a| a.0);
        let mut top: Option<(i64, u64, &str)> = None;
        for a in &mut acked {
            if top.is_none_or(|t| a.1 > t.1) {
                top = Some(*a);
            }
            if let Some(t) = top {
                *a = (a.0, t.1, t.2);
            }
        }
        Applied {
            wrote,
            max_fence,
            acked,
        }
    }

    /// The audit entry with the greatest fence among those applied before
    /// a read saw `value` (none: the value is the initial one, or was
    /// never written).
    fn before_value(&self, value: i64) -> Option<(u64, &'a str, u64)> {
        self.wrote.get(&value).map(|&i| self.max_fence[i])
    }

    /// The greatest fence acknowledged (or sealed) before `t`, with its op.
    fn acked_before(&self, t: i64) -> Option<(u64, &'a str)> {
        let n = self.acked.partition_point(|a| a.0 < t);
        n.checked_sub(1).map(|i| (self.acked[i].1, self.acked[i].2))
    }
}

/// C11: validated reads.
pub(super) fn c11(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C11",
        "a validated read never reports a torn write as clean (stored fence at most its epoch, no accepted write or seal with a greater fence applied before the value it read), and a read made while its lease was unexpired is clean",
    );
    let lease_of: HashMap<&str, &Lease> = index.leases.iter().map(|l| (l.op.as_str(), l)).collect();
    let fences: HashMap<&str, u64> = index
        .leases
        .iter()
        .map(|l| (l.op.as_str(), l.fence))
        .collect();
    let mut applied: HashMap<&str, Applied<'_>> = HashMap::new();
    for read in &index.reads {
        let Some(lease) = lease_of.get(read.op.as_str()) else {
            continue;
        };
        r.checked += 1;
        let name = lease.name.as_str();
        let applied = applied
            .entry(name)
            .or_insert_with(|| Applied::of(index, name, &fences));
        if read.clean {
            clean_read(index, &mut r, read, lease, applied);
        } else {
            torn_while_valid(index, &mut r, read, lease);
        }
    }
    r
}

/// C11 for a read reported clean: what it saw must be as of its epoch.
fn clean_read(
    index: &Index<'_>,
    r: &mut CheckResult,
    read: &ReadRec,
    lease: &Lease,
    applied: &Applied<'_>,
) {
    let name = lease.name.as_str();
    let head = format!(
        "{name}: reader {} (epoch {}) reported its read of {} clean at {:.3} s",
        read.op,
        read.epoch,
        read.value,
        read.t as f64 / 1e6
    );
    if let Some(f) = read.fence.filter(|f| *f > read.epoch) {
        let message = format!("{head}, but the fence stored with it was {f}: a torn read");
        r.violation(index, read.t, message, &[&read.op], name);
        return;
    }
    if let Some((f, op, seq)) = applied.before_value(read.value)
        && f > read.epoch
    {
        let message = format!(
            "{head}, but that value came after the write of {op} with fence {f} (audit #{seq}), above its epoch: a torn read reported clean"
        );
        r.violation(index, read.t, message, &[&read.op, op], name);
        return;
    }
    if let Some((f, op)) = applied.acked_before(read.sent)
        && f > read.epoch
    {
        let message = format!(
            "{head}, but {op} with fence {f}, above its epoch, had been acknowledged before the read was sent: a torn read reported clean"
        );
        r.violation(index, read.t, message, &[&read.op, op], name);
    }
}

/// C11 for a torn read: not while its lease was unexpired.
fn torn_while_valid(index: &Index<'_>, r: &mut CheckResult, read: &ReadRec, lease: &Lease) {
    if read.t >= read.valid_until {
        return;
    }
    // A revoke ended the lease in the store (its seal tears the read).
    if index.revoked_at(lease).is_some_and(|t| t <= read.t) {
        return;
    }
    if index.data_lost_between(lease.granted, read.t) {
        r.excuse(C11_DATA_LOSS);
        return;
    }
    if index.rollback_between(lease.invoked, read.t) {
        r.excuse(C11_ROLLBACK);
        return;
    }
    let message = format!(
        "{}: reader {} (epoch {}) read a fence of {} at {:.3} s while its lease was valid until {:.3} s: a writer granted after it came in while it held",
        lease.name,
        read.op,
        read.epoch,
        read.fence.map_or("?".to_string(), |f| f.to_string()),
        read.t as f64 / 1e6,
        read.valid_until as f64 / 1e6
    );
    r.violation(index, read.t, message, &[&read.op], &lease.name);
}

/// Why C12 excuses an epoch out of order after a restart that lost the
/// counter.
const C12_DATA_LOSS: &str = "counter fences repeat after a restart that lost the counter (clock fences do not; docs/design.md §9), and so do the epochs read from it";
/// Why C12 excuses an epoch out of order across a failover.
const C12_COUNTER_ROLLBACK: &str = "counter fences repeat when a failover loses a grant that was not waited for by every replica (clock fences do not), and so do the epochs read from it";

/// Whether C12 excuses grants `a` then `b` out of order.
fn c12_excuse(index: &Index<'_>, r: &mut CheckResult, a: &Lease, b: &Lease) -> bool {
    if index.counter_mode && index.data_lost_between(a.granted, b.granted) {
        r.excuse(C12_DATA_LOSS);
        return true;
    }
    if index.counter_mode
        && !index.grants_replicated
        && index.rollback_between(a.granted, b.granted)
    {
        r.excuse(C12_COUNTER_ROLLBACK);
        return true;
    }
    false
}

/// C12: the readers' epochs against the writers' fences, in real-time
/// order.
pub(super) fn c12(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C12",
        "a reader's epoch is at least the fence of every writer granted before the reader asked, and below the fence of every writer that asked after the reader was granted",
    );
    let mut by_name: HashMap<&str, (Vec<&Lease>, Vec<&Lease>)> = HashMap::new();
    for l in &index.leases {
        let sides = by_name.entry(&l.name).or_default();
        if l.reader {
            sides.0.push(l);
        } else {
            sides.1.push(l);
        }
    }
    let mut names: Vec<&&str> = by_name.keys().collect();
    names.sort();
    for name in names {
        let (readers, writers) = &by_name[*name];
        // Both sorted by grant time (the index's order).
        let mut by_invoke: Vec<&Lease> = readers.clone();
        by_invoke.sort_by_key(|l| l.invoked);
        let mut done = 0;
        let mut top: Option<&Lease> = None;
        for reader in &by_invoke {
            while done < writers.len() && writers[done].granted < reader.invoked {
                if top.is_none_or(|t| writers[done].fence > t.fence) {
                    top = Some(writers[done]);
                }
                done += 1;
            }
            r.checked += 1;
            let Some(w) = top else { continue };
            if reader.fence >= w.fence || c12_excuse(index, &mut r, w, reader) {
                continue;
            }
            let message = format!(
                "{name}: reader {} was granted epoch {} after writer {} had been granted fence {}",
                reader.op, reader.fence, w.op, w.fence
            );
            r.violation(index, reader.granted, message, &[&w.op, &reader.op], name);
        }
        let mut by_invoke: Vec<&Lease> = writers.clone();
        by_invoke.sort_by_key(|l| l.invoked);
        let mut done = 0;
        let mut top: Option<&Lease> = None;
        for writer in &by_invoke {
            while done < readers.len() && readers[done].granted < writer.invoked {
                if top.is_none_or(|t| readers[done].fence > t.fence) {
                    top = Some(readers[done]);
                }
                done += 1;
            }
            r.checked += 1;
            let Some(rd) = top else { continue };
            if writer.fence > rd.fence || c12_excuse(index, &mut r, rd, writer) {
                continue;
            }
            let message = format!(
                "{name}: writer {} was granted fence {} after reader {} had been granted epoch {}: a validated read of that reader would not see the writer",
                writer.op, writer.fence, rd.op, rd.fence
            );
            r.violation(index, writer.granted, message, &[&rd.op, &writer.op], name);
        }
    }
    r
}
