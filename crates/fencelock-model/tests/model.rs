//! The model checked exhaustively: every safe configuration satisfies every
//! property, reaches its faults and the end of every cycle, and explores
//! exactly the pinned number of unique states (a change that shrinks or
//! grows the space fails here, and its commit says why); every negative
//! control produces a counterexample of the property that names its flaw,
//! and its trace is printed.

use fencelock_model::configs;
use fencelock_model::model::{Faults, LockModel, Replicated};
use fencelock_model::store::{Broken, FenceMode, WaitMode};
use stateright::{Checker, Model};

/// Faults with one switched on.
fn only(set: fn(&mut Faults)) -> Faults {
    let mut faults = Faults::default();
    set(&mut faults);
    faults
}

/// Checks `model` to the end: every `always` property holds, every
/// `sometimes` one is reached; returns the unique states.
fn check_safe(name: &str, model: LockModel) -> usize {
    let checker = model.checker().spawn_bfs().join();
    assert!(checker.is_done(), "{name}: the search did not finish");
    for property in [
        "C1 fences accepted in order",
        "C2 one holder per fence",
        "C3 no acknowledged write lost",
        "C4 mutual exclusion",
        "C6 fences increase",
        "C7 no zombie renewal",
        "revoked holders are refused",
        "a free lock is reserved for one head at most a waiter lease",
    ] {
        if let Some(path) = checker.discovery(property) {
            panic!("{name}: {property} fails:\n{path}");
        }
    }
    for reached in ["every cycle done", "every fault happened"] {
        assert!(
            checker.discovery(reached).is_some(),
            "{name}: never reached: {reached}"
        );
    }
    checker.unique_state_count()
}

/// The safe configurations and their pinned unique state counts.
#[test]
fn every_safe_configuration_holds_every_property() {
    let base = LockModel::default();
    let configs: Vec<(&str, LockModel, usize)> = vec![
        ("notify", base.clone(), 6344),
        (
            "fair",
            LockModel {
                wait_mode: WaitMode::Fair,
                ..base.clone()
            },
            6476,
        ),
        (
            "poll",
            LockModel {
                wait_mode: WaitMode::Poll,
                ..base.clone()
            },
            5009,
        ),
        (
            "notify, two cycles each",
            LockModel {
                cycles: 2,
                max_ticks: 6,
                ..base.clone()
            },
            146866,
        ),
        (
            "three clients",
            LockModel {
                clients: 3,
                ..base.clone()
            },
            131389,
        ),
        (
            "three clients, fair",
            LockModel {
                clients: 3,
                wait_mode: WaitMode::Fair,
                ..base.clone()
            },
            140429,
        ),
        (
            "two cycles each, a lost grant reply",
            LockModel {
                cycles: 2,
                max_ticks: 6,
                faults: only(|f| f.lost_reply = true),
                ..base.clone()
            },
            413513,
        ),
        (
            "fair, hand-over wake-ups (trusted when fresh, else confirmed)",
            LockModel {
                wait_mode: WaitMode::Fair,
                handover_wakeups: true,
                ..base.clone()
            },
            17636,
        ),
        (
            "fair, hand-over wake-ups, two cycles each",
            LockModel {
                wait_mode: WaitMode::Fair,
                handover_wakeups: true,
                cycles: 2,
                max_ticks: 6,
                ..base.clone()
            },
            1429181,
        ),
        (
            "a lost grant reply (the retry keeps its token)",
            LockModel {
                faults: only(|f| f.lost_reply = true),
                ..base.clone()
            },
            14855,
        ),
        (
            "a restart that loses the data (clock fences)",
            LockModel {
                faults: only(|f| f.lose_data = true),
                ..base.clone()
            },
            18804,
        ),
        (
            "a restart that loses the data (counter fences)",
            LockModel {
                faults: only(|f| f.lose_data = true),
                fence_mode: FenceMode::Counter,
                ..base.clone()
            },
            7109,
        ),
        (
            "a failover to a replica missing the last write",
            LockModel {
                faults: only(|f| f.failover = true),
                ..base.clone()
            },
            55669,
        ),
        (
            "a failover, grants and renewals waiting for the replica",
            LockModel {
                faults: only(|f| f.failover = true),
                replicas: Replicated::GrantsAndRenewals,
                ..base.clone()
            },
            26265,
        ),
        (
            "a server clock stepping back",
            LockModel {
                faults: only(|f| f.clock_back = true),
                ..base.clone()
            },
            15365,
        ),
        (
            "a server clock jumping forward",
            LockModel {
                faults: only(|f| f.clock_forward = true),
                ..base.clone()
            },
            20319,
        ),
        (
            "a revoke (notify)",
            LockModel {
                faults: only(|f| f.revoke = true),
                ..base.clone()
            },
            56643,
        ),
        (
            "a revoke (fair)",
            LockModel {
                faults: only(|f| f.revoke = true),
                wait_mode: WaitMode::Fair,
                ..base.clone()
            },
            58399,
        ),
        (
            "a drift margin of one tick",
            LockModel {
                drift: 1,
                ttl: 3,
                ..base.clone()
            },
            4648,
        ),
    ];
    let mut counts = Vec::new();
    for (name, model, pinned) in configs {
        let started = std::time::Instant::now();
        let states = check_safe(name, model);
        eprintln!("{name}: {states} unique states in {:?}", started.elapsed());
        counts.push((name, states, pinned));
    }
    for (name, states, pinned) in counts {
        assert_eq!(states, pinned, "{name}: unique states changed");
    }
}

/// Checks `model` and returns the counterexample of `property`, printed.
fn counterexample(name: &str, model: LockModel, property: &'static str) -> usize {
    let checker = model.checker().spawn_bfs().join();
    let Some(path) = checker.discovery(property) else {
        panic!("{name}: the broken variant was not caught by {property}");
    };
    let steps = path.clone().into_actions().len();
    eprintln!("{name}: caught by {property} after {steps} steps:\n{path}");
    steps
}

/// Each of torture's `--unsafe` variants, and each broken rule, as a model
/// switch that must produce a counterexample of the property named.
#[test]
fn every_broken_rule_is_caught() {
    let base = LockModel::default();
    let broken = |set: fn(&mut Broken)| {
        let mut b = Broken::default();
        set(&mut b);
        b
    };
    let controls: Vec<(&str, LockModel, &'static str)> = vec![
        (
            "two-command-acquire",
            LockModel {
                broken: broken(|b| b.two_command_acquire = true),
                fence_mode: FenceMode::Counter,
                ..base.clone()
            },
            "C6 fences increase",
        ),
        (
            "ge-check",
            LockModel {
                broken: broken(|b| b.ge_check = true),
                fence_mode: FenceMode::Counter,
                faults: only(|f| f.lose_data = true),
                ..base.clone()
            },
            "C2 one holder per fence",
        ),
        (
            "write-only-check",
            LockModel {
                write_only: true,
                ..base.clone()
            },
            "C3 no acknowledged write lost",
        ),
        (
            "unchecked-release",
            LockModel {
                broken: broken(|b| b.unchecked_release = true),
                cycles: 2,
                max_ticks: 6,
                ..base.clone()
            },
            "C4 mutual exclusion",
        ),
        (
            "recreating-renewal",
            LockModel {
                broken: broken(|b| b.recreating_renewal = true),
                ..base.clone()
            },
            "C7 no zombie renewal",
        ),
        (
            "a mint without + 1",
            LockModel {
                broken: broken(|b| b.mint_without_increment = true),
                ..base.clone()
            },
            "C6 fences increase",
        ),
        (
            "a revoke that mints no fence",
            LockModel {
                broken: broken(|b| b.revoke_without_mint = true),
                faults: only(|f| f.revoke = true),
                ..base.clone()
            },
            "C6 fences increase",
        ),
        (
            "a failover, only grants waiting for the replica",
            LockModel {
                faults: only(|f| f.failover = true),
                replicas: Replicated::Grants,
                ..base.clone()
            },
            "C4 mutual exclusion",
        ),
        (
            "an endless waiter lease",
            LockModel {
                broken: broken(|b| b.endless_waiter_lease = true),
                wait_mode: WaitMode::Fair,
                ..base.clone()
            },
            "a free lock is reserved for one head at most a waiter lease",
        ),
        (
            "every hand-over wake-up trusted",
            LockModel {
                wait_mode: WaitMode::Fair,
                handover_wakeups: true,
                trust_every_handover: true,
                cycles: 2,
                max_ticks: 6,
                ..base.clone()
            },
            "C4 mutual exclusion",
        ),
        (
            "revoke-without-seal",
            LockModel {
                revoke_without_seal: true,
                faults: only(|f| f.revoke = true),
                ..base.clone()
            },
            "revoked holders are refused",
        ),
    ];
    for (name, model, property) in controls {
        counterexample(name, model, property);
    }
}

/// The opt-in run's larger configurations (`scripts/model-large`), each
/// checked here for its first states: none fails a property among them
/// (the opt-in run checks them to the end).
#[test]
fn the_large_configurations_hold_in_their_first_states() {
    for (name, model) in configs::large() {
        let properties = model.properties();
        let checker = model
            .checker()
            .target_state_count(100_000)
            .spawn_bfs()
            .join();
        assert!(
            checker.unique_state_count() >= 20_000,
            "{name}: only {} states",
            checker.unique_state_count()
        );
        for p in properties {
            if matches!(p.expectation, stateright::Expectation::Always)
                && let Some(path) = checker.discovery(p.name)
            {
                panic!("{name}: {} fails:\n{path}", p.name);
            }
        }
    }
}
