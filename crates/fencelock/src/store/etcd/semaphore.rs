//! A semaphore's transactions on etcd (the recipe that sends them is
//! `engine/etcd/semaphore.rs`; the key layout is in `keys.rs`): read what
//! the name holds, queue a waiter, take a slot, give back a slot an
//! abandoned attempt may have taken, and who holds which slot.
//!
//! Every transaction that creates a key of the semaphore first compares
//! that the name has no key outside `sem/N/` (two range compares: below
//! and above it), so a semaphore key is never created beside a mutex's
//! key, a read-write lock's (`rw/` sorts below `sem/`) or another count's;
//! on failure it reads the name's keys, from which the caller tells what
//! was in the way. The mutex's and the read-write lock's grant
//! transactions compare the other way round (`grant.rs`, `rwlock.rs`).

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use super::conn::EtcdConn;
use super::errors::is_lease_gone;
use super::grant::header_revision;
use super::keys::{KeyKind, SemKeys, key_kind, prefix_end};
use crate::error::Result;

/// What is in the way of a semaphore of one count on its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Foreign {
    /// A mutex's holder or waiter.
    Mutex,
    /// A semaphore of this other count.
    Permits(u32),
    /// A read-write lock's reader or writer.
    RwLock,
    /// This key under `sem/`, which fencelock does not write.
    Malformed(String),
}

/// The holder of one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotHeld {
    pub(crate) slot: u32,
    /// The key's value: the holder id (`None` if not text).
    pub(crate) holder: Option<String>,
    /// The key's create revision: the permit's fence before its epoch.
    pub(crate) revision: i64,
    /// The lease it lives on.
    pub(crate) lease: i64,
}

/// What a semaphore's name holds, as one read saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SemState {
    /// The revision of the read.
    pub(crate) revision: i64,
    /// The first key in the way, if any.
    pub(crate) foreign: Option<Foreign>,
    /// The held slots of this count, by slot.
    pub(crate) slots: Vec<SlotHeld>,
    /// The waiters of this count (key, create revision), oldest first.
    pub(crate) waiters: Vec<(String, i64)>,
}

impl SemState {
    /// The state that `kvs`, every key under the lock's prefix read at
    /// `revision`, show to a semaphore with `keys`.
    pub(crate) fn of(keys: &SemKeys, revision: i64, kvs: &[KeyValue]) -> Self {
        let mut state = SemState {
            revision,
            ..SemState::default()
        };
        for kv in kvs {
            let foreign = match key_kind(keys.lock(), kv.key()) {
                None => continue,
                Some(KeyKind::Mutex) => Foreign::Mutex,
                Some(KeyKind::Reader | KeyKind::Writer | KeyKind::RwMalformed) => Foreign::RwLock,
                Some(KeyKind::Malformed) => {
                    Foreign::Malformed(String::from_utf8_lossy(kv.key()).into_owned())
                }
                Some(KeyKind::Slot { permits, slot }) if permits == keys.permits() => {
                    state.slots.push(SlotHeld {
                        slot,
                        holder: kv.value_str().ok().map(str::to_owned),
                        revision: kv.create_revision(),
                        lease: kv.lease(),
                    });
                    continue;
                }
                Some(KeyKind::Waiter { permits }) if permits == keys.permits() => {
                    state.waiters.push((
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        kv.create_revision(),
                    ));
                    continue;
                }
                Some(KeyKind::Slot { permits, .. } | KeyKind::Waiter { permits }) => {
                    Foreign::Permits(permits)
                }
            };
            // Another kind is named before a key of another count or one
            // fencelock does not write: it is what a caller can act on.
            let named = |f: &Foreign| matches!(f, Foreign::Mutex | Foreign::RwLock);
            let replace = match &state.foreign {
                None => true,
                Some(seen) => !named(seen) && named(&foreign),
            };
            if replace {
                state.foreign = Some(foreign);
            }
        }
        state.slots.sort_by_key(|s| s.slot);
        state.waiters.sort_by_key(|w| w.1);
        state
    }
}

/// What a semaphore transaction did.
#[derive(Debug)]
pub(crate) enum Sent {
    /// Applied at this revision (the create revision of the key it
    /// created), with the name's keys as they were after it (`queue`) or
    /// none (`take_slot`).
    Done(i64, Option<SemState>),
    /// A compare failed: nothing was written; the name's keys as they were.
    Failed(SemState),
    /// The lease the key was to live on is gone: nothing was written.
    LeaseGone,
}

/// How a slot is taken: by an acquisition not in the queue, or by a
/// waiter from its place in it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Taker<'a> {
    /// Not queued: only if no slot was taken and nobody queued since the
    /// read at `seen` (the caller decided from it that a slot is free for
    /// it with every waiter served first).
    Fresh { seen: i64 },
    /// The waiter whose key `key` was created at `revision`: only if that
    /// key is still there (its place is kept); the key is deleted in the
    /// same transaction.
    Queued { key: &'a str, revision: i64 },
}

/// No key of the name outside `sem/N/`: none of a mutex, none of another
/// count (two range compares, below and above the semaphore's range).
fn no_other_kind(keys: &SemKeys) -> [Compare; 2] {
    [
        Compare::create_revision(keys.lock(), CompareOp::Equal, 0).with_range(keys.base()),
        Compare::create_revision(prefix_end(keys.base()), CompareOp::Equal, 0)
            .with_range(prefix_end(keys.lock())),
    ]
}

/// Every key of the name, with values.
fn read_name(keys: &SemKeys) -> TxnOp {
    TxnOp::get(keys.lock(), Some(GetOptions::new().with_prefix()))
}

fn put_on(key: &str, holder: &str, lease: i64) -> TxnOp {
    TxnOp::put(key, holder, Some(PutOptions::new().with_lease(lease)))
}

/// Reads what the name holds.
pub(crate) async fn read(conn: &EtcdConn, keys: &SemKeys) -> Result<SemState> {
    let reply = conn
        .get(keys.lock(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| conn.error(e, "reading the semaphore"))?;
    Ok(SemState::of(
        keys,
        header_revision(reply.header())?,
        reply.kvs(),
    ))
}

/// Joins the queue: creates the waiter key `key` on `lease` unless it
/// exists (a resent transaction finds the key an earlier send created) or
/// another kind or count holds the name, and reads the name's keys.
pub(crate) async fn queue(
    conn: &EtcdConn,
    keys: &SemKeys,
    key: &str,
    holder: &str,
    lease: i64,
) -> Result<Sent> {
    let [below, above] = no_other_kind(keys);
    let txn = Txn::new()
        .when([
            below,
            above,
            Compare::create_revision(key, CompareOp::Equal, 0),
        ])
        .and_then([put_on(key, holder, lease), read_name(keys)])
        .or_else([read_name(keys)]);
    let reply = match conn.txn(txn).await {
        Ok(reply) => reply,
        Err(e) if is_lease_gone(&e) => return Ok(Sent::LeaseGone),
        Err(e) => return Err(conn.error(e, "queueing for the semaphore")),
    };
    let revision = header_revision(reply.header())?;
    let state = state_in(keys, revision, &reply, usize::from(reply.succeeded()));
    Ok(if reply.succeeded() {
        Sent::Done(revision, Some(state))
    } else {
        Sent::Failed(state)
    })
}

/// Takes `slot`: creates its key on `lease` with the holder id as value,
/// if the slot is free, the name has no key of another kind or count, and
/// `taker`'s condition holds (see [`Taker`]). The key's create revision is
/// the permit's fence.
pub(crate) async fn take_slot(
    conn: &EtcdConn,
    keys: &SemKeys,
    slot: u32,
    holder: &str,
    lease: i64,
    taker: Taker<'_>,
) -> Result<Sent> {
    let slot_key = keys.slot(slot);
    let [below, above] = no_other_kind(keys);
    let mut compares = vec![
        below,
        above,
        Compare::create_revision(slot_key.as_str(), CompareOp::Equal, 0),
    ];
    let mut writes = vec![put_on(&slot_key, holder, lease)];
    match taker {
        // Nothing of this semaphore created since the read the decision
        // came from (keys are never modified after their creation, so a
        // newer mod revision is a newer key): the slots it saw taken and
        // the waiters it saw are all there are, less any that left.
        Taker::Fresh { seen } => compares.push(
            Compare::mod_revision(keys.base(), CompareOp::Less, seen.saturating_add(1))
                .with_prefix(),
        ),
        // Only the waiter's own key: a waiter's condition (fewer older
        // waiters than free slots) is kept by every grant that respects
        // it, so new slots taken since its read do not break it (see
        // `engine/etcd/semaphore.rs`).
        Taker::Queued { key, revision } => {
            compares.push(Compare::create_revision(key, CompareOp::Equal, revision));
            writes.push(TxnOp::delete(key, None));
        }
    }
    let txn = Txn::new()
        .when(compares)
        .and_then(writes)
        .or_else([read_name(keys)]);
    let reply = match conn.txn(txn).await {
        Ok(reply) => reply,
        Err(e) if is_lease_gone(&e) => return Ok(Sent::LeaseGone),
        Err(e) => return Err(conn.error(e, "taking a semaphore slot")),
    };
    let revision = header_revision(reply.header())?;
    if reply.succeeded() {
        return Ok(Sent::Done(revision, None));
    }
    Ok(Sent::Failed(state_in(keys, revision, &reply, 0)))
}

/// The name's keys in the range response at `at` of `reply`.
fn state_in(keys: &SemKeys, revision: i64, reply: &TxnResponse, at: usize) -> SemState {
    let responses = reply.op_responses();
    let kvs = match responses.get(at) {
        Some(TxnOpResponse::Get(get)) => get.kvs(),
        _ => &[],
    };
    SemState::of(keys, revision, kvs)
}

/// Deletes slot key `key` if `holder` holds it: what an abandoned attempt
/// may have taken (a transaction whose reply was lost). The slot's key is
/// shared by every holder of the slot in turn, so it is compared by the
/// holder id, which is the attempt's own.
pub(crate) async fn give_back(conn: &EtcdConn, key: &str, holder: &str) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::value(key, CompareOp::Equal, holder)])
        .and_then([TxnOp::delete(key, None)]);
    conn.txn(txn)
        .await
        .map(drop)
        .map_err(|e| conn.error(e, "giving back a semaphore slot"))
}

/// The holder of one slot, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PermitShown {
    pub(crate) slot: u32,
    pub(crate) holder: Option<String>,
    pub(crate) revision: i64,
    /// Its lease's time left (zero once gone), in whole seconds.
    pub(crate) remaining: Duration,
}

impl EtcdConn {
    /// The time left of each of `leases` (zero for one that is gone), read
    /// at once.
    pub(crate) async fn leases_left(&self, leases: &[i64]) -> Result<HashMap<i64, Duration>> {
        let mut unique = leases.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let reads =
            futures_util::future::join_all(unique.iter().map(|id| self.lease_time_to_live(*id)))
                .await;
        unique
            .into_iter()
            .zip(reads)
            .map(|(id, read)| {
                let left = match read {
                    Ok(ttl) if ttl.ttl() >= 0 => Duration::from_secs(ttl.ttl().unsigned_abs()),
                    Ok(_) => Duration::ZERO,
                    Err(e) if is_lease_gone(&e) => Duration::ZERO,
                    Err(e) => return Err(self.error(e, "reading a permit holder's lease")),
                };
                Ok((id, left))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_other_kind_ranges_leave_out_exactly_the_semaphores_own_keys() {
        let keys = SemKeys::new("lock:a/", 3);
        assert_eq!(keys.base(), "lock:a/sem/3/");
        // Below: [lock:a/, lock:a/sem/3/); above: [lock:a/sem/30, lock:a0).
        assert_eq!(prefix_end(keys.base()), b"lock:a/sem/30".to_vec());
        assert_eq!(prefix_end(keys.lock()), b"lock:a0".to_vec());
        let inside = |key: &str| {
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
            "lock:a/sem/30/slot/0",
            "lock:a/sem/4/slot/0",
            "lock:a/sem/1024/wait/1/1",
            "lock:a/sem/",
            "lock:a/zzz",
        ] {
            assert!(inside(other), "{other} must be in the way");
        }
        for own in [keys.slot(0), keys.slot(2), keys.waiter(0x1f, 9)] {
            assert!(!inside(&own), "{own} is the semaphore's own");
        }
        assert!(!inside("lock:a%2Fb/1/1") && !inside("lock:b/1/1"));
    }
}
