//! The recipe on etcd (feature `etcd`): the same fenced lock on a
//! consensus store. The calls it makes are the etcd store's
//! (`store::etcd`); what is decided here is which, and when.
//!
//! # The protocol
//!
//! It is etcd's own lock recipe (`concurrency.Mutex`, which `etcdctl lock`
//! and etcd's Lock RPC use), with fencelock's guarantees around it:
//!
//! - **A lease per holder.** Every acquisition grants a lease of its own
//!   (the ttl rounded up to whole seconds: etcd leases count seconds, and
//!   etcd may raise a short one to its minimum, 1.5 election timeouts). It
//!   is never the server's default lease: etcd's Lock RPC called without a
//!   lease grants a 60 s lease that nobody keeps alive, and the lock then
//!   silently expires after 60 s. The keeper task (`lease::keeper`) keeps it
//!   alive at ttl/3 through the engine's renewal.
//! - **The grant is one transaction** that creates the holder's key
//!   `NAMESPACE PREFIX NAME/LEASE` (the lease id in hex, attached to the
//!   lease) if it does not exist, and reads who is first. The holder is the
//!   key with the lowest create revision under `NAMESPACE PREFIX NAME/`:
//!   later keys are waiters. A retried grant (the reply was lost) finds the
//!   key it created and uses it: one key per lease, never two.
//! - **The fence is the holder key's create revision** (plus the fence
//!   epoch's base, [`crate::LockOptions::fence_epoch`], 1 × 2^53 unless
//!   set). Revisions grow cluster-wide with every write and survive leader
//!   changes, and the holders of a name hold keys in create-revision order,
//!   so each holder's fence is above every earlier holder's. It is a
//!   property of the key, readable by anyone (`status`), the same on every
//!   retry, and a transaction can compare it (the fenced write inside etcd,
//!   [`crate::FencedKey::write_held`]). The *response header* revision,
//!   which `etcdctl lock` exports as `ETCD_LOCK_REV`, is a different number
//!   (after a wait it is the revision of a later read): the two must never be
//!   mixed, or a later holder's fence can be below an earlier one's.
//! - **Waiting watches the predecessor**: the waiter's key stays in the
//!   queue; it watches the key created just before its own for its deletion
//!   (a watch from now, then a read that the key is still there, so no
//!   deletion is missed and the watch is one etcd serves at once), then
//!   looks again. First come, first served by construction.
//!   Every wait mode waits this way (`poll`, `notify` and `fair` alike).
//! - **A waiter's key is on a short lease.** With a ttl longer than
//!   `WAITER_LEASE` (2 s), a free lock is tried first with the holder's
//!   lease; if someone holds or waits, the waiter's key is created on a
//!   waiter lease of its own, and moved to the holder's lease (a put that
//!   keeps its create revision, so its place and fence) once it is first.
//!   The waiter keeps both alive while it waits. A waiter that dies leaves
//!   its key for the waiter lease, not the ttl.
//! - **Giving up removes the key**, by revoking the acquisition's leases: a
//!   wait that runs out before it returns `Timeout`, a refusal or failure
//!   and a dropped future in the background (tracked by the client's
//!   `Cleanups`, which `LockClient::flush` waits for).
//! - **Loss**: a keep-alive that finds the lease gone, a holder key that is
//!   gone, or the local monotonic deadline passing first.
//! - **Release** deletes the key if it still has the holder's create
//!   revision and revokes the lease, both sent at once.
//!
//! | file | concern |
//! |---|---|
//! | `acquire.rs` | the lease of an acquisition, the grant, the wait for the predecessor, giving up |
//! | `mod.rs` | a held lease's renewal and release, `inspect`, `top`'s names, the waiters |

mod acquire;

use super::cleanup::Cleanups;
use super::grant::{Acquired, EtcdHold, Granted};
use super::inspect::LockState;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::keys::{KeyLayout, LockKeys};
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::store::Checked;
use crate::store::etcd::{EtcdConn, HeldKey, lock_prefix, validate_name};

/// The etcd side of one client: its connection.
#[derive(Debug)]
pub(crate) struct EtcdEngine {
    pub(crate) conn: EtcdConn,
    /// The revocations of dropped acquisitions and the releases of dropped
    /// leases still running.
    pub(crate) cleanups: Cleanups,
}

impl EtcdEngine {
    pub(crate) fn new(conn: EtcdConn) -> Self {
        EtcdEngine {
            conn,
            cleanups: Cleanups::default(),
        }
    }

    /// Takes lock `name` (its keys' prefix is `keys.lock`): once if `wait`
    /// is false or the wait is zero, else waiting until the options'
    /// deadline.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
        wait: bool,
    ) -> Result<Acquired> {
        // Boxed: etcd's request futures are large, and this one would
        // otherwise sit on the caller's stack.
        Box::pin(acquire::acquire(
            &self.conn,
            &self.cleanups,
            name,
            keys,
            opts,
            wait,
        ))
        .await
    }

    /// One renewal: a keep-alive of the holder's own lease and a read of
    /// its key.
    pub(crate) async fn extend(&self, granted: &Granted) -> Result<Checked> {
        self.conn.keep_alive(held_key(granted.etcd()?)).await
    }

    /// Deletes the holder's key if it is still its own, and revokes its
    /// lease.
    pub(crate) async fn release(&self, granted: &Granted) -> Result<Checked> {
        self.conn.release(held_key(granted.etcd()?)).await
    }

    /// One keep-alive per holder's lease, all sent at once; one code per
    /// lease, in order (an error fails the batch: each lease retries).
    pub(crate) async fn renew_many(&self, leases: &[&Granted]) -> Result<Vec<Checked>> {
        let holds = leases
            .iter()
            .map(|g| g.etcd())
            .collect::<Result<Vec<&EtcdHold>>>()?;
        futures_util::future::join_all(holds.into_iter().map(|h| self.conn.keep_alive(held_key(h))))
            .await
            .into_iter()
            .collect()
    }

    /// The keys of lock `name`: `lock` is the prefix of the lock's keys
    /// (`NAMESPACE PREFIX NAME/`, `/` and `%` in the name escaped); each
    /// holder or waiter has the key `lock` + its lease id in hex; the other
    /// fields are empty (etcd needs no fence key, queue or channel).
    pub(crate) fn keys(&self, prefix: &str, name: &str) -> Result<LockKeys> {
        validate_name(name)?;
        Ok(LockKeys {
            lock: lock_prefix(self.conn.namespace(), prefix, name),
            fence: String::new(),
            queue: String::new(),
            waiters: String::new(),
            wake_prefix: String::new(),
        })
    }

    /// The keys of lock `name` for a call: the guide layout does not exist
    /// on etcd.
    pub(crate) fn lock_keys(
        &self,
        prefix: &str,
        name: &str,
        layout: KeyLayout,
    ) -> Result<LockKeys> {
        if layout == KeyLayout::Guide {
            return Err(Error::InvalidOption(
                "the guide layout (lock:NAME in Redis) does not exist on etcd: use the default layout".into(),
            ));
        }
        self.keys(prefix, name)
    }

    /// Who holds lock `keys`: the key with the lowest create revision (its
    /// value is the holder id), the fence its create revision in the epoch
    /// of `defaults`, `remaining` its lease's time to live (whole seconds);
    /// `last_fence` of a free lock is `None`, etcd keeps no fence per name.
    pub(crate) async fn inspect(
        &self,
        keys: &LockKeys,
        defaults: &LockOptions,
    ) -> Result<LockState> {
        let Some(holder) = self.conn.holder(&keys.lock).await? else {
            return Ok(LockState::Free { last_fence: None });
        };
        let fence = u64::try_from(holder.revision)
            .ok()
            .filter(|r| *r < FENCE_EPOCH_SIZE)
            .map(|r| Fence::new(defaults.fence_base(ETCD_DEFAULT_FENCE_EPOCH) + r));
        Ok(LockState::Held {
            holder: holder.id.unwrap_or_else(|| "unknown".to_owned()),
            fence,
            remaining: Some(holder.remaining),
        })
    }

    /// How many wait behind the holder of lock `keys`.
    pub(crate) async fn waiters(&self, keys: &LockKeys) -> Result<u64> {
        self.conn.waiters(&keys.lock).await
    }

    /// The names of the locks under `prefix` (after the URL's namespace)
    /// that have a key and match the glob `pattern`, sorted.
    pub(crate) async fn lock_names(&self, prefix: &str, pattern: &str) -> Result<Vec<String>> {
        let names_prefix = format!("{}{prefix}", self.conn.namespace());
        self.conn.lock_names(&names_prefix, pattern).await
    }
}

/// What the store needs of a held etcd lease.
fn held_key(hold: &EtcdHold) -> HeldKey<'_> {
    HeldKey {
        key: &hold.key,
        lease: hold.lease,
        revision: hold.revision,
    }
}
