//! The trace search on small hand-written histories: what the store's
//! transitions explain (every order the intervals allow, expiry only after
//! the shortest key lifetime, grants nobody was told of where an
//! observation shows them, indeterminate operations taking effect or not,
//! data loss, failovers, clock jumps, revokes and their seals), what they
//! do not (reported at exactly the first operation no order explains, with
//! why), and the bounds (unknown, never unexplained).

use fencelock_model::trace::{
    Bounds, Deposed, Event, Op, Outcome, Params, SEALED, Seen, Verdict, explain, explain_each,
};

/// The shortest key lifetime of these histories: 100 time units.
const LIFE: i64 = 100;

fn on(name: u32, invoked: i64, completed: i64, op: Op, outcome: Outcome) -> Event {
    Event {
        client: 0,
        name: Some(name),
        invoked,
        completed: Some(completed),
        op,
        outcome,
    }
}

fn ev(invoked: i64, completed: i64, op: Op, outcome: Outcome) -> Event {
    on(0, invoked, completed, op, outcome)
}

fn grant(holder: u32, invoked: i64, completed: i64, fence: u64) -> Event {
    ev(
        invoked,
        completed,
        Op::Acquire { holder },
        Outcome::Granted(fence),
    )
}

fn release(holder: u32, fence: u64, invoked: i64, completed: i64, outcome: Outcome) -> Event {
    ev(invoked, completed, Op::Release { holder, fence }, outcome)
}

fn observe(invoked: i64, completed: i64, seen: Option<(u32, u64)>) -> Event {
    ev(
        invoked,
        completed,
        Op::Observe,
        Outcome::Lock(seen.map(|(holder, fence)| Seen {
            holder,
            fence: Some(fence),
        })),
    )
}

fn write(holder: u32, fence: u64, value: i64, at: (i64, i64), outcome: Outcome) -> Event {
    ev(
        at.0,
        at.1,
        Op::Write {
            holder,
            fence,
            value,
        },
        outcome,
    )
}

fn run(events: &[Event]) -> Verdict {
    explain(events, &Params::new(LIFE), &Bounds::default())
}

#[track_caller]
fn explained(events: &[Event]) -> u64 {
    match run(events) {
        Verdict::Explained { states } => states,
        other => panic!("expected explained, got {other:?}"),
    }
}

/// The index and reason of the first unexplained operation.
#[track_caller]
fn unexplained(events: &[Event]) -> (usize, String) {
    match run(events) {
        Verdict::Unexplained { step, why, .. } => (step, why),
        other => panic!("expected unexplained, got {other:?}"),
    }
}

/// One lease cycle of `holder` with `fence` from `at`: grant, register,
/// read, write, release (the torture workers' cycle).
fn cycle(holder: u32, fence: u64, value: i64, at: i64) -> Vec<Event> {
    vec![
        grant(holder, at, at + 2, fence),
        ev(
            at + 3,
            at + 4,
            Op::Register { holder, fence },
            Outcome::Accepted,
        ),
        ev(at + 4, at + 5, Op::Read, Outcome::Value(value)),
        write(
            holder,
            fence,
            value + 1,
            (at + 6, at + 7),
            Outcome::Accepted,
        ),
        release(holder, fence, at + 8, at + 9, Outcome::Released),
    ]
}

#[test]
fn sequential_cycles_are_explained() {
    let mut events = cycle(1, 10, 0, 0);
    events.extend(cycle(2, 11, 1, 10));
    events.extend(cycle(3, 25, 2, 20));
    events.push(ev(
        40,
        40,
        Op::Final,
        Outcome::Resource {
            value: 3,
            fence: Some(25),
            holder: Some(3),
        },
    ));
    explained(&events);
}

#[test]
fn overlapping_acquisitions_are_ordered_by_their_fences() {
    // Both ask at once; whichever came second got the higher fence, and
    // the first released before the second was granted.
    let events = vec![
        grant(1, 0, 50, 20),
        grant(2, 0, 10, 10),
        release(2, 10, 20, 30, Outcome::Released),
        release(1, 20, 60, 70, Outcome::Released),
    ];
    explained(&events);
}

#[test]
fn a_repeated_fence_is_unexplained_at_its_grant() {
    let events = vec![
        grant(1, 0, 10, 10),
        release(1, 10, 20, 30, Outcome::Released),
        grant(2, 40, 50, 10),
        release(2, 10, 60, 70, Outcome::Released),
    ];
    let (step, why) = unexplained(&events);
    assert_eq!(step, 2, "{why}");
    assert!(why.contains("not above the last fence issued"), "{why}");
}

#[test]
fn a_grant_while_another_holds_is_unexplained_until_the_key_may_have_expired() {
    // Holder 1 never releases. A grant to holder 2 before the shortest
    // lifetime passed is impossible; after it, the key may have expired.
    let early = vec![grant(1, 0, 10, 10), grant(2, 20, 50, 11)];
    let (step, why) = unexplained(&early);
    assert_eq!(step, 1);
    assert!(why.contains("held by holder 1"), "{why}");
    let late = vec![grant(1, 0, 10, 10), grant(2, 20, LIFE + 10, 11)];
    explained(&late);
}

#[test]
fn a_release_acknowledged_after_another_grant_is_unexplained() {
    // Holder 1's key expired, holder 2 took the lock: holder 1's release
    // cannot have found its own key.
    let mut events = vec![
        grant(1, 0, 10, 10),
        grant(2, 20, 200, 11),
        release(1, 10, 210, 220, Outcome::Released),
    ];
    let (step, why) = unexplained(&events);
    assert_eq!(step, 2);
    assert!(why.contains("held by holder 2"), "{why}");
    // As it was: not ours.
    events[2].outcome = Outcome::NotOurs;
    explained(&events);
}

#[test]
fn a_release_refused_while_the_key_must_still_be_there_is_unexplained() {
    let events = vec![
        grant(1, 0, 10, 10),
        release(1, 10, 20, 30, Outcome::NotOurs),
    ];
    let (step, why) = unexplained(&events);
    assert_eq!(step, 1);
    assert!(why.contains("still in the store"), "{why}");
    // Once the shortest lifetime has passed, the key may have expired.
    let late = vec![
        grant(1, 0, 10, 10),
        release(1, 10, 20, LIFE + 30, Outcome::NotOurs),
    ];
    explained(&late);
}

#[test]
fn an_indeterminate_release_may_or_may_not_have_taken_effect() {
    // The release had no reply; the next grant comes at once: only its
    // having taken effect explains it.
    let took = vec![
        grant(1, 0, 10, 10),
        release(1, 10, 20, 30, Outcome::Unknown),
        grant(2, 40, 50, 11),
    ];
    explained(&took);
    // The same release, and then the key still held: it did not.
    let did_not = vec![
        grant(1, 0, 10, 10),
        release(1, 10, 20, 30, Outcome::Unknown),
        observe(40, 50, Some((1, 10))),
    ];
    explained(&did_not);
    // Without it, the second grant comes too early.
    let without = vec![grant(1, 0, 10, 10), grant(2, 40, 50, 11)];
    assert_eq!(unexplained(&without).0, 1);
}

#[test]
fn the_resource_refuses_a_lower_fence_and_reads_are_checked() {
    let events = vec![
        write(1, 10, 1, (0, 10), Outcome::Accepted),
        write(2, 9, 1, (20, 30), Outcome::Stale),
        ev(31, 32, Op::Read, Outcome::Value(1)),
        write(2, 9, 2, (40, 50), Outcome::Accepted),
    ];
    let (step, why) = unexplained(&events);
    assert_eq!(step, 3);
    assert!(why.contains("refuses fence 9"), "{why}");
    let wrong_read = vec![
        write(1, 10, 1, (0, 10), Outcome::Accepted),
        ev(11, 12, Op::Read, Outcome::Value(2)),
    ];
    let (step, why) = unexplained(&wrong_read);
    assert_eq!(step, 1);
    assert!(why.contains("held the value 1"), "{why}");
    // An equal fence from the same holder is accepted, from another not.
    let equal = vec![
        write(1, 10, 1, (0, 10), Outcome::Accepted),
        write(1, 10, 2, (20, 30), Outcome::Accepted),
        write(2, 10, 3, (40, 50), Outcome::Stale),
    ];
    explained(&equal);
}

#[test]
fn concurrent_writes_are_explained_in_either_order() {
    // Overlapping: the higher fence landed first, so the lower one was
    // refused; the value read afterwards is the accepted one's.
    let events = vec![
        write(1, 10, 5, (0, 100), Outcome::Stale),
        write(2, 20, 7, (10, 20), Outcome::Accepted),
        ev(110, 120, Op::Read, Outcome::Value(7)),
    ];
    explained(&events);
}

#[test]
fn a_revoke_deposes_the_holder_and_its_seal_refuses_the_deposed_write() {
    let revoke = Event {
        client: 9,
        name: Some(0),
        invoked: 20,
        completed: Some(30),
        op: Op::Revoke,
        outcome: Outcome::Revoked {
            fence: Some(15),
            deposed: Deposed::Holder(Seen {
                holder: 1,
                fence: Some(10),
            }),
        },
    };
    let seal = ev(20, 30, Op::Seal { fence: 15 }, Outcome::Accepted);
    let mut events = vec![
        grant(1, 0, 10, 10),
        ev(
            11,
            12,
            Op::Register {
                holder: 1,
                fence: 10,
            },
            Outcome::Accepted,
        ),
        revoke.clone(),
        seal,
        // The next grant right away: the revoke freed the lock.
        grant(2, 31, 40, 16),
        write(1, 10, 1, (41, 42), Outcome::Stale),
        ev(
            50,
            50,
            Op::Final,
            Outcome::Resource {
                value: 0,
                fence: Some(15),
                holder: Some(SEALED),
            },
        ),
    ];
    explained(&events);
    // The deposed holder's write accepted after the seal: unexplained.
    events[5].outcome = Outcome::Accepted;
    let (step, why) = unexplained(&events);
    assert_eq!(step, 5);
    assert!(why.contains("refuses fence 10"), "{why}");
    // A revoke that names the wrong holder.
    let mut wrong = vec![grant(1, 0, 10, 10), revoke];
    wrong[1].outcome = Outcome::Revoked {
        fence: Some(15),
        deposed: Deposed::Nobody,
    };
    let (step, why) = unexplained(&wrong);
    assert_eq!(step, 1);
    assert!(why.contains("would have deposed it"), "{why}");
}

#[test]
fn a_data_loss_restarts_fences_and_frees_the_lock() {
    let loss = Event {
        client: 9,
        name: None,
        invoked: 20,
        completed: Some(30),
        op: Op::LoseData,
        outcome: Outcome::Done,
    };
    // Holder 1 never released; after the loss a lower fence is granted at
    // once (counter fences restart).
    let mut events = vec![grant(1, 0, 10, 10), loss, grant(2, 31, 40, 1)];
    explained(&events);
    events.remove(1);
    let (step, _) = unexplained(&events);
    assert_eq!(step, 1);
}

#[test]
fn a_failover_may_bring_back_a_released_key() {
    let failover = Event {
        client: 9,
        name: None,
        invoked: 35,
        completed: Some(60),
        op: Op::Failover { floor: Some(10) },
        outcome: Outcome::Done,
    };
    // The release was acknowledged, yet the key is seen again afterwards:
    // the promoted replica had not received the release.
    let mut events = vec![
        grant(1, 0, 10, 10),
        release(1, 10, 20, 30, Outcome::Released),
        failover,
        observe(70, 80, Some((1, 10))),
    ];
    explained(&events);
    events.remove(2);
    let (step, _) = unexplained(&events);
    assert_eq!(step, 2);
}

#[test]
fn a_clock_jump_may_expire_a_key_at_once() {
    let jump = Event {
        client: 9,
        name: None,
        invoked: 15,
        completed: Some(20),
        op: Op::ClockJump,
        outcome: Outcome::Done,
    };
    let mut events = vec![grant(1, 0, 10, 10), jump, grant(2, 25, 30, 11)];
    explained(&events);
    events.remove(1);
    assert_eq!(unexplained(&events).0, 1);
}

#[test]
fn hidden_grants_are_taken_only_where_an_observation_shows_them() {
    // Holder 1's acquisition was handed fence 10 and lost it before taking
    // it, then was granted 12: the observer saw the first grant.
    let events = vec![
        grant(1, 0, 50, 12),
        observe(10, 20, Some((1, 10))),
        release(1, 12, 60, 70, Outcome::Released),
    ];
    explained(&events);
    // A holder nobody names needs an acquisition that failed.
    let stranger = vec![observe(10, 20, Some((7, 10)))];
    let (step, why) = unexplained(&stranger);
    assert_eq!(step, 0);
    assert!(why.contains("no recorded grant"), "{why}");
    let failed = Event {
        client: 3,
        name: Some(0),
        invoked: 0,
        completed: Some(30),
        op: Op::Acquire { holder: 99 },
        outcome: Outcome::Unknown,
    };
    explained(&[failed, observe(10, 20, Some((7, 10)))]);
}

#[test]
fn the_first_unexplained_operation_is_the_earliest_completion_across_names() {
    // Name 1 goes wrong first (its repeated fence completes at 50), name 0
    // later (a wrong read at 80).
    let events = vec![
        on(0, 0, 10, Op::Acquire { holder: 1 }, Outcome::Granted(10)),
        on(0, 70, 80, Op::Read, Outcome::Value(3)),
        on(1, 0, 10, Op::Acquire { holder: 2 }, Outcome::Granted(10)),
        on(
            1,
            20,
            30,
            Op::Release {
                holder: 2,
                fence: 10,
            },
            Outcome::Released,
        ),
        on(1, 40, 50, Op::Acquire { holder: 3 }, Outcome::Granted(10)),
    ];
    let (step, _) = unexplained(&events);
    assert_eq!(step, 4);
    let each = explain_each(&events, &Params::new(LIFE), &Bounds::default());
    assert_eq!(each.len(), 2);
    assert!(
        matches!(each[0].1, Verdict::Unexplained { step: 1, .. }),
        "{each:?}"
    );
    assert!(
        matches!(each[1].1, Verdict::Unexplained { step: 4, .. }),
        "{each:?}"
    );
}

#[test]
fn bounds_give_unknown_never_unexplained() {
    // Three writes open at once; the last one's refusal is impossible
    // (nothing above its fence is ever stored).
    let events = vec![
        write(1, 10, 1, (0, 30), Outcome::Accepted),
        write(2, 11, 2, (1, 31), Outcome::Accepted),
        write(3, 12, 3, (2, 32), Outcome::Stale),
    ];
    assert_eq!(unexplained(&events).0, 2);
    let narrow = Bounds {
        max_open: 2,
        max_states: 1_000,
    };
    match explain(&events, &Params::new(LIFE), &narrow) {
        Verdict::Unknown { step, why, .. } => {
            assert_eq!(step, Some(2));
            assert!(why.contains("more than 2 operations open"), "{why}");
        }
        other => panic!("expected unknown, got {other:?}"),
    }
    let few = Bounds {
        max_open: 64,
        max_states: 1,
    };
    match explain(&events, &Params::new(LIFE), &few) {
        Verdict::Unknown { why, .. } => assert!(why.contains("states visited"), "{why}"),
        other => panic!("expected unknown, got {other:?}"),
    }
}

#[test]
fn an_operation_that_never_completed_may_take_effect_later() {
    // A write whose reply never came is seen by a read long after.
    let events = vec![
        Event {
            client: 1,
            name: Some(0),
            invoked: 0,
            completed: None,
            op: Op::Write {
                holder: 1,
                fence: 10,
                value: 4,
            },
            outcome: Outcome::Accepted,
        },
        ev(500, 510, Op::Read, Outcome::Value(0)),
        ev(600, 610, Op::Read, Outcome::Value(4)),
    ];
    explained(&events);
}
