//! Fenced resources: the storage half of safety.
//!
//! A lease cannot stop a holder that does not know it lost the lock; only the
//! resource can, by refusing writes that carry an older fence. The rule
//! (docs/design.md §2.4, [`fence_accepts`]): a write is accepted iff its fence is
//! greater than the stored fence, or equal to it *and* from the same holder
//! token. A resource that has no fence yet accepts any write.
//!
//! Rejections are a normal outcome ([`WriteOutcome::Rejected`]), not an
//! error: they mean a holder outlived its lease and the resource protected
//! the newer holder's work.
//!
//! Ready-made resources: [`FencedHash`] (a Redis hash), with the `postgres`
//! feature `FencedTable` (rows of a Postgres table), and with the `etcd`
//! feature `FencedKey` (a key in etcd, which can also check that the writer
//! still holds its etcd lock). Anything else that can do a conditional
//! write implements [`Fenced`]. Each takes fences from any backend: a
//! Redis lock can guard an etcd key and an etcd lock a Redis hash.
//!
//! A revoke seals resources ([`Sealable`], `seal.rs`): every fence up to
//! the revocation fence is refused there from then on.
//!
//! Readers of a fenced read-write lock do not write; they validate what they
//! read ([`read_is_clean`], [`ValidatedRead`]): a read is clean iff the
//! resource's stored fence is absent or at most the reader's write epoch.
//! Each ready-made resource has a `read_validated`.

#[cfg(feature = "etcd")]
mod etcd_key;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod redis_hash;
mod seal;

#[cfg(feature = "etcd")]
pub use etcd_key::{FencedKey, KeyState};
pub use redis_hash::{FencedHash, HashState};
pub use seal::{Revoked, SealFuture, Sealable, Sealed};

use std::future::Future;

use crate::error::{Error, Result};
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
        /// The public id of the holder the resource held
        /// ([`holder_id`](crate::holder_id)), if recorded.
        current_holder: Option<String>,
    },
}

impl WriteOutcome {
    /// True for [`WriteOutcome::Accepted`].
    pub fn is_accepted(&self) -> bool {
        matches!(self, WriteOutcome::Accepted)
    }
}

/// The resource rule of docs/design.md §2.4: may a write carrying `fence` from
/// `holder` replace what was written under `stored` by `stored_holder`?
///
/// - nothing stored yet (`stored == None`): yes;
/// - `fence > stored`: yes (a newer holder);
/// - `fence == stored`: only if `stored_holder` is known and equals `holder`
///   (the same holder writing again; both are public holder ids,
///   [`holder_id`](crate::holder_id) of the tokens). Two *different* holders can be issued
///   the same fence after the lock service lost its counter; the guide's
///   `fence >= stored` would accept both;
/// - `fence < stored`: no (a stale holder).
///
/// Implementations of [`Fenced`] must apply exactly this rule, atomically
/// with the write.
///
/// ```
/// use fencelock::{Fence, fence_accepts};
///
/// let (f33, f34) = (Fence::new(33), Fence::new(34));
/// assert!(fence_accepts(None, None, f33, "a"));
/// assert!(fence_accepts(Some(f33), Some("a"), f34, "b"));
/// assert!(!fence_accepts(Some(f34), Some("b"), f33, "a"));
/// assert!(fence_accepts(Some(f34), Some("b"), f34, "b"));
/// assert!(!fence_accepts(Some(f34), Some("b"), f34, "c"));
/// assert!(!fence_accepts(Some(f34), None, f34, "b"));
/// ```
pub fn fence_accepts(
    stored: Option<Fence>,
    stored_holder: Option<&str>,
    fence: Fence,
    holder: &str,
) -> bool {
    match stored {
        None => true,
        Some(stored) if fence > stored => true,
        Some(stored) if fence == stored => stored_holder == Some(holder),
        Some(_) => false,
    }
}

/// The reader's rule of a fenced read-write lock: is a read clean, given the
/// fence the resource stored (`stored`, read in the same atomic step as the
/// data, or after it) and the reader's write epoch (`epoch`, its lease's
/// [`fence`](crate::LeaseHandle::fence): the last fence issued for the name when
/// the read lease was granted)?
///
/// - nothing stored (`stored == None`): clean (no fenced write at all);
/// - `stored <= epoch`: clean (the last write came from a writer at or
///   before the reader's epoch);
/// - `stored > epoch`: **torn**. Every writer granted after the reader has a
///   fence greater than `epoch`, so one of them has written: the reader
///   outlived its lease (or read outside it) and a writer came in.
///
/// Fences at a resource only grow, so a check made *after* the read (not
/// atomically with it) is conservative: a writer that had written before the
/// read is still visible to the check. [`ValidatedRead`] carries the result
/// with the value; the resources' `read_validated` apply this rule.
///
/// ```
/// use fencelock::{Fence, read_is_clean};
///
/// let epoch = Fence::new(40);
/// assert!(read_is_clean(None, epoch)); // never written under a lock
/// assert!(read_is_clean(Some(Fence::new(39)), epoch));
/// assert!(read_is_clean(Some(Fence::new(40)), epoch)); // the epoch's own writer
/// assert!(!read_is_clean(Some(Fence::new(41)), epoch)); // a later writer wrote
/// ```
pub fn read_is_clean(stored: Option<Fence>, epoch: Fence) -> bool {
    match stored {
        None => true,
        Some(stored) => stored <= epoch,
    }
}

/// A read checked against a reader's write epoch ([`read_is_clean`]): the
/// value read, and whether a writer granted after the reader had written it.
///
/// Returned by [`FencedHash::read_validated`], `FencedKey::read_validated`
/// (feature `etcd`) and `FencedTable::read_validated` (feature `postgres`).
/// A torn read still carries what was read (to log it, or to compare), but
/// it is not the state as of the reader's epoch: do not act on it as if it
/// were; stop, or acquire again and read again.
///
/// ```
/// use fencelock::{Fence, ValidatedRead};
///
/// fn report(read: ValidatedRead<String>) -> Option<String> {
///     match read {
///         ValidatedRead::Clean(value) => Some(value),
///         ValidatedRead::Torn { fence, .. } => {
///             eprintln!("a writer with fence {fence} came in: read again");
///             None
///         }
///         _ => None, // non_exhaustive
///     }
/// }
/// # assert_eq!(report(ValidatedRead::Clean("x".into())), Some("x".into()));
/// # let torn = ValidatedRead::Torn { value: "y".to_owned(), fence: Fence::new(9) };
/// # assert_eq!(report(torn), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a torn read must not be used as clean"]
#[non_exhaustive]
pub enum ValidatedRead<T> {
    /// No writer after the reader's epoch had written: the stored fence was
    /// absent or at most the epoch. The value is what the reader's epoch
    /// admits.
    Clean(T),
    /// A writer with a later fence had written: the stored fence is greater
    /// than the reader's epoch. The value is what was read; it may be that
    /// writer's (a read-write lock's reader must not see it).
    Torn {
        /// What was read.
        value: T,
        /// The fence the resource stored, greater than the reader's epoch.
        fence: Fence,
    },
}

impl<T> ValidatedRead<T> {
    /// `Clean(value)` or `Torn { value, fence }` by [`read_is_clean`]: the
    /// one place a resource turns its stored fence into the verdict.
    pub(crate) fn check(value: T, stored: Option<Fence>, epoch: Fence) -> Self {
        match stored {
            Some(fence) if !read_is_clean(stored, epoch) => ValidatedRead::Torn { value, fence },
            _ => ValidatedRead::Clean(value),
        }
    }

    /// True for [`ValidatedRead::Clean`].
    pub fn is_clean(&self) -> bool {
        matches!(self, ValidatedRead::Clean(_))
    }

    /// The value of a clean read; `None` for a torn one.
    pub fn clean(self) -> Option<T> {
        match self {
            ValidatedRead::Clean(value) => Some(value),
            ValidatedRead::Torn { .. } => None,
        }
    }

    /// The value read, clean or torn (check [`ValidatedRead::is_clean`]
    /// before acting on it).
    pub fn value(&self) -> &T {
        match self {
            ValidatedRead::Clean(value) | ValidatedRead::Torn { value, .. } => value,
        }
    }

    /// The value read, clean or torn (check [`ValidatedRead::is_clean`]
    /// before acting on it).
    pub fn into_value(self) -> T {
        match self {
            ValidatedRead::Clean(value) | ValidatedRead::Torn { value, .. } => value,
        }
    }
}

/// Refuses an empty holder token: a fenced write records its holder, and an
/// empty one could not be told apart from another empty one (two holders
/// sharing the same fence would both be accepted).
///
/// # Errors
/// [`Error::InvalidOption`] for an empty `holder`.
pub(crate) fn check_holder(holder: &str) -> Result<()> {
    if holder.is_empty() {
        return Err(Error::InvalidOption(
            "the holder token of a fenced write is empty".into(),
        ));
    }
    Ok(())
}

/// A resource that refuses stale writes: anything that can make a write
/// conditional on what it stores — a row with a fence column, an object
/// store's `If-Match`, a version column, a compare-and-set.
///
/// A write takes the lease's [`Fence`] and secret holder token (`lease.fence()`,
/// `lease.token()`) and returns [`WriteOutcome::Accepted`] when it was applied,
/// or [`WriteOutcome::Rejected`] with the resource's current fence and holder
/// when it was refused as stale. Errors are for failures (connection lost,
/// bad input), never for a stale fence, and a write that returns an error
/// must not have been applied partially.
///
/// # Implementing it
///
/// The resource must store the fence and the holder's public id
/// ([`holder_id`](crate::holder_id) of the token, never the token itself) of
/// the last accepted write
/// next to the data, and check [`fence_accepts`] and write **in one atomic
/// step** (one conditional statement, one script, one conditional request);
/// a check followed by a separate write lets a stale holder slip in between.
///
/// The method returns `impl Future + Send` rather than being an `async fn`
/// so that generic callers can rely on the future being `Send` (and
/// `tokio::spawn` it); an `async fn` in a public trait cannot promise that.
/// Implementations may still be written as `async fn`, as below.
///
/// A compare-and-set cell (in memory here; the same shape fits any store
/// with an atomic conditional write):
///
/// ```
/// use std::sync::Mutex;
/// use fencelock::{Fence, Fenced, Result, WriteOutcome, fence_accepts, holder_id};
///
/// #[derive(Default)]
/// struct Cell {
///     // value, fence of the last accepted write, its holder
///     state: Mutex<(String, Option<Fence>, Option<String>)>,
/// }
///
/// impl Fenced for Cell {
///     type Write = str;
///
///     async fn fenced_write(&self, fence: Fence, token: &str, value: &str) -> Result<WriteOutcome> {
///         let holder = holder_id(token);
///         // The mutex makes check-and-write one atomic step.
///         let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
///         let (stored_value, stored, stored_holder) = &mut *state;
///         if !fence_accepts(*stored, stored_holder.as_deref(), fence, &holder) {
///             return Ok(WriteOutcome::Rejected {
///                 current_fence: *stored,
///                 current_holder: stored_holder.clone(),
///             });
///         }
///         *stored_value = value.to_owned();
///         *stored = Some(fence);
///         *stored_holder = Some(holder);
///         Ok(WriteOutcome::Accepted)
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let cell = Cell::default();
/// // B (fence 2) writes first; A wakes from its pause and writes with fence 1.
/// assert!(cell.fenced_write(Fence::new(2), "b", "closed by B").await?.is_accepted());
/// let stale = cell.fenced_write(Fence::new(1), "a", "closed by A").await?;
/// assert_eq!(stale, WriteOutcome::Rejected {
///     current_fence: Some(Fence::new(2)),
///     current_holder: Some(holder_id("b")),
/// });
/// # Ok::<(), fencelock::Error>(()) }).unwrap();
/// ```
///
/// An object store with conditional requests: keep the fence and holder in
/// the object's metadata, read them with the object's `ETag`, decide with
/// [`fence_accepts`], and write with `If-Match: <etag>`. A `412 Precondition
/// Failed` means someone wrote in between: read again and decide again (the
/// newer write may carry a newer fence):
///
/// ```no_run
/// use fencelock::{Fence, Fenced, Result, WriteOutcome, fence_accepts, holder_id};
/// # struct Head { etag: String, fence: Option<Fence>, holder: Option<String> }
/// # enum Put { Done, PreconditionFailed }
/// # struct Bucket;
/// # impl Bucket {
/// #     async fn head(&self, _key: &str) -> Result<Head> {
/// #         Ok(Head { etag: String::new(), fence: None, holder: None })
/// #     }
/// #     async fn put_if_match(&self, _key: &str, _etag: &str, _body: &[u8],
/// #         _meta: &[(&str, String)]) -> Result<Put> { Ok(Put::Done) }
/// # }
///
/// /// One object in a bucket (`Bucket` stands for your object-store client).
/// struct FencedObject { bucket: Bucket, key: String }
///
/// impl Fenced for FencedObject {
///     type Write = [u8];
///
///     async fn fenced_write(&self, fence: Fence, token: &str, body: &[u8]) -> Result<WriteOutcome> {
///         let holder = holder_id(token);
///         loop {
///             let head = self.bucket.head(&self.key).await?;
///             if !fence_accepts(head.fence, head.holder.as_deref(), fence, &holder) {
///                 return Ok(WriteOutcome::Rejected {
///                     current_fence: head.fence,
///                     current_holder: head.holder,
///                 });
///             }
///             let meta = [("lock-fence", fence.to_string()), ("lock-holder", holder.clone())];
///             match self.bucket.put_if_match(&self.key, &head.etag, body, &meta).await? {
///                 Put::Done => return Ok(WriteOutcome::Accepted),
///                 Put::PreconditionFailed => continue, // changed since `head`: decide again
///             }
///         }
///     }
/// }
/// ```
///
/// A table with a version column is the same as a fence column: one
/// conditional `UPDATE … SET …, lock_fence = $f, lock_holder = $h WHERE id =
/// $k AND (lock_fence IS NULL OR lock_fence < $f OR (lock_fence = $f AND
/// lock_holder = $h))`, accepted iff one row was updated. With the `postgres`
/// feature, `FencedTable` does this for Postgres, and tells a stale fence
/// apart from a missing row.
///
/// # Read-modify-write
///
/// A fenced write alone does not stop a stale write that lands *between* the
/// new holder's read and its write (the stale fence is still the newest the
/// resource has seen), and the new holder then overwrites it with a value
/// computed from a stale read: a lost update. Either register the fence at
/// the resource before reading ([`FencedHash::register`],
/// `FencedTable::register`), or compute the new value inside the resource in
/// one conditional statement or script (`FencedTable::update` with
/// `SET v = v + 1`).
pub trait Fenced {
    /// What one write carries: a value, a set of column changes, an object
    /// body. Passed by reference.
    type Write: ?Sized;

    /// Applies `write` iff `fence` from `holder` passes [`fence_accepts`]
    /// against the fence and holder the resource stores, recording `fence`
    /// and `holder` with it — all in one atomic step.
    ///
    /// # Errors
    /// Failures of the resource (connection, bad input, a missing record);
    /// never a stale fence, which is [`WriteOutcome::Rejected`]. A write that
    /// returned an error was not applied.
    fn fenced_write(
        &self,
        fence: Fence,
        holder: &str,
        write: &Self::Write,
    ) -> impl Future<Output = Result<WriteOutcome>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_and_equal_fences_are_clean_greater_ones_torn() {
        let epoch = Fence::new(40);
        assert!(read_is_clean(None, epoch));
        assert!(read_is_clean(None, Fence::new(0)));
        assert!(read_is_clean(Some(Fence::new(0)), epoch));
        assert!(read_is_clean(Some(epoch), epoch), "equal is clean");
        assert!(!read_is_clean(Some(Fence::new(41)), epoch));
    }

    #[test]
    fn u64_max_compares_exactly() {
        let max = Fence::new(u64::MAX);
        let below = Fence::new(u64::MAX - 1);
        assert!(read_is_clean(Some(max), max));
        assert!(read_is_clean(Some(below), max));
        assert!(!read_is_clean(Some(max), below));
        assert!(!read_is_clean(Some(max), Fence::new(0)));
    }

    #[test]
    fn check_carries_the_value_and_the_later_fence() {
        let epoch = Fence::new(7);
        let clean = ValidatedRead::check("a", Some(epoch), epoch);
        assert_eq!(clean, ValidatedRead::Clean("a"));
        assert!(clean.is_clean());
        assert_eq!(clean.value(), &"a");
        assert_eq!(clean.clean(), Some("a"));
        assert_eq!(ValidatedRead::check("n", None, epoch).clean(), Some("n"));

        let torn = ValidatedRead::check("b", Some(Fence::new(8)), epoch);
        assert_eq!(
            torn,
            ValidatedRead::Torn {
                value: "b",
                fence: Fence::new(8)
            }
        );
        assert!(!torn.is_clean());
        assert_eq!(torn.value(), &"b");
        assert_eq!(torn.clone().into_value(), "b");
        assert_eq!(torn.clean(), None, "a torn read has no clean value");
    }
}
