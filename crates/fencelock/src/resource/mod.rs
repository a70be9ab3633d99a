//! Fenced resources: the storage half of safety.
//!
//! A lease cannot stop a holder that does not know it lost the lock; only the
//! resource can, by refusing writes that carry an older fence. The rule
//! (DESIGN.md §2.4): a write is accepted iff its fence is greater than the
//! stored fence, or equal to it *and* from the same holder token.
//!
//! Rejections are a normal outcome ([`WriteOutcome::Rejected`]), not an
//! error: they mean a holder outlived its lease and the resource protected
//! the newer holder's work.

mod redis_hash;

pub use redis_hash::{FencedHash, HashState};

use crate::fence::Fence;

/// The result of a fenced write or fence registration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// The write was applied.
    Accepted,
    /// The write was refused as stale; nothing changed.
    Rejected {
        /// The fence the resource held (the newer holder's).
        current_fence: Option<Fence>,
        /// The holder token the resource held, if recorded.
        current_holder: Option<String>,
    },
}

impl WriteOutcome {
    /// True for [`WriteOutcome::Accepted`].
    pub fn is_accepted(&self) -> bool {
        matches!(self, WriteOutcome::Accepted)
    }
}
