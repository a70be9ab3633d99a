//! Whether a server's clock runs faster than this host's monotonic clock.
//!
//! Redis expires a lease by its own clock, and a lease's local deadline is
//! counted on this host's monotonic clock (docs/design.md §2.5): a server
//! clock that jumps forward expires held leases early, and the next holder
//! gets in while the first still runs. The keeper cannot prevent that, but
//! it can say so: after a batch of renewals, at most once a second per
//! client, it reads the server's `TIME` and compares how far the server's
//! clock moved since the last reading with the most this host's monotonic
//! clock can have moved (from the first request's send to the second
//! reply). A server that moved further, by more than the drift allowance,
//! is warned about once and counted in
//! `fencelock_deployment_warnings_total{warning="server_clock_fast"}`.
//! The cost is one `TIME` per client per second of renewals.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::redis::{BatchGroup, RedisConn};

/// Readings closer together than this are not taken: the check costs one
/// `TIME` per client per second at most (on a Cluster, the servers take
/// turns).
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The server's clock read between two instants of this host's monotonic
/// clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    pub(super) sent: Instant,
    pub(super) received: Instant,
    pub(super) server_us: u64,
}

/// How far the server's clock moved beyond the most this host's clock can
/// have moved between `earlier` and `later`, if that is more than the
/// drift allowance (a hundredth of the interval + 2 ms, as for lease
/// deadlines, and 10 ms for the resolution of `TIME` and timers).
pub(super) fn runs_fast(earlier: &Reading, later: &Reading) -> Option<Duration> {
    let server = Duration::from_micros(later.server_us.checked_sub(earlier.server_us)?);
    let local_max = later.received.checked_duration_since(earlier.sent)?;
    let ahead = server.checked_sub(local_max)?;
    let allowance = local_max / 100 + Duration::from_millis(12);
    (ahead > allowance).then_some(ahead)
}

/// The last reading of each server (one per batch group: a Cluster's
/// masters have clocks of their own), and whether a warning was given.
#[derive(Debug, Default)]
pub(crate) struct ServerClocks {
    last: Mutex<Last>,
    warned: AtomicBool,
}

#[derive(Debug, Default)]
struct Last {
    /// The last reading of each server.
    by_group: HashMap<BatchGroup, Reading>,
    /// When the last reading of any server was started.
    started: Option<Instant>,
}

impl ServerClocks {
    /// After renewals on the server of `key` (batch group `group`): reads
    /// its clock if the last reading is a second old or more, and warns
    /// when it ran fast. Best effort: a failed reading is dropped (the
    /// renewal that just ran reports the server's state).
    pub(crate) async fn check(&self, conn: &RedisConn, group: BatchGroup, key: &str) {
        let sent = Instant::now();
        {
            let mut last = self.lock();
            if last
                .started
                .is_some_and(|started| sent.duration_since(started) < MIN_INTERVAL)
            {
                return;
            }
            last.started = Some(sent);
        }
        let Ok((secs, micros)) = conn.cmd::<(u64, u64)>(key, &redis::cmd("TIME")).await else {
            return;
        };
        let reading = Reading {
            sent,
            received: Instant::now(),
            server_us: secs.saturating_mul(1_000_000).saturating_add(micros),
        };
        let earlier = self.lock().by_group.insert(group, reading);
        if let Some(ahead) = earlier.and_then(|earlier| runs_fast(&earlier, &reading)) {
            crate::metrics::deployment_warning("server_clock_fast");
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    url = %conn.url(),
                    ahead_ms = u64::try_from(ahead.as_millis()).unwrap_or(u64::MAX),
                    "the Redis server's clock ran faster than this host's (it jumped forward?): Redis expires leases by its clock, so held leases can expire before their holders renew them and another holder get in; keep the server's clock slewed by NTP, not stepped"
                );
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Last> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at: Instant, rtt_ms: u64, server_us: u64) -> Reading {
        Reading {
            sent: at,
            received: at + Duration::from_millis(rtt_ms),
            server_us,
        }
    }

    #[test]
    fn a_server_clock_that_moved_further_than_this_host_runs_fast() {
        let t0 = Instant::now();
        let start = 1_800_000_000_000_000;
        let first = reading(t0, 1, start);
        // 3 s here, 3 s there (within the round trips): in step.
        let in_step = reading(t0 + Duration::from_secs(3), 1, start + 3_001_000);
        assert_eq!(runs_fast(&first, &in_step), None);
        // A slow server, or one stepped back: not this check's concern.
        assert_eq!(
            runs_fast(&first, &reading(t0 + Duration::from_secs(3), 1, start)),
            None
        );
        // Within the drift allowance (1 % + 12 ms of 3 s = 42 ms).
        let drifting = reading(t0 + Duration::from_secs(3), 1, start + 3_040_000);
        assert_eq!(runs_fast(&first, &drifting), None);
        // The server moved 5 s while this host moved 3 s: 2 s ahead.
        let jumped = reading(t0 + Duration::from_secs(3), 1, start + 5_001_000);
        let ahead = runs_fast(&first, &jumped).expect("runs fast");
        assert!(
            ahead > Duration::from_millis(1990) && ahead <= Duration::from_secs(2),
            "{ahead:?}"
        );
    }
}
