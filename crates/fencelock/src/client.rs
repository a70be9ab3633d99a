//! The client façade: [`LockClient`], its builder, and what it offers —
//! `try_acquire` / `acquire` / `with_lock` (leases from `crate::lease`,
//! grants from `crate::engine`), `revoke`, `inspect`, fenced resources and
//! stats. It
//! checks its input and delegates; which kind of store is behind it is the
//! engine's business, never this file's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::audit::Audit;
use crate::engine::{Engine, LockState};
use crate::error::{Error, LossReason, Result};
use crate::keys::{KeyLayout, LockKeys, key_text_problem};
use crate::lease::{Lease, LeaseHandle, Leases, ReleaseOutcome};
use crate::metrics::{Stats, StatsHandle};
use crate::options::{LockOptions, MAX_CONNECTION_TIMEOUT};
use crate::resource::{FencedHash, Revoked, Sealable, Sealed};
use crate::store::ConnSettings;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lock:";

/// Longest accepted key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// A handle to one Redis deployment (or, with the `etcd` feature, one etcd
/// cluster) for taking locks. Cheap to clone; clones share one multiplexed,
/// auto-reconnecting connection.
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
    leases: Leases,
    prefix: String,
    defaults: LockOptions,
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
#[derive(Clone)]
pub struct LockClientBuilder {
    url: String,
    prefix: String,
    defaults: LockOptions,
    settings: ConnSettings,
}

/// Shows the URL without its password ([`crate::redact_url`]).
impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("url", &crate::store::redact(&self.url))
            .field("prefix", &self.prefix)
            .field("defaults", &self.defaults)
            .field("settings", &self.settings)
            .finish()
    }
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

    /// How long to wait for a TCP connection (default 2 s; above zero and
    /// at most [`MAX_CONNECTION_TIMEOUT`], checked by
    /// [`connect`](Self::connect)).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// How long to wait for any single reply (default 5 s; above zero and at
    /// most [`MAX_CONNECTION_TIMEOUT`], checked by
    /// [`connect`](Self::connect)). Renewals are also bounded by the lease
    /// deadline.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Trusts the CA certificate in the PEM file `path` for `rediss` URLs
    /// (TLS), instead of the system's roots: for sentinels and data nodes
    /// alike.
    pub fn tls_ca(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.settings.tls.ca = Some(path.into());
        self
    }

    /// Presents the client certificate and key in the PEM files `cert` and
    /// `key` (mutual TLS, for servers with `tls-auth-clients yes`).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.settings.tls.cert = Some(cert.into());
        self.settings.tls.key = Some(key.into());
        self
    }

    /// Connects.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL, invalid defaults or a
    /// connect or response timeout of zero or above
    /// [`MAX_CONNECTION_TIMEOUT`],
    /// and on etcd for a namespace (`?prefix=`) without a closing `/` or a
    /// lock prefix with a `/` (the two could join into another pair's
    /// keys), [`Error::Unreachable`] naming the URL, [`Error::Auth`] when
    /// the credentials are refused.
    pub async fn connect(self) -> Result<LockClient> {
        self.defaults.validate()?;
        // Deadlines are computed as `now + timeout` (and multiples of it for
        // Sentinel): an unbounded timeout would overflow the clock.
        for (what, timeout) in [
            ("connect timeout", self.settings.connect_timeout),
            ("response timeout", self.settings.response_timeout),
        ] {
            if timeout.is_zero() || timeout > MAX_CONNECTION_TIMEOUT {
                return Err(Error::InvalidOption(format!(
                    "{what} {timeout:?} is out of range: above zero and at most {} s",
                    MAX_CONNECTION_TIMEOUT.as_secs()
                )));
            }
        }
        let shown: String = self.prefix.chars().take(64).collect();
        if self.prefix.contains(['{', '}']) {
            return Err(Error::InvalidOption(format!(
                "prefix {shown:?} must not contain braces: they would break the hash tag"
            )));
        }
        if let Some(problem) = key_text_problem(&self.prefix, MAX_PREFIX_LEN) {
            return Err(Error::InvalidOption(format!(
                "prefix {shown:?} cannot be used: {problem} (at most {MAX_PREFIX_LEN} bytes of visible text)"
            )));
        }
        let engine = Engine::connect(&self.url, &self.settings).await?;
        engine.check_prefix(&self.prefix)?;
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                leases: Leases::new(engine),
                prefix: self.prefix,
                defaults: self.defaults,
            }),
        })
    }
}

impl LockClient {
    /// Connects with default settings (prefix `lock:`, [`LockOptions::default`]).
    ///
    /// # Errors
    /// As [`LockClientBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Starts a builder for `url`, one URL for every topology:
    ///
    /// - `redis://[user:password@]host:port[/db]` — one server (a Cluster
    ///   node given this way is detected and used as a Cluster seed);
    ///   `rediss://` for TLS; `unix:///path[?db=N&pass=…]` for a socket;
    /// - `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER[?db=N]`
    ///   — the master the sentinels name `MASTER`, followed across
    ///   failovers (`rediss+sentinel://` for TLS to sentinels and data
    ///   nodes; `sentinel_password=` if the sentinels have their own);
    /// - `redis+cluster://[user:password@]host:port[,host:port…]` — Redis
    ///   Cluster (`rediss+cluster://` for TLS);
    /// - `etcd://[user:password@]host[:port][,host[:port]…][?prefix=NAMESPACE/]`
    ///   — an etcd cluster (feature `etcd`; `etcds://` for TLS; port 2379 by
    ///   default; `prefix` is put in front of every key the client touches,
    ///   and must end with `/`; the lock prefix must then have no `/`, so
    ///   the two never join into another pair's keys).
    ///   The same API, with etcd's guarantees: see the crate docs, "etcd".
    ///
    /// TLS trusts the system's roots unless [`LockClientBuilder::tls_ca`]
    /// names a CA.
    pub fn builder(url: impl Into<String>) -> LockClientBuilder {
        LockClientBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_string(),
            defaults: LockOptions::default(),
            settings: ConnSettings::default(),
        }
    }

    /// The client's default options, to adjust per acquisition.
    pub fn options(&self) -> LockOptions {
        self.inner.defaults.clone()
    }

    /// The engine behind this client.
    pub(crate) fn engine(&self) -> &Engine {
        self.inner.leases.engine()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        self.engine().url()
    }

    /// The keys of lock `name` in `layout`.
    ///
    /// On etcd, `lock` is the prefix of the lock's keys
    /// (`NAMESPACE PREFIX NAME/`, `/` and `%` in the name escaped): each
    /// holder or waiter has the key `lock` + its lease id in hex; the other
    /// fields are empty (etcd needs no fence key, queue or channel).
    ///
    /// # Errors
    /// [`Error::InvalidName`].
    pub fn keys(&self, name: &str, layout: KeyLayout) -> Result<LockKeys> {
        self.engine().keys(&self.inner.prefix, name, layout)
    }

    /// The keys of lock `name` for a call on this client's deployment: the
    /// guide layout is refused on a Cluster, where its keys would land in
    /// different slots, and on etcd, which has no such layout.
    fn lock_keys(&self, name: &str, layout: KeyLayout) -> Result<LockKeys> {
        self.engine().lock_keys(&self.inner.prefix, name, layout)
    }

    /// A fenced Redis hash resource at `key` on this client's Redis (the key
    /// is used as given, without the lock prefix). One of the keys this
    /// client's locks keep (`PREFIX{NAME}`, alone or with `:fence`, `:queue`
    /// or `:waiters` after it) is refused: a hash there would break that
    /// lock. In the guide layout any key under the prefix is some name's
    /// lock key; keep resources outside the prefix there.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed key, or
    /// one of a lock's own keys;
    /// [`Error::InvalidOption`] on an etcd client (use
    /// [`LockClient::fenced_key`] there, or a Redis client for the hash:
    /// fences from any backend work with it).
    pub fn fenced_hash(&self, key: &str) -> Result<FencedHash> {
        FencedHash::new(
            self.engine().redis()?.clone(),
            key,
            &self.inner.prefix,
            Some(self.inner.leases.stats().clone()),
        )
    }

    /// A fenced key in this client's etcd (feature `etcd`): `key` is used as
    /// given, after the URL's namespace (`?prefix=`), without the lock
    /// prefix. Locks and fenced keys share the namespace, so a key that
    /// starts with the lock prefix and has a `/` after it (`lock:job/1`,
    /// shaped like a holder's key) is refused: etcd's lock recipe would
    /// take it for a holder that never expires.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed key, or
    /// one in the locks' key space;
    /// [`Error::InvalidOption`] on a Redis client (use
    /// [`LockClient::fenced_hash`] there).
    #[cfg(feature = "etcd")]
    pub fn fenced_key(&self, key: &str) -> Result<crate::FencedKey> {
        let Some(conn) = self.engine().etcd() else {
            return Err(Error::InvalidOption(
                "fenced keys live in etcd, but this client is connected to Redis: use fenced_hash"
                    .into(),
            ));
        };
        crate::FencedKey::new(
            conn.clone(),
            key,
            &self.inner.prefix,
            Some(self.inner.leases.stats().clone()),
        )
    }

    /// The kind of store behind this client: `"redis"` or `"etcd"`.
    pub fn backend_kind(&self) -> &'static str {
        self.engine().kind()
    }

    /// Per-family counters since this client connected (shared by its
    /// clones): acquisitions by outcome, renewals, losses, releases that
    /// found the lock no longer ours, the worst renewal lag, and the fenced
    /// writes of the [`FencedHash`]es it created (and of any `FencedTable`
    /// given [`LockClient::stats_handle`]). Families as in
    /// [`crate::metrics`]. Kept whether or not a metrics recorder is
    /// installed; one short mutex section per event.
    pub fn stats(&self) -> Stats {
        self.inner.leases.stats().snapshot()
    }

    /// The storage behind [`LockClient::stats`], to share with resources
    /// created without the client (`FencedTable::with_stats`).
    pub fn stats_handle(&self) -> StatsHandle {
        self.inner.leases.stats().clone()
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
    /// If the future is dropped after the request was sent, the grant may
    /// still take the lock, with nobody holding the guard. On Redis a
    /// mutex so taken is released from the background (a release for this
    /// acquisition's token, sent after the grant on the same connection;
    /// [`LockClient::flush`] waits for it); a semaphore's or read-write
    /// lock's permit so taken expires after its ttl.
    pub async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        opts.validate()?;
        let keys = self.lock_keys(name, opts.layout)?;
        self.inner.leases.try_acquire(name, keys, opts).await
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
    /// As [`LockClient::try_acquire`]; a queued waiter also leaves the wait
    /// queue in the background, passing on a lock handed to it meanwhile.
    /// On etcd, a dropped acquisition removes its key in the background.
    /// [`LockClient::flush`] waits for these. When the wait runs
    /// out, the key is removed before `Timeout` is returned.
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        opts.validate()?;
        let keys = self.lock_keys(name, opts.layout)?;
        self.inner.leases.acquire(name, keys, opts, None).await
    }

    /// [`LockClient::acquire`], telling `waiting` why the wait goes on: it
    /// is called with the error each failed attempt ended with, while the
    /// wait deadline has not passed — the lock held ([`Error::Contended`]),
    /// a master that takes no writes for now (`NOREPLICAS`, `READONLY`, …:
    /// [`Error::Unreachable`] with its code), Redis unreachable, too few
    /// replicas ([`Error::NotReplicated`]). For a progress line that says
    /// why a caller waits. On etcd a waiter watches the holder before it
    /// and `waiting` hears nothing.
    ///
    /// # Errors
    /// As [`LockClient::acquire`].
    pub async fn acquire_reporting(
        &self,
        name: &str,
        opts: &LockOptions,
        waiting: &(dyn Fn(&Error) + Send + Sync),
    ) -> Result<Lease> {
        opts.validate()?;
        let keys = self.lock_keys(name, opts.layout)?;
        self.inner
            .leases
            .acquire(name, keys, opts, Some(waiting))
            .await
    }

    /// Waits until the clean-ups this client sends in the background have
    /// finished: the release of a [`Lease`] dropped without
    /// [`Lease::release`], and on etcd the revocation of an acquisition's
    /// lease (and so of its waiter's key) when its future was dropped.
    /// Dropping cannot wait, so these run as tasks of their own, and a
    /// runtime that ends first cancels them (the store then removes what
    /// they would have by its ttl; on etcd a waiter's key by the short
    /// waiter lease, see the README). Call it before a process ends right
    /// after dropping an acquisition or a lease, e.g. in a Ctrl-C handler;
    /// bound it with a timeout if the store may be unreachable.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencelock::Error> {
    /// use std::time::Duration;
    /// use fencelock::LockClient;
    ///
    /// let client = LockClient::connect("etcd://127.0.0.1:2379").await?;
    /// let opts = client.options().wait(Duration::from_secs(60));
    /// tokio::select! {
    ///     lease = client.acquire("nightly", &opts) => { lease?.release().await?; }
    ///     _ = tokio::signal::ctrl_c() => {}
    /// }
    /// // The waiter's key is gone before the process ends.
    /// let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self) {
        self.engine().cleanups().finished().await;
    }

    /// [`LockClient::try_acquire`] as a future that owns what it needs
    /// (`Send + 'static`): for code that spawns the attempt or hands it to
    /// another runtime or event loop (a language binding, say). Dropping it
    /// is as dropping [`LockClient::try_acquire`]'s.
    pub fn try_acquire_owned(
        &self,
        name: impl Into<String>,
        opts: LockOptions,
    ) -> impl Future<Output = Result<Lease>> + Send + 'static {
        let (client, name) = (self.clone(), name.into());
        async move { client.try_acquire(&name, &opts).await }
    }

    /// [`LockClient::acquire`] as a future that owns what it needs (`Send +
    /// 'static`), as [`LockClient::try_acquire_owned`].
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), Box<dyn std::error::Error>> {
    /// let lease = tokio::spawn(client.acquire_owned("invoice:42", client.options())).await??;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn acquire_owned(
        &self,
        name: impl Into<String>,
        opts: LockOptions,
    ) -> impl Future<Output = Result<Lease>> + Send + 'static {
        let (client, name) = (self.clone(), name.into());
        async move { client.acquire(&name, &opts).await }
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

    /// The names of the held locks whose names match `pattern` (a Redis
    /// glob such as `invoice:*`) in `layout`, sorted; found with `SCAN` on
    /// every master (never `KEYS`, which blocks the server). On etcd: one
    /// keys-only range read of the prefix, the glob applied here.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn lock_names(&self, pattern: &str, layout: KeyLayout) -> Result<Vec<String>> {
        self.engine()
            .lock_names(&self.inner.prefix, pattern, layout)
            .await
    }

    /// How many waiters are queued for lock `name` (notify and fair modes;
    /// on etcd, every waiter: the keys behind the holder's).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::WrongType`] and connection errors.
    pub async fn waiters(&self, name: &str, layout: KeyLayout) -> Result<u64> {
        let keys = self.lock_keys(name, layout)?;
        self.engine().waiters(&keys).await
    }

    /// Audits the Redis deployment behind this client: whether it provides
    /// what fencelock's guarantees assume (version, role, replication,
    /// eviction, persistence for the default fence mode, the server clock
    /// against this host's and against the stored clock fences, the
    /// user's permissions, the round trip against the default ttl), and
    /// what to change where it does not. [`crate::audit`] lists the checks.
    ///
    /// It reads `INFO`, `TIME` and the fence keys under the prefix (one
    /// `SCAN` and `MGET` per thousand keys), and probes the permissions by
    /// running fencelock's own operations on a probe lock of its own under
    /// the prefix (deleted afterwards), without touching any other lock.
    /// A missing permission is a row of the audit, not an error.
    ///
    /// # Errors
    /// Connection errors ([`Error::Unreachable`] and the like) when Redis
    /// cannot be reached while auditing.
    pub async fn audit(&self) -> Result<Audit> {
        self.engine()
            .audit(&self.inner.prefix, &self.inner.defaults)
            .await
    }

    /// Takes lock `name` away from whoever holds it — no token of the
    /// holder needed — and seals `resources` at the revocation fence: from
    /// the moment this returns, the deposed holder's writes to them are
    /// refused, and every later holder's accepted.
    ///
    /// In order:
    /// 1. **Depose**, in one atomic step: on Redis one script mints a fence
    ///    above every fence issued for the name (and stores it, so every
    ///    later grant's fence is above it), deletes the lock whoever holds
    ///    it, and passes it on to the head waiter as a release does; on etcd
    ///    one transaction deletes the holder's key, and the revocation fence
    ///    lies just below the next key in the queue. Waiters keep their
    ///    places.
    /// 2. **Seal** each resource at the revocation fence ([`Sealable`]):
    ///    every fence up to it is refused there from then on. A resource
    ///    that a later holder wrote first is sealed by that holder's greater
    ///    fence already ([`Sealed::outcome`] `Rejected`): the deposed
    ///    holder is refused there too.
    ///
    /// The lock is not held while the resources are sealed: the revocation
    /// fence is below every later holder's, so a seal and a later holder's
    /// writes may land in either order, and a revoker that dies midway
    /// leaves no lock behind.
    ///
    /// Without resources, the only effect on the deposed holder is its loss
    /// signal at its next renewal (at most a third of its ttl later):
    /// until then it may believe it holds the lock, and any resource not
    /// sealed accepts its writes until a later holder writes there. The
    /// lock being free is not an error ([`Revoked::deposed`] is `None`):
    /// the resources are sealed all the same, against holders whose lease
    /// ended but who may still write.
    ///
    /// `opts` must have the fence mode, fence epoch and layout of the
    /// lock's holders; its replicas ([`LockOptions::wait_for_replicas`], on
    /// Redis) are waited for after the revoke. The revoke is logged (a
    /// `warn` event when it deposed a holder) and counted
    /// ([`metrics::REVOKES`](crate::metrics::REVOKES)). On Redis it needs
    /// the ACL permission `+unlink`, which no other operation needs: leave
    /// it out of the workers' rule to keep them from revoking.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
    /// let invoice = client.fenced_hash("invoice:42:data")?;
    /// let revoked = client
    ///     .revoke("invoice:42", &client.options(), &[&invoice])
    ///     .await?;
    /// if let Some(deposed) = &revoked.deposed {
    ///     println!("took the lock from {} at fence {}", deposed.holder, revoked.fence);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Bad input and connection errors as for [`LockClient::try_acquire`]
    /// (nothing was changed), also [`Error::InvalidOption`] for a resource
    /// that is one of the lock's own keys; [`Error::NoPermission`] without `+unlink`
    /// (nothing was changed); [`Error::RevokeIncomplete`] when the lock was
    /// revoked but a resource could not be sealed (it names the resource);
    /// [`Error::RevokeNotReplicated`] when fewer replicas than asked for
    /// acknowledged the revoke (it was applied, and the resources sealed).
    pub async fn revoke(
        &self,
        name: &str,
        opts: &LockOptions,
        resources: &[&dyn Sealable],
    ) -> Result<Revoked> {
        opts.validate()?;
        let keys = self.lock_keys(name, opts.layout)?;
        // A seal writes a hash: at one of the lock's own keys it would
        // break the lock (a key of the wrong type for every later grant).
        let own = [
            keys.lock().to_owned(),
            keys.fence(),
            keys.queue(),
            keys.waiters(),
        ];
        if let Some(resource) = resources
            .iter()
            .map(|r| r.resource())
            .find(|r| own.contains(r))
        {
            return Err(Error::InvalidOption(format!(
                "resource {:?} is one of lock {:?}'s own keys: name the resource the lock guards, not the lock; nothing was changed",
                resource.chars().take(128).collect::<String>(),
                name.chars().take(128).collect::<String>()
            )));
        }
        let revocation = self.engine().revoke(name, &keys, opts).await?;
        let fence = revocation.fence;
        crate::metrics::revoke(
            self.inner.leases.stats(),
            opts.family_of(name),
            revocation.deposed.is_some(),
        );
        match &revocation.deposed {
            Some(deposed) => {
                tracing::warn!(lock = %name, %fence, holder = %deposed.holder, deposed_fence = ?deposed.fence, "lock revoked: its holder was deposed");
            }
            None => tracing::info!(lock = %name, %fence, "lock revoked: it was free"),
        }
        let outcomes =
            futures_util::future::join_all(resources.iter().map(|r| r.seal(fence))).await;
        let mut sealed = Vec::with_capacity(resources.len());
        let mut failed = None;
        for (resource, outcome) in resources.iter().zip(outcomes) {
            match outcome {
                Ok(outcome) => sealed.push(Sealed {
                    resource: resource.resource(),
                    outcome,
                }),
                Err(e) => {
                    tracing::warn!(lock = %name, %fence, resource = %resource.resource(), error = %e, "revoke could not seal a resource");
                    failed.get_or_insert((resource.resource(), e));
                }
            }
        }
        if let Some((resource, source)) = failed {
            return Err(Error::RevokeIncomplete {
                name: name.to_owned(),
                fence,
                resource,
                source: Box::new(source),
            });
        }
        if let Some((acked, wanted)) = revocation.replicas
            && acked < wanted
        {
            return Err(Error::RevokeNotReplicated {
                name: name.to_owned(),
                fence,
                acked,
                wanted,
            });
        }
        Ok(Revoked {
            name: name.to_owned(),
            fence,
            deposed: revocation.deposed,
            sealed,
        })
    }

    /// Reads the current state of lock `name` (one atomic script). Fences
    /// are shown in the fence epoch of the client's default options.
    ///
    /// On etcd: the holder is the key with the lowest create revision (its
    /// value is the holder id), the fence its create revision, `remaining`
    /// its lease's time to live (whole seconds); `last_fence` of a free lock
    /// is `None`, etcd keeps no fence per name.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::WrongType`] and connection errors.
    pub async fn inspect(&self, name: &str, layout: KeyLayout) -> Result<LockState> {
        let keys = self.lock_keys(name, layout)?;
        self.engine()
            .inspect(&keys, layout, &self.inner.defaults)
            .await
    }
}
