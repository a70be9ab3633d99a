//! The fenced semaphore's specification checked exhaustively: per-slot
//! fences keep every property (pinned unique-state counts), and each
//! broken rule — one fence pair for all slots (a mutex's resource), a grant
//! past the permit count, a release without the compare — yields its
//! counterexample (printed).

use fencelock_model::semaphore::{SemBroken, SemaphoreModel};
use stateright::{Checker, Expectation, Model};

/// Checks `model` to the end; returns the unique states.
fn check_safe(name: &str, model: SemaphoreModel) -> usize {
    let properties = model.properties();
    let checker = model.checker().spawn_bfs().join();
    assert!(checker.is_done(), "{name}: the search did not finish");
    for p in properties {
        let found = checker.discovery(p.name);
        match p.expectation {
            Expectation::Always => {
                if let Some(path) = found {
                    panic!("{name}: {} fails:\n{path}", p.name);
                }
            }
            _ => assert!(found.is_some(), "{name}: never reached: {}", p.name),
        }
    }
    checker.unique_state_count()
}

#[test]
fn per_slot_fences_hold_every_property() {
    let base = SemaphoreModel::default();
    let configs = vec![
        ("three clients, two permits", base.clone(), 417484),
        (
            "three clients, two permits, a lost grant reply",
            SemaphoreModel {
                lost_reply: true,
                ..base.clone()
            },
            1044057,
        ),
        (
            "two clients, two permits, two cycles each",
            SemaphoreModel {
                clients: 2,
                cycles: 2,
                max_ticks: 5,
                ..base.clone()
            },
            681034,
        ),
        (
            "three clients, one permit (a mutex)",
            SemaphoreModel {
                permits: 1,
                ..base.clone()
            },
            17678,
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

#[test]
fn every_broken_rule_is_caught() {
    let base = SemaphoreModel::default();
    let broken = |set: fn(&mut SemBroken)| {
        let mut b = SemBroken::default();
        set(&mut b);
        SemaphoreModel {
            broken: b,
            ..base.clone()
        }
    };
    let controls = [
        (
            "one fence for all slots",
            broken(|b| b.one_fence_for_all_slots = true),
            "a valid permit is never refused",
        ),
        (
            "a grant past the permit count",
            broken(|b| b.ignore_permits = true),
            "never more valid holders than permits",
        ),
        (
            "a release without the compare",
            broken(|b| b.unchecked_release = true),
            "one valid holder per slot",
        ),
    ];
    for (name, model, property) in controls {
        let checker = model.checker().spawn_bfs().join();
        let Some(path) = checker.discovery(property) else {
            panic!("{name}: not caught by {property}");
        };
        let steps = path.clone().into_actions().len();
        eprintln!("{name}: caught by {property} after {steps} steps:\n{path}");
    }
}
