//! A revoke on etcd: delete the holder's key — the first of the lock's
//! keys by create revision, whoever it belongs to — and read who is first
//! after it, in one transaction (the recipe that seals the resources is
//! `engine/etcd`). A revoke takes a mutex or a read-write lock away (of a
//! read-write lock every key goes, holders and waiters, in one
//! transaction: `rwlock.rs`); a name held as a semaphore is refused, and
//! nothing is deleted.

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::conn::EtcdConn;
use super::grant::{first_by_create, first_kv, header_revision};
use super::keys::{KeyKind, RwKeys, key_kind};
use super::rwlock::delete_all;
use crate::error::{Error, Result};

/// How often the holder is read again when it changed between the read and
/// the deleting transaction.
const MAX_ATTEMPTS: usize = 100;

/// What a revoke found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deposal {
    /// The deleted holder key's value (the holder's public id) and create
    /// revision (its fence); `None` when nobody held the lock.
    pub(crate) holder: Option<(String, i64)>,
    /// The create revision of the first key left (the next holder), if any
    /// (never one of a read-write lock: all its keys are deleted).
    pub(crate) next: Option<i64>,
    /// The revision at which the lock was seen free or its holder deleted:
    /// every key created later has a greater create revision.
    pub(crate) revision: i64,
}

/// Deletes the holder key of lock `name`, whose keys start with `prefix`,
/// and reads the first key left; of a read-write lock (its first key is a
/// reader's or a writer's) deletes every key, and reports the oldest.
///
/// # Errors
/// etcd errors; [`Error::KindConflict`] when a semaphore holds the name
/// (its first key is a semaphore's: deleting it would free one slot of
/// many, not take the name away); [`Error::UnexpectedReply`] when the
/// holder changed under every attempt.
pub(crate) async fn depose(conn: &EtcdConn, name: &str, prefix: &str) -> Result<Deposal> {
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    for _ in 0..MAX_ATTEMPTS {
        let read = conn
            .get(prefix, Some(first.clone()))
            .await
            .map_err(|e| conn.error(e, "reading the lock's holder"))?;
        let Some(holder) = read.kvs().first() else {
            return Ok(Deposal {
                holder: None,
                next: None,
                revision: header_revision(read.header())?,
            });
        };
        match key_kind(prefix, holder.key()) {
            Some(KeyKind::Mutex) => {}
            Some(kind) if kind.is_rwlock() => {
                // `None`: another kind came since the read; read again.
                if let Some(deleted) = delete_all(conn, &RwKeys::new(prefix)).await? {
                    return Ok(Deposal {
                        holder: deleted.first,
                        next: None,
                        revision: deleted.revision,
                    });
                }
                continue;
            }
            _ => {
                return Err(Error::KindConflict {
                    name: name.to_owned(),
                    held: "semaphore",
                    asked: "mutex",
                });
            }
        }
        let key = holder.key().to_vec();
        let created = holder.create_revision();
        // Deleted only if it is still the key that was read (not a new key
        // of the same name: a holder key is never re-created, but a retried
        // revoke must not delete the next holder's).
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                created,
            )])
            .and_then([TxnOp::delete(key, None), first_by_create(prefix)]);
        // Sent once: a resent transaction applied before would find the
        // holder key gone, and the next attempt would depose the next
        // holder as well.
        let reply = conn
            .txn_once(txn)
            .await
            .map_err(|e| conn.error(e, "revoking"))?;
        if !reply.succeeded() {
            continue;
        }
        let responses = reply.op_responses();
        return Ok(Deposal {
            holder: Some((
                String::from_utf8_lossy(holder.value()).into_owned(),
                created,
            )),
            next: first_kv(responses.get(1)).map(|kv| kv.create_revision()),
            revision: header_revision(reply.header())?,
        });
    }
    Err(Error::UnexpectedReply(format!(
        "the holder of {prefix:?} changed under every one of {MAX_ATTEMPTS} attempts to revoke it"
    )))
}
