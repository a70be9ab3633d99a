//! Taking a lock on etcd: a key of its own on the client's session, the
//! grant transaction, and the wait for the predecessor (see `engine::etcd`
//! for the recipe). The result is an [`Acquired`] as on Redis: the same
//! lease layer, keeper task, loss signal, metrics and release follow. The
//! loop around an attempt (the wait's deadline, giving up, retrying)
//! serves the semaphore's attempt (`semaphore.rs`) and the read-write
//! lock's (`rwlock.rs`) too; the mutex's and the read-write lock's waiters
//! wait in `wait.rs`; what all work with is `attempt.rs`.

use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{Attempt, OwnKey, TXN_RETRY, WaitSessions, fence_and_deadline};
use super::session::{Session, Sessions, WAITER_LEASE};
use super::wait::{Ahead, move_to_session, wait_turn};
use crate::engine::cleanup::Cleanups;
use crate::engine::grant::{Acquired, EtcdHold, Granted};
use crate::error::{Error, Result};
use crate::holder::new_token;
use crate::keys::LockKeys;
use crate::options::{LockOptions, Primitive};
use crate::store::etcd::{EtcdConn, Found, holder_key, queue_txn, try_or_queue_txn, try_txn};

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
        // A trait object: the attempts' state machines are large, and
        // naming their types here would nest them into every caller's.
        let to = Attempt {
            conn,
            sessions,
            name,
            keys,
            opts,
            wait,
        };
        let pending: Pending<'_> = match opts.primitive() {
            Primitive::Semaphore(permits) => {
                let (own, to) = (&mut own, &to);
                Box::pin(async move { super::semaphore::attempt(to, permits, own).await })
            }
            Primitive::RwLock(access) => {
                let (own, to) = (&mut own, &to);
                Box::pin(async move { super::rwlock::attempt(to, access, own).await })
            }
            Primitive::Mutex => Box::pin(attempt(conn, sessions, name, keys, opts, wait, &mut own)),
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
        Found::OtherKind(held) => {
            // Nothing was created by this send, and a key an earlier one
            // created would have kept the other kind out; deleted anyway,
            // by its name (it is this attempt's alone).
            own.remove_now().await;
            return Err(Error::KindConflict {
                name: name.to_owned(),
                held,
                asked: Primitive::Mutex.kind(),
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
            let ahead = Ahead::Mutex(prefix);
            if !wait_turn(conn, ahead, (&key, revision), predecessor, &leases).await? {
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
    // Too late: `own` deletes the key.
    let (fence, deadline) = fence_and_deadline(name, opts, revision, &session, sent)?;
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
            access: None,
        },
    );
    Ok(Some(Acquired {
        granted,
        deadline,
        renew_now: false,
    }))
}
