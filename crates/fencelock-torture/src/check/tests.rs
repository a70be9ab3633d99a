//! Each checker passes a clean history and catches its own violation, on
//! small hand-written histories.

use super::check;
use crate::history::{Entry, Event, Header, History, Outcome, Released};

fn header(fence_mode: &str) -> Event {
    ev(
        0,
        "run",
        Entry::Header(Header {
            version: "0".into(),
            seed: 1,
            topology: "single".into(),
            workers: 2,
            names: vec!["t0".into()],
            ttl_ms: 300,
            renewal_ms: 100,
            mode: "notify".into(),
            fence_mode: fence_mode.into(),
            layout: "default".into(),
            resource: "redis".into(),
            unsafe_variant: None,
            nemeses: vec![],
            duration_ms: 1000,
        }),
    )
}

fn ev(t: i64, p: &str, e: Entry) -> Event {
    Event { t, p: p.into(), e }
}

/// One clean cycle of worker `w` from `t` (ms): grant with `fence`, read
/// `read`, write `read + 1`, release; audit entry `seq`. Valid for 300 ms.
fn cycle(w: &str, n: u32, t: i64, fence: u64, read: i64, seq: u64) -> Vec<Event> {
    let op = format!("{w}.{n}");
    let holder = format!("h{w}{n}");
    let t = t * 1000;
    let valid = t + 300_000;
    vec![
        ev(
            t,
            w,
            Entry::Acquire {
                op: op.clone(),
                name: "t0".into(),
            },
        ),
        ev(
            t + 1000,
            w,
            Entry::Granted {
                op: op.clone(),
                name: "t0".into(),
                fence,
                holder: holder.clone(),
                valid_until: valid,
            },
        ),
        ev(
            t + 1500,
            "observer",
            Entry::Observed {
                name: "t0".into(),
                holder: Some(holder.clone()),
                fence: Some(fence),
                sent: t + 1200,
            },
        ),
        ev(
            t + 2000,
            w,
            Entry::Read {
                op: op.clone(),
                value: read,
                valid_until: valid,
            },
        ),
        ev(
            t + 3000,
            w,
            Entry::Write {
                op: op.clone(),
                fence,
                read,
                value: read + 1,
                valid_until: valid,
            },
        ),
        ev(
            t + 4000,
            w,
            Entry::Written {
                op: op.clone(),
                outcome: Outcome::Accepted,
            },
        ),
        ev(
            t + 5000,
            w,
            Entry::Release {
                op: op.clone(),
                valid_until: valid,
            },
        ),
        ev(
            t + 6000,
            w,
            Entry::ReleaseDone {
                op: op.clone(),
                outcome: Released::Released,
            },
        ),
        ev(
            t + 6500,
            "observer",
            Entry::Observed {
                name: "t0".into(),
                holder: None,
                fence: None,
                sent: t + 6200,
            },
        ),
        ev(
            9_000_000,
            "resource",
            Entry::Audit {
                name: "t0".into(),
                seq,
                op,
                worker: w.into(),
                fence,
                holder,
                read,
                before: read,
                after: read + 1,
            },
        ),
    ]
}

fn final_value(v: i64) -> Event {
    ev(
        9_000_000,
        "resource",
        Entry::Final {
            name: "t0".into(),
            value: v,
            fence: None,
            holder: None,
        },
    )
}

fn violations(events: Vec<Event>) -> Vec<(&'static str, u64)> {
    check(&History::new(events))
        .into_iter()
        .filter(|c| c.violations > 0)
        .map(|c| (c.id, c.violations))
        .collect()
}

fn clean() -> Vec<Event> {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    e.extend(cycle("w1", 1, 20, 200, 1, 2));
    e.push(final_value(2));
    e
}

#[test]
fn a_clean_history_passes_every_checker() {
    let results = check(&History::new(clean()));
    assert!(results.iter().all(|c| c.passed()), "{results:?}");
    assert!(
        results.iter().all(|c| c.checked > 0 || c.id == "C5"),
        "{results:?}"
    );
}

#[test]
fn c1_a_lower_fence_accepted_after_a_higher_one() {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 200, 0, 1));
    e.extend(cycle("w1", 1, 20, 100, 1, 2));
    e.push(final_value(2));
    let found = violations(e);
    assert!(found.iter().any(|(id, _)| *id == "C1"), "{found:?}");
}

#[test]
fn c2_one_fence_from_two_holders() {
    let mut e = vec![header("counter")];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    e.extend(cycle("w1", 1, 20, 100, 1, 2));
    e.push(final_value(2));
    assert!(violations(e).iter().any(|(id, _)| *id == "C2"));
}

#[test]
fn c3_an_acknowledged_increment_overwritten() {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    // w1 read 0 (before w0's write) and wrote 1 over w0's 1.
    let mut second = cycle("w1", 1, 20, 200, 0, 2);
    if let Entry::Audit { before, .. } = &mut second.last_mut().expect("audit").e {
        *before = 1;
    }
    e.extend(second);
    e.push(final_value(1));
    assert_eq!(violations(e), vec![("C3", 1)]);
}

#[test]
fn c4_two_valid_holders_at_once() {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    // w1 is granted while w0 is still in its critical section (10..15 ms)
    // and both leases are valid.
    e.extend(cycle("w1", 1, 12, 200, 1, 2));
    e.push(final_value(2));
    let found = violations(e);
    assert!(found.iter().any(|(id, _)| *id == "C4"), "{found:?}");
}

#[test]
fn c4_excuses_a_restart_that_lost_the_data() {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    e.push(ev(
        11_500,
        "nemesis",
        Entry::NemesisStart {
            kind: "kill-wipe".into(),
            target: None,
            detail: String::new(),
            data_loss: true,
        },
    ));
    e.extend(cycle("w1", 1, 12, 200, 1, 2));
    e.push(final_value(2));
    let results = check(&History::new(e));
    let c4 = results.iter().find(|c| c.id == "C4").expect("C4");
    assert_eq!((c4.violations, c4.excused), (0, 1), "{c4:?}");
}

#[test]
fn c5_a_loss_signalled_too_late() {
    let mut e = clean();
    // w0's key is taken at 12 ms while w0 still works until 500 ms, and its
    // loss signal comes at 450 ms.
    e.push(ev(
        12_000,
        "observer",
        Entry::Observed {
            name: "t0".into(),
            holder: Some("other".into()),
            fence: Some(150),
            sent: 11_900,
        },
    ));
    for x in &mut e {
        if let Entry::Release { op, .. } = &x.e
            && op == "w0.1"
        {
            x.t = 500_000;
        }
    }
    e.push(ev(
        450_000,
        "w0",
        Entry::Lost {
            op: "w0.1".into(),
            reason: "taken".into(),
        },
    ));
    let found = violations(e);
    assert!(found.iter().any(|(id, _)| *id == "C5"), "{found:?}");
}

#[test]
fn c6_a_later_grant_with_a_lower_fence() {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 200, 0, 1));
    e.extend(cycle("w1", 1, 20, 150, 1, 2));
    e.push(final_value(2));
    let found = violations(e);
    assert!(found.iter().any(|(id, _)| *id == "C6"), "{found:?}");
}

#[test]
fn c7_a_key_back_after_its_release() {
    let mut e = clean();
    e.push(ev(
        30_000,
        "observer",
        Entry::Observed {
            name: "t0".into(),
            holder: Some("hw01".into()),
            fence: Some(100),
            sent: 29_900,
        },
    ));
    let found = violations(e);
    assert!(found.iter().any(|(id, _)| *id == "C7"), "{found:?}");
}

/// A run interrupted while a worker was paused leaves the pause open (it
/// ends "never"): checking such a history must not overflow.
#[test]
fn c5_with_a_pause_that_never_ended_does_not_overflow() {
    let mut e = clean();
    e.push(ev(
        11_000,
        "nemesis",
        Entry::NemesisStart {
            kind: "pause-worker".into(),
            target: Some("w0".into()),
            detail: "interrupted".into(),
            data_loss: false,
        },
    ));
    e.push(ev(
        12_000,
        "observer",
        Entry::Observed {
            name: "t0".into(),
            holder: Some("other".into()),
            fence: Some(150),
            sent: 11_900,
        },
    ));
    let results = check(&History::new(e));
    let c5 = results.iter().find(|c| c.id == "C5").expect("C5");
    assert_eq!(c5.violations, 0, "{c5:?}");
}
