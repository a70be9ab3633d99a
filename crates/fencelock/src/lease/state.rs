//! The shared state of one held lease: what was granted, the local monotonic
//! deadline, the loss signal, and the two calls that act on the lock in the
//! store for it (renew and release, through the engine). Owned together by
//! the [`Lease`](crate::Lease) guard, its handles and the client's keeper
//! (`super::keeper`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::timing::drift;
use crate::engine::{Engine, Granted};
use crate::error::{Error, LossReason, Result};
use crate::metrics::LeaseMetrics;
use crate::store::Checked;

/// Shared state of one lease.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// The client's engine, shared by all its leases.
    pub(crate) engine: Arc<Engine>,
    pub(crate) grant: Granted,
    /// Local monotonic deadline: when the lease must be assumed gone.
    deadline: Mutex<Instant>,
    /// The loss signal, made on first use: a lease nobody watches (most are
    /// released before anything asks) never allocates one. Made by
    /// [`LeaseState::mark_lost`] too, so a watcher that came first is
    /// cancelled and one that comes later finds it cancelled.
    lost: OnceLock<CancellationToken>,
    pub(crate) loss: OnceLock<LossReason>,
    /// Set when the holder starts releasing: from then on a renewal that
    /// finds the lock gone (a manual `extend` racing the release) is not a
    /// loss, and the loss signal never fires after a normal release.
    releasing: AtomicBool,
    /// Metrics and stats of this lease (family, hold time, once-only flags).
    pub(crate) metrics: LeaseMetrics,
}

impl LeaseState {
    pub(crate) fn new(
        engine: Arc<Engine>,
        grant: Granted,
        deadline: Instant,
        metrics: LeaseMetrics,
    ) -> Self {
        LeaseState {
            engine,
            grant,
            deadline: Mutex::new(deadline),
            lost: OnceLock::new(),
            loss: OnceLock::new(),
            releasing: AtomicBool::new(false),
            metrics,
        }
    }

    /// The loss signal, cancelled once the lease is declared lost.
    pub(crate) fn lost(&self) -> &CancellationToken {
        self.lost.get_or_init(CancellationToken::new)
    }

    /// Whether the lease was declared lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.loss.get().is_some()
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
        if self.releasing.load(Ordering::Acquire) {
            return;
        }
        if self.loss.set(reason).is_ok() {
            tracing::warn!(lock = %self.grant.name, fence = %self.grant.fence, %reason, "lease lost");
            self.metrics.lost(reason);
            self.lost().cancel();
            if reason == LossReason::DeadlinePassed {
                self.engine.deadline_passed(&self.grant);
            }
        }
    }

    pub(crate) fn loss_error(&self, fallback: LossReason) -> Error {
        Error::LockLost {
            name: self.grant.name.clone(),
            fence: self.grant.fence,
            reason: self.loss.get().copied().unwrap_or(fallback),
        }
    }

    /// One renewal; moves the deadline forward on success.
    pub(crate) async fn extend_once(&self) -> Result<Checked> {
        let sent = Instant::now();
        let reply = self.engine.extend(&self.grant).await;
        self.metrics.renewal(matches!(reply, Ok(Checked::Done)));
        let reply = reply?;
        if reply == Checked::Done {
            self.renewed(sent);
        }
        Ok(reply)
    }

    /// A renewal sent at `sent` extended the lease: the deadline moves to
    /// `sent` + ttl (less the drift margin).
    pub(crate) fn renewed(&self, sent: Instant) {
        let g = &self.grant;
        self.push_deadline(sent + g.ttl - drift(g.ttl));
        tracing::debug!(lock = %g.name, fence = %g.fence, "lease renewed");
    }

    /// One release (which passes the lock on to a waiter).
    pub(crate) async fn release_once(&self) -> Result<Checked> {
        self.releasing.store(true, Ordering::Release);
        let reply = self.engine.release(&self.grant).await?;
        if reply != Checked::Done {
            self.metrics.release_not_ours();
        }
        Ok(reply)
    }
}
