//! [`EtcdConn`]: one etcd cluster behind one URL (parsed in `target.rs`;
//! its errors as fencelock's in `errors.rs`).
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

use super::errors::{connect_error, is_transient, map_error, never_sent};
use super::target::EtcdTarget;
use crate::error::{Error, Result};
use crate::store::ConnSettings;
use crate::store::tls::{self, TlsFiles};
use crate::store::url::redact;

/// HTTP/2 keep-alive pings: a connection whose member stopped answering is
/// dropped after this long without a reply, so requests move to the others.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

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
            options = options.with_tls(tls_options(&settings.tls, &redact(url))?);
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

/// The CA and client certificate of `files` for tonic (read and checked as
/// for Redis, errors naming `shown`).
fn tls_options(files: &TlsFiles, shown: &str) -> Result<TlsOptions> {
    let pems = files.read(shown)?;
    let mut options = match pems.ca {
        Some(ca) => TlsOptions::new().ca_certificate(Certificate::from_pem(ca)),
        None => TlsOptions::new().with_native_roots(),
    };
    if let Some((cert, key)) = pems.client {
        options = options.identity(Identity::from_pem(cert, key));
    }
    Ok(options)
}
