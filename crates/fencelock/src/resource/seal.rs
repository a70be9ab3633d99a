//! Sealing resources at a revocation fence: [`Sealable`], and what a
//! revoke reports ([`Revoked`], [`Sealed`]). A seal records the holder
//! [`REVOKED_HOLDER`](crate::REVOKED_HOLDER) (`crate::holder`).
//!
//! A seal is the one write with another rule than [`fence_accepts`](crate::fence_accepts):
//! it records fence `F` with the holder [`REVOKED_HOLDER`](crate::REVOKED_HOLDER) when nothing
//! greater is stored, *an equal fence from any holder included* — that
//! holder is the one revoked. Afterwards every write with a fence up to
//! `F` is refused (an equal fence too: no holder id equals
//! [`REVOKED_HOLDER`](crate::REVOKED_HOLDER)), and every greater one accepted.

use std::future::Future;
use std::pin::Pin;

use crate::engine::Deposed;
use crate::error::Result;
use crate::fence::Fence;
use crate::resource::{FencedHash, WriteOutcome};

/// A future a [`Sealable`] returns (boxed, so that a revoke can take
/// resources of different kinds in one list).
pub type SealFuture<'a> = Pin<Box<dyn Future<Output = Result<WriteOutcome>> + Send + 'a>>;

/// A resource a revoke can seal ([`LockClient::revoke`](crate::LockClient::revoke)):
/// [`FencedHash`], `FencedKey` (feature `etcd`), `FencedRow` (feature
/// `postgres`), or your own.
///
/// # Implementing it
///
/// `seal(fence)` must, atomically, record `fence` and the holder
/// [`REVOKED_HOLDER`](crate::REVOKED_HOLDER) (keeping the value) iff nothing is stored or the
/// stored fence is at most `fence`, and return [`WriteOutcome::Accepted`];
/// else leave the resource alone and return [`WriteOutcome::Rejected`] with
/// what it holds. Its writes must keep applying
/// [`fence_accepts`](crate::fence_accepts), which then refuses every fence
/// up to the sealed one.
pub trait Sealable: Send + Sync {
    /// The resource's name in reports and errors (a key; a table and row).
    fn resource(&self) -> String;

    /// Seals the resource at `fence` (see the trait's docs).
    fn seal(&self, fence: Fence) -> SealFuture<'_>;
}

impl Sealable for FencedHash {
    /// The key; for a slot view, the key and the slot (`KEY slot N`).
    fn resource(&self) -> String {
        match self.slot_number() {
            None => self.key().to_owned(),
            Some(slot) => format!("{} slot {slot}", self.key()),
        }
    }

    fn seal(&self, fence: Fence) -> SealFuture<'_> {
        Box::pin(FencedHash::seal(self, fence))
    }
}

#[cfg(feature = "etcd")]
impl Sealable for crate::resource::FencedKey {
    /// The key as given; for a slot view, the key and the slot (`KEY slot N`).
    fn resource(&self) -> String {
        match self.slot_number() {
            None => self.key().to_owned(),
            Some(slot) => format!("{} slot {slot}", self.key()),
        }
    }

    fn seal(&self, fence: Fence) -> SealFuture<'_> {
        Box::pin(crate::resource::FencedKey::seal(self, fence))
    }
}

#[cfg(feature = "postgres")]
impl<K: crate::resource::postgres::RowKey> Sealable for crate::resource::postgres::FencedRow<K> {
    fn resource(&self) -> String {
        format!(
            "{} row {} = {:?}",
            self.table().table(),
            self.table().key_column(),
            self.key()
        )
    }

    fn seal(&self, fence: Fence) -> SealFuture<'_> {
        Box::pin(self.table().seal(self.table().pool(), self.key(), fence))
    }
}

/// What [`LockClient::revoke`](crate::LockClient::revoke) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revoked {
    /// The lock's name.
    pub name: String,
    /// The revocation fence: at or above the deposed holder's fence, below
    /// every later holder's. The resources were sealed at it.
    pub fence: Fence,
    /// The holder whose lock was taken away; `None` when the lock was free
    /// (the resources were sealed all the same, against any holder whose
    /// lease had ended).
    pub deposed: Option<Deposed>,
    /// Each resource, in the order given, and how its seal came out.
    pub sealed: Vec<Sealed>,
}

/// How one resource's seal came out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sealed {
    /// The resource ([`Sealable::resource`]).
    pub resource: String,
    /// [`WriteOutcome::Accepted`]: sealed at the revocation fence.
    /// [`WriteOutcome::Rejected`]: a later holder had written already,
    /// with a greater fence, which refuses the deposed holder as well.
    pub outcome: WriteOutcome,
}
