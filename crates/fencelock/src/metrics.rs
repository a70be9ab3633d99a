//! Diagnostics: metric names, the family rule, recording helpers and the
//! stats snapshot.
//!
//! Every event is recorded twice: through the [`metrics`] facade (the
//! application picks the exporter; with no recorder installed a call costs
//! what the facade's no-op recorder costs) and into the owning client's
//! [`StatsHandle`], which [`LockClient::stats`](crate::LockClient::stats)
//! reads for programs without an exporter.
//!
//! ## Metrics
//!
//! | name | kind | labels |
//! |---|---|---|
//! | [`ACQUIRE_ATTEMPTS`] `fencelock_acquire_attempts_total` | counter | `lock`, `outcome` = `acquired` \| `contended` \| `timed_out` \| `error` |
//! | [`ACQUIRE_WAIT`] `fencelock_acquire_wait_seconds` | histogram | `lock` |
//! | [`HOLD`] `fencelock_hold_seconds` | histogram (grant → release, drop or loss) | `lock` |
//! | [`RENEWALS`] `fencelock_renewals_total` | counter | `lock`, `outcome` = `ok` \| `failed` |
//! | [`LEASES_LOST`] `fencelock_leases_lost_total` | counter | `lock`, `reason` = `expired` \| `taken_over` \| `deadline_passed` |
//! | [`RELEASES_NOT_OURS`] `fencelock_releases_not_ours_total` | counter | `lock` |
//! | [`REVOKES`] `fencelock_revokes_total` | counter (one per [`LockClient::revoke`](crate::LockClient::revoke) that reached the store) | `lock`, `outcome` = `deposed` \| `free` |
//! | [`FENCED_WRITES`] `fencelock_fenced_writes_total` | counter | `resource`, `outcome` = `accepted` \| `rejected_stale` |
//! | [`RENEWAL_LAG`] `fencelock_renewal_lag_seconds` | histogram | `lock` |
//! | [`DEPLOYMENT_WARNINGS`] `fencelock_deployment_warnings_total` | counter (`evicting_maxmemory_policy`: once per connect; `server_clock_fast`: each time a server's clock moved further than this host's monotonic clock between two readings after renewals) | `warning` = `evicting_maxmemory_policy` \| `server_clock_fast` |
//!
//! One `acquire` or `try_acquire` call is one attempt, counted once with its
//! final outcome (the retries inside a waiting `acquire` are not attempts).
//! The renewal lag is how late the client's keeper sent a renewal against its schedule:
//! event-loop stalls, blocking calls, GC-like pauses of this process.
//!
//! ## Handles, cached per family and recorder
//!
//! A client keeps one entry per lock family ([`StatsHandle`]): its counters
//! for [`Stats`] (atomics), and the family's metric handles, registered
//! with the current recorder on first use and kept, so that recording an
//! event hashes no label strings. The handles remember which recorder they
//! came from (by address): when another recorder is current (an exporter
//! installed after connecting, a test's local recorder), they are
//! registered again. At most 4,096 families per client keep handles;
//! events of the others register their metric each time, as the `metrics`
//! macros do.
//!
//! ## Families: bounded labels
//!
//! Lock names such as `invoice:42` are unbounded, so the `lock` label is the
//! name's *family* ([`family`]): the name up to its last `:` (`invoice:42` →
//! `invoice`, `tenant:7:job:3` → `tenant:7:job`); a name without `:` is its
//! own family. Override it per lock with
//! [`LockOptions::metrics_family`](crate::LockOptions::metrics_family). The
//! `resource` label of a [`FencedHash`](crate::FencedHash) follows the same
//! rule on its key (overridable with
//! [`FencedHash::metrics_family`](crate::FencedHash::metrics_family)); a
//! `FencedTable`'s is its table name. A per-entity hash key such as
//! `invoice:42:data` derives `invoice:42`, still one series per invoice: give
//! such hashes a fixed family (`.metrics_family("invoice-data")`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Metadata, Recorder};

use tokio::time::Instant;

use crate::error::{Error, LossReason};

/// Awaits `$fut` inside `$span`, wrapped in `tracing`'s `Instrumented`
/// only when the span is enabled. With no subscriber that wants the span
/// (the common case: spans at debug level), the wrapper is nothing but one
/// more move of the whole call future, several kilobytes on every acquire.
macro_rules! in_span {
    ($span:expr, $fut:expr) => {
        if $span.is_disabled() {
            $fut.await
        } else {
            ::tracing::Instrument::instrument($fut, $span.clone()).await
        }
    };
}
pub(crate) use in_span;

/// Counter: acquisition calls by final outcome.
pub const ACQUIRE_ATTEMPTS: &str = "fencelock_acquire_attempts_total";
/// Histogram: time from the start of a successful acquisition to the grant.
pub const ACQUIRE_WAIT: &str = "fencelock_acquire_wait_seconds";
/// Histogram: time a lease was held (grant → release, drop or loss).
pub const HOLD: &str = "fencelock_hold_seconds";
/// Counter: renewals (background or manual `extend`) by outcome.
pub const RENEWALS: &str = "fencelock_renewals_total";
/// Counter: leases declared lost, by reason.
pub const LEASES_LOST: &str = "fencelock_leases_lost_total";
/// Counter: releases that found the lock no longer ours.
pub const RELEASES_NOT_OURS: &str = "fencelock_releases_not_ours_total";
/// Counter: revokes by outcome (a holder deposed, or the lock was free).
pub const REVOKES: &str = "fencelock_revokes_total";
/// Counter: fenced writes by resource and outcome.
pub const FENCED_WRITES: &str = "fencelock_fenced_writes_total";
/// Histogram: how late the renewal task woke against its schedule.
pub const RENEWAL_LAG: &str = "fencelock_renewal_lag_seconds";
/// Counter: unsafe deployment settings found at connect (a memory policy
/// that can evict locks), by kind; each is also logged as a `warn` event.
pub const DEPLOYMENT_WARNINGS: &str = "fencelock_deployment_warnings_total";

/// The metrics family of lock (or resource) `name`: the name up to its last
/// `:`, or the whole name if it has no `:` (or only a leading one).
///
/// ```
/// assert_eq!(fencelock::metrics::family("invoice:42"), "invoice");
/// assert_eq!(fencelock::metrics::family("nightly-report"), "nightly-report");
/// ```
pub fn family(name: &str) -> &str {
    match name.rsplit_once(':') {
        Some((head, _)) if !head.is_empty() => head,
        _ => name,
    }
}

/// The counters of one lock family since the client started, in [`Stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Acquisitions that got the lock.
    pub acquired: u64,
    /// Acquisitions refused at once (try-once, or a wait of zero).
    pub contended: u64,
    /// Acquisitions whose wait deadline passed.
    pub timed_out: u64,
    /// Acquisitions that ended in any other error.
    pub errors: u64,
    /// Renewals that extended the lease.
    pub renewals_ok: u64,
    /// Renewals that failed (not ours, or a connection error).
    pub renewals_failed: u64,
    /// Leases declared lost.
    pub lost: u64,
    /// Releases that found the lock no longer ours.
    pub releases_not_ours: u64,
    /// The worst renewal lag seen (zero without renewal samples).
    pub worst_renewal_lag: Duration,
    /// Revokes made by this client (a holder deposed or not).
    pub revokes: u64,
}

/// The counters of one resource family since start, in [`Stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResourceStats {
    /// Fenced writes accepted.
    pub accepted: u64,
    /// Fenced writes rejected as stale (each one means a holder outlived its
    /// lease).
    pub rejected_stale: u64,
}

/// A snapshot of a [`StatsHandle`]: per-family counters since it was created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Lock families, by family label.
    pub locks: BTreeMap<String, LockStats>,
    /// Resource families, by family label.
    pub resources: BTreeMap<String, ResourceStats>,
}

impl Stats {
    /// The counters of lock family `family`, if it saw any event.
    pub fn lock(&self, family: &str) -> Option<&LockStats> {
        self.locks.get(family)
    }

    /// The counters of resource family `family`, if it saw any write.
    pub fn resource(&self, family: &str) -> Option<&ResourceStats> {
        self.resources.get(family)
    }

    /// The worst renewal lag over all lock families, with its family.
    pub fn worst_renewal_lag(&self) -> Option<(&str, Duration)> {
        self.locks
            .iter()
            .map(|(f, s)| (f.as_str(), s.worst_renewal_lag))
            .filter(|(_, lag)| !lag.is_zero())
            .max_by_key(|(_, lag)| *lag)
    }
}

/// Shared, cheap-to-clone storage of [`Stats`]: one entry per family. A
/// [`LockClient`](crate::LockClient) owns one (shared by its leases
/// and by the [`FencedHash`](crate::FencedHash)es it creates); pass
/// [`LockClient::stats_handle`](crate::LockClient::stats_handle) to a
/// `FencedTable` (`with_stats`) to count its writes there too.
#[derive(Debug, Clone, Default)]
pub struct StatsHandle {
    inner: Arc<Mutex<StatsInner>>,
}

#[derive(Debug, Default)]
struct StatsInner {
    locks: HashMap<String, Arc<LockFamily>, foldhash::fast::RandomState>,
    resources: HashMap<String, ResourceStats>,
    /// Lock families whose metric handles are cached (at most
    /// [`CACHED_FAMILIES`]).
    cached: usize,
}

/// Most lock families per client whose metric handles are cached: beyond
/// them (a name scheme with a family per name, say), each event registers
/// its metric with the recorder again, as the `metrics` macros do, rather
/// than keep handles for millions of families.
const CACHED_FAMILIES: usize = 4096;

impl StatsHandle {
    /// Empty stats.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the counters now.
    pub fn snapshot(&self) -> Stats {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Stats {
            locks: inner
                .locks
                .iter()
                .map(|(k, v)| (k.clone(), v.counters.snapshot()))
                .collect(),
            resources: inner
                .resources
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The entry of lock family `family` (created on first use).
    pub(crate) fn lock_family(&self, family: &str) -> Arc<LockFamily> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = inner.locks.get(family) {
            return entry.clone();
        }
        let cache = inner.cached < CACHED_FAMILIES;
        inner.cached += usize::from(cache);
        let entry = Arc::new(LockFamily::new(family, cache));
        inner.locks.insert(family.to_owned(), entry.clone());
        entry
    }

    fn resource(&self, family: &str, update: impl FnOnce(&mut ResourceStats)) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.resources.get_mut(family) {
            Some(s) => update(s),
            None => update(inner.resources.entry(family.to_owned()).or_default()),
        }
    }
}

fn record_outcome(outcome: &'static str) {
    tracing::Span::current().record("outcome", outcome);
}

/// The final outcomes of an acquisition call, in [`LockHandles::attempts`]
/// order.
const ATTEMPT_OUTCOMES: [&str; 4] = ["acquired", "contended", "timed_out", "error"];
/// Renewal outcomes, in [`LockHandles::renewals`] order.
const RENEWAL_OUTCOMES: [&str; 2] = ["ok", "failed"];
/// Loss reasons, in [`LockHandles::lost`] order.
const LOSS_REASONS: [&str; 3] = ["expired", "taken_over", "deadline_passed"];
/// Revoke outcomes, in [`LockHandles::revokes`] order.
const REVOKE_OUTCOMES: [&str; 2] = ["deposed", "free"];

/// Where the metrics of this crate are registered from (what the `metrics`
/// macros would pass).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One lock family of a client: its counters for [`Stats`], and its metric
/// handles, registered with the recorder once instead of on every event
/// (registering hashes the name and labels, and an exporter looks them up
/// in its registry). Acquisitions look the family up once; their leases
/// keep it.
#[derive(Debug)]
pub(crate) struct LockFamily {
    label: String,
    counters: LockCounters,
    /// `None`: beyond [`CACHED_FAMILIES`], nothing is cached.
    handles: Option<Mutex<Cached>>,
}

/// The counters of [`LockStats`], updated without a lock.
#[derive(Debug, Default)]
struct LockCounters {
    attempts: [AtomicU64; 4],
    renewals: [AtomicU64; 2],
    lost: AtomicU64,
    releases_not_ours: AtomicU64,
    worst_renewal_lag_ns: AtomicU64,
    revokes: AtomicU64,
}

impl LockCounters {
    fn snapshot(&self) -> LockStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LockStats {
            acquired: get(&self.attempts[0]),
            contended: get(&self.attempts[1]),
            timed_out: get(&self.attempts[2]),
            errors: get(&self.attempts[3]),
            renewals_ok: get(&self.renewals[0]),
            renewals_failed: get(&self.renewals[1]),
            lost: get(&self.lost),
            releases_not_ours: get(&self.releases_not_ours),
            worst_renewal_lag: Duration::from_nanos(get(&self.worst_renewal_lag_ns)),
            revokes: get(&self.revokes),
        }
    }
}

/// The handles of one family, registered with one recorder, each on its
/// first use (so a series appears in an exporter only once it happened).
#[derive(Default)]
struct LockHandles {
    attempts: [OnceLock<Counter>; 4],
    wait: OnceLock<Histogram>,
    hold: OnceLock<Histogram>,
    renewals: [OnceLock<Counter>; 2],
    lost: [OnceLock<Counter>; 3],
    releases_not_ours: OnceLock<Counter>,
    renewal_lag: OnceLock<Histogram>,
    revokes: [OnceLock<Counter>; 2],
}

/// The handles of a family and the recorder they were registered with (its
/// address: the `metrics` facade names a recorder by reference only). A
/// program may install its exporter after connecting, and tests set local
/// recorders: when the current recorder is another one, the handles are
/// registered again. A local recorder that ends while the client lives and
/// a new one at the same address would keep the first one's handles; give
/// each local recorder its own client.
struct Cached {
    recorder: usize,
    handles: LockHandles,
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("recorder", &self.recorder)
            .finish_non_exhaustive()
    }
}

/// A counter of a lock family: its key, and its handle in [`LockHandles`].
#[derive(Clone, Copy)]
enum Counted {
    Attempts(usize),
    Renewals(usize),
    Lost(usize),
    ReleasesNotOurs,
    Revokes(usize),
}

impl Counted {
    fn key(self, label: &str) -> Key {
        match self {
            Counted::Attempts(i) => key(
                ACQUIRE_ATTEMPTS,
                label,
                Some(("outcome", ATTEMPT_OUTCOMES[i])),
            ),
            Counted::Renewals(i) => key(RENEWALS, label, Some(("outcome", RENEWAL_OUTCOMES[i]))),
            Counted::Lost(i) => key(LEASES_LOST, label, Some(("reason", LOSS_REASONS[i]))),
            Counted::ReleasesNotOurs => key(RELEASES_NOT_OURS, label, None),
            Counted::Revokes(i) => key(REVOKES, label, Some(("outcome", REVOKE_OUTCOMES[i]))),
        }
    }

    fn slot(self, handles: &LockHandles) -> &OnceLock<Counter> {
        match self {
            Counted::Attempts(i) => &handles.attempts[i],
            Counted::Renewals(i) => &handles.renewals[i],
            Counted::Lost(i) => &handles.lost[i],
            Counted::ReleasesNotOurs => &handles.releases_not_ours,
            Counted::Revokes(i) => &handles.revokes[i],
        }
    }
}

/// A histogram of a lock family: its key, and its handle in
/// [`LockHandles`].
#[derive(Clone, Copy)]
enum Observed {
    Wait,
    Hold,
    RenewalLag,
}

impl Observed {
    fn key(self, label: &str) -> Key {
        let name = match self {
            Observed::Wait => ACQUIRE_WAIT,
            Observed::Hold => HOLD,
            Observed::RenewalLag => RENEWAL_LAG,
        };
        key(name, label, None)
    }

    fn slot(self, handles: &LockHandles) -> &OnceLock<Histogram> {
        match self {
            Observed::Wait => &handles.wait,
            Observed::Hold => &handles.hold,
            Observed::RenewalLag => &handles.renewal_lag,
        }
    }
}

/// The key of metric `name` for lock family `label`, with one more label
/// if given.
fn key(name: &'static str, label: &str, extra: Option<(&'static str, &'static str)>) -> Key {
    let mut labels = vec![Label::new("lock", label.to_owned())];
    labels.extend(extra.map(|(k, v)| Label::new(k, v)));
    Key::from_parts(name, labels)
}

impl LockFamily {
    fn new(label: &str, cache: bool) -> Self {
        LockFamily {
            label: label.to_owned(),
            counters: LockCounters::default(),
            handles: cache.then(|| {
                Mutex::new(Cached {
                    recorder: 0,
                    handles: LockHandles::default(),
                })
            }),
        }
    }

    /// Adds one to counter `metric` of the current recorder.
    fn count(&self, metric: Counted) {
        metrics::with_recorder(|recorder| {
            let register = || recorder.register_counter(&metric.key(&self.label), &METADATA);
            match &self.handles {
                Some(cached) => {
                    let cached = self.current(cached, recorder);
                    metric
                        .slot(&cached.handles)
                        .get_or_init(register)
                        .increment(1);
                }
                None => register().increment(1),
            }
        });
    }

    /// Records `value` into histogram `metric` of the current recorder.
    fn observe(&self, metric: Observed, value: Duration) {
        metrics::with_recorder(|recorder| {
            let register = || recorder.register_histogram(&metric.key(&self.label), &METADATA);
            match &self.handles {
                Some(cached) => {
                    let cached = self.current(cached, recorder);
                    metric
                        .slot(&cached.handles)
                        .get_or_init(register)
                        .record(value);
                }
                None => register().record(value),
            }
        });
    }

    /// The cached handles, emptied first if they belong to another recorder
    /// than `recorder`.
    fn current<'a>(
        &self,
        cached: &'a Mutex<Cached>,
        recorder: &dyn Recorder,
    ) -> MutexGuard<'a, Cached> {
        let id = std::ptr::from_ref(recorder).cast::<()>() as usize;
        let mut cached = cached.lock().unwrap_or_else(|p| p.into_inner());
        if cached.recorder != id {
            *cached = Cached {
                recorder: id,
                handles: LockHandles::default(),
            };
        }
        cached
    }
}

/// Records one acquisition call's final outcome on its `span` (and, when
/// acquired, its `wait`).
pub(crate) fn acquire<T>(
    family: &LockFamily,
    span: &tracing::Span,
    result: &Result<T, Error>,
    wait: Duration,
) {
    let outcome = match result {
        Ok(_) => 0,
        Err(Error::Contended { .. }) => 1,
        Err(Error::Timeout { .. }) => 2,
        Err(_) => 3,
    };
    span.record("outcome", ATTEMPT_OUTCOMES[outcome]);
    family.count(Counted::Attempts(outcome));
    if result.is_ok() {
        family.observe(Observed::Wait, wait);
    }
    family.counters.attempts[outcome].fetch_add(1, Ordering::Relaxed);
}

/// Records one revoke of a lock of `family`; `deposed`: it took a
/// holder's lock away (else the lock was free).
pub(crate) fn revoke(stats: &StatsHandle, family: &str, deposed: bool) {
    let family = stats.lock_family(family);
    family.count(Counted::Revokes(usize::from(!deposed)));
    family.counters.revokes.fetch_add(1, Ordering::Relaxed);
}

/// Records an unsafe deployment setting found at connect.
pub(crate) fn deployment_warning(warning: &'static str) {
    ::metrics::counter!(DEPLOYMENT_WARNINGS, "warning" => warning).increment(1);
}

/// Records one fenced write.
pub(crate) fn fenced_write(stats: Option<&StatsHandle>, resource: &str, accepted: bool) {
    let outcome = if accepted {
        "accepted"
    } else {
        "rejected_stale"
    };
    record_outcome(outcome);
    ::metrics::counter!(FENCED_WRITES, "resource" => resource.to_owned(), "outcome" => outcome)
        .increment(1);
    if let Some(stats) = stats {
        stats.resource(resource, |s| match accepted {
            true => s.accepted += 1,
            false => s.rejected_stale += 1,
        });
    }
}

/// The metrics side of one lease: its family, the grant instant (for the
/// hold time) and the once-only flags.
#[derive(Debug)]
pub(crate) struct LeaseMetrics {
    family: Arc<LockFamily>,
    granted: Instant,
    hold_recorded: AtomicBool,
    lag_warned: AtomicBool,
}

impl LeaseMetrics {
    /// The metrics of a lease of `family` held since `granted`.
    pub(crate) fn new(family: Arc<LockFamily>, granted: Instant) -> Self {
        LeaseMetrics {
            family,
            granted,
            hold_recorded: AtomicBool::new(false),
            lag_warned: AtomicBool::new(false),
        }
    }

    /// The hold ended (release, drop or loss); recorded once per lease.
    pub(crate) fn hold_ended(&self) {
        if !self.hold_recorded.swap(true, Ordering::Relaxed) {
            self.family.observe(Observed::Hold, self.granted.elapsed());
        }
    }

    /// One renewal's outcome.
    pub(crate) fn renewal(&self, ok: bool) {
        let i = usize::from(!ok);
        record_outcome(RENEWAL_OUTCOMES[i]);
        self.family.count(Counted::Renewals(i));
        self.family.counters.renewals[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The lease was declared lost (called once per lease).
    pub(crate) fn lost(&self, reason: LossReason) {
        let i = match reason {
            LossReason::Expired => 0,
            LossReason::TakenOver => 1,
            LossReason::DeadlinePassed => 2,
        };
        self.family.count(Counted::Lost(i));
        self.family.counters.lost.fetch_add(1, Ordering::Relaxed);
        self.hold_ended();
    }

    /// A release found the lock no longer ours.
    pub(crate) fn release_not_ours(&self) {
        self.family.count(Counted::ReleasesNotOurs);
        self.family
            .counters
            .releases_not_ours
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The keeper woke `lag` late; warns once per lease when the lag exceeds
    /// a third of `ttl`.
    pub(crate) fn renewal_lag(&self, name: &str, lag: Duration, ttl: Duration) {
        self.family.observe(Observed::RenewalLag, lag);
        let ns = u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX);
        self.family
            .counters
            .worst_renewal_lag_ns
            .fetch_max(ns, Ordering::Relaxed);
        if lag > ttl / 3 && !self.lag_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                lock = %name,
                lag_ms = lag.as_millis() as u64,
                ttl_ms = ttl.as_millis() as u64,
                suggested_ttl_ms = suggested_ttl(lag).as_millis() as u64,
                "this process stalled for more than a third of the lease ttl; set the ttl to at least {} (3x the observed lag)",
                humanize(suggested_ttl(lag)),
            );
        }
    }
}

/// Three times `lag`, rounded up to 100 ms (below 10 s) or to whole seconds.
pub(crate) fn suggested_ttl(lag: Duration) -> Duration {
    let ms = lag.as_millis().saturating_mul(3) as u64;
    let step = if ms < 10_000 { 100 } else { 1000 };
    Duration::from_millis(ms.div_ceil(step).max(1) * step)
}

fn humanize(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_cut_at_the_last_colon() {
        assert_eq!(family("invoice:42"), "invoice");
        assert_eq!(family("tenant:7:job:3"), "tenant:7:job");
        assert_eq!(family("plain"), "plain");
        assert_eq!(family(":x"), ":x");
        assert_eq!(family("invoice:42:data"), "invoice:42");
    }

    /// Counter values by lock label in `recorder`'s snapshot.
    fn counts(snapshotter: &metrics_util::debugging::Snapshotter) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if let metrics_util::debugging::DebugValue::Counter(n) = value {
                let lock = key.key().labels().find(|l| l.key() == "lock");
                *counts
                    .entry(lock.map_or_else(String::new, |l| l.value().to_owned()))
                    .or_default() += n;
            }
        }
        counts
    }

    #[test]
    fn families_beyond_the_cache_still_reach_the_recorder_and_the_stats() {
        let stats = StatsHandle::new();
        let families: Vec<Arc<LockFamily>> = (0..=CACHED_FAMILIES)
            .map(|i| stats.lock_family(&format!("f{i}")))
            .collect();
        let (first, last) = (&families[0], &families[CACHED_FAMILIES]);
        assert!(first.handles.is_some() && last.handles.is_none());
        // The same family again is the same entry.
        assert!(Arc::ptr_eq(first, &stats.lock_family("f0")));
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            for family in [first, last] {
                acquire::<()>(family, &tracing::Span::none(), &Ok(()), Duration::ZERO);
                acquire::<()>(family, &tracing::Span::none(), &Ok(()), Duration::ZERO);
            }
        });
        let counts = counts(&snapshotter);
        let last_label = format!("f{CACHED_FAMILIES}");
        assert_eq!(counts.get("f0"), Some(&2), "{counts:?}");
        assert_eq!(counts.get(last_label.as_str()), Some(&2), "{counts:?}");
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.lock("f0").map(|s| s.acquired), Some(2));
        assert_eq!(snapshot.lock(&last_label).map(|s| s.acquired), Some(2));
    }

    #[test]
    fn suggested_ttls_round_up() {
        assert_eq!(
            suggested_ttl(Duration::from_millis(120)),
            Duration::from_millis(400)
        );
        assert_eq!(
            suggested_ttl(Duration::from_millis(3500)),
            Duration::from_secs(11)
        );
        assert_eq!(humanize(Duration::from_secs(11)), "11s");
    }
}
