//! The grant transactions on etcd (the recipe that sends them is
//! `engine/etcd/acquire.rs`):
//! create the holder's key, attached to its lease, unless it exists, and
//! read who is first — once (`try_txn`: only if nobody holds or waits) or
//! queueing (`queue_txn`: and the key just before ours). A retried
//! transaction finds the key it created: one key per acquisition, however
//! often it is sent. `attach` moves a waiter's key from its short waiter lease to
//! the holder's lease once it is first.
//!
//! **A mutex never meets a semaphore or a read-write lock on one name.** A
//! semaphore's keys live under the name's `sem/`, a read-write lock's
//! under its `rw/` (`keys.rs`); a transaction that creates a mutex's key
//! makes sure none is there, at the lowest cost found for each:
//!
//! - `try_txn` already compares that the name has no key at all, and on a
//!   refusal reads the first key: another kind's key there is the conflict,
//!   told at no cost (the kinds never coexist, so when another kind holds
//!   the name, its keys are the only ones);
//! - `queue_txn` adds two compares, "no key under `sem/`" and "none under
//!   `rw/`": range lookups in etcd's in-memory index that find nothing in
//!   the common case, inside the transaction it sends anyway (no round
//!   trip, no Raft entry more). A marker key set by the other kinds would
//!   make each compare a single-key one, but it would need its own
//!   lifetime (whose lease? deleted by whom when its holders die?); the
//!   ranges have none: each is empty exactly when no key of its kind is
//!   left. On a refusal it counts the keys under `rw/` to tell which kind
//!   is in the way;
//! - `try_or_queue_txn` puts the same compares on its queueing branch, as
//!   a nested transaction (the free-lock branch compares "no key at all").

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use super::conn::EtcdConn;
use super::errors::is_lease_gone;
use super::keys::{KeyKind, RWLOCK_PART, SEMAPHORE_PART, key_kind};
use crate::error::{Error, Result};
use crate::options::{Access, Primitive};

/// The lease seconds for `ttl`: whole seconds, rounded up (at least 1).
pub(crate) fn lease_seconds(ttl: Duration) -> i64 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// What the grant transaction found.
pub(crate) enum Found {
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
    /// The name is held (or waited for) as another kind of lock, named as
    /// [`crate::Error::KindConflict`] names it: the caller created nothing
    /// (a key an earlier send created would have kept the other kind out).
    OtherKind(&'static str),
    /// The lease the key was to live on is gone (expired or revoked): this
    /// transaction wrote nothing. An earlier send of it whose reply was
    /// lost may have created the key, on a lease that lives
    /// (`try_or_queue_txn`: on the holder's, then the waiter's is gone): the
    /// caller deletes it.
    LeaseGone,
}

pub(super) fn first_by_create(prefix: &str) -> TxnOp {
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

/// The kind of lock `key` (the first key by create revision under
/// `prefix`) belongs to, if not a mutex.
fn other_kind(prefix: &str, key: &[u8]) -> Option<&'static str> {
    match key_kind(prefix, key) {
        None | Some(KeyKind::Mutex) => None,
        Some(kind) => Some(kind.lock_kind()),
    }
}

/// No key of another kind under the name: none under `prefix` + `sem/`,
/// none under `prefix` + `rw/`.
fn no_other_kind(prefix: &str) -> [Compare; 2] {
    [SEMAPHORE_PART, RWLOCK_PART].map(|part| {
        Compare::create_revision(format!("{prefix}{part}"), CompareOp::Equal, 0).with_prefix()
    })
}

/// How many keys lie under the name's `rw/` (a refusal's read: none means
/// a semaphore is in the way).
fn count_rwlock(prefix: &str) -> TxnOp {
    TxnOp::get(
        format!("{prefix}{RWLOCK_PART}"),
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
}

/// The kind in the way of a mutex, from `count_rwlock`'s reply: a
/// read-write lock if it has keys, else a semaphore.
fn kind_in_the_way(count: Option<&TxnOpResponse>) -> &'static str {
    match count {
        Some(TxnOpResponse::Get(get)) if get.count() > 0 => Primitive::RwLock(Access::Write).kind(),
        _ => Primitive::Semaphore(1).kind(),
    }
}

fn put_own(key: &str, holder: &str, lease: i64) -> TxnOp {
    TxnOp::put(key, holder, Some(PutOptions::new().with_lease(lease)))
}

/// Try once: create the key only if nobody holds or waits; if the key
/// exists already (a retried attempt whose reply was lost), it is ours.
pub(crate) async fn try_txn(
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
    let reply = match conn.txn(txn).await {
        Ok(reply) => reply,
        Err(e) if is_lease_gone(&e) => return Ok(Found::LeaseGone),
        Err(e) => return Err(conn.error(e, "granting")),
    };
    if reply.succeeded() {
        return Ok(Found::First(header_revision(reply.header())?));
    }
    let responses = reply.op_responses();
    match first_kv(responses.first()) {
        Some(owner) if owner.key() == key.as_bytes() => Ok(Found::First(owner.create_revision())),
        Some(owner) => Ok(other_kind(prefix, owner.key()).map_or(Found::Refused, Found::OtherKind)),
        None => Ok(Found::Refused),
    }
}

/// Join the queue: create the key unless it exists (one key per acquisition,
/// however often this is retried), and read the first key and the key just
/// before ours.
pub(crate) async fn queue_txn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    holder: &str,
    lease: i64,
) -> Result<Found> {
    let [no_semaphore, no_rwlock] = no_other_kind(prefix);
    let txn = Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, 0),
            no_semaphore,
            no_rwlock,
        ])
        .and_then([
            put_own(key, holder, lease),
            first_by_create(prefix),
            last_two(prefix),
        ])
        .or_else([
            TxnOp::get(key, None),
            first_by_create(prefix),
            count_rwlock(prefix),
        ]);
    let reply = match conn.txn(txn).await {
        Ok(reply) => reply,
        Err(e) if is_lease_gone(&e) => return Ok(Found::LeaseGone),
        Err(e) => return Err(conn.error(e, "granting")),
    };
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
        // Our key is not there, so it is another kind's compare that failed.
        return Ok(Found::OtherKind(kind_in_the_way(responses.get(2))));
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

/// Try, else queue, in one transaction (a waiter whose key waits on a
/// shorter lease than its lock's): create `key` on the holder's `lease` if
/// nobody holds or waits; else put it on the `waiter` lease (a put keeps
/// the create revision of a key a retried transaction created before) and
/// read it, the first key and the two newest. Returns what it found and
/// whether the key is on the waiter lease.
pub(crate) async fn try_or_queue_txn(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    holder: &str,
    lease: i64,
    waiter: i64,
) -> Result<(Found, bool)> {
    // Queueing, unless another kind holds the name (a key of ours an
    // earlier send created would have kept it out, so the nested compares
    // fail only when nothing of ours is there).
    let queue = Txn::new()
        .when(no_other_kind(prefix))
        .and_then([
            put_own(key, holder, waiter),
            TxnOp::get(key, None),
            first_by_create(prefix),
            last_two(prefix),
        ])
        .or_else([count_rwlock(prefix)]);
    let txn = Txn::new()
        .when([Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix()])
        .and_then([put_own(key, holder, lease)])
        .or_else([TxnOp::txn(queue)]);
    let reply = match conn.txn(txn).await {
        Ok(reply) => reply,
        Err(e) if is_lease_gone(&e) => return Ok((Found::LeaseGone, false)),
        Err(e) => return Err(conn.error(e, "granting")),
    };
    if reply.succeeded() {
        return Ok((Found::First(header_revision(reply.header())?), false));
    }
    let queued = match reply.op_responses().into_iter().next() {
        Some(TxnOpResponse::Txn(queued)) => queued,
        _ => {
            return Err(Error::UnexpectedReply(
                "etcd grant: the queueing branch did not answer".into(),
            ));
        }
    };
    if !queued.succeeded() {
        let in_the_way = kind_in_the_way(queued.op_responses().first());
        return Ok((Found::OtherKind(in_the_way), false));
    }
    let responses = queued.op_responses();
    let Some(own) = first_kv(responses.get(1)) else {
        return Err(Error::UnexpectedReply(
            "etcd grant: the key the transaction wrote is gone".into(),
        ));
    };
    let revision = own.create_revision();
    if first_kv(responses.get(2)).is_some_and(|o| o.key() == key.as_bytes()) {
        return Ok((Found::First(revision), true));
    }
    Ok((
        Found::Queued {
            revision,
            predecessor: predecessor_of(responses.get(3), key, revision),
        },
        true,
    ))
}

/// The two newest keys under `prefix` by create revision.
fn last_two(prefix: &str) -> TxnOp {
    TxnOp::get(
        prefix,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2)
                .with_keys_only(),
        ),
    )
}

/// The key just before ours in `newest` (the two newest keys), when ours
/// (created at `revision`) is the newest; else unknown (the waiter reads
/// the queue).
fn predecessor_of(newest: Option<&TxnOpResponse>, key: &str, revision: i64) -> Option<String> {
    let Some(TxnOpResponse::Get(get)) = newest else {
        return None;
    };
    let kvs = get.kvs();
    let ours_newest = kvs
        .first()
        .is_some_and(|kv| kv.key() == key.as_bytes() && kv.create_revision() == revision);
    if !ours_newest {
        return None;
    }
    kvs.get(1)
        .and_then(|kv| kv.key_str().ok())
        .map(str::to_owned)
}

/// Attaches `key` to `lease` (the holder's, once a waiter is first), if
/// it still has create revision `revision`: a put keeps the key's create
/// revision, so its place in the queue and its fence stay; watchers of its
/// deletion ignore puts. `Ok(false)`: the key is gone, or the lease is
/// (the caller then queues again, on a lease that lives).
pub(crate) async fn attach(
    conn: &EtcdConn,
    key: &str,
    revision: i64,
    holder: &str,
    lease: i64,
) -> Result<bool> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([put_own(key, holder, lease)]);
    match conn.txn(txn).await {
        Ok(reply) => Ok(reply.succeeded()),
        Err(e) if is_lease_gone(&e) => Ok(false),
        Err(e) => Err(conn.error(e, "moving the key to the holder's lease")),
    }
}

/// The first key-value of a range response.
pub(super) fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

pub(super) fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<i64> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .ok_or_else(|| Error::UnexpectedReply("etcd reply without a header".into()))
}

/// The grant transaction alone, for tests: returns the key's create
/// revision and the number of keys under the lock's prefix.
#[cfg(feature = "testing")]
pub(crate) async fn grant_txn_for_tests(
    conn: &EtcdConn,
    prefix: &str,
    lease: i64,
) -> Result<(i64, usize)> {
    let key = super::keys::holder_key(prefix, lease, 1);
    let revision = match queue_txn(conn, prefix, &key, "test", lease).await? {
        Found::First(r) | Found::Queued { revision: r, .. } => r,
        Found::Refused | Found::OtherKind(_) | Found::LeaseGone => 0,
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
        assert_eq!(lease_seconds(Duration::MAX), i64::MAX);
    }
}
