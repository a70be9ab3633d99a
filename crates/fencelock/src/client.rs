//! The client façade: [`LockClient`], its builder, and what it offers —
//! `try_acquire` / `acquire` / `with_lock` (through the acquire engine,
//! `crate::acquire`), `inspect`, fenced resources and stats.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Engine;
use crate::audit::Audit;
use crate::backend::ops::Inspect;
use crate::backend::{Backend, ConnSettings, wire};
use crate::error::{Error, LossReason, Result};
use crate::fence::Fence;
use crate::keys::{KeyLayout, LockKeys, key_text_problem, lock_key_pattern, lock_name_of};
use crate::lease::{Lease, LeaseHandle, ReleaseOutcome};
use crate::metrics::{Stats, StatsHandle};
use crate::options::LockOptions;
use crate::resource::FencedHash;

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
    engine: Engine,
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
    /// [`Error::InvalidOption`] for a malformed URL or invalid defaults,
    /// [`Error::Unreachable`] naming the URL, [`Error::Auth`] when the
    /// credentials are refused.
    pub async fn connect(self) -> Result<LockClient> {
        self.defaults.validate()?;
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
        let backend = Backend::connect(&self.url, &self.settings).await?;
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                engine: Engine::new(backend),
                prefix: self.prefix,
                defaults: self.defaults,
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
        /// The holder's public id ([`holder_id`](crate::holder_id) of its
        /// token; the token itself is a secret and is never read back).
        holder: String,
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
    /// - `etcd://[user:password@]host[:port][,host[:port]…][?prefix=NAMESPACE]`
    ///   — an etcd cluster (feature `etcd`; `etcds://` for TLS; port 2379 by
    ///   default; `prefix` is put in front of every key the client touches).
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

    /// The store behind this client.
    #[cfg(feature = "testing")]
    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.engine.backend
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        self.inner.engine.backend.url()
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
        #[cfg(feature = "etcd")]
        if let Some(conn) = self.inner.engine.backend.etcd() {
            crate::backend::etcd::validate_name(name)?;
            return Ok(LockKeys {
                lock: crate::backend::etcd::lock_prefix(conn.namespace(), &self.inner.prefix, name),
                fence: String::new(),
                queue: String::new(),
                waiters: String::new(),
                wake_prefix: String::new(),
            });
        }
        LockKeys::new(&self.inner.prefix, layout, name)
    }

    /// The keys of lock `name` for a call on this client's deployment: the
    /// guide layout is refused on a Cluster, where its keys would land in
    /// different slots, and on etcd, which has no such layout.
    fn lock_keys(&self, name: &str, layout: KeyLayout) -> Result<LockKeys> {
        #[cfg(feature = "etcd")]
        if layout == KeyLayout::Guide && self.inner.engine.backend.etcd().is_some() {
            return Err(Error::InvalidOption(
                "the guide layout (lock:NAME in Redis) does not exist on etcd: use the default layout".into(),
            ));
        }
        if layout == KeyLayout::Guide && self.inner.engine.backend.is_cluster() {
            return Err(Error::InvalidOption(
                "the guide layout (lock:NAME) cannot be used on Redis Cluster: a lock's keys would land in different slots; use the default layout (lock:{NAME})".into(),
            ));
        }
        self.keys(name, layout)
    }

    /// A fenced Redis hash resource at `key` on this client's Redis (the key
    /// is used as given, without the lock prefix).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed key;
    /// [`Error::InvalidOption`] on an etcd client (use
    /// [`LockClient::fenced_key`] there, or a Redis client for the hash:
    /// fences from any backend work with it).
    pub fn fenced_hash(&self, key: &str) -> Result<FencedHash> {
        FencedHash::new(
            self.inner.engine.backend.redis()?.clone(),
            key,
            Some(self.inner.engine.stats.clone()),
        )
    }

    /// A fenced key in this client's etcd (feature `etcd`): `key` is used as
    /// given, after the URL's namespace (`?prefix=`), without the lock
    /// prefix.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed key;
    /// [`Error::InvalidOption`] on a Redis client (use
    /// [`LockClient::fenced_hash`] there).
    #[cfg(feature = "etcd")]
    pub fn fenced_key(&self, key: &str) -> Result<crate::FencedKey> {
        let Some(conn) = self.inner.engine.backend.etcd() else {
            return Err(Error::InvalidOption(
                "fenced keys live in etcd, but this client is connected to Redis: use fenced_hash"
                    .into(),
            ));
        };
        crate::FencedKey::new(conn.clone(), key, Some(self.inner.engine.stats.clone()))
    }

    /// The kind of store behind this client: `"redis"` or `"etcd"`.
    pub fn backend_kind(&self) -> &'static str {
        match &self.inner.engine.backend {
            Backend::Redis(_) => "redis",
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => "etcd",
        }
    }

    /// Per-family counters since this client connected (shared by its
    /// clones): acquisitions by outcome, renewals, losses, releases that
    /// found the lock no longer ours, the worst renewal lag, and the fenced
    /// writes of the [`FencedHash`]es it created (and of any `FencedTable`
    /// given [`LockClient::stats_handle`]). Families as in
    /// [`crate::metrics`]. Kept whether or not a metrics recorder is
    /// installed; one short mutex section per event.
    pub fn stats(&self) -> Stats {
        self.inner.engine.stats.snapshot()
    }

    /// The storage behind [`LockClient::stats`], to share with resources
    /// created without the client (`FencedTable::with_stats`).
    pub fn stats_handle(&self) -> StatsHandle {
        self.inner.engine.stats.clone()
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
        opts.validate()?;
        let keys = self.lock_keys(name, opts.layout)?;
        self.inner.engine.try_acquire(name, keys, opts).await
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
        opts.validate()?;
        let keys = self.lock_keys(name, opts.layout)?;
        self.inner.engine.acquire(name, keys, opts).await
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
        #[cfg(feature = "etcd")]
        if let Some(conn) = self.inner.engine.backend.etcd() {
            let names_prefix = format!("{}{}", conn.namespace(), self.inner.prefix);
            return conn.lock_names(&names_prefix, pattern).await;
        }
        let keys = self
            .inner
            .engine
            .backend
            .redis()?
            .scan(
                &lock_key_pattern(&self.inner.prefix, layout, pattern),
                "string",
            )
            .await?;
        Ok(keys
            .iter()
            .filter_map(|key| lock_name_of(&self.inner.prefix, layout, key))
            .map(str::to_owned)
            .collect())
    }

    /// How many waiters are queued for lock `name` (notify and fair modes;
    /// on etcd, every waiter: the keys behind the holder's).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::WrongType`] and connection errors.
    pub async fn waiters(&self, name: &str, layout: KeyLayout) -> Result<u64> {
        let keys = self.lock_keys(name, layout)?;
        #[cfg(feature = "etcd")]
        if let Some(conn) = self.inner.engine.backend.etcd() {
            return conn.waiters(&keys.lock).await;
        }
        self.inner
            .engine
            .backend
            .redis()?
            .cmd(&keys.queue, redis::cmd("ZCARD").arg(&keys.queue))
            .await
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
        crate::audit::run(
            &self.inner.engine.backend,
            &self.inner.prefix,
            &self.inner.defaults,
        )
        .await
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
        #[cfg(feature = "etcd")]
        if let Some(conn) = self.inner.engine.backend.etcd() {
            return Ok(conn.inspect(&keys.lock, &self.inner.defaults).await?.0);
        }
        let base = self.inner.defaults.fence_base(0);
        let epoch = |f: Fence| Fence::new(f.get().saturating_add(base));
        let reply = self
            .inner
            .engine
            .backend
            .run(&Inspect { keys: &keys })
            .await?;
        let last_fence = reply
            .last_fence
            .and_then(|f| f.parse::<Fence>().ok())
            .map(epoch);
        Ok(match reply.value {
            None => LockState::Free { last_fence },
            Some(value) => {
                let (token, fence) = wire::parse_lock_value(&value, layout);
                LockState::Held {
                    holder: crate::holder::holder_id(token),
                    fence: fence.map(epoch).or(match layout {
                        KeyLayout::HashTagged => None,
                        KeyLayout::Guide => last_fence,
                    }),
                    remaining: reply.remaining,
                }
            }
        })
    }
}
