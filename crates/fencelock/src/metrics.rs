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
//! | [`FENCED_WRITES`] `fencelock_fenced_writes_total` | counter | `resource`, `outcome` = `accepted` \| `rejected_stale` |
//! | [`RENEWAL_LAG`] `fencelock_renewal_lag_seconds` | histogram | `lock` |
//! | [`DEPLOYMENT_WARNINGS`] `fencelock_deployment_warnings_total` | counter (`evicting_maxmemory_policy`: once per connect; `server_clock_fast`: each time a server's clock moved further than this host's monotonic clock between two readings after renewals) | `warning` = `evicting_maxmemory_policy` \| `server_clock_fast` |
//!
//! One `acquire` or `try_acquire` call is one attempt, counted once with its
//! final outcome (the retries inside a waiting `acquire` are not attempts).
//! The renewal lag is how late the client's keeper sent a renewal against its schedule:
//! event-loop stalls, blocking calls, GC-like pauses of this process.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, LossReason};

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

/// Shared, cheap-to-clone storage of [`Stats`]: one mutex-guarded map per
/// kind. A [`LockClient`](crate::LockClient) owns one (shared by its leases
/// and by the [`FencedHash`](crate::FencedHash)es it creates); pass
/// [`LockClient::stats_handle`](crate::LockClient::stats_handle) to a
/// `FencedTable` (`with_stats`) to count its writes there too.
#[derive(Debug, Clone, Default)]
pub struct StatsHandle {
    inner: Arc<Mutex<StatsInner>>,
}

#[derive(Debug, Default)]
struct StatsInner {
    locks: HashMap<String, LockStats>,
    resources: HashMap<String, ResourceStats>,
}

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
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            resources: inner
                .resources
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    fn lock(&self, family: &str, update: impl FnOnce(&mut LockStats)) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.locks.get_mut(family) {
            Some(s) => update(s),
            None => update(inner.locks.entry(family.to_owned()).or_default()),
        }
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

/// Records one acquisition call's final outcome (and its wait when acquired).
pub(crate) fn acquire<T>(
    stats: &StatsHandle,
    family: &str,
    result: &Result<T, Error>,
    started: Instant,
) {
    let outcome = match result {
        Ok(_) => "acquired",
        Err(Error::Contended { .. }) => "contended",
        Err(Error::Timeout { .. }) => "timed_out",
        Err(_) => "error",
    };
    record_outcome(outcome);
    let lock = family.to_owned();
    ::metrics::counter!(ACQUIRE_ATTEMPTS, "lock" => lock.clone(), "outcome" => outcome)
        .increment(1);
    if result.is_ok() {
        ::metrics::histogram!(ACQUIRE_WAIT, "lock" => lock).record(started.elapsed());
    }
    stats.lock(family, |s| match outcome {
        "acquired" => s.acquired += 1,
        "contended" => s.contended += 1,
        "timed_out" => s.timed_out += 1,
        _ => s.errors += 1,
    });
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

/// The metrics side of one lease: its family, the client's stats, the grant
/// instant (for the hold time) and the once-only flags.
#[derive(Debug)]
pub(crate) struct LeaseMetrics {
    family: String,
    stats: StatsHandle,
    granted: Instant,
    hold_recorded: AtomicBool,
    lag_warned: AtomicBool,
}

impl LeaseMetrics {
    pub(crate) fn new(family: String, stats: StatsHandle) -> Self {
        LeaseMetrics {
            family,
            stats,
            granted: Instant::now(),
            hold_recorded: AtomicBool::new(false),
            lag_warned: AtomicBool::new(false),
        }
    }

    /// The hold ended (release, drop or loss); recorded once per lease.
    pub(crate) fn hold_ended(&self) {
        if !self.hold_recorded.swap(true, Ordering::Relaxed) {
            ::metrics::histogram!(HOLD, "lock" => self.family.clone())
                .record(self.granted.elapsed());
        }
    }

    /// One renewal's outcome.
    pub(crate) fn renewal(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        record_outcome(outcome);
        ::metrics::counter!(RENEWALS, "lock" => self.family.clone(), "outcome" => outcome)
            .increment(1);
        self.stats.lock(&self.family, |s| match ok {
            true => s.renewals_ok += 1,
            false => s.renewals_failed += 1,
        });
    }

    /// The lease was declared lost (called once per lease).
    pub(crate) fn lost(&self, reason: LossReason) {
        let reason = match reason {
            LossReason::Expired => "expired",
            LossReason::TakenOver => "taken_over",
            LossReason::DeadlinePassed => "deadline_passed",
        };
        ::metrics::counter!(LEASES_LOST, "lock" => self.family.clone(), "reason" => reason)
            .increment(1);
        self.stats.lock(&self.family, |s| s.lost += 1);
        self.hold_ended();
    }

    /// A release found the lock no longer ours.
    pub(crate) fn release_not_ours(&self) {
        ::metrics::counter!(RELEASES_NOT_OURS, "lock" => self.family.clone()).increment(1);
        self.stats.lock(&self.family, |s| s.releases_not_ours += 1);
    }

    /// The keeper woke `lag` late; warns once per lease when the lag exceeds
    /// a third of `ttl`.
    pub(crate) fn renewal_lag(&self, name: &str, lag: Duration, ttl: Duration) {
        ::metrics::histogram!(RENEWAL_LAG, "lock" => self.family.clone()).record(lag);
        self.stats.lock(&self.family, |s| {
            s.worst_renewal_lag = s.worst_renewal_lag.max(lag);
        });
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
