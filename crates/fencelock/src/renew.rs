//! The keeper task of a lease: background renewal and the deadline watchdog.
//!
//! One task per lease. It renews every interval (compare-and-pexpire), moves
//! the local deadline forward on success, and declares the lease lost at once
//! when Redis says it is no longer ours, or when the local monotonic deadline
//! passes before a renewal succeeded (Redis paused or unreachable, or this
//! process stalled). With renewal off it only watches the deadline.
//!
//! Every wake-up of a renewing keeper measures how late it woke against its
//! schedule (the renewal lag: event-loop stalls, blocking calls, pauses of
//! the process) into `fencelock_renewal_lag_seconds` and the client's stats,
//! and warns once per lease when the lag exceeds a third of the ttl, with a
//! suggested ttl ("measure the pauses you actually have").
//!
//! It stops as soon as the lease is released or dropped. It sends a renewal
//! only while holding the lease's `renewing` lock and after checking that it
//! was not stopped; the release stops it and then takes that lock once, so
//! no renewal is sent after a release.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::backend::ops::Checked;
use crate::error::LossReason;
use crate::state::LeaseState;

/// Delay before retrying a renewal that failed with a transient error.
fn retry_delay(interval: Duration) -> Duration {
    (interval / 4).max(Duration::from_millis(5))
}

/// Keeps the lease granted at `started` (the schedule counts from there, not
/// from this task's first poll, which a busy event loop may delay).
///
/// `renew_now`: the lease was handed over for less than its ttl; the first
/// renewal brings it to the full ttl at once (even with renewal off, the
/// lease is owed its ttl once).
pub(crate) async fn keep(
    state: Arc<LeaseState>,
    started: Instant,
    interval: Option<Duration>,
    renew_now: bool,
    stop: CancellationToken,
) {
    let mut warned = false;
    let mut next = if renew_now {
        Some(Instant::now())
    } else {
        interval.map(|i| started + i)
    };
    loop {
        let deadline = state.deadline();
        let wake = next.map_or(deadline, |n| n.min(deadline));
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep_until(wake) => {}
        }
        // Released meanwhile (this task is not awaited by the release).
        if stop.is_cancelled() {
            return;
        }
        // How late this wake-up is: the process's pauses, measured.
        if interval.is_some() {
            let lag = Instant::now().saturating_duration_since(wake);
            state
                .metrics
                .renewal_lag(&state.grant.name, lag, state.grant.ttl);
        }
        // Re-read: a manual extend may have moved the deadline meanwhile.
        let deadline = state.deadline();
        if Instant::now() >= deadline {
            state.mark_lost(LossReason::DeadlinePassed);
            return;
        }
        let Some(due) = next else { continue };
        if Instant::now() < due {
            continue;
        }
        let _sending = state.renewing.lock().await;
        if stop.is_cancelled() {
            return;
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            reply = timeout_at(deadline, state.extend_once()) => match reply {
                Err(_deadline_passed) => {
                    state.mark_lost(LossReason::DeadlinePassed);
                    return;
                }
                Ok(Ok(Checked::Done)) => next = interval.map(|i| Instant::now() + i),
                Ok(Ok(Checked::NotOurs(reason))) => {
                    state.mark_lost(reason);
                    return;
                }
                Ok(Err(e)) => {
                    if e.is_config() && !warned {
                        // A missing permission (PEXPIRE) or a key of the
                        // wrong type will not cure itself: the lease will be
                        // lost at its deadline, and this says why.
                        warned = true;
                        tracing::warn!(lock = %state.grant.name, error = %e, "renewal refused; the lease will be lost at its deadline");
                    } else {
                        tracing::debug!(lock = %state.grant.name, error = %e, "renewal failed; retrying until the deadline");
                    }
                    let every = interval.unwrap_or(state.grant.ttl / 3);
                    next = Some(Instant::now() + retry_delay(every));
                }
            }
        }
    }
}
