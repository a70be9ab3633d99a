//! [`EtcdConn`]: one etcd cluster behind one URL, and etcd's errors as
//! fencelock's.
//!
//! `etcd://[user:password@]host[:port][,host[:port]…][?prefix=NAMESPACE]`
//! (`etcds://` for TLS, with the same CA and client certificate settings as
//! `rediss://`). The port defaults to 2379. `prefix` is a namespace put in
//! front of every key the client touches (locks and fenced keys), like
//! `etcdctl`'s namespaces. The client balances over every listed member and
//! needs a leader for every request (a member cut off from the quorum fails
//! fast instead of hanging).

use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmResponse, AlarmType, Certificate, Client, ConnectOptions, DeleteOptions,
    DeleteResponse, GetOptions, GetResponse, Identity, LeaseGrantResponse, LeaseRevokeResponse,
    LeaseTimeToLiveResponse, MemberListResponse, TlsOptions, Txn, TxnResponse, WatchOptions,
    WatchStream,
};

use crate::error::{DriverError, Error, Result};
use crate::store::ConnSettings;
use crate::store::tls::{self, TlsFiles};
use crate::store::url::{percent_decoded, redact, redact_url_in};

/// The default client port of etcd.
const DEFAULT_PORT: u16 = 2379;

/// HTTP/2 keep-alive pings: a connection whose member stopped answering is
/// dropped after this long without a reply, so requests move to the others.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// What an `etcd://` or `etcds://` URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdTarget {
    /// `host:port` of every listed member.
    pub(crate) hosts: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) user: Option<(String, String)>,
    /// Put in front of every key (`?prefix=`).
    pub(crate) namespace: String,
}

impl EtcdTarget {
    /// Parses an etcd URL.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] saying what is wrong (the URL shown without
    /// its password).
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidOption(format!("bad etcd URL {}: {why}", redact(url)));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected etcd://HOST:PORT[,HOST:PORT…]"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad("the scheme must be etcd or etcds")),
        };
        let (userinfo, location) = match rest.rsplit_once('@') {
            Some((userinfo, location)) => (Some(userinfo), location),
            None => (None, rest),
        };
        let user = match userinfo {
            None => None,
            Some(info) => match info.split_once(':') {
                Some((user, password)) if !user.is_empty() => {
                    Some((percent_decoded(user), percent_decoded(password)))
                }
                _ => return Err(bad("credentials must be USER:PASSWORD@")),
            },
        };
        let (hosts, query) = match location.split_once('?') {
            Some((hosts, query)) => (hosts, Some(query)),
            None => (location, None),
        };
        let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
        let mut namespace = String::new();
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            match param.split_once('=') {
                Some(("prefix", value)) => namespace = percent_decoded(value),
                _ if param.is_empty() => {}
                _ => {
                    return Err(bad(&format!(
                        "unknown parameter {param:?} (etcd URLs take prefix=NAMESPACE)"
                    )));
                }
            }
        }
        let hosts = hosts
            .split(',')
            .map(|host| with_port(host).ok_or_else(|| bad(&format!("bad member address {host:?}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(EtcdTarget {
            hosts,
            tls,
            user,
            namespace,
        })
    }

    /// The client's endpoints (`http://host:port`, `https` with TLS).
    pub(crate) fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect()
    }
}

/// `host:port` with etcd's default port added when missing; `None` for an
/// empty or malformed address.
fn with_port(host: &str) -> Option<String> {
    if host.is_empty() || host.contains(['/', ' ']) {
        return None;
    }
    // [v6]:port, [v6], host:port, host.
    if let Some(rest) = host.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        return match after {
            "" => Some(format!("[{addr}]:{DEFAULT_PORT}")),
            p => p
                .strip_prefix(':')?
                .parse::<u16>()
                .ok()
                .map(|port| format!("[{addr}]:{port}")),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && !name.contains(':') => port
            .parse::<u16>()
            .ok()
            .map(|port| format!("{name}:{port}")),
        Some(_) => None,
        None => Some(format!("{host}:{DEFAULT_PORT}")),
    }
}

/// A connection to one etcd cluster: a client balancing over its members.
/// Cheap to clone (and small: the client itself is shared).
#[derive(Clone)]
pub(crate) struct EtcdConn {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    client: Client,
    /// The URL without its password, for messages.
    url: String,
    /// The URL as given, to scrub client errors of its password.
    raw_url: String,
    target: EtcdTarget,
    options: ConnectOptions,
}

impl std::fmt::Debug for EtcdConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConn")
            .field("url", &self.inner.url)
            .field("namespace", &self.inner.target.namespace)
            .finish()
    }
}

impl EtcdConn {
    /// Connects to the cluster `url` names and checks that it answers
    /// (`Status` of a member), so a wrong URL fails here, not at the first
    /// lock.
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        tls::install_provider();
        let target = EtcdTarget::parse(url)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(settings.connect_timeout)
            .with_timeout(settings.response_timeout)
            .with_keep_alive(KEEP_ALIVE, KEEP_ALIVE)
            .with_require_leader(true);
        if let Some((user, password)) = &target.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if target.tls {
            options = options.with_tls(tls_options(&settings.tls)?);
        } else if !settings.tls.is_empty() {
            return Err(Error::InvalidOption(format!(
                "TLS files were given but {} is not a TLS URL: use etcds://",
                redact(url)
            )));
        }
        let shown = redact(url);
        let hint = target_hint(&target, settings);
        let client = Client::connect(target.endpoints(), Some(options.clone()))
            .await
            .map_err(|e| connect_error(&shown, url, e, hint))?;
        let conn = EtcdConn {
            inner: std::sync::Arc::new(Inner {
                client,
                url: shown,
                raw_url: url.to_owned(),
                target,
                options,
            }),
        };
        // The client balances over the members; a request may go to one
        // that is down before the balancer knows. Any member answering is
        // enough, so try each a couple of times.
        let attempts = 2 * conn.inner.target.hosts.len();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match conn.inner.client.clone().status().await {
                Ok(_) => break,
                Err(e) if is_transient(&e) && attempt < attempts => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(connect_error(&conn.inner.url, url, e, hint)),
            }
        }
        Ok(conn)
    }

    /// The URL, without its password.
    pub(crate) fn url(&self) -> &str {
        &self.inner.url
    }

    /// The namespace every key starts with (`?prefix=`, empty by default).
    pub(crate) fn namespace(&self) -> &str {
        &self.inner.target.namespace
    }

    /// Runs one request, again (on another member) if it was never sent: a
    /// member that is down fails the requests the client's balancer still
    /// routes to it with a connect error, until the balancer stops picking
    /// it. A request that was sent is never repeated here.
    async fn call<T, F, Fut>(&self, mut request: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let attempts = 2 * self.inner.target.hosts.len() + 1;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match request(self.inner.client.clone()).await {
                Err(e) if attempt < attempts && never_sent(&e) => {}
                other => return other,
            }
        }
    }

    /// A range read (`Get`).
    pub(crate) async fn get(
        &self,
        key: &str,
        options: Option<GetOptions>,
    ) -> std::result::Result<GetResponse, etcd_client::Error> {
        self.call(|mut c| {
            let options = options.clone();
            async move { c.get(key, options).await }
        })
        .await
    }

    /// A transaction.
    pub(crate) async fn txn(
        &self,
        txn: Txn,
    ) -> std::result::Result<TxnResponse, etcd_client::Error> {
        self.call(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Deletes every key that starts with `prefix` (namespace included).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) async fn delete_prefix(
        &self,
        prefix: &str,
    ) -> std::result::Result<DeleteResponse, etcd_client::Error> {
        self.call(|mut c| async move {
            c.delete(prefix, Some(DeleteOptions::new().with_prefix()))
                .await
        })
        .await
    }

    /// Grants a lease of `ttl` seconds.
    pub(crate) async fn lease_grant(
        &self,
        ttl: i64,
    ) -> std::result::Result<LeaseGrantResponse, etcd_client::Error> {
        self.call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await
    }

    /// Revokes a lease (and deletes its keys).
    pub(crate) async fn lease_revoke(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseRevokeResponse, etcd_client::Error> {
        self.call(|mut c| async move { c.lease_revoke(id).await })
            .await
    }

    /// One keep-alive of a lease (a stream opened and closed: one round
    /// trip).
    pub(crate) async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> std::result::Result<(), etcd_client::Error> {
        self.call(|mut c| async move { c.lease_keep_alive(id).await.map(drop) })
            .await
    }

    /// A lease's time to live.
    pub(crate) async fn lease_time_to_live(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseTimeToLiveResponse, etcd_client::Error> {
        self.call(|mut c| async move { c.lease_time_to_live(id, None).await })
            .await
    }

    /// Opens a watch.
    pub(crate) async fn watch(
        &self,
        key: &str,
        options: Option<WatchOptions>,
    ) -> std::result::Result<WatchStream, etcd_client::Error> {
        self.call(|mut c| {
            let options = options.clone();
            async move { c.watch(key, options).await }
        })
        .await
    }

    /// The member list.
    pub(crate) async fn member_list(
        &self,
    ) -> std::result::Result<MemberListResponse, etcd_client::Error> {
        self.call(|mut c| async move { c.member_list().await })
            .await
    }

    /// The raised alarms.
    pub(crate) async fn alarms(&self) -> std::result::Result<AlarmResponse, etcd_client::Error> {
        self.call(|mut c| async move { c.alarm(AlarmAction::Get, AlarmType::None, None).await })
            .await
    }

    /// A client of the member at `endpoint` alone (for the audit).
    pub(crate) async fn member(&self, endpoint: &str) -> Result<Client> {
        Client::connect([endpoint], Some(self.inner.options.clone()))
            .await
            .map_err(|e| self.error(e, &format!("connecting to the member at {endpoint}")))
    }

    /// etcd's error `e`, met while `doing` something, as a fencelock error.
    pub(crate) fn error(&self, e: etcd_client::Error, doing: &str) -> Error {
        map_error(&self.inner.url, &self.inner.raw_url, e, doing)
    }
}

/// What to add to a failed connect's message on a TLS URL: a handshake
/// refused by either side can end as a closed connection, which says
/// nothing about TLS.
fn target_hint(target: &EtcdTarget, settings: &ConnSettings) -> &'static str {
    match (target.tls, settings.tls.cert.is_some()) {
        (false, _) => "",
        (true, false) => {
            "; if it is TLS that fails: --tls-ca must name the members' CA, and members that require client certificates need --tls-cert and --tls-key"
        }
        (true, true) => {
            "; if it is TLS that fails: --tls-ca must name the members' CA, and --tls-cert/--tls-key a certificate they accept"
        }
    }
}

/// The CA and client certificate of `files` for tonic.
fn tls_options(files: &TlsFiles) -> Result<TlsOptions> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            Error::InvalidOption(format!(
                "cannot read the TLS {what} file {}: {e}",
                path.display()
            ))
        })
    };
    let mut options = TlsOptions::new();
    options = match &files.ca {
        Some(ca) => options.ca_certificate(Certificate::from_pem(read("CA certificate", ca)?)),
        None => options.with_native_roots(),
    };
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Ok(options.identity(Identity::from_pem(
            read("client certificate", cert)?,
            read("client key", key)?,
        ))),
        (None, None) => Ok(options),
        _ => Err(Error::InvalidOption(
            "a TLS client certificate and its key go together (--tls-cert and --tls-key)".into(),
        )),
    }
}

/// A failed connect as a fencelock error. On a TLS URL a handshake
/// refused by the member often reaches the client as a closed stream
/// ("broken pipe", "connection reset", "transport error") that names no
/// TLS problem, so every such failure carries `hint`, except a refused
/// user or password, which is not a TLS matter.
fn connect_error(shown: &str, raw: &str, e: etcd_client::Error, hint: &str) -> Error {
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

fn map_error(shown: &str, raw: &str, e: etcd_client::Error, doing: &str) -> Error {
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
    let detail = if is_config(&e) {
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
fn never_sent(e: &etcd_client::Error) -> bool {
    let text = full_text(e);
    text.contains("tcp connect error") || text.contains("error trying to connect")
}

/// Whether `e` is an outage that may pass: the member is unreachable, the
/// cluster has no leader, a request timed out, a leader changed.
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
                && (status.message().contains("leader") || broke_the_connection(status)))
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
/// wrong credentials, a missing role.
pub(crate) fn is_config(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unauthenticated | Code::PermissionDenied
            ) || status.message().contains("authentication failed")
        }
        _ => false,
    }
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
    use super::*;

    #[test]
    fn urls_name_members_credentials_and_a_namespace() -> Result<()> {
        let t = EtcdTarget::parse("etcd://10.0.0.1:2379,10.0.0.2,[::1]:2381/?prefix=%2Fapp%2F")?;
        assert_eq!(t.hosts, ["10.0.0.1:2379", "10.0.0.2:2379", "[::1]:2381"]);
        assert_eq!(t.namespace, "/app/");
        assert!(!t.tls);
        assert_eq!(
            t.endpoints(),
            [
                "http://10.0.0.1:2379",
                "http://10.0.0.2:2379",
                "http://[::1]:2381"
            ]
        );
        let t = EtcdTarget::parse("etcds://app:s%40cret@db:2379")?;
        assert!(t.tls);
        assert_eq!(t.user, Some(("app".into(), "s@cret".into())));
        assert_eq!(t.endpoints(), ["https://db:2379"]);
        assert!(crate::store::is_etcd_url("ETCD://x") && crate::store::is_etcd_url("etcds://x"));
        assert!(!crate::store::is_etcd_url("redis://x"));
        Ok(())
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for bad in [
            "etcd://",
            "etcd://h:99999",
            "etcd://h:1?db=2",
            "etcd://:pw@h",
            "etcd://a,,b",
            "http://h:2379",
        ] {
            assert!(EtcdTarget::parse(bad).is_err(), "{bad}");
        }
        let e = EtcdTarget::parse("etcd://u:topsecret@h:1?x=1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains("topsecret") && e.contains("***"), "{e}");
    }
}
