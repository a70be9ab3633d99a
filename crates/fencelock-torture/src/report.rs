//! The report of a run: its configuration, the figures, and each checker's
//! result. Built from the history alone ([`Report::from_history`]), so a
//! saved history gives the same report as the run that wrote it.

use std::collections::BTreeMap;

use crate::check::{self, CheckResult};
use crate::history::{Entry, Header, History, Outcome};

/// What a run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The configuration (the history's header).
    pub header: Option<Header>,
    /// The figures.
    pub figures: Figures,
    /// C1–C7.
    pub checks: Vec<CheckResult>,
    /// Why the run ended.
    pub ended: String,
}

/// The figures of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Time from the first to the last event, in s.
    pub duration_s: f64,
    /// Lease cycles started (acquire, register, read, write, release).
    pub ops_attempted: u64,
    /// Cycles whose write the resource accepted.
    pub ops_acknowledged: u64,
    /// Cycles whose registration or write the resource refused as stale.
    pub ops_rejected_stale: u64,
    /// Cycles that failed otherwise (no lock, an error, an unknown outcome).
    pub ops_failed: u64,
    /// Locks granted.
    pub grants: u64,
    /// Leases lost (loss signal, or a release that found the lock gone).
    pub losses: u64,
    /// Nemeses injected, by kind.
    pub nemesis_events: BTreeMap<String, u64>,
    /// Failovers carried out: a replica became the primary (`failover`, and
    /// `kill-wipe` on a replicated topology), without an error.
    pub failovers: u64,
    /// Revokes that returned (`revoke`), without an error.
    pub revokes: u64,
    /// Of those, the revokes that deposed a holder.
    pub revokes_deposing: u64,
    /// Of those, the revokes that sealed the resource (a seal accepted, or
    /// refused over a later holder's greater fence).
    pub revokes_sealed: u64,
    /// Loss signal − moment the loss was observable, median, in ms
    /// (negative: the holder knew before Redis showed it).
    pub loss_signal_latency_ms_p50: Option<f64>,
    /// The same, 99th percentile.
    pub loss_signal_latency_ms_p99: Option<f64>,
    /// The longest time a name had no usable holder while workers tried to
    /// acquire it, in ms.
    pub unavailability_ms_max: f64,
    /// Locks granted, per name.
    pub grants_by_name: BTreeMap<String, u64>,
    /// Cycles whose write the resource accepted, per name.
    pub acknowledged_by_name: BTreeMap<String, u64>,
    /// A read-write lock's validated reads (`--primitive rwlock`).
    pub reads: u64,
    /// Of those, the reads the readers reported torn (a writer after their
    /// epoch had written: they outlived their lease).
    pub reads_torn: u64,
    /// The most readers the observer saw hold one name at once.
    pub readers_max: u64,
    /// Validated reads, per name (a read-write lock's).
    pub reads_by_name: BTreeMap<String, u64>,
    /// The figures per kind of worker (`rust`, `python`), when the header
    /// names the workers' kinds (a mixed run); empty otherwise.
    pub by_worker_kind: BTreeMap<String, KindFigures>,
}

/// The figures of one kind of worker in a mixed run (see
/// [`crate::Launcher::kind`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindFigures {
    /// Workers of this kind.
    pub workers: u64,
    /// Lease cycles they started.
    pub ops_attempted: u64,
    /// Locks granted to them.
    pub grants: u64,
    /// Their cycles whose write the resource accepted.
    pub ops_acknowledged: u64,
    /// Their cycles whose registration or write was refused as stale.
    pub ops_rejected_stale: u64,
    /// Their cycles that failed otherwise.
    pub ops_failed: u64,
}

/// The least a run must have seen of every lock name for its checkers to
/// judge anything: grants (C4–C7 judge the lock through them) and
/// acknowledged writes (C1–C3 judge the resource through them). A run
/// below it ends inconclusive, never "no violation".
pub const MIN_GRANTS_PER_NAME: u64 = 1;

/// See [`MIN_GRANTS_PER_NAME`].
pub const MIN_ACKNOWLEDGED_PER_NAME: u64 = 1;

/// The least validated reads a read-write lock run must have seen of every
/// lock name (C11 judges the readers through them).
pub const MIN_READS_PER_NAME: u64 = 1;

fn percentile(sorted: &[i64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)] as f64 / 1e3)
}

impl Report {
    /// Checks `history` and computes its figures.
    pub fn from_history(history: &History) -> Report {
        let checks = check::check(history);
        let mut f = Figures::default();
        let first = history.events.first().map_or(0, |e| e.t);
        let last = history.events.last().map_or(0, |e| e.t);
        f.duration_s = (last - first).max(0) as f64 / 1e6;
        let mut ended = String::from("unknown (no end event)");
        // Per cycle: write acknowledged, refused as stale, read made.
        let mut cycles: BTreeMap<&str, (bool, bool, bool)> = BTreeMap::new();
        let mut cycle_name: BTreeMap<&str, &str> = BTreeMap::new();
        if let Some(h) = history.header() {
            for name in &h.names {
                f.grants_by_name.insert(name.clone(), 0);
                f.acknowledged_by_name.insert(name.clone(), 0);
                if h.rwlock_reads.is_some() {
                    f.reads_by_name.insert(name.clone(), 0);
                }
            }
        }
        // A mixed run's kind of each worker (`w3` → its kind).
        let kinds: Vec<String> = history
            .header()
            .and_then(|h| h.worker_kinds.clone())
            .unwrap_or_default();
        let kind_of = |p: &str| -> Option<String> {
            let index: usize = p.strip_prefix('w')?.parse().ok()?;
            kinds.get(index).cloned()
        };
        for kind in &kinds {
            f.by_worker_kind.entry(kind.clone()).or_default().workers += 1;
        }
        let mut cycle_kind: BTreeMap<&str, String> = BTreeMap::new();
        // Per name: (grant time, when that holder stopped being usable).
        let mut held: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
        let mut lease_end: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
        let replicated = history.header().is_some_and(|h| h.replicas > 0);
        for e in &history.events {
            match &e.e {
                Entry::Acquire { op, name } => {
                    f.ops_attempted += 1;
                    cycles.insert(op, (false, false, false));
                    cycle_name.insert(op, name);
                    if let Some(kind) = kind_of(&e.p) {
                        f.by_worker_kind
                            .entry(kind.clone())
                            .or_default()
                            .ops_attempted += 1;
                        cycle_kind.insert(op, kind);
                    }
                }
                Entry::Granted { op, name, .. } => {
                    f.grants += 1;
                    if let Some(kind) = cycle_kind.get(op.as_str()) {
                        f.by_worker_kind.entry(kind.clone()).or_default().grants += 1;
                    }
                    *f.grants_by_name.entry(name.clone()).or_default() += 1;
                    lease_end.insert(op, (e.t, name));
                    held.entry(name).or_default().push((e.t, i64::MAX));
                }
                Entry::Registered { op, outcome } | Entry::Written { op, outcome } => {
                    if let Some(c) = cycles.get_mut(op.as_str()) {
                        match outcome {
                            Outcome::Accepted if matches!(e.e, Entry::Written { .. }) => c.0 = true,
                            Outcome::Stale => c.1 = true,
                            _ => {}
                        }
                    }
                }
                Entry::ValidatedRead { op, clean, .. } => {
                    f.reads += 1;
                    if !clean {
                        f.reads_torn += 1;
                    }
                    if let Some(c) = cycles.get_mut(op.as_str()) {
                        c.2 = true;
                    }
                    if let Some(name) = cycle_name.get(op.as_str()) {
                        *f.reads_by_name.entry((*name).to_string()).or_default() += 1;
                    }
                }
                Entry::ObservedHolders { holders, .. } => {
                    let readers = holders
                        .iter()
                        .filter(|h| h.access.as_deref() == Some("read"))
                        .count() as u64;
                    f.readers_max = f.readers_max.max(readers);
                }
                Entry::Lost { op, .. } | Entry::Release { op, .. } => {
                    if let Entry::Lost { .. } = &e.e {
                        f.losses += 1;
                    }
                    if let Some(&(granted, name)) = lease_end.get(op.as_str())
                        && let Some(h) = held.get_mut(name)
                        && let Some(slot) = h.iter_mut().rev().find(|s| s.0 == granted)
                    {
                        slot.1 = slot.1.min(e.t);
                    }
                }
                Entry::NemesisStart { kind, .. } => {
                    *f.nemesis_events.entry(kind.clone()).or_default() += 1;
                }
                Entry::NemesisEnd {
                    kind, error: None, ..
                } if kind == "failover" || (replicated && kind == "kill-wipe") => {
                    f.failovers += 1;
                }
                Entry::Revoke {
                    deposed,
                    sealed,
                    error: None,
                    ..
                } => {
                    f.revokes += 1;
                    if deposed.is_some() {
                        f.revokes_deposing += 1;
                    }
                    if matches!(sealed, Some(Outcome::Accepted | Outcome::Stale)) {
                        f.revokes_sealed += 1;
                    }
                }
                Entry::End { reason } => ended = reason.clone(),
                _ => {}
            }
        }
        // A release that found the lock gone is a loss the signal missed.
        let signalled: std::collections::HashSet<&str> = history
            .events
            .iter()
            .filter_map(|x| match &x.e {
                Entry::Lost { op, .. } => Some(op.as_str()),
                _ => None,
            })
            .collect();
        for e in &history.events {
            if let Entry::ReleaseDone {
                op,
                outcome: crate::history::Released::NotOurs,
            } = &e.e
                && !signalled.contains(op.as_str())
            {
                f.losses += 1;
            }
        }
        for (op, (acked, stale, read)) in &cycles {
            if let Some(kind) = cycle_kind.get(op) {
                let k = f.by_worker_kind.entry(kind.clone()).or_default();
                if *acked {
                    k.ops_acknowledged += 1;
                } else if *stale {
                    k.ops_rejected_stale += 1;
                } else if !*read {
                    k.ops_failed += 1;
                }
            }
            if *acked {
                f.ops_acknowledged += 1;
                if let Some(name) = cycle_name.get(op) {
                    *f.acknowledged_by_name
                        .entry((*name).to_string())
                        .or_default() += 1;
                }
            } else if *stale {
                f.ops_rejected_stale += 1;
            } else if *read {
                // A reader's cycle: its validated read is its work.
            } else {
                f.ops_failed += 1;
            }
        }
        for spans in held.values_mut() {
            spans.sort();
            for pair in spans.windows(2) {
                let free_from = pair[0].1.max(pair[0].0);
                let gap = pair[1].0 - free_from;
                if gap > 0 {
                    f.unavailability_ms_max = f.unavailability_ms_max.max(gap as f64 / 1e3);
                }
            }
        }
        let mut lat = check::loss_latencies(history);
        lat.sort_unstable();
        f.loss_signal_latency_ms_p50 = percentile(&lat, 0.5);
        f.loss_signal_latency_ms_p99 = percentile(&lat, 0.99);
        Report {
            header: history.header().cloned(),
            figures: f,
            checks,
            ended,
        }
    }

    /// What the checkers may expect of this run's deployment, in
    /// sentences: on a replicated topology, what a failover may roll back
    /// (see [`crate::check`]).
    pub fn expectations(&self) -> Vec<String> {
        let Some(h) = &self.header else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if h.replicas > 0 {
            if h.wait_replicas >= h.replicas {
                out.push(format!(
                    "every grant was acknowledged by all {} replica(s) of its shard before use, so a failover cannot lose it: C4 (mutual exclusion) is expected to hold across failovers, for each lease as far as its grant's validity (renewals and releases are not waited for; what a failover rolls back of them is excused and counted)",
                    h.replicas
                ));
            } else {
                out.push(format!(
                    "grants were acknowledged by {} of {} replica(s): a failover may lose an acknowledged grant, so C4 (mutual exclusion) is NOT promised across failovers; overlaps a failover explains are excused and counted, not passed",
                    h.wait_replicas, h.replicas
                ));
            }
            out.push(format!(
                "fences stay monotonic regardless (C1, C2, C6){}; the resource (C1–C3) lives on a server no nemesis touches",
                if h.fence_mode == "counter" && h.wait_replicas < h.replicas {
                    ", except counter fences after a lost grant (excused)"
                } else {
                    ""
                }
            ));
        }
        out
    }

    /// Why the checkers saw too little to judge, if they did: a lock name
    /// with fewer than [`MIN_GRANTS_PER_NAME`] grants or
    /// [`MIN_ACKNOWLEDGED_PER_NAME`] acknowledged writes (a deployment on
    /// which nothing works — a replica that refuses every write, a master
    /// short of the replicas `min-replicas-to-write` asks for — checks
    /// nothing and must not pass). `None`: enough was seen.
    pub fn inconclusive(&self) -> Option<String> {
        let f = &self.figures;
        let short: Vec<String> = f
            .grants_by_name
            .iter()
            .map(|(name, grants)| {
                let acked = f.acknowledged_by_name.get(name).copied().unwrap_or(0);
                (name, *grants, acked)
            })
            .filter(|(name, grants, acked)| {
                *grants < MIN_GRANTS_PER_NAME
                    || *acked < MIN_ACKNOWLEDGED_PER_NAME
                    || f.reads_by_name
                        .get(*name)
                        .is_some_and(|r| *r < MIN_READS_PER_NAME)
            })
            .map(|(name, grants, acked)| match f.reads_by_name.get(name) {
                Some(reads) => format!(
                    "{name}: {grants} grant(s), {acked} acknowledged write(s), {reads} validated read(s)"
                ),
                None => format!("{name}: {grants} grant(s), {acked} acknowledged write(s)"),
            })
            .collect();
        if short.is_empty() && !f.grants_by_name.is_empty() {
            return None;
        }
        let seen = if short.is_empty() {
            "no lock name in the history".to_string()
        } else {
            short.join("; ")
        };
        let reads = if f.reads_by_name.is_empty() {
            String::new()
        } else {
            format!(" (and, a read-write lock's, {MIN_READS_PER_NAME} validated read)")
        };
        Some(format!(
            "the checkers saw too little to judge: every lock name needs at least {MIN_GRANTS_PER_NAME} grant and {MIN_ACKNOWLEDGED_PER_NAME} acknowledged write{reads}, and {seen}"
        ))
    }

    /// Violations over all checkers.
    pub fn violations(&self) -> u64 {
        self.checks.iter().map(|c| c.violations).sum()
    }

    /// The checkers that found a violation.
    pub fn caught_by(&self) -> Vec<&'static str> {
        self.checks
            .iter()
            .filter(|c| !c.passed())
            .map(|c| c.id)
            .collect()
    }

    /// When the earliest violation happened, in s since the start.
    pub fn first_violation_s(&self) -> Option<f64> {
        self.checks
            .iter()
            .filter_map(|c| c.first.as_ref().map(|v| v.at))
            .min()
            .map(|at| at as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, Released};

    fn ev(t: i64, p: &str, e: Entry) -> Event {
        Event { t, p: p.into(), e }
    }

    /// A cycle of worker `p`: acquire, grant, write with `outcome`, release.
    fn cycle(t: i64, p: &str, fence: u64, outcome: Outcome) -> Vec<Event> {
        let op = format!("{p}.{t}");
        vec![
            ev(
                t,
                p,
                Entry::Acquire {
                    op: op.clone(),
                    name: "t0".into(),
                },
            ),
            ev(
                t + 1,
                p,
                Entry::Granted {
                    op: op.clone(),
                    name: "t0".into(),
                    fence,
                    holder: p.into(),
                    valid_until: t + 300,
                    slot: None,
                    access: None,
                },
            ),
            ev(
                t + 2,
                p,
                Entry::Written {
                    op: op.clone(),
                    outcome,
                },
            ),
            ev(
                t + 3,
                p,
                Entry::ReleaseDone {
                    op,
                    outcome: Released::Released,
                },
            ),
        ]
    }

    fn header(worker_kinds: Option<Vec<String>>) -> Event {
        ev(
            0,
            "run",
            Entry::Header(Header {
                version: "0".into(),
                seed: 1,
                topology: "single".into(),
                workers: 3,
                names: vec!["t0".into()],
                ttl_ms: 300,
                renewal_ms: 100,
                mode: "notify".into(),
                fence_mode: "clock".into(),
                layout: "default".into(),
                resource: "redis".into(),
                unsafe_variant: None,
                nemeses: vec![],
                duration_ms: 1000,
                replicas: 0,
                wait_replicas: 0,
                permits: None,
                rwlock_reads: None,
                worker_kinds,
            }),
        )
    }

    /// A mixed run's figures are counted per kind of worker, from the
    /// header's kinds by worker index; a run without kinds has none.
    #[test]
    fn a_mixed_run_counts_operations_per_kind_of_worker() {
        let kinds = vec!["rust".to_string(), "python".into(), "python".into()];
        let mut events = vec![header(Some(kinds))];
        events.extend(cycle(10, "w0", 1, Outcome::Accepted));
        events.extend(cycle(20, "w1", 2, Outcome::Accepted));
        events.extend(cycle(30, "w2", 3, Outcome::Stale));
        events.push(ev(
            40,
            "w1",
            Entry::Acquire {
                op: "w1.40".into(),
                name: "t0".into(),
            },
        ));
        let report = Report::from_history(&History::new(events.clone()));
        let by = &report.figures.by_worker_kind;
        assert_eq!(
            by.get("rust"),
            Some(&KindFigures {
                workers: 1,
                ops_attempted: 1,
                grants: 1,
                ops_acknowledged: 1,
                ops_rejected_stale: 0,
                ops_failed: 0,
            })
        );
        assert_eq!(
            by.get("python"),
            Some(&KindFigures {
                workers: 2,
                ops_attempted: 3,
                grants: 2,
                ops_acknowledged: 1,
                ops_rejected_stale: 1,
                ops_failed: 1,
            })
        );
        let json = report.to_json();
        assert_eq!(json["worker_kinds"]["python"]["ops_acknowledged"], 1);
        assert!(report.to_text().contains("python workers (2): 3 attempted"));
        events[0] = header(None);
        let plain = Report::from_history(&History::new(events));
        assert!(plain.figures.by_worker_kind.is_empty());
        assert!(plain.to_json().get("worker_kinds").is_none());
    }
}
