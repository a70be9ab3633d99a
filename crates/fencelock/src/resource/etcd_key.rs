//! A key in etcd guarded by fences (feature `etcd`).

use std::future::Future;

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::holder_id;
use crate::keys::check_resource_key;
use crate::lease::LeaseHandle;
use crate::metrics::StatsHandle;
use crate::resource::{Fenced, ValidatedRead, WriteOutcome, check_holder};
use crate::store::etcd::{
    EtcdConn, KeyWrite, Stored, in_lock_space, read_key, seal_key, write_key,
};

/// How often a read-modify-write retries when the key changed between its
/// read and its write.
const MAX_RMW_ATTEMPTS: usize = 100;

/// Separates a fenced key from the slot of a slot view in etcd: the ASCII
/// unit separator (U+001F). It is a control character, which no resource
/// key may contain (`check_resource_key` refuses them), so the key of a
/// slot can never be the key of another resource, whatever its name; and it
/// is not `/`, so a slot of a key outside the lock space stays outside it.
const SLOT_SEPARATOR: char = '\u{1f}';

/// The etcd key of `slot`'s pair of the fenced key whose etcd key is
/// `base`: `BASE`, [`SLOT_SEPARATOR`], `slot:`, the slot in decimal.
/// Exact keys, never a prefix: slot 1 and slot 11 are two keys.
fn slot_key(base: &str, slot: u32) -> String {
    format!("{base}{SLOT_SEPARATOR}slot:{slot}")
}

/// A key in etcd written only through the fence check, for state kept in
/// etcd next to its locks. The check runs inside etcd, in one transaction:
///
/// - [`FencedKey::write`] (and the [`Fenced`] trait) applies the resource
///   rule of [`fence_accepts`](crate::fence_accepts), with any fence — an
///   etcd lock's, or another backend's;
/// - [`FencedKey::write_held`] also compares the writer's lock key: it must
///   still exist with the create revision it was granted at (etcd's
///   `IsOwner` check). A holder whose lease expired is refused even when
///   nobody has written since.
///
/// The stored value is `FENCE:HOLDER:VALUE` (the fence as 20 digits, the
/// writer's public [`holder_id`](crate::holder_id), the value);
/// [`FencedKey::read`] decodes it. Write the key only through `FencedKey`.
///
/// A slot view ([`FencedKey::slot`], for a semaphore's permits) keeps the
/// pair of one slot in a key of its own, `KEY` + `U+001F` + `slot:N`, under
/// the same rule; see "Per-slot fencing" on
/// [`FencedHash`](crate::FencedHash) for what it protects and what it does
/// not.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::LockClient;
///
/// let client = LockClient::connect("etcd://127.0.0.1:2379").await?;
/// let lease = client.acquire("invoice:42", &client.options()).await?;
/// let invoice = client.fenced_key("invoices/42")?;
/// if !invoice.write_held(&lease, "closed").await?.is_accepted() {
///     // no longer the holder, or a newer fence wrote: stop
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FencedKey {
    conn: EtcdConn,
    /// The key as given.
    key: String,
    /// The key in etcd: the client's namespace, then the key.
    full_key: String,
    /// The `resource` label of its metrics.
    family: String,
    stats: Option<StatsHandle>,
    /// The slot whose pair this view writes (`full_key` is then the slot's
    /// key); `None`: the key itself.
    slot: Option<u32>,
}

/// What a [`FencedKey`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyState {
    /// The stored value, if any (a value not written by `FencedKey` is
    /// returned whole, without fence or holder).
    pub value: Option<String>,
    /// The fence of the last accepted write.
    pub fence: Option<Fence>,
    /// The public id of its writer ([`holder_id`](crate::holder_id)).
    pub holder: Option<String>,
    /// The key's etcd mod revision (0: absent).
    pub mod_revision: i64,
}

impl From<Stored> for KeyState {
    fn from(s: Stored) -> Self {
        KeyState {
            value: s.value,
            fence: s.fence,
            holder: s.holder,
            mod_revision: s.mod_revision,
        }
    }
}

impl FencedKey {
    pub(crate) fn new(
        conn: EtcdConn,
        key: &str,
        lock_prefix: &str,
        stats: Option<StatsHandle>,
    ) -> Result<Self> {
        check_resource_key(key)?;
        if in_lock_space(lock_prefix, key) {
            // Never moved: old clients would no longer see them. Refused.
            return Err(Error::invalid_name(
                key,
                "a fenced etcd key must not start with the lock prefix and contain '/' after it: there it lies in a lock's key range (PREFIX NAME/), where etcd's lock recipe would take it for a holder that never expires; choose a key outside the lock prefix",
            ));
        }
        Ok(FencedKey {
            full_key: format!("{}{key}", conn.namespace()),
            conn,
            key: key.to_owned(),
            family: crate::metrics::family(key).to_owned(),
            stats,
            slot: None,
        })
    }

    /// A view on the (fence, holder) pair of `slot`, kept in an etcd key of
    /// its own: the key, the unit separator `U+001F` (a control character,
    /// which no resource key may contain, so no other resource can have this
    /// key), `slot:` and the slot in decimal — for `invoices/42` and slot 3,
    /// `invoices/42\u{1f}slot:3` after the URL's namespace. Its writes (held
    /// ones too), registrations, seals, updates and reads apply the rule of
    /// [`fence_accepts`](crate::fence_accepts) to that pair only. Nothing is
    /// sent. Called on a view, it gives the view of `slot` (views do not
    /// nest). See "Per-slot fencing" on [`FencedHash`](crate::FencedHash)
    /// for what it protects and what it does not.
    ///
    /// ```no_run
    /// # async fn demo(client: fencelock::LockClient, fence: fencelock::Fence, token: &str)
    /// # -> Result<(), fencelock::Error> {
    /// let partitions = client.fenced_key("jobs/partitions")?;
    /// // A permit of slot 3: refused only by a newer fence of slot 3.
    /// let outcome = partitions.slot(3).write(fence, token, "flushed").await?;
    /// # let _ = outcome;
    /// # Ok(()) }
    /// ```
    pub fn slot(&self, slot: u32) -> FencedKey {
        let base = format!("{}{}", self.conn.namespace(), self.key);
        FencedKey {
            full_key: slot_key(&base, slot),
            slot: Some(slot),
            ..self.clone()
        }
    }

    /// The slot of a view made by [`FencedKey::slot`]; `None` for the key
    /// itself.
    pub fn slot_number(&self) -> Option<u32> {
        self.slot
    }

    /// Sets the `resource` label of this key's metrics and its key in the
    /// client's stats (default: the key's family, see [`crate::metrics`]).
    pub fn metrics_family(mut self, family: impl Into<String>) -> Self {
        self.family = family.into();
        self
    }

    /// The key, as given (without the URL's namespace); a slot view's is
    /// the same (its pair lives in the slot's key, see [`FencedKey::slot`]).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Writes `value` if `fence`, held by the holder with token `holder`,
    /// is not stale ([`fence_accepts`](crate::fence_accepts)).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for an empty token; etcd errors. A stale
    /// fence is [`WriteOutcome::Rejected`].
    pub async fn write(&self, fence: Fence, holder: &str, value: &str) -> Result<WriteOutcome> {
        check_holder(holder)?;
        let id = holder_id(holder);
        let outcome = write_key(&self.conn, &self.full_key, fence, &id, value, None, None).await?;
        self.outcome(fence, outcome)
    }

    /// Writes `value` with `lease`'s fence and token, only while `lease`
    /// still holds its lock: one transaction compares the lock key's create
    /// revision, then applies the fence rule.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a lease not granted by etcd; etcd
    /// errors. A refused write is [`WriteOutcome::Rejected`].
    pub async fn write_held(&self, lease: &LeaseHandle, value: &str) -> Result<WriteOutcome> {
        let (lock_key, revision) = owner_of(lease)?;
        let id = holder_id(lease.token());
        let outcome = write_key(
            &self.conn,
            &self.full_key,
            lease.fence(),
            &id,
            value,
            Some((lock_key, revision)),
            None,
        )
        .await?;
        self.outcome(lease.fence(), outcome)
    }

    /// Records `fence` and `holder` without changing the value (a
    /// read-modify-write through [`FencedKey::write`] then loses no update
    /// to a stale holder); under the rule of a write.
    ///
    /// # Errors
    /// As [`FencedKey::write`].
    pub async fn register(&self, fence: Fence, holder: &str) -> Result<WriteOutcome> {
        self.update_with(fence, holder, None, |v| {
            v.map(str::to_owned).unwrap_or_default()
        })
        .await
    }

    /// Seals the key at `fence`: records `fence` with the holder
    /// [`REVOKED_HOLDER`](crate::REVOKED_HOLDER) (the value is kept),
    /// unless a greater fence is recorded already, so that every write with
    /// a fence up to `fence` is refused from then on and every greater one
    /// accepted. A revoke ([`LockClient::revoke`](crate::LockClient::revoke))
    /// seals its resources at its revocation fence; an equal fence recorded
    /// by a holder is sealed too (that holder is the one revoked). A key
    /// that does not exist is created with an empty value.
    ///
    /// # Errors
    /// etcd errors. A greater fence recorded already is
    /// [`WriteOutcome::Rejected`] (the key is sealed by it as well).
    pub async fn seal(&self, fence: Fence) -> Result<WriteOutcome> {
        for _ in 0..MAX_RMW_ATTEMPTS {
            let current = read_key(&self.conn, &self.full_key).await?;
            if current.fence.is_some_and(|stored| stored > fence) {
                return self.outcome(fence, KeyWrite::Stale(current));
            }
            let value = current.value.as_deref().unwrap_or_default();
            if Box::pin(seal_key(
                &self.conn,
                &self.full_key,
                fence,
                value,
                current.mod_revision,
            ))
            .await?
            {
                return self.outcome(fence, KeyWrite::Accepted);
            }
        }
        Err(Error::InvalidOption(format!(
            "{}: the key changed under every one of {MAX_RMW_ATTEMPTS} attempts to seal it",
            self.described()
        )))
    }

    /// A read-modify-write that loses no update: reads the value, computes
    /// the new one with `update`, and writes it with the fence rule and only
    /// if the key did not change since the read (else reads again).
    ///
    /// # Errors
    /// As [`FencedKey::write`].
    pub async fn update(
        &self,
        fence: Fence,
        holder: &str,
        update: impl FnMut(Option<&str>) -> String,
    ) -> Result<WriteOutcome> {
        self.update_with(fence, holder, None, update).await
    }

    /// [`FencedKey::update`] while `lease` still holds its lock (as
    /// [`FencedKey::write_held`]).
    ///
    /// # Errors
    /// As [`FencedKey::write_held`].
    pub async fn update_held(
        &self,
        lease: &LeaseHandle,
        update: impl FnMut(Option<&str>) -> String,
    ) -> Result<WriteOutcome> {
        let owner = owner_of(lease)?;
        self.update_with(lease.fence(), lease.token(), Some(owner), update)
            .await
    }

    async fn update_with(
        &self,
        fence: Fence,
        holder: &str,
        owner: Option<(&str, i64)>,
        mut update: impl FnMut(Option<&str>) -> String,
    ) -> Result<WriteOutcome> {
        check_holder(holder)?;
        let id = holder_id(holder);
        for _ in 0..MAX_RMW_ATTEMPTS {
            let current = read_key(&self.conn, &self.full_key).await?;
            let next = update(current.value.as_deref());
            let outcome = write_key(
                &self.conn,
                &self.full_key,
                fence,
                &id,
                &next,
                owner,
                Some(current.mod_revision),
            )
            .await?;
            if outcome != KeyWrite::Changed {
                return self.outcome(fence, outcome);
            }
        }
        Err(Error::InvalidOption(format!(
            "{}: the key changed under every one of {MAX_RMW_ATTEMPTS} read-modify-write attempts",
            self.described()
        )))
    }

    /// Reads value, fence and holder.
    ///
    /// # Errors
    /// etcd errors.
    pub async fn read(&self) -> Result<KeyState> {
        Ok(read_key(&self.conn, &self.full_key).await?.into())
    }

    /// Reads value, fence and holder in one etcd read ([`FencedKey::read`])
    /// and checks the read against a reader's write epoch (`epoch`: a read
    /// lease's [`fence`](crate::LeaseHandle::fence)) by
    /// [`read_is_clean`](crate::read_is_clean): [`ValidatedRead::Torn`] if
    /// the stored fence is greater, so a writer granted after the reader has
    /// written what was read. A view checks its slot's key
    /// ([`FencedKey::slot`]). A value not written by `FencedKey` has no
    /// fence and is clean.
    ///
    /// # Errors
    /// As [`FencedKey::read`]. A torn read is not an error.
    pub async fn read_validated(&self, epoch: Fence) -> Result<ValidatedRead<KeyState>> {
        let state = self.read().await?;
        let stored = state.fence;
        Ok(ValidatedRead::check(state, stored, epoch))
    }

    /// The key, and the slot of a view, for messages.
    fn described(&self) -> String {
        match self.slot {
            None => self.key.clone(),
            Some(slot) => format!("{} slot {slot}", self.key),
        }
    }

    fn outcome(&self, fence: Fence, outcome: KeyWrite) -> Result<WriteOutcome> {
        let accepted = outcome == KeyWrite::Accepted;
        crate::metrics::fenced_write(self.stats.as_ref(), &self.family, accepted);
        match outcome {
            KeyWrite::Accepted => {
                tracing::debug!(resource = %self.key, slot = ?self.slot, %fence, "fenced write accepted");
                Ok(WriteOutcome::Accepted)
            }
            KeyWrite::Stale(stored) | KeyWrite::NotHolder(stored) => {
                tracing::warn!(resource = %self.key, slot = ?self.slot, %fence, current = ?stored.fence, "fenced write rejected: a holder outlived its lease");
                Ok(WriteOutcome::Rejected {
                    current_fence: stored.fence,
                    current_holder: stored.holder,
                })
            }
            KeyWrite::Changed => Err(Error::UnexpectedReply(
                "etcd fenced write: the key changed".into(),
            )),
        }
    }
}

/// The lock key and create revision of an etcd lease.
fn owner_of(lease: &LeaseHandle) -> Result<(&str, i64)> {
    match lease.state.grant.etcd() {
        Ok(held) => Ok((lease.key(), held.revision)),
        Err(_) => Err(Error::InvalidOption(format!(
            "lock {:?} was not granted by etcd: a held write compares an etcd lock key (use write with its fence instead)",
            lease.name()
        ))),
    }
}

impl Fenced for FencedKey {
    /// The new value.
    type Write = str;

    /// [`FencedKey::write`]: the same call, through the trait.
    fn fenced_write(
        &self,
        fence: Fence,
        holder: &str,
        value: &str,
    ) -> impl Future<Output = Result<WriteOutcome>> + Send {
        self.write(fence, holder, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_keys_are_exact_distinct_and_outside_every_user_key() {
        let (one, eleven) = (slot_key("ns/doc", 1), slot_key("ns/doc", 11));
        assert_eq!(one, "ns/doc\u{1f}slot:1");
        assert_ne!(one, eleven);
        assert_eq!(slot_key("ns/doc", u32::MAX), "ns/doc\u{1f}slot:4294967295");
        // No '/' added: a key outside the lock space stays outside it.
        assert!(!one.trim_start_matches("ns/doc").contains('/'));
        // No resource key may contain the separator, so none equals a slot's key.
        assert!(check_resource_key("doc\u{1f}slot:1").is_err());
    }
}
