//! What `inspect` tells of a lock, on any store.

use std::time::Duration;

use crate::fence::Fence;

/// A snapshot of one lock, from [`LockClient::inspect`](crate::LockClient::inspect).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// Nobody holds the lock.
    Free {
        /// The last fence issued for the name, if the fence key still exists.
        last_fence: Option<Fence>,
    },
    /// Someone holds the lock.
    Held {
        /// The holder's public id ([`holder_id`](crate::holder_id) of its
        /// token; the token is a secret, and the value read back from the
        /// store is turned into this id before it leaves the engine).
        holder: String,
        /// The holder's fence (known in the hash-tagged layout; in the guide
        /// layout, the last fence issued).
        fence: Option<Fence>,
        /// Lease time left as Redis sees it (`None` if the key has no expiry,
        /// which fencelock never creates).
        remaining: Option<Duration>,
    },
    /// The name is a semaphore with holders
    /// ([`LockOptions::permits`](crate::LockOptions::permits)).
    Semaphore {
        /// Its permit count.
        permits: u32,
        /// The holder of each held slot, by slot.
        holders: Vec<PermitHolder>,
        /// The last fence issued for the name, if the fence key still exists.
        last_fence: Option<Fence>,
    },
    /// The name is a read-write lock with holders
    /// ([`LockClient::rwlock`](crate::LockClient::rwlock)): a writer, or
    /// readers.
    RwLock {
        /// The writer, if one holds it.
        writer: Option<RwHolder>,
        /// The readers, in the order of their fields in the store; each
        /// one's fence is the write epoch it saw.
        readers: Vec<RwHolder>,
        /// The last fence issued for the name, if the fence key still exists.
        last_fence: Option<Fence>,
    },
}

/// A reader or the writer of a read-write lock, in [`LockState::RwLock`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHolder {
    /// The holder's public id ([`holder_id`](crate::holder_id) of its token).
    pub holder: String,
    /// The writer's fence, or the reader's write epoch.
    pub fence: Option<Fence>,
    /// Time left until the lease lapses, as the server sees it.
    pub remaining: Duration,
}

/// The holder of one slot of a semaphore, in [`LockState::Semaphore`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The slot, `0..permits`.
    pub slot: u32,
    /// The holder's public id ([`holder_id`](crate::holder_id) of its token).
    pub holder: String,
    /// The permit's fence.
    pub fence: Option<Fence>,
    /// Time left until the permit lapses, as the server sees it.
    pub remaining: Duration,
}
