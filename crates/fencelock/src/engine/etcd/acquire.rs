//! Taking a lock on etcd: a lease of its own, the grant transaction, and the
//! wait for the predecessor (see `engine::etcd` for the recipe). The result
//! is an [`Acquired`] as on Redis: the same lease layer, keeper task, loss
//! signal, metrics and release follow.

use std::time::Duration;

use tokio::time::Instant;

use crate::engine::grant::{Acquired, EtcdHold, Granted};
use crate::engine::timing::{arrived_too_late, drift};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::new_token;
use crate::keys::LockKeys;
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::store::etcd::{
    EtcdConn, Found, Look, holder_key, is_lease_gone, lease_seconds, look, queue_txn, try_txn,
    watch_deletion,
};

/// Pause before sending a failed grant transaction again.
const TXN_RETRY: Duration = Duration::from_millis(20);

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

/// Revokes a lease when dropped, unless disarmed: an acquisition that ends
/// without the lock (refused, timed out, failed, or its future dropped)
/// leaves no key in the queue.
struct RevokeOnDrop {
    armed: Option<(EtcdConn, i64)>,
}

impl RevokeOnDrop {
    fn disarm(&mut self) {
        self.armed = None;
    }

    /// Revokes now and waits for it (best effort).
    async fn revoke(mut self) {
        if let Some((conn, lease)) = self.armed.take() {
            let _ = conn.lease_revoke(lease).await;
        }
    }
}

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        if let Some((conn, lease)) = self.armed.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = conn.lease_revoke(lease).await;
            });
        }
    }
}

/// The lease of one acquisition and until when it is surely alive.
struct OwnLease {
    id: i64,
    /// Local monotonic time before which etcd cannot have expired it: the
    /// send time of the grant or of the last successful keep-alive, plus the
    /// ttl, less the drift margin.
    valid_until: Instant,
    ttl: Duration,
}

impl OwnLease {
    async fn grant(conn: &EtcdConn, ttl: Duration) -> Result<Self> {
        let sent = Instant::now();
        let reply = conn
            .lease_grant(lease_seconds(ttl))
            .await
            .map_err(|e| conn.error(e, "granting a lease"))?;
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
pub(crate) async fn acquire(
    conn: &EtcdConn,
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
        // Timing out drops the attempt, which revokes its lease.
        let attempt = Box::pin(attempt(conn, name, keys, opts, wait));
        let outcome = match give_up {
            Some(at) if wait => match tokio::time::timeout_at(at, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(timed_out()),
            },
            _ => attempt.await,
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

/// One lease's attempt: `Ok(None)` if the lease was lost while queued.
async fn attempt(
    conn: &EtcdConn,
    name: &str,
    keys: &LockKeys,
    opts: &LockOptions,
    wait: bool,
) -> Result<Option<Acquired>> {
    let token = new_token();
    let holder = crate::holder::holder_id(&token);
    let mut lease = OwnLease::grant(conn, opts.ttl_value()).await?;
    let mut revoke = RevokeOnDrop {
        armed: Some((conn.clone(), lease.id)),
    };
    let prefix = &keys.lock;
    let key = holder_key(prefix, lease.id);
    // A grant whose reply was lost is sent again with the same lease: it
    // finds the key it created (one key per lease), so retrying is safe.
    let found = loop {
        let sent = if wait {
            queue_txn(conn, prefix, &key, &holder, lease.id).await
        } else {
            try_txn(conn, prefix, &key, &holder, lease.id).await
        };
        match sent {
            Err(e) if e.is_retryable() && Instant::now() + TXN_RETRY < lease.valid_until => {
                tracing::debug!(lock = %name, error = %e, "etcd grant failed; sending it again");
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => break other?,
        }
    };
    let revision = match found {
        Found::First(revision) => revision,
        Found::Refused => {
            revoke.revoke().await;
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
            let waited = wait_turn(conn, prefix, &key, revision, predecessor, &mut lease).await?;
            if !waited {
                return Ok(None);
            }
            revision
        }
    };
    let fence = fence_of(revision, opts)?;
    let deadline = lease.valid_until;
    if arrived_too_late(deadline, opts.ttl_value(), Instant::now()) {
        // The key goes with the lease.
        revoke.revoke().await;
        return Err(Error::GrantTooLate {
            name: name.to_owned(),
            elapsed: opts
                .ttl_value()
                .saturating_sub(deadline.saturating_duration_since(Instant::now())),
            ttl: opts.ttl_value(),
        });
    }
    revoke.disarm();
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

/// Waits until no key before ours (create revision `revision`) is left,
/// watching the one just before ours for its deletion, and keeping our lease
/// alive every third of the ttl. `Ok(false)`: our lease or key is gone.
async fn wait_turn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    mut predecessor: Option<String>,
    lease: &mut OwnLease,
) -> Result<bool> {
    let every = (lease.ttl / 3).max(Duration::from_millis(5));
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
        // Wait for the watch to end, keeping the lease alive meanwhile.
        loop {
            tokio::select! {
                () = deletion.ended() => break,
                () = tokio::time::sleep_until(next_keep_alive) => {
                    match lease.keep_alive(conn).await {
                        Ok(true) => next_keep_alive = Instant::now() + every,
                        Ok(false) => return Ok(false),
                        Err(e) => {
                            if Instant::now() >= lease.valid_until {
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
