//! Each checker passes a clean history and catches its own violation, on
//! small hand-written histories.

use super::check;
use crate::history::{Entry, Event, Header, History, Outcome, Released};

fn header(fence_mode: &str) -> Event {
    replicated_header(fence_mode, 0, 0)
}

/// A header of a topology with `replicas` replicas per shard whose grants
/// waited for `wait` of them.
fn replicated_header(fence_mode: &str, replicas: u32, wait: u32) -> Event {
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
            replicas,
            wait_replicas: wait,
            permits: None,
            rwlock_reads: None,
            worker_kinds: None,
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
                slot: None,
                access: None,
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
                slot: None,
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
                slot: None,
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
                slot: None,
            },
        ),
    ]
}

/// The observer saw `holder` hold t0 with `fence`, its read sent 100 µs
/// before `t`.
fn observed(t: i64, holder: &str, fence: u64) -> Event {
    ev(
        t,
        "observer",
        Entry::Observed {
            name: "t0".into(),
            holder: Some(holder.into()),
            fence: Some(fence),
            sent: t - 100,
            slot: None,
        },
    )
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
            slot: None,
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
            rollback: false,
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
    e.push(observed(12_000, "other", 150));
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
    e.push(observed(30_000, "hw01", 100));
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
            rollback: false,
        },
    ));
    e.push(observed(12_000, "other", 150));
    let results = check(&History::new(e));
    let c5 = results.iter().find(|c| c.id == "C5").expect("C5");
    assert_eq!(c5.violations, 0, "{c5:?}");
}

/// A failover window from `from` to `to` (ms).
fn failover(from: i64, to: i64) -> Vec<Event> {
    vec![
        ev(
            from * 1000,
            "nemesis",
            Entry::NemesisStart {
                kind: "failover".into(),
                target: None,
                detail: String::new(),
                data_loss: false,
                rollback: true,
            },
        ),
        ev(
            to * 1000,
            "nemesis",
            Entry::NemesisEnd {
                kind: "failover".into(),
                target: None,
                outcome: Some("a -> b".into()),
                error: None,
            },
        ),
    ]
}

/// A lease of worker `w` granted at `granted` ms (valid 300 ms from its
/// acquire), with validity `samples` (ms, valid until ms) and released at
/// `release` ms; no write.
fn lease(w: &str, granted: i64, fence: u64, samples: &[(i64, i64)], release: i64) -> Vec<Event> {
    let op = format!("{w}.1");
    let mut out = vec![
        ev(
            granted * 1000 - 500,
            w,
            Entry::Acquire {
                op: op.clone(),
                name: "t0".into(),
            },
        ),
        ev(
            granted * 1000,
            w,
            Entry::Granted {
                op: op.clone(),
                name: "t0".into(),
                fence,
                holder: format!("h{w}"),
                valid_until: (granted + 300) * 1000 - 500,
                slot: None,
                access: None,
            },
        ),
    ];
    for &(t, valid) in samples {
        out.push(ev(
            t * 1000,
            w,
            Entry::Read {
                op: op.clone(),
                value: 0,
                valid_until: valid * 1000,
            },
        ));
    }
    out.push(ev(
        release * 1000,
        w,
        Entry::Release {
            op: op.clone(),
            valid_until: samples.last().map_or(0, |s| s.1 * 1000),
        },
    ));
    out
}

fn c4_of(events: Vec<Event>) -> crate::CheckResult {
    check(&History::new(events))
        .into_iter()
        .find(|c| c.id == "C4")
        .expect("C4")
}

/// w0 renews at 110 ms (valid until 410 ms) and works until 350 ms; w1 is
/// granted at 320 ms, after w0's grant alone would have expired.
fn renewed_then_overlapped(header: Event) -> Vec<Event> {
    let mut e = vec![header];
    e.extend(lease("w0", 10, 100, &[(200, 410), (340, 410)], 350));
    e.extend(lease("w1", 320, 200, &[(330, 620)], 360));
    e
}

#[test]
fn c4_excuses_a_renewal_a_failover_rolled_back_but_not_a_grant() {
    // Without a failover the overlap is a violation.
    let c4 = c4_of(renewed_then_overlapped(replicated_header("clock", 2, 2)));
    assert_eq!((c4.violations, c4.excused), (1, 0), "{c4:?}");
    // A failover after the renewal may have rolled it back: excused, and
    // said why.
    let mut e = renewed_then_overlapped(replicated_header("clock", 2, 2));
    e.extend(failover(120, 200));
    let c4 = c4_of(e);
    assert_eq!((c4.violations, c4.excused), (0, 1), "{c4:?}");
    assert!(c4.notes[0].contains("renewals"), "{c4:?}");
    // A grant every replica acknowledged is not excused by a failover.
    let mut e = vec![replicated_header("clock", 2, 2)];
    e.extend(lease("w0", 10, 100, &[(200, 300)], 250));
    e.extend(failover(50, 100));
    e.extend(lease("w1", 150, 200, &[(160, 450)], 260));
    let c4 = c4_of(e);
    assert_eq!((c4.violations, c4.excused), (1, 0), "{c4:?}");
}

#[test]
fn c4_is_not_promised_across_a_failover_when_grants_wait_for_fewer_replicas() {
    let mut e = vec![replicated_header("clock", 2, 1)];
    e.extend(lease("w0", 10, 100, &[(200, 300)], 250));
    e.extend(failover(50, 100));
    e.extend(lease("w1", 150, 200, &[(160, 450)], 260));
    let c4 = c4_of(e);
    assert_eq!((c4.violations, c4.excused), (0, 1), "{c4:?}");
    assert!(c4.notes[0].contains("1 of 2"), "{c4:?}");
}

#[test]
fn c7_and_c6_excuse_what_a_failover_rolled_back() {
    // w0's release is rolled back by a failover: its key is back.
    let mut e = clean();
    e.extend(failover(25, 29));
    e.push(observed(30_000, "hw01", 100));
    let results = check(&History::new(e));
    let c7 = results.iter().find(|c| c.id == "C7").expect("C7");
    assert_eq!((c7.violations, c7.excused), (0, 1), "{c7:?}");
    // A grant refused for lack of replicas (nobody was told of it) is seen
    // with fence 300, then the failover rolls the key back to w1's 200.
    let mut e = vec![replicated_header("clock", 2, 2)];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    e.extend(cycle("w1", 1, 20, 200, 1, 2));
    e.push(final_value(2));
    e.push(observed(23_000, "refused", 300));
    e.extend(failover(23, 24));
    e.push(observed(24_500, "hw11", 200));
    let results = check(&History::new(e));
    let c6 = results.iter().find(|c| c.id == "C6").expect("C6");
    assert_eq!((c6.violations, c6.excused), (0, 1), "{c6:?}");
}

/// An acquisition that retries keeps its token, so one holder id can be
/// seen first with a fence it was refused (replicas did not acknowledge;
/// released) and later be told another. A failover that rolls the key back
/// past the refused fence is excused; had the holder been told that fence,
/// the same history is a violation (the negative control).
#[test]
fn c6_excuses_a_rolled_back_fence_that_its_holder_was_refused_and_retried() {
    let history = |told: u64| {
        let mut e = vec![replicated_header("clock", 2, 2)];
        e.extend(cycle("w0", 1, 10, 100, 0, 1));
        e.extend(cycle("w1", 1, 20, 200, 1, 2));
        e.push(observed(23_000, "hw21", 300));
        e.extend(failover(23, 24));
        e.push(observed(24_500, "hw11", 200));
        // w2's retry, with the same token, is granted after the failover.
        e.extend(cycle("w2", 1, 30, told, 2, 3));
        e.push(final_value(3));
        History::new(e)
    };
    let c6 = |h: &History| check(h).into_iter().find(|c| c.id == "C6").expect("C6");
    let retried = c6(&history(400));
    assert_eq!((retried.violations, retried.excused), (0, 1), "{retried:?}");
    let told = c6(&history(300));
    assert_eq!(told.violations, 1, "{told:?}");
}

/// A history in which nothing was granted or acknowledged (a deployment
/// that refuses every write) is inconclusive, naming what each name saw; a
/// clean one is not.
#[test]
fn a_history_that_saw_too_little_is_inconclusive() {
    use crate::report::Report;
    let clean = Report::from_history(&History::new(clean()));
    assert_eq!(clean.inconclusive(), None);
    let mut e = vec![header("clock")];
    for n in 1..=3 {
        e.push(ev(
            i64::from(n) * 1000,
            "w0",
            Entry::Acquire {
                op: format!("w0.{n}"),
                name: "t0".into(),
            },
        ));
        e.push(ev(
            i64::from(n) * 1000 + 500,
            "w0",
            Entry::AcquireFailed {
                op: format!("w0.{n}"),
                name: "t0".into(),
                error: "READONLY".into(),
            },
        ));
    }
    let report = Report::from_history(&History::new(e));
    assert_eq!(report.violations(), 0);
    let why = report.inconclusive().expect("inconclusive");
    assert!(
        why.contains("t0: 0 grant(s), 0 acknowledged write(s)"),
        "{why}"
    );
    assert!(report.verdict().starts_with("verdict: INCONCLUSIVE"));
}

/// A revoke of w0's lock (holder `hw01`, fence 100) sent at 12.2 ms and
/// returned at `returned` µs with revocation fence 150; `sealed` as the
/// run's seal came out.
fn revoke(returned: i64, sealed: Option<Outcome>) -> Event {
    ev(
        returned,
        "nemesis",
        Entry::Revoke {
            name: "t0".into(),
            sent: 12_200,
            fence: Some(150),
            deposed: Some("hw01".into()),
            deposed_fence: Some(100),
            worker: Some("w0".into()),
            paused: vec!["w1".into()],
            sealed,
            error: None,
        },
    )
}

/// w0 (fence 100) is deposed by a revoke while between its read and its
/// write; w1 (fence 200) is granted at 13 ms, while w0 is still in its
/// critical section, reads 0 and writes 1.
fn deposed_then_next(returned: i64, sealed: Option<Outcome>) -> Vec<Event> {
    let mut e = vec![header("clock")];
    let mut first = cycle("w0", 1, 10, 100, 0, 1);
    // The lock was gone, not released by w0: w0 is told at its renewal
    // (13.1 ms), its release finds the lock not its own, and the observer
    // never sees the key free (w1 holds it from 13 ms).
    first.retain(|x| !matches!(&x.e, Entry::Observed { holder: None, .. }));
    for x in &mut first {
        if let Entry::ReleaseDone { outcome, .. } = &mut x.e {
            *outcome = Released::NotOurs;
        }
    }
    first.push(ev(
        13_100,
        "w0",
        Entry::Lost {
            op: "w0.1".into(),
            reason: "taken over".into(),
        },
    ));
    e.extend(first);
    e.push(revoke(returned, sealed));
    e.extend(cycle("w1", 1, 12, 200, 0, 2));
    e.push(final_value(1));
    e
}

#[test]
fn a_revoke_whose_seal_refused_the_deposed_write_passes() {
    let mut e = deposed_then_next(12_400, Some(Outcome::Accepted));
    // The seal refused w0's write (sent at 13 ms): no audit entry of it,
    // the seal's own entry instead (value unchanged).
    e.retain(|x| !matches!(&x.e, Entry::Audit { op, .. } if op == "w0.1"));
    for x in &mut e {
        if let Entry::Written { op, outcome } = &mut x.e
            && op == "w0.1"
        {
            *outcome = Outcome::Stale;
        }
    }
    e.push(ev(
        9_000_000,
        "resource",
        Entry::Audit {
            name: "t0".into(),
            seq: 1,
            op: "revoke.1".into(),
            worker: "nemesis".into(),
            fence: 150,
            holder: fencelock::REVOKED_HOLDER.into(),
            read: 0,
            before: 0,
            after: 0,
            slot: None,
        },
    ));
    let results = check(&History::new(e));
    // C4: w0's lease ended in the lock store when the revoke was sent, so
    // w1's grant at 13 ms overlaps no valid lease; nothing is excused.
    assert!(results.iter().all(|c| c.passed()), "{results:?}");
    assert!(results.iter().all(|c| c.excused == 0), "{results:?}");
}

#[test]
fn c1_a_deposed_write_accepted_after_an_unsealed_revoke() {
    // No seal: w0's write with fence 100, sent at 13 ms after the revoke
    // returned at 12.4 ms with revocation fence 150, was accepted.
    let mut e = deposed_then_next(12_400, None);
    for x in &mut e {
        if let Entry::Audit {
            op,
            read,
            before,
            after,
            ..
        } = &mut x.e
            && op == "w1.1"
        {
            (*read, *before, *after) = (1, 1, 2);
        }
        if let Entry::Read { op, value, .. } = &mut x.e
            && op == "w1.1"
        {
            *value = 1;
        }
        if let Entry::Final { value, .. } = &mut x.e {
            *value = 2;
        }
    }
    assert_eq!(violations(e), vec![("C1", 1)]);
}

#[test]
fn c1_a_write_sent_before_the_revoke_returned_is_the_deposed_holders() {
    // The revoke returned at 13.5 ms, after w0's write was sent (13 ms):
    // it may have reached the resource before the seal.
    let mut e = deposed_then_next(13_500, None);
    for x in &mut e {
        if let Entry::Audit {
            op,
            read,
            before,
            after,
            ..
        } = &mut x.e
            && op == "w1.1"
        {
            (*read, *before, *after) = (1, 1, 2);
        }
        if let Entry::Final { value, .. } = &mut x.e {
            *value = 2;
        }
    }
    assert_eq!(violations(e), vec![]);
}

#[test]
fn c2_a_write_with_the_sealed_fence_after_the_seal() {
    let mut e = vec![header("clock")];
    e.extend(cycle("w0", 1, 10, 100, 0, 1));
    e.push(ev(
        9_000_000,
        "resource",
        Entry::Audit {
            name: "t0".into(),
            seq: 2,
            op: "revoke.1".into(),
            worker: "nemesis".into(),
            fence: 200,
            holder: fencelock::REVOKED_HOLDER.into(),
            read: 1,
            before: 1,
            after: 1,
            slot: None,
        },
    ));
    e.extend(cycle("w1", 1, 20, 200, 1, 3));
    e.push(final_value(2));
    assert_eq!(violations(e), vec![("C2", 1)]);
}

/// A semaphore run's header: `permits` permits.
fn semaphore_header(permits: u32) -> Event {
    let mut h = header("clock");
    if let Entry::Header(header) = &mut h.e {
        header.permits = Some(permits);
    }
    h
}

/// `events` (one cycle) as a permit of `slot`: its grant, observations and
/// audit entry carry the slot.
fn in_slot(mut events: Vec<Event>, slot: u32) -> Vec<Event> {
    for e in &mut events {
        match &mut e.e {
            Entry::Granted { slot: s, .. }
            | Entry::Observed { slot: s, .. }
            | Entry::Audit { slot: s, .. } => *s = Some(slot),
            _ => {}
        }
    }
    events
}

fn slot_final(slot: u32, v: i64) -> Event {
    let mut f = final_value(v);
    if let Entry::Final { slot: s, .. } = &mut f.e {
        *s = Some(slot);
    }
    f
}

#[test]
fn a_clean_semaphore_history_passes_per_slot_and_across_slots() {
    // Two permits held at once (10..15 ms and 12..17 ms), one per slot,
    // fences interleaving from one counter.
    let mut e = vec![semaphore_header(2)];
    e.extend(in_slot(cycle("w0", 1, 10, 100, 0, 1), 0));
    e.extend(in_slot(cycle("w1", 1, 12, 200, 0, 2), 1));
    e.extend(in_slot(cycle("w2", 1, 20, 300, 1, 3), 0));
    e.push(slot_final(0, 2));
    e.push(slot_final(1, 1));
    let results = check(&History::new(e));
    assert!(results.iter().all(|c| c.passed()), "{results:#?}");
    let ids: Vec<&str> = results.iter().map(|c| c.id).collect();
    assert_eq!(
        ids,
        ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"],
        "{results:#?}"
    );
    assert!(
        results.iter().all(|c| c.checked > 0 || c.id == "C5"),
        "{results:#?}"
    );
    assert!(results[3].rule.starts_with("per slot"), "{results:#?}");
}

#[test]
fn c8_more_valid_holders_than_permits() {
    // Three holders of a two-permit semaphore valid at once (a grant past
    // the permit count: slots 0, 1 and 2), each alone in its slot.
    let mut e = vec![semaphore_header(2)];
    e.extend(in_slot(cycle("w0", 1, 10, 100, 0, 1), 0));
    e.extend(in_slot(cycle("w1", 1, 11, 200, 0, 2), 1));
    e.extend(in_slot(cycle("w2", 1, 12, 300, 0, 3), 2));
    e.push(slot_final(0, 1));
    e.push(slot_final(1, 1));
    e.push(slot_final(2, 1));
    let results = check(&History::new(e));
    let found: Vec<(&str, u64)> = results
        .iter()
        .filter(|c| c.violations > 0)
        .map(|c| (c.id, c.violations))
        .collect();
    assert_eq!(found, vec![("C8", 1)], "{results:#?}");
    let c8 = results.iter().find(|c| c.id == "C8").expect("C8");
    let first = c8.first.as_ref().expect("the violation");
    assert!(
        first.message.contains("3 holders") && first.message.contains("2 permit"),
        "{first:?}"
    );
    assert_eq!(first.at, 12_000 + 1000, "{first:?}");
}

#[test]
fn c8_excuses_a_restart_that_lost_the_data() {
    let mut e = vec![semaphore_header(1)];
    e.extend(in_slot(cycle("w0", 1, 10, 100, 0, 1), 0));
    e.push(ev(
        11_500,
        "nemesis",
        Entry::NemesisStart {
            kind: "kill-wipe".into(),
            target: None,
            detail: String::new(),
            data_loss: true,
            rollback: false,
        },
    ));
    e.extend(in_slot(cycle("w1", 1, 12, 200, 1, 2), 0));
    e.push(slot_final(0, 2));
    let results = check(&History::new(e));
    let c8 = results.iter().find(|c| c.id == "C8").expect("C8");
    assert_eq!((c8.violations, c8.excused), (0, 1), "{c8:?}");
}

#[test]
fn c9_a_live_permit_refused() {
    // w1's permit (slot 1, fence 100) is valid until 312 ms, but its write
    // at 15 ms is refused: w0 (slot 0) wrote fence 200 to the same pair.
    let mut e = vec![semaphore_header(2)];
    e.extend(in_slot(cycle("w0", 1, 10, 200, 0, 1), 0));
    let mut second = in_slot(cycle("w1", 1, 12, 100, 0, 2), 1);
    second.retain(|x| !matches!(x.e, Entry::Audit { .. }));
    for x in &mut second {
        if let Entry::Written { outcome, .. } = &mut x.e {
            *outcome = Outcome::Stale;
        }
    }
    e.extend(second);
    e.push(slot_final(0, 1));
    e.push(slot_final(1, 0));
    let found = violations(e);
    assert_eq!(found, vec![("C9", 1)], "{found:?}");
}

/// A read-write lock run's header: `reads` % read leases.
fn rwlock_header() -> Event {
    let mut h = header("clock");
    if let Entry::Header(header) = &mut h.e {
        header.rwlock_reads = Some(70);
    }
    h
}

/// `events` (one cycle of [`cycle`]) as a writer's.
fn as_writer(mut events: Vec<Event>) -> Vec<Event> {
    for e in &mut events {
        if let Entry::Granted { access, .. } = &mut e.e {
            *access = Some("write".into());
        }
    }
    events
}

/// One reader cycle of worker `w` from `t` (ms) to `t + 5` ms with epoch
/// `epoch` (valid 300 ms from its grant): its validated read at `read_at`
/// ms of `value` with stored fence `seen`, reported `clean`.
fn reader(
    w: &str,
    t: i64,
    epoch: u64,
    read_at: i64,
    (value, seen, clean): (i64, Option<u64>, bool),
) -> Vec<Event> {
    let op = format!("{w}.1");
    let holder = format!("h{w}");
    let (t, read_at) = (t * 1000, read_at * 1000);
    let valid = t + 300_000;
    let end = read_at.max(t + 4000) + 1000;
    vec![
        ev(
            t - 500,
            w,
            Entry::Acquire {
                op: op.clone(),
                name: "t0".into(),
            },
        ),
        ev(
            t,
            w,
            Entry::Granted {
                op: op.clone(),
                name: "t0".into(),
                fence: epoch,
                holder,
                valid_until: valid,
                slot: None,
                access: Some("read".into()),
            },
        ),
        ev(
            read_at,
            w,
            Entry::ValidatedRead {
                op: op.clone(),
                epoch,
                sent: read_at - 100,
                value,
                fence: seen,
                clean,
                valid_until: valid,
            },
        ),
        ev(
            end,
            w,
            Entry::Release {
                op: op.clone(),
                valid_until: valid,
            },
        ),
        ev(
            end + 500,
            w,
            Entry::ReleaseDone {
                op,
                outcome: Released::Released,
            },
        ),
    ]
}

fn rw_violations(events: Vec<Event>) -> (Vec<(&'static str, u64)>, Vec<crate::CheckResult>) {
    let results = check(&History::new(events));
    let found = results
        .iter()
        .filter(|c| c.violations > 0)
        .map(|c| (c.id, c.violations))
        .collect();
    (found, results)
}

#[test]
fn a_clean_rwlock_history_passes_every_checker() {
    // A writer (fence 100), two readers sharing epoch 100 at once, then a
    // writer with fence 200 once they are gone.
    let mut e = vec![rwlock_header()];
    e.extend(as_writer(cycle("w0", 1, 10, 100, 0, 1)));
    e.extend(reader("w1", 20, 100, 22, (1, Some(100), true)));
    e.extend(reader("w2", 21, 100, 23, (1, Some(100), true)));
    e.extend(as_writer(cycle("w3", 1, 40, 200, 1, 2)));
    e.push(final_value(2));
    let (found, results) = rw_violations(e);
    assert!(found.is_empty(), "{results:#?}");
    let ids: Vec<&str> = results.iter().map(|c| c.id).collect();
    assert_eq!(
        ids,
        [
            "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C10", "C11", "C12"
        ],
        "{results:#?}"
    );
    for id in ["C1", "C3", "C4", "C10", "C11", "C12"] {
        let c = results.iter().find(|c| c.id == id).expect(id);
        assert!(c.checked > 0, "{id}: {results:#?}");
    }
    assert!(results[3].rule.starts_with("writers"), "{results:#?}");
}

#[test]
fn c10_a_writer_while_a_reader_was_valid() {
    // The reader holds 20..26 ms (valid until 320 ms); a writer is granted
    // at 23 ms.
    let mut e = vec![rwlock_header()];
    e.extend(as_writer(cycle("w0", 1, 10, 100, 0, 1)));
    e.extend(reader("w1", 20, 100, 21, (1, Some(100), true)));
    e.extend(as_writer(cycle("w2", 1, 23, 200, 1, 2)));
    e.push(final_value(2));
    let (found, results) = rw_violations(e);
    assert_eq!(found, vec![("C10", 1)], "{results:#?}");
    let c10 = results.iter().find(|c| c.id == "C10").expect("C10");
    let message = &c10.first.as_ref().expect("the violation").message;
    assert!(
        message.contains("reader w1.1 (epoch 100)") && message.contains("writer w2.1 (fence 200)"),
        "{message}"
    );
}

/// A reader (epoch 100, valid until 320 ms) that reads at 500 ms, after a
/// writer with fence 200 came in at 400 ms and wrote 1 -> 2.
fn outlived(seen: Option<u64>, clean: bool) -> Vec<Event> {
    let mut e = vec![rwlock_header()];
    e.extend(as_writer(cycle("w0", 1, 10, 100, 0, 1)));
    e.extend(reader("w1", 20, 100, 500, (2, seen, clean)));
    e.extend(as_writer(cycle("w2", 1, 400, 200, 1, 2)));
    e.push(final_value(2));
    e
}

#[test]
fn c11_a_torn_read_reported_clean() {
    // Reported torn: nothing wrong (the lease had run out).
    let (found, results) = rw_violations(outlived(Some(200), false));
    assert!(found.is_empty(), "{results:#?}");
    // Reported clean with the fence it saw: caught by that fence.
    let (found, results) = rw_violations(outlived(Some(200), true));
    assert_eq!(found, vec![("C11", 1)], "{results:#?}");
    // Reported clean without looking at the fence (`unvalidated-read`):
    // caught by the audit, whose write of the value read had fence 200.
    let (found, results) = rw_violations(outlived(None, true));
    assert_eq!(found, vec![("C11", 1)], "{results:#?}");
    let c11 = results.iter().find(|c| c.id == "C11").expect("C11");
    let message = &c11.first.as_ref().expect("the violation").message;
    assert!(
        message.contains("came after the write of w2.1 with fence 200"),
        "{message}"
    );
}

#[test]
fn c11_an_acknowledged_write_before_the_read_is_seen() {
    // The reader read value 1 (the first writer's) and reported it clean,
    // but a write with fence 200 had been acknowledged before it was sent.
    let mut e = vec![rwlock_header()];
    e.extend(as_writer(cycle("w0", 1, 10, 100, 0, 1)));
    e.extend(reader("w1", 20, 100, 500, (1, None, true)));
    e.extend(as_writer(cycle("w2", 1, 400, 200, 1, 2)));
    e.push(final_value(2));
    let (found, results) = rw_violations(e);
    assert_eq!(found, vec![("C11", 1)], "{results:#?}");
    let c11 = results.iter().find(|c| c.id == "C11").expect("C11");
    let message = &c11.first.as_ref().expect("the violation").message;
    assert!(
        message.contains("acknowledged before the read"),
        "{message}"
    );
}

#[test]
fn c11_a_torn_read_while_the_lease_was_valid() {
    let mut e = vec![rwlock_header()];
    e.extend(as_writer(cycle("w0", 1, 10, 100, 0, 1)));
    e.extend(reader("w1", 20, 100, 22, (1, Some(200), false)));
    e.push(final_value(1));
    let (found, results) = rw_violations(e);
    assert_eq!(found, vec![("C11", 1)], "{results:#?}");
}

#[test]
fn c12_a_reader_epoch_below_an_earlier_writer() {
    let mut e = vec![rwlock_header()];
    e.extend(as_writer(cycle("w0", 1, 10, 100, 0, 1)));
    e.extend(reader("w1", 20, 50, 22, (1, Some(100), false)));
    e.push(final_value(1));
    let (found, results) = rw_violations(e);
    // The read is torn while valid too: its epoch is below the fence
    // stored before it was granted.
    assert_eq!(found, vec![("C11", 1), ("C12", 1)], "{results:#?}");
}
