//! The engine's decisions about time, without a store.

use super::*;

fn contended(remaining: Option<Duration>) -> Error {
    Error::Contended {
        name: "job".into(),
        remaining,
    }
}

#[test]
fn only_a_handover_above_the_fence_seen_at_the_refusal_is_fresh() {
    let fence = Fence::new;
    assert!(handover_is_fresh(Some(41), fence(42)));
    // Not above: minted before the refused attempt, or nothing known.
    assert!(!handover_is_fresh(Some(42), fence(42)));
    assert!(!handover_is_fresh(Some(43), fence(42)));
    assert!(!handover_is_fresh(None, fence(42)));
}

#[test]
fn queued_waiters_sleep_until_the_lease_ends_or_a_third_of_their_waiter_lease() {
    let lease = Duration::from_millis(900);
    let mut backoff = Backoff::new();
    let ms = Duration::from_millis;
    assert_eq!(
        retry_delay(&contended(Some(ms(50))), true, lease, &mut backoff),
        ms(51)
    );
    assert_eq!(
        retry_delay(&contended(Some(ms(5000))), true, lease, &mut backoff),
        ms(300)
    );
    // Reserved for the fair head: the holder's lease is unknown.
    assert_eq!(
        retry_delay(&contended(None), true, lease, &mut backoff),
        ms(300)
    );
    // A huge reported lease cannot overflow.
    assert_eq!(
        retry_delay(&contended(Some(Duration::MAX)), true, lease, &mut backoff),
        ms(300)
    );
}

#[test]
fn pollers_back_off_but_never_past_the_holders_expiry() {
    let lease = Duration::from_secs(1);
    let mut backoff = Backoff::new();
    for _ in 0..20 {
        let d = retry_delay(
            &contended(Some(Duration::from_millis(3))),
            false,
            lease,
            &mut backoff,
        );
        assert!(d <= Duration::from_millis(4), "{d:?}");
    }
    let late = Error::GrantTooLate {
        name: "job".into(),
        elapsed: Duration::from_secs(1),
        ttl: Duration::from_secs(1),
    };
    let d = retry_delay(&late, true, lease, &mut backoff);
    assert!(d <= Duration::from_millis(200), "{d:?}");
}

#[test]
fn a_handed_over_lock_is_taken_only_with_a_quarter_of_it_left() {
    let provisional = Duration::from_millis(100);
    let refused_at = Instant::now();
    let deadline = handover_deadline(refused_at, provisional, refused_at);
    assert_eq!(deadline, Some(refused_at + Duration::from_millis(97)));
    let late = refused_at + Duration::from_millis(80);
    assert_eq!(handover_deadline(refused_at, provisional, late), None);
    assert!(
        handover_deadline(
            refused_at,
            provisional,
            refused_at + Duration::from_millis(70)
        )
        .is_some()
    );
}

#[test]
fn grants_with_less_than_a_tenth_of_the_ttl_left_are_too_late() {
    let now = Instant::now();
    let ttl = Duration::from_secs(1);
    assert!(!arrived_too_late(
        now + Duration::from_millis(100),
        ttl,
        now
    ));
    assert!(arrived_too_late(now + Duration::from_millis(99), ttl, now));
    assert!(arrived_too_late(now, ttl, now + Duration::from_secs(5)));
}
