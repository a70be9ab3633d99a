//! Showing a [`Report`]: the human summary or one JSON object — the only
//! place either is written.

use serde_json::{Value, json};

use crate::check::CheckResult;
use crate::report::Report;

/// How a report is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A readable summary.
    Text,
    /// One JSON object.
    Json,
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0} ms"))
}

fn check_json(c: &CheckResult) -> Value {
    json!({
        "id": c.id,
        "rule": c.rule,
        "checked": c.checked,
        "violations": c.violations,
        "excused": c.excused,
        "excused_because": c.notes,
        "passed": c.passed(),
        "first_violation": c.first.as_ref().map(|v| json!({
            "at_s": v.at as f64 / 1e6,
            "message": v.message,
            "context": v.context.iter()
                .map(|l| serde_json::from_str::<Value>(l).unwrap_or(Value::String(l.clone())))
                .collect::<Vec<_>>(),
        })),
    })
}

impl Report {
    /// The report as one JSON object (snake_case fields that carry their
    /// unit).
    pub fn to_json(&self) -> Value {
        let f = &self.figures;
        let h = self.header.as_ref();
        let mut out = json!({
            "topology": h.map(|h| h.topology.clone()),
            "primitive": h.map(|h| match (h.permits, h.rwlock_reads) {
                (Some(_), _) => "semaphore",
                (None, Some(_)) => "rwlock",
                (None, None) => "mutex",
            }),
            "permits": h.and_then(|h| h.permits),
            "seed": h.map(|h| h.seed),
            "unsafe": h.and_then(|h| h.unsafe_variant.clone()),
            "workers": h.map(|h| h.workers),
            "names": h.map(|h| h.names.len()),
            "ttl_ms": h.map(|h| h.ttl_ms),
            "mode": h.map(|h| h.mode.clone()),
            "fence_mode": h.map(|h| h.fence_mode.clone()),
            "resource": h.map(|h| h.resource.clone()),
            "nemeses": h.map(|h| h.nemeses.clone()),
            "replicas": h.map(|h| h.replicas),
            "wait_replicas": h.map(|h| h.wait_replicas),
            "expectations": self.expectations(),
            "duration_s": (f.duration_s * 10.0).round() / 10.0,
            "ended": self.ended,
            "ops_attempted": f.ops_attempted,
            "ops_acknowledged": f.ops_acknowledged,
            "ops_rejected_stale": f.ops_rejected_stale,
            "ops_failed": f.ops_failed,
            "grants": f.grants,
            "losses": f.losses,
            "nemesis_events": f.nemesis_events,
            "failovers": f.failovers,
            "revokes": f.revokes,
            "revokes_deposing": f.revokes_deposing,
            "revokes_sealed": f.revokes_sealed,
            "loss_signal_latency_ms_p50": f.loss_signal_latency_ms_p50,
            "loss_signal_latency_ms_p99": f.loss_signal_latency_ms_p99,
            "unavailability_ms_max": f.unavailability_ms_max.round(),
            "violations": self.violations(),
            "inconclusive": self.inconclusive(),
            "minimum": json!({
                "grants_per_name": crate::report::MIN_GRANTS_PER_NAME,
                "acknowledged_writes_per_name": crate::report::MIN_ACKNOWLEDGED_PER_NAME,
            }),
            "caught_by": self.caught_by(),
            "first_violation_s": self.first_violation_s(),
            "checkers": self.checks.iter().map(check_json).collect::<Vec<_>>(),
        });
        // A read-write lock's figures (a second object: one json! of all
        // fields would pass the macro's recursion limit).
        if let (Some(reads), Some(object)) = (h.and_then(|h| h.rwlock_reads), out.as_object_mut()) {
            for (key, value) in [
                ("rwlock_reads_percent", json!(reads)),
                ("reads", json!(f.reads)),
                ("reads_torn", json!(f.reads_torn)),
                ("readers_max", json!(f.readers_max)),
            ] {
                object.insert(key.to_string(), value);
            }
            if let Some(minimum) = object.get_mut("minimum").and_then(Value::as_object_mut) {
                minimum.insert(
                    "validated_reads_per_name".to_string(),
                    json!(crate::report::MIN_READS_PER_NAME),
                );
            }
        }
        // A mixed run's figures per kind of worker.
        if !f.by_worker_kind.is_empty()
            && let Some(object) = out.as_object_mut()
        {
            let kinds: serde_json::Map<String, Value> = f
                .by_worker_kind
                .iter()
                .map(|(kind, k)| {
                    (
                        kind.clone(),
                        json!({
                            "workers": k.workers,
                            "ops_attempted": k.ops_attempted,
                            "grants": k.grants,
                            "ops_acknowledged": k.ops_acknowledged,
                            "ops_rejected_stale": k.ops_rejected_stale,
                            "ops_failed": k.ops_failed,
                        }),
                    )
                })
                .collect();
            object.insert("worker_kinds".to_string(), Value::Object(kinds));
        }
        out
    }

    /// The readable summary.
    pub fn to_text(&self) -> String {
        let f = &self.figures;
        let mut out = String::new();
        if let Some(h) = &self.header {
            out += &format!(
                "fencelock torture: {} topology, {} workers, {} name(s), ttl {} ms, {} wait, {} fences, {} resource, seed {}\n",
                h.topology,
                h.workers,
                h.names.len(),
                h.ttl_ms,
                h.mode,
                h.fence_mode,
                h.resource,
                h.seed
            );
            if let Some(permits) = h.permits {
                out += &format!(
                    "primitive: a fenced semaphore of {permits} permits per name; its resource fenced per slot (C1-C7 checked per slot, C8 and C9 across the slots)\n"
                );
            }
            if let Some(reads) = h.rwlock_reads {
                out += &format!(
                    "primitive: a fenced read-write lock per name, {reads} % read leases; writers' writes audited (C1-C3; C4 and C6 among writers), C5 and C7 per holder, C10 no writer with a valid reader, C11 validated reads, C12 epochs\n"
                );
            }
            if h.replicas > 0 {
                out += &format!(
                    "replication: {} replica(s) per shard; every grant waits for {}\n",
                    h.replicas, h.wait_replicas
                );
            }
            if let Some(v) = &h.unsafe_variant {
                out += &format!(
                    "NEGATIVE CONTROL {v}: a deliberately broken variant, not fencelock\n"
                );
            }
        }
        out += &format!("ran {:.1} s ({})\n", f.duration_s, self.ended);
        out += &format!(
            "operations: {} attempted, {} acknowledged, {} rejected as stale, {} failed\n",
            f.ops_attempted, f.ops_acknowledged, f.ops_rejected_stale, f.ops_failed
        );
        for (kind, k) in &f.by_worker_kind {
            out += &format!(
                "  {kind} workers ({}): {} attempted, {} granted, {} acknowledged, {} rejected as stale, {} failed\n",
                k.workers,
                k.ops_attempted,
                k.grants,
                k.ops_acknowledged,
                k.ops_rejected_stale,
                k.ops_failed
            );
        }
        out += &format!(
            "grants {}, losses {}; loss signal after the loss was observable: p50 {}, p99 {}; longest unavailability {:.0} ms\n",
            f.grants,
            f.losses,
            ms(f.loss_signal_latency_ms_p50),
            ms(f.loss_signal_latency_ms_p99),
            f.unavailability_ms_max
        );
        if self
            .header
            .as_ref()
            .is_some_and(|h| h.rwlock_reads.is_some())
        {
            out += &format!(
                "validated reads {}: {} clean, {} torn (their reader had outlived its lease); at most {} readers observed at once\n",
                f.reads,
                f.reads - f.reads_torn,
                f.reads_torn,
                f.readers_max
            );
        }
        let nemeses: Vec<String> = f
            .nemesis_events
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        out += &format!(
            "nemeses: {}\n",
            if nemeses.is_empty() {
                "none".to_string()
            } else {
                nemeses.join(", ")
            }
        );
        if self.header.as_ref().is_some_and(|h| h.replicas > 0) {
            out += &format!("failovers carried out: {}\n", f.failovers);
        }
        if f.revokes > 0 {
            out += &format!(
                "revokes: {}, {} of them deposing a holder, {} sealing the resource\n",
                f.revokes, f.revokes_deposing, f.revokes_sealed
            );
        }
        for e in self.expectations() {
            out += &format!("expected: {e}\n");
        }
        out += "\n";
        out += "check  checked  violations  excused  rule\n";
        for c in &self.checks {
            out += &format!(
                "{:<5}  {:>7}  {:>10}  {:>7}  {}\n",
                c.id, c.checked, c.violations, c.excused, c.rule
            );
        }
        for c in &self.checks {
            for note in &c.notes {
                out += &format!("{} excused: {note}\n", c.id);
            }
        }
        for c in self.checks.iter().filter(|c| !c.passed()) {
            if let Some(v) = &c.first {
                out += &format!(
                    "\n{} first violation at {:.3} s: {}\n",
                    c.id,
                    v.at as f64 / 1e6,
                    v.message
                );
                for line in &v.context {
                    out += &format!("  {line}\n");
                }
            }
        }
        out += "\n";
        out += &self.verdict();
        out += "\n";
        out
    }

    /// One line: no violation, or which checkers found some.
    pub fn verdict(&self) -> String {
        let control = self.header.as_ref().and_then(|h| h.unsafe_variant.clone());
        match (self.violations(), control) {
            (0, None) => match self.inconclusive() {
                Some(why) => format!("verdict: INCONCLUSIVE: no violation found, but {why}"),
                None => "verdict: no violation".to_string(),
            },
            (0, Some(v)) => match self.inconclusive() {
                Some(why) => {
                    format!("verdict: negative control {v} NOT CAUGHT, and INCONCLUSIVE: {why}")
                }
                None => {
                    format!("verdict: negative control {v} NOT CAUGHT: the checkers found nothing")
                }
            },
            (n, None) => format!(
                "verdict: {n} VIOLATION(S) found by {}",
                self.caught_by().join(", ")
            ),
            (n, Some(v)) => format!(
                "verdict: negative control {v} caught by {} ({n} violation(s), the first at {:.1} s)",
                self.caught_by().join(", "),
                self.first_violation_s().unwrap_or(0.0)
            ),
        }
    }
}
