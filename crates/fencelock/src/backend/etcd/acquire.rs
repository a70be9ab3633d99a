//! Taking a lock on etcd: a lease of its own, the grant transaction, and the
//! wait for the predecessor (see the parent module for the protocol). The
//! result is the same [`Lease`] as on Redis: same keeper task, loss signal,
//! metrics and release.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use tokio::time::Instant;

use super::Held;
use super::conn::{EtcdConn, is_lease_gone};
use super::keys::holder_key;
use crate::acquire::{Engine, arrived_too_late, new_token};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::lease::Lease;
use crate::metrics::LeaseMetrics;
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::state::{Granted, LeaseState, drift};

/// Pause before sending a failed grant transaction again.
const TXN_RETRY: Duration = Duration::from_millis(20);

/// The lease seconds for `ttl`: whole seconds, rounded up (at least 1).
pub(crate) fn lease_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The fence of a holder key created at `revision`, in the epoch of `opts`.
///
/// # Errors
/// [`Error::UnexpectedReply`] for a revision of 2^53 or more (it would reach
/// into the next epoch).
pub(crate) fn fence_of(revision: i64, opts: &LockOptions) -> Result<Fence> {
    match u64::try_from(revision) {
        Ok(r) if r > 0 && r < FENCE_EPOCH_SIZE => {
            Ok(Fence::new(opts.fence_base(ETCD_DEFAULT_FENCE_EPOCH) + r))
        }
        _ => Err(Error::UnexpectedReply(format!(
            "etcd revision {revision} is not a usable fence (0 < revision < 2^53)"
        ))),
    }
}

/// Revokes a lease when dropped, unless disarmed: an acquisition that ends
/// without the lock (refused, timed out, failed, or its future dropped)
/// leaves no key in the queue.
struct RevokeOnDrop {
    armed: Option<(EtcdConn, i64)>,
}

impl RevokeOnDrop {
    fn disarm(&mut self) {
        self.armed = None;
    }

    /// Revokes now and waits for it (best effort).
    async fn revoke(mut self) {
        if let Some((conn, lease)) = self.armed.take() {
            let _ = conn.lease_revoke(lease).await;
        }
    }
}

impl Drop for RevokeOnDrop {
    fn drop(&mut self) {
        if let Some((conn, lease)) = self.armed.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = conn.lease_revoke(lease).await;
            });
        }
    }
}

/// The lease of one acquisition and until when it is surely alive.
struct OwnLease {
    id: i64,
    /// Local monotonic time before which etcd cannot have expired it: the
    /// send time of the grant or of the last successful keep-alive, plus the
    /// ttl, less the drift margin.
    valid_until: Instant,
    ttl: Duration,
}

impl OwnLease {
    async fn grant(conn: &EtcdConn, ttl: Duration) -> Result<Self> {
        let sent = Instant::now();
        let reply = conn
            .lease_grant(lease_seconds(ttl))
            .await
            .map_err(|e| conn.error(e, "granting a lease"))?;
        Ok(OwnLease {
            id: reply.id(),
            valid_until: valid_until(sent, ttl, reply.ttl()),
            ttl,
        })
    }

    /// One keep-alive: `Ok(false)` when the lease is gone.
    async fn keep_alive(&mut self, conn: &EtcdConn) -> Result<bool> {
        let sent = Instant::now();
        match conn.lease_keep_alive(self.id).await {
            Ok(_) => {
                self.valid_until =
                    self.valid_until
                        .max(valid_until(sent, self.ttl, lease_seconds(self.ttl)));
                Ok(true)
            }
            Err(e) if is_lease_gone(&e) => Ok(false),
            Err(e) => Err(conn.error(e, "keeping the lease alive")),
        }
    }
}

/// The local deadline of a lease whose grant or keep-alive was sent at
/// `sent`: the requested ttl (never more than what etcd granted), less the
/// drift margin.
pub(crate) fn valid_until(sent: Instant, ttl: Duration, granted_secs: i64) -> Instant {
    let granted = Duration::from_secs(u64::try_from(granted_secs).unwrap_or(0));
    let ttl = ttl.min(granted);
    sent + ttl.saturating_sub(drift(ttl))
}

/// What the grant transaction found.
enum Found {
    /// The caller's key is first: granted at this create revision.
    First(i64),
    /// The caller's key waits at this create revision; `predecessor` is the
    /// key just before it, when the transaction read it.
    Queued {
        revision: i64,
        predecessor: Option<String>,
    },
    /// Someone holds or waits (try once): the caller created nothing.
    Refused,
}

/// Takes lock `name` (its keys' prefix is `keys.lock`): once if `wait` is
/// false or the wait is zero, else waiting until the options' deadline.
pub(crate) async fn acquire(
    engine: &Engine,
    conn: &EtcdConn,
    name: &str,
    keys: &LockKeys,
    opts: &LockOptions,
    wait: bool,
) -> Result<Lease> {
    if opts.replication.is_some() {
        return Err(Error::InvalidOption(
            "waiting for replicas is for Redis: etcd commits every grant to a majority of its members before it answers".into(),
        ));
    }
    let wait = wait && !opts.wait_value().is_zero();
    let started = Instant::now();
    // None: a wait too long to add to the clock is a wait forever.
    let give_up = started.checked_add(opts.wait_value());
    let timed_out = || Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    };
    loop {
        // Timing out drops the attempt, which revokes its lease.
        let attempt = Box::pin(attempt(engine, conn, name, keys, opts, wait));
        let outcome = match give_up {
            Some(at) if wait => match tokio::time::timeout_at(at, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => return Err(timed_out()),
            },
            _ => attempt.await,
        };
        match outcome {
            Ok(Some(lease)) => return Ok(lease),
            // The lease expired while waiting (this process stalled, or etcd
            // was out of reach for longer than the ttl): queue again.
            Ok(None) => continue,
            Err(e) if !wait || !e.is_retryable() => return Err(e),
            Err(e) => {
                tracing::debug!(lock = %name, error = %e, "etcd acquisition failed; retrying");
                let retry = Instant::now() + Duration::from_millis(50);
                if give_up.is_some_and(|at| retry >= at) {
                    return Err(match e {
                        Error::GrantTooLate { .. } => timed_out(),
                        other => other,
                    });
                }
                tokio::time::sleep_until(retry).await;
            }
        }
    }
}

/// One lease's attempt: `Ok(None)` if the lease was lost while queued.
async fn attempt(
    engine: &Engine,
    conn: &EtcdConn,
    name: &str,
    keys: &LockKeys,
    opts: &LockOptions,
    wait: bool,
) -> Result<Option<Lease>> {
    let token = new_token();
    let holder = crate::holder::holder_id(&token);
    let mut lease = OwnLease::grant(conn, opts.ttl_value()).await?;
    let mut revoke = RevokeOnDrop {
        armed: Some((conn.clone(), lease.id)),
    };
    let prefix = &keys.lock;
    let key = holder_key(prefix, lease.id);
    // A grant whose reply was lost is sent again with the same lease: it
    // finds the key it created (one key per lease), so retrying is safe.
    let found = loop {
        let sent = if wait {
            queue_txn(conn, prefix, &key, &holder, lease.id).await
        } else {
            try_txn(conn, prefix, &key, &holder, lease.id).await
        };
        match sent {
            Err(e) if e.is_retryable() && Instant::now() + TXN_RETRY < lease.valid_until => {
                tracing::debug!(lock = %name, error = %e, "etcd grant failed; sending it again");
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => break other?,
        }
    };
    let revision = match found {
        Found::First(revision) => revision,
        Found::Refused => {
            revoke.revoke().await;
            tracing::debug!(lock = %name, "contended");
            return Err(Error::Contended {
                name: name.to_owned(),
                remaining: None,
            });
        }
        Found::Queued {
            revision,
            predecessor,
        } => {
            let waited = wait_turn(conn, prefix, &key, revision, predecessor, &mut lease).await?;
            if !waited {
                return Ok(None);
            }
            revision
        }
    };
    let fence = fence_of(revision, opts)?;
    let granted = Granted::on_etcd(
        name,
        key,
        token,
        fence,
        opts,
        Held {
            lease: lease.id,
            revision,
        },
    );
    let state = LeaseState::new(
        engine.lease_backend.clone(),
        granted,
        lease.valid_until,
        LeaseMetrics::new(opts.family_of(name).to_owned(), engine.stats.clone()),
    );
    if arrived_too_late(state.deadline(), opts.ttl_value(), Instant::now()) {
        // The key goes with the lease.
        revoke.revoke().await;
        return Err(Error::GrantTooLate {
            name: name.to_owned(),
            elapsed: opts
                .ttl_value()
                .saturating_sub(state.deadline().saturating_duration_since(Instant::now())),
            ttl: opts.ttl_value(),
        });
    }
    revoke.disarm();
    tracing::debug!(lock = %name, %fence, "acquired");
    debug_assert!(matches!(engine.backend, Backend::Etcd(_)));
    Ok(Some(Lease::start(
        state,
        &engine.keeper,
        opts.renewal_interval(),
        false,
    )))
}

fn first_by_create(prefix: &str) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1)
                .with_keys_only(),
        ),
    )
}

fn put_own(key: &str, holder: &str, lease: i64) -> TxnOp {
    TxnOp::put(key, holder, Some(PutOptions::new().with_lease(lease)))
}

/// Try once: create the key only if nobody holds or waits; if the key
/// exists already (a retried attempt whose reply was lost), it is ours.
async fn try_txn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    holder: &str,
    lease: i64,
) -> Result<Found> {
    let txn = Txn::new()
        .when([Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix()])
        .and_then([put_own(key, holder, lease)])
        .or_else([first_by_create(prefix)]);
    let reply = conn.txn(txn).await.map_err(|e| conn.error(e, "granting"))?;
    if reply.succeeded() {
        return Ok(Found::First(header_revision(reply.header())?));
    }
    let responses = reply.op_responses();
    match first_kv(responses.first()) {
        Some(owner) if owner.key() == key.as_bytes() => Ok(Found::First(owner.create_revision())),
        _ => Ok(Found::Refused),
    }
}

/// Join the queue: create the key unless it exists (one key per lease,
/// however often this is retried), and read the first key and the key just
/// before ours.
async fn queue_txn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    holder: &str,
    lease: i64,
) -> Result<Found> {
    let last_two = TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2)
                .with_keys_only(),
        ),
    );
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            put_own(key, holder, lease),
            first_by_create(prefix),
            last_two,
        ])
        .or_else([TxnOp::get(key, None), first_by_create(prefix)]);
    let reply = conn.txn(txn).await.map_err(|e| conn.error(e, "granting"))?;
    let seen_at = header_revision(reply.header())?;
    let responses = reply.op_responses();
    if reply.succeeded() {
        let owner = first_kv(responses.get(1));
        if owner.is_some_and(|o| o.key() == key.as_bytes()) {
            return Ok(Found::First(seen_at));
        }
        // Newest first: ours, then the one before it.
        let predecessor = match responses.get(2) {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .iter()
                .find(|kv| kv.key() != key.as_bytes())
                .and_then(|kv| kv.key_str().ok())
                .map(str::to_owned),
            _ => None,
        };
        return Ok(Found::Queued {
            revision: seen_at,
            predecessor,
        });
    }
    let Some(own) = first_kv(responses.first()) else {
        return Err(Error::UnexpectedReply(
            "etcd grant: the key the transaction found is gone".into(),
        ));
    };
    let revision = own.create_revision();
    match first_kv(responses.get(1)) {
        Some(owner) if owner.key() == key.as_bytes() => Ok(Found::First(revision)),
        _ => Ok(Found::Queued {
            revision,
            predecessor: None,
        }),
    }
}

/// The first key-value of a range response.
fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<i64> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .ok_or_else(|| Error::UnexpectedReply("etcd reply without a header".into()))
}

/// Waits until no key before ours (create revision `revision`) is left,
/// watching the one just before ours for its deletion, and keeping our lease
/// alive every third of the ttl. `Ok(false)`: our lease or key is gone.
async fn wait_turn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    mut predecessor: Option<String>,
    lease: &mut OwnLease,
) -> Result<bool> {
    let every = (lease.ttl / 3).max(Duration::from_millis(5));
    let mut next_keep_alive = Instant::now() + every;
    loop {
        let watched = match predecessor.take() {
            Some(p) => p,
            None => match look(conn, prefix, key, revision).await? {
                Look::Gone => return Ok(false),
                Look::First => return Ok(true),
                Look::Behind(key) => key,
            },
        };
        // Watch from now, then check that the predecessor is still there: a
        // watch from a past revision would start "unsynced" in etcd, and
        // unsynced watches get their events up to 100 ms late (etcd syncs
        // them in the background), which would slow every hand-over. A
        // deletion after the check comes after the watch's start: seen.
        let mut stream = conn
            .watch(
                watched.as_str(),
                Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
            )
            .await
            .map_err(|e| conn.error(e, "watching the lock"))?;
        match stream.message().await {
            Ok(Some(reply)) if reply.created() && !reply.canceled() => {}
            // Not created: look again.
            _ => continue,
        }
        let still_there = conn
            .get(watched.as_str(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(|e| conn.error(e, "reading the lock's queue"))?
            .count()
            > 0;
        if !still_there {
            continue;
        }
        // Wait for the deletion, keeping the lease alive meanwhile; any end
        // of the watch (deleted, cancelled, compacted, broken) means: look
        // again.
        loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(reply)) if reply.canceled() => break,
                    Ok(Some(reply)) => {
                        if reply
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                },
                () = tokio::time::sleep_until(next_keep_alive) => {
                    match lease.keep_alive(conn).await {
                        Ok(true) => next_keep_alive = Instant::now() + every,
                        Ok(false) => return Ok(false),
                        Err(e) => {
                            if Instant::now() >= lease.valid_until {
                                return Err(e);
                            }
                            next_keep_alive = Instant::now() + every / 4;
                        }
                    }
                }
            }
        }
    }
}

/// Where our key stands.
enum Look {
    /// Our key is gone (our lease expired).
    Gone,
    /// No key before ours: our turn.
    First,
    /// This key is just before ours.
    Behind(String),
}

/// Reads the two newest keys up to our create revision: ours, and the one
/// just before it if any.
///
/// A serializable read (served by the member, without a quorum round) is
/// enough when it shows our own key: it is then a snapshot at a revision at
/// or after our key's creation, and keys created before ours can only
/// disappear, never come back; so "none before ours" in it is true now. A
/// member lagging behind may not show our key yet: then a linearizable read
/// decides.
async fn look(conn: &EtcdConn, prefix: &str, key: &str, revision: i64) -> Result<Look> {
    match read_queue(conn, prefix, key, revision, true).await? {
        Look::Gone => read_queue(conn, prefix, key, revision, false).await,
        seen => Ok(seen),
    }
}

async fn read_queue(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    serializable: bool,
) -> Result<Look> {
    let mut options = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(revision)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_keys_only();
    if serializable {
        options = options.with_serializable();
    }
    let reply = conn
        .get(prefix, Some(options))
        .await
        .map_err(|e| conn.error(e, "reading the lock's queue"))?;
    let kvs = reply.kvs();
    match kvs.first() {
        Some(own) if own.key() == key.as_bytes() && own.create_revision() == revision => {}
        _ => return Ok(Look::Gone),
    }
    Ok(match kvs.get(1).and_then(|kv| kv.key_str().ok()) {
        Some(before) => Look::Behind(before.to_owned()),
        None => Look::First,
    })
}

/// The grant transaction alone, for tests: returns the key's create
/// revision and the number of keys under the lock's prefix.
#[cfg(feature = "testing")]
pub(crate) async fn grant_txn_for_tests(
    conn: &EtcdConn,
    prefix: &str,
    lease: i64,
) -> Result<(i64, usize)> {
    let key = holder_key(prefix, lease);
    let revision = match queue_txn(conn, prefix, &key, "test", lease).await? {
        Found::First(r) | Found::Queued { revision: r, .. } => r,
        Found::Refused => 0,
    };
    let count = conn
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .map_err(|e| conn.error(e, "counting"))?
        .count();
    Ok((revision, usize::try_from(count).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_whole_seconds_rounded_up() {
        assert_eq!(lease_seconds(Duration::from_millis(10)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn the_local_deadline_never_exceeds_what_etcd_granted() {
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        assert_eq!(valid_until(now, ttl, 10), now + ttl - drift(ttl));
        // etcd may raise a short lease to its minimum: the local deadline
        // keeps the requested ttl.
        let short = Duration::from_millis(500);
        assert_eq!(valid_until(now, short, 2), now + short - drift(short));
        // A lease shorter than asked (never granted by etcd) would shorten it.
        assert_eq!(
            valid_until(now, ttl, 5),
            now + Duration::from_secs(5) - drift(Duration::from_secs(5))
        );
    }

    #[test]
    fn fences_are_revisions_in_their_epoch() -> Result<()> {
        let opts = LockOptions::default();
        assert_eq!(fence_of(7, &opts)?.get(), FENCE_EPOCH_SIZE + 7);
        assert_eq!(fence_of(7, &opts.clone().fence_epoch(0))?.get(), 7);
        assert!(fence_of(0, &opts).is_err());
        assert!(fence_of(1 << 53, &opts).is_err());
        Ok(())
    }
}
