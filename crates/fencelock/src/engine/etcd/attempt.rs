//! What an etcd attempt of either kind works with (the mutex's,
//! `acquire.rs`, and the semaphore's, `semaphore.rs`): what it is for
//! ([`Attempt`]), the key it leaves to delete ([`OwnKey`]), the sessions a
//! waiter keeps alive ([`WaitSessions`]), and the fence of a create
//! revision ([`fence_of`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::session::{Session, Sessions};
use crate::engine::cleanup::Cleanups;
use crate::engine::timing::{arrived_too_late, drift};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::store::etcd::{EtcdConn, give_back};

/// Pause before sending a failed grant transaction again.
pub(super) const TXN_RETRY: Duration = Duration::from_millis(20);

/// How long an acquisition that gives up (its wait ran out) waits for the
/// deletion of its key before it returns: etcd unreachable for longer, the
/// deletion goes on in the background (see [`remove_key`]).
const GIVE_UP_WAIT: Duration = Duration::from_secs(2);

/// Pause before sending a failed deletion of an abandoned key again.
const REMOVE_RETRY: Duration = Duration::from_millis(100);

/// The fence of a holder key created at `revision`, in the epoch of `opts`.
///
/// # Errors
/// [`Error::UnexpectedReply`] for a revision of 2^53 or more (it would reach
/// into the next epoch).
pub(crate) fn fence_of(revision: i64, opts: &LockOptions) -> Result<Fence> {
    match u64::try_from(revision) {
        Ok(r) if r > 0 && r < FENCE_EPOCH_SIZE => {
            Ok(Fence::new(opts.fence_base(ETCD_DEFAULT_FENCE_EPOCH) + r))
        }
        _ => Err(Error::UnexpectedReply(format!(
            "etcd revision {revision} is not a usable fence (0 < revision < 2^53)"
        ))),
    }
}

/// The key an attempt created (or may have: a transaction whose reply was
/// lost), deleted when the attempt ends without the lock: refused, timed
/// out (awaited, see [`OwnKey::remove_now`]), failed, or its future dropped
/// (in the background, tracked by the client's [`Cleanups`]). Its lease is
/// the client's session, shared with other acquisitions, so the key is
/// deleted, not its lease revoked: the queue keeps no key of a waiter that
/// is gone.
///
/// A semaphore's attempt may also have taken slots (`claims`): a slot's
/// key is shared by its holders in turn, so it is deleted only if it still
/// holds the attempt's own holder id ([`give_back`]). Every slot a take was
/// sent for is kept: a send whose reply was lost may be applied late, after
/// a resend was refused and the attempt moved on to another slot.
pub(super) struct OwnKey {
    conn: EtcdConn,
    cleanups: Cleanups,
    key: Option<(String, Arc<Session>)>,
    /// The slot keys the attempt may have created, each with the holder id
    /// it would hold and the session it would live on.
    claims: Vec<(String, String, Arc<Session>)>,
}

impl OwnKey {
    pub(super) fn new(conn: &EtcdConn, cleanups: &Cleanups) -> Self {
        OwnKey {
            conn: conn.clone(),
            cleanups: cleanups.clone(),
            key: None,
            claims: Vec::new(),
        }
    }

    /// The attempt may create `key` on `session` now.
    pub(super) fn set(&mut self, key: &str, session: &Arc<Session>) {
        self.key = Some((key.to_owned(), session.clone()));
    }

    /// The attempt may take the slot key `key` for `holder` on `session`
    /// now.
    pub(super) fn claim(&mut self, key: &str, holder: &str, session: &Arc<Session>) {
        if !self.claims.iter().any(|(k, _, _)| k == key) {
            self.claims
                .push((key.to_owned(), holder.to_owned(), session.clone()));
        }
    }

    /// Nothing of the attempt is left (a refusal: a key an earlier send
    /// created would be found first, so a resend is refused only once that
    /// key is gone), or its key is the holder's now.
    pub(super) fn clear(&mut self) {
        self.key = None;
        self.claims.clear();
    }

    /// What is left to delete, as a task; `None` if nothing.
    fn removal(
        &mut self,
    ) -> Option<impl std::future::Future<Output = ()> + std::marker::Send + 'static> {
        let (key, claims) = (self.key.take(), std::mem::take(&mut self.claims));
        if key.is_none() && claims.is_empty() {
            return None;
        }
        let conn = self.conn.clone();
        Some(async move {
            if let Some((key, session)) = key {
                remove_key(&conn, &key, &session).await;
            }
            for (key, holder, session) in claims {
                give_back_slot(&conn, &key, &holder, &session).await;
            }
        })
    }

    /// Deletes what is left now and waits (at most [`GIVE_UP_WAIT`], then
    /// the deletion goes on in the background).
    pub(super) async fn remove_now(&mut self) {
        let Some(removal) = self.removal() else {
            return;
        };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        self.cleanups.spawn(async move {
            removal.await;
            let _ = done_tx.send(());
        });
        let _ = tokio::time::timeout(GIVE_UP_WAIT, done_rx).await;
    }
}

impl Drop for OwnKey {
    fn drop(&mut self) {
        if let Some(removal) = self.removal() {
            self.cleanups.spawn(removal);
        }
    }
}

/// Deletes slot key `key` if `holder` still holds it, again while that
/// fails transiently and `session` may be alive (as [`remove_key`]).
async fn give_back_slot(conn: &EtcdConn, key: &str, holder: &str, session: &Session) {
    loop {
        match give_back(conn, key, holder).await {
            Err(e) if e.is_retryable() && session.may_be_alive(Instant::now()) => {
                tracing::debug!(key, error = %e, "giving back an abandoned slot failed; retrying");
                tokio::time::sleep(REMOVE_RETRY).await;
            }
            _ => return,
        }
    }
}

/// Deletes an abandoned `key`, again while that fails transiently and its
/// `session` may be alive: other locks of the client keep the session
/// alive, and with it any key left on it. Once the session may be gone
/// the key goes with it (a session is never kept alive after its local
/// deadline passed).
pub(super) async fn remove_key(conn: &EtcdConn, key: &str, session: &Session) {
    loop {
        match conn.delete_key(key).await {
            Err(e) if e.is_retryable() && session.may_be_alive(Instant::now()) => {
                tracing::debug!(key, error = %e, "removing an abandoned key failed; retrying");
                tokio::time::sleep(REMOVE_RETRY).await;
            }
            _ => return,
        }
    }
}

/// What one attempt is for (the semaphore's attempt takes it whole).
pub(super) struct Attempt<'a> {
    pub(super) conn: &'a EtcdConn,
    pub(super) sessions: &'a Sessions,
    pub(super) name: &'a str,
    pub(super) keys: &'a LockKeys,
    pub(super) opts: &'a LockOptions,
    /// Whether to wait (else: once).
    pub(super) wait: bool,
}

/// The sessions a waiter keeps alive: the holder's (its lock will live on
/// it) and, if any, the waiter session its key is on.
pub(super) struct WaitSessions<'a> {
    pub(super) holder: &'a Session,
    pub(super) waiter: Option<&'a Session>,
}

impl WaitSessions<'_> {
    /// How often to keep them alive: a third of the shorter one.
    pub(super) fn every(&self) -> Duration {
        let shortest = self.waiter.map_or(self.holder.length(), |w| {
            w.length().min(self.holder.length())
        });
        (shortest / 3).max(Duration::from_millis(5))
    }

    /// When the first of them may expire.
    pub(super) fn valid_until(&self) -> Instant {
        self.waiter.map_or(self.holder.valid_until(), |w| {
            w.valid_until().min(self.holder.valid_until())
        })
    }

    /// One keep-alive of each, sent together: `Ok(false)` if one is gone.
    pub(super) async fn keep_alive(&self, conn: &EtcdConn) -> Result<bool> {
        let (holder, waiter) = tokio::join!(self.holder.keep_alive(conn), async {
            match self.waiter {
                Some(w) => w.keep_alive(conn).await,
                None => Ok(true),
            }
        });
        Ok(holder? && waiter?)
    }
}

/// The fence and local deadline of a key created at `revision` by a grant
/// sent at `sent`, living on `session`: the key lasts as long as the
/// session, the lease its ttl from the grant (or from when a waiter became
/// first), less the drift margin. Refused as too late ([`Error::GrantTooLate`])
/// when most of the ttl is gone; the caller's [`OwnKey`] then deletes the
/// key (or gives the slot back).
pub(super) fn fence_and_deadline(
    name: &str,
    opts: &LockOptions,
    revision: i64,
    session: &Session,
    sent: Instant,
) -> Result<(Fence, Instant)> {
    let ttl = opts.ttl_value();
    let fence = fence_of(revision, opts)?;
    let deadline = session
        .valid_until()
        .min(sent + ttl.saturating_sub(drift(ttl)));
    if arrived_too_late(deadline, ttl, Instant::now()) {
        return Err(Error::GrantTooLate {
            name: name.to_owned(),
            elapsed: ttl.saturating_sub(deadline.saturating_duration_since(Instant::now())),
            ttl,
        });
    }
    Ok((fence, deadline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_revisions_in_their_epoch() -> Result<()> {
        let opts = LockOptions::default();
        assert_eq!(fence_of(7, &opts)?.get(), FENCE_EPOCH_SIZE + 7);
        assert_eq!(fence_of(7, &opts.clone().fence_epoch(0))?.get(), 7);
        assert!(fence_of(0, &opts).is_err());
        assert!(fence_of(1 << 53, &opts).is_err());
        Ok(())
    }
}
