//! The checkers: C1–C7, run on a [`History`] (at the end of a run, during
//! one to stop early, or on a saved `--history` file).
//!
//! | id | rule | evidence |
//! |---|---|---|
//! | C1 | no write accepted with a fence lower than an already accepted one (per resource; a revoke's seal counts as accepted), nor a write sent after a revoke returned with a fence at or below its revocation fence | the resource's audit, the revokes |
//! | C2 | no two different holders accepted with the same fence | the audit |
//! | C3 | no acknowledged write lost: every acknowledged write is in the audit, no accepted write overwrote an increment it had not read, and the counter equals the accepted increments | the workers' acknowledgements, the audit, the final state |
//! | C4 | mutual exclusion among valid holders: no two workers in their critical sections at once while both held leases Redis had not let expire | the workers' critical sections and lease validity (from Redis's replies: sent time + ttl − drift) |
//! | C5 | a worker whose lease was lost got its loss signal within one renewal interval (+ [`SLACK`]) of the loss being observable | the observer (the key gone or taken), worker pauses, the workers' loss signals and releases |
//! | C6 | fences strictly increasing in grant order per name (clock mode: also across restarts without persistence) | the observer's order of holders, and real-time order of grants |
//! | C7 | no lock key re-created after it ended (no zombie renewals) | the observer |
//!
//! Every checker counts what it checked, its violations, and what it
//! excused: only what docs/design.md §9 does not promise — mutual exclusion
//! across a restart that lost the lock server's data (C4), and counter-mode
//! fences across such a restart (C6). The first violation comes with the
//! surrounding history.
//!
//! On a replicated topology (Sentinel, Cluster) a failover (`failover`, and
//! `kill-wipe` of the primary, which a replica replaces) promotes a replica
//! that may lack the primary's last writes. What the workers waited for is
//! on every replica: their grants, when they wait for every replica of the
//! shard (the default). What nobody waited for may be rolled back: renewals
//! and releases always, grants too when the workers wait for fewer
//! replicas. So across a failover window the checkers excuse — and say so
//! in the result's notes — exactly what such a rollback explains:
//!
//! - C4: an overlap that disappears when each lease is taken as valid only
//!   as far as the writes that survive promise (its grant's own validity;
//!   nothing, from the failover on, when the grant itself was not waited
//!   for by every replica);
//! - C6: a lower fence observed after a failover, when the higher one
//!   belonged to a grant nobody was told of (a grant refused for lack of
//!   replica acknowledgements, released again) or, without the wait for
//!   every replica, a rolled-back grant; counter fences that repeat after a
//!   rolled-back grant (without that wait);
//! - C7: a released or expired key that is back after a failover (the
//!   release or expiry was rolled back; no renewal re-created it).
//!
//! C1–C3 (the resource, which no nemesis but `revoke`'s seal touches) are
//! never excused.
//!
//! A semaphore run (`--primitive semaphore --permits N`) is checked per
//! slot: C1–C7 as above on the history partitioned by slot (each slot a
//! lock with a resource of its own; C4 then says one valid holder per
//! slot), and across the slots of a name
//!
//! | id | rule | evidence |
//! |---|---|---|
//! | C8 | never more than N valid holders at once | the workers' critical sections and lease validity, as C4 computes them |
//! | C9 | no valid permit refused: no registration or write refused as stale while its permit was unexpired | the workers' invocations and refusals |
//!
//! (see `semaphore`).
//!
//! A read-write lock run (`--primitive rwlock`) is checked with C1–C3 on
//! the writers' audited writes, C4 and C6 among the writers (the observer's
//! writer as a mutex's key), C5 and C7 per holder (each reader and writer
//! followed apart in the observer's sets of holders), and across both
//! sides
//!
//! | id | rule | evidence |
//! |---|---|---|
//! | C10 | no writer in its critical section while a reader was in its own, both leases unexpired in the store | the workers' critical sections and lease validity, as C4 computes them |
//! | C11 | a validated read never reports a torn write as clean, and a read made while its lease was unexpired is clean | the readers' reads, the audit in its order, acknowledged writes, seals |
//! | C12 | a reader's epoch is at least every earlier writer's fence and below every later writer's | the grants in real-time order |
//!
//! (see `rwlock`).
//!
//! A `revoke` ends the deposed holder's lease in the lock store: C4 counts
//! that lease valid only until the revoke was sent (as a release ends one;
//! nothing is excused), and C1 checks that its late writes were refused.

mod index;
mod lock;
mod resource;
mod rwlock;
mod semaphore;
mod verdict;

pub use verdict::{CheckResult, SLACK, Violation};

use crate::history::History;
use index::Index;

/// Runs C1–C7 on `history` (a semaphore's: C1–C7 per slot, C8 and C9; a
/// read-write lock's: C1–C7 on writers and holders, C10–C12).
pub fn check(history: &History) -> Vec<CheckResult> {
    if let Some(permits) = history.header().and_then(|h| h.permits) {
        return semaphore::check(history, permits);
    }
    if history.header().is_some_and(|h| h.rwlock_reads.is_some()) {
        return rwlock::check(history);
    }
    let index = Index::new(history);
    vec![
        resource::c1(&index),
        resource::c2(&index),
        resource::c3(&index),
        lock::c4(&index),
        lock::c5(&index).0,
        lock::c6(&index),
        lock::c7(&index),
    ]
}

/// Loss-signal latencies (signal − observable, µs; negative when the holder
/// knew first), for the figures.
pub(crate) fn loss_latencies(history: &History) -> Vec<i64> {
    if history.header().is_some_and(|h| h.permits.is_some()) {
        return semaphore::loss_latencies(history);
    }
    if history.header().is_some_and(|h| h.rwlock_reads.is_some()) {
        return rwlock::loss_latencies(history);
    }
    lock::c5(&Index::new(history)).1
}

#[cfg(test)]
mod tests;
