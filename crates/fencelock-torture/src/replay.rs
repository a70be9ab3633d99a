//! The model's verdict on a saved history (`fencelock torture --check FILE
//! --model`): every recorded operation replayed through the lock
//! protocol's store transitions (`fencelock_model::trace`), and the first
//! one no order of the operations explains.
//!
//! What becomes an operation of the model, with its invocation and
//! completion times:
//!
//! | history | model operation | interval | outcome |
//! |---|---|---|---|
//! | `acquire` → `granted` | a grant of the holder | acquire → granted | its fence |
//! | `acquire` → `acquire_failed`, or no outcome | an acquisition that may have made grants nobody was told of | acquire → — | indeterminate |
//! | `register` → `registered` | a fenced registration | register → registered | accepted, stale; unknown: indeterminate |
//! | `read` | a read of the resource's value | the cycle's previous event → read | the value |
//! | `write` → `written` | a fenced write of the value | write → written | as a registration |
//! | `release` → `release_done` | compare-and-delete of the grant | release → release_done | released, not ours; unknown: indeterminate |
//! | `observed` | a read of the lock key | sent → t | the holder and fence in the key |
//! | `revoke` | the revoke (depose, mint) and its seal of the resource | sent → t | the revocation fence, the deposed holder, the seal's outcome; an error without a fence: indeterminate |
//! | `nemesis_start`/`_end` with `data_loss` | the keys lost, once in the window | start → end | done (an error: may not have happened) |
//! | `nemesis_start`/`_end` with `rollback` | a possibly stale replica promoted, anywhere in the window | start → end | the last grant every replica had acknowledged is kept |
//! | `final` | a read of the resource's whole state | t | value, fence, holder |
//!
//! Loss signals, the audit and the other nemeses (pauses, delays, script
//! flushes, connection kills, restarts with the data) are no operations:
//! what they do shows in the operations' outcomes and timing. The shortest
//! a lock key lives is the shortest lease a script sets (the ttl; a
//! hand-over lease in notify and fair mode: `min(ttl, waiter lease)`, at
//! most 100 ms in notify mode) less the drift allowance (ttl / 100 +
//! 2 ms). Histories on etcd are not replayed: the model is of the Redis
//! store (its verdict is then unknown, and says so).
//!
//! [`ModelCheck`] holds the verdict, its figures and, for an unexplained
//! operation, the history lines around it; it renders as text or JSON.

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use fencelock_model::trace::Bounds;
use fencelock_model::trace::{
    self, Deposed, Event as MEvent, Op, Outcome as MOutcome, Params, SEALED, Verdict,
};
use serde_json::{Value, json};

use crate::history::{Entry, Event, History, Outcome, Released};

/// What the model said of a history.
#[derive(Debug, Clone)]
pub struct ModelCheck {
    /// The search's answer.
    pub verdict: Verdict,
    /// Operations replayed.
    pub operations: usize,
    /// Lock names searched.
    pub names: usize,
    /// How long the search took.
    pub elapsed: Duration,
    /// The bounds it ran with.
    pub bounds: Bounds,
    /// The operation the verdict stops at (the first unexplained one, or
    /// where the bounds stopped the search), in words, with its history.
    pub at: Option<Step>,
    /// Why no search ran, or what to bear in mind (a negative control).
    pub note: Option<String>,
}

/// An operation of the history, as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// When it completed (or was invoked), µs since the start.
    pub at: i64,
    /// The lease cycle it belongs to (`w3.17`), if any.
    pub op: Option<String>,
    /// The process that recorded it.
    pub process: String,
    /// What it did and what it got, in words.
    pub what: String,
    /// The history lines of its operation and the lock name's events just
    /// before it (JSON lines).
    pub context: Vec<String>,
}

/// Where a model operation came from.
#[derive(Debug, Clone)]
struct Source {
    op: Option<String>,
    process: String,
    name: Option<String>,
    what: String,
    /// History event indices of its invocation and completion.
    lines: Vec<usize>,
}

/// The parts of a lease cycle the conversion needs.
#[derive(Debug, Clone, Default)]
struct Cycle {
    name: String,
    process: String,
    acquired: i64,
    acquire_line: usize,
    holder: Option<u32>,
    fence: u64,
    /// The cycle's last event (a read is invoked after it).
    last: i64,
    /// An invocation waiting for its outcome: (time, line, fence, value).
    register: Option<(i64, usize, u64)>,
    write: Option<(i64, usize, u64, i64)>,
    release: Option<(i64, usize)>,
}

/// Builds the model's events from a history.
#[derive(Debug, Default)]
struct Convert {
    steps: Vec<MEvent>,
    sources: Vec<Source>,
    names: HashMap<String, u32>,
    name_list: Vec<String>,
    processes: HashMap<String, u32>,
    holders: HashMap<String, u32>,
    labels: Vec<String>,
}

fn short(holder: &str) -> String {
    holder.chars().take(8).collect()
}

impl Convert {
    fn name(&mut self, name: &str) -> u32 {
        if let Some(&n) = self.names.get(name) {
            return n;
        }
        let n = self.name_list.len() as u32;
        self.names.insert(name.to_string(), n);
        self.name_list.push(name.to_string());
        n
    }

    fn process(&mut self, p: &str) -> u32 {
        let n = self.processes.len() as u32;
        *self.processes.entry(p.to_string()).or_insert(n)
    }

    /// The model's holder for a public holder id.
    fn holder(&mut self, id: &str) -> u32 {
        if let Some(&h) = self.holders.get(id) {
            return h;
        }
        let h = self.labels.len() as u32;
        self.holders.insert(id.to_string(), h);
        self.labels.push(format!("holder {}", short(id)));
        h
    }

    /// A holder nobody can name (a failed acquisition's token).
    fn nameless(&mut self, op: &str) -> u32 {
        let h = self.labels.len() as u32;
        self.labels
            .push(format!("{op}'s token (its acquisition failed)"));
        h
    }

    fn push(&mut self, step: MEvent, source: Source) {
        self.steps.push(step);
        self.sources.push(source);
    }
}

fn outcome(o: Outcome) -> MOutcome {
    match o {
        Outcome::Accepted => MOutcome::Accepted,
        Outcome::Stale => MOutcome::Stale,
        Outcome::Unknown => MOutcome::Unknown,
    }
}

fn outcome_word(o: Outcome) -> &'static str {
    match o {
        Outcome::Accepted => "accepted",
        Outcome::Stale => "refused as stale",
        Outcome::Unknown => "no reply",
    }
}

/// The model's events from `history`, where each came from, and the
/// labels of the holders.
fn convert(history: &History) -> Convert {
    let mut c = Convert::default();
    if let Some(h) = history.header() {
        for name in &h.names {
            c.name(name);
        }
    }
    let grants_replicated = history
        .header()
        .is_some_and(|h| h.wait_replicas >= h.replicas);
    let mut cycles: HashMap<String, Cycle> = HashMap::new();
    // The grants so far, per name: for a failover's floor.
    let mut granted: HashMap<String, u64> = HashMap::new();
    // Open nemeses: (kind, target) → (start, line, data loss, rollback,
    // the floor per name at the start).
    type Open = (i64, usize, bool, bool, HashMap<String, u64>);
    let mut nemeses: HashMap<(String, Option<String>), Open> = HashMap::new();
    for (line, ev) in history.events.iter().enumerate() {
        let t = ev.t;
        let client = c.process(&ev.p);
        match &ev.e {
            Entry::Acquire { op, name } => {
                cycles.insert(
                    op.clone(),
                    Cycle {
                        name: name.clone(),
                        process: ev.p.clone(),
                        acquired: t,
                        acquire_line: line,
                        last: t,
                        ..Cycle::default()
                    },
                );
            }
            Entry::Granted {
                op,
                name,
                fence,
                holder,
                ..
            } => {
                let h = c.holder(holder);
                if let Some(label) = c.labels.get_mut(h as usize) {
                    *label = format!("{op}'s holder {}", short(holder));
                }
                let n = c.name(name);
                let (acquired, acquire_line) = cycles
                    .get(op)
                    .map_or((t, line), |cy| (cy.acquired, cy.acquire_line));
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked: acquired,
                        completed: Some(t),
                        op: Op::Acquire { holder: h },
                        outcome: MOutcome::Granted(*fence),
                    },
                    Source {
                        op: Some(op.clone()),
                        process: ev.p.clone(),
                        name: Some(name.clone()),
                        what: format!("{op}'s grant of {name} with fence {fence}"),
                        lines: vec![acquire_line, line],
                    },
                );
                let entry = granted.entry(name.clone()).or_insert(0);
                *entry = (*entry).max(*fence);
                let cy = cycles.entry(op.clone()).or_default();
                cy.name.clone_from(name);
                cy.process.clone_from(&ev.p);
                cy.holder = Some(h);
                cy.fence = *fence;
                cy.last = t;
            }
            Entry::AcquireFailed { op, name, error } => {
                let h = c.nameless(op);
                let n = c.name(name);
                let (acquired, acquire_line) = cycles
                    .remove(op)
                    .map_or((t, line), |cy| (cy.acquired, cy.acquire_line));
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked: acquired,
                        completed: Some(t),
                        op: Op::Acquire { holder: h },
                        outcome: MOutcome::Unknown,
                    },
                    Source {
                        op: Some(op.clone()),
                        process: ev.p.clone(),
                        name: Some(name.clone()),
                        what: format!("{op}'s acquisition of {name}, failed ({error})"),
                        lines: vec![acquire_line, line],
                    },
                );
            }
            Entry::Register { op, fence, .. } => {
                if let Some(cy) = cycles.get_mut(op) {
                    cy.register = Some((t, line, *fence));
                }
            }
            Entry::Registered { op, outcome: o } => {
                let Some(cy) = cycles.get_mut(op) else {
                    continue;
                };
                let Some((invoked, from, fence)) = cy.register.take() else {
                    continue;
                };
                cy.last = t;
                let (holder, name, process) =
                    (cy.holder.unwrap_or(0), cy.name.clone(), cy.process.clone());
                let n = c.name(&name);
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked,
                        completed: Some(t),
                        op: Op::Register { holder, fence },
                        outcome: outcome(*o),
                    },
                    Source {
                        op: Some(op.clone()),
                        process,
                        name: Some(name),
                        what: format!("{op}'s registration of fence {fence}: {}", outcome_word(*o)),
                        lines: vec![from, line],
                    },
                );
            }
            Entry::Read { op, value, .. } => {
                let Some(cy) = cycles.get_mut(op) else {
                    continue;
                };
                let invoked = cy.last;
                cy.last = t;
                let (name, process) = (cy.name.clone(), cy.process.clone());
                let n = c.name(&name);
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked,
                        completed: Some(t),
                        op: Op::Read,
                        outcome: MOutcome::Value(*value),
                    },
                    Source {
                        op: Some(op.clone()),
                        process,
                        name: Some(name),
                        what: format!("{op}'s read of the resource: {value}"),
                        lines: vec![line],
                    },
                );
            }
            Entry::Write {
                op, fence, value, ..
            } => {
                if let Some(cy) = cycles.get_mut(op) {
                    cy.write = Some((t, line, *fence, *value));
                }
            }
            Entry::Written { op, outcome: o } => {
                let Some(cy) = cycles.get_mut(op) else {
                    continue;
                };
                let Some((invoked, from, fence, value)) = cy.write.take() else {
                    continue;
                };
                cy.last = t;
                let (holder, name, process) =
                    (cy.holder.unwrap_or(0), cy.name.clone(), cy.process.clone());
                let n = c.name(&name);
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked,
                        completed: Some(t),
                        op: Op::Write {
                            holder,
                            fence,
                            value,
                        },
                        outcome: outcome(*o),
                    },
                    Source {
                        op: Some(op.clone()),
                        process,
                        name: Some(name),
                        what: format!(
                            "{op}'s write of {value} with fence {fence}: {}",
                            outcome_word(*o)
                        ),
                        lines: vec![from, line],
                    },
                );
            }
            Entry::Release { op, .. } => {
                if let Some(cy) = cycles.get_mut(op) {
                    cy.release = Some((t, line));
                }
            }
            Entry::ReleaseDone { op, outcome: o } => {
                let Some(cy) = cycles.remove(op) else {
                    continue;
                };
                let Some((invoked, from)) = cy.release else {
                    continue;
                };
                let Some(holder) = cy.holder else { continue };
                let n = c.name(&cy.name);
                let (seen, word) = match o {
                    Released::Released => (MOutcome::Released, "released"),
                    Released::NotOurs => (MOutcome::NotOurs, "not ours"),
                    Released::Unknown => (MOutcome::Unknown, "no reply"),
                };
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked,
                        completed: Some(t),
                        op: Op::Release {
                            holder,
                            fence: cy.fence,
                        },
                        outcome: seen,
                    },
                    Source {
                        op: Some(op.clone()),
                        process: cy.process.clone(),
                        name: Some(cy.name.clone()),
                        what: format!("{op}'s release (fence {}): {word}", cy.fence),
                        lines: vec![from, line],
                    },
                );
            }
            Entry::Observed {
                name,
                holder,
                fence,
                sent,
                ..
            } => {
                let n = c.name(name);
                let seen = holder.as_deref().map(|h| trace::Seen {
                    holder: c.holder(h),
                    fence: *fence,
                });
                let what = match (holder, fence) {
                    (Some(h), Some(f)) => format!(
                        "an observation of {name}: held by holder {} with fence {f}",
                        short(h)
                    ),
                    (Some(h), None) => {
                        format!("an observation of {name}: held by holder {}", short(h))
                    }
                    (None, _) => format!("an observation of {name}: free"),
                };
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked: *sent,
                        completed: Some(t),
                        op: Op::Observe,
                        outcome: MOutcome::Lock(seen),
                    },
                    Source {
                        op: None,
                        process: ev.p.clone(),
                        name: Some(name.clone()),
                        what,
                        lines: vec![line],
                    },
                );
            }
            Entry::Revoke {
                name,
                sent,
                fence,
                deposed,
                deposed_fence,
                sealed,
                error,
                ..
            } => {
                let n = c.name(name);
                let revoked = match (error, fence) {
                    (None, _) => MOutcome::Revoked {
                        fence: *fence,
                        deposed: match deposed {
                            Some(h) => Deposed::Holder(trace::Seen {
                                holder: c.holder(h),
                                fence: *deposed_fence,
                            }),
                            None => Deposed::Nobody,
                        },
                    },
                    (Some(_), Some(_)) => MOutcome::Revoked {
                        fence: *fence,
                        deposed: Deposed::Unknown,
                    },
                    (Some(_), None) => MOutcome::Unknown,
                };
                let what = match (error, fence, deposed) {
                    (None, Some(f), Some(h)) => format!(
                        "a revoke of {name}: revocation fence {f}, deposed holder {}",
                        short(h)
                    ),
                    (None, Some(f), None) => {
                        format!("a revoke of {name}: revocation fence {f}, the lock was free")
                    }
                    (_, Some(f), _) => format!("a revoke of {name}: revocation fence {f}, failed"),
                    _ => format!("a revoke of {name}: failed"),
                };
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked: *sent,
                        completed: Some(t),
                        op: Op::Revoke,
                        outcome: revoked,
                    },
                    Source {
                        op: None,
                        process: ev.p.clone(),
                        name: Some(name.clone()),
                        what,
                        lines: vec![line],
                    },
                );
                if let (Some(o), Some(f)) = (sealed, fence) {
                    c.push(
                        MEvent {
                            client,
                            name: Some(n),
                            invoked: *sent,
                            completed: Some(t),
                            op: Op::Seal { fence: *f },
                            outcome: outcome(*o),
                        },
                        Source {
                            op: None,
                            process: ev.p.clone(),
                            name: Some(name.clone()),
                            what: format!(
                                "the revoke's seal of {name}'s resource at fence {f}: {}",
                                outcome_word(*o)
                            ),
                            lines: vec![line],
                        },
                    );
                }
            }
            Entry::NemesisStart {
                kind,
                target,
                data_loss,
                rollback,
                ..
            } if *data_loss || *rollback => {
                let floors = if grants_replicated {
                    granted.clone()
                } else {
                    HashMap::new()
                };
                nemeses.insert(
                    (kind.clone(), target.clone()),
                    (t, line, *data_loss, *rollback, floors),
                );
            }
            Entry::NemesisEnd {
                kind,
                target,
                error,
                ..
            } => {
                let Some((start, from, lost, rollback, floors)) =
                    nemeses.remove(&(kind.clone(), target.clone()))
                else {
                    continue;
                };
                let done = if error.is_some() {
                    MOutcome::Unknown
                } else {
                    MOutcome::Done
                };
                fault(
                    &mut c,
                    (start, Some(t)),
                    (kind, done, lost, rollback, &floors),
                    (client, &ev.p, vec![from, line]),
                );
            }
            Entry::Final {
                name,
                value,
                fence,
                holder,
                ..
            } => {
                let n = c.name(name);
                let h = holder.as_deref().map(|h| {
                    if h == fencelock::REVOKED_HOLDER {
                        SEALED
                    } else {
                        c.holder(h)
                    }
                });
                c.push(
                    MEvent {
                        client,
                        name: Some(n),
                        invoked: t,
                        completed: Some(t),
                        op: Op::Final,
                        outcome: MOutcome::Resource {
                            value: *value,
                            fence: *fence,
                            holder: h,
                        },
                    },
                    Source {
                        op: None,
                        process: ev.p.clone(),
                        name: Some(name.clone()),
                        what: format!(
                            "the final read of {name}'s resource: value {value}, fence {}",
                            fence.map_or("none".to_string(), |f| f.to_string())
                        ),
                        lines: vec![line],
                    },
                );
            }
            _ => {}
        }
    }
    // What the end of the run cut short: indeterminate.
    let mut open: Vec<(String, Cycle)> = cycles.into_iter().collect();
    open.sort_by_key(|(_, cy)| cy.acquire_line);
    for (op, cy) in open {
        let client = c.process(&cy.process);
        let n = c.name(&cy.name);
        let base = Source {
            op: Some(op.clone()),
            process: cy.process.clone(),
            name: Some(cy.name.clone()),
            what: String::new(),
            lines: Vec::new(),
        };
        let cut = |c: &mut Convert, invoked: i64, line: usize, op_: Op, what: String| {
            c.push(
                MEvent {
                    client,
                    name: Some(n),
                    invoked,
                    completed: None,
                    op: op_,
                    outcome: MOutcome::Unknown,
                },
                Source {
                    what,
                    lines: vec![line],
                    ..base.clone()
                },
            );
        };
        let Some(holder) = cy.holder else {
            let h = c.nameless(&op);
            cut(
                &mut c,
                cy.acquired,
                cy.acquire_line,
                Op::Acquire { holder: h },
                format!("{op}'s acquisition of {} (cut short)", cy.name),
            );
            continue;
        };
        if let Some((t, line, fence)) = cy.register {
            cut(
                &mut c,
                t,
                line,
                Op::Register { holder, fence },
                format!("{op}'s registration of fence {fence} (cut short)"),
            );
        }
        if let Some((t, line, fence, value)) = cy.write {
            cut(
                &mut c,
                t,
                line,
                Op::Write {
                    holder,
                    fence,
                    value,
                },
                format!("{op}'s write of {value} with fence {fence} (cut short)"),
            );
        }
        if let Some((t, line)) = cy.release {
            cut(
                &mut c,
                t,
                line,
                Op::Release {
                    holder,
                    fence: cy.fence,
                },
                format!("{op}'s release (cut short)"),
            );
        }
    }
    let mut left: Vec<((String, Option<String>), Open)> = nemeses.into_iter().collect();
    left.sort_by_key(|(_, o)| o.1);
    for ((kind, _), (start, from, lost, rollback, floors)) in left {
        let client = c.process("nemesis");
        fault(
            &mut c,
            (start, None),
            (&kind, MOutcome::Unknown, lost, rollback, &floors),
            (client, "nemesis", vec![from]),
        );
    }
    c
}

/// The model operations of a nemesis window that lost the data or rolled
/// back a failover.
fn fault(
    c: &mut Convert,
    (start, end): (i64, Option<i64>),
    (kind, done, lost, rollback, floors): (&str, MOutcome, bool, bool, &HashMap<String, u64>),
    (client, process, lines): (u32, &str, Vec<usize>),
) {
    let source = |what: String| Source {
        op: None,
        process: process.to_string(),
        name: None,
        what,
        lines: lines.clone(),
    };
    if lost {
        c.push(
            MEvent {
                client,
                name: None,
                invoked: start,
                completed: end,
                op: Op::LoseData,
                outcome: done,
            },
            source(format!("{kind}: the lock server's data lost")),
        );
    }
    if rollback {
        for (n, name) in c.name_list.clone().into_iter().enumerate() {
            c.push(
                MEvent {
                    client,
                    name: Some(n as u32),
                    invoked: start,
                    completed: end,
                    op: Op::Failover {
                        floor: floors.get(&name).copied(),
                    },
                    outcome: MOutcome::Done,
                },
                source(format!("{kind}: a replica promoted")),
            );
        }
    }
}

/// The timing the model allows, from the header (see the module docs).
fn params(history: &History, labels: Vec<String>) -> Params {
    let header = history.header();
    let ttl = header.map_or(300_000, |h| i64::try_from(h.ttl_ms).unwrap_or(0) * 1000);
    let mode = header.map_or("notify", |h| h.mode.as_str());
    let waiter_lease = i64::try_from(fencelock::DEFAULT_WAITER_LEASE.as_micros()).unwrap_or(0);
    let notify = i64::try_from(fencelock::NOTIFY_HANDOVER_LEASE.as_micros()).unwrap_or(0);
    let handover = match mode {
        "poll" => ttl,
        "fair" => ttl.min(waiter_lease),
        _ => ttl.min(waiter_lease).min(notify),
    };
    let drift = ttl / 100 + 2_000;
    let mut params = Params::new((handover - drift).max(0));
    // A Sentinel or Cluster connection may send a call again after an I/O
    // error or a failover.
    params.repeated_releases = header.is_some_and(|h| h.replicas > 0 || h.topology == "cluster");
    params.labels = labels;
    params.units_per_second = Some(1e6);
    params
}

/// Replays `history` through the model within `bounds`.
pub fn replay(history: &History, bounds: Bounds) -> ModelCheck {
    let started = Instant::now();
    let header = history.header();
    let control = header
        .and_then(|h| h.unsafe_variant.clone())
        .map(|v| format!("a negative control ({v}): its broken part is not the store the model holds, and may be unexplained"));
    if header.is_some_and(|h| h.fence_mode == "revision" || h.topology == "etcd") {
        return ModelCheck {
            verdict: Verdict::Unknown {
                step: None,
                why: "a history on etcd: the model is of the Redis store".to_string(),
                states: 0,
            },
            operations: 0,
            names: 0,
            elapsed: started.elapsed(),
            bounds,
            at: None,
            note: Some(
                "the etcd recipe (a key per contender, fences from create revisions) is not modelled"
                    .to_string(),
            ),
        };
    }
    if header.is_some_and(|h| h.permits.is_some()) {
        return ModelCheck {
            verdict: Verdict::Unknown {
                step: None,
                why: "a semaphore history: the trace model is of the mutex's store".to_string(),
                states: 0,
            },
            operations: 0,
            names: 0,
            elapsed: started.elapsed(),
            bounds,
            at: None,
            note: Some(
                "the semaphore is specified by its own model (fencelock_model::semaphore), which does not replay histories"
                    .to_string(),
            ),
        };
    }
    if header.is_some_and(|h| h.rwlock_reads.is_some()) {
        return ModelCheck {
            verdict: Verdict::Unknown {
                step: None,
                why: "a read-write lock history: the trace model is of the mutex's store".to_string(),
                states: 0,
            },
            operations: 0,
            names: 0,
            elapsed: started.elapsed(),
            bounds,
            at: None,
            note: Some(
                "readers sharing a name and their validated reads are not modelled; the checkers C1-C12 judge the history"
                    .to_string(),
            ),
        };
    }
    let converted = convert(history);
    let Convert {
        steps,
        sources,
        name_list,
        labels,
        ..
    } = converted;
    let params = params(history, labels);
    let verdict = trace::explain(&steps, &params, &bounds);
    let step = match &verdict {
        Verdict::Unexplained { step, .. } => Some(*step),
        Verdict::Unknown { step, .. } => *step,
        Verdict::Explained { .. } => None,
    };
    let at = step.and_then(|i| {
        let (s, source) = (steps.get(i)?, sources.get(i)?);
        Some(Step {
            at: s.completed.unwrap_or(s.invoked),
            op: source.op.clone(),
            process: source.process.clone(),
            what: source.what.clone(),
            context: context(history, source, s.completed.unwrap_or(s.invoked)),
        })
    });
    ModelCheck {
        verdict,
        operations: steps.len(),
        names: name_list.len(),
        elapsed: started.elapsed(),
        bounds,
        at,
        note: control,
    }
}

/// The lines of `source`'s operation, and of its lock name (its cycles,
/// observations, revokes) and the nemeses in the 30 lines before `at`.
fn context(history: &History, source: &Source, at: i64) -> Vec<String> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    for ev in &history.events {
        if let Entry::Acquire { op, name } = &ev.e {
            names.insert(op, name);
        }
    }
    let of_name = |ev: &Event| -> bool {
        let Some(name) = source.name.as_deref() else {
            return true;
        };
        match &ev.e {
            Entry::Observed { name: n, .. }
            | Entry::Revoke { name: n, .. }
            | Entry::Final { name: n, .. } => n == name,
            Entry::NemesisStart { .. } | Entry::NemesisEnd { .. } => true,
            Entry::Audit { .. } | Entry::Header(_) | Entry::End { .. } => false,
            _ => ev
                .op()
                .and_then(|op| names.get(op))
                .is_some_and(|n| *n == name),
        }
    };
    let mut picked: Vec<usize> = history
        .events
        .iter()
        .enumerate()
        .filter(|(_, ev)| ev.t <= at && of_name(ev))
        .map(|(i, _)| i)
        .collect();
    let keep = picked.len().saturating_sub(30);
    picked.drain(..keep);
    for &line in &source.lines {
        if !picked.contains(&line) {
            picked.push(line);
        }
    }
    if let Some(op) = &source.op {
        for (i, ev) in history.events.iter().enumerate() {
            if ev.op() == Some(op.as_str()) && ev.t <= at && !picked.contains(&i) {
                picked.push(i);
            }
        }
    }
    picked.sort_unstable();
    picked
        .iter()
        .filter_map(|&i| history.events.get(i))
        .map(Event::to_line)
        .collect()
}

impl ModelCheck {
    /// Whether the model explained the history.
    pub fn explained(&self) -> bool {
        matches!(self.verdict, Verdict::Explained { .. })
    }

    /// Whether the model found an operation it cannot explain.
    pub fn unexplained(&self) -> bool {
        matches!(self.verdict, Verdict::Unexplained { .. })
    }

    /// Operations explained per second of search.
    pub fn rate(&self) -> f64 {
        self.operations as f64 / self.elapsed.as_secs_f64().max(1e-6)
    }

    /// `explained`, `unexplained` or `unknown`.
    pub fn word(&self) -> &'static str {
        match self.verdict {
            Verdict::Explained { .. } => "explained",
            Verdict::Unexplained { .. } => "unexplained",
            Verdict::Unknown { .. } => "unknown",
        }
    }

    /// The verdict in lines of text (after the checkers' verdict).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let figures = format!(
            "{} operations on {} name(s), {} states visited in {:.2} s ({:.0} operations/s)",
            self.operations,
            self.names,
            self.verdict.states(),
            self.elapsed.as_secs_f64(),
            self.rate()
        );
        match &self.verdict {
            Verdict::Explained { .. } => {
                out += &format!(
                    "model: explained: the store's transitions explain every operation ({figures})\n"
                );
            }
            Verdict::Unexplained { why, .. } => {
                let (when, what) = self.at.as_ref().map_or((0.0, String::new()), |a| {
                    (a.at as f64 / 1e6, a.what.clone())
                });
                out += &format!("model: UNEXPLAINED at {when:.3} s: {what}: {why} ({figures})\n");
                for line in self.at.iter().flat_map(|a| &a.context) {
                    out += &format!("  {line}\n");
                }
            }
            Verdict::Unknown { why, .. } => {
                let at = self.at.as_ref().map_or(String::new(), |a| {
                    format!(" at {:.3} s ({})", a.at as f64 / 1e6, a.what)
                });
                out += &format!(
                    "model: UNKNOWN{at}: {why}; everything before it was explained ({figures})\n"
                );
            }
        }
        if let Some(note) = &self.note {
            out += &format!("model note: {note}\n");
        }
        out
    }

    /// The verdict as JSON (the `model` object of `--json`).
    pub fn to_json(&self) -> Value {
        let (why, unknown) = match &self.verdict {
            Verdict::Unexplained { why, .. } => (Some(why.clone()), None),
            Verdict::Unknown { why, .. } => (None, Some(why.clone())),
            Verdict::Explained { .. } => (None, None),
        };
        let at = self.at.as_ref().map(|a| {
            json!({
                "at_s": a.at as f64 / 1e6,
                "op": a.op,
                "process": a.process,
                "what": a.what,
                "why": why,
                "context": a.context.iter()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap_or(Value::String(l.clone())))
                    .collect::<Vec<_>>(),
            })
        });
        json!({
            "verdict": self.word(),
            "operations": self.operations,
            "names": self.names,
            "states": self.verdict.states(),
            "elapsed_s": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "operations_per_s": self.rate().round(),
            "bounds": {
                "max_open": self.bounds.max_open,
                "max_states": self.bounds.max_states,
            },
            "first_unexplained": if self.unexplained() { at.clone() } else { None },
            "unknown_because": unknown,
            "stopped_at": if self.unexplained() { None } else { at },
            "note": self.note,
        })
    }
}
