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
//!   always, notify once the head has waited 10 ms; a contended release is
//!   sent behind a `PING` so the head is woken first), the new holder renews
//!   it to its full ttl, a lost hand-over message is picked up by the
//!   waiter's retry, and a hand-over wake-up is trusted only with a fence
//!   above the one the waiter saw refused;
//! - `common`: in every mode, no overlapping holders and strictly
//!   increasing fences over 10,000 contended grants; without pub/sub
//!   permission, waiters fall back to polling and a release never fails.
//!
//! The lock's keys and the fixture the tests share are in
//! `support::fixture`. The waiters SIGKILLed at the head of a queue are lock
//! workers in processes of their own: this test binary re-run as
//! `support::worker`'s entry point, so they need nothing built beforehand.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{LockKeys, LockOptions};
use fencelock_testkit::{RedisServer, Worker};

use crate::support::Keys;
use crate::support::fixture::{Acquisition, Fixture};

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

/// The lock value right after a release that must have handed the lock (of
/// `keys`) to the waiter with `token`.
fn handed_over(server: &RedisServer, keys: &LockKeys, token: &str) -> Result<String> {
    let value = server
        .get(keys.lock())
        .context("the release handed the lock to nobody")?;
    ensure!(
        value.starts_with(&format!("{token}:")),
        "the release did not hand the lock to the waiter with token {token}: {value:?}"
    );
    Ok(value)
}

/// A lock worker in its own process (to SIGKILL) queued at the head of the
/// fixture's lock in `mode` (`notify` or `fair`) with waiter lease `wlease`,
/// renewing its place, and the fixture's waiter queued behind it with
/// `opts`: the worker, its queue member and the waiter's acquisition.
async fn worker_head_and_waiter_behind(
    f: &Fixture,
    mode: &str,
    wlease: Duration,
    opts: &LockOptions,
) -> Result<(Worker, String, Acquisition)> {
    let mut head = crate::support::worker::start(&f.server.url(), &["default", "clock"]);
    head.post(&format!(
        "acquire {} 10000 30000 renew {mode} wlease={}",
        f.name,
        wlease.as_millis()
    ));
    let member = f.queued(1).await?.remove(0);
    let waiter = f.spawn_waiter(opts);
    let q = f.queued(2).await?;
    ensure!(q[0] == member, "the worker is not the head: {q:?}");
    Ok((head, member, waiter))
}
