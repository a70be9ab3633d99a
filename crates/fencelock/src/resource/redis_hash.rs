//! A Redis hash guarded by fences (the guide's step 3).

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::keys::{check_resource_key, is_lock_key};
use crate::metrics::StatsHandle;
use crate::options::Replication;
use crate::resource::{Fenced, ValidatedRead, WriteOutcome, check_holder};
use crate::store::redis::RedisConn;
use crate::store::redis::ops::{Change, FencedWrite};

/// A Redis hash with fields `value`, `fence` and `holder` (the writer's
/// public [`holder_id`](crate::holder_id), which the write script derives
/// from the token it is given), written only
/// through the fence check. Compatible with the guide's hash (`fence`,
/// `value`); a hash without `holder` is read as "holder unknown", so an equal
/// fence is then refused.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let lease = client.acquire("invoice:42", &client.options()).await?;
/// let invoice = client.fenced_hash("invoice:42:data")?;
/// if !invoice.write(lease.fence(), lease.token(), "closed").await?.is_accepted() {
///     // a newer holder exists: stop, do not retry the write
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
///
/// # Per-slot fencing (a semaphore's permits)
///
/// One stored fence cannot fence N holders at once: the permits of a
/// semaphore each hold a slot `0..N` and a fence of their own, minted from
/// the name's one counter, so live permits' fences interleave, and a stale
/// permit's fence can lie between two live ones. [`FencedHash::slot`] gives
/// a view of the same key that keeps **one (fence, holder) pair per slot**,
/// in the fields `fence:SLOT`, `holder:SLOT` and `value:SLOT`; its
/// [`write`](FencedHash::write), [`register`](FencedHash::register),
/// [`seal`](FencedHash::seal), [`update`](FencedHash::update) and
/// [`read`](FencedHash::read) apply the rule of
/// [`fence_accepts`](crate::fence_accepts) to that slot's pair only. The
/// hash's own fields (`fence`, `holder`, `value`) belong to the unslotted
/// hash, which a mutex uses, and no slot touches them.
///
/// What it protects: each slot's partition against a stale holder of the
/// *same* slot (a permit that outlived its lease, after the slot was
/// granted again with a greater fence). What it does not: two live permits
/// of *different* slots are both accepted whatever their fences, so it does
/// not serialize writers of one value. Give each slot its own data (the
/// "N workers, each owning the partition of its slot" pattern), and write
/// a slot only with the fence of a permit granted for that slot.
///
/// ```no_run
/// use fencelock::{Fence, FencedHash, WriteOutcome};
///
/// /// A permit's work: `slot`, `fence` and `token` come from the
/// /// semaphore's lease for this worker.
/// async fn flush(
///     partitions: &FencedHash,
///     slot: u32,
///     fence: Fence,
///     token: &str,
/// ) -> Result<(), fencelock::Error> {
///     let mine = partitions.slot(slot); // fields fence:SLOT, holder:SLOT, value:SLOT
///     match mine.write(fence, token, "flushed").await? {
///         WriteOutcome::Accepted => {}
///         // a newer permit of this slot wrote: this one is stale, stop
///         _ => return Ok(()),
///     }
///     // Reads this slot's value, fence and holder; other slots are not seen.
///     let _state = mine.read().await?;
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone)]
pub struct FencedHash {
    conn: RedisConn,
    key: String,
    /// The `resource` label of its metrics (default: the key's family).
    family: String,
    /// The creating client's stats, counting this hash's writes.
    stats: Option<StatsHandle>,
    /// Replicas that must acknowledge each accepted write.
    replication: Option<Replication>,
    /// The slot whose pair this view writes; `None`: the hash's own fields.
    slot: Option<u32>,
}

/// What a [`FencedHash`] holds: the hash's own fields, or, read through a
/// slot view ([`FencedHash::slot`]), that slot's `value:SLOT`,
/// `fence:SLOT` and `holder:SLOT`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HashState {
    /// The stored value, if any.
    pub value: Option<String>,
    /// The highest accepted fence, if any.
    pub fence: Option<Fence>,
    /// The public id of the holder that wrote `fence`
    /// ([`holder_id`](crate::holder_id)), if recorded.
    pub holder: Option<String>,
}

impl FencedHash {
    pub(crate) fn new(
        conn: RedisConn,
        key: &str,
        lock_prefix: &str,
        stats: Option<StatsHandle>,
    ) -> Result<Self> {
        check_resource_key(key)?;
        if is_lock_key(lock_prefix, key) {
            // A hash there would make that lock's next grant fail on a key
            // of the wrong type (or its fence unreadable): refused before
            // anything is sent.
            return Err(Error::invalid_name(
                key,
                "the resource key is one of a lock's own keys (the lock prefix, then {NAME}, alone or with :fence, :queue or :waiters after it): a fenced hash there would break that lock; choose a key outside the lock keys",
            ));
        }
        Ok(FencedHash {
            conn,
            key: key.to_string(),
            family: crate::metrics::family(key).to_string(),
            stats,
            replication: None,
            slot: None,
        })
    }

    /// A view of the same hash on the (fence, holder) pair of `slot`: its
    /// writes, registrations, seals, updates and reads use the fields
    /// `fence:SLOT`, `holder:SLOT` and `value:SLOT` (`SLOT` in decimal),
    /// under the rule of [`fence_accepts`](crate::fence_accepts) applied to
    /// that pair only. Nothing is sent; the view shares the connection,
    /// metrics and replication settings. Called on a view, it gives the view
    /// of `slot` (views do not nest). See "Per-slot fencing" on
    /// [`FencedHash`] for what it protects and what it does not.
    pub fn slot(&self, slot: u32) -> FencedHash {
        FencedHash {
            slot: Some(slot),
            ..self.clone()
        }
    }

    /// The slot of a view made by [`FencedHash::slot`]; `None` for the hash
    /// itself (its own fields).
    pub fn slot_number(&self) -> Option<u32> {
        self.slot
    }

    /// Sets the `resource` label of this hash's metrics and its key in the
    /// client's stats, instead of the key's family (up to the last `:`, see
    /// [`crate::metrics`]). Writes are counted in the stats of the client
    /// that created the hash.
    pub fn metrics_family(mut self, family: impl Into<String>) -> Self {
        self.family = family.into();
        self
    }

    /// After each accepted write or registration, waits until `replicas`
    /// replicas acknowledged it (Redis `WAIT`), for at most `timeout`; with
    /// fewer, the call returns [`Error::WriteNotReplicated`] (the write was
    /// applied on the primary: a failover now could lose it; writing again
    /// with the same fence and holder is accepted).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: std::time::Duration) -> Self {
        self.replication = Some(Replication { replicas, timeout });
        self
    }

    /// The hash's key (a slot view's is the same key).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Writes `value` if `fence`, held by the holder with token `holder`, is
    /// not stale.
    ///
    /// # Errors
    /// [`Error::WrongType`] if the key is not a hash; connection errors. A
    /// stale fence is not an error but [`WriteOutcome::Rejected`].
    pub async fn write(&self, fence: Fence, holder: &str, value: &str) -> Result<WriteOutcome> {
        self.call(fence, holder, Change::Write(value)).await
    }

    /// Records `fence` and `holder` without changing the value, under the same
    /// rule as [`FencedHash::write`]. Do this *before reading* in a
    /// read-modify-write: once registered, a stale holder's write can no
    /// longer land between your read and your write (a lost update that a
    /// write-only check allows).
    ///
    /// # Errors
    /// As [`FencedHash::write`].
    pub async fn register(&self, fence: Fence, holder: &str) -> Result<WriteOutcome> {
        self.call(fence, holder, Change::Register).await
    }

    /// Seals the hash at `fence`: records `fence` with the holder
    /// [`REVOKED_HOLDER`](crate::REVOKED_HOLDER) (the value is kept),
    /// unless a greater fence is recorded already, so that every write with
    /// a fence up to `fence` is refused from then on and every greater one
    /// accepted. A revoke ([`LockClient::revoke`](crate::LockClient::revoke))
    /// seals its resources at its revocation fence; an equal fence recorded
    /// by a holder is sealed too (that holder is the one revoked). A hash
    /// that does not exist is created with the fence and holder only.
    ///
    /// # Errors
    /// As [`FencedHash::write`]. A greater fence recorded already is
    /// [`WriteOutcome::Rejected`] (the hash is sealed by it as well).
    pub async fn seal(&self, fence: Fence) -> Result<WriteOutcome> {
        self.call(fence, "", Change::Seal).await
    }

    /// Registers the fence, reads the value, computes the new one with
    /// `update` and writes it: a read-modify-write that loses no update to a
    /// stale holder.
    ///
    /// # Errors
    /// As [`FencedHash::write`].
    pub async fn update(
        &self,
        fence: Fence,
        holder: &str,
        update: impl FnOnce(Option<&str>) -> String,
    ) -> Result<WriteOutcome> {
        let registered = self.register(fence, holder).await?;
        if !registered.is_accepted() {
            return Ok(registered);
        }
        let current = self.read().await?;
        let next = update(current.value.as_deref());
        self.write(fence, holder, &next).await
    }

    /// Reads value, fence and holder (a view's: those of its slot).
    ///
    /// # Errors
    /// [`Error::WrongType`] if the key is not a hash; connection errors.
    pub async fn read(&self) -> Result<HashState> {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&self.key);
        match self.slot {
            None => hmget.arg("value").arg("fence").arg("holder"),
            Some(slot) => hmget
                .arg(format!("value:{slot}"))
                .arg(format!("fence:{slot}"))
                .arg(format!("holder:{slot}")),
        };
        let (value, fence, holder): (Option<String>, Option<String>, Option<String>) =
            self.conn.cmd(&self.key, &hmget).await?;
        Ok(HashState {
            value,
            fence: parse_fence(fence)?,
            holder,
        })
    }

    /// Reads value, fence and holder in one atomic step ([`FencedHash::read`])
    /// and checks the read against a reader's write epoch (`epoch`: a read
    /// lease's [`fence`](crate::LeaseHandle::fence)) by
    /// [`read_is_clean`](crate::read_is_clean): [`ValidatedRead::Torn`] if
    /// the stored fence is greater, so a writer granted after the reader has
    /// written what was read. A view checks its slot's fence
    /// ([`FencedHash::slot`]).
    ///
    /// ```no_run
    /// use fencelock::{FencedHash, Lease};
    ///
    /// /// The invoice's status as of `reader`'s epoch; `None` if a writer
    /// /// came in after it (read again under a new read lease).
    /// async fn status(invoice: &FencedHash, reader: &Lease) -> fencelock::Result<Option<String>> {
    ///     let read = invoice.read_validated(reader.fence()).await?;
    ///     Ok(read.clean().and_then(|state| state.value))
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`FencedHash::read`]. A torn read is not an error.
    pub async fn read_validated(&self, epoch: Fence) -> Result<ValidatedRead<HashState>> {
        let state = self.read().await?;
        let stored = state.fence;
        Ok(ValidatedRead::check(state, stored, epoch))
    }

    #[tracing::instrument(name = "fenced_write", level = "debug", skip_all, fields(resource = %self.key, slot = ?self.slot, %fence, op = change.name(), outcome))]
    async fn call(&self, fence: Fence, holder: &str, change: Change<'_>) -> Result<WriteOutcome> {
        // A seal names no holder: it records REVOKED_HOLDER.
        if !matches!(change, Change::Seal) {
            check_holder(holder)?;
        }
        let write = FencedWrite {
            key: &self.key,
            fence,
            holder,
            change,
        }
        .in_slot(self.slot);
        let (reply, acked) = match self.replication {
            Some(Replication { replicas, timeout }) => {
                let (reply, acked) = self.conn.run_replicated(&write, replicas, timeout).await?;
                (reply, Some((acked, replicas)))
            }
            None => (self.conn.run(&write).await?, None),
        };
        crate::metrics::fenced_write(self.stats.as_ref(), &self.family, reply.accepted);
        let op = change.name();
        if reply.accepted {
            tracing::debug!(resource = %self.key, slot = ?self.slot, %fence, op, "fenced write accepted");
            if let Some((acked, wanted)) = acked
                && acked < wanted
            {
                return Err(Error::WriteNotReplicated {
                    resource: self.key.clone(),
                    acked,
                    wanted,
                });
            }
            Ok(WriteOutcome::Accepted)
        } else {
            let current_fence = parse_fence(reply.stored_fence)?;
            tracing::warn!(resource = %self.key, slot = ?self.slot, %fence, current = ?current_fence, op, "fenced write rejected as stale: a holder outlived its lease");
            Ok(WriteOutcome::Rejected {
                current_fence,
                current_holder: reply.stored_holder,
            })
        }
    }
}

impl Fenced for FencedHash {
    /// The new `value` field.
    type Write = str;

    /// [`FencedHash::write`]: the same call, through the trait.
    fn fenced_write(
        &self,
        fence: Fence,
        holder: &str,
        value: &str,
    ) -> impl Future<Output = Result<WriteOutcome>> + Send {
        self.write(fence, holder, value)
    }
}

fn parse_fence(raw: Option<String>) -> Result<Option<Fence>> {
    raw.map(|s| {
        s.parse::<Fence>()
            .map_err(|_| Error::UnexpectedReply(format!("resource fence {s:?} is not an integer")))
    })
    .transpose()
}
