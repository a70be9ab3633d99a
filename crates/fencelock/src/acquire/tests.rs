//! Tests of the acquire engine: the pure decisions, and grants against a
//! real redis-server.

mod pure {
    use super::super::*;

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
}

mod redis {
    use super::super::*;
    use crate::backend::ConnSettings;
    use crate::error::LossReason;
    use crate::keys::KeyLayout;
    use crate::lease::ReleaseOutcome;
    use crate::options::{FenceMode, Renewal};
    use fencelock_testkit::RedisServer;

    async fn engine(server: &RedisServer) -> Result<Engine> {
        let settings = ConnSettings::default();
        Ok(Engine::new(
            Backend::connect(&server.url(), &settings).await?,
        ))
    }

    /// A retried grant with the same token (its first reply lost) returns the
    /// same fence, mints nothing new and restarts the lease; a different token
    /// is refused.
    #[tokio::test]
    async fn a_retried_grant_returns_the_same_fence() -> Result<()> {
        let server = RedisServer::start();
        let engine = engine(&server).await?;
        for (layout, mode) in [
            (KeyLayout::HashTagged, FenceMode::Clock),
            (KeyLayout::HashTagged, FenceMode::Counter),
            (KeyLayout::Guide, FenceMode::Counter),
            (KeyLayout::Guide, FenceMode::Clock),
        ] {
            let name = format!("retry-{layout:?}-{mode:?}");
            let opts = LockOptions::default()
                .ttl(Duration::from_secs(5))
                .renewal(Renewal::Off)
                .layout(layout)
                .fence_mode(mode);
            let keys = LockKeys::new("lock:", layout, &name)?;
            let token = new_token();
            let first = engine
                .grant(&name, &keys, &token, &opts, Standing::default())
                .await?;
            let fence_key_before: Option<String> = server.query(&["GET", &keys.fence]);
            server.cmd(&["PEXPIRE", &keys.lock, "1000"]);
            let again = engine
                .grant(&name, &keys, &token, &opts, Standing::default())
                .await?;
            assert_eq!(first.fence(), again.fence(), "{layout:?} {mode:?}");
            let fence_key_after: Option<String> = server.query(&["GET", &keys.fence]);
            assert_eq!(fence_key_before, fence_key_after, "no new fence minted");
            let pttl: i64 = server.query(&["PTTL", &keys.lock]);
            assert!(pttl > 4000, "the retry restarted the lease (pttl {pttl})");
            let other = engine
                .grant(&name, &keys, &new_token(), &opts, Standing::default())
                .await;
            assert!(matches!(other, Err(Error::Contended { .. })), "{other:?}");
            // Both guards name the same grant: the first release deletes it.
            assert_eq!(again.release().await?, ReleaseOutcome::Released);
            assert_eq!(
                first.release().await?,
                ReleaseOutcome::NotOurs(LossReason::Expired)
            );
        }
        Ok(())
    }
}
