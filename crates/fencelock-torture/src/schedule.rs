//! The nemesis schedule: a seeded, reproducible list of faults.
//!
//! The same seed and configuration give the same schedule: which nemesis,
//! after which gap, for how long, and which worker it picks. Kinds come in
//! rounds, each a seeded shuffle of every enabled kind, so every kind is
//! injected once before any is injected twice. Nemeses never overlap: the
//! next gap starts when the previous fault is healed.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::nemesis::NemesisKind;

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Quiet time before it, after the previous fault was healed.
    pub gap: Duration,
    /// What to inject.
    pub kind: NemesisKind,
    /// How long the fault lasts (its meaning depends on the kind).
    pub length: Duration,
    /// A second parameter (the reply delay of `proxy-delay`, the mode of
    /// `client-pause`, the hold of a killed server before its restart).
    pub param: Duration,
    /// The seeded choice of a target worker (taken modulo the candidates).
    pub pick: u32,
}

/// `x` ttl, with `lo..hi` drawn as a multiple of the ttl.
fn ttls(rng: &mut StdRng, ttl: Duration, lo: f64, hi: f64) -> Duration {
    ttl.mul_f64(rng.random_range(lo..hi))
}

/// The schedule for `duration` (enough faults to fill it and then some; the
/// run stops at its duration).
pub fn plan(
    seed: u64,
    kinds: &[NemesisKind],
    ttl: Duration,
    interval: Duration,
    duration: Duration,
) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    if kinds.is_empty() {
        return out;
    }
    let mut planned = Duration::ZERO;
    while planned < duration + interval {
        let mut round = kinds.to_vec();
        round.shuffle(&mut rng);
        for kind in round {
            let gap = interval.mul_f64(rng.random_range(0.5..1.5));
            let (length, param) = match kind {
                NemesisKind::PauseServer => (ttls(&mut rng, ttl, 1.2, 2.5), Duration::ZERO),
                NemesisKind::KillRestart | NemesisKind::KillWipe => {
                    (Duration::ZERO, ttls(&mut rng, ttl, 0.0, 1.0))
                }
                NemesisKind::DebugSleep => (ttls(&mut rng, ttl, 0.5, 2.0), Duration::ZERO),
                NemesisKind::ClientPause => (
                    ttls(&mut rng, ttl, 1.0, 2.0),
                    Duration::from_millis(rng.random_range(0..2)),
                ),
                NemesisKind::ScriptFlush => (Duration::ZERO, Duration::ZERO),
                NemesisKind::ClientKill => (Duration::ZERO, Duration::ZERO),
                NemesisKind::PauseWorker => (ttls(&mut rng, ttl, 1.2, 3.0), Duration::ZERO),
                NemesisKind::ProxyDelay => {
                    (ttls(&mut rng, ttl, 3.0, 6.0), ttls(&mut rng, ttl, 1.2, 2.0))
                }
                NemesisKind::ProxyBlackhole => (ttls(&mut rng, ttl, 1.0, 3.0), Duration::ZERO),
                NemesisKind::ProxySwallow => (ttl * 2, Duration::ZERO),
                NemesisKind::ProxyReset | NemesisKind::Failover | NemesisKind::Revoke => {
                    (Duration::ZERO, Duration::ZERO)
                }
            };
            planned += gap + length + param;
            out.push(Planned {
                gap,
                kind,
                length,
                param,
                pick: rng.random(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_schedule_and_every_kind_comes_each_round() {
        let kinds = NemesisKind::ALL;
        let ttl = Duration::from_millis(300);
        let a = plan(
            7,
            &kinds,
            ttl,
            Duration::from_secs(1),
            Duration::from_secs(30),
        );
        let b = plan(
            7,
            &kinds,
            ttl,
            Duration::from_secs(1),
            Duration::from_secs(30),
        );
        let c = plan(
            8,
            &kinds,
            ttl,
            Duration::from_secs(1),
            Duration::from_secs(30),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut first: Vec<_> = a[..kinds.len()].iter().map(|p| p.kind).collect();
        first.sort();
        assert_eq!(first, kinds.to_vec());
    }
}
