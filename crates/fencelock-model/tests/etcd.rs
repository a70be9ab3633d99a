//! The etcd model checked exhaustively: every configuration of the recipe
//! satisfies every property, reaches its faults, its paths and the end of
//! every cycle, and explores exactly the pinned number of unique states (a
//! change that shrinks or grows the space fails here, and its commit says
//! why); each finding on the recipe as first written, its old rule switched
//! back on, is again a counterexample of the property it broke and of no
//! other, asserted and printed; every negative control produces a
//! counterexample of the property that names its flaw, and its trace is
//! printed.

use fencelock_model::etcd::{Action, Broken, EtcdLockModel, Faults, State};
use stateright::{Checker, HasDiscoveries, Model, Path};

/// Every `always` property of the model.
const ALWAYS: [&str; 9] = [
    "C1 fences accepted in order",
    "C2 one holder per fence",
    "C3 no acknowledged write lost",
    "C4 mutual exclusion",
    "C6 fences increase",
    "C7 no zombie renewal",
    "revoked holders are refused",
    "no grant of a revoked key",
    "the lock passes within the drift margin",
];

/// Every `sometimes` property of the model.
const SOMETIMES: [&str; 4] = [
    "every cycle done",
    "every fault happened",
    "a holder outlived its lease",
    "a waiter got the lock after waiting",
];

/// Faults with some switched on.
fn faults(set: fn(&mut Faults)) -> Faults {
    let mut f = Faults::default();
    set(&mut f);
    f
}

/// A broken rule switched on.
fn broken(set: fn(&mut Broken)) -> Broken {
    let mut b = Broken::default();
    set(&mut b);
    b
}

/// A trace: each state, then the action taken from it.
fn render(steps: &[(State, Option<Action>)]) -> String {
    let mut out = String::new();
    for (state, action) in steps {
        out.push_str(&format!("  = {state}\n"));
        if let Some(action) = action {
            out.push_str(&format!("  - {action:?}\n"));
        }
    }
    out
}

/// A shortest counterexample of `property` in `model`, up to the first
/// state that breaks it, with etcd's own revision numbers: searches of
/// growing depth, each stopped once it found one, until one does
/// (stateright keeps the last counterexample a search found, not the
/// shortest); its actions are then replayed without relabelling.
fn shortest(model: &EtcdLockModel, property: &'static str) -> Option<Vec<(State, Option<Action>)>> {
    let path: Path<State, Action> = (1..=64).find_map(|depth| {
        model
            .clone()
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf([property].into()))
            .spawn_bfs()
            .join()
            .discovery(property)
    })?;
    let plain = EtcdLockModel {
        relabel: false,
        ..model.clone()
    };
    let holds = plain
        .properties()
        .into_iter()
        .find(|p| p.name == property)?
        .condition;
    let mut state = plain.init_states().into_iter().next()?;
    let mut steps = Vec::new();
    for action in path.into_actions() {
        if !holds(&plain, &state) {
            break;
        }
        let next = plain.next_state(&state, action)?;
        steps.push((state, Some(action)));
        state = next;
    }
    let broken = !holds(&plain, &state);
    steps.push((state, None));
    broken.then_some(steps)
}

/// Checks `model` to the end: every `always` property holds but those in
/// `fails`, which must fail (a finding: the trace is printed); every
/// `sometimes` one is reached. Returns the unique states.
fn check(name: &str, model: EtcdLockModel, fails: &[&str]) -> usize {
    let started = std::time::Instant::now();
    let checker = model.clone().checker().spawn_bfs().join();
    assert!(checker.is_done(), "{name}: the search did not finish");
    for property in ALWAYS {
        match (checker.discovery(property), fails.contains(&property)) {
            (Some(path), false) => panic!("{name}: {property} fails:\n{path}"),
            (None, true) => panic!("{name}: {property} was expected to fail"),
            (Some(_), true) => {
                let steps = shortest(&model, property).expect("found before");
                eprintln!(
                    "{name}: {property} fails after {} steps:\n{}",
                    steps.len() - 1,
                    render(&steps)
                );
            }
            (None, false) => {}
        }
    }
    for reached in SOMETIMES {
        assert!(
            checker.discovery(reached).is_some(),
            "{name}: never reached: {reached}"
        );
    }
    let states = checker.unique_state_count();
    eprintln!("{name}: {states} unique states in {:?}", started.elapsed());
    states
}

/// Checks each configuration and compares its unique states with the
/// pinned count (after all of them ran, so that one run reports every
/// count).
fn check_all(configs: Vec<(&str, EtcdLockModel, &[&str], usize)>) {
    let mut counts = Vec::new();
    for (name, model, fails, pinned) in configs {
        counts.push((name, check(name, model, fails), pinned));
    }
    for (name, states, pinned) in counts {
        assert_eq!(states, pinned, "{name}: unique states changed");
    }
}

/// The configurations of the recipe, with their pinned unique state counts
/// (two clients, one cycle each, ttl 2 ticks, up to 5 ticks, waiters on
/// the holder's session, unless said).
#[test]
fn every_configuration_holds_every_property() {
    let base = EtcdLockModel::default();
    check_all(vec![
        ("queue on the holder's session", base.clone(), &[], 11807),
        (
            "two cycles each, up to 6 ticks",
            EtcdLockModel {
                cycles: 2,
                max_ticks: 6,
                ..base.clone()
            },
            &[],
            1131848,
        ),
        (
            "three clients, up to 4 ticks",
            EtcdLockModel {
                clients: 3,
                max_ticks: 4,
                ..base.clone()
            },
            &[],
            1503145,
        ),
        (
            "a lost grant reply (resent with the same key)",
            EtcdLockModel {
                faults: faults(|f| f.lost_reply = true),
                ..base.clone()
            },
            &[],
            69098,
        ),
        (
            "a revoke",
            EtcdLockModel {
                faults: faults(|f| f.revoke = true),
                ..base.clone()
            },
            &[],
            70593,
        ),
        (
            "a revoke, held writes (the lock key compared)",
            EtcdLockModel {
                held_writes: true,
                faults: faults(|f| f.revoke = true),
                ..base.clone()
            },
            &[],
            75613,
        ),
        (
            "a lost grant reply and a revoke",
            EtcdLockModel {
                faults: faults(|f| {
                    f.lost_reply = true;
                    f.revoke = true;
                }),
                ..base.clone()
            },
            &[],
            608990,
        ),
        (
            "a waiter session (ttl 3 ticks, waiter lease 2)",
            EtcdLockModel {
                ttl: 3,
                waiter_lease: Some(2),
                ..base.clone()
            },
            &[],
            32377,
        ),
        (
            "a waiter session and a revoke",
            EtcdLockModel {
                ttl: 3,
                waiter_lease: Some(2),
                faults: faults(|f| f.revoke = true),
                ..base.clone()
            },
            &[],
            251888,
        ),
        (
            "a waiter session and a lost grant reply (LeaseGone deletes the key)",
            EtcdLockModel {
                ttl: 3,
                waiter_lease: Some(2),
                faults: faults(|f| f.lost_reply = true),
                ..base.clone()
            },
            &[],
            269412,
        ),
        (
            "a waiter session and a stale look",
            EtcdLockModel {
                ttl: 3,
                waiter_lease: Some(2),
                faults: faults(|f| f.stale_look = true),
                ..base.clone()
            },
            &[],
            77879,
        ),
        (
            "a waiter session, a stale look and a revoke (attach compares)",
            EtcdLockModel {
                ttl: 3,
                waiter_lease: Some(2),
                faults: faults(|f| {
                    f.stale_look = true;
                    f.revoke = true;
                }),
                ..base.clone()
            },
            &[],
            568552,
        ),
        (
            "a drift margin of one tick (ttl 3 ticks)",
            EtcdLockModel {
                drift: 1,
                ttl: 3,
                ..base.clone()
            },
            &[],
            16461,
        ),
    ]);
}

/// The findings on the recipe as first written, each with its old rule
/// switched back on (see the module docs of `fencelock_model::etcd`): its
/// property fails again, every other one holds, every `sometimes` one is
/// reached, and the states are those the recipe as first written had.
#[test]
fn the_old_rules_bring_the_findings_back() {
    let base = EtcdLockModel::default();
    check_all(vec![
        (
            "LeaseGone clears the key (own.clear()), a waiter session and a lost grant reply: a key orphaned",
            EtcdLockModel {
                ttl: 3,
                waiter_lease: Some(2),
                faults: faults(|f| f.lost_reply = true),
                broken: broken(|b| b.keep_key_on_lease_gone = true),
                ..base.clone()
            },
            &["the lock passes within the drift margin"],
            234847,
        ),
        (
            "a serializable look on the holder's session, a revoke and a stale look: a revoked waiter told that it holds",
            EtcdLockModel {
                faults: faults(|f| {
                    f.stale_look = true;
                    f.revoke = true;
                }),
                broken: broken(|b| b.serializable_holder_look = true),
                ..base.clone()
            },
            &["no grant of a revoked key"],
            187920,
        ),
    ]);
}

/// Checks `model` and returns the length of the counterexample of
/// `property`, printed.
fn counterexample(name: &str, model: EtcdLockModel, property: &'static str) -> usize {
    let Some(steps) = shortest(&model, property) else {
        panic!("{name}: the broken variant was not caught by {property}");
    };
    eprintln!(
        "{name}: caught by {property} after {} steps:\n{}",
        steps.len() - 1,
        render(&steps)
    );
    steps.len() - 1
}

/// Each broken rule, a mistake the code guards against, as a model switch
/// that must produce a counterexample of the property named.
#[test]
fn every_broken_rule_is_caught() {
    let base = EtcdLockModel::default();
    let revoke = faults(|f| f.revoke = true);
    let controls: Vec<(&str, EtcdLockModel, &'static str)> = vec![
        (
            "a holder test that does not wait for the keys ahead",
            EtcdLockModel {
                broken: broken(|b| b.no_wait = true),
                ..base.clone()
            },
            "C4 mutual exclusion",
        ),
        (
            "a resent grant that creates a second key",
            EtcdLockModel {
                broken: broken(|b| b.new_key_on_resend = true),
                faults: faults(|f| f.lost_reply = true),
                ..base.clone()
            },
            "the lock passes within the drift margin",
        ),
        (
            "the fence from the lease id",
            EtcdLockModel {
                broken: broken(|b| b.fence_from_lease = true),
                ..base.clone()
            },
            "C6 fences increase",
        ),
        (
            "a >= check at the fenced key",
            EtcdLockModel {
                broken: broken(|b| b.ge_check = true),
                faults: revoke,
                ..base.clone()
            },
            "revoked holders are refused",
        ),
        (
            "write-only check (no register before the read)",
            EtcdLockModel {
                broken: broken(|b| b.write_only = true),
                ..base.clone()
            },
            "C3 no acknowledged write lost",
        ),
        (
            "a revoke without a seal",
            EtcdLockModel {
                broken: broken(|b| b.revoke_without_seal = true),
                faults: revoke,
                ..base.clone()
            },
            "revoked holders are refused",
        ),
        (
            "a renewal that puts the key again",
            EtcdLockModel {
                broken: broken(|b| b.recreating_renewal = true),
                faults: revoke,
                ..base.clone()
            },
            "C7 no zombie renewal",
        ),
        (
            "a revocation fence above the waiters' (a new key's revision)",
            EtcdLockModel {
                broken: broken(|b| b.revoke_above_waiters = true),
                faults: revoke,
                ..base.clone()
            },
            "C6 fences increase",
        ),
    ];
    for (name, model, property) in controls {
        counterexample(name, model, property);
    }
}
