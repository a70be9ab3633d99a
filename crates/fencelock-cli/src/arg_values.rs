//! Argument values several subcommands share: durations (`--ttl`,
//! `--wait`, `--interval` …) and wait modes (`run --wait-mode`, `bench
//! --mode`, `torture --mode`). In a module of their own so that no command
//! imports another for them.

use std::time::Duration;

use clap::ValueEnum;

/// Wait modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WaitModeArg {
    /// Backoff with jitter.
    Poll,
    /// Pub/sub wake-up of the head waiter.
    Notify,
    /// First come, first served.
    Fair,
}

impl From<WaitModeArg> for fencelock::WaitMode {
    fn from(m: WaitModeArg) -> Self {
        match m {
            WaitModeArg::Poll => fencelock::WaitMode::Poll,
            WaitModeArg::Notify => fencelock::WaitMode::Notify,
            WaitModeArg::Fair => fencelock::WaitMode::Fair,
        }
    }
}

/// Parses `300ms`, `10s`, `2m`, `1h30m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 300ms, 10s, 2m)"))
}
