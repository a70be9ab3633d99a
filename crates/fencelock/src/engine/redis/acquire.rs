//! Taking a lock on Redis: grant attempts, waiting, and locks handed over by
//! a release.
//!
//! `try_acquire` is one grant attempt; `acquire` repeats attempts until the
//! wait deadline, with one token for all of them (a retried grant whose
//! first reply was lost gets the same fence back). Between attempts a
//! waiter sleeps for [`retry_delay`]: a poller backs off with jitter, a
//! queued waiter (notify, fair) sleeps until a release wakes it, or until
//! the holder's lease runs out, or until its place in the queue needs
//! renewing. A release may also hand the lock straight to a queued waiter;
//! [`handover_deadline`] decides whether such a lock is still worth taking,
//! and [`handover_is_fresh`] whether its wake-up can be trusted without
//! asking Redis. The decisions are pure functions (`engine::timing`).

use std::time::Duration;

use tokio::time::Instant;

use super::RedisEngine;
use super::wakeups::{Waiter, Wakeups};
use crate::engine::Waiting;
use crate::engine::backoff::Backoff;
use crate::engine::cleanup::Cleanups;
use crate::engine::grant::{Acquired, Granted};
use crate::engine::timing::{
    arrived_too_late, drift, handover_deadline, handover_is_fresh, retry_delay,
};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::new_token;
use crate::keys::LockKeys;
use crate::options::{Access, LockOptions, Primitive, WaitMode};
use crate::store::Checked;
use crate::store::redis::RedisConn;
use crate::store::redis::ops::{
    Grant, GrantReply, Leave, Mint, PassOn, PermitKind, SemLeaving, SemRelease,
};
use crate::store::redis::wire::{QueueMember, wake_channel};

/// A refused grant attempt.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refused {
    /// The holder's time left, if known.
    pub(super) remaining: Option<Duration>,
    /// The fence stored when the attempt was refused (see
    /// [`handover_is_fresh`]).
    pub(super) seen: Option<u64>,
}

/// What one grant attempt found: the lease, a refusal, or an error.
type Attempted = Result<std::result::Result<Acquired, Refused>>;

/// Where a grant attempt stands with the lock's wait queue.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Standing<'a> {
    /// The caller's queue member, if a refusal queues it.
    pub(super) member: Option<&'a QueueMember>,
    /// Whether an earlier attempt may have queued the caller.
    pub(super) queued: bool,
    /// Whether an earlier attempt of the same call was refused: the lock is
    /// contended, and the lease it grants releases with the next holder
    /// woken first (`Granted::contended`).
    refused: bool,
}

impl RedisEngine {
    /// One attempt.
    pub(crate) async fn try_acquire(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
    ) -> Result<Acquired> {
        let token = new_token();
        let mut unreleased = None;
        let mut in_flight = GrantInFlight::new(self, keys, &token, opts);
        let granted = self
            .grant(
                name,
                keys,
                &token,
                opts,
                Default::default(),
                &mut unreleased,
            )
            .await;
        in_flight.disarm();
        granted
    }

    /// Attempts until the wait deadline; `waiting` hears why each attempt
    /// that the wait goes on from failed.
    ///
    /// A grant that an attempt had to give back (too few replicas, too
    /// late) but could not release (the master refused the write, say) is
    /// released once more when the call ends without the lock, so it does
    /// not hold the lock for the rest of its ttl when the refusal passed.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
        waiting: Waiting<'_>,
    ) -> Result<Acquired> {
        let mut unreleased = None;
        // One token for every attempt of this call: if an attempt was granted
        // but its reply was lost, the next attempt gets the same grant back
        // (same fence) instead of leaving an orphaned lock until its ttl.
        let token = new_token();
        let mut in_flight = GrantInFlight::new(self, keys, &token, opts);
        // A free lock, the common case, is taken by the first attempt
        // without the waiting loop's state (deadline, backoff, queue
        // guard): a caller that is not fair sends its first attempt with no
        // queue member anyway. A fair one queues before its first attempt.
        let first = if opts.wait_mode == WaitMode::Fair {
            None
        } else {
            let at = Instant::now();
            let outcome = self
                .attempt(
                    name,
                    keys,
                    &token,
                    opts,
                    Standing::default(),
                    &mut unreleased,
                )
                .await;
            Some((at, outcome))
        };
        let acquired = match first {
            Some((_, Ok(Ok(lease)))) => Ok(lease),
            first => {
                self.wait_for(name, keys, &token, opts, waiting, &mut unreleased, first)
                    .await
            }
        };
        in_flight.disarm();
        if acquired.is_err()
            && let Some(granted) = unreleased
            && let Err(e) = Box::pin(self.release(&granted)).await
        {
            tracing::warn!(lock = %name, error = %e, "a grant given back could not be released; it expires after its ttl");
        }
        acquired
    }

    /// The steps that only a waiting or replicated acquisition takes
    /// (queueing up, hand-overs, `WAIT`) run boxed: inline, their futures
    /// would widen the future of every acquisition, which is moved whole
    /// when it is created (a free lock needs none of them). `first`: when
    /// the first attempt was sent, and what it found (`acquire` sends it
    /// for a caller that is not fair); the wait counts from then.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
        waiting: Waiting<'_>,
        unreleased: &mut Option<Granted>,
        mut first: Option<(Instant, Attempted)>,
    ) -> Result<Acquired> {
        let started = first.as_ref().map_or_else(Instant::now, |(at, _)| *at);
        // None: a wait too long to add to the clock is a wait forever.
        let give_up = started.checked_add(opts.wait);
        // A queued waiter (notify, fair) registers for wake-ups before the
        // attempt that queues it, so a release right after a refused attempt
        // wakes it. Fair waiters queue from their first attempt; a notify
        // waiter's first attempt carries no queue member (the common case,
        // a free lock, then needs no registration and no queue), and it
        // registers and queues only once that attempt was refused.
        let queues = opts.wait_mode != WaitMode::Poll && !opts.wait.is_zero();
        let mut waiter = None;
        let mut member = None;
        if queues && opts.wait_mode == WaitMode::Fair {
            (waiter, member) = Box::pin(self.queue_up(name, keys, token, opts)).await;
        }
        let mut queued = QueuedGuard::new(self, keys, member.as_ref(), opts);
        let mut backoff = Backoff::new();
        // When the last refused attempt was sent, and the fence stored then.
        let mut last_refusal: Option<(Instant, Option<u64>)> = None;
        // Whether an earlier attempt may have queued this waiter (even one
        // whose reply was lost), so a successful grant removes the entry.
        let mut tried = false;
        loop {
            let (attempt_at, attempted) = match first.take() {
                Some(first) => first,
                None => {
                    let attempt_at = Instant::now();
                    let standing = Standing {
                        member: member.as_ref(),
                        queued: tried,
                        refused: last_refusal.is_some(),
                    };
                    let attempted = self
                        .attempt(name, keys, token, opts, standing, unreleased)
                        .await;
                    (attempt_at, attempted)
                }
            };
            let error = match attempted {
                Ok(Ok(lease)) => {
                    queued.disarm();
                    // Same token: a grant given back unreleased is this one.
                    *unreleased = None;
                    return Ok(lease);
                }
                Ok(Err(refused)) => {
                    last_refusal = Some((attempt_at, refused.seen));
                    let error = self.contended(name, refused.remaining);
                    if opts.wait.is_zero() {
                        return Err(error);
                    }
                    error
                }
                Err(e) if opts.wait.is_zero() || !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            tried = member.is_some();
            if matches!(error, Error::Contended { .. })
                && queues
                && waiter.is_none()
                && member.is_none()
            {
                // A notify waiter refused once: register, then queue with
                // the next attempt, at once.
                (waiter, member) = Box::pin(self.queue_up(name, keys, token, opts)).await;
                queued = QueuedGuard::new(self, keys, member.as_ref(), opts);
                if member.is_some() {
                    continue;
                }
            }
            let now = Instant::now();
            if give_up.is_some_and(|give_up| now >= give_up) {
                return Err(match error {
                    Error::Contended { .. } | Error::GrantTooLate { .. } => Error::Timeout {
                        name: name.to_string(),
                        waited: now - started,
                    },
                    other => other,
                });
            }
            if let Some(waiting) = waiting {
                waiting(&error);
            }
            let delay = retry_delay(&error, waiter.is_some(), opts.waiter_lease, &mut backoff);
            let sleep = tokio::time::sleep(match give_up {
                Some(give_up) => delay.min(give_up - now),
                None => delay,
            });
            let Some(w) = &waiter else {
                sleep.await;
                continue;
            };
            let handed = tokio::select! {
                handed = w.woken() => handed,
                () = sleep => None,
            };
            let Some(fence) = handed else { continue };
            if opts.replication.is_some() {
                // The release that handed the lock over wrote it on another
                // client's connection, which this client's WAIT does not
                // cover: take it through a grant (same token, same fence,
                // its lease restarted by this connection), then wait.
                let handed = Standing {
                    member: member.as_ref(),
                    queued: true,
                    refused: true,
                };
                match Box::pin(self.grant(name, keys, token, opts, handed, unreleased)).await {
                    Ok(lease) => {
                        queued.disarm();
                        *unreleased = None;
                        return Ok(lease);
                    }
                    Err(e) if !e.is_retryable() => return Err(e),
                    Err(_) => continue,
                }
            }
            if let Some(refusal) = last_refusal
                && let Some(lease) =
                    Box::pin(self.handed_over(name, keys, token, fence, opts, refusal)).await
            {
                queued.disarm();
                return Ok(lease);
            }
        }
    }

    /// Registers a waiter for wake-ups on lock `keys` and the queue member
    /// that carries it; on failure the waiter polls (`None`s).
    async fn queue_up(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
    ) -> (Option<Waiter>, Option<QueueMember>) {
        match self.register_waiter(keys).await {
            Ok(w) => {
                let member = QueueMember {
                    client: self.client_id.clone(),
                    waiter: w.id(),
                    mode: opts.wait_mode,
                    ttl: opts.ttl,
                    handover: opts.handover_lease(),
                    token: token.to_string(),
                    access: opts.access,
                };
                (Some(w), Some(member))
            }
            Err(e) => {
                tracing::warn!(lock = %name, error = %e, "cannot subscribe for wake-ups; polling instead");
                (None, None)
            }
        }
    }

    /// Registers a waiter for wake-ups on lock `keys`, opening the client's
    /// pub/sub connection on first use.
    async fn register_waiter(&self, keys: &LockKeys) -> Result<Waiter> {
        let wakeups = self
            .wakeups
            .get_or_try_init(|| Wakeups::connect(&self.conn))
            .await?;
        wakeups.register(&wake_channel(keys, &self.client_id)).await
    }

    /// One grant attempt; a refusal is [`Error::Contended`].
    async fn grant(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
        standing: Standing<'_>,
        unreleased: &mut Option<Granted>,
    ) -> Result<Acquired> {
        self.attempt(name, keys, token, opts, standing, unreleased)
            .await?
            .map_err(|refused| self.contended(name, refused.remaining))
    }

    /// One grant attempt: the lease, or the refusal. A grant it gives back
    /// but cannot release goes to `unreleased`.
    async fn attempt(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
        standing: Standing<'_>,
        unreleased: &mut Option<Granted>,
    ) -> Attempted {
        let kind = match opts.primitive() {
            Primitive::Mutex => None,
            Primitive::Semaphore(permits) => Some(PermitKind::Slots(permits)),
            Primitive::RwLock(access) => Some(PermitKind::Side(access)),
        };
        if let Some(kind) = kind {
            return Box::pin(self.attempt_permit(
                name,
                keys,
                token,
                opts,
                (kind, standing),
                unreleased,
            ))
            .await;
        }
        let ttl = opts.ttl;
        let sent = Instant::now();
        let grant = Grant {
            keys,
            mint: Mint::new(opts),
            token,
            ttl,
            wait_mode: opts.wait_mode,
            member: standing.member,
            waiter_lease: opts.waiter_lease,
            queued: standing.queued,
        };
        let (reply, acked) = match opts.replication {
            Some(replication) => {
                let (reply, acked) = match Box::pin(self.conn.run_replicated(
                    &grant,
                    replication.replicas,
                    replication.timeout,
                ))
                .await
                {
                    Ok(replied) => replied,
                    Err(e) => return Err(Box::pin(self.kind_conflict(name, keys, e)).await),
                };
                (Ok(reply), Some(acked))
            }
            // Batched with the client's concurrent grants when it can be:
            // `sent` is taken before the call joins a batch, so the lease's
            // deadline never starts after Redis runs it.
            None => (self.batches.grant(&self.conn, &grant).await, None),
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => return Err(Box::pin(self.kind_conflict(name, keys, e)).await),
        };
        let fence = match reply {
            GrantReply::Granted(fence) => fence,
            GrantReply::Held { remaining, seen } => return Ok(Err(Refused { remaining, seen })),
            GrantReply::ReservedForHead { seen } => {
                return Ok(Err(Refused {
                    remaining: None,
                    seen,
                }));
            }
        };
        let granted = Granted::on_redis(name, keys, token, fence, opts, standing.refused);
        let deadline = sent + ttl - drift(ttl);
        if let Some(refusal) = unusable(name, opts, acked, sent, deadline) {
            self.give_back(granted, unreleased).await;
            return Err(refusal);
        }
        tracing::debug!(lock = %name, %fence, "acquired");
        Ok(Ok(Acquired {
            granted,
            deadline,
            renew_now: false,
        }))
    }

    /// Releases a grant the attempt cannot use; one whose release failed
    /// goes to `unreleased`, for the caller to release once more.
    pub(super) async fn give_back(&self, granted: Granted, unreleased: &mut Option<Granted>) {
        match self.release(&granted).await {
            Ok(_) => *unreleased = None,
            Err(_) => *unreleased = Some(granted),
        }
    }

    /// A mutex call's error `e` (a grant's, a revoke's), told as
    /// [`Error::KindConflict`] when it met a semaphore or a read-write
    /// lock: a hash at the lock key with a permit count or the `rw` mark,
    /// which a grant's `SET` finds of the wrong type (looked at only on
    /// that error, so the grant itself pays nothing for it).
    pub(super) async fn kind_conflict(&self, name: &str, keys: &LockKeys, e: Error) -> Error {
        let Error::WrongType { key, .. } = &e else {
            return e;
        };
        if key != keys.lock() {
            return e;
        }
        let marks: Result<(Option<String>, Option<String>)> = self
            .conn
            .cmd(
                keys.lock(),
                redis::cmd("HMGET")
                    .arg(keys.lock())
                    .arg("permits")
                    .arg("rw"),
            )
            .await;
        let held = match marks {
            Ok((Some(_), _)) => Primitive::Semaphore(0),
            Ok((None, Some(_))) => Primitive::RwLock(Access::Write),
            _ => return e,
        };
        Error::KindConflict {
            name: name.to_owned(),
            held: held.kind(),
            asked: Primitive::Mutex.kind(),
        }
    }

    fn contended(&self, name: &str, remaining: Option<Duration>) -> Error {
        tracing::debug!(lock = %name, "contended");
        Error::Contended {
            name: name.to_string(),
            remaining,
        }
    }

    /// A lease for a lock that a release handed over to this waiter (see
    /// [`handover_deadline`]), whose last refused attempt was sent at
    /// `refusal.0` and saw fence `refusal.1` stored.
    ///
    /// A fresh wake-up ([`handover_is_fresh`]) is a hand-over made after
    /// that attempt: the lease counts from the attempt's send time, with the
    /// hand-over lease, and the keeper renews it to the full ttl at once.
    ///
    /// Any other wake-up may be older than the attempt (the waiter's process
    /// was paused with the message queued), and the hand-over may have
    /// ended meanwhile: a deadline counted from the later attempt would
    /// outlive the lock in Redis (found by `fencelock torture`, checker C4).
    /// So the lock is first confirmed with a compare-and-pexpire to the full
    /// ttl, and the lease's deadline starts when that confirmation was sent.
    /// Anything else (gone, taken, no reply) leaves the waiter waiting.
    async fn handed_over(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        fence: Fence,
        opts: &LockOptions,
        (refused_at, seen): (Instant, Option<u64>),
    ) -> Option<Acquired> {
        let provisional = opts.handover_lease();
        let deadline = handover_deadline(refused_at, provisional, Instant::now())?;
        let granted = Granted::on_redis(name, keys, token, fence, opts, true);
        if handover_is_fresh(seen, fence) {
            tracing::debug!(lock = %name, %fence, "acquired by hand-over");
            return Some(Acquired {
                granted,
                deadline,
                renew_now: provisional < opts.ttl,
            });
        }
        // Not valid until confirmed: the deadline is the confirmation's
        // send time + ttl - drift.
        let sent = Instant::now();
        if !matches!(self.extend(&granted).await, Ok(Checked::Done)) {
            return None;
        }
        let deadline = sent + opts.ttl - drift(opts.ttl);
        if arrived_too_late(deadline, opts.ttl, Instant::now()) {
            return None;
        }
        tracing::debug!(lock = %name, %fence, "acquired by hand-over");
        Some(Acquired {
            granted,
            deadline,
            renew_now: false,
        })
    }
}

/// Why a grant cannot be used, if it cannot: too few replicas acknowledged
/// it (`acked`, when the options wait for replicas), or its reply came back
/// with too little of the lease left (sent at `sent`, valid until
/// `deadline`). The caller gives the grant back.
pub(super) fn unusable(
    name: &str,
    opts: &LockOptions,
    acked: Option<u32>,
    sent: Instant,
    deadline: Instant,
) -> Option<Error> {
    if let (Some(replication), Some(acked)) = (opts.replication, acked)
        && acked < replication.replicas
    {
        return Some(Error::NotReplicated {
            name: name.to_string(),
            acked,
            wanted: replication.replicas,
        });
    }
    arrived_too_late(deadline, opts.ttl, Instant::now()).then(|| Error::GrantTooLate {
        name: name.to_string(),
        elapsed: sent.elapsed(),
        ttl: opts.ttl,
    })
}

/// Leaves the wait queue when an acquisition that may be queued ends without
/// the lock (timeout, error, or the future dropped), so a fair queue is not
/// held up by a waiter that is gone, and a lock handed over to it meanwhile
/// is passed on. Best effort: the waiter lease removes the entry anyway.
struct QueuedGuard {
    leave: Option<(Cleanups, RedisConn, LockKeys, QueueMember, Mint, bool)>,
}

impl QueuedGuard {
    fn new(
        engine: &RedisEngine,
        keys: &LockKeys,
        member: Option<&QueueMember>,
        opts: &LockOptions,
    ) -> Self {
        QueuedGuard {
            leave: member.map(|m| {
                (
                    engine.cleanups.clone(),
                    engine.conn.clone(),
                    keys.clone(),
                    m.clone(),
                    Mint::new(opts),
                    opts.primitive() != Primitive::Mutex,
                )
            }),
        }
    }

    fn disarm(&mut self) {
        self.leave = None;
    }
}

impl Drop for QueuedGuard {
    fn drop(&mut self) {
        if let Some((cleanups, conn, keys, member, mint, semaphore)) = self.leave.take() {
            spawn_leave(&cleanups, conn, keys, member, mint, semaphore);
        }
    }
}

/// Releases, from the background, a mutex that a grant of this acquisition
/// may have taken when the acquisition's future is dropped before it
/// returned (a task aborted, an asyncio call cancelled, a `select!` that
/// took another branch): a grant whose request was sent but whose reply was
/// never read holds the lock with nobody to release it, for its whole ttl.
/// It runs `leave.lua` for the acquisition's token (it deletes the lock
/// only if that token holds it, and passes a free lock on), sent after the
/// grant on the same connection, so Redis runs it after the grant. Free
/// until it fires: it borrows, and clones only when it must send.
///
/// A queued waiter's [`QueuedGuard`] also leaves with its real member. A
/// semaphore's or read-write lock's permit so granted is not released
/// here: it expires after its ttl.
struct GrantInFlight<'a> {
    engine: &'a RedisEngine,
    keys: &'a LockKeys,
    token: &'a str,
    opts: &'a LockOptions,
    armed: bool,
}

impl<'a> GrantInFlight<'a> {
    fn new(
        engine: &'a RedisEngine,
        keys: &'a LockKeys,
        token: &'a str,
        opts: &'a LockOptions,
    ) -> Self {
        GrantInFlight {
            engine,
            keys,
            token,
            opts,
            armed: opts.primitive() == Primitive::Mutex,
        }
    }

    /// The acquisition returned: what it holds, its caller holds.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GrantInFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Queued under no waiter (`u64::MAX` is never a waiter's number):
        // only the token counts, and removing this member removes nothing.
        let member = QueueMember {
            client: self.engine.client_id.clone(),
            waiter: u64::MAX,
            mode: self.opts.wait_mode,
            ttl: self.opts.ttl,
            handover: self.opts.handover_lease(),
            token: self.token.to_owned(),
            access: None,
        };
        spawn_leave(
            &self.engine.cleanups,
            self.engine.conn.clone(),
            self.keys.clone(),
            member,
            Mint::new(self.opts),
            false,
        );
    }
}

/// Sends, as a clean-up of the client (one that `LockClient::flush` waits
/// for), the leave of `member`: a mutex's `leave.lua`, or for a semaphore
/// or read-write lock `sem_release.lua`'s leave. Without a runtime nothing
/// is sent (what it would remove expires).
fn spawn_leave(
    cleanups: &Cleanups,
    conn: RedisConn,
    keys: LockKeys,
    member: QueueMember,
    mint: Mint,
    semaphore: bool,
) {
    cleanups.spawn(async move {
        let pass_on = PassOn {
            publish: conn.publish(),
        };
        if semaphore {
            let leave = SemRelease {
                lock: keys.lock(),
                mint,
                pass_on,
                what: SemLeaving::Waiter(&member),
            };
            let _ = conn.run(&leave).await;
            return;
        }
        let leave = Leave {
            keys: &keys,
            mint,
            pass_on,
            member: &member,
        };
        let _ = conn.run(&leave).await;
    });
}

#[cfg(test)]
mod tests;
