//! A read-write lock's transactions on etcd (the recipe that sends them is
//! `engine/etcd/rwlock.rs`; the key layout, `rw/r/LEASE/ACQ` and
//! `rw/w/LEASE/ACQ` under the name, is in `keys.rs`): join (create the
//! acquisition's key, granted at once if nothing is in its way), look
//! (is anything still in the way of a key, which must still exist), the
//! holders for `inspect`, and a revoke's deletion of every key.
//!
//! What is "in the way", by create revision (the order of the queue):
//!
//! - of a **writer**, any key of the lock older than its own;
//! - of a **reader**, any writer's key older than its own.
//!
//! Every transaction that creates a key compares that the name has no key
//! outside `rw/` (two range compares, below and above it), so a reader's
//! or writer's key is never created beside a mutex's or a semaphore's; on
//! failure it reads the first key on each side, which tells the kind in
//! the way. The mutex's and the semaphore's grants compare the other way
//! round (`grant.rs`, `semaphore.rs`).

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse,
};

use super::conn::EtcdConn;
use super::errors::is_lease_gone;
use super::grant::header_revision;
use super::keys::{KeyKind, RwKeys, key_kind, prefix_end};
use super::queue::Look;
use super::semaphore::Foreign;
use crate::error::{Error, Result};
use crate::options::Access;

/// Where a key stands, as the transaction that placed it saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Nothing is in its way: granted.
    First,
    /// This key (the newest in its way) is in its way.
    Behind(String),
    /// Not told (a resent transaction, whose key is not the newest): look.
    Unknown,
}

/// What the join transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Joined {
    /// The key exists at `revision` (created by this send or an earlier
    /// one); `queued`: it is on the queueing lease (the key was not
    /// granted at once by this send).
    Placed {
        revision: i64,
        standing: Standing,
        queued: bool,
    },
    /// Trying once, something was in the way: nothing was created.
    Refused,
    /// Another kind holds the name: nothing was created.
    OtherKind(Foreign),
    /// The lease the key was to live on is gone: nothing was written.
    LeaseGone,
}

/// No key of the name outside `rw/`: none of a mutex, none of a semaphore
/// (two range compares, below and above the read-write lock's range).
fn no_other_kind(keys: &RwKeys) -> [Compare; 2] {
    [
        Compare::create_revision(keys.lock(), CompareOp::Equal, 0).with_range(keys.base()),
        Compare::create_revision(prefix_end(keys.base()), CompareOp::Equal, 0)
            .with_range(prefix_end(keys.lock())),
    ]
}

/// The first key on each side of the read-write lock's range: what is in
/// the way when `no_other_kind` fails.
fn read_other_kinds(keys: &RwKeys) -> [TxnOp; 2] {
    let first = |from: Vec<u8>, to: Vec<u8>| {
        TxnOp::get(
            from,
            Some(
                GetOptions::new()
                    .with_range(to)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        )
    };
    [
        first(
            keys.lock().as_bytes().to_vec(),
            keys.base().as_bytes().to_vec(),
        ),
        first(prefix_end(keys.base()), prefix_end(keys.lock())),
    ]
}

/// The kind of the first of `kvs`, keys of lock `keys` outside `rw/`.
fn foreign_in(keys: &RwKeys, kvs: &[&KeyValue]) -> Option<Foreign> {
    let kv = kvs.first()?;
    Some(match key_kind(keys.lock(), kv.key())? {
        KeyKind::Mutex => Foreign::Mutex,
        KeyKind::Slot { permits, .. } | KeyKind::Waiter { permits } => Foreign::Permits(permits),
        KeyKind::Malformed | KeyKind::Reader | KeyKind::Writer | KeyKind::RwMalformed => {
            Foreign::Malformed(String::from_utf8_lossy(kv.key()).into_owned())
        }
    })
}

/// Nothing in the way of a new key of `access`: no key of the lock at all
/// for a writer, no writer's key for a reader.
fn nothing_ahead(keys: &RwKeys, access: Access) -> Compare {
    Compare::create_revision(keys.ahead_of(access), CompareOp::Equal, 0).with_prefix()
}

/// The newest keys in the way of an acquisition of `access` (two for a
/// writer, whose own key is among them; one writer's for a reader), newest
/// first.
fn newest_ahead(keys: &RwKeys, access: Access) -> TxnOp {
    let limit = match access {
        Access::Read => 1,
        Access::Write => 2,
    };
    TxnOp::get(
        keys.ahead_of(access),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(limit)
                .with_keys_only(),
        ),
    )
}

/// Puts `key` with the holder id `holder` on `lease`.
fn put_on(key: &str, holder: &str, lease: i64) -> TxnOp {
    TxnOp::put(key, holder, Some(PutOptions::new().with_lease(lease)))
}

/// Joins the read-write lock with `key`, an acquisition of `access`: one
/// transaction that creates the key on `lease` if nothing is in its way
/// (granted at once) and no other kind holds the name; else, with
/// `queue_on`, puts it on that lease (a put keeps the create revision of a
/// key an earlier send created) and reads where it stands; without it
/// (trying once) creates nothing, but finds a key an earlier send created.
pub(crate) async fn join(
    conn: &EtcdConn,
    keys: &RwKeys,
    (key, access): (&str, Access),
    holder: &str,
    lease: i64,
    queue_on: Option<i64>,
) -> Result<Joined> {
    let [below, above] = no_other_kind(keys);
    let mut placing = Vec::new();
    if let Some(queue) = queue_on {
        placing.push(put_on(key, holder, queue));
    }
    placing.extend([TxnOp::get(key, None), newest_ahead(keys, access)]);
    let place = Txn::new()
        .when(no_other_kind(keys))
        .and_then(placing)
        .or_else(read_other_kinds(keys));
    let txn = Txn::new()
        .when([
            below,
            above,
            Compare::create_revision(key, CompareOp::Equal, 0),
            nothing_ahead(keys, access),
        ])
        .and_then([put_on(key, holder, lease)])
        .or_else([TxnOp::txn(place)]);
    let reply = match conn.txn(txn).await {
        Ok(reply) => reply,
        Err(e) if is_lease_gone(&e) => return Ok(Joined::LeaseGone),
        Err(e) => return Err(conn.error(e, "joining the read-write lock")),
    };
    if reply.succeeded() {
        return Ok(Joined::Placed {
            revision: header_revision(reply.header())?,
            standing: Standing::First,
            queued: false,
        });
    }
    let Some(TxnOpResponse::Txn(placed)) = reply.op_responses().into_iter().next() else {
        return Err(Error::UnexpectedReply(
            "etcd read-write lock: the queueing branch did not answer".into(),
        ));
    };
    let responses = placed.op_responses();
    if !placed.succeeded() {
        let kvs: Vec<&KeyValue> = responses
            .iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(get) => get.kvs().first(),
                _ => None,
            })
            .collect();
        return match foreign_in(keys, &kvs) {
            Some(foreign) => Ok(Joined::OtherKind(foreign)),
            None => Err(Error::UnexpectedReply(
                "etcd read-write lock: another kind's compare failed, but no other key was read"
                    .into(),
            )),
        };
    }
    let at = usize::from(queue_on.is_some());
    let own = match responses.get(at) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    };
    let Some(own) = own else {
        // Trying once, with nothing created (by this send or before).
        return Ok(Joined::Refused);
    };
    let revision = own.create_revision();
    let newest = match responses.get(at + 1) {
        Some(TxnOpResponse::Get(get)) => get.kvs(),
        _ => &[],
    };
    Ok(Joined::Placed {
        revision,
        standing: standing(newest, key, revision, access),
        queued: queue_on.is_some(),
    })
}

/// Where `key` (created at `revision`) stands, from `newest` (the newest
/// keys in its way, newest first: see [`newest_ahead`]).
fn standing(newest: &[KeyValue], key: &str, revision: i64, access: Access) -> Standing {
    let others: Vec<&KeyValue> = newest
        .iter()
        .filter(|kv| kv.key() != key.as_bytes())
        .collect();
    // Ours is the newest key of the lock when a writer's own key leads
    // the list, or (a reader's) when the newest writer is older.
    let ours_newest = match access {
        Access::Write => newest
            .first()
            .is_some_and(|kv| kv.key() == key.as_bytes() && kv.create_revision() == revision),
        Access::Read => others.iter().all(|kv| kv.create_revision() < revision),
    };
    if !ours_newest {
        return Standing::Unknown;
    }
    match others.first().and_then(|kv| kv.key_str().ok()) {
        Some(ahead) => Standing::Behind(ahead.to_owned()),
        None => Standing::First,
    }
}

/// Where `key`, an acquisition of `access` created at `revision`, stands
/// now: one read-only transaction, linearizable, that compares the key
/// still has its create revision and reads the newest key in its way.
/// `Look::Gone`: the key is gone (its lease expired or was revoked, or a
/// revoke deleted it), and a waiter whose key is gone is never told it
/// holds the lock, however its predecessors went (etcd's RWMutex,
/// issue #16221, granted it).
pub(crate) async fn look(
    conn: &EtcdConn,
    keys: &RwKeys,
    (key, access): (&str, Access),
    revision: i64,
) -> Result<Look> {
    let ahead = TxnOp::get(
        keys.ahead_of(access),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_max_create_revision(revision.saturating_sub(1))
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1)
                .with_keys_only(),
        ),
    );
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([ahead]);
    let reply = conn
        .txn(txn)
        .await
        .map_err(|e| conn.error(e, "reading the read-write lock's queue"))?;
    if !reply.succeeded() {
        return Ok(Look::Gone);
    }
    let responses = reply.op_responses();
    let newest = match responses.first() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    };
    Ok(match newest.and_then(|kv| kv.key_str().ok()) {
        Some(ahead) => Look::Behind(ahead.to_owned()),
        None => Look::First,
    })
}

/// One holder of a read-write lock, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwShown {
    /// The key's value: the holder id (`None` if empty or not text).
    pub(crate) holder: Option<String>,
    /// The key's create revision: the writer's fence or the reader's epoch
    /// before its epoch base.
    pub(crate) revision: i64,
    /// Its lease's time left (zero once gone), in whole seconds.
    pub(crate) remaining: Duration,
}

/// The holders among `kvs` (keys of lock `lock_prefix`, oldest first):
/// the writer if the oldest read-write key is a writer's, else the readers
/// before the oldest writer's key. Each with its key and lease.
pub(crate) fn holders_of<'a>(
    lock_prefix: &str,
    kvs: &'a [KeyValue],
) -> (Option<&'a KeyValue>, Vec<&'a KeyValue>) {
    let mut readers = Vec::new();
    // Whether a key is in the way of a writer.
    let mut ahead = false;
    for kv in kvs {
        match key_kind(lock_prefix, kv.key()) {
            Some(KeyKind::Writer) if !ahead => return (Some(kv), readers),
            Some(KeyKind::Writer) => break,
            Some(KeyKind::Reader) => {
                readers.push(kv);
                ahead = true;
            }
            Some(KeyKind::RwMalformed) => ahead = true,
            _ => {}
        }
    }
    (None, readers)
}

/// What a revoke of a read-write lock deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwDeposal {
    /// The oldest key deleted (the writer, or the first reader): its
    /// value (the holder id) and create revision; `None` if no key was
    /// left to delete.
    pub(crate) first: Option<(String, i64)>,
    /// The revision of the deletion: above every deleted key's create
    /// revision, below every later key's.
    pub(crate) revision: i64,
}

/// Deletes every key of the read-write lock `keys` (holders and waiters:
/// see `engine/etcd/rwlock.rs` for why the waiters too), if the name has
/// no key of another kind. Sent once: a resent deletion would depose the
/// next holders too. `Ok(None)`: another kind's key is there now.
pub(crate) async fn delete_all(conn: &EtcdConn, keys: &RwKeys) -> Result<Option<RwDeposal>> {
    let txn = Txn::new()
        .when(no_other_kind(keys))
        .and_then([TxnOp::delete(
            keys.base(),
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )]);
    let reply = conn
        .txn_once(txn)
        .await
        .map_err(|e| conn.error(e, "revoking"))?;
    if !reply.succeeded() {
        return Ok(None);
    }
    let revision = header_revision(reply.header())?;
    let deleted = match reply.op_responses().first() {
        Some(TxnOpResponse::Delete(deleted)) => deleted.prev_kvs().to_vec(),
        _ => Vec::new(),
    };
    let first = deleted
        .iter()
        .filter(|kv| {
            matches!(
                key_kind(keys.lock(), kv.key()),
                Some(KeyKind::Reader | KeyKind::Writer)
            )
        })
        .min_by_key(|kv| kv.create_revision())
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        });
    Ok(Some(RwDeposal { first, revision }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_other_kind_ranges_leave_out_exactly_the_rwlocks_own_keys() {
        let keys = RwKeys::new("lock:a/");
        assert_eq!(keys.base(), "lock:a/rw/");
        assert_eq!(keys.writers(), "lock:a/rw/w/");
        assert_eq!(keys.ahead_of(Access::Write), "lock:a/rw/");
        assert_eq!(keys.ahead_of(Access::Read), "lock:a/rw/w/");
        let outside = |key: &str| {
            let k = key.as_bytes();
            let below = k >= keys.lock().as_bytes() && k < keys.base().as_bytes();
            let above =
                k >= prefix_end(keys.base()).as_slice() && k < prefix_end(keys.lock()).as_slice();
            below || above
        };
        for other in [
            "lock:a/1f/2",
            "lock:a/1f",
            "lock:a/sem/2/slot/0",
            "lock:a/sem/2/wait/1/1",
            "lock:a/rw",
            "lock:a/rwx",
            "lock:a/zzz",
        ] {
            assert!(outside(other), "{other}");
        }
        for own in [
            keys.key(Access::Read, 0x1f, 2),
            keys.key(Access::Write, i64::MAX, u64::MAX),
        ] {
            assert!(!outside(&own), "{own}");
            assert!(own.starts_with(keys.base()));
        }
        assert!(!outside("lock:b/rw/r/1/1") && !outside("lock:a0"));
    }
}
