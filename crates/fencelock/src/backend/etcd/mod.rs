//! The etcd backend (feature `etcd`): the same fenced lock on a consensus
//! store.
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
//!   silently expires after 60 s. The keeper task (`crate::renew`) keeps it
//!   alive at ttl/3 through `LeaseState::extend_once`.
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
//!   Every wait mode waits this way (`poll`, `notify` and `fair` alike). The
//!   waiter keeps its lease alive while it waits; if it gives up, times out
//!   or is dropped, its lease is revoked, which removes its key.
//! - **Loss**: a keep-alive that finds the lease gone, a holder key that is
//!   gone, or the local monotonic deadline passing first.
//! - **Release** deletes the key if it still has the holder's create
//!   revision and revokes the lease, both sent at once.
//!
//! # Files
//!
//! | module | concern |
//! |---|---|
//! | `conn` | [`EtcdConn`]: the URL (`etcd://`, `etcds://`, credentials, `?prefix=`), connecting, TLS, errors |
//! | `keys` | lock names to etcd keys and back; `top`'s glob |
//! | `acquire` | the grant transaction, the wait, and the lease a grant gives |
//! | `held` | what a held lease does in etcd: keep-alive, release, and `inspect` |
//! | `fenced` | the transactions of `FencedKey` |

mod acquire;
mod conn;
mod fenced;
mod held;
mod keys;

pub(crate) use acquire::acquire;
pub(crate) use conn::{EtcdConn, is_transient};
pub(crate) use fenced::{KeyWrite, Stored, read_key, write_key};
pub(crate) use held::Status;
pub(crate) use keys::{lock_prefix, validate_name};

/// What a grant on etcd gave, besides the common `Granted` fields: the
/// holder's lease and the create revision of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) lease: i64,
    pub(crate) revision: i64,
}

/// The grant transaction, for tests (feature `testing`): creates the key of
/// `lease` under lock `name`'s prefix if missing; returns the key's create
/// revision and how many keys the lock has.
#[cfg(feature = "testing")]
pub(crate) async fn grant_txn(
    conn: &EtcdConn,
    prefix: &str,
    name: &str,
    lease: i64,
) -> crate::error::Result<(i64, usize)> {
    acquire::grant_txn_for_tests(conn, &lock_prefix(conn.namespace(), prefix, name), lease).await
}
