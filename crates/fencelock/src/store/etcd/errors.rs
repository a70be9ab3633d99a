//! etcd's errors as fencelock's: what failed (unreachable, no leader,
//! refused, a TLS handshake), whether it may pass, and the [`DriverError`]
//! that carries the client's own error.

use crate::error::{DriverError, Error};
use crate::store::tls;
use crate::store::url::redact_url_in;

/// A failed connect as a fencelock error. On a TLS URL a handshake
/// refused by the member often reaches the client as a closed stream
/// ("broken pipe", "connection reset", "transport error") that names no
/// TLS problem, so every such failure carries `hint`, except a refused
/// user or password, which is not a TLS matter.
pub(super) fn connect_error(shown: &str, raw: &str, e: etcd_client::Error, hint: &str) -> Error {
    match map_error(shown, raw, e, "connecting") {
        Error::Etcd {
            url,
            detail,
            source,
        } if !hint.is_empty() && !source.is_config() => Error::Etcd {
            url,
            detail: format!("{detail}{hint}"),
            source,
        },
        other => other,
    }
}

/// The whole text of `e` and its causes (tonic hides the cause of a
/// transport error behind "transport error").
fn full_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The TLS alert named in `text` (`received fatal alert: BadCertificate`).
fn alert(text: &str) -> &str {
    text.split_once("alert: ")
        .map_or(text, |(_, rest)| rest)
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap_or(text)
}

pub(super) fn map_error(shown: &str, raw: &str, e: etcd_client::Error, doing: &str) -> Error {
    let text = redact_url_in(&full_text(&e), raw);
    // Only a failed handshake is a TLS problem ("TimeoutExpired" is not an
    // expired certificate).
    let handshake = [
        "certificate",
        "Certificate",
        "Handshake",
        "InvalidContentType",
        "corrupt message",
    ]
    .iter()
    .any(|marker| text.contains(marker));
    if handshake {
        let problem = tls::problem(&text).or_else(|| {
            text.contains("alert").then(|| {
                format!(
                    "the TLS handshake was refused ({}): check that --tls-ca names the members' CA and --tls-cert/--tls-key a certificate they accept",
                    alert(&text)
                )
            })
        });
        if let Some(problem) = problem {
            return Error::Tls {
                url: shown.to_owned(),
                detail: problem
                    .replace("redis://", "etcd://")
                    .replace("rediss://", "etcds://"),
            };
        }
    }
    let detail = if auth_not_enabled(&e) {
        format!(
            "{doing}: refused ({text}); the cluster has authentication off, so it takes no user: remove USER:PASSWORD@ from the URL (or enable authentication on the cluster)"
        )
    } else if user_required(&e) {
        format!(
            "{doing}: refused ({text}); the cluster requires authentication: give a user in the URL, etcd://USER:PASSWORD@HOST"
        )
    } else if is_config(&e) {
        format!(
            "{doing}: refused ({text}); check the user and password in the URL and the user's roles"
        )
    } else if is_transient(&e) {
        format!("{doing}: unreachable or without a leader ({text})")
    } else {
        format!("{doing}: {text}")
    };
    Error::Etcd {
        url: shown.to_owned(),
        detail,
        source: driver_error(e),
    }
}

/// An etcd client error as the [`DriverError`] fencelock's errors carry:
/// its gRPC status code's name as the code, and whether it may pass or
/// needs a credential or role fixed.
fn driver_error(e: etcd_client::Error) -> DriverError {
    let code = match &e {
        etcd_client::Error::GRpcStatus(status) => Some(format!("{:?}", status.code())),
        _ => None,
    };
    let (transient, config) = (is_transient(&e), is_config(&e));
    let message = e.to_string();
    let error = DriverError::new(e, message, code);
    match (transient, config) {
        (true, _) => error.transient(true),
        (false, true) => error.needs_config(),
        (false, false) => error,
    }
}

/// Whether `e` says the request never left: the connection to the member
/// could not be made.
pub(super) fn never_sent(e: &etcd_client::Error) -> bool {
    let text = full_text(e);
    text.contains("tcp connect error") || text.contains("error trying to connect")
}

/// Whether `e` is an outage that may pass: the member is unreachable, the
/// cluster has no leader, a request timed out, a leader changed, or Raft
/// dropped the proposal (etcd's "raft proposal dropped", code `Unknown`:
/// the member had no leader to forward it to, or the leadership was being
/// handed over; nothing was applied). Taken for a lasting error, a
/// dropped release was not sent again, and its key stayed first in the
/// queue on a session that lives on: every waiter waited its whole wait.
pub(crate) fn is_transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::EndpointError(_) => true,
        E::LeaseKeepAliveError(message) => !message.contains("not found"),
        E::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Cancelled
                    | Code::Aborted
                    | Code::ResourceExhausted
            ) || (status.code() == Code::Unknown
                && (status.message().contains("leader")
                    || status.message().contains("proposal dropped")
                    || broke_the_connection(status)))
        }
        _ => false,
    }
}

/// Whether `status` is tonic's wrapping of a failed connection (a reset
/// or closed stream it could not map to a gRPC code; with TLS, also how a
/// member's refused handshake often ends).
fn broke_the_connection(status: &tonic::Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|cause| cause.downcast_ref::<tonic::transport::Error>().is_some())
}

/// Whether `e` is a refusal that only a change of configuration cures:
/// wrong credentials, a missing role, credentials given to a cluster with
/// authentication off, none given to one with it on.
pub(crate) fn is_config(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unauthenticated | Code::PermissionDenied
            ) || status.message().contains("authentication failed")
                || auth_not_enabled(e)
                || user_required(e)
        }
        _ => false,
    }
}

/// The message of an etcd server error, if `e` is one.
fn server_message(e: &etcd_client::Error) -> &str {
    match e {
        etcd_client::Error::GRpcStatus(status) => status.message(),
        _ => "",
    }
}

/// Whether `e` is etcd refusing to authenticate a user because the
/// cluster has authentication off.
fn auth_not_enabled(e: &etcd_client::Error) -> bool {
    server_message(e).contains("authentication is not enabled")
}

/// Whether `e` is etcd refusing a request without a user, on a cluster
/// with authentication on.
fn user_required(e: &etcd_client::Error) -> bool {
    let message = server_message(e);
    message.contains("user name is empty") || message.contains("user name not found")
}

/// Whether `e` says a lease does not exist (it expired, or was revoked).
pub(crate) fn is_lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::NotFound || status.message().contains("lease not found")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{is_config, is_transient};
    use tonic::{Code, Status};

    fn status(code: Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(Status::new(code, message))
    }

    #[test]
    fn a_dropped_proposal_and_a_missing_leader_may_pass() {
        for passing in [
            status(Code::Unknown, "raft proposal dropped"),
            status(Code::Unknown, "etcdserver: leader changed"),
            status(Code::Unavailable, "etcdserver: request timed out"),
            status(Code::Unavailable, "etcdserver: no leader"),
        ] {
            assert!(is_transient(&passing), "{passing}");
            assert!(!is_config(&passing), "{passing}");
        }
    }

    #[test]
    fn refusals_and_unknown_failures_do_not_pass() {
        for lasting in [
            status(Code::Unknown, "something else"),
            status(Code::InvalidArgument, "etcdserver: request is too large"),
            status(Code::PermissionDenied, "etcdserver: permission denied"),
        ] {
            assert!(!is_transient(&lasting), "{lasting}");
        }
        assert!(is_config(&status(
            Code::PermissionDenied,
            "etcdserver: permission denied"
        )));
    }
}
