//! Taking a lock on etcd: a lease of its own, the grant transaction, and the
//! wait for the predecessor (see `engine::etcd` for the recipe). The result
//! is an [`Acquired`] as on Redis: the same lease layer, keeper task, loss
//! signal, metrics and release follow.

use std::time::Duration;

use tokio::time::Instant;

use super::Cleanups;
use crate::engine::grant::{Acquired, EtcdHold, Granted};
use crate::engine::timing::{arrived_too_late, drift};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::new_token;
use crate::keys::LockKeys;
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::store::etcd::{
    EtcdConn, Found, Look, attach, holder_key, is_lease_gone, lease_seconds, look, queue_txn,
    try_txn, watch_deletion,
};

/// Pause before sending a failed grant transaction again.
const TXN_RETRY: Duration = Duration::from_millis(20);

/// The lease a waiter's key is attached to while it waits (when the ttl is
/// longer): a waiter that dies, even of SIGKILL, leaves its key in the queue
/// for this long at most (or etcd's shortest lease, if that is longer), not
/// for the lock's ttl. Its key moves to the holder's lease once it is first.
pub(crate) const WAITER_LEASE: Duration = Duration::from_secs(2);

/// How long an acquisition that gives up (its wait ran out) waits for the
/// revocation of its leases, which removes its waiter's key, before it
/// returns: etcd unreachable for longer, the revocation goes on in the
/// background and the key goes with its (short) lease.
const REVOKE_WAIT: Duration = Duration::from_secs(2);

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

/// The leases an acquisition granted, revoked when it ends without the
/// lock: refused, timed out (awaited, see [`Revocations::revoke_now`]),
/// failed, or its future dropped (in the background, tracked by the
/// client's [`Cleanups`]). Revoking a lease deletes its keys, so the queue
/// keeps no key of a waiter that is gone.
struct Revocations {
    conn: EtcdConn,
    cleanups: Cleanups,
    leases: Vec<i64>,
}

impl Revocations {
    fn new(conn: &EtcdConn, cleanups: &Cleanups) -> Self {
        Revocations {
            conn: conn.clone(),
            cleanups: cleanups.clone(),
            leases: Vec::new(),
        }
    }

    fn add(&mut self, lease: i64) {
        self.leases.push(lease);
    }

    /// `lease` is the holder's now: it is no longer revoked.
    fn keep(&mut self, lease: i64) {
        self.leases.retain(|l| *l != lease);
    }

    /// Revokes every lease now, all at once, and waits (at most
    /// [`REVOKE_WAIT`], then they go on in the background).
    async fn revoke_now(&mut self) {
        let leases = std::mem::take(&mut self.leases);
        if leases.is_empty() {
            return;
        }
        let conn = self.conn.clone();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        self.cleanups.spawn(async move {
            revoke_all(&conn, &leases).await;
            let _ = done_tx.send(());
        });
        let _ = tokio::time::timeout(REVOKE_WAIT, done_rx).await;
    }
}

impl Drop for Revocations {
    fn drop(&mut self) {
        let leases = std::mem::take(&mut self.leases);
        if leases.is_empty() {
            return;
        }
        let conn = self.conn.clone();
        self.cleanups
            .spawn(async move { revoke_all(&conn, &leases).await });
    }
}

/// Revokes `leases` (best effort: a lease that cannot be revoked expires).
async fn revoke_all(conn: &EtcdConn, leases: &[i64]) {
    futures_util::future::join_all(leases.iter().map(|l| conn.lease_revoke(*l))).await;
}

/// A lease of this acquisition and until when it is surely alive.
struct OwnLease {
    id: i64,
    /// Local monotonic time before which etcd cannot have expired it: the
    /// send time of the grant or of the last successful keep-alive, plus the
    /// ttl, less the drift margin.
    valid_until: Instant,
    ttl: Duration,
}

impl OwnLease {
    async fn grant(conn: &EtcdConn, ttl: Duration, revocations: &mut Revocations) -> Result<Self> {
        let sent = Instant::now();
        let reply = conn
            .lease_grant(lease_seconds(ttl))
            .await
            .map_err(|e| conn.error(e, "granting a lease"))?;
        revocations.add(reply.id());
        Ok(OwnLease {
            id: reply.id(),
            valid_until: valid_until(sent, ttl, reply.ttl()),
            ttl,
        })
    }

    /// One keep-alive: `Ok(false)` when the lease is gone.
    async fn keep_alive(&mut self, conn: &EtcdConn) -> Result<bool> {
        let sent = Instant::now();
        match conn.lease_keep_alive(self.id).await {
            Ok(_) => {
                self.valid_until =
                    self.valid_until
                        .max(valid_until(sent, self.ttl, lease_seconds(self.ttl)));
                Ok(true)
            }
            Err(e) if is_lease_gone(&e) => Ok(false),
            Err(e) => Err(conn.error(e, "keeping the lease alive")),
        }
    }
}

/// The local deadline of a lease whose grant or keep-alive was sent at
/// `sent`: the requested ttl (never more than what etcd granted), less the
/// drift margin.
pub(crate) fn valid_until(sent: Instant, ttl: Duration, granted_secs: i64) -> Instant {
    let granted = Duration::from_secs(u64::try_from(granted_secs).unwrap_or(0));
    let ttl = ttl.min(granted);
    sent + ttl.saturating_sub(drift(ttl))
}

/// Takes lock `name` (its keys' prefix is `keys.lock`): once if `wait` is
/// false or the wait is zero, else waiting until the options' deadline.
/// Giving up at the deadline revokes the acquisition's leases (its waiter's
/// key with them) before it returns.
pub(crate) async fn acquire(
    conn: &EtcdConn,
    cleanups: &Cleanups,
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
        // Outlives the attempt: a timed-out attempt is dropped, and its
        // leases are then revoked here, before the timeout is returned.
        let mut revocations = Revocations::new(conn, cleanups);
        let attempt = Box::pin(attempt(conn, name, keys, opts, wait, &mut revocations));
        let outcome = match give_up {
            Some(at) if wait => tokio::time::timeout_at(at, attempt).await,
            _ => Ok(attempt.await),
        };
        // The attempt is dropped by now.
        let Ok(outcome) = outcome else {
            revocations.revoke_now().await;
            return Err(timed_out());
        };
        match outcome {
            Ok(Some(lease)) => return Ok(lease),
            // The lease expired while waiting (this process stalled, or etcd
            // was out of reach for longer than the ttl): queue again.
            Ok(None) => continue,
            Err(e) if !wait || !e.is_retryable() => return Err(e),
            Err(e) => {
                tracing::debug!(lock = %name, error = %e, "etcd acquisition failed; retrying");
                let retry = Instant::now() + Duration::from_millis(50);
                if give_up.is_some_and(|at| retry >= at) {
                    revocations.revoke_now().await;
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

/// Sends one grant transaction, again while it fails transiently and
/// `lease` lives (a grant whose reply was lost finds the key it created:
/// one key per lease, so retrying is safe).
async fn send_grant(
    conn: &EtcdConn,
    name: &str,
    prefix: &str,
    key: &str,
    holder: &str,
    lease: &OwnLease,
    queue: bool,
) -> Result<Found> {
    loop {
        let sent = if queue {
            queue_txn(conn, prefix, key, holder, lease.id).await
        } else {
            try_txn(conn, prefix, key, holder, lease.id).await
        };
        match sent {
            Err(e) if e.is_retryable() && Instant::now() + TXN_RETRY < lease.valid_until => {
                tracing::debug!(lock = %name, error = %e, "etcd grant failed; sending it again");
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => return other,
        }
    }
}

/// One attempt with a holder's lease of its own: `Ok(None)` if a lease was
/// lost while queued.
///
/// Waiting, when the ttl is longer than [`WAITER_LEASE`]: a grant without a
/// queue is tried first with the holder's lease (the common case: a free
/// lock costs no more than without waiting); if someone holds or waits, the
/// waiter's key is created on a short waiter lease instead, and moved to
/// the holder's lease (same key, same create revision, so the same fence
/// and place) once it is first.
async fn attempt(
    conn: &EtcdConn,
    name: &str,
    keys: &LockKeys,
    opts: &LockOptions,
    wait: bool,
    revocations: &mut Revocations,
) -> Result<Option<Acquired>> {
    let token = new_token();
    let holder = crate::holder::holder_id(&token);
    let mut lease = OwnLease::grant(conn, opts.ttl_value(), revocations).await?;
    let prefix = &keys.lock;
    let short_waiter = wait && opts.ttl_value() > WAITER_LEASE;
    let mut key = holder_key(prefix, lease.id);
    let mut waiter: Option<OwnLease> = None;
    let mut found = send_grant(
        conn,
        name,
        prefix,
        &key,
        &holder,
        &lease,
        wait && !short_waiter,
    )
    .await?;
    if short_waiter && matches!(found, Found::Refused) {
        let short = OwnLease::grant(conn, WAITER_LEASE, revocations).await?;
        key = holder_key(prefix, short.id);
        found = send_grant(conn, name, prefix, &key, &holder, &short, true).await?;
        waiter = Some(short);
    }
    let revision = match found {
        Found::First(revision) => revision,
        Found::Refused => {
            revocations.revoke_now().await;
            tracing::debug!(lock = %name, "contended");
            return Err(Error::Contended {
                name: name.to_owned(),
                remaining: None,
            });
        }
        Found::Queued {
            revision,
            predecessor,
        } => {
            let mut leases = WaitLeases {
                holder: &mut lease,
                waiter: waiter.as_mut(),
            };
            let waited = wait_turn(conn, prefix, &key, revision, predecessor, &mut leases).await?;
            if !waited {
                return Ok(None);
            }
            revision
        }
    };
    if let Some(short) = &waiter {
        // First now: the key moves to the holder's lease.
        if !move_to_lease(conn, &key, revision, &holder, &lease, short).await? {
            return Ok(None);
        }
    }
    let fence = fence_of(revision, opts)?;
    let deadline = lease.valid_until;
    if arrived_too_late(deadline, opts.ttl_value(), Instant::now()) {
        // The key goes with the lease.
        revocations.revoke_now().await;
        return Err(Error::GrantTooLate {
            name: name.to_owned(),
            elapsed: opts
                .ttl_value()
                .saturating_sub(deadline.saturating_duration_since(Instant::now())),
            ttl: opts.ttl_value(),
        });
    }
    // The holder's lease is kept; the waiter lease (no key left on it) is
    // revoked in the background as the revocations are dropped.
    revocations.keep(lease.id);
    tracing::debug!(lock = %name, %fence, "acquired");
    let granted = Granted::on_etcd(
        name,
        fence,
        opts,
        EtcdHold {
            key,
            token,
            lease: lease.id,
            revision,
        },
    );
    Ok(Some(Acquired {
        granted,
        deadline,
        renew_now: false,
    }))
}

/// Moves the waiter's key (created at `revision`) from the waiter lease to
/// the holder's `lease`, sent again while it fails transiently and both
/// leases live. `Ok(false)`: the key is gone (the waiter lease expired).
async fn move_to_lease(
    conn: &EtcdConn,
    key: &str,
    revision: i64,
    holder: &str,
    lease: &OwnLease,
    waiter: &OwnLease,
) -> Result<bool> {
    loop {
        match attach(conn, key, revision, holder, lease.id).await {
            Err(e)
                if e.is_retryable()
                    && Instant::now() + TXN_RETRY < lease.valid_until.min(waiter.valid_until) =>
            {
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => return other,
        }
    }
}

/// The leases a waiter keeps alive: the holder's (no key on it while a
/// waiter lease holds the key) and, if any, the waiter lease.
struct WaitLeases<'a> {
    holder: &'a mut OwnLease,
    waiter: Option<&'a mut OwnLease>,
}

impl WaitLeases<'_> {
    /// How often to keep them alive: a third of the shorter one.
    fn every(&self) -> Duration {
        let shortest = self
            .waiter
            .as_ref()
            .map_or(self.holder.ttl, |w| w.ttl.min(self.holder.ttl));
        (shortest / 3).max(Duration::from_millis(5))
    }

    /// When the first of them may expire.
    fn valid_until(&self) -> Instant {
        self.waiter.as_ref().map_or(self.holder.valid_until, |w| {
            w.valid_until.min(self.holder.valid_until)
        })
    }

    /// One keep-alive of each, sent together: `Ok(false)` if one is gone.
    async fn keep_alive(&mut self, conn: &EtcdConn) -> Result<bool> {
        let (holder, waiter) = tokio::join!(self.holder.keep_alive(conn), async {
            match self.waiter.as_mut() {
                Some(w) => w.keep_alive(conn).await,
                None => Ok(true),
            }
        });
        Ok(holder? && waiter?)
    }
}

/// Waits until no key before ours (create revision `revision`) is left,
/// watching the one just before ours for its deletion, and keeping our
/// leases alive every third of the shorter one. `Ok(false)`: a lease or our
/// key is gone.
async fn wait_turn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    mut predecessor: Option<String>,
    leases: &mut WaitLeases<'_>,
) -> Result<bool> {
    let every = leases.every();
    let mut next_keep_alive = Instant::now() + every;
    loop {
        let watched = match predecessor.take() {
            Some(p) => p,
            None => match look(conn, prefix, key, revision).await? {
                Look::Gone => return Ok(false),
                Look::First => return Ok(true),
                Look::Behind(key) => key,
            },
        };
        let Some(mut deletion) = watch_deletion(conn, &watched).await? else {
            continue;
        };
        // Wait for the watch to end, keeping the leases alive meanwhile.
        loop {
            tokio::select! {
                () = deletion.ended() => break,
                () = tokio::time::sleep_until(next_keep_alive) => {
                    match leases.keep_alive(conn).await {
                        Ok(true) => next_keep_alive = Instant::now() + every,
                        Ok(false) => return Ok(false),
                        Err(e) => {
                            if Instant::now() >= leases.valid_until() {
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
    fn leases_are_whole_seconds_rounded_up() {
        assert_eq!(lease_seconds(Duration::from_millis(10)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn the_local_deadline_never_exceeds_what_etcd_granted() {
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(valid_until(now, ttl, 10), now + ttl - drift(ttl));
        // etcd may raise a short lease to its minimum: the local deadline
        // keeps the requested ttl.
        let short = Duration::from_millis(500);
        assert_eq!(valid_until(now, short, 2), now + short - drift(short));
        // A lease shorter than asked (never granted by etcd) would shorten it.
        assert_eq!(
            valid_until(now, ttl, 5),
            now + Duration::from_secs(5) - drift(Duration::from_secs(5))
        );
    }

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
