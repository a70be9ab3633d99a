//! Taking a lock on etcd: a key of its own on the client's session, the
//! grant transaction, and the wait for the predecessor (see `engine::etcd`
//! for the recipe). The result is an [`Acquired`] as on Redis: the same
//! lease layer, keeper task, loss signal, metrics and release follow. The
//! loop around an attempt (the wait's deadline, giving up, retrying) and
//! what an attempt leaves to delete ([`OwnKey`]) are shared with the
//! semaphore's attempt (`semaphore.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::session::{Session, Sessions, WAITER_LEASE};
use crate::engine::cleanup::Cleanups;
use crate::engine::grant::{Acquired, EtcdHold, Granted};
use crate::engine::timing::{arrived_too_late, drift};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::new_token;
use crate::keys::LockKeys;
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::store::etcd::{
    EtcdConn, Found, Look, attach, give_back, holder_key, look, queue_txn, try_or_queue_txn,
    try_txn, watch_deletion,
};

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
    fn new(conn: &EtcdConn, cleanups: &Cleanups) -> Self {
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
pub(crate) async fn remove_key(conn: &EtcdConn, key: &str, session: &Session) {
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

/// Takes lock `name` (its keys' prefix is `keys.lock`): once if `wait` is
/// false or the wait is zero, else waiting until the options' deadline.
/// Giving up at the deadline deletes the acquisition's key before it
/// returns.
pub(crate) async fn acquire(
    conn: &EtcdConn,
    cleanups: &Cleanups,
    sessions: &Sessions,
    name: &str,
    keys: &LockKeys,
    opts: &LockOptions,
    wait: bool,
) -> Result<Acquired> {
    if opts.replication.is_some() {
        return Err(Error::InvalidOption(
            "waiting for replicas is for Redis: etcd commits every grant to a majority of its members before it answers".into(),
        ));
    }
    let wait = wait && !opts.wait_value().is_zero();
    let started = Instant::now();
    // None: a wait too long to add to the clock is a wait forever.
    let give_up = started.checked_add(opts.wait_value());
    let timed_out = || Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    };
    loop {
        // Outlives the attempt: a timed-out attempt is dropped, and its key
        // is then deleted here, before the timeout is returned.
        let mut own = OwnKey::new(conn, cleanups);
        // A trait object: the two attempts' state machines are large, and
        // naming their types here would nest them into every caller's.
        let pending: Pending<'_> = match opts.permits {
            Some(permits) => {
                let own = &mut own;
                Box::pin(async move {
                    let to = Attempt {
                        conn,
                        sessions,
                        name,
                        keys,
                        opts,
                        wait,
                    };
                    super::semaphore::attempt(&to, permits, own).await
                })
            }
            None => Box::pin(attempt(conn, sessions, name, keys, opts, wait, &mut own)),
        };
        let outcome = match give_up {
            Some(at) if wait => tokio::time::timeout_at(at, pending).await,
            _ => Ok(pending.await),
        };
        // The attempt is dropped by now.
        let Ok(outcome) = outcome else {
            own.remove_now().await;
            return Err(timed_out());
        };
        match outcome {
            Ok(Some(lease)) => return Ok(lease),
            // A session was lost while queued (this process stalled, or
            // etcd was out of reach for longer than its lease): queue
            // again, on a session that lives.
            Ok(None) => continue,
            Err(e) if !wait || !e.is_retryable() => return Err(e),
            Err(e) => {
                tracing::debug!(lock = %name, error = %e, "etcd acquisition failed; retrying");
                let retry = Instant::now() + Duration::from_millis(50);
                if give_up.is_some_and(|at| retry >= at) {
                    own.remove_now().await;
                    return Err(match e {
                        Error::GrantTooLate { .. } => timed_out(),
                        other => other,
                    });
                }
                tokio::time::sleep_until(retry).await;
            }
        }
    }
}

/// One attempt under way, of either kind.
type Pending<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Acquired>>> + std::marker::Send + 'a>,
>;

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

/// Which grant transaction an attempt sends.
#[derive(Clone, Copy)]
enum Send<'a> {
    /// Once: only if nobody holds or waits.
    Try,
    /// Join the queue, on the holder's session.
    Queue,
    /// Try on the holder's session, else queue on this waiter session.
    TryOrQueue(&'a Session),
}

/// Sends one grant transaction, again while it fails transiently and
/// `session` lives (a grant whose reply was lost finds the key it created:
/// one key per acquisition, so retrying is safe). Also says whether the
/// key is on the waiter session. A resend that finds a lease gone may
/// leave a key an earlier send created (`try_or_queue_txn` creates it on
/// the holder's session, then finds the waiter session gone): the caller
/// deletes it.
async fn send_grant(
    conn: &EtcdConn,
    name: &str,
    prefix: &str,
    key: &str,
    holder: &str,
    session: &Session,
    send: Send<'_>,
) -> Result<(Found, bool)> {
    loop {
        let sent = match send {
            Send::Try => try_txn(conn, prefix, key, holder, session.id)
                .await
                .map(|f| (f, false)),
            Send::Queue => queue_txn(conn, prefix, key, holder, session.id)
                .await
                .map(|f| (f, false)),
            Send::TryOrQueue(waiter) => {
                try_or_queue_txn(conn, prefix, key, holder, session.id, waiter.id).await
            }
        };
        match sent {
            Err(e) if e.is_retryable() && Instant::now() + TXN_RETRY < session.valid_until() => {
                tracing::debug!(lock = %name, error = %e, "etcd grant failed; sending it again");
                tokio::time::sleep(TXN_RETRY).await;
            }
            Ok((Found::LeaseGone, on_waiter)) => {
                // Which lease is gone: a keep-alive tells (and marks it).
                session.keep_alive(conn).await?;
                if let Send::TryOrQueue(waiter) = send {
                    waiter.keep_alive(conn).await?;
                }
                return Ok((Found::LeaseGone, on_waiter));
            }
            other => return other,
        }
    }
}

/// One attempt with a key of its own on the client's session for the ttl:
/// `Ok(None)` if a session was lost while queued.
///
/// Waiting, when the ttl is longer than [`WAITER_LEASE`]: a grant without a
/// queue is tried first on the holder's session (the common case: a free
/// lock costs no more than without waiting); if someone holds or waits, the
/// waiter's key is created on the client's short waiter session instead,
/// and moved to the holder's session (same key, same create revision, so
/// the same fence and place) once it is first.
async fn attempt(
    conn: &EtcdConn,
    sessions: &Sessions,
    name: &str,
    keys: &LockKeys,
    opts: &LockOptions,
    wait: bool,
    own: &mut OwnKey,
) -> Result<Option<Acquired>> {
    let ttl = opts.ttl_value();
    let token = new_token();
    let holder = crate::holder::holder_id(&token);
    let acquisition = sessions.next_acquisition();
    let session = sessions.holder(conn, ttl).await?;
    let prefix = &keys.lock();
    let short_waiter = wait && ttl > WAITER_LEASE;
    let key = holder_key(prefix, session.id, acquisition);
    // A waiter with a ttl longer than the waiter lease tries on the holder's
    // session and, if someone holds or waits, queues on the waiter session,
    // in one transaction.
    let send_on = if short_waiter {
        Some(sessions.waiter(conn).await?)
    } else {
        None
    };
    let send = match (&send_on, wait) {
        (Some(short), _) => Send::TryOrQueue(short),
        (None, true) => Send::Queue,
        (None, false) => Send::Try,
    };
    own.set(&key, &session);
    let mut sent = Instant::now();
    let (found, on_waiter) = send_grant(conn, name, prefix, &key, &holder, &session, send).await?;
    let waiter = send_on.filter(|_| on_waiter);
    let revision = match found {
        Found::First(revision) => revision,
        Found::Refused => {
            own.clear();
            tracing::debug!(lock = %name, "contended");
            return Err(Error::Contended {
                name: name.to_owned(),
                remaining: None,
            });
        }
        Found::OtherKind => {
            // Nothing was created by this send, and a key an earlier one
            // created would have kept the semaphore out; deleted anyway,
            // by its name (it is this attempt's alone).
            own.remove_now().await;
            return Err(Error::KindConflict {
                name: name.to_owned(),
                held: "semaphore",
                asked: "mutex",
            });
        }
        Found::LeaseGone => {
            // This send wrote nothing, but an earlier one whose reply was
            // lost may have created the key on the holder's session, which
            // lives on: left, it would stay first, nobody's, and the next
            // attempt would queue behind it and keep the session alive. It
            // is deleted by its name before the next attempt.
            own.remove_now().await;
            return Ok(None);
        }
        Found::Queued {
            revision,
            predecessor,
        } => {
            let leases = WaitSessions {
                holder: &session,
                waiter: waiter.as_deref(),
            };
            if !wait_turn(conn, prefix, &key, revision, predecessor, &leases).await? {
                return Ok(None);
            }
            sent = Instant::now();
            revision
        }
    };
    if let Some(short) = &waiter {
        // First now: the key moves to the holder's session.
        if !move_to_session(conn, &key, revision, &holder, &session, short).await? {
            return Ok(None);
        }
    }
    let fence = fence_of(revision, opts)?;
    // The key lives as long as the session; the lock's own deadline counts
    // its ttl from the grant (or from when a waiter became first).
    let deadline = session
        .valid_until()
        .min(sent + ttl.saturating_sub(drift(ttl)));
    if arrived_too_late(deadline, ttl, Instant::now()) {
        // `own` deletes the key.
        return Err(Error::GrantTooLate {
            name: name.to_owned(),
            elapsed: ttl.saturating_sub(deadline.saturating_duration_since(Instant::now())),
            ttl,
        });
    }
    own.clear();
    tracing::debug!(lock = %name, %fence, "acquired");
    let granted = Granted::on_etcd(
        name,
        fence,
        opts,
        EtcdHold {
            key,
            token,
            session,
            revision,
            slot: None,
        },
    );
    Ok(Some(Acquired {
        granted,
        deadline,
        renew_now: false,
    }))
}

/// Moves the waiter's key (created at `revision`) from the waiter session
/// to the holder's `session`, sent again while it fails transiently and
/// both live. `Ok(false)`: the key is gone (the waiter session expired), or
/// the holder's session is.
async fn move_to_session(
    conn: &EtcdConn,
    key: &str,
    revision: i64,
    holder: &str,
    session: &Session,
    waiter: &Session,
) -> Result<bool> {
    loop {
        match attach(conn, key, revision, holder, session.id).await {
            Err(e)
                if e.is_retryable()
                    && Instant::now() + TXN_RETRY
                        < session.valid_until().min(waiter.valid_until()) =>
            {
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => return other,
        }
    }
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

/// Waits until no key before ours (create revision `revision`) is left,
/// watching the one just before ours for its deletion, and keeping the
/// sessions alive every third of the shorter one. `Ok(false)`: a session
/// or our key is gone. `Ok(true)` is only as recent as the read that found
/// our key first: a linearizable one, unless our key is on the waiter
/// session, whose move to the holder's session compares it again (`look`).
async fn wait_turn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    mut predecessor: Option<String>,
    sessions: &WaitSessions<'_>,
) -> Result<bool> {
    let every = sessions.every();
    let mut next_keep_alive = Instant::now() + every;
    loop {
        let watched = match predecessor.take() {
            Some(p) => p,
            None => match look(conn, prefix, key, revision, sessions.waiter.is_some()).await? {
                Look::Gone => return Ok(false),
                Look::First => return Ok(true),
                Look::Behind(key) => key,
            },
        };
        let Some(mut deletion) = watch_deletion(conn, &watched).await? else {
            continue;
        };
        // Wait for the watch to end, keeping the sessions alive meanwhile.
        loop {
            tokio::select! {
                () = deletion.ended() => break,
                () = tokio::time::sleep_until(next_keep_alive) => {
                    match sessions.keep_alive(conn).await {
                        Ok(true) => next_keep_alive = Instant::now() + every,
                        Ok(false) => return Ok(false),
                        Err(e) => {
                            if Instant::now() >= sessions.valid_until() {
                                return Err(e);
                            }
                            next_keep_alive = Instant::now() + every / 4;
                        }
                    }
                }
            }
        }
    }
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
