//! The shared state of one held lease: what was granted, the local monotonic
//! deadline, the loss signal, and the two calls that act on the lock in the
//! store for it (renew and release; on etcd, a lease keep-alive and a
//! delete-and-revoke, in `backend::etcd`). Owned together by the [`Lease`] guard,
//! its handles and the client's keeper (`crate::renew`).
//!
//! [`Lease`]: crate::Lease

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::backend::ops::{Checked, Extend, Mint, PassOn, Release};
use crate::backend::wire;
use crate::error::{Error, LossReason, Result};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::metrics::LeaseMetrics;
use crate::options::LockOptions;

/// Margin subtracted from every lease for clock drift between this host and
/// Redis and for timer lateness: 1 % of the ttl plus 2 ms (as in Redlock).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// What one grant gave: fixed for the life of the lease. Kept small (a
/// client may hold 100,000 leases): the lock key alone (the other keys are
/// derived from it for a release), and the token as the start of the value.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) name: String,
    /// The lock key (`LockKeys::lock`).
    pub(crate) lock: String,
    /// The exact value stored in the lock key (`TOKEN:FENCE` or `TOKEN`):
    /// the token is its first `token_len` bytes.
    pub(crate) value: String,
    token_len: usize,
    /// The fence the holder is given: the backend's fence plus the fence
    /// epoch's base ([`LockOptions::fence_epoch`]).
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    /// How fences are minted for the name: a release may hand the lock over.
    pub(crate) mint: Mint,
    /// Whether the lock was contended when granted (the acquisition was
    /// refused at least once): its release then wakes the next holder first
    /// (`Release::wake_first`).
    pub(crate) contended: bool,
    /// On etcd: the holder's lease and its key's create revision.
    #[cfg(feature = "etcd")]
    pub(crate) etcd: Option<crate::backend::etcd::Held>,
}

impl Granted {
    pub(crate) fn new(
        name: &str,
        keys: &LockKeys,
        token: &str,
        fence: Fence,
        opts: &LockOptions,
        contended: bool,
    ) -> Self {
        Granted {
            name: name.to_owned(),
            value: wire::lock_value(token, fence, opts.layout),
            token_len: token.len(),
            lock: keys.lock.clone(),
            // The fence the holder is given: the backend's plus the fence
            // epoch's base; the stored value keeps the backend's.
            fence: Fence::new(fence.get().saturating_add(opts.fence_base(0))),
            ttl: opts.ttl,
            mint: Mint::new(opts),
            contended,
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }

    /// A grant on etcd: the holder's key `lock` (which stores the holder id,
    /// not the token: `value` is the token alone), its lease and create
    /// revision in `held`, and the `fence` already in its epoch.
    #[cfg(feature = "etcd")]
    pub(crate) fn on_etcd(
        name: &str,
        lock: String,
        token: String,
        fence: Fence,
        opts: &LockOptions,
        held: crate::backend::etcd::Held,
    ) -> Self {
        Granted {
            name: name.to_owned(),
            lock,
            token_len: token.len(),
            value: token,
            fence,
            ttl: opts.ttl,
            mint: Mint::new(opts),
            contended: false,
            etcd: Some(held),
        }
    }

    /// The holder token.
    pub(crate) fn token(&self) -> &str {
        &self.value[..self.token_len]
    }
}

/// Shared state of one lease.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// The client's backend, shared by all its leases.
    pub(crate) backend: Arc<Backend>,
    pub(crate) grant: Granted,
    /// Local monotonic deadline: when the lease must be assumed gone.
    deadline: Mutex<Instant>,
    pub(crate) lost: CancellationToken,
    pub(crate) loss: OnceLock<LossReason>,
    /// Metrics and stats of this lease (family, hold time, once-only flags).
    pub(crate) metrics: LeaseMetrics,
}

impl LeaseState {
    pub(crate) fn new(
        backend: Arc<Backend>,
        grant: Granted,
        deadline: Instant,
        metrics: LeaseMetrics,
    ) -> Self {
        LeaseState {
            backend,
            grant,
            deadline: Mutex::new(deadline),
            lost: CancellationToken::new(),
            loss: OnceLock::new(),
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
            tracing::warn!(lock = %self.grant.name, fence = %self.grant.fence, %reason, "lease lost");
            self.metrics.lost(reason);
            self.lost.cancel();
        }
    }

    pub(crate) fn loss_error(&self, fallback: LossReason) -> Error {
        Error::LockLost {
            name: self.grant.name.clone(),
            fence: self.grant.fence,
            reason: self.loss.get().copied().unwrap_or(fallback),
        }
    }

    /// One compare-and-pexpire; moves the deadline forward on success.
    #[tracing::instrument(name = "renew", level = "debug", skip_all, fields(lock = %self.grant.name, fence = %self.grant.fence, outcome))]
    pub(crate) async fn extend_once(&self) -> Result<Checked> {
        let sent = Instant::now();
        let g = &self.grant;
        let reply = match &*self.backend {
            Backend::Redis(_) => {
                self.backend
                    .run(&Extend {
                        key: &g.lock,
                        value: &g.value,
                        ttl: g.ttl,
                    })
                    .await
            }
            // A keep-alive of the holder's own lease.
            #[cfg(feature = "etcd")]
            Backend::Etcd(conn) => conn.keep_alive(g).await,
        };
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

    /// One compare-and-delete (which passes the lock on to a waiter).
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(lock = %self.grant.name, fence = %self.grant.fence, outcome))]
    pub(crate) async fn release_once(&self) -> Result<Checked> {
        let g = &self.grant;
        let reply = match &*self.backend {
            Backend::Redis(_) => {
                self.backend
                    .release(&Release {
                        lock: &g.lock,
                        mint: g.mint,
                        pass_on: PassOn {
                            publish: self.backend.publish(),
                        },
                        value: &g.value,
                        wake_first: g.contended,
                    })
                    .await?
            }
            // Delete the holder's key if it is still its own, then revoke
            // its lease.
            #[cfg(feature = "etcd")]
            Backend::Etcd(conn) => conn.release(g).await?,
        };
        if reply == Checked::Done {
            tracing::Span::current().record("outcome", "released");
        } else {
            tracing::Span::current().record("outcome", "not_ours");
            self.metrics.release_not_ours();
        }
        Ok(reply)
    }
}
