//! The history of a run: one [`Event`] per line of JSON (`--history FILE`).
//!
//! Every process stamps its events with the run's monotonic clock
//! ([`crate::clock`]), in µs since the start (`t`). `p` names the process:
//! `w0`, `w1`, … for workers, `nemesis`, `observer` (the poller of the lock
//! keys), `resource` (the audit and final state read at the end) and `run`
//! (the header and the end). `ev` says what happened; the other fields
//! depend on it ([`Entry`]). Lines are written as they arrive, so their
//! order is not `t` order; checkers sort. Holder tokens (secrets) never
//! appear: only public holder ids.
//!
//! ```text
//! {"t":0,"p":"run","ev":"header","seed":7,...}
//! {"t":10433,"p":"w3","ev":"acquire","op":"w3.1","name":"t0"}
//! {"t":10981,"p":"w3","ev":"granted","op":"w3.1","name":"t0","fence":1712...,"holder":"3f2a...","valid_until":307911}
//! {"t":11012,"p":"observer","ev":"observed","name":"t0","holder":"3f2a...","fence":1712...,"sent":10990}
//! {"t":512001,"p":"nemesis","ev":"nemesis_start","kind":"pause-worker","target":"w3","detail":"SIGSTOP for 540 ms","data_loss":false}
//! ```

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// µs since the start of the run (`CLOCK_MONOTONIC`).
    pub t: i64,
    /// The process that recorded it.
    pub p: String,
    /// What happened.
    #[serde(flatten)]
    pub e: Entry,
}

/// The outcome of a fenced register or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The resource applied it.
    Accepted,
    /// The resource refused it as stale.
    Stale,
    /// No reply (an error): it may or may not have been applied.
    Unknown,
}

/// The outcome of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Released {
    /// The lock was ours and was deleted.
    Released,
    /// The lock was no longer ours; nothing was deleted.
    NotOurs,
    /// No reply (an error).
    Unknown,
}

/// One holder of a read-write lock, as the observer saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Holding {
    /// The public holder id.
    pub holder: String,
    /// The writer's fence, or the reader's write epoch.
    pub fence: Option<u64>,
    /// `read` or `write` (none: the store showed a plain holder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
}

/// What the run was configured with (the first line of every history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The fencelock version that ran.
    pub version: String,
    /// The seed of the nemesis schedule and of the workers' choices.
    pub seed: u64,
    /// The topology (`single`, `sentinel`, `cluster`, `remote`).
    pub topology: String,
    /// Worker processes.
    pub workers: usize,
    /// The lock names (each with its own resource).
    pub names: Vec<String>,
    /// Lease ttl in ms.
    pub ttl_ms: u64,
    /// Renewal interval in ms.
    pub renewal_ms: u64,
    /// Wait mode (`poll`, `notify`, `fair`).
    pub mode: String,
    /// Fence mode (`clock`, `counter`).
    pub fence_mode: String,
    /// Key layout (`default`, `guide`).
    pub layout: String,
    /// The resource (`redis`, `postgres`).
    pub resource: String,
    /// The negative control, if this run is one (never the default).
    pub unsafe_variant: Option<String>,
    /// The nemeses enabled.
    pub nemeses: Vec<String>,
    /// The planned duration in ms.
    pub duration_ms: u64,
    /// Replicas per shard of the lock server (0: none).
    #[serde(default)]
    pub replicas: u32,
    /// How many replicas acknowledged each grant before the workers used
    /// it (0: no wait).
    #[serde(default)]
    pub wait_replicas: u32,
    /// The semaphore's permit count (`--primitive semaphore --permits N`);
    /// absent for a mutex run. Its grants, observations, audit entries and
    /// final states then carry their slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// The share of read leases in percent of a read-write lock run
    /// (`--primitive rwlock`); absent for a mutex or a semaphore. Its
    /// grants then carry their access, its readers' validated reads are
    /// `validated_read` events and the observer records every holder of a
    /// name (`observed_holders`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rwlock_reads: Option<u32>,
    /// What implements each worker, by index (`rust`: this crate's worker;
    /// `python`: the Python package's, `fencelock torture
    /// --python-workers`); absent when every worker is this crate's. The
    /// report then counts the operations per kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_kinds: Option<Vec<String>>,
}

/// What an event says. Times (`valid_until`, `sent`) are on the run's axis,
/// like `t`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Entry {
    /// The run's configuration.
    Header(Header),
    /// A worker starts to acquire `name` (operation `op`, one lease cycle).
    Acquire {
        /// Operation id, unique in the run (`w3.17`).
        op: String,
        /// Lock name.
        name: String,
    },
    /// The lock was granted.
    Granted {
        /// Operation id.
        op: String,
        /// Lock name.
        name: String,
        /// The fence of the grant.
        fence: u64,
        /// The public holder id of the grant's token.
        holder: String,
        /// Until when the lease is valid, as the holder computes it from
        /// Redis's reply (sent time + ttl − drift margin).
        valid_until: i64,
        /// The semaphore slot granted (`--primitive semaphore`); absent
        /// for a mutex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
        /// The side of a read-write lock asked for and granted (`read` or
        /// `write`, `--primitive rwlock`); absent for a mutex or a
        /// semaphore. A reader's `fence` is its write epoch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        access: Option<String>,
    },
    /// The acquisition failed (timed out, granted too late, an error).
    AcquireFailed {
        /// Operation id.
        op: String,
        /// Lock name.
        name: String,
        /// What went wrong.
        error: String,
    },
    /// The fence is registered at the resource before reading.
    Register {
        /// Operation id.
        op: String,
        /// The fence.
        fence: u64,
        /// Lease validity (see `Granted`) when sent.
        valid_until: i64,
    },
    /// What the registration got.
    Registered {
        /// Operation id.
        op: String,
        /// Accepted, stale or unknown.
        outcome: Outcome,
    },
    /// The resource's counter was read.
    Read {
        /// Operation id.
        op: String,
        /// The value read.
        value: i64,
        /// Lease validity when the read returned.
        valid_until: i64,
    },
    /// A reader's validated read of the resource (`--primitive rwlock`)
    /// returned (`t`): the counter, the fence the resource stored, and
    /// whether the reader judged the read clean (stored fence absent or at
    /// most its epoch, the lease's fence).
    ValidatedRead {
        /// Operation id.
        op: String,
        /// The reader's write epoch (its lease's fence).
        epoch: u64,
        /// When the read was sent.
        sent: i64,
        /// The counter read.
        value: i64,
        /// The fence the resource stored, as the read returned it (none:
        /// nothing stored, or not read: the `unvalidated-read` control).
        fence: Option<u64>,
        /// Whether the reader reported the read clean.
        clean: bool,
        /// Lease validity when sent.
        valid_until: i64,
    },
    /// A fenced write of `value` (= `read` + 1) is sent.
    Write {
        /// Operation id.
        op: String,
        /// The fence.
        fence: u64,
        /// The value the worker read.
        read: i64,
        /// The value it writes.
        value: i64,
        /// Lease validity when sent.
        valid_until: i64,
    },
    /// What the write got.
    Written {
        /// Operation id.
        op: String,
        /// Accepted, stale or unknown.
        outcome: Outcome,
    },
    /// The worker starts to release (its critical section ends here).
    Release {
        /// Operation id.
        op: String,
        /// Lease validity when sent.
        valid_until: i64,
    },
    /// What the release got.
    ReleaseDone {
        /// Operation id.
        op: String,
        /// Released, not ours, unknown.
        outcome: Released,
    },
    /// The lease's loss signal fired.
    Lost {
        /// Operation id.
        op: String,
        /// Why, as the lock reported it.
        reason: String,
    },
    /// A nemesis begins.
    NemesisStart {
        /// Its kind (`pause-server`, `kill-wipe`, …).
        kind: String,
        /// The worker it targets, if any.
        target: Option<String>,
        /// Parameters, in words.
        detail: String,
        /// Whether it makes the lock server lose its data.
        data_loss: bool,
        /// Whether it moves the primary to a replica (a failover), which
        /// loses the writes the replica had not received: those no grant
        /// waited for (renewals, releases), and grants too when the workers
        /// wait for fewer than every replica.
        #[serde(default)]
        rollback: bool,
    },
    /// A nemesis ends (the fault is healed).
    NemesisEnd {
        /// Its kind.
        kind: String,
        /// The worker it targeted, if any.
        target: Option<String>,
        /// What it did, where that is only known at the end (a failover:
        /// the old and the new primary).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<String>,
        /// Why it could not be carried out (fully), if it could not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A `revoke` nemesis's revoke returned (`t`): who was deposed, at
    /// which revocation fence, and how the name's audited resource was
    /// sealed. From `t` on, every write with a fence up to `fence` must be
    /// refused (C1), unless the revoke failed (`error`).
    Revoke {
        /// Lock name.
        name: String,
        /// When the revoke was sent.
        sent: i64,
        /// The revocation fence, if one was minted.
        fence: Option<u64>,
        /// The public holder id of the holder deposed (none: the lock was
        /// free).
        deposed: Option<String>,
        /// The deposed holder's fence, when the lock store told it.
        deposed_fence: Option<u64>,
        /// The worker that held the name, SIGSTOPped from the nemesis's
        /// start until `t`.
        worker: Option<String>,
        /// The other workers, SIGSTOPped from the nemesis's start to its
        /// end.
        #[serde(default)]
        paused: Vec<String>,
        /// The seal of the name's audited resource: accepted, stale (a
        /// later holder had written a greater fence, which refuses the
        /// deposed holder as well) or unknown (it failed); none when the
        /// run does not seal (the `revoke-without-seal` control).
        sealed: Option<Outcome>,
        /// Why the revoke failed (or left the resource unsealed).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The observer saw the lock key of `name` change (`t` = reply time).
    Observed {
        /// Lock name.
        name: String,
        /// The public holder id in the key, or none if the key is absent.
        holder: Option<String>,
        /// The fence in the key's value (hash-tagged layout), if any.
        fence: Option<u64>,
        /// When the poll that saw it was sent.
        sent: i64,
        /// The semaphore slot observed (`--primitive semaphore`); absent
        /// for a mutex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// The observer saw the holders of read-write lock `name` change
    /// (`--primitive rwlock`; `t` = reply time): every holder now, the
    /// writer or the readers.
    ObservedHolders {
        /// Lock name.
        name: String,
        /// Who holds it now (empty: nobody).
        holders: Vec<Holding>,
        /// When the poll that saw it was sent.
        sent: i64,
    },
    /// One accepted write as the resource recorded it, in the same
    /// script/transaction as the write (read at the end of the run).
    Audit {
        /// Lock name (the resource's).
        name: String,
        /// Position in the resource's audit log, from 1.
        seq: u64,
        /// The writing operation.
        op: String,
        /// The writing worker.
        worker: String,
        /// The write's fence.
        fence: u64,
        /// The writer's public holder id.
        holder: String,
        /// The value the writer had read.
        read: i64,
        /// The stored value just before the write.
        before: i64,
        /// The value written.
        after: i64,
        /// The semaphore slot written: its partition and its (fence,
        /// holder) pair (`--primitive semaphore`); absent for a mutex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// The resource's final state (read at the end of the run).
    Final {
        /// Lock name (the resource's).
        name: String,
        /// The counter.
        value: i64,
        /// The stored fence.
        fence: Option<u64>,
        /// The stored holder id.
        holder: Option<String>,
        /// The semaphore slot whose state this is (`--primitive
        /// semaphore`); absent for a mutex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// The run ended.
    End {
        /// Why (`duration reached`, `violation found`, `interrupted`).
        reason: String,
    },
}

impl Event {
    /// One JSON line (without the newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The operation this event belongs to, if any.
    pub fn op(&self) -> Option<&str> {
        match &self.e {
            Entry::Acquire { op, .. }
            | Entry::Granted { op, .. }
            | Entry::AcquireFailed { op, .. }
            | Entry::Register { op, .. }
            | Entry::Registered { op, .. }
            | Entry::Read { op, .. }
            | Entry::ValidatedRead { op, .. }
            | Entry::Write { op, .. }
            | Entry::Written { op, .. }
            | Entry::Release { op, .. }
            | Entry::ReleaseDone { op, .. }
            | Entry::Lost { op, .. }
            | Entry::Audit { op, .. } => Some(op),
            _ => None,
        }
    }
}

/// A whole history, sorted by time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The events, sorted by `t` (stable: lines with equal `t` keep their
    /// order).
    pub events: Vec<Event>,
}

impl History {
    /// A history of `events` (sorted here).
    pub fn new(mut events: Vec<Event>) -> Self {
        events.sort_by_key(|e| e.t);
        History { events }
    }

    /// The header, if the history has one.
    pub fn header(&self) -> Option<&Header> {
        self.events.iter().find_map(|e| match &e.e {
            Entry::Header(h) => Some(h),
            _ => None,
        })
    }

    /// Reads a history file: JSON lines, blank lines skipped. A last line
    /// cut short (the run was killed while writing it) is ignored.
    ///
    /// # Errors
    /// [`ErrorKind::History`] if the file cannot be read or a line (other
    /// than a cut-off last one) is not an event.
    pub fn read(path: &Path) -> Result<Self> {
        let shown = path.display();
        let file = std::fs::File::open(path)
            .map_err(|e| Error::new(ErrorKind::History, format!("cannot read {shown}: {e}")))?;
        let lines: Vec<String> = std::io::BufReader::new(file)
            .lines()
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::new(ErrorKind::History, format!("cannot read {shown}: {e}")))?;
        let last = lines.len();
        let mut events = Vec::with_capacity(lines.len());
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(line) {
                Ok(event) => events.push(event),
                Err(_) if i + 1 == last && !line.ends_with('}') => {}
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::History,
                        format!("{shown} line {}: not a history event: {e}", i + 1),
                    ));
                }
            }
        }
        if events.is_empty() {
            return Err(Error::new(
                ErrorKind::History,
                format!("{shown} holds no history events"),
            ));
        }
        Ok(History::new(events))
    }
}

/// Writes events to a history file as they arrive.
#[derive(Debug)]
pub(crate) struct HistoryFile {
    out: std::io::BufWriter<std::fs::File>,
}

impl HistoryFile {
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(|e| {
            Error::usage(format!(
                "--history {}: cannot create it: {e}",
                path.display()
            ))
        })?;
        Ok(HistoryFile {
            out: std::io::BufWriter::new(file),
        })
    }

    pub(crate) fn write(&mut self, event: &Event) {
        let _ = writeln!(self.out, "{}", event.to_line());
    }

    pub(crate) fn flush(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_json_lines() {
        let e = Event {
            t: 12,
            p: "w1".into(),
            e: Entry::Granted {
                op: "w1.1".into(),
                name: "t0".into(),
                fence: 5,
                holder: "ab".into(),
                valid_until: 99,
                slot: None,
                access: None,
            },
        };
        let line = e.to_line();
        assert!(
            line.starts_with("{\"t\":12,\"p\":\"w1\",\"ev\":\"granted\""),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Event>(&line).ok(), Some(e));
    }
}
