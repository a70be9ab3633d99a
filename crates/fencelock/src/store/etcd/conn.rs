//! [`EtcdConn`]: one etcd cluster behind one URL (parsed in `target.rs`;
//! its errors as fencelock's in `errors.rs`).
//!
//! `etcd://[user:password@]host[:port][,host[:port]…][?prefix=NAMESPACE/]`
//! (`etcds://` for TLS, with the same CA and client certificate settings as
//! `rediss://`). The port defaults to 2379. `prefix` is a namespace put in
//! front of every key the client touches (locks and fenced keys), like
//! `etcdctl`'s namespaces; it must end with `/` (`check_key_space`). Every request needs a leader (a member cut off
//! from the quorum fails fast instead of hanging).
//!
//! **Members that do not answer are skipped.** The connection keeps a
//! client per listed member and sends each request to one member: the
//! leader, once found (`find_leader`: a write sent to a follower is
//! forwarded, a hop more). A member
//! that fails it (refused, reset, no leader) or does not answer within
//! [`MEMBER_TIMEOUT`] (paused, a dead host whose packets vanish) is set
//! aside for [`SET_ASIDE`] and the request goes to the next member, so a
//! paused member costs one member timeout per connection and period, not a
//! response timeout per request. A request that may have been applied is
//! sent again only when sending it twice is harmless (reads, keep-alives,
//! the grant and release transactions, which find their own key); a fenced
//! write is not.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmResponse, AlarmType, Certificate, Client, ConnectOptions, DeleteOptions,
    DeleteResponse, GetOptions, GetResponse, Identity, LeaseGrantResponse, LeaseRevokeResponse,
    LeaseTimeToLiveResponse, StatusResponse, TlsOptions, Txn, TxnResponse, WatchOptions,
    WatchStream,
};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::errors::{connect_error, is_transient, map_error, never_sent};
use super::target::EtcdTarget;
use crate::error::{Error, Result};
use crate::store::ConnSettings;
use crate::store::tls::{self, TlsFiles};
use crate::store::url::redact;

/// HTTP/2 keep-alive pings: a connection whose member stopped answering is
/// dropped after this long without a reply, so requests move to the others.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// How long one member has to answer a request while other members are
/// left to try (the last one gets what is left of the response timeout).
/// etcd answers in milliseconds when it has a quorum; a commit slowed by
/// the disk is sent again only where that is harmless.
pub(crate) const MEMBER_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a member that failed a request is tried only after the others.
const SET_ASIDE: Duration = Duration::from_secs(5);

/// How often the leader is looked for again while requests succeed (a
/// leader moved away from a member that still answers, by forwarding, is
/// found within this).
const LEADER_RECHECK: Duration = Duration::from_secs(5);

/// Whether a request that may have reached a member can be sent again to
/// another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Sending it twice is harmless.
    Safe,
    /// Only if it surely never left (the connection was refused).
    IfNeverSent,
}

/// A connection to one etcd cluster: a client per listed member.
/// Cheap to clone (and small: the clients themselves are shared).
#[derive(Clone)]
pub(crate) struct EtcdConn {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    members: Vec<Member>,
    /// The member tried first: the leader once it is known, else the last
    /// one that answered.
    preferred: AtomicUsize,
    /// A search for the leader is running.
    finding_leader: AtomicBool,
    /// When the last search for the leader started.
    leader_sought: Mutex<Option<Instant>>,
    /// The URL without its password, for messages.
    url: String,
    /// The URL as given, to scrub client errors of its password.
    raw_url: String,
    target: EtcdTarget,
    options: ConnectOptions,
    /// The response timeout: what one request may take, all members
    /// together.
    response_timeout: Duration,
    /// Faults a test injects (feature `testing`).
    #[cfg(feature = "testing")]
    faults: TestFaults,
}

/// Faults a test injects into one connection (feature `testing`): a
/// transaction's reply held back (and lost), a member serving serializable
/// reads from the past.
#[cfg(feature = "testing")]
#[derive(Default)]
struct TestFaults {
    /// The next transaction's reply is held back until this completes
    /// (sent or dropped); `true`: it is then lost (a transient error).
    held_reply: Mutex<Option<(tokio::sync::oneshot::Receiver<()>, bool)>>,
    /// Serializable reads are served as of this revision (0: current).
    stale_reads_at: std::sync::atomic::AtomicI64,
}

/// One listed member: its client, made at first use (with credentials,
/// making it is a request), and until when it is set aside.
struct Member {
    endpoint: String,
    client: OnceCell<Client>,
    set_aside_until: Mutex<Option<Instant>>,
}

impl Member {
    fn is_set_aside(&self, now: Instant) -> bool {
        self.set_aside_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|until| until > now)
    }

    fn set_aside(&self) {
        *self
            .set_aside_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now() + SET_ASIDE);
    }

    fn restore(&self) {
        *self
            .set_aside_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
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
        let members = target
            .endpoints()
            .into_iter()
            .map(|endpoint| Member {
                endpoint,
                client: OnceCell::new(),
                set_aside_until: Mutex::new(None),
            })
            .collect::<Vec<_>>();
        // Spread the clients of a cluster over its members until the
        // leader is known.
        let preferred = rand::random_range(0..members.len().max(1));
        let conn = EtcdConn {
            inner: std::sync::Arc::new(Inner {
                members,
                preferred: AtomicUsize::new(preferred),
                finding_leader: AtomicBool::new(false),
                leader_sought: Mutex::new(None),
                url: shown,
                raw_url: url.to_owned(),
                target,
                options,
                response_timeout: settings.response_timeout,
                #[cfg(feature = "testing")]
                faults: TestFaults::default(),
            }),
        };
        // Any member answering is enough.
        let status = conn
            .status()
            .await
            .map_err(|e| connect_error(&conn.inner.url, url, e, hint))?;
        if status.header().map(|h| h.member_id()) == Some(status.leader()) {
            // The member that answered is the leader (and preferred).
            *conn
                .inner
                .leader_sought
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        } else {
            conn.find_leader();
        }
        Ok(conn)
    }

    /// Makes the leader the member tried first, in the background: every
    /// write is the leader's to commit, and one sent to a follower is
    /// forwarded to it, a hop more for each grant and release. Each member
    /// is asked who it is (`Status`, within [`MEMBER_TIMEOUT`]); the one
    /// that is the leader it reports is preferred. Started at connect,
    /// whenever a request had to move to another member, and every
    /// [`LEADER_RECHECK`] while requests are sent (the leader may have
    /// changed); one search at a time.
    fn find_leader(&self) {
        if self.inner.members.len() < 2
            || self.inner.finding_leader.swap(true, Ordering::AcqRel)
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        *self
            .inner
            .leader_sought
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        let conn = self.clone();
        tokio::spawn(async move {
            let asked = conn
                .inner
                .members
                .iter()
                .enumerate()
                .map(|(index, member)| {
                    let conn = &conn;
                    async move {
                        let status = tokio::time::timeout(MEMBER_TIMEOUT, async {
                            conn.client(member).await?.status().await
                        })
                        .await
                        .ok()?
                        .ok()?;
                        let id = status.header()?.member_id();
                        Some((index, id, status.leader()))
                    }
                });
            let answers: Vec<(usize, u64, u64)> = futures_util::future::join_all(asked)
                .await
                .into_iter()
                .flatten()
                .collect();
            if let Some((index, _, _)) = answers
                .iter()
                .find(|(_, id, _)| answers.iter().any(|(_, _, leader)| leader == id))
            {
                conn.inner.preferred.store(*index, Ordering::Relaxed);
            }
            conn.inner.finding_leader.store(false, Ordering::Release);
        });
    }

    /// The URL, without its password.
    pub(crate) fn url(&self) -> &str {
        &self.inner.url
    }

    /// The namespace every key starts with (`?prefix=`, empty by default).
    pub(crate) fn namespace(&self) -> &str {
        &self.inner.target.namespace
    }

    /// Runs one request on one member, and on the next if that member
    /// fails it or does not answer within [`MEMBER_TIMEOUT`] (see the
    /// module's docs); `resend` says whether a request that may have been
    /// applied can be sent again. All attempts together take at most the
    /// response timeout.
    async fn call<T, F, Fut>(
        &self,
        resend: Resend,
        mut request: F,
    ) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let members = &self.inner.members;
        let now = Instant::now();
        let give_up = now + self.inner.response_timeout;
        let recheck = self
            .inner
            .leader_sought
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|at| now.saturating_duration_since(at) >= LEADER_RECHECK);
        if recheck {
            self.find_leader();
        }
        let order = self.order();
        let mut last = None;
        for (tried, &index) in order.iter().enumerate() {
            let member = &members[index];
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let others_left = tried + 1 < order.len();
            let limit = if others_left {
                left.min(MEMBER_TIMEOUT)
            } else {
                left
            };
            let attempt = async {
                let client = self.client(member).await?;
                request(client).await
            };
            let outcome = match tokio::time::timeout(limit, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Err(no_answer(&member.endpoint, limit)),
            };
            match outcome {
                Ok(reply) => {
                    member.restore();
                    if tried > 0 {
                        // The preferred member failed: answer from this
                        // one meanwhile, and look for the leader again.
                        self.inner.preferred.store(index, Ordering::Relaxed);
                        self.find_leader();
                    }
                    return Ok(reply);
                }
                Err(e) if is_transient(&e) => {
                    tracing::debug!(member = %member.endpoint, error = %e, "etcd member failed a request; setting it aside");
                    member.set_aside();
                    let again = resend == Resend::Safe || never_sent(&e);
                    if !again {
                        return Err(e);
                    }
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| no_answer(&self.inner.url, self.inner.response_timeout)))
    }

    /// The members in the order to try them: the preferred one first, then
    /// the others in the URL's order; members set aside after all of them.
    fn order(&self) -> Vec<usize> {
        let members = &self.inner.members;
        let n = members.len();
        let first = self.inner.preferred.load(Ordering::Relaxed) % n.max(1);
        let now = Instant::now();
        let (mut ready, aside): (Vec<usize>, Vec<usize>) = (0..n)
            .map(|i| (first + i) % n)
            .partition(|&i| !members[i].is_set_aside(now));
        ready.extend(aside);
        ready
    }

    /// The client of `member`, made now if this is its first request.
    async fn client(&self, member: &Member) -> std::result::Result<Client, etcd_client::Error> {
        member
            .client
            .get_or_try_init(|| {
                Client::connect([member.endpoint.as_str()], Some(self.inner.options.clone()))
            })
            .await
            .cloned()
    }

    /// `Status` of a member (the first that answers).
    pub(crate) async fn status(&self) -> std::result::Result<StatusResponse, etcd_client::Error> {
        self.call(Resend::Safe, |mut c| async move { c.status().await })
            .await
    }

    /// A range read (`Get`).
    pub(crate) async fn get(
        &self,
        key: &str,
        options: Option<GetOptions>,
    ) -> std::result::Result<GetResponse, etcd_client::Error> {
        self.call(Resend::Safe, |mut c| {
            let options = options.clone();
            async move { c.get(key, options).await }
        })
        .await
    }

    /// A transaction that may be sent twice (another member gets it if the
    /// first does not answer): the grant and release transactions, which
    /// find their own key again.
    pub(crate) async fn txn(
        &self,
        txn: Txn,
    ) -> std::result::Result<TxnResponse, etcd_client::Error> {
        let reply = self
            .call(Resend::Safe, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await;
        #[cfg(feature = "testing")]
        let reply = self.held_reply(reply).await;
        reply
    }

    /// Makes the reply of the next [`EtcdConn::txn`] wait until `until`
    /// completes (sent or dropped); with `lose`, the reply is then lost:
    /// the transaction was applied, and the caller gets a transient error
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub(crate) fn hold_next_reply(&self, until: tokio::sync::oneshot::Receiver<()>, lose: bool) {
        *self
            .inner
            .faults
            .held_reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((until, lose));
    }

    /// `reply`, held back (and lost) if [`EtcdConn::hold_next_reply`] said so.
    #[cfg(feature = "testing")]
    async fn held_reply(
        &self,
        reply: std::result::Result<TxnResponse, etcd_client::Error>,
    ) -> std::result::Result<TxnResponse, etcd_client::Error> {
        let held = self
            .inner
            .faults
            .held_reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some((until, lose)) = held else {
            return reply;
        };
        let _ = until.await;
        if lose {
            return Err(no_answer(&self.inner.url, self.inner.response_timeout));
        }
        reply
    }

    /// Serves serializable reads as of `revision` (`None`: as they come),
    /// as a member that has applied nothing after it would (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub(crate) fn serve_stale_reads(&self, revision: Option<i64>) {
        self.inner
            .faults
            .stale_reads_at
            .store(revision.unwrap_or(0), Ordering::Relaxed);
    }

    /// `options` of a serializable read, as of the revision
    /// [`EtcdConn::serve_stale_reads`] set, if any (feature `testing`).
    #[cfg(feature = "testing")]
    pub(crate) fn stale(&self, options: GetOptions) -> GetOptions {
        match self.inner.faults.stale_reads_at.load(Ordering::Relaxed) {
            0 => options,
            revision => options.with_revision(revision),
        }
    }

    /// A transaction sent to one member only, unless it surely never left:
    /// a write whose second application could differ from the first (a
    /// read-modify-write that compares a revision).
    pub(crate) async fn txn_once(
        &self,
        txn: Txn,
    ) -> std::result::Result<TxnResponse, etcd_client::Error> {
        self.call(Resend::IfNeverSent, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Deletes one key.
    pub(crate) async fn delete(
        &self,
        key: &str,
    ) -> std::result::Result<DeleteResponse, etcd_client::Error> {
        self.call(
            Resend::Safe,
            |mut c| async move { c.delete(key, None).await },
        )
        .await
    }

    /// Deletes every key that starts with `prefix` (namespace included).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) async fn delete_prefix(
        &self,
        prefix: &str,
    ) -> std::result::Result<DeleteResponse, etcd_client::Error> {
        self.call(Resend::Safe, |mut c| async move {
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
        self.call(Resend::Safe, |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await
    }

    /// Revokes a lease (and deletes its keys).
    pub(crate) async fn lease_revoke(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseRevokeResponse, etcd_client::Error> {
        self.call(
            Resend::Safe,
            |mut c| async move { c.lease_revoke(id).await },
        )
        .await
    }

    /// One keep-alive of a lease (a stream opened and closed: one round
    /// trip).
    pub(crate) async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> std::result::Result<(), etcd_client::Error> {
        self.call(Resend::Safe, |mut c| async move {
            c.lease_keep_alive(id).await.map(drop)
        })
        .await
    }

    /// A lease's time to live.
    pub(crate) async fn lease_time_to_live(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseTimeToLiveResponse, etcd_client::Error> {
        self.call(Resend::Safe, |mut c| async move {
            c.lease_time_to_live(id, None).await
        })
        .await
    }

    /// Opens a watch.
    pub(crate) async fn watch(
        &self,
        key: &str,
        options: Option<WatchOptions>,
    ) -> std::result::Result<WatchStream, etcd_client::Error> {
        self.call(Resend::Safe, |mut c| {
            let options = options.clone();
            async move { c.watch(key, options).await }
        })
        .await
    }

    /// The raised alarms.
    pub(crate) async fn alarms(&self) -> std::result::Result<AlarmResponse, etcd_client::Error> {
        self.call(Resend::Safe, |mut c| async move {
            c.alarm(AlarmAction::Get, AlarmType::None, None).await
        })
        .await
    }

    /// The client endpoints the URL lists.
    pub(crate) fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.inner.members.iter().map(|m| m.endpoint.as_str())
    }

    /// A client of the member at `endpoint` alone, for the audit: one that
    /// does not require a leader, so a member cut off from the quorum still
    /// answers what it knows (no leader) instead of refusing.
    pub(crate) async fn member(&self, endpoint: &str) -> Result<Client> {
        let options = self.inner.options.clone().with_require_leader(false);
        Client::connect([endpoint], Some(options))
            .await
            .map_err(|e| self.error(e, &format!("connecting to the member at {endpoint}")))
    }

    /// etcd's error `e`, met while `doing` something, as a fencelock error.
    pub(crate) fn error(&self, e: etcd_client::Error, doing: &str) -> Error {
        map_error(&self.inner.url, &self.inner.raw_url, e, doing)
    }
}

/// The error of a member (or of all) that did not answer within `limit`.
fn no_answer(endpoint: &str, limit: Duration) -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(format!(
        "no answer from {endpoint} within {limit:?}"
    )))
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
