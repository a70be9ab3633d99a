//! The wait modes against a real `redis-server` (one per test), a file per
//! mode and one each for what they share:
//!
//! - `poll`: a poller costs Redis many script calls while it waits (the
//!   negative control of notify's silence);
//! - `notify`: a waiter sleeps until the release wakes it, and still
//!   acquires when the wake-up is lost (no release message; its
//!   subscription killed; Redis restarted, or down for a while; its idle
//!   subscription dropped), or when the head ahead of it was SIGKILLed;
//! - `fair`: waiters are granted in queue order; a SIGKILLed, timed-out or
//!   cancelled waiter does not hold up the ones behind it; a long-lease head
//!   keeps its place; `try_acquire` honours the queue;
//! - `handover`: a release hands the lock to the head of the queue (fair
//!   always, notify once the head has waited 10 ms), the new holder renews
//!   it to its full ttl, a lost hand-over message is picked up by the
//!   waiter's retry, and a hand-over wake-up is trusted only with a fence
//!   above the one the waiter saw refused;
//! - `common`: in every mode, no overlapping holders and strictly
//!   increasing fences over 10,000 contended grants; without pub/sub
//!   permission, waiters fall back to polling and a release never fails.
//!
//! The lock's keys and the fixture the tests share are in
//! `support::fixture`. Fair- and notify-mode worker processes need
//! `cargo build -p fencelock-testkit --bins` (nextest builds them with the
//! workspace).

use std::time::Duration;

mod common;
mod fair;
mod handover;
mod notify;
mod poll;

/// Allowance for scheduling on a loaded 2-core machine, added to every upper
/// bound that the design derives from leases and retry intervals.
const SLACK: Duration = Duration::from_millis(400);

/// Longest accepted release → grant time of a woken waiter. The waiters of
/// these tests would otherwise retry only after seconds (their waiter lease
/// is long), so only the wake-up can explain a grant this fast.
const WAKE_BOUND: Duration = Duration::from_millis(100);
