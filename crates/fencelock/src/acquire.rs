//! The acquire engine: grant attempts, waiting, and locks handed over by a
//! release.
//!
//! One [`Engine`] per client. `try_acquire` is one grant attempt; `acquire`
//! repeats attempts until the wait deadline, with one token for all of them
//! (a retried grant whose first reply was lost gets the same fence back).
//! Between attempts a waiter sleeps for [`retry_delay`]: a poller backs off
//! with jitter, a queued waiter (notify, fair) sleeps until a release wakes
//! it, or until the holder's lease runs out, or until its place in the queue
//! needs renewing. A release may also hand the lock straight to a queued
//! waiter; [`handover_deadline`] decides whether such a lock is still worth
//! taking. The decisions are pure functions, tested without Redis.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Backend;
use crate::backend::ops::{Checked, Grant, GrantReply, Leave, Mint, PassOn};
use crate::backend::wire::{QueueMember, wake_channel};
use crate::error::{Error, Result, Retry};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::lease::Lease;
use crate::metrics::{LeaseMetrics, StatsHandle};
use crate::notify::{Waiter, Wakeups};
use crate::options::{LockOptions, WaitMode};
use crate::renew::Keeper;
use crate::state::{Granted, LeaseState, drift};
use crate::wait::Backoff;

/// The delay before the next attempt of a waiting acquisition whose last
/// attempt failed with `error`.
///
/// - A queued waiter (`queued`) is woken by the release; it also retries
///   just after the holder's lease ends, and at least every third of its
///   waiter lease (which renews its place in the queue).
/// - A poller backs off with jitter, but never sleeps past the holder's
///   reported expiry.
/// - After any other error (a connection problem, a grant that came too
///   late), everyone backs off.
pub(crate) fn retry_delay(
    error: &Error,
    queued: bool,
    waiter_lease: Duration,
    backoff: &mut Backoff,
) -> Duration {
    const JUST_AFTER: Duration = Duration::from_millis(1);
    match (queued, error.retry()) {
        (true, Retry::WhenFree { remaining }) => remaining
            .map_or(waiter_lease / 3, |r| r.saturating_add(JUST_AFTER))
            .min(waiter_lease / 3),
        (
            false,
            Retry::WhenFree {
                remaining: Some(r),
            },
        ) => backoff.next_delay().min(r.saturating_add(JUST_AFTER)),
        _ => backoff.next_delay(),
    }
}

/// The local deadline of a lock that a release handed over to this waiter,
/// or `None` if too little of it is left to be worth taking.
///
/// The hand-over set the lock for `provisional` at some moment after
/// `refused_at`, when this waiter's last refused attempt was sent (that
/// attempt ran before the hand-over, or it would have found the lock ours).
/// So `refused_at` is a safe start for the local deadline. With less than a
/// quarter of it left, the waiter lets it go; its next attempt picks the
/// lock up through the retry path (same token, same fence) if it is still
/// there.
pub(crate) fn handover_deadline(
    refused_at: Instant,
    provisional: Duration,
    now: Instant,
) -> Option<Instant> {
    let deadline = refused_at + provisional - drift(provisional);
    (deadline.saturating_duration_since(now) >= provisional / 4).then_some(deadline)
}

/// Whether a grant whose local deadline is `deadline` arrived too late to
/// be used: with less than a tenth of the ttl left, the holder would start
/// work with almost no time (etcd #11456).
pub(crate) fn arrived_too_late(deadline: Instant, ttl: Duration, now: Instant) -> bool {
    deadline.saturating_duration_since(now) < ttl / 10
}

/// A fresh holder token: 122 random bits, hyphenated like the guide's
/// `str(uuid.uuid4())`.
pub(crate) fn new_token() -> String {
    // Encoded directly: `to_string` goes through the formatting machinery,
    // a measurable share of an acquire's own work.
    let mut buf = uuid::Uuid::encode_buffer();
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut buf)
        .to_owned()
}

/// A refused grant attempt.
#[derive(Debug, Clone, Copy)]
struct Refused {
    /// The holder's time left, if known.
    remaining: Option<Duration>,
    /// The fence stored when the attempt was refused (see
    /// [`handover_is_fresh`]).
    seen: Option<u64>,
}

/// Where a grant attempt stands with the lock's wait queue.
#[derive(Debug, Clone, Copy, Default)]
struct Standing<'a> {
    /// The caller's queue member, if a refusal queues it.
    member: Option<&'a QueueMember>,
    /// Whether an earlier attempt may have queued the caller.
    queued: bool,
    /// Whether an earlier attempt of the same call was refused: the lock is
    /// contended, and the lease it grants releases with the next holder
    /// woken first (`Granted::contended`).
    refused: bool,
}

/// Whether a hand-over wake-up carrying `handed` can be trusted without
/// asking Redis: only if it minted a fence above `seen`, the fence stored
/// when this waiter's last attempt was refused, so the hand-over happened
/// after that attempt (fences only grow), and a deadline counted from the
/// attempt's send time is safe. A wake-up that is not above it is from
/// before the attempt: that hand-over may be long over (the waiter was
/// paused with the message queued), so it must be confirmed first. With no
/// fence stored at the refusal nothing is known: confirm.
pub(crate) fn handover_is_fresh(seen: Option<u64>, handed: Fence) -> bool {
    seen.is_some_and(|seen| handed.get() > seen)
}

/// The span of one acquisition call; its `fence` is recorded once granted.
fn acquire_span(name: &str) -> tracing::Span {
    tracing::debug_span!(
        "acquire",
        lock = %name,
        fence = tracing::field::Empty,
        outcome = tracing::field::Empty
    )
}

/// Takes locks for one client.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) backend: Backend,
    /// Names this client's waiters in wait queues and wake-up channels.
    client_id: String,
    /// The pub/sub connection, opened when a waiter first needs it.
    wakeups: tokio::sync::OnceCell<Wakeups>,
    /// Per-family counters since connect, shared with leases and resources.
    pub(crate) stats: StatsHandle,
    /// Renews every lease of the client (one task, batched renewals).
    pub(crate) keeper: Arc<Keeper>,
    /// `backend`, shared by the client's leases (one copy, not one each).
    pub(crate) lease_backend: Arc<Backend>,
}

impl Engine {
    pub(crate) fn new(backend: Backend) -> Self {
        Engine {
            lease_backend: Arc::new(backend.clone()),
            backend,
            client_id: uuid::Uuid::new_v4().simple().to_string(),
            wakeups: tokio::sync::OnceCell::new(),
            stats: StatsHandle::new(),
            keeper: Keeper::new(),
        }
    }

    /// One attempt (`try_acquire`), recorded.
    pub(crate) async fn try_acquire(
        &self,
        name: &str,
        keys: LockKeys,
        opts: &LockOptions,
    ) -> Result<Lease> {
        let (span, started) = (acquire_span(name), Instant::now());
        #[cfg(feature = "etcd")]
        if let Backend::Etcd(conn) = &self.backend {
            // Boxed: etcd's request futures are large, and this one would
            // otherwise sit on the caller's stack.
            let attempt = Box::pin(crate::backend::etcd::acquire(
                self, conn, name, &keys, opts, false,
            ));
            let result = attempt.instrument(span.clone()).await;
            return self.recorded(&span, name, opts, result, started);
        }
        let token = new_token();
        let result = self
            .grant(name, &keys, &token, opts, Standing::default())
            .instrument(span.clone())
            .await;
        self.recorded(&span, name, opts, result, started)
    }

    /// Attempts until the wait deadline (`acquire`), recorded.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: LockKeys,
        opts: &LockOptions,
    ) -> Result<Lease> {
        let (span, started) = (acquire_span(name), Instant::now());
        #[cfg(feature = "etcd")]
        if let Backend::Etcd(conn) = &self.backend {
            let attempt = Box::pin(crate::backend::etcd::acquire(
                self, conn, name, &keys, opts, true,
            ));
            let result = attempt.instrument(span.clone()).await;
            return self.recorded(&span, name, opts, result, started);
        }
        let result = self
            .wait_for(name, &keys, opts)
            .instrument(span.clone())
            .await;
        self.recorded(&span, name, opts, result, started)
    }

    /// Records the outcome of one acquisition call (its `acquire` span,
    /// metrics and stats) and returns it.
    ///
    /// The call's future is instrumented where it is awaited rather than
    /// passed in here: an `async fn` keeps its future argument and the
    /// moved copy it awaits side by side, and every acquisition future
    /// would carry that doubled size (it was three times the attempt's).
    fn recorded(
        &self,
        span: &tracing::Span,
        name: &str,
        opts: &LockOptions,
        result: Result<Lease>,
        started: Instant,
    ) -> Result<Lease> {
        if let Ok(lease) = &result {
            span.record("fence", lease.fence().get());
        }
        // Entered, so the outcome lands on this call's span (the metrics
        // record it on the current one).
        let _entered = span.enter();
        crate::metrics::acquire(&self.stats, opts.family_of(name), &result, started);
        result
    }

    /// The steps that only a waiting or replicated acquisition takes
    /// (queueing up, hand-overs, `WAIT`) run boxed: inline, their futures
    /// would widen the future of every acquisition, which is moved whole
    /// when it is created (a free lock needs none of them).
    async fn wait_for(&self, name: &str, keys: &LockKeys, opts: &LockOptions) -> Result<Lease> {
        let started = Instant::now();
        // None: a wait too long to add to the clock is a wait forever.
        let give_up = started.checked_add(opts.wait);
        // One token for every attempt of this call: if an attempt was granted
        // but its reply was lost, the next attempt gets the same grant back
        // (same fence) instead of leaving an orphaned lock until its ttl.
        let token = new_token();
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
            (waiter, member) = Box::pin(self.queue_up(name, keys, &token, opts)).await;
        }
        let mut queued = QueuedGuard::new(&self.backend, keys, member.as_ref(), opts);
        let mut backoff = Backoff::new();
        // When the last refused attempt was sent, and the fence stored then.
        let mut last_refusal: Option<(Instant, Option<u64>)> = None;
        // Whether an earlier attempt may have queued this waiter (even one
        // whose reply was lost), so a successful grant removes the entry.
        let mut tried = false;
        loop {
            let attempt_at = Instant::now();
            let standing = Standing {
                member: member.as_ref(),
                queued: tried,
                refused: last_refusal.is_some(),
            };
            let error = match self.attempt(name, keys, &token, opts, standing).await {
                Ok(Ok(lease)) => {
                    queued.disarm();
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
                (waiter, member) = Box::pin(self.queue_up(name, keys, &token, opts)).await;
                queued = QueuedGuard::new(&self.backend, keys, member.as_ref(), opts);
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
                match Box::pin(self.grant(name, keys, &token, opts, handed)).await {
                    Ok(lease) => {
                        queued.disarm();
                        return Ok(lease);
                    }
                    Err(e) if !e.is_retryable() => return Err(e),
                    Err(_) => continue,
                }
            }
            if let Some(refusal) = last_refusal
                && let Some(lease) =
                    Box::pin(self.handed_over(name, keys, &token, fence, opts, refusal)).await
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
            .get_or_try_init(|| Wakeups::connect(&self.backend))
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
    ) -> Result<Lease> {
        self.attempt(name, keys, token, opts, standing)
            .await?
            .map_err(|refused| self.contended(name, refused.remaining))
    }

    /// One grant attempt: the lease, or the refusal.
    async fn attempt(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
        standing: Standing<'_>,
    ) -> Result<std::result::Result<Lease, Refused>> {
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
                let (reply, acked) = Box::pin(self.backend.run_replicated(
                    &grant,
                    replication.replicas,
                    replication.timeout,
                ))
                .await?;
                (reply, Some(acked))
            }
            // Batched with the client's concurrent grants when it can be:
            // `sent` is taken before the call joins a batch, so the lease's
            // deadline never starts after Redis runs it.
            None => (self.backend.grant(&grant).await?, None),
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
        let granted = Granted::new(name, keys, token, fence, opts, standing.refused);
        let state = self.lease_state(granted, opts, sent + ttl - drift(ttl));
        if let (Some(replication), Some(acked)) = (opts.replication, acked)
            && acked < replication.replicas
        {
            let _ = state.release_once().await;
            return Err(Error::NotReplicated {
                name: name.to_string(),
                acked,
                wanted: replication.replicas,
            });
        }
        if arrived_too_late(state.deadline(), ttl, Instant::now()) {
            let _ = state.release_once().await;
            return Err(Error::GrantTooLate {
                name: name.to_string(),
                elapsed: sent.elapsed(),
                ttl,
            });
        }
        tracing::debug!(lock = %name, %fence, "acquired");
        Ok(Ok(Lease::start(
            state,
            &self.keeper,
            opts.renewal_interval(),
            false,
        )))
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
    ) -> Option<Lease> {
        let provisional = opts.handover_lease();
        let deadline = handover_deadline(refused_at, provisional, Instant::now())?;
        if handover_is_fresh(seen, fence) {
            let state = self.lease_state(
                Granted::new(name, keys, token, fence, opts, true),
                opts,
                deadline,
            );
            tracing::debug!(lock = %name, %fence, "acquired by hand-over");
            return Some(Lease::start(
                state,
                &self.keeper,
                opts.renewal_interval(),
                provisional < opts.ttl,
            ));
        }
        // Not valid until confirmed: the deadline moves to the
        // confirmation's send time + ttl - drift.
        let granted = Granted::new(name, keys, token, fence, opts, true);
        let state = self.lease_state(granted, opts, Instant::now());
        if !matches!(state.extend_once().await, Ok(Checked::Done))
            || arrived_too_late(state.deadline(), opts.ttl, Instant::now())
        {
            return None;
        }
        tracing::debug!(lock = %name, %fence, "acquired by hand-over");
        Some(Lease::start(
            state,
            &self.keeper,
            opts.renewal_interval(),
            false,
        ))
    }

    fn lease_state(&self, grant: Granted, opts: &LockOptions, deadline: Instant) -> LeaseState {
        let metrics = LeaseMetrics::new(opts.family_of(&grant.name).to_owned(), self.stats.clone());
        LeaseState::new(self.lease_backend.clone(), grant, deadline, metrics)
    }
}

/// Leaves the wait queue when an acquisition that may be queued ends without
/// the lock (timeout, error, or the future dropped), so a fair queue is not
/// held up by a waiter that is gone, and a lock handed over to it meanwhile
/// is passed on. Best effort: the waiter lease removes the entry anyway.
struct QueuedGuard {
    leave: Option<(Backend, LockKeys, QueueMember, Mint)>,
}

impl QueuedGuard {
    fn new(
        backend: &Backend,
        keys: &LockKeys,
        member: Option<&QueueMember>,
        opts: &LockOptions,
    ) -> Self {
        QueuedGuard {
            leave: member.map(|m| (backend.clone(), keys.clone(), m.clone(), Mint::new(opts))),
        }
    }

    fn disarm(&mut self) {
        self.leave = None;
    }
}

impl Drop for QueuedGuard {
    fn drop(&mut self) {
        let Some((backend, keys, member, mint)) = self.leave.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let leave = Leave {
                    keys: &keys,
                    mint,
                    pass_on: PassOn {
                        publish: backend.publish(),
                    },
                    member: &member,
                };
                let _ = backend.run(&leave).await;
            });
        }
    }
}

#[cfg(test)]
mod tests;
