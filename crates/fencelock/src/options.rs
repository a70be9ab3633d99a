//! Per-acquire options: lease ttl, wait deadline, renewal, layout, fence mode.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::keys::KeyLayout;

/// Shortest accepted lease. Below this, ordinary scheduling and network
/// jitter would lose leases constantly (the guide's "very short TTLs").
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// Longest accepted lease (30 days). Longer leases keep a crashed holder's
/// lock for longer than any job should; use renewal instead.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The longest connect or response timeout a client takes (one day): its
/// deadlines are computed from the current instant, and a larger bound
/// would mean nothing but an overflow risk.
pub const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How fences are minted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FenceMode {
    /// `fence = max(last_fence + 1, Redis server TIME in µs)`, computed inside
    /// the grant script. Fences stay strictly increasing even when the fence
    /// key is lost (Redis restarted without persistence, failover to a lagging
    /// replica, eviction), provided the Redis server's clock does not step
    /// back. The fence key expires after a retention period, so no key is left
    /// behind per name forever.
    #[default]
    Clock,
    /// Plain `INCR`: fences 1, 2, 3 … as in the guide. Requires a durable
    /// Redis (AOF `appendfsync always`): a lost counter re-issues old fences.
    /// Resources that check the holder as well (all fencelock resources do)
    /// still refuse a re-issued fence from a different holder.
    Counter,
}

impl FenceMode {
    /// Parses `clock` or `counter`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "clock" => Some(FenceMode::Clock),
            "counter" => Some(FenceMode::Counter),
            _ => None,
        }
    }
}

/// How `acquire` waits while a lock is held.
///
/// All modes are equally safe; they differ in latency, fairness and Redis
/// work. Use one mode for all workers of a name: a `poll` or `notify` grant
/// does not honour a `fair` queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WaitMode {
    /// Retry with capped exponential backoff and jitter (4 ms doubling to
    /// 200 ms), never sleeping past the holder's expiry. No queue, no
    /// subscription; a waiter notices a release up to 200 ms late.
    Poll,
    /// Waiters queue; a release wakes the head waiter at once through
    /// pub/sub (one message per release, however many wait). Any worker may
    /// take a free lock, so the releasing worker may take it back ahead of
    /// the woken waiter; but once the head has waited 10 ms, the release
    /// hands the lock over to it as in [`WaitMode::Fair`] (for
    /// [`NOTIFY_HANDOVER_LEASE`] until it renews), so nobody starves (see
    /// [`STARVATION_THRESHOLD`]). A waiter also retries when the holder's
    /// lease runs out and at least every third of its waiter lease, so a lost
    /// message or a crashed holder never stalls it.
    #[default]
    Notify,
    /// First come, first served: a free lock is granted only to the head of
    /// the queue. A waiter that crashes or gives up leaves the queue within
    /// its waiter lease, so it never blocks the ones behind it for longer.
    Fair,
}

impl WaitMode {
    /// Parses `poll`, `notify` or `fair`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "poll" => Some(WaitMode::Poll),
            "notify" => Some(WaitMode::Notify),
            "fair" => Some(WaitMode::Fair),
            _ => None,
        }
    }

    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            WaitMode::Poll => "poll",
            WaitMode::Notify => "notify",
            WaitMode::Fair => "fair",
        }
    }
}

/// How long a clock-mode fence key is kept after the last grant of its name
/// (at least; twice the ttl if that is longer). Within this window, fences
/// stay increasing even if the Redis server's clock steps back.
pub const FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How long the head of a notify queue may wait before a release hands the
/// lock over to it instead of only waking it (so workers that barge in ahead
/// of it cannot starve it; the starvation mode of Go's `sync.Mutex`).
pub const STARVATION_THRESHOLD: Duration = Duration::from_millis(10);

/// Default waiter lease: how long a queued waiter keeps its place without
/// renewing it (it renews every third of it while waiting).
pub const DEFAULT_WAITER_LEASE: Duration = Duration::from_secs(1);

/// How long a lock handed over to a starving notify waiter lasts until that
/// waiter renews it (at once, on receipt). Short, so a waiter that vanished
/// while queued holds up the ones behind it for no longer than this.
pub const NOTIFY_HANDOVER_LEASE: Duration = Duration::from_millis(100);

/// The size of one fence epoch: 2^53. A lease's fence is `epoch × 2^53 +`
/// the backend's own fence (a Redis fence, or an etcd revision), and every
/// backend fence is below 2^53 (Redis fences are minted by Lua, whose numbers
/// are doubles; an etcd revision that large is refused). So every fence of
/// an epoch is above every fence of the epochs before it: moving a lock to
/// another backend in the next epoch makes every resource refuse the old
/// backend's fences as soon as it has seen one of the new
/// ([`LockOptions::fence_epoch`]; the README's "Redis or etcd?").
pub const FENCE_EPOCH_SIZE: u64 = 1 << 53;

/// The highest fence epoch: fences stay below 2^63, so a Postgres `bigint`
/// column holds every one.
pub const MAX_FENCE_EPOCH: u16 = 1023;

/// The fence epoch of etcd locks unless set: 1, so an etcd fence is above
/// every fence Redis can issue (epoch 0) and a lock moved from Redis to etcd
/// by changing its URL is safe at the resource.
pub const ETCD_DEFAULT_FENCE_EPOCH: u16 = 1;

/// Most permits a semaphore may have ([`LockOptions::permits`]). Every
/// grant looks at each slot of its name in one script, so the bound keeps
/// that call short.
pub const MAX_PERMITS: u32 = 1024;

/// How many replicas must acknowledge a grant, a renewal, a revoke (or a
/// fenced write), and for
/// how long to wait for them: Redis `WAIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Replication {
    /// Replicas that must acknowledge.
    pub replicas: u32,
    /// Longest wait for them.
    pub timeout: Duration,
}

/// Background renewal of a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Renewal {
    /// Renew every third of the ttl (the default).
    #[default]
    Auto,
    /// Renew at this interval (must be shorter than the ttl).
    Every(Duration),
    /// Never renew: the lease ends after its ttl. The loss signal still fires
    /// when the local deadline passes.
    Off,
}

/// Options for one acquisition. Start from [`LockOptions::default`] (or the
/// client's defaults) and change what you need:
///
/// ```
/// use std::time::Duration;
/// use fencelock::{LockOptions, Renewal};
///
/// let opts = LockOptions::default()
///     .ttl(Duration::from_secs(30))
///     .wait(Duration::from_secs(5))
///     .renewal(Renewal::Every(Duration::from_secs(5)));
/// assert_eq!(opts.ttl_value(), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) renewal: Renewal,
    pub(crate) layout: KeyLayout,
    pub(crate) fence_mode: FenceMode,
    pub(crate) wait_mode: WaitMode,
    pub(crate) waiter_lease: Duration,
    pub(crate) metrics_family: Option<String>,
    pub(crate) replication: Option<Replication>,
    pub(crate) fence_epoch: Option<u16>,
    pub(crate) permits: Option<u32>,
    pub(crate) access: Option<Access>,
}

/// Which side of a fenced read-write lock an acquisition takes
/// ([`LockOptions::access`], [`LockClient::rwlock`](crate::LockClient::rwlock)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// A reader: shares the lock with other readers, excludes writers. Its
    /// lease's fence is the write epoch it saw (the last fence issued for
    /// the name), which validated reads compare against
    /// ([`ValidatedRead`](crate::ValidatedRead)).
    Read,
    /// A writer: excludes readers and writers; fenced like a mutex.
    Write,
}

impl Access {
    /// `"read"` or `"write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// What one acquisition takes: the kind of lock and its part. Derived from
/// [`LockOptions::permits`] and [`LockOptions::access`] in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Primitive {
    Mutex,
    Semaphore(u32),
    RwLock(Access),
}

impl Primitive {
    /// The kind's name in errors: `"mutex"`, `"semaphore"` or
    /// `"read-write lock"`.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore(_) => "semaphore",
            Primitive::RwLock(_) => "read-write lock",
        }
    }
}

impl Default for LockOptions {
    /// ttl 10 s, wait 10 s, renewal every ttl/3, hash-tagged keys, clock
    /// fences, notify wait mode with a 1 s waiter lease.
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(10),
            wait: Duration::from_secs(10),
            renewal: Renewal::Auto,
            layout: KeyLayout::HashTagged,
            fence_mode: FenceMode::Clock,
            wait_mode: WaitMode::Notify,
            waiter_lease: DEFAULT_WAITER_LEASE,
            metrics_family: None,
            replication: None,
            fence_epoch: None,
            permits: None,
            access: None,
        }
    }
}

impl LockOptions {
    /// Sets the lease ttl (between [`MIN_TTL`] and [`MAX_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long `acquire` waits for a held lock; zero means "try once".
    /// A wait too long to add to the current time (`Duration::MAX`) waits
    /// forever, as [`LockOptions::wait_forever`] does.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// `acquire` waits until it gets the lock (or its future is dropped).
    pub fn wait_forever(self) -> Self {
        self.wait(Duration::MAX)
    }

    /// Sets background renewal.
    pub fn renewal(mut self, renewal: Renewal) -> Self {
        self.renewal = renewal;
        self
    }

    /// Sets the key layout.
    pub fn layout(mut self, layout: KeyLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets the fence mode.
    pub fn fence_mode(mut self, mode: FenceMode) -> Self {
        self.fence_mode = mode;
        self
    }

    /// Sets the fence epoch: every lease's fence becomes `epoch ×`
    /// [`FENCE_EPOCH_SIZE`] `+` the backend's fence, so the fences of a
    /// higher epoch are above every fence of a lower one, whatever the
    /// backends (at most [`MAX_FENCE_EPOCH`]). The default is 0 on Redis and
    /// [`ETCD_DEFAULT_FENCE_EPOCH`] (1) on etcd.
    ///
    /// Raise it by one each time a lock moves to another backend (Redis to
    /// etcd and back), for every worker of the lock: the resources then
    /// refuse every fence of the old backend once they have accepted one of
    /// the new, however the two backends number their fences. Use one epoch
    /// for all workers of a name on one backend.
    ///
    /// ```
    /// use fencelock::{FENCE_EPOCH_SIZE, LockOptions};
    ///
    /// // Back from etcd (epoch 1) to Redis: epoch 2.
    /// let opts = LockOptions::default().fence_epoch(2);
    /// assert_eq!(opts.fence_epoch_value(), Some(2));
    /// assert_eq!(opts.fence_base(0), 2 * FENCE_EPOCH_SIZE);
    /// ```
    pub fn fence_epoch(mut self, epoch: u16) -> Self {
        self.fence_epoch = Some(epoch);
        self
    }

    /// The fence epoch set with [`LockOptions::fence_epoch`], if any.
    pub fn fence_epoch_value(&self) -> Option<u16> {
        self.fence_epoch
    }

    /// What these options add to a backend's fence: the epoch set, or
    /// `backend_default` when none is, times [`FENCE_EPOCH_SIZE`].
    pub fn fence_base(&self, backend_default: u16) -> u64 {
        u64::from(self.fence_epoch.unwrap_or(backend_default)) * FENCE_EPOCH_SIZE
    }

    /// Sets how `acquire` waits.
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.wait_mode = mode;
        self
    }

    /// After each grant, waits until `replicas` replicas acknowledged it
    /// (Redis `WAIT replicas timeout`), for at most `timeout`; with fewer
    /// acknowledgements the grant is released again and
    /// [`Error::NotReplicated`] says how many acknowledged. With Redis
    /// replication being asynchronous, a failover can otherwise lose a
    /// granted lock; this narrows that window to grants a replica has seen.
    /// A lock handed over by a release is acknowledged the same way (the
    /// waiter renews it first, then waits for the replicas). Renewals (the
    /// keeper's and [`LeaseHandle::extend`](crate::LeaseHandle::extend)) wait for the
    /// replicas too, and one acknowledged by fewer does not move the
    /// lease's deadline ([`Error::RenewalNotReplicated`]; the keeper
    /// retries): a failover could lose it, and the new primary would then
    /// expire the lock at the older expiry while the holder still worked.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replication = Some(Replication { replicas, timeout });
        self
    }

    /// The replication acknowledgement set with
    /// [`LockOptions::wait_for_replicas`].
    pub fn replication_value(&self) -> Option<Replication> {
        self.replication
    }

    /// Sets the waiter lease of the notify and fair modes (at least 30 ms).
    pub fn waiter_lease(mut self, lease: Duration) -> Self {
        self.waiter_lease = lease;
        self
    }

    /// Sets the `lock` label of this lock's metrics and its key in
    /// [`LockClient::stats`](crate::LockClient::stats), instead of the family
    /// derived from the name ([`crate::metrics::family`]: up to the last `:`).
    /// Keep the set of families small: each is a time series.
    pub fn metrics_family(mut self, family: impl Into<String>) -> Self {
        self.metrics_family = Some(family.into());
        self
    }

    /// The metrics family set with [`LockOptions::metrics_family`]; `None`
    /// means derived from the lock name.
    pub fn metrics_family_value(&self) -> Option<&str> {
        self.metrics_family.as_deref()
    }

    /// The metrics family of lock `name` under these options.
    pub(crate) fn family_of<'a>(&'a self, name: &'a str) -> &'a str {
        self.metrics_family
            .as_deref()
            .unwrap_or_else(|| crate::metrics::family(name))
    }

    /// The wait mode.
    pub fn wait_mode_value(&self) -> WaitMode {
        self.wait_mode
    }

    /// The waiter lease.
    pub fn waiter_lease_value(&self) -> Duration {
        self.waiter_lease
    }

    /// How long a lock handed over to a waiter of these options lasts until
    /// it renews it: min(ttl, waiter lease) in fair mode, and at most
    /// [`NOTIFY_HANDOVER_LEASE`] in notify mode. Queue members carry it, so
    /// the release that hands over and the waiter agree on it.
    pub(crate) fn handover_lease(&self) -> Duration {
        let lease = self.ttl.min(self.waiter_lease);
        match self.wait_mode {
            WaitMode::Fair => lease,
            _ => lease.min(NOTIFY_HANDOVER_LEASE),
        }
    }

    /// The lease ttl.
    pub fn ttl_value(&self) -> Duration {
        self.ttl
    }

    /// The wait deadline.
    pub fn wait_value(&self) -> Duration {
        self.wait
    }

    /// The renewal setting.
    pub fn renewal_value(&self) -> Renewal {
        self.renewal
    }

    /// The key layout.
    pub fn layout_value(&self) -> KeyLayout {
        self.layout
    }

    /// The fence mode.
    pub fn fence_mode_value(&self) -> FenceMode {
        self.fence_mode
    }

    /// Makes the acquisition take one of `permits` **permits** of a fenced
    /// semaphore instead of a mutex: up to `permits` holders at once, each
    /// in its own slot `0..permits` ([`LeaseHandle::slot`](crate::LeaseHandle::slot)),
    /// with a fence minted from the name's one clock-floored counter. A
    /// resource fences permits per slot (`FencedHash::slot`): a stale
    /// holder of a slot is refused once the slot's next holder wrote; two
    /// live permits of different slots never refuse each other.
    ///
    /// Everything else is the mutex's: the three wait modes (fair is FIFO
    /// across all permits; a waiter is woken when any slot frees), renewal
    /// in the keeper's batches, the loss signal, compare-and-delete
    /// release. A name is either a mutex or a semaphore while it has
    /// holders: the other kind gets [`Error::KindConflict`](crate::Error::KindConflict),
    /// and a different permit count [`Error::PermitsConflict`](crate::Error::PermitsConflict)
    /// (once the last holder is gone, the next grant sets the count). Not
    /// in the guide layout (its Python workers know no semaphores), and
    /// between 1 and [`MAX_PERMITS`].
    ///
    /// ```
    /// use fencelock::LockOptions;
    ///
    /// let opts = LockOptions::default().permits(4);
    /// assert_eq!(opts.permits_value(), Some(4));
    /// ```
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// The semaphore's permit count, or `None` for a mutex.
    pub fn permits_value(&self) -> Option<u32> {
        self.permits
    }

    /// Makes the acquisition one side of a fenced **read-write lock**
    /// instead of a mutex: [`Access::Read`] shares the name with other
    /// readers, [`Access::Write`] excludes everyone and is fenced exactly
    /// like a mutex. A reader's fence is the write epoch it saw: every
    /// writer granted after it has a greater fence, so a read validated
    /// against it ([`FencedHash::read_validated`](crate::FencedHash::read_validated))
    /// tells whether such a writer came in.
    ///
    /// Fair mode queues readers and writers in one order (a writer waits
    /// for the readers ahead of it, later readers wait for the writer);
    /// notify and poll promise no order, and a steady stream of readers
    /// can keep a writer out. A name is one kind while it has holders
    /// ([`Error::KindConflict`](crate::Error::KindConflict)); not in the
    /// guide layout, and not together with [`LockOptions::permits`].
    /// [`LockClient::rwlock`](crate::LockClient::rwlock) sets this for you.
    ///
    /// ```
    /// use fencelock::{Access, LockOptions};
    ///
    /// let opts = LockOptions::default().access(Access::Read);
    /// assert_eq!(opts.access_value(), Some(Access::Read));
    /// ```
    pub fn access(mut self, access: Access) -> Self {
        self.access = Some(access);
        self
    }

    /// The side of a read-write lock taken, or `None` for a mutex or a
    /// semaphore.
    pub fn access_value(&self) -> Option<Access> {
        self.access
    }

    /// What the acquisition takes (validated options have at most one of
    /// permits and access).
    pub(crate) fn primitive(&self) -> Primitive {
        match (self.permits, self.access) {
            (Some(permits), _) => Primitive::Semaphore(permits),
            (None, Some(access)) => Primitive::RwLock(access),
            (None, None) => Primitive::Mutex,
        }
    }

    /// The renewal interval these options give, or `None` when renewal is off.
    pub fn renewal_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Auto => Some(self.ttl / 3),
            Renewal::Every(every) => Some(every),
            Renewal::Off => None,
        }
    }

    /// Checks the options; every acquisition does this before sending anything.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the bad value.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < MIN_TTL {
            return Err(Error::InvalidOption(format!(
                "ttl {:?} is below the minimum of {MIN_TTL:?}: leases that short are lost to ordinary scheduling delays",
                self.ttl
            )));
        }
        if self.ttl > MAX_TTL {
            return Err(Error::InvalidOption(format!(
                "ttl {:?} is above the maximum of 30 days: use renewal for long work",
                self.ttl
            )));
        }
        if self.waiter_lease < Duration::from_millis(30) || self.waiter_lease > MAX_TTL {
            return Err(Error::InvalidOption(format!(
                "waiter lease {:?} must be between 30 ms and 30 days",
                self.waiter_lease
            )));
        }
        if let Some(Replication { replicas, timeout }) = self.replication
            && (replicas == 0 || timeout.is_zero() || timeout >= self.ttl)
        {
            return Err(Error::InvalidOption(format!(
                "waiting for {replicas} replicas for {timeout:?}: need at least 1 replica and a timeout above zero and shorter than the ttl {:?}",
                self.ttl
            )));
        }
        if let Some(epoch) = self.fence_epoch
            && epoch > MAX_FENCE_EPOCH
        {
            return Err(Error::InvalidOption(format!(
                "fence epoch {epoch} is above the maximum of {MAX_FENCE_EPOCH}: fences must stay below 2^63"
            )));
        }
        if let Some(permits) = self.permits {
            if permits == 0 || permits > MAX_PERMITS {
                return Err(Error::InvalidOption(format!(
                    "{permits} permits: a semaphore has between 1 and {MAX_PERMITS}"
                )));
            }
            if self.layout == KeyLayout::Guide {
                return Err(Error::InvalidOption(
                    "a semaphore cannot use the guide layout (lock:NAME): the guide's workers know only a mutex; use the default layout".into(),
                ));
            }
        }
        if let Some(access) = self.access {
            if let Some(permits) = self.permits {
                return Err(Error::InvalidOption(format!(
                    "{permits} permits and {} access: a lock is a semaphore or a read-write lock, not both",
                    access.as_str()
                )));
            }
            if self.layout == KeyLayout::Guide {
                return Err(Error::InvalidOption(
                    "a read-write lock cannot use the guide layout (lock:NAME): the guide's workers know only a mutex; use the default layout".into(),
                ));
            }
        }
        if let Renewal::Every(every) = self.renewal
            && (every.is_zero() || every >= self.ttl)
        {
            return Err(Error::InvalidOption(format!(
                "renewal interval {every:?} must be above zero and shorter than the ttl {:?}",
                self.ttl
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_ttls_outside_the_range_and_bad_intervals() {
        let base = LockOptions::default();
        assert!(base.clone().ttl(Duration::ZERO).validate().is_err());
        assert!(
            base.clone()
                .ttl(Duration::from_millis(9))
                .validate()
                .is_err()
        );
        assert!(
            base.clone()
                .ttl(MAX_TTL + Duration::from_secs(1))
                .validate()
                .is_err()
        );
        assert!(
            base.clone()
                .renewal(Renewal::Every(Duration::from_secs(10)))
                .validate()
                .is_err()
        );
        assert!(
            base.clone()
                .renewal(Renewal::Every(Duration::ZERO))
                .validate()
                .is_err()
        );
        assert!(base.clone().ttl(MIN_TTL).validate().is_ok());
        assert!(base.clone().fence_epoch(MAX_FENCE_EPOCH).validate().is_ok());
        assert!(base.fence_epoch(MAX_FENCE_EPOCH + 1).validate().is_err());
    }

    #[test]
    fn fence_epochs_order_every_backend_fence() {
        let base = LockOptions::default();
        assert_eq!(base.fence_base(0), 0);
        assert_eq!(base.fence_base(ETCD_DEFAULT_FENCE_EPOCH), FENCE_EPOCH_SIZE);
        // The largest fence of the highest epoch is still a bigint.
        let top = base.fence_epoch(MAX_FENCE_EPOCH).fence_base(0) + (FENCE_EPOCH_SIZE - 1);
        assert!(i64::try_from(top).is_ok());
    }
}
