//! The report of a run: one header, then one record per scenario (and per
//! wait mode of a scenario that has them), in the order measured.

use std::time::Duration;

use crate::scenarios::{Contended, Cycles, Held, ReadWrite, Semaphore};

/// Everything one run measured. It grows record by record while the run
/// goes on (see [`crate::Observer::updated`]); a [`crate::Renderer`] shows it
/// as the human table or as JSON lines (all at once: [`Report::render`]).
#[derive(Debug, Clone)]
pub struct Report {
    /// What every record shares.
    pub header: Header,
    /// The records, in the order measured.
    pub records: Vec<Record>,
}

/// What every record of a run shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The Redis measured: its URL with the password replaced by `***`.
    pub redis: String,
    /// The measuring time of each contestant (and of each wait mode) per
    /// round.
    pub duration: Duration,
    /// Rounds of each scenario.
    pub rounds: usize,
    /// Why a placement of the client (see [`crate::Placement`]) was not
    /// measured, if one was not.
    pub placement_note: Option<String>,
}

/// One measured record.
#[derive(Debug, Clone)]
pub struct Record {
    /// The position in [`crate::Config::scenarios`] of the scenario that
    /// measured this record: consecutive records of one step form one block
    /// of the human table (the wait modes of `contended` share a heading and
    /// a footer).
    pub step: usize,
    /// What was measured.
    pub measurement: Measurement,
}

/// The result of one scenario, or of one wait mode of a scenario.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Measurement {
    /// `uncontended`: see [`Cycles`].
    Uncontended(Cycles),
    /// See [`Contended`].
    Contended(Contended),
    /// `many`: see [`Cycles`].
    Many(Cycles),
    /// See [`Held`].
    Held(Held),
    /// See [`Semaphore`].
    Semaphore(Semaphore),
    /// `rwlock`: see [`ReadWrite`].
    RwLock(ReadWrite),
}

impl Report {
    /// An empty report under `header`.
    pub fn new(header: Header) -> Self {
        Report {
            header,
            records: Vec::new(),
        }
    }

    /// The `contended` records (one per wait mode), in the order measured.
    pub fn contended(&self) -> impl Iterator<Item = &Contended> {
        self.records.iter().filter_map(|r| match &r.measurement {
            Measurement::Contended(c) => Some(c),
            _ => None,
        })
    }

    /// The `semaphore` records, in the order measured.
    pub fn semaphores(&self) -> impl Iterator<Item = &Semaphore> {
        self.records.iter().filter_map(|r| match &r.measurement {
            Measurement::Semaphore(s) => Some(s),
            _ => None,
        })
    }

    /// The `rwlock` records, in the order measured.
    pub fn rwlocks(&self) -> impl Iterator<Item = &ReadWrite> {
        self.records.iter().filter_map(|r| match &r.measurement {
            Measurement::RwLock(r) => Some(r),
            _ => None,
        })
    }

    /// Overlapping holders over the whole run (a semaphore's: more holders
    /// than permits; a read-write lock's: a writer with anyone else):
    /// anything but 0 is a broken lock.
    pub fn overlaps(&self) -> u64 {
        self.contended().map(|c| c.overlaps).sum::<u64>()
            + self
                .semaphores()
                .map(|s| s.semaphore.overlaps + s.mutex.overlaps)
                .sum::<u64>()
            + self
                .rwlocks()
                .map(|r| r.rwlock.overlaps + r.mutex.overlaps)
                .sum::<u64>()
    }

    /// Leases lost while held (`held`): anything but 0 is a failure.
    pub fn leases_lost(&self) -> u64 {
        self.records
            .iter()
            .filter_map(|r| match &r.measurement {
                Measurement::Held(h) => Some(h.leases_lost),
                _ => None,
            })
            .sum()
    }

    /// The SVG of the acquire-wait and handoff distributions of each
    /// `contended` wait mode, side by side (`fencelock bench --plot`).
    pub fn svg(&self) -> String {
        crate::plot::render(&self.contended().collect::<Vec<_>>())
    }
}
