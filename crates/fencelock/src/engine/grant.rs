//! What one grant gave — the same for every kind of store and every
//! primitive: the name, the fence, the ttl, and what is held in the store
//! ([`Hold`]: the one enum a new primitive extends). The engine hands out
//! an [`Acquired`] (what was granted, and until when it is surely valid); the
//! lease layer turns it into a `Lease` and renews and releases it through
//! the engine.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::holder_id;
use crate::keys::LockKeys;
use crate::options::{Access, LockOptions, Replication};
use crate::store::redis::ops::{Mint, PermitField};
use crate::store::redis::wire;

/// What one grant gave: fixed for the life of the lease. Kept small (a
/// client may hold 100,000 leases).
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) name: String,
    /// The fence the holder is given, in its fence epoch
    /// ([`LockOptions::fence_epoch`]).
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    /// What is held in the store.
    pub(crate) hold: Hold,
}

/// What a grant holds in the store: the seam where each kind of store and
/// each primitive keeps what renewing and releasing it needs. The engine
/// matches on it (and only the engine).
#[derive(Debug)]
pub(crate) enum Hold {
    /// A Redis mutex: the lock key and its exact value.
    Redis(RedisHold),
    /// A permit of a Redis semaphore, or a reader or the writer of a Redis
    /// read-write lock (a permit of its hash): its key, field and identity.
    RedisPermit(PermitHold),
    /// An etcd mutex: the holder's own key, its lease and create revision.
    #[cfg(feature = "etcd")]
    Etcd(EtcdHold),
}

/// A Redis mutex as held: the lock key alone (the other keys are derived
/// from it for a release), and the token as the start of the value.
pub(crate) struct RedisHold {
    /// The lock key (`LockKeys::lock`).
    pub(crate) lock: String,
    /// The exact value stored in the lock key (`TOKEN:FENCE` or `TOKEN`):
    /// the token is its first `token_len` bytes.
    pub(crate) value: String,
    token_len: usize,
    /// How fences are minted for the name: a release may hand the lock over.
    pub(crate) mint: Mint,
    /// Whether the lock was contended when granted (the acquisition was
    /// refused at least once): its release then wakes the next holder first
    /// (`Release::wake_first`).
    pub(crate) contended: bool,
    /// The replicas its renewals wait for, as its grant did: a renewal a
    /// failover could lose must not move the lease's deadline.
    pub(crate) replication: Option<Replication>,
}

/// A permit of a Redis semaphore or read-write lock as held: the key (a
/// hash), the field and its `TOKEN:FENCE`, which its renewals and release
/// compare (the stored value also carries the permit's deadline, which
/// renewals move).
pub(crate) struct PermitHold {
    /// The semaphore's or read-write lock's key (`LockKeys::lock`).
    pub(crate) lock: String,
    /// The field: a slot `0..permits`, the writer's or a reader's.
    pub(crate) field: PermitField,
    /// `TOKEN:FENCE` (the store's fence): the token is its first
    /// `token_len` bytes.
    pub(crate) ident: String,
    token_len: usize,
    /// How fences are minted for the name (a release's pass-on reads it).
    pub(crate) mint: Mint,
    /// The replicas its renewals wait for, as its grant did.
    pub(crate) replication: Option<Replication>,
}

/// An etcd mutex as held: the holder's key `NAMESPACE PREFIX NAME/LEASE/ACQ`
/// (which stores the holder id, not the token), the client's session it
/// lives on, and its create revision (the fence before its epoch).
#[cfg(feature = "etcd")]
pub(crate) struct EtcdHold {
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) session: std::sync::Arc<super::etcd::Session>,
    pub(crate) revision: i64,
    /// The semaphore slot it holds, `None` for a mutex.
    pub(crate) slot: Option<u32>,
    /// The side of a read-write lock it holds, `None` for a mutex or a
    /// semaphore.
    pub(crate) access: Option<Access>,
}

// The holds keep the holder's secret token (in the stored value, or as
// is): their `Debug` shows its public id instead, so that a client's, a
// lease's or a keeper's `Debug` never prints a token.

impl fmt::Debug for RedisHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (token, rest) = self.value.split_at(self.token_len);
        f.debug_struct("RedisHold")
            .field("lock", &self.lock)
            .field("holder", &holder_id(token))
            .field("value_after_token", &rest)
            .field("mint", &self.mint)
            .field("contended", &self.contended)
            .field("replication", &self.replication)
            .finish()
    }
}

impl fmt::Debug for PermitHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (token, rest) = self.ident.split_at(self.token_len);
        f.debug_struct("PermitHold")
            .field("lock", &self.lock)
            .field("field", &self.field)
            .field("holder", &holder_id(token))
            .field("ident_after_token", &rest)
            .field("mint", &self.mint)
            .field("replication", &self.replication)
            .finish()
    }
}

#[cfg(feature = "etcd")]
impl fmt::Debug for EtcdHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdHold")
            .field("key", &self.key)
            .field("holder", &holder_id(&self.token))
            .field("session", &self.session)
            .field("revision", &self.revision)
            .field("slot", &self.slot)
            .field("access", &self.access)
            .finish()
    }
}

impl Granted {
    /// A grant on Redis of lock `keys` to `token`, with the store's `fence`
    /// (before the fence epoch).
    pub(crate) fn on_redis(
        name: &str,
        keys: &LockKeys,
        token: &str,
        fence: Fence,
        opts: &LockOptions,
        contended: bool,
    ) -> Self {
        Granted {
            name: name.to_owned(),
            // The fence the holder is given: the store's plus the fence
            // epoch's base; the stored value keeps the store's.
            fence: Fence::new(fence.get().saturating_add(opts.fence_base(0))),
            ttl: opts.ttl,
            hold: Hold::Redis(RedisHold {
                lock: keys.lock().to_owned(),
                value: wire::lock_value(token, fence, opts.layout),
                token_len: token.len(),
                mint: Mint::new(opts),
                contended,
                replication: opts.replication,
            }),
        }
    }

    /// A grant on Redis of `field` of semaphore or read-write lock `keys`
    /// to `token`, with the store's `fence` (before the fence epoch).
    pub(crate) fn on_redis_permit(
        name: &str,
        keys: &LockKeys,
        token: &str,
        (fence, field): (Fence, PermitField),
        opts: &LockOptions,
    ) -> Self {
        Granted {
            name: name.to_owned(),
            fence: Fence::new(fence.get().saturating_add(opts.fence_base(0))),
            ttl: opts.ttl,
            hold: Hold::RedisPermit(PermitHold {
                lock: keys.lock().to_owned(),
                field,
                ident: wire::lock_value(token, fence, crate::keys::KeyLayout::HashTagged),
                token_len: token.len(),
                mint: Mint::new(opts),
                replication: opts.replication,
            }),
        }
    }

    /// A grant on etcd: `fence` is already in its epoch.
    #[cfg(feature = "etcd")]
    pub(crate) fn on_etcd(name: &str, fence: Fence, opts: &LockOptions, hold: EtcdHold) -> Self {
        Granted {
            name: name.to_owned(),
            fence,
            ttl: opts.ttl,
            hold: Hold::Etcd(hold),
        }
    }

    /// The holder token.
    pub(crate) fn token(&self) -> &str {
        match &self.hold {
            Hold::Redis(h) => &h.value[..h.token_len],
            Hold::RedisPermit(h) => &h.ident[..h.token_len],
            #[cfg(feature = "etcd")]
            Hold::Etcd(h) => &h.token,
        }
    }

    /// What a Redis semaphore's permit holds.
    ///
    /// # Errors
    /// [`Error::UnexpectedReply`] if the grant is not a Redis permit.
    pub(crate) fn permit(&self) -> Result<&PermitHold> {
        match &self.hold {
            Hold::RedisPermit(h) => Ok(h),
            _ => Err(self.not_from("Redis semaphore")),
        }
    }

    /// What a Redis recipe holds.
    ///
    /// # Errors
    /// [`Error::UnexpectedReply`] if the grant is not Redis's.
    /// The replicas this grant's renewals wait for (Redis with
    /// [`LockOptions::wait_for_replicas`]; etcd writes are on a quorum).
    pub(crate) fn replication(&self) -> Option<Replication> {
        match &self.hold {
            Hold::Redis(h) => h.replication,
            Hold::RedisPermit(h) => h.replication,
            #[cfg(feature = "etcd")]
            Hold::Etcd(_) => None,
        }
    }

    /// The semaphore slot this grant holds, `None` for a mutex or a
    /// read-write lock.
    pub(crate) fn slot(&self) -> Option<u32> {
        match &self.hold {
            Hold::Redis(_) => None,
            Hold::RedisPermit(h) => match h.field {
                PermitField::Slot(slot) => Some(slot),
                PermitField::Writer | PermitField::Reader(_) => None,
            },
            #[cfg(feature = "etcd")]
            Hold::Etcd(h) => h.slot,
        }
    }

    /// Whether this grant is a permit of a Redis hash (a semaphore's slot,
    /// a read-write lock's reader or writer): renewed and released by the
    /// permit calls.
    pub(crate) fn is_permit(&self) -> bool {
        matches!(self.hold, Hold::RedisPermit(_))
    }

    /// The side of a read-write lock this grant holds, `None` for a mutex
    /// or a semaphore.
    pub(crate) fn access(&self) -> Option<Access> {
        match &self.hold {
            Hold::Redis(_) => None,
            Hold::RedisPermit(h) => match h.field {
                PermitField::Slot(_) => None,
                PermitField::Writer => Some(Access::Write),
                PermitField::Reader(_) => Some(Access::Read),
            },
            #[cfg(feature = "etcd")]
            Hold::Etcd(h) => h.access,
        }
    }

    pub(crate) fn redis(&self) -> Result<&RedisHold> {
        match &self.hold {
            Hold::Redis(h) => Ok(h),
            _ => Err(self.not_from("Redis mutex")),
        }
    }

    /// What an etcd recipe holds.
    ///
    /// # Errors
    /// [`Error::UnexpectedReply`] if the grant is not etcd's.
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd(&self) -> Result<&EtcdHold> {
        match &self.hold {
            Hold::Etcd(h) => Ok(h),
            _ => Err(self.not_from("etcd")),
        }
    }

    fn not_from(&self, store: &str) -> Error {
        Error::UnexpectedReply(format!(
            "the lease of {:?} was not granted as a {store} lock, but is renewed or released as one",
            self.name
        ))
    }

    /// The key holding the lease: the Redis lock key, or on etcd the
    /// holder's own key.
    pub(crate) fn key(&self) -> &str {
        match &self.hold {
            Hold::Redis(h) => &h.lock,
            Hold::RedisPermit(h) => &h.lock,
            #[cfg(feature = "etcd")]
            Hold::Etcd(h) => &h.key,
        }
    }
}

/// What the engine hands out for one successful acquisition.
#[derive(Debug)]
pub(crate) struct Acquired {
    pub(crate) granted: Granted,
    /// The local monotonic deadline: when the lease must be assumed gone
    /// (counted from when the grant, or the confirmation of a hand-over,
    /// was *sent*, less the drift margin).
    pub(crate) deadline: Instant,
    /// The lease was handed over for less than its ttl: the keeper renews
    /// it to the full ttl at once.
    pub(crate) renew_now: bool,
}
