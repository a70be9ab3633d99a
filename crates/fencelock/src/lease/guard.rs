//! A held lease as the user sees it: the [`Lease`] guard and its cloneable
//! [`LeaseHandle`] (fence, token, remaining time, loss signal, extend,
//! release). The state they share is `super::state`; the client's keeper
//! that renews it `super::keeper`.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::keeper::Keeper;
use super::state::LeaseState;
use crate::error::{LossReason, Result};
use crate::fence::Fence;
use crate::store::Checked;

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

impl From<Checked> for ReleaseOutcome {
    fn from(reply: Checked) -> Self {
        match reply {
            Checked::Done => ReleaseOutcome::Released,
            Checked::NotOurs(reason) => ReleaseOutcome::NotOurs(reason),
        }
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
        &self.state.grant.name
    }

    /// The fence of this grant. Pass it to every write the lock protects.
    pub fn fence(&self) -> Fence {
        self.state.grant.fence
    }

    /// The semaphore slot this lease holds (`0..permits`, see
    /// [`LockOptions::permits`](crate::LockOptions::permits)); `None` for
    /// a mutex. Write to your slot's partition through the resource's slot
    /// view (`FencedHash::slot`), so a stale holder of the same slot is
    /// refused.
    pub fn slot(&self) -> Option<u32> {
        self.state.grant.slot()
    }

    /// The side of a read-write lock this lease holds
    /// ([`LockClient::rwlock`](crate::LockClient::rwlock)); `None` for a
    /// mutex or a semaphore. A reader's [`fence`](LeaseHandle::fence) is
    /// the write epoch it saw: validate reads against it
    /// (`FencedHash::read_validated`), and never write with it.
    pub fn access(&self) -> Option<crate::Access> {
        self.state.grant.access()
    }

    /// The holder token of this grant (a UUID v4: 122 random bits): a secret that
    /// lets whoever knows it release or extend the lock and write as this
    /// holder. Pass it to fenced writes; show [`LeaseHandle::holder_id`]
    /// instead.
    pub fn token(&self) -> &str {
        self.state.grant.token()
    }

    /// The public id of this holder ([`holder_id`](crate::holder_id) of the
    /// token), as `status`, `top` and the fenced resources show it.
    pub fn holder_id(&self) -> String {
        crate::holder::holder_id(self.state.grant.token())
    }

    /// The key holding the lease: the Redis lock key, or on etcd the
    /// holder's own key (`PREFIX NAME/LEASE/ACQ`).
    pub fn key(&self) -> &str {
        self.state.grant.key()
    }

    /// The lease ttl that every renewal restores.
    pub fn ttl(&self) -> Duration {
        self.state.grant.ttl
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
        self.state.is_lost()
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
        self.state.lost().cancelled()
    }

    /// A token cancelled when the lease is lost, to hand to code that takes a
    /// [`CancellationToken`]. Cancelling the returned token yourself does not
    /// affect the lease.
    pub fn loss_token(&self) -> CancellationToken {
        self.state.lost().child_token()
    }

    /// [`LeaseHandle::extend`] as a future that owns a handle (`Send +
    /// 'static`), for code that spawns it or hands it to another runtime.
    pub fn extend_owned(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        let handle = self.clone();
        async move { handle.extend().await }
    }

    /// Extends the lease by its ttl now (compare-and-pexpire; the fence is
    /// unchanged). Background renewal does this for you; call it before a
    /// step you know to be long.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) (and the loss signal fires) when the lock expired or
    /// another holder has it: an extend never re-creates an expired lock.
    /// Connection errors are returned as they are and do not by themselves
    /// mark the lease lost.
    pub async fn extend(&self) -> Result<()> {
        if self.is_lost() {
            return Err(self.state.loss_error(LossReason::Expired));
        }
        match self.state.extend_once().await? {
            Checked::Done => Ok(()),
            Checked::NotOurs(reason) => {
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
    /// The client's keeper, which renews this lease under `id`.
    keeper: Arc<Keeper>,
    id: u64,
    finished: bool,
}

impl Deref for Lease {
    type Target = LeaseHandle;

    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl Lease {
    /// Hands a new grant to the client's keeper (renewal and deadline
    /// watchdog). `renew_now`: the lease is provisional (handed over for less
    /// than its ttl) and is renewed to the full ttl at once.
    pub(crate) fn start(
        state: LeaseState,
        keeper: &Arc<Keeper>,
        renew_every: Option<Duration>,
        renew_now: bool,
        now: Instant,
    ) -> Self {
        let state = Arc::new(state);
        let id = keeper.register(state.clone(), now, renew_every, renew_now);
        Lease {
            handle: LeaseHandle { state },
            keeper: keeper.clone(),
            id,
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
        self.handle.state.metrics.hold_ended();
        // Once closed, the keeper sends no renewal of this lease, and the
        // one in flight (if any) has replied.
        self.keeper.close(self.id).await;
        let outcome = ReleaseOutcome::from(self.handle.state.release_once().await?);
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
        self.keeper.stop(self.id);
        self.handle.state.metrics.hold_ended();
        let (state, keeper, id) = (self.handle.state.clone(), self.keeper.clone(), self.id);
        // Tracked, so `LockClient::flush` can wait for it.
        self.handle.state.engine.cleanups().spawn(async move {
            keeper.close(id).await;
            if let Err(e) = state.release_once().await {
                tracing::debug!(lock = %state.grant.name, error = %e, "best-effort release on drop failed; the lock expires by ttl");
            }
        });
    }
}
