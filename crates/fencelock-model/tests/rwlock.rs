//! The fenced read-write lock checked exhaustively: its store's rules keep
//! every property in each configuration (pinned unique-state counts, so a
//! change that shrinks the explored space fails), and each broken rule —
//! a reader granted while a writer holds, a writer that reuses the last
//! fence, a read that skips its validation, a reader's epoch not minted
//! when the fence key is missing, a reader that skips the writers queued
//! ahead of it — yields its counterexample (printed).

use std::collections::BTreeSet;
use std::time::Instant;

use fencelock_model::rwlock::{Role, RwBroken, RwModel};
use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// Checks `model` to the end; returns the unique states.
fn check_safe(name: &str, model: RwModel) -> usize {
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

/// Checks each configuration, then compares the pinned counts.
fn check_all(configs: Vec<(&str, RwModel, usize)>) {
    let mut counts = Vec::new();
    for (name, model, pinned) in configs {
        let started = Instant::now();
        let states = check_safe(name, model);
        eprintln!("{name}: {states} unique states in {:?}", started.elapsed());
        counts.push((name, states, pinned));
    }
    for (name, states, pinned) in counts {
        assert_eq!(states, pinned, "{name}: unique states changed");
    }
}

#[test]
fn every_poll_configuration_holds_every_property() {
    use Role::{Either, Reader, Writer};
    let base = RwModel {
        max_ticks: 5,
        ..RwModel::default()
    };
    check_all(vec![
        ("a writer, two readers", base.clone(), 55622),
        (
            "two writers, a reader",
            RwModel {
                roles: vec![Writer, Writer, Reader],
                ..base.clone()
            },
            37261,
        ),
        (
            "two writers, two readers (up to 4 ticks)",
            RwModel {
                roles: vec![Writer, Writer, Reader, Reader],
                max_ticks: 4,
                ..base.clone()
            },
            162330,
        ),
        (
            "two clients either side, two cycles each",
            RwModel {
                roles: vec![Either, Either],
                cycles: 2,
                ..base.clone()
            },
            284787,
        ),
        (
            "three clients either side",
            RwModel {
                roles: vec![Either, Either, Either],
                ..base.clone()
            },
            506242,
        ),
        (
            "three clients either side, counter fences (up to 4 ticks)",
            RwModel {
                roles: vec![Either, Either, Either],
                counter: true,
                max_ticks: 4,
                ..base.clone()
            },
            113021,
        ),
        (
            "a writer, two readers, a lost grant reply",
            RwModel {
                lost_reply: true,
                ..base.clone()
            },
            129805,
        ),
        (
            "a writer, two readers, the fence key lost",
            RwModel {
                lose_fence_key: true,
                ..base.clone()
            },
            206001,
        ),
        (
            "three clients either side, a lost grant reply and the fence key lost (up to 4 ticks)",
            RwModel {
                roles: vec![Either, Either, Either],
                lost_reply: true,
                lose_fence_key: true,
                max_ticks: 4,
                ..base.clone()
            },
            2203936,
        ),
    ]);
}

#[test]
fn every_fair_configuration_holds_every_property() {
    use Role::{Either, Reader, Writer};
    let base = RwModel {
        fair: true,
        ..RwModel::default()
    };
    check_all(vec![
        (
            "fair: a reader, a writer, a reader (up to 5 ticks)",
            RwModel {
                roles: vec![Reader, Writer, Reader],
                max_ticks: 5,
                ..base.clone()
            },
            124676,
        ),
        (
            "fair: three clients either side",
            RwModel {
                roles: vec![Either, Either, Either],
                ..base.clone()
            },
            460503,
        ),
        (
            "fair: two clients either side, two cycles each (up to 5 ticks)",
            RwModel {
                roles: vec![Either, Either],
                cycles: 2,
                max_ticks: 5,
                ..base.clone()
            },
            465865,
        ),
        (
            "fair: two writers, two readers",
            RwModel {
                roles: vec![Writer, Writer, Reader, Reader],
                ..base.clone()
            },
            1293572,
        ),
    ]);
}

#[test]
fn every_broken_rule_is_caught() {
    let base = RwModel::default();
    let broken = |model: &RwModel, set: fn(&mut RwBroken)| {
        let mut b = RwBroken::default();
        set(&mut b);
        RwModel {
            broken: b,
            ..model.clone()
        }
    };
    let fair = RwModel {
        roles: vec![Role::Reader, Role::Writer, Role::Reader],
        fair: true,
        ..base.clone()
    };
    let key_lost = RwModel {
        lose_fence_key: true,
        ..base.clone()
    };
    let controls = [
        (
            "a reader granted while a writer holds",
            broken(&base, |b| b.reader_under_writer = true),
            "no valid writer with a valid reader",
        ),
        (
            "a writer that reuses the last fence",
            broken(&base, |b| b.writer_reuses_fence = true),
            "a writer's fence is above every earlier writer's fence and reader's epoch",
        ),
        (
            "a writer that reuses the last fence",
            broken(&base, |b| b.writer_reuses_fence = true),
            "a Clean read saw no write of a writer granted after it",
        ),
        (
            "an unvalidated read",
            broken(&base, |b| b.unvalidated_read = true),
            "a Clean read saw no write fenced above its epoch",
        ),
        (
            "a reader's epoch not minted when the fence key is missing",
            broken(&key_lost, |b| b.epoch_without_mint = true),
            "a reader's epoch is at least every earlier writer's fence",
        ),
        (
            "a reader that skips the writers queued ahead",
            broken(&fair, |b| b.reader_skips_queue = true),
            "fair order: no grant past a live conflicting waiter queued before",
        ),
    ];
    for (name, model, property) in controls {
        let started = Instant::now();
        // Stops once a counterexample is found.
        let checker = model
            .checker()
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join();
        let Some(path) = checker.discovery(property) else {
            panic!("{name}: not caught by {property}");
        };
        let steps = path.clone().into_actions().len();
        eprintln!(
            "{name}: caught by {property:?} after {steps} steps ({:?}):\n{path}",
            started.elapsed()
        );
    }
}
