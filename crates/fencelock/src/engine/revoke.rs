//! What a revoke did in the store ([`Revocation`]): the revocation fence,
//! and whom it deposed ([`Deposed`]). The resources are sealed at that
//! fence by the client façade (`LockClient::revoke`), which reports both.

use crate::fence::Fence;

/// What a revoke did in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Revocation {
    /// The revocation fence: at or above the deposed holder's fence and
    /// every earlier one, and below the fence of every holder after the
    /// revoke. Sealing a resource at it refuses exactly the holders before.
    pub(crate) fence: Fence,
    /// Whom it deposed; `None` when the lock was free.
    pub(crate) deposed: Option<Deposed>,
    /// On Redis with [`LockOptions::wait_for_replicas`](crate::LockOptions::wait_for_replicas):
    /// how many replicas acknowledged the revoke, and how many were asked
    /// for.
    pub(crate) replicas: Option<(u32, u32)>,
}

/// The holder a revoke took its lock away from. A read-write lock's
/// revoke deposes every holder; the one named is the writer, or the
/// reader with the lowest field (a reader's fence is its write epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deposed {
    /// Its public holder id ([`holder_id`](crate::holder_id)); on etcd the
    /// value of its key, which is its holder id for every fencelock holder.
    pub holder: String,
    /// Its fence, when the store tells (on Redis it is in the lock's value,
    /// or the last fence issued in the guide's layout; on etcd its key's
    /// create revision).
    pub fence: Option<Fence>,
}
