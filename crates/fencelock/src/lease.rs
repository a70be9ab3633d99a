//! A held lease: its fence and token, the loss signal, extend and release.

use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::{Error, LossReason, Result};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::metrics::LeaseMetrics;
use crate::redis::{RedisConn, scripts};

/// What [`Lease::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock was ours and is now deleted.
    Released,
    /// The lock was no longer ours: it had expired or another holder had
    /// taken it. Nothing was deleted. Any work done after the loss may have
    /// overlapped with the next holder; fenced writes were refused.
    NotOurs(LossReason),
}

impl ReleaseOutcome {
    /// True for [`ReleaseOutcome::Released`].
    pub fn is_released(self) -> bool {
        self == ReleaseOutcome::Released
    }
}

/// The reply of one compare-and-pexpire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtendReply {
    Extended,
    NotOurs(LossReason),
}

/// Margin subtracted from every lease for clock drift between this host and
/// Redis and for timer lateness: 1 % of the ttl plus 2 ms (as in Redlock).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How fences are minted for a name: passed to every script call that may
/// grant (a release or a leave can hand the lock over to the next waiter).
#[derive(Debug, Clone)]
pub(crate) struct MintArgs {
    pub(crate) fence_mode: &'static str,
    pub(crate) format: &'static str,
    /// Fence key retention in ms ("0": the fence key never expires).
    pub(crate) retention: String,
}

impl MintArgs {
    pub(crate) fn new(opts: &crate::options::LockOptions) -> Self {
        let retention = match (opts.fence_mode_value(), opts.layout_value()) {
            (crate::options::FenceMode::Clock, crate::keys::KeyLayout::HashTagged) => {
                crate::client::FENCE_RETENTION
                    .max(opts.ttl_value() * 2)
                    .as_millis()
            }
            // The guide's Python workers INCR the fence key: it must never expire.
            _ => 0,
        };
        MintArgs {
            fence_mode: opts.fence_mode_value().as_arg(),
            format: LockKeys::value_format(opts.layout_value()),
            retention: retention.to_string(),
        }
    }
}

/// What the grant script returned, ready to become a lease.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) name: String,
    pub(crate) keys: LockKeys,
    pub(crate) token: String,
    pub(crate) value: String,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    pub(crate) deadline: Instant,
    pub(crate) mint: MintArgs,
}

/// Shared state of one lease, owned by the guard, its handles and the keeper.
#[derive(Debug)]
pub(crate) struct LeaseState {
    pub(crate) conn: RedisConn,
    pub(crate) name: String,
    pub(crate) keys: LockKeys,
    pub(crate) token: String,
    /// The exact value stored in the lock key (`TOKEN:FENCE` or `TOKEN`).
    pub(crate) value: String,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    mint: MintArgs,
    /// Local monotonic deadline: when the lease must be assumed gone.
    deadline: Mutex<Instant>,
    lost: CancellationToken,
    loss: OnceLock<LossReason>,
    /// Held by the keeper while it sends a renewal. The release takes it
    /// once after stopping the keeper, so no renewal can be sent after the
    /// release, without waiting for the keeper task to end.
    pub(crate) renewing: tokio::sync::Mutex<()>,
    /// Metrics and stats of this lease (family, hold time, once-only flags).
    pub(crate) metrics: LeaseMetrics,
}

impl LeaseState {
    pub(crate) fn new(conn: RedisConn, grant: Grant, metrics: LeaseMetrics) -> Self {
        LeaseState {
            conn,
            name: grant.name,
            keys: grant.keys,
            token: grant.token,
            value: grant.value,
            fence: grant.fence,
            ttl: grant.ttl,
            mint: grant.mint,
            deadline: Mutex::new(grant.deadline),
            lost: CancellationToken::new(),
            loss: OnceLock::new(),
            renewing: tokio::sync::Mutex::new(()),
            metrics,
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push_deadline(&self, candidate: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        if candidate > *d {
            *d = candidate;
        }
    }

    /// Declares the lease lost (once) and fires the loss signal.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        if self.loss.set(reason).is_ok() {
            tracing::warn!(lock = %self.name, fence = %self.fence, %reason, "lease lost");
            self.metrics.lost(reason);
            self.lost.cancel();
        }
    }

    pub(crate) fn loss_error(&self, fallback: LossReason) -> Error {
        Error::LockLost {
            name: self.name.clone(),
            fence: self.fence,
            reason: self.loss.get().copied().unwrap_or(fallback),
        }
    }

    /// One compare-and-pexpire; moves the deadline forward on success.
    #[tracing::instrument(name = "renew", level = "debug", skip_all, fields(lock = %self.name, fence = %self.fence, outcome))]
    pub(crate) async fn extend_once(&self) -> Result<ExtendReply> {
        let sent = Instant::now();
        let ttl_ms = self.ttl.as_millis().to_string();
        let reply = self
            .conn
            .run(
                &scripts::EXTEND,
                &[&self.keys.lock],
                &[&self.value, &ttl_ms],
            )
            .await;
        self.metrics.renewal(matches!(reply, Ok(1)));
        let r: i64 = reply?;
        Ok(match r {
            1 => {
                self.push_deadline(sent + self.ttl - drift(self.ttl));
                tracing::debug!(lock = %self.name, fence = %self.fence, "lease renewed");
                ExtendReply::Extended
            }
            0 => ExtendReply::NotOurs(LossReason::Expired),
            _ => ExtendReply::NotOurs(LossReason::TakenOver),
        })
    }

    /// One compare-and-delete.
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(lock = %self.name, fence = %self.fence, outcome))]
    pub(crate) async fn release_once(&self) -> Result<ReleaseOutcome> {
        let keys = &self.keys;
        let mint = &self.mint;
        let r: i64 = self
            .conn
            .run(
                &scripts::LOCK,
                &keys.all(),
                &[
                    "release",
                    &self.value,
                    mint.fence_mode,
                    mint.format,
                    &mint.retention,
                    &keys.wake_prefix,
                    crate::client::PUBLISH,
                ],
            )
            .await?;
        let outcome = match r {
            1 => ReleaseOutcome::Released,
            0 => ReleaseOutcome::NotOurs(LossReason::Expired),
            _ => ReleaseOutcome::NotOurs(LossReason::TakenOver),
        };
        if outcome.is_released() {
            tracing::Span::current().record("outcome", "released");
        } else {
            tracing::Span::current().record("outcome", "not_ours");
            self.metrics.release_not_ours();
        }
        Ok(outcome)
    }
}

/// A cheap, cloneable view of a held lease: its identity, remaining time, loss
/// signal and manual extension. [`Lease`] dereferences to it, and
/// [`LockClient::with_lock`](crate::LockClient::with_lock) hands one to the
/// critical section. A handle cannot release the lease; only the [`Lease`]
/// guard can.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    pub(crate) state: Arc<LeaseState>,
}

impl LeaseHandle {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The fence of this grant. Pass it to every write the lock protects.
    pub fn fence(&self) -> Fence {
        self.state.fence
    }

    /// The holder token of this grant (random, 128 bits). Resources store it
    /// next to the fence to tell holders with equal fences apart.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// The Redis key holding the lease.
    pub fn key(&self) -> &str {
        &self.state.keys.lock
    }

    /// The lease ttl that every renewal restores.
    pub fn ttl(&self) -> Duration {
        self.state.ttl
    }

    /// Time left before the lease must be assumed gone, from the local
    /// monotonic deadline (which started when the grant or the last successful
    /// renewal was *sent*, minus a drift margin). Zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// True once the lease has been declared lost.
    pub fn is_lost(&self) -> bool {
        self.state.lost.is_cancelled()
    }

    /// Why the lease was lost, once it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.state.loss.get().copied()
    }

    /// Completes as soon as the lease is lost (renewal found it gone or taken,
    /// or the local deadline passed). Never completes for a lease that is
    /// released normally.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future has no effect on the lease.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.state.lost.cancelled()
    }

    /// A token cancelled when the lease is lost, to hand to code that takes a
    /// [`CancellationToken`]. Cancelling the returned token yourself does not
    /// affect the lease.
    pub fn loss_token(&self) -> CancellationToken {
        self.state.lost.child_token()
    }

    /// Extends the lease by its ttl now (compare-and-pexpire; the fence is
    /// unchanged). Background renewal does this for you; call it before a
    /// step you know to be long.
    ///
    /// # Errors
    /// [`Error::LockLost`] (and the loss signal fires) when the lock expired or
    /// another holder has it: an extend never re-creates an expired lock.
    /// Connection errors are returned as they are and do not by themselves
    /// mark the lease lost.
    pub async fn extend(&self) -> Result<()> {
        if self.is_lost() {
            return Err(self.state.loss_error(LossReason::Expired));
        }
        match self.state.extend_once().await? {
            ExtendReply::Extended => Ok(()),
            ExtendReply::NotOurs(reason) => {
                self.state.mark_lost(reason);
                Err(self.state.loss_error(reason))
            }
        }
    }
}

/// A held lease: the guard returned by
/// [`LockClient::acquire`](crate::LockClient::acquire).
///
/// Dereferences to [`LeaseHandle`] for `name()`, `fence()`, `token()`,
/// `remaining()`, `lost()` and `extend()`.
///
/// Call [`Lease::release`] when done. Dropping a lease without releasing it
/// stops its renewal at once and, when a tokio runtime is available, sends a
/// best-effort release in the background; otherwise the lock simply expires
/// after its ttl. Dropping never panics and never blocks.
#[derive(Debug)]
pub struct Lease {
    handle: LeaseHandle,
    stop: CancellationToken,
    finished: bool,
}

impl Deref for Lease {
    type Target = LeaseHandle;

    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl Lease {
    /// Starts the keeper task (renewal and deadline watchdog) for a new grant.
    /// `renew_now`: the lease is provisional (handed over for less than its
    /// ttl) and is renewed to the full ttl at once.
    pub(crate) fn start(state: LeaseState, renew_every: Option<Duration>, renew_now: bool) -> Self {
        let state = Arc::new(state);
        let stop = CancellationToken::new();
        // Detached: it ends by itself on `stop`, on loss, or at the deadline.
        tokio::spawn(crate::renew::keep(
            state.clone(),
            Instant::now(),
            renew_every,
            renew_now,
            stop.clone(),
        ));
        Lease {
            handle: LeaseHandle { state },
            stop,
            finished: false,
        }
    }

    /// A cloneable handle to this lease (for other tasks, or to pass into a
    /// critical section).
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Releases the lock if it is still ours (compare-and-delete). Renewal is
    /// stopped first (a renewal in flight is awaited), so no renewal reaches
    /// Redis afterwards.
    ///
    /// # Errors
    /// Connection errors. The lease is finished either way; if the release did
    /// not reach Redis the lock expires after its ttl.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.finished = true;
        self.stop.cancel();
        self.handle.state.metrics.hold_ended();
        // The keeper checks `stop` while holding this lock before it sends a
        // renewal: once we have had it, it sends none.
        drop(self.handle.state.renewing.lock().await);
        let outcome = self.handle.state.release_once().await?;
        match outcome {
            ReleaseOutcome::Released => {
                tracing::debug!(lock = %self.name(), fence = %self.fence(), "released");
            }
            ReleaseOutcome::NotOurs(reason) => {
                tracing::warn!(lock = %self.name(), fence = %self.fence(), %reason, "release found the lock no longer ours");
            }
        }
        Ok(outcome)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.stop.cancel();
        self.handle.state.metrics.hold_ended();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let state = self.handle.state.clone();
            runtime.spawn(async move {
                drop(state.renewing.lock().await);
                if let Err(e) = state.release_once().await {
                    tracing::debug!(lock = %state.name, error = %e, "best-effort release on drop failed; the lock expires by ttl");
                }
            });
        }
    }
}
