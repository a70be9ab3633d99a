//! The client's etcd sessions (etcd's own `concurrency.Session` model): one
//! lease per client and lease length, shared by every lock the client
//! holds with that ttl, and one short waiter lease shared by its waiting
//! acquisitions. An uncontended cycle then costs a create transaction and
//! a delete, not also a lease grant and a revoke (two Raft commits fewer).
//!
//! A session is kept alive by what uses it: the keeper's renewal of each
//! lock held on it (a keep-alive and a read of the lock's key), the wait
//! loop of each waiter, and an acquisition that finds it not kept alive
//! for a while. Its local deadline only moves forward, from the send time
//! of each keep-alive that succeeded; once it passed (nothing kept it
//! alive, or etcd did not answer in time) the session is never used again:
//! the next acquisition grants a new one. A session etcd says is gone
//! (expired or revoked) is given up at once, and every lock held on it is
//! lost: each one's renewal finds the lease gone and fires its loss
//! signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::timing::drift;
use crate::error::Result;
use crate::store::etcd::{EtcdConn, is_lease_gone, lease_seconds};

/// The waiter lease's length: a waiter that dies, even of SIGKILL, leaves
/// its key in the queue for this long at most (or etcd's shortest lease,
/// if that is longer), not for the lock's ttl. Its key moves to the
/// holder's session once it is first.
pub(crate) const WAITER_LEASE: Duration = Duration::from_secs(2);

/// Most holder sessions a client keeps (one per lease length in whole
/// seconds): a client asked for more lease lengths than this gives the
/// others a session of their own, unshared, rather than grow without
/// bound.
const MAX_SESSIONS: usize = 64;

/// One etcd lease shared by the acquisitions of one client.
#[derive(Debug)]
pub(crate) struct Session {
    /// The lease id.
    pub(crate) id: i64,
    /// The lease's length as asked (whole seconds).
    length: Duration,
    /// Local monotonic time before which etcd cannot have expired it: the
    /// send time of the grant or of the latest keep-alive that succeeded,
    /// plus its length, less the drift margin.
    valid_until: Mutex<Instant>,
    /// etcd said it is gone, or its deadline passed: never used again.
    gone: AtomicBool,
}

impl Session {
    /// Grants a new lease of `seconds`.
    async fn grant(conn: &EtcdConn, seconds: i64) -> Result<Arc<Session>> {
        let sent = Instant::now();
        let reply = conn
            .lease_grant(seconds)
            .await
            .map_err(|e| conn.error(e, "granting a lease"))?;
        Ok(Arc::new(Session::new(
            reply.id(),
            seconds,
            reply.ttl(),
            sent,
        )))
    }

    /// Lease `id`, asked for `seconds` and granted `granted` seconds by a
    /// grant sent at `sent`.
    fn new(id: i64, seconds: i64, granted: i64, sent: Instant) -> Session {
        let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
        // Never more than asked: etcd may raise a short lease to its
        // minimum, and a lease shorter than asked (never granted by etcd)
        // shortens it.
        let length = secs(seconds).min(secs(granted));
        Session {
            id,
            length,
            valid_until: Mutex::new(sent + length.saturating_sub(drift(length))),
            gone: AtomicBool::new(false),
        }
    }

    /// The lease's length, as this client counts it.
    pub(crate) fn length(&self) -> Duration {
        self.length
    }

    /// Local monotonic time before which etcd cannot have expired it.
    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A keep-alive sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant) {
        let candidate = sent + self.length.saturating_sub(drift(self.length));
        let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        if candidate > *until {
            *until = candidate;
        }
    }

    /// etcd said the lease is gone: it is never used again.
    pub(crate) fn mark_gone(&self) {
        self.gone.store(true, Ordering::Relaxed);
    }

    /// Whether it may still be alive in etcd, as far as this client knows.
    pub(crate) fn may_be_alive(&self, now: Instant) -> bool {
        !self.gone.load(Ordering::Relaxed) && now < self.valid_until()
    }

    /// One keep-alive: `Ok(false)` when etcd says the lease is gone, or
    /// its local deadline passed (it is then never kept alive again: what
    /// was left on it goes with it).
    pub(crate) async fn keep_alive(&self, conn: &EtcdConn) -> Result<bool> {
        let sent = Instant::now();
        if !self.may_be_alive(sent) {
            self.mark_gone();
            return Ok(false);
        }
        match conn.lease_keep_alive(self.id).await {
            Ok(()) => {
                self.renewed(sent);
                Ok(true)
            }
            Err(e) if is_lease_gone(&e) => {
                self.mark_gone();
                Ok(false)
            }
            Err(e) => Err(conn.error(e, "keeping the lease alive")),
        }
    }

    /// Whether a lock of `ttl` taken now on it would have most of its ttl:
    /// else an acquisition keeps it alive first.
    fn fresh_for(&self, ttl: Duration, now: Instant) -> bool {
        let wanted = ttl.saturating_sub(drift(ttl)).saturating_sub(ttl / 3);
        self.may_be_alive(now) && self.valid_until().saturating_duration_since(now) >= wanted
    }
}

/// One slot of [`Sessions`]: the session of one lease length, granted by
/// the first acquisition that needs it (the others wait for that grant).
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Session>>>>;

/// The sessions of one client, and the numbers of its acquisitions.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// The number of the last acquisition (the last part of its key).
    acquisitions: std::sync::atomic::AtomicU64,
    /// Holder sessions by lease length in whole seconds.
    holders: Mutex<HashMap<i64, Slot>>,
    /// The waiter session.
    waiter: tokio::sync::Mutex<Option<Arc<Session>>>,
}

impl Sessions {
    /// A number no other acquisition of this client has.
    pub(crate) fn next_acquisition(&self) -> u64 {
        self.acquisitions.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The session for a lock of `ttl`: the client's one for its lease
    /// length, kept alive first if it was not for a while, or a new one if
    /// it may be gone.
    pub(crate) async fn holder(&self, conn: &EtcdConn, ttl: Duration) -> Result<Arc<Session>> {
        let slot = {
            let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
            let seconds = lease_seconds(ttl);
            if !holders.contains_key(&seconds) && holders.len() >= MAX_SESSIONS {
                // Forget the sessions that may be gone: none is used for a
                // new lock again (one being granted or kept alive is kept).
                let now = Instant::now();
                holders.retain(|_, slot| {
                    slot.try_lock()
                        .map_or(true, |s| s.as_ref().is_some_and(|s| s.may_be_alive(now)))
                });
            }
            match holders.get(&seconds) {
                Some(slot) => Some(slot.clone()),
                None if holders.len() < MAX_SESSIONS => {
                    let slot = Slot::default();
                    holders.insert(seconds, slot.clone());
                    Some(slot)
                }
                None => None,
            }
        };
        let Some(slot) = slot else {
            return Session::grant(conn, lease_seconds(ttl)).await;
        };
        let mut current = slot.lock().await;
        fresh(conn, &mut current, lease_seconds(ttl), ttl).await
    }

    /// The waiter session, kept alive first if it was not for a while, or a
    /// new one if it may be gone.
    pub(crate) async fn waiter(&self, conn: &EtcdConn) -> Result<Arc<Session>> {
        let mut current = self.waiter.lock().await;
        fresh(
            conn,
            &mut current,
            lease_seconds(WAITER_LEASE),
            WAITER_LEASE,
        )
        .await
    }
}

/// The session in `current` if it is fresh for a lock of `ttl` (kept alive
/// first if it may be alive but not fresh), else a new one of `seconds`.
async fn fresh(
    conn: &EtcdConn,
    current: &mut Option<Arc<Session>>,
    seconds: i64,
    ttl: Duration,
) -> Result<Arc<Session>> {
    let now = Instant::now();
    if let Some(session) = current.as_ref() {
        if session.fresh_for(ttl, now) {
            return Ok(session.clone());
        }
        if session.may_be_alive(now) && session.keep_alive(conn).await? {
            return Ok(session.clone());
        }
    }
    let session = Session::grant(conn, seconds).await?;
    *current = Some(session.clone());
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_deadline_never_exceeds_what_etcd_granted() {
        let now = Instant::now();
        let ten = Duration::from_secs(10);
        assert_eq!(
            Session::new(1, 10, 10, now).valid_until(),
            now + ten - drift(ten)
        );
        // etcd may raise a short lease to its minimum: the local deadline
        // keeps the length asked.
        let one = Duration::from_secs(1);
        assert_eq!(
            Session::new(1, 1, 2, now).valid_until(),
            now + one - drift(one)
        );
        // A lease shorter than asked (never granted by etcd) shortens it.
        let five = Duration::from_secs(5);
        assert_eq!(
            Session::new(1, 10, 5, now).valid_until(),
            now + five - drift(five)
        );
    }

    #[test]
    fn a_deadline_only_moves_forward_and_a_gone_session_stays_gone() {
        let now = Instant::now();
        let session = Session::new(1, 10, 10, now);
        let first = session.valid_until();
        session.renewed(now - Duration::from_secs(1));
        assert_eq!(session.valid_until(), first);
        session.renewed(now + Duration::from_secs(1));
        assert!(session.valid_until() > first);
        assert!(session.may_be_alive(now));
        assert!(!session.may_be_alive(session.valid_until()));
        session.mark_gone();
        assert!(!session.may_be_alive(now));
    }

    #[test]
    fn a_lock_is_taken_on_a_session_only_with_most_of_its_ttl_left() {
        let now = Instant::now();
        let ttl = Duration::from_secs(3);
        let session = Session::new(1, 3, 3, now);
        assert!(session.fresh_for(ttl, now));
        // A session last kept alive over a third of the ttl ago is kept
        // alive first.
        assert!(!session.fresh_for(ttl, now + Duration::from_millis(1100)));
    }
}
