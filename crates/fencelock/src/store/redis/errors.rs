//! Server errors as fencelock reports them: which key, command or setting is
//! in the way, without the script internals Redis appends (`script: SHA, on
//! @user_script:N.`).
//!
//! The scripts raise their own codes for what they check (see
//! `scripts/common.lua`): `FLWRONGTYPE TYPE KEY`, `FLBADFENCE KEY`,
//! `FLFENCEMAX KEY`, `FLNOPERM COMMAND` and `FLNOKEY KEY`. Redis itself
//! answers `NOPERM` for a command or key the ACL user may not use before a
//! script runs.

use redis::RedisError;

use crate::error::{DriverError, Error};

/// A redis-rs error as the [`DriverError`] fencelock's errors carry: its
/// text without script internals, its code, and whether a reconnect may
/// cure it ([`is_transient`]).
pub(crate) fn driver_error(e: RedisError) -> DriverError {
    let code = e.code().map(str::to_owned);
    let transient = is_transient(&e);
    // A server's refusal for now reads as Redis words it (`NOREPLICAS Not
    // enough good replicas to write.`), not as the client library's kind.
    let message = match (&code, e.detail()) {
        (Some(code), Some(detail)) if transient => {
            format!("{code} {}", without_script_internals(detail))
        }
        _ => without_script_internals(&e.to_string()).to_owned(),
    };
    let error = DriverError::new(e, message, code);
    if transient {
        error.transient(true)
    } else {
        error
    }
}

/// Connection-level failures that a reconnect may cure (including a
/// server that is loading, failing over or read-only for now, or a master
/// that refuses writes until enough replicas are in sync again:
/// `NOREPLICAS`, under `min-replicas-to-write`).
pub(crate) fn is_transient(e: &RedisError) -> bool {
    is_refused_for_now(e.code())
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::BusyLoading
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::ClusterDown
                    | redis::ServerErrorKind::MasterDown
                    | redis::ServerErrorKind::ReadOnly
            )
        )
}

/// Whether a server's error code says it refuses writes for now: a
/// replica (`READONLY`, a master demoted by a failover), a replica cut off
/// from its master (`MASTERDOWN`), a server loading its data (`LOADING`),
/// or a master with too few good replicas (`NOREPLICAS`).
pub(crate) fn is_refused_for_now(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOREPLICAS")
    )
}

/// The error of one command of a failed pipeline (the first that failed),
/// as that command alone would have failed: a pipeline's error keeps the
/// code only of the errors the client library knows (`READONLY`), not of
/// the others (`NOREPLICAS`).
pub(crate) fn first_failure(e: RedisError) -> RedisError {
    match e.clone().into_server_errors() {
        Some(failures) => failures
            .first()
            .map_or(e, |(_, failure)| RedisError::from(failure.clone())),
        None => e,
    }
}

/// A server error from its wire text `CODE detail` (as a batch script
/// reports an item's failure), typed as the client library types it.
pub(crate) fn from_wire(text: &str) -> Option<RedisError> {
    let reply =
        redis::parse_redis_value(format!("-{}\r\n", text.replace(['\r', '\n'], " ")).as_bytes())
            .ok()?;
    reply.extract_error().err()
}

/// The message of a server error without what Redis appends to errors
/// raised inside a script.
pub(crate) fn without_script_internals(text: &str) -> &str {
    match text.find(" script: ") {
        Some(at) => text[..at].trim_end(),
        None => text.trim_end(),
    }
}

/// The typed error for a server error with `code` and `detail` from a call
/// on `keys`, if it is one fencelock names itself.
pub(crate) fn classify(code: &str, detail: &str, keys: &[&str]) -> Option<Error> {
    let detail = without_script_internals(detail);
    match code {
        "FLWRONGTYPE" => {
            let (kind, key) = detail.split_once(' ')?;
            Some(Error::WrongType {
                key: key.to_owned(),
                detail: format!("a {kind}"),
            })
        }
        "FLBADFENCE" => Some(Error::WrongType {
            key: detail.to_owned(),
            detail: "a fence that is not a plain non-negative integer".to_owned(),
        }),
        "FLFENCEMAX" => Some(Error::WrongType {
            key: detail.to_owned(),
            detail: "a fence at or above 2^53 - 1, beyond which fences cannot grow".to_owned(),
        }),
        "WRONGTYPE" => Some(Error::WrongType {
            key: keys.first().copied().unwrap_or_default().to_owned(),
            detail: "a value of another type".to_owned(),
        }),
        "FLNOPERM" => Some(no_permission(format!("run the command {detail}"), detail)),
        "FLNOKEY" => Some(no_key_permission(detail)),
        "NOPERM" => Some(noperm(detail, keys)),
        _ => None,
    }
}

/// The typed error for `e`, if its server error (a pipeline's first
/// failed command, for a pipeline) is one fencelock names itself: a
/// pipeline refused by an ACL rule names the permission, not every
/// refused command.
pub(crate) fn classify_reply(e: &RedisError, keys: &[&str]) -> Option<Error> {
    if let (Some(code), Some(detail)) = (e.code(), e.detail()) {
        return classify(code, detail, keys);
    }
    let failed = e.clone().into_server_errors()?;
    let (_, first) = failed.first()?;
    classify(first.code(), first.details().unwrap_or_default(), keys)
}

/// The missing permission in the text of a connect error, if that is what
/// it is: a user that may not run `PING` (the connect check) or `SELECT` (a
/// URL with a database other than 0) is refused with `NOPERM`, which the
/// client library reports as a failed connection.
pub(crate) fn refused_at_connect(text: &str) -> Option<Error> {
    text.find(NOPERM_TEXT).map(|at| noperm(&text[at..], &[]))
}

/// How every `NOPERM` reply of Redis 7 words what is missing.
const NOPERM_TEXT: &str = "no permissions to ";

/// Redis's own `NOPERM` replies, e.g. "this user has no permissions to run
/// the 'evalsha' command", "... to access one of the keys used as
/// arguments", "... to access one of the channels used as arguments".
fn noperm(detail: &str, keys: &[&str]) -> Error {
    if let Some(command) = detail
        .split_once("to run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command.to_uppercase())
    {
        let fix = command.to_lowercase().replace(' ', "|");
        return no_permission(format!("run the command {command}"), &fix);
    }
    if detail.contains("keys") {
        return no_key_permission(keys.first().copied().unwrap_or("the lock's keys"));
    }
    if detail.contains("channels") {
        let pattern = keys
            .first()
            .map_or_else(|| "lock:*".to_owned(), |k| key_pattern(k));
        return Error::NoPermission {
            detail: "use the wake-up channels".to_owned(),
            fix: format!("a channel pattern that covers them, such as &{pattern}"),
        };
    }
    Error::NoPermission {
        detail: detail.to_owned(),
        fix: "the permission named".to_owned(),
    }
}

/// The user may not access `key` (or may read it but not write it: Redis
/// words both alike).
fn no_key_permission(key: &str) -> Error {
    Error::NoPermission {
        detail: format!("access the key {key:?}"),
        fix: format!(
            "a key pattern that covers it, such as ~{}",
            key_pattern(key)
        ),
    }
}

fn no_permission(detail: String, command: &str) -> Error {
    Error::NoPermission {
        detail,
        fix: format!("+{}", command.to_lowercase()),
    }
}

/// A key pattern that covers `key` and its siblings: up to and including its
/// first `:` (the prefix in both layouts), then `*`.
fn key_pattern(key: &str) -> String {
    match key.split_once(':') {
        Some((prefix, _)) => format!("{prefix}:*"),
        None => key.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A redis-rs error keeps its code and its message without script
    /// internals, knows whether a reconnect may cure it, and stays
    /// reachable as the source.
    #[test]
    fn redis_errors_become_driver_errors() {
        use std::error::Error as _;
        let e = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "READONLY",
            "You can't write against a read only replica. script: abc, on @user_script:1."
                .to_owned(),
        ));
        let driver = driver_error(e);
        assert_eq!(driver.code(), Some("READONLY"));
        assert!(!driver.to_string().contains("script:"), "{driver}");
        assert!(crate::Error::Redis(driver).is_retryable());
        let refused = driver_error(RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "bad",
        )));
        assert!(!crate::Error::Redis(refused).is_retryable());
        let source = driver_error(RedisError::from((redis::ErrorKind::Io, "gone")));
        assert!(
            source
                .source()
                .and_then(|s| s.downcast_ref::<RedisError>())
                .is_some_and(|r| r.kind() == redis::ErrorKind::Io)
        );
    }

    #[test]
    fn script_internals_are_cut() {
        assert_eq!(
            without_script_internals(
                "OOM command not allowed when used memory > 'maxmemory'. script: 219bb33e7c6773035c720850383aa2ebb63d9904, on @user_script:1."
            ),
            "OOM command not allowed when used memory > 'maxmemory'."
        );
        assert_eq!(without_script_internals("plain"), "plain");
    }

    #[test]
    fn script_codes_name_one_key() {
        let e = classify(
            "FLWRONGTYPE",
            "list lock:{q}:queue script: 1234, on @user_script:9.",
            &[
                "lock:{q}",
                "lock:{q}:fence",
                "lock:{q}:queue",
                "lock:{q}:waiters",
            ],
        );
        let Some(Error::WrongType { key, detail }) = e else {
            panic!("{e:?}");
        };
        assert_eq!(
            (key.as_str(), detail.as_str()),
            ("lock:{q}:queue", "a list")
        );
        let message = Error::WrongType { key, detail }.to_string();
        assert!(
            !message.contains("script") && !message.contains(":fence"),
            "{message}"
        );
        assert!(matches!(
            classify("FLFENCEMAX", "lock:{q}:fence", &[]),
            Some(Error::WrongType { key, .. }) if key == "lock:{q}:fence"
        ));
    }

    #[test]
    fn missing_permissions_are_named_with_their_fix() {
        let e = classify("FLNOPERM", "TIME script: 1234, on @user_script:3.", &[]);
        assert!(
            matches!(&e, Some(Error::NoPermission { detail, fix }) if detail == "run the command TIME" && fix == "+time"),
            "{e:?}"
        );
        let e = classify(
            "FLNOKEY",
            "lock:{q}:fence script: 1234, on @user_script:3.",
            &["lock:{q}"],
        );
        assert!(
            matches!(&e, Some(Error::NoPermission { detail, fix }) if detail == "access the key \"lock:{q}:fence\"" && fix == "a key pattern that covers it, such as ~lock:*"),
            "{e:?}"
        );
        let e = classify(
            "NOPERM",
            "this user has no permissions to run the 'evalsha' command",
            &[],
        );
        assert!(
            matches!(&e, Some(Error::NoPermission { detail, fix }) if detail == "run the command EVALSHA" && fix == "+evalsha"),
            "{e:?}"
        );
        let e = classify(
            "NOPERM",
            "this user has no permissions to access one of the keys used as arguments",
            &["jobs:{x}", "jobs:{x}:fence"],
        );
        assert!(
            matches!(&e, Some(Error::NoPermission { fix, .. }) if fix.ends_with("~jobs:*")),
            "{e:?}"
        );
        assert!(classify("ERR", "anything", &[]).is_none());
    }

    #[test]
    fn a_refused_connect_check_is_a_missing_permission() {
        let e = refused_at_connect(
            "Redis server refused to switch database - ResponseError: this user has no permissions to run the 'select' command",
        );
        assert!(
            matches!(&e, Some(Error::NoPermission { detail, fix }) if detail == "run the command SELECT" && fix == "+select"),
            "{e:?}"
        );
        assert!(refused_at_connect("connection refused").is_none());
    }
}
