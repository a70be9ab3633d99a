//! Timestamps every process of a run agrees on: `CLOCK_MONOTONIC` in µs.
//! On one Linux host all processes read the same monotonic clock, so the
//! coordinator, the observer and every worker stamp events on one time
//! axis (the history stores them relative to the run's start).

/// `CLOCK_MONOTONIC` now, in µs.
pub fn mono_us() -> i64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => ts.tv_sec() * 1_000_000 + ts.tv_nsec() / 1_000,
        // CLOCK_MONOTONIC exists on every Linux; fall back to a clock that
        // never goes backwards within this process if it ever failed.
        Err(_) => fallback_us(),
    }
}

fn fallback_us() -> i64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// The run's clock: µs since its start, as the history records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunClock {
    /// `CLOCK_MONOTONIC` at the start of the run, in µs.
    pub origin: i64,
}

impl RunClock {
    /// A clock starting now.
    pub fn start() -> Self {
        RunClock { origin: mono_us() }
    }

    /// µs since the start of the run.
    pub fn now(&self) -> i64 {
        mono_us() - self.origin
    }

    /// `now + d` on the run's axis.
    pub fn after(&self, d: std::time::Duration) -> i64 {
        self.now()
            .saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }
}
