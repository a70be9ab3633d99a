//! Waiting for a held lock: capped exponential backoff with jitter.
//!
//! Jitter keeps many waiters from retrying in lockstep; the cap bounds how
//! late a waiter notices a release; and the caller never sleeps past the
//! holder's reported expiry, so a crashed holder is replaced promptly.

use std::time::Duration;

use rand::Rng;

/// First retry delay.
const BASE: Duration = Duration::from_millis(4);
/// Longest retry delay.
const CAP: Duration = Duration::from_millis(200);

/// Retry delays: `d` doubles from [`BASE`] up to [`CAP`]; each delay is drawn
/// uniformly from `[d/2, d]` ("equal jitter").
#[derive(Debug)]
pub(crate) struct Backoff {
    current: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff { current: BASE }
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(CAP);
        let half = d / 2;
        let jitter_us = rand::rng().random_range(0..=half.as_micros() as u64);
        half + Duration::from_micros(jitter_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_capped_and_jittered() {
        let mut b = Backoff::new();
        let delays: Vec<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(delays[0] <= BASE && delays[0] >= BASE / 2);
        assert!(delays.iter().all(|d| *d <= CAP && *d >= BASE / 2));
        let tail: std::collections::HashSet<_> = delays[10..].iter().collect();
        assert!(tail.len() > 1, "capped delays must still be jittered");
    }
}
