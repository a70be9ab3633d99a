//! The engine's decisions about time, as pure functions (tested without a
//! store; the protocol model calls `handover_is_fresh` as it is and
//! restates the others in its ticks): the drift margin,
//! how long a waiter sleeps, whether a hand-over is worth taking and can be
//! trusted, whether a grant came too late.

use std::time::Duration;

use tokio::time::Instant;

use super::backoff::Backoff;
use crate::error::{Error, Retry};
use crate::fence::Fence;

/// Margin subtracted from every lease for clock drift between this host and
/// the store and for timer lateness: 1 % of the ttl plus 2 ms (as in
/// Redlock).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The delay before the next attempt of a waiting acquisition whose last
/// attempt failed with `error`.
///
/// - A queued waiter (`queued`) is woken by the release; it also retries
///   just after the holder's lease ends, and at least every third of its
///   waiter lease (which renews its place in the queue).
/// - A poller backs off with jitter, but never sleeps past the holder's
///   reported expiry.
/// - After any other error (a connection problem, a grant that came too
///   late), everyone backs off.
pub(crate) fn retry_delay(
    error: &Error,
    queued: bool,
    waiter_lease: Duration,
    backoff: &mut Backoff,
) -> Duration {
    const JUST_AFTER: Duration = Duration::from_millis(1);
    match (queued, error.retry()) {
        (true, Retry::WhenFree { remaining }) => remaining
            .map_or(waiter_lease / 3, |r| r.saturating_add(JUST_AFTER))
            .min(waiter_lease / 3),
        (false, Retry::WhenFree { remaining: Some(r) }) => {
            backoff.next_delay().min(r.saturating_add(JUST_AFTER))
        }
        _ => backoff.next_delay(),
    }
}

/// The local deadline of a lock that a release handed over to this waiter,
/// or `None` if too little of it is left to be worth taking.
///
/// The hand-over set the lock for `provisional` at some moment after
/// `refused_at`, when this waiter's last refused attempt was sent (that
/// attempt ran before the hand-over, or it would have found the lock ours).
/// So `refused_at` is a safe start for the local deadline. With less than a
/// quarter of it left, the waiter lets it go; its next attempt picks the
/// lock up through the retry path (same token, same fence) if it is still
/// there.
pub(crate) fn handover_deadline(
    refused_at: Instant,
    provisional: Duration,
    now: Instant,
) -> Option<Instant> {
    let deadline = refused_at + provisional - drift(provisional);
    (deadline.saturating_duration_since(now) >= provisional / 4).then_some(deadline)
}

/// Whether a grant whose local deadline is `deadline` arrived too late to
/// be used: with less than a tenth of the ttl left, the holder would start
/// work with almost no time (etcd #11456).
pub(crate) fn arrived_too_late(deadline: Instant, ttl: Duration, now: Instant) -> bool {
    deadline.saturating_duration_since(now) < ttl / 10
}

/// Whether a hand-over wake-up carrying `handed` can be trusted without
/// asking Redis: only if it minted a fence above `seen`, the fence stored
/// when this waiter's last attempt was refused, so the hand-over happened
/// after that attempt (fences only grow), and a deadline counted from the
/// attempt's send time is safe. A wake-up that is not above it is from
/// before the attempt: that hand-over may be long over (the waiter was
/// paused with the message queued), so it must be confirmed first. With no
/// fence stored at the refusal nothing is known: confirm.
pub(crate) fn handover_is_fresh(seen: Option<u64>, handed: Fence) -> bool {
    seen.is_some_and(|seen| handed.get() > seen)
}

#[cfg(test)]
mod tests;
