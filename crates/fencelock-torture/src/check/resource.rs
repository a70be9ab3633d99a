//! C1–C3: what the resource accepted, from its audit.
//!
//! A revoke's seal is in the audit too (holder
//! [`fencelock::REVOKED_HOLDER`], value unchanged): for C1 and C2 it is an
//! accepted fence like any write's, which a later write must exceed; C3
//! counts increments, which a seal is not. A revoke that returned also
//! promises, sealed or not in the audit, that from its return on no write
//! with a fence up to its revocation fence is accepted: C1 checks that
//! against the writes sent after it (a write sent before may have reached
//! the resource before the seal, and is the deposed holder's legitimately).
//! A deposed holder whose writes were refused breaks nothing: C3 judges
//! acknowledged writes only.

use std::collections::{HashMap, HashSet};

use super::index::{AuditRow, Index};
use super::verdict::CheckResult;
use crate::history::Outcome;

/// When the write of `op` was acknowledged (or sent), for the report.
fn write_time(index: &Index<'_>, op: &str) -> i64 {
    index
        .writes
        .get(op)
        .map_or(index.end, |w| w.done.map_or(w.invoked, |(t, _)| t))
}

/// C1: accepted fences never go down, per resource, and none is at or
/// below a revocation fence once its revoke returned.
pub(super) fn c1(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C1",
        "no write accepted with a fence lower than an already accepted one (a revoke's seal included), nor at or below a revocation fence after its revoke returned",
    );
    let mut names: Vec<&String> = index.audit.keys().collect();
    names.sort();
    for name in names {
        let mut max: Option<(u64, &str)> = None;
        for row in &index.audit[name] {
            r.checked += 1;
            if let Some((m, by)) = max
                && row.fence < m
            {
                let message = format!(
                    "resource {name}: write of {} accepted with fence {} after {by} had written fence {m} (audit #{})",
                    row.op, row.fence, row.seq
                );
                r.violation(
                    index,
                    write_time(index, &row.op),
                    message,
                    &[&row.op, by],
                    name,
                );
            }
            if max.is_none_or(|(m, _)| row.fence >= m) {
                max = Some((row.fence, &row.op));
            }
        }
    }
    revoked_writes(index, &mut r);
    r
}

/// C1's revoke rule: an accepted write (in the audit) sent after a revoke
/// of its name returned, with a fence at or below the revocation fence.
/// The revoke deposed its holder; a seal (or a later holder's greater
/// fence) refuses it from the revoke on, so only a revoke that left the
/// resource unsealed lets it through.
fn revoked_writes(index: &Index<'_>, r: &mut CheckResult) {
    for rev in index.revokes.iter().filter(|v| v.holds) {
        let Some(fence) = rev.fence else { continue };
        let Some(rows) = index.audit.get(&rev.name) else {
            continue;
        };
        for row in rows.iter().filter(|row| !row.seal) {
            let Some(w) = index.writes.get(&row.op) else {
                continue;
            };
            r.checked += 1;
            if w.invoked <= rev.t || row.fence > fence {
                continue;
            }
            let by = rev
                .deposed
                .as_deref()
                .map_or(String::new(), |h| format!(" (it deposed holder {h})"));
            let message = format!(
                "resource {}: write of {} accepted with fence {} (audit #{}), sent at {:.3} s after the revoke at {:.3} s had returned revocation fence {fence}{by}: the deposed holder's write was not refused",
                rev.name,
                row.op,
                row.fence,
                row.seq,
                w.invoked as f64 / 1e6,
                rev.t as f64 / 1e6
            );
            r.violation(
                index,
                write_time(index, &row.op),
                message,
                &[&row.op],
                &rev.name,
            );
        }
    }
}

/// C2: one holder per fence.
pub(super) fn c2(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C2",
        "no two different holders accepted with the same fence",
    );
    let mut names: Vec<&String> = index.audit.keys().collect();
    names.sort();
    for name in names {
        let mut by_fence: HashMap<u64, (&str, &str)> = HashMap::new();
        for row in &index.audit[name] {
            r.checked += 1;
            // A seal records its fence over an equal one from any holder
            // (that holder is the one revoked); a write after it with that
            // fence is then from a holder other than the seal's.
            if row.seal {
                by_fence.insert(row.fence, (&row.holder, &row.op));
                continue;
            }
            match by_fence.get(&row.fence) {
                Some(&(holder, op)) if holder != row.holder => {
                    let message = format!(
                        "resource {name}: fence {} accepted from holder {holder} ({op}) and from holder {} ({}, audit #{})",
                        row.fence, row.holder, row.op, row.seq
                    );
                    r.violation(
                        index,
                        write_time(index, &row.op),
                        message,
                        &[op, &row.op],
                        name,
                    );
                }
                Some(_) => {}
                None => {
                    by_fence.insert(row.fence, (&row.holder, &row.op));
                }
            }
        }
    }
    r
}

/// C3: no acknowledged write lost.
pub(super) fn c3(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C3",
        "no acknowledged write lost: every acknowledged increment is in the final counter",
    );
    let acked: HashSet<&str> = index
        .writes
        .iter()
        .filter(|(_, w)| matches!(w.done, Some((_, Outcome::Accepted))))
        .map(|(op, _)| op.as_str())
        .collect();
    r.checked = acked.len() as u64;
    let mut names: Vec<&String> = index.audit.keys().chain(index.finals.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        // Seals change no value: C3 counts the writes' increments only.
        let rows: Vec<&AuditRow> = index
            .audit
            .get(name)
            .map(|rows| rows.iter().filter(|row| !row.seal).collect())
            .unwrap_or_default();
        let in_audit: HashSet<&str> = rows.iter().map(|a| a.op.as_str()).collect();
        let mut missing: Vec<(&str, i64)> = index
            .writes
            .iter()
            .filter(|(op, w)| {
                &w.name == name && acked.contains(op.as_str()) && !in_audit.contains(op.as_str())
            })
            .map(|(op, w)| (op.as_str(), w.done.map_or(w.invoked, |(t, _)| t)))
            .collect();
        missing.sort_by_key(|m| m.1);
        for (op, t) in missing {
            r.violation(
                index,
                t,
                format!(
                    "resource {name}: the write of {op} was acknowledged but is not in the audit"
                ),
                &[op],
                name,
            );
        }
        // An accepted write that did not start from what it had read
        // overwrote the increments accepted in between.
        for (i, row) in rows.iter().enumerate() {
            if row.before == row.read {
                continue;
            }
            let lost: Vec<&str> = rows[..i]
                .iter()
                .filter(|p| p.after > row.read && p.after <= row.before)
                .map(|p| p.op.as_str())
                .collect();
            let lost_acked: Vec<&str> = lost
                .iter()
                .copied()
                .filter(|op| acked.contains(op))
                .collect();
            if lost_acked.is_empty() {
                continue;
            }
            let message = format!(
                "resource {name}: {} read {} but wrote {} over {} (audit #{}): the acknowledged increment(s) of {} are lost",
                row.op,
                row.read,
                row.after,
                row.before,
                row.seq,
                lost_acked.join(", ")
            );
            let mut ops = vec![row.op.as_str()];
            ops.extend(lost_acked.iter().copied());
            r.violation(index, write_time(index, &row.op), message, &ops, name);
        }
        if let Some(&value) = index.finals.get(name) {
            let accepted = rows.len() as i64;
            if value != accepted && rows.iter().all(|row| row.before == row.read) {
                r.violation(
                    index,
                    index.end,
                    format!(
                        "resource {name}: the counter is {value} but {accepted} increments were accepted"
                    ),
                    &[],
                    name,
                );
            }
        }
    }
    r
}
