//! The etcd store (feature `etcd`): I/O only. The recipe — when to grant
//! a lease, queue, watch, keep alive and give up — is `engine::etcd`.
//!
//! | module | concern |
//! |---|---|
//! | `conn` | [`EtcdConn`]: connecting (TLS included) and the calls |
//! | `target` | the URL (`etcd://`, `etcds://`, credentials, `?prefix=`), parsed |
//! | `errors` | etcd's errors as fencelock's: what failed, whether it may pass |
//! | `keys` | lock names to etcd keys and back (a semaphore's and a read-write lock's keys too); `top`'s glob |
//! | `grant` | the grant transactions (`try_txn`, `queue_txn`), moving a waiter's key to the holder's lease (`attach`), and the lease seconds of a ttl |
//! | `queue` | where a waiter stands in the queue, and the watch for its predecessor's deletion (a semaphore's waiters: for any deletion under its keys) |
//! | `semaphore` | a semaphore's transactions: read the name, queue a waiter, take a slot, give back an abandoned one; its holders' leases |
//! | `rwlock` | a read-write lock's transactions: join, look (a compare of the waiter's own key and a read of what is in its way), its holders, a revoke's deletion of every key |
//! | `held` | what a held lease does in etcd: keep-alive, release; who holds a lock; a member's status |
//! | `revoke` | a revoke's transaction: delete the holder's key, whoever holds it, and read who is next (a read-write lock's: every key) |
//! | `fenced` | the transactions of `FencedKey` (and its seal) |

mod conn;
mod errors;
mod fenced;
mod grant;
mod held;
mod keys;
mod queue;
mod revoke;
mod rwlock;
mod semaphore;
mod target;

pub(crate) use conn::EtcdConn;
pub(crate) use errors::{is_lease_gone, is_transient};
pub(crate) use fenced::{KeyWrite, Stored, read_key, seal_key, write_key};
#[cfg(feature = "testing")]
pub(crate) use grant::grant_txn_for_tests;
pub(crate) use grant::{Found, attach, lease_seconds, queue_txn, try_or_queue_txn, try_txn};
pub(crate) use held::{Held, HeldKey, Status};
pub(crate) use keys::{RwKeys, SemKeys, check_key_space, holder_key, in_lock_space, lock_prefix};
pub(crate) use queue::{Deletions, Look, look, watch_deletion, watch_deletions};
pub(crate) use revoke::depose;
pub(crate) use rwlock::{Joined, RwShown, Standing, join as join_rw, look as look_rw};
#[cfg(test)]
pub(crate) use semaphore::SlotHeld;
pub(crate) use semaphore::{
    Foreign, SemState, Sent, Taker, give_back, queue as queue_permit, read as read_permits,
    take_slot,
};
