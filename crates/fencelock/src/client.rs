//! The client: connection, defaults, and the ways to take a lock.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, LossReason, Result};
use crate::fence::Fence;
use crate::keys::{KeyLayout, LockKeys};
use crate::lease::{Grant, Lease, LeaseHandle, LeaseState, MintArgs, ReleaseOutcome, drift};
use crate::metrics::{LeaseMetrics, Stats, StatsHandle};
use crate::notify::{Waiter, Wakeups};
use crate::options::{LockOptions, WaitMode};
use crate::redis::{ConnSettings, RedisConn, scripts};
use crate::resource::FencedHash;
use crate::wait::Backoff;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lock:";

/// How long a clock-mode fence key is kept after the last grant of its name
/// (at least; twice the ttl if that is longer). Within this window, fences
/// stay increasing even if the Redis server's clock steps back.
pub const FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A handle to one Redis for taking locks. Cheap to clone; clones share one
/// multiplexed, auto-reconnecting connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::{LockClient, LockOptions};
///
/// let client = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let lease = client.acquire("invoice:42", &LockOptions::default()).await?;
/// // ... write with lease.fence() and lease.token() ...
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

#[derive(Debug)]
struct ClientInner {
    conn: RedisConn,
    prefix: String,
    defaults: LockOptions,
    /// Names this client's waiters in wait queues and wake-up channels.
    client_id: String,
    /// The pub/sub connection, opened when a waiter first needs it.
    wakeups: tokio::sync::OnceCell<Wakeups>,
    /// Per-family counters since connect, shared with leases and hashes.
    stats: StatsHandle,
}

/// Builds a [`LockClient`] with a prefix, default options and timeouts.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use std::time::Duration;
/// use fencelock::{FenceMode, KeyLayout, LockClient, LockOptions};
///
/// let client = LockClient::builder("redis://127.0.0.1:6379")
///     .prefix("jobs:")
///     .defaults(LockOptions::default().ttl(Duration::from_secs(30)))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LockClientBuilder {
    url: String,
    prefix: String,
    defaults: LockOptions,
    settings: ConnSettings,
}

impl LockClientBuilder {
    /// Key prefix for every lock of this client (default `lock:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Default options returned by [`LockClient::options`].
    pub fn defaults(mut self, defaults: LockOptions) -> Self {
        self.defaults = defaults;
        self
    }

    /// How long to wait for a TCP connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// How long to wait for any single reply (default 5 s). Renewals are also
    /// bounded by the lease deadline.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Connects.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL or invalid defaults,
    /// [`Error::Unreachable`] naming the URL, [`Error::Auth`] when the
    /// credentials are refused.
    pub async fn connect(self) -> Result<LockClient> {
        self.defaults.validate()?;
        if self.prefix.contains(['{', '}']) {
            return Err(Error::InvalidOption(format!(
                "prefix {:?} must not contain braces: they would break the hash tag",
                self.prefix
            )));
        }
        let conn = RedisConn::connect(&self.url, &self.settings).await?;
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                conn,
                prefix: self.prefix,
                defaults: self.defaults,
                client_id: uuid::Uuid::new_v4().simple().to_string(),
                wakeups: tokio::sync::OnceCell::new(),
                stats: StatsHandle::new(),
            }),
        })
    }
}

/// A snapshot of one lock, from [`LockClient::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// Nobody holds the lock.
    Free {
        /// The last fence issued for the name, if the fence key still exists.
        last_fence: Option<Fence>,
    },
    /// Someone holds the lock.
    Held {
        /// The holder's token.
        token: String,
        /// The holder's fence (known in the hash-tagged layout; in the guide
        /// layout, the last fence issued).
        fence: Option<Fence>,
        /// Lease time left as Redis sees it (`None` if the key has no expiry,
        /// which fencelock never creates).
        remaining: Option<Duration>,
    },
}

impl LockClient {
    /// Connects with default settings (prefix `lock:`, [`LockOptions::default`]).
    ///
    /// # Errors
    /// As [`LockClientBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Starts a builder for `url` (`redis://[user:password@]host:port[/db]`,
    /// `rediss://` for TLS).
    pub fn builder(url: impl Into<String>) -> LockClientBuilder {
        LockClientBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_string(),
            defaults: LockOptions::default(),
            settings: ConnSettings {
                connect_timeout: Duration::from_secs(2),
                response_timeout: Duration::from_secs(5),
            },
        }
    }

    /// The client's default options, to adjust per acquisition.
    pub fn options(&self) -> LockOptions {
        self.inner.defaults.clone()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis URL, without its password.
    pub fn url(&self) -> &str {
        self.inner.conn.url()
    }

    /// The Redis keys of lock `name` in `layout`.
    ///
    /// # Errors
    /// [`Error::InvalidName`].
    pub fn keys(&self, name: &str, layout: KeyLayout) -> Result<LockKeys> {
        LockKeys::new(&self.inner.prefix, layout, name)
    }

    /// A fenced Redis hash resource at `key` on this client's Redis (the key
    /// is used as given, without the lock prefix).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed key.
    pub fn fenced_hash(&self, key: &str) -> Result<FencedHash> {
        FencedHash::new(self.inner.conn.clone(), key, Some(self.inner.stats.clone()))
    }

    /// Per-family counters since this client connected (shared by its
    /// clones): acquisitions by outcome, renewals, losses, releases that
    /// found the lock no longer ours, the worst renewal lag, and the fenced
    /// writes of the [`FencedHash`]es it created (and of any `FencedTable`
    /// given [`LockClient::stats_handle`]). Families as in
    /// [`crate::metrics`]. Kept whether or not a metrics recorder is
    /// installed; one short mutex section per event.
    pub fn stats(&self) -> Stats {
        self.inner.stats.snapshot()
    }

    /// The storage behind [`LockClient::stats`], to share with resources
    /// created without the client (`FencedTable::with_stats`).
    pub fn stats_handle(&self) -> StatsHandle {
        self.inner.stats.clone()
    }

    /// Runs one acquisition call inside an `acquire` span and records its
    /// outcome (metrics and stats).
    async fn recorded(
        &self,
        name: &str,
        opts: &LockOptions,
        attempt: impl Future<Output = Result<Lease>>,
    ) -> Result<Lease> {
        let span = tracing::debug_span!(
            "acquire",
            lock = %name,
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        async {
            let started = Instant::now();
            let result = attempt.await;
            if let Ok(lease) = &result {
                tracing::Span::current().record("fence", lease.fence().get());
            }
            crate::metrics::acquire(&self.inner.stats, opts.family_of(name), &result, started);
            result
        }
        .instrument(span)
        .await
    }

    /// Tries once to take lock `name`.
    ///
    /// # Errors
    /// [`Error::Contended`] when someone else holds it; [`Error::GrantTooLate`]
    /// when the reply came back with too little of the lease left (the grant
    /// is released again); bad input, wrong key types and connection errors
    /// as described on [`Error`].
    ///
    /// # Cancel safety
    /// If the future is dropped after the request was sent, the lock may be
    /// granted with nobody holding the guard; it then expires after its ttl.
    pub async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        self.recorded(name, opts, async {
            opts.validate()?;
            let keys = self.keys(name, opts.layout)?;
            self.grant(name, keys, &new_token(), opts, "", false).await
        })
        .await
    }

    /// Takes lock `name`, waiting up to the options' wait deadline (zero means
    /// try once) with capped, jittered exponential backoff that never sleeps
    /// past the holder's reported expiry.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming the lock when the wait deadline passed while
    /// the lock was held ([`Error::Contended`] with a wait of zero); the last
    /// connection error when Redis stayed unreachable; otherwise as
    /// [`LockClient::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`LockClient::try_acquire`].
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        self.recorded(name, opts, self.acquire_waiting(name, opts))
            .await
    }

    /// [`LockClient::acquire`] without the recording.
    async fn acquire_waiting(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        opts.validate()?;
        let keys = self.keys(name, opts.layout)?;
        let started = Instant::now();
        let give_up = started + opts.wait;
        // One token for every attempt of this call: if an attempt was granted
        // but its reply was lost, the next attempt gets the same grant back
        // (same fence) instead of leaving an orphaned lock until its ttl.
        let token = new_token();
        // Notify and fair waiters register before their first attempt, so a
        // release that happens right after a refused attempt wakes them.
        let waiter = match (opts.wait_mode, opts.wait.is_zero()) {
            (WaitMode::Poll, _) | (_, true) => None,
            _ => match self.register_waiter(&keys).await {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(lock = %name, error = %e, "cannot subscribe for wake-ups; polling instead");
                    None
                }
            },
        };
        // A queued waiter carries what a release needs to hand it the lock
        // (always in fair mode; in notify mode once it is starving).
        let member = match &waiter {
            Some(w) => format!(
                "{}:{}:{}:{}:{token}",
                w.member(),
                opts.wait_mode.as_arg(),
                opts.ttl.as_millis(),
                opts.handover_lease().as_millis()
            ),
            None => String::new(),
        };
        let mut queued = QueuedGuard::new(self, &keys, &member, &token, opts);
        let mut backoff = Backoff::new();
        let mut refused_at = None;
        // Whether an earlier attempt may have queued this waiter (even one
        // whose reply was lost), so a successful grant removes the entry.
        let mut tried = false;
        loop {
            let attempt_at = Instant::now();
            let error = match self
                .grant(name, keys.clone(), &token, opts, &member, tried)
                .await
            {
                Ok(lease) => {
                    queued.disarm();
                    return Ok(lease);
                }
                Err(e) if opts.wait.is_zero() || !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            tried = true;
            if matches!(error, Error::Contended { .. }) {
                refused_at = Some(attempt_at);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(match error {
                    Error::Contended { .. } | Error::GrantTooLate { .. } => Error::Timeout {
                        name: name.to_string(),
                        waited: now - started,
                    },
                    other => other,
                });
            }
            let delay = match (&waiter, &error) {
                // Queued: woken by the release; otherwise retry when the
                // holder's lease runs out, and often enough to renew our place.
                (Some(_), Error::Contended { remaining, .. }) => remaining
                    .map_or(opts.waiter_lease / 3, |r| r + Duration::from_millis(1))
                    .min(opts.waiter_lease / 3),
                (
                    None,
                    Error::Contended {
                        remaining: Some(r), ..
                    },
                ) => backoff.next_delay().min(*r + Duration::from_millis(1)),
                _ => backoff.next_delay(),
            };
            let sleep = tokio::time::sleep(delay.min(give_up - now));
            let Some(w) = &waiter else {
                sleep.await;
                continue;
            };
            let handed = tokio::select! {
                handed = w.woken() => handed,
                () = sleep => None,
            };
            if let (Some(fence), Some(refused_at)) = (handed, refused_at)
                && let Some(lease) =
                    self.handed_over(name, &keys, &token, Fence::new(fence), opts, refused_at)
            {
                queued.disarm();
                return Ok(lease);
            }
        }
    }

    /// Registers a waiter for wake-ups on lock `keys`, opening the client's
    /// pub/sub connection on first use.
    async fn register_waiter(&self, keys: &LockKeys) -> Result<Waiter> {
        let wakeups = self
            .inner
            .wakeups
            .get_or_try_init(|| Wakeups::connect(&self.inner.conn, self.inner.client_id.clone()))
            .await?;
        wakeups
            .register(&format!("{}{}", keys.wake_prefix, self.inner.client_id))
            .await
    }

    /// Runs `work` while holding lock `name`, then releases it.
    ///
    /// The critical section gets a [`LeaseHandle`] (for `fence()` and
    /// `token()`). If the lease is lost while `work` runs, `work` is dropped
    /// (cancelled at its next `.await`) and [`Error::LockLost`] is returned
    /// with the fence. The lock is released on every path.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// let written = client
    ///     .with_lock("invoice:42", &client.options(), |lease| async move {
    ///         // every protected write carries lease.fence()
    ///         lease.fence()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`LockClient::acquire`]; [`Error::LockLost`] when the lease was lost
    /// during `work` or found no longer ours at release (the work may then
    /// have overlapped with the next holder, and its fenced writes may have
    /// been refused).
    pub async fn with_lock<T, F, Fut>(&self, name: &str, opts: &LockOptions, work: F) -> Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(name, opts).await?;
        let output = {
            let work = work(lease.handle());
            tokio::select! {
                biased;
                () = lease.lost() => None,
                out = work => Some(out),
            }
        };
        let handle = lease.handle();
        let released = lease.release().await;
        match (output, released) {
            (Some(out), Ok(ReleaseOutcome::Released)) => Ok(out),
            (Some(_), Ok(ReleaseOutcome::NotOurs(reason))) => Err(handle.state.loss_error(reason)),
            (Some(_), Err(e)) => Err(e),
            (None, _) => Err(handle.state.loss_error(LossReason::DeadlinePassed)),
        }
    }

    /// Reads the current state of lock `name` (one atomic script).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::WrongType`] and connection errors.
    pub async fn inspect(&self, name: &str, layout: KeyLayout) -> Result<LockState> {
        let keys = self.keys(name, layout)?;
        let (value, pttl, fence): (Option<String>, i64, Option<String>) = self
            .inner
            .conn
            .run(&scripts::INSPECT, &[&keys.lock, &keys.fence], &[])
            .await?;
        let last_fence = fence.and_then(|f| f.parse::<Fence>().ok());
        Ok(match value {
            None => LockState::Free { last_fence },
            Some(v) => {
                let (token, fence) = match (layout, v.rsplit_once(':')) {
                    (KeyLayout::HashTagged, Some((t, f))) => (t.to_string(), f.parse().ok()),
                    _ => (v, last_fence),
                };
                LockState::Held {
                    token,
                    fence,
                    remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
                }
            }
        })
    }

    /// One grant attempt.
    async fn grant(
        &self,
        name: &str,
        keys: LockKeys,
        token: &str,
        opts: &LockOptions,
        member: &str,
        queued: bool,
    ) -> Result<Lease> {
        let ttl = opts.ttl;
        let mint = MintArgs::new(opts);
        let sent = Instant::now();
        let (granted, n): (i64, i64) = self
            .inner
            .conn
            .run(
                &scripts::LOCK,
                &keys.all(),
                &[
                    "grant",
                    token,
                    &ttl.as_millis().to_string(),
                    mint.fence_mode,
                    mint.format,
                    &mint.retention,
                    opts.wait_mode.as_arg(),
                    member,
                    &opts.waiter_lease.as_millis().to_string(),
                    if queued { "1" } else { "0" },
                ],
            )
            .await?;
        if granted != 1 {
            tracing::debug!(lock = %name, "contended");
            return Err(Error::Contended {
                name: name.to_string(),
                remaining: u64::try_from(n).ok().map(Duration::from_millis),
            });
        }
        let fence = Fence::new(
            u64::try_from(n).map_err(|_| Error::UnexpectedReply(format!("negative fence {n}")))?,
        );
        let state = self.lease_state(name, keys, token, fence, opts, sent + ttl - drift(ttl));
        // A reply that used up most of the lease is useless and dangerous: the
        // holder would start work with almost no time left (etcd #11456).
        if state.deadline().saturating_duration_since(Instant::now()) < ttl / 10 {
            let _ = state.release_once().await;
            return Err(Error::GrantTooLate {
                name: name.to_string(),
                elapsed: sent.elapsed(),
                ttl,
            });
        }
        tracing::debug!(lock = %name, %fence, "acquired");
        Ok(Lease::start(state, opts.renewal_interval(), false))
    }

    /// A lease for a lock that a release handed over to this (fair) waiter.
    ///
    /// The hand-over set the lock for min(ttl, waiter lease) at some moment
    /// after `refused_at`, when this waiter's last refused attempt was sent
    /// (that attempt ran before the hand-over, or it would have found the
    /// lock ours). So `refused_at` is a safe start for the local deadline.
    /// The keeper renews at once to the full ttl. Returns `None` if too little
    /// of that provisional lease is left; the next attempt then picks the
    /// lock up through the retry path (same token, same fence).
    fn handed_over(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        fence: Fence,
        opts: &LockOptions,
        refused_at: Instant,
    ) -> Option<Lease> {
        let provisional = opts.handover_lease();
        let deadline = refused_at + provisional - drift(provisional);
        if deadline.saturating_duration_since(Instant::now()) < provisional / 4 {
            return None;
        }
        let state = self.lease_state(name, keys.clone(), token, fence, opts, deadline);
        tracing::debug!(lock = %name, %fence, "acquired by hand-over");
        Some(Lease::start(
            state,
            opts.renewal_interval(),
            provisional < opts.ttl,
        ))
    }

    fn lease_state(
        &self,
        name: &str,
        keys: LockKeys,
        token: &str,
        fence: Fence,
        opts: &LockOptions,
        deadline: Instant,
    ) -> LeaseState {
        let value = match opts.layout {
            KeyLayout::HashTagged => format!("{token}:{fence}"),
            KeyLayout::Guide => token.to_string(),
        };
        LeaseState::new(
            self.inner.conn.clone(),
            Grant {
                name: name.to_string(),
                keys,
                token: token.to_string(),
                value,
                fence,
                ttl: opts.ttl,
                deadline,
                mint: MintArgs::new(opts),
            },
            LeaseMetrics::new(opts.family_of(name).to_owned(), self.inner.stats.clone()),
        )
    }
}

/// A fresh holder token: 122 random bits, hyphenated like the guide's
/// `str(uuid.uuid4())`.
fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Leaves the wait queue when an acquisition that may be queued ends without
/// the lock (timeout, error, or the future dropped), so a fair queue is not
/// held up by a waiter that is gone, and a lock handed over to it meanwhile
/// is passed on. Best effort: the waiter lease removes the entry anyway.
struct QueuedGuard {
    leave: Option<(RedisConn, LockKeys, [String; 5])>,
}

impl QueuedGuard {
    fn new(
        client: &LockClient,
        keys: &LockKeys,
        member: &str,
        token: &str,
        opts: &LockOptions,
    ) -> Self {
        QueuedGuard {
            leave: (!member.is_empty()).then(|| {
                let mint = MintArgs::new(opts);
                (
                    client.inner.conn.clone(),
                    keys.clone(),
                    [
                        member.to_string(),
                        token.to_string(),
                        mint.fence_mode.to_string(),
                        mint.format.to_string(),
                        mint.retention,
                    ],
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
        let Some((conn, keys, [member, token, fence_mode, format, retention])) = self.leave.take()
        else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _: Result<i64> = conn
                    .run(
                        &scripts::LOCK,
                        &keys.all(),
                        &[
                            "leave",
                            &member,
                            &token,
                            &fence_mode,
                            &format,
                            &retention,
                            &keys.wake_prefix,
                            PUBLISH,
                        ],
                    )
                    .await;
            });
        }
    }
}

/// The publish command of wake-ups on a single Redis (Cluster uses SPUBLISH).
pub(crate) const PUBLISH: &str = "PUBLISH";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::FenceMode;
    use fencelock_testkit::RedisServer;

    /// The release script wakes a waiter with whichever publish command it is
    /// given: `SPUBLISH` (sharded pub/sub, for Cluster) reaches a connection
    /// subscribed with `SSUBSCRIBE` to the waiter's channel, which shares the
    /// lock's hash slot.
    #[tokio::test]
    async fn the_release_script_wakes_over_sharded_pub_sub() -> Result<()> {
        let server = RedisServer::start();
        let client = LockClient::connect(&server.url()).await?;
        let keys = client.keys("job", KeyLayout::HashTagged)?;
        let channel = format!("{}ghostclient", keys.wake_prefix);
        let mut sub = redis::Client::open(server.url())
            .and_then(|c| c.get_connection())
            .map_err(Error::Redis)?;
        sub.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(Error::Redis)?;
        sub.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&channel).get_packed_command())
            .map_err(Error::Redis)?;
        let confirmed = sub.recv_response().map_err(Error::Redis)?;
        assert!(
            format!("{confirmed:?}").contains("ssubscribe"),
            "{confirmed:?}"
        );

        let opts = LockOptions::default().renewal(crate::Renewal::Off);
        let lease = client.try_acquire("job", &opts).await?;
        // A young notify waiter (arrival far in the future): woken, not handed.
        let member = "ghostclient:7:notify:10000:100:0b5e7a9c-0000-4000-8000-000000000001";
        server.cmd(&["ZADD", &keys.queue, "99999999999999999", member]);
        server.cmd(&["ZADD", &keys.waiters, "99999999999999", member]);
        let mint = MintArgs::new(&opts);
        let value = format!("{}:{}", lease.token(), lease.fence());
        let released: i64 = client
            .inner
            .conn
            .run(
                &scripts::LOCK,
                &keys.all(),
                &[
                    "release",
                    &value,
                    mint.fence_mode,
                    mint.format,
                    &mint.retention,
                    &keys.wake_prefix,
                    "SPUBLISH",
                ],
            )
            .await?;
        assert_eq!(released, 1);
        let message = sub.recv_response().map_err(Error::Redis)?;
        let text = format!("{message:?}");
        assert!(
            text.contains("smessage") && text.contains(&channel) && text.contains("\"7\""),
            "{text}"
        );
        drop(lease);
        Ok(())
    }

    /// A retried grant with the same token (its first reply lost) returns the
    /// same fence, mints nothing new and restarts the lease; a different token
    /// is refused.
    #[tokio::test]
    async fn a_retried_grant_returns_the_same_fence() -> Result<()> {
        let server = RedisServer::start();
        let client = LockClient::connect(&server.url()).await?;
        for (layout, mode) in [
            (KeyLayout::HashTagged, FenceMode::Clock),
            (KeyLayout::HashTagged, FenceMode::Counter),
            (KeyLayout::Guide, FenceMode::Counter),
            (KeyLayout::Guide, FenceMode::Clock),
        ] {
            let name = format!("retry-{layout:?}-{mode:?}");
            let opts = LockOptions::default()
                .ttl(Duration::from_secs(5))
                .renewal(crate::Renewal::Off)
                .layout(layout)
                .fence_mode(mode);
            let keys = client.keys(&name, layout)?;
            let token = new_token();
            let first = client
                .grant(&name, keys.clone(), &token, &opts, "", false)
                .await?;
            let fence_key_before: Option<String> = server.query(&["GET", &keys.fence]);
            server.cmd(&["PEXPIRE", &keys.lock, "1000"]);
            let again = client
                .grant(&name, keys.clone(), &token, &opts, "", false)
                .await?;
            assert_eq!(first.fence(), again.fence(), "{layout:?} {mode:?}");
            let fence_key_after: Option<String> = server.query(&["GET", &keys.fence]);
            assert_eq!(fence_key_before, fence_key_after, "no new fence minted");
            let pttl: i64 = server.query(&["PTTL", &keys.lock]);
            assert!(pttl > 4000, "the retry restarted the lease (pttl {pttl})");
            let other = client
                .grant(&name, keys, &new_token(), &opts, "", false)
                .await;
            assert!(matches!(other, Err(Error::Contended { .. })), "{other:?}");
            // Both guards name the same grant: the first release deletes it.
            assert_eq!(again.release().await?, ReleaseOutcome::Released);
            assert_eq!(
                first.release().await?,
                ReleaseOutcome::NotOurs(LossReason::Expired)
            );
        }
        Ok(())
    }
}
