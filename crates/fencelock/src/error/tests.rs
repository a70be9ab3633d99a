//! One classification: what to do about each error, and every predicate
//! read from the same look at the variant.

use std::error::Error as _;
use std::time::Duration;

use super::*;

fn driver(transient: bool, connection: bool) -> DriverError {
    let source = std::io::Error::other("the client's own error");
    let error = DriverError::new(source, "the message".into(), Some("CODE".into()));
    if transient {
        error.transient(connection)
    } else {
        error
    }
}

#[test]
fn contention_is_retried_when_the_lock_may_be_free() {
    let remaining = Some(Duration::from_millis(40));
    let contended = Error::Contended {
        name: "job".into(),
        remaining,
    };
    assert_eq!(contended.retry(), Retry::WhenFree { remaining });
    assert!(contended.is_contended() && contended.is_retryable());
    let timeout = Error::Timeout {
        name: "job".into(),
        waited: Duration::from_secs(1),
    };
    assert_eq!(timeout.retry(), Retry::WhenFree { remaining: None });
    assert!(timeout.is_contended());
}

#[test]
fn passing_faults_are_retried_after_a_backoff_and_the_rest_never() {
    let unreachable = Error::Unreachable {
        url: "redis://h:1".into(),
        source: driver(false, false),
    };
    assert_eq!(unreachable.retry(), Retry::AfterBackoff);
    assert!(unreachable.is_connection() && !unreachable.is_config());
    let auth = Error::Auth {
        url: "redis://h:1".into(),
        source: driver(false, false),
    };
    assert_eq!(auth.retry(), Retry::Never);
    assert!(auth.is_connection() && auth.is_config());
    let lost = Error::LockLost {
        name: "job".into(),
        fence: Fence::new(7),
        reason: LossReason::TakenOver,
    };
    assert_eq!(lost.retry(), Retry::Never);
    assert!(lost.is_lost() && !lost.is_retryable());
    let bad = Error::InvalidOption("ttl".into());
    assert!(bad.is_invalid_input() && !bad.is_retryable());
    // A driver's error is what its converting layer found it to be.
    assert_eq!(
        Error::Redis(driver(true, true)).retry(),
        Retry::AfterBackoff
    );
    assert!(Error::Redis(driver(true, true)).is_connection());
    assert_eq!(Error::Redis(driver(false, false)).retry(), Retry::Never);
    assert!(!Error::Redis(driver(false, false)).is_connection());
}

#[test]
fn a_driver_error_keeps_its_message_code_and_source() {
    let error = driver(false, false);
    assert_eq!(error.to_string(), "the message");
    assert_eq!(error.code(), Some("CODE"));
    let source = error
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(
        source.map(ToString::to_string).as_deref(),
        Some("the client's own error")
    );
    assert_eq!(Error::Redis(error).to_string(), "Redis error: the message");
}
