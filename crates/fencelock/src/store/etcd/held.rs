//! What a held lease does in etcd (renew, release), what `inspect`, `top`
//! and `status` read, and what a member reports about itself (the audit).

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};

use super::conn::EtcdConn;
use super::errors::is_lease_gone;
use super::keys::{KeyKind, RWLOCK_PART, glob_match, key_kind, name_of_key};
use super::rwlock::{RwShown, holders_of};
use super::semaphore::PermitShown;
use crate::error::{LossReason, Result};
use crate::store::Checked;

/// A holder's key in etcd: the key, the lease it lives on, and its create
/// revision (the holder's fence before its epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldKey<'a> {
    pub(crate) key: &'a str,
    pub(crate) lease: i64,
    pub(crate) revision: i64,
}

/// Who holds a name, as its keys show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Held {
    /// A mutex's holder.
    Mutex(Holder),
    /// A semaphore of `permits`, and the holder of each held slot, by slot
    /// (empty while only waiters are left, for a moment).
    Semaphore {
        permits: u32,
        slots: Vec<PermitShown>,
    },
    /// A read-write lock: its writer, or its readers (oldest first); both
    /// empty while a key fencelock does not write is first.
    RwLock {
        writer: Option<RwShown>,
        readers: Vec<RwShown>,
    },
}

/// Who holds a lock, as its keys show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The holder key's value: the public holder id (`None` if empty or
    /// not text).
    pub(crate) id: Option<String>,
    /// The holder key's create revision.
    pub(crate) revision: i64,
    /// Its lease's time left (zero once gone), in whole seconds.
    pub(crate) remaining: Duration,
    /// How many keys wait behind it.
    pub(crate) waiters: u64,
}

impl EtcdConn {
    /// One renewal of `held`, keys that all live on lease `lease`: one
    /// keep-alive of the lease and a read of each key, all sent together;
    /// one code per key, in order. The lease gone means every one of them
    /// expired; a key gone (deleted by someone else) or re-created means
    /// another holder may have that lock.
    pub(crate) async fn keep_alive(
        &self,
        lease: i64,
        held: &[HeldKey<'_>],
    ) -> Result<Vec<Checked>> {
        // Boxed, as every etcd call here: etcd's request futures are large.
        Box::pin(self.keep_alive_now(lease, held)).await
    }

    async fn keep_alive_now(&self, lease: i64, held: &[HeldKey<'_>]) -> Result<Vec<Checked>> {
        let reads = futures_util::future::join_all(
            held.iter()
                .map(|h| self.get(h.key, Some(GetOptions::new().with_keys_only()))),
        );
        let (alive, reads) = tokio::join!(self.lease_keep_alive(lease), reads);
        match alive {
            Ok(()) => {}
            Err(e) if is_lease_gone(&e) => {
                return Ok(vec![Checked::NotOurs(LossReason::Expired); held.len()]);
            }
            Err(e) => return Err(self.error(e, "keeping the lease alive")),
        }
        held.iter()
            .zip(reads)
            .map(|(h, read)| {
                let read = read.map_err(|e| self.error(e, "reading the lock"))?;
                Ok(match read.kvs().first() {
                    Some(kv) if kv.create_revision() == h.revision => Checked::Done,
                    _ => Checked::NotOurs(LossReason::TakenOver),
                })
            })
            .collect()
    }

    /// Release: delete the holder's key if it still has the holder's create
    /// revision. The lease is the client's session, shared with its other
    /// locks: it is not revoked. A key already gone was lost: expired if
    /// its lease is gone too, else deleted by someone else.
    pub(crate) async fn release(&self, held: HeldKey<'_>) -> Result<Checked> {
        Box::pin(self.release_now(held)).await
    }

    async fn release_now(&self, held: HeldKey<'_>) -> Result<Checked> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                held.key,
                CompareOp::Equal,
                held.revision,
            )])
            .and_then([TxnOp::delete(held.key, None)]);
        let reply = self
            .txn(txn)
            .await
            .map_err(|e| self.error(e, "releasing"))?;
        if reply.succeeded() {
            return Ok(Checked::Done);
        }
        Ok(Checked::NotOurs(
            match self.lease_time_to_live(held.lease).await {
                Ok(ttl) if ttl.ttl() > 0 => LossReason::TakenOver,
                _ => LossReason::Expired,
            },
        ))
    }

    /// Deletes `key` whatever it holds: the key of an acquisition that gave
    /// up (it is that acquisition's alone, see `holder_key`).
    pub(crate) async fn delete_key(&self, key: &str) -> Result<()> {
        self.delete(key)
            .await
            .map(drop)
            .map_err(|e| self.error(e, "removing a waiter's key"))
    }

    /// Who holds the lock whose keys start with `lock_prefix` (`None`:
    /// nobody): for a mutex the first key by create revision, its lease's
    /// time left, and how many wait behind it; for a semaphore (its first
    /// key is one) the holder of each slot; for a read-write lock its
    /// writer or its readers.
    pub(crate) async fn holder(&self, lock_prefix: &str) -> Result<Option<Held>> {
        Box::pin(self.holder_now(lock_prefix)).await
    }

    async fn holder_now(&self, lock_prefix: &str) -> Result<Option<Held>> {
        let reply = self
            .get(
                lock_prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                ),
            )
            .await
            .map_err(|e| self.error(e, "reading the lock"))?;
        let Some(owner) = reply.kvs().first() else {
            return Ok(None);
        };
        // The kinds never share a name: the first key tells which.
        match key_kind(lock_prefix, owner.key()) {
            Some(KeyKind::Mutex) => {}
            Some(kind) if kind.is_rwlock() => {
                return self.rw_holders(lock_prefix, reply.kvs()).await;
            }
            _ => return self.permit_holders(lock_prefix, reply.kvs()).await,
        }
        let waiters = u64::try_from(reply.kvs().len() - 1).unwrap_or(u64::MAX);
        let remaining = match self.lease_time_to_live(owner.lease()).await {
            Ok(ttl) if ttl.ttl() >= 0 => Duration::from_secs(ttl.ttl().unsigned_abs()),
            Ok(_) => Duration::ZERO,
            Err(e) if is_lease_gone(&e) => Duration::ZERO,
            Err(e) => return Err(self.error(e, "reading the holder's lease")),
        };
        Ok(Some(Held::Mutex(Holder {
            id: owner
                .value_str()
                .ok()
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
            revision: owner.create_revision(),
            remaining,
            waiters,
        })))
    }

    /// The holders of the semaphore whose keys are `kvs` (its count is the
    /// first slot key's; keys that are not a slot's are left out).
    async fn permit_holders(
        &self,
        lock_prefix: &str,
        kvs: &[etcd_client::KeyValue],
    ) -> Result<Option<Held>> {
        let mut permits = None;
        let mut slots = Vec::new();
        for kv in kvs {
            if let Some(KeyKind::Slot { permits: n, slot }) = key_kind(lock_prefix, kv.key())
                && *permits.get_or_insert(n) == n
            {
                slots.push((slot, kv));
            }
        }
        let Some(permits) = permits else {
            // Only waiters (or keys fencelock does not write): nobody holds.
            return Ok(None);
        };
        let leases: Vec<i64> = slots.iter().map(|(_, kv)| kv.lease()).collect();
        let left = self.leases_left(&leases).await?;
        let mut slots: Vec<PermitShown> = slots
            .into_iter()
            .map(|(slot, kv)| PermitShown {
                slot,
                holder: kv
                    .value_str()
                    .ok()
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned),
                revision: kv.create_revision(),
                remaining: left.get(&kv.lease()).copied().unwrap_or_default(),
            })
            .collect();
        slots.sort_by_key(|s| s.slot);
        Ok(Some(Held::Semaphore { permits, slots }))
    }

    /// The holders of the read-write lock whose keys are `kvs`, oldest
    /// first (see [`holders_of`]).
    async fn rw_holders(
        &self,
        lock_prefix: &str,
        kvs: &[etcd_client::KeyValue],
    ) -> Result<Option<Held>> {
        let (writer, readers) = holders_of(lock_prefix, kvs);
        let leases: Vec<i64> = writer.iter().chain(&readers).map(|kv| kv.lease()).collect();
        let left = self.leases_left(&leases).await?;
        let shown = |kv: &etcd_client::KeyValue| RwShown {
            holder: kv
                .value_str()
                .ok()
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
            revision: kv.create_revision(),
            remaining: left.get(&kv.lease()).copied().unwrap_or_default(),
        };
        Ok(Some(Held::RwLock {
            writer: writer.map(shown),
            readers: readers.into_iter().map(shown).collect(),
        }))
    }

    /// How many wait for the lock at `lock_prefix`: the keys behind a
    /// mutex's holder, a semaphore's waiter keys, or a read-write lock's
    /// keys behind its holders. One read-only transaction: the count of
    /// the name's keys, the semaphore's keys and the read-write lock's
    /// (none for a mutex).
    pub(crate) async fn waiters(&self, lock_prefix: &str) -> Result<u64> {
        let semaphore = format!("{lock_prefix}{}", super::keys::SEMAPHORE_PART);
        let rwlock = format!("{lock_prefix}{RWLOCK_PART}");
        let txn = Txn::new().and_then([
            TxnOp::get(
                lock_prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
            TxnOp::get(
                semaphore.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
            TxnOp::get(
                rwlock.as_str(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                ),
            ),
        ]);
        let reply = self
            .txn(txn)
            .await
            .map_err(|e| self.error(e, "counting the lock's waiters"))?;
        let responses = reply.op_responses();
        let (
            Some(TxnOpResponse::Get(all)),
            Some(TxnOpResponse::Get(semaphore)),
            Some(TxnOpResponse::Get(rwlock)),
        ) = (responses.first(), responses.get(1), responses.get(2))
        else {
            return Err(crate::error::Error::UnexpectedReply(
                "etcd: a read of the lock's waiters came back without its ranges".into(),
            ));
        };
        if !rwlock.kvs().is_empty() {
            let (writer, readers) = holders_of(lock_prefix, rwlock.kvs());
            let holding = readers.len() + usize::from(writer.is_some());
            let waiting = rwlock.kvs().len().saturating_sub(holding.max(1));
            return Ok(u64::try_from(waiting).unwrap_or(u64::MAX));
        }
        if semaphore.kvs().is_empty() {
            return Ok(u64::try_from(all.count()).unwrap_or(0).saturating_sub(1));
        }
        let waiting = semaphore
            .kvs()
            .iter()
            .filter(|kv| {
                matches!(
                    key_kind(lock_prefix, kv.key()),
                    Some(KeyKind::Waiter { .. })
                )
            })
            .count();
        Ok(u64::try_from(waiting).unwrap_or(u64::MAX))
    }

    /// The names of the locks under `names_prefix` (namespace and prefix)
    /// that have a key and match the glob `pattern`, sorted.
    pub(crate) async fn lock_names(
        &self,
        names_prefix: &str,
        pattern: &str,
    ) -> Result<Vec<String>> {
        let reply = self
            .get(
                names_prefix,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(|e| self.error(e, "listing the locks"))?;
        let mut names: Vec<String> = reply
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok())
            .filter_map(|key| name_of_key(names_prefix, key))
            .filter(|name| glob_match(pattern, name))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// What one member reports about itself (`Status`), for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    /// Its client endpoint.
    pub(crate) endpoint: String,
    pub(crate) member_id: u64,
    pub(crate) leader: u64,
    pub(crate) version: String,
    pub(crate) db_size: i64,
    pub(crate) raft_term: u64,
    pub(crate) revision: i64,
    pub(crate) errors: Vec<String>,
}
