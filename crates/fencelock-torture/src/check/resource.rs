//! C1–C3: what the resource accepted, from its audit.

use std::collections::{HashMap, HashSet};

use super::index::Index;
use super::verdict::CheckResult;
use crate::history::Outcome;

/// When the write of `op` was acknowledged (or sent), for the report.
fn write_time(index: &Index<'_>, op: &str) -> i64 {
    index
        .writes
        .get(op)
        .map_or(index.end, |w| w.done.map_or(w.invoked, |(t, _)| t))
}

/// C1: accepted fences never go down, per resource.
pub(super) fn c1(index: &Index<'_>) -> CheckResult {
    let mut r = CheckResult::new(
        "C1",
        "no write accepted with a fence lower than an already accepted one",
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
    r
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
        let rows = index.audit.get(name).map(Vec::as_slice).unwrap_or(&[]);
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
