//! The recipe on Redis: how a lock is taken (`acquire`: grant attempts,
//! the wait, hand-overs), how waiters learn of releases (`wakeups`), and
//! how a held lock is renewed, released and read (this file). Every call
//! goes to Redis through the store's typed calls (`store::redis::ops`);
//! what is decided here is which call, and when.

mod acquire;
mod permit;
mod server_clock;
mod wakeups;

use std::time::Duration;

use tokio::sync::OnceCell;

use super::grant::{Granted, RedisHold};
use super::inspect::{LockState, PermitHolder, RwHolder};
use super::revoke::{Deposed, Revocation};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::holder_id;
use crate::keys::{KeyLayout, LockKeys, lock_key_pattern, lock_name_of};
use crate::options::LockOptions;
use crate::store::Checked;
use crate::store::redis::ops::{
    Extend, ExtendMany, Inspect, Mint, NotExtended, PassOn, PermitField, PermitRef, Release,
    Revoke, ScriptCall, SemExtend, SemInspect, SemLeaving, SemRelease, SlotEntry,
};
use crate::store::redis::{BatchGroup, Coalescer, RedisConn, Topology, wire};
use server_clock::ServerClocks;
use wakeups::Wakeups;

/// A lease of a renewal batch, with its place in the batch.
type Indexed<'a> = (usize, &'a Granted);

/// The Redis side of one client: its connection, the batches of its
/// concurrent grants and releases, and the waiters it has registered for
/// wake-ups.
#[derive(Debug)]
pub(crate) struct RedisEngine {
    pub(crate) conn: RedisConn,
    /// Batches the client's concurrent grants and releases.
    batches: Coalescer,
    /// Names this client's waiters in wait queues and wake-up channels.
    client_id: String,
    /// The pub/sub connection, opened when a waiter first needs it.
    wakeups: OnceCell<Wakeups>,
    /// The releases of dropped leases still running.
    pub(crate) cleanups: super::cleanup::Cleanups,
    /// Whether a server's clock runs faster than this host's, read after
    /// renewals.
    server_clocks: ServerClocks,
}

impl RedisEngine {
    pub(crate) fn new(conn: RedisConn) -> Self {
        RedisEngine {
            conn,
            batches: Coalescer::new(),
            client_id: uuid::Uuid::new_v4().simple().to_string(),
            wakeups: OnceCell::new(),
            cleanups: super::cleanup::Cleanups::default(),
            server_clocks: ServerClocks::default(),
        }
    }

    /// The batches of this client's grants and releases (feature
    /// `testing`: the negative controls break them).
    #[cfg(feature = "testing")]
    pub(crate) fn batches(&self) -> &Coalescer {
        &self.batches
    }

    /// One compare-and-pexpire of `granted` to its ttl.
    pub(crate) async fn extend(&self, granted: &Granted) -> Result<Checked> {
        if granted.is_permit() {
            return Ok(self.renew_many(&[granted], granted.ttl).await?[0]);
        }
        let hold = granted.redis()?;
        let call = Extend {
            key: &hold.lock,
            value: &hold.value,
            ttl: granted.ttl,
        };
        self.renew(&call, &granted.name, hold.replication).await
    }

    /// One compare-and-delete of `granted`, which passes the lock on to a
    /// waiter (batched with the client's concurrent releases).
    pub(crate) async fn release(&self, granted: &Granted) -> Result<Checked> {
        if granted.is_permit() {
            return self.release_permit(granted).await;
        }
        let hold = granted.redis()?;
        self.batches
            .release(
                &self.conn,
                &Release {
                    lock: &hold.lock,
                    mint: hold.mint,
                    pass_on: PassOn {
                        publish: self.conn.publish(),
                    },
                    value: &hold.value,
                    wake_first: hold.contended,
                },
            )
            .await
    }

    /// Deposes whoever holds lock `keys`, mints the revocation fence and
    /// passes the lock on (`revoke.lua`), waiting for the options'
    /// replicas.
    pub(crate) async fn revoke(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
    ) -> Result<Revocation> {
        match self.revoke_mutex(keys, opts).await {
            Err(e) => Err(Box::pin(self.kind_conflict(name, keys, e)).await),
            revoked => revoked,
        }
    }

    /// [`RedisEngine::revoke`] of a mutex.
    async fn revoke_mutex(&self, keys: &LockKeys, opts: &LockOptions) -> Result<Revocation> {
        // Sent once: first make sure it goes out on a live connection.
        self.conn.ensure_live(keys.lock()).await?;
        let call = Revoke {
            lock: keys.lock(),
            mint: Mint::new(opts),
            pass_on: PassOn {
                publish: self.conn.publish(),
            },
        };
        let (reply, replicas) = match opts.replication {
            Some(replication) => {
                let (reply, acked) = self
                    .conn
                    .run_replicated(&call, replication.replicas, replication.timeout)
                    .await?;
                (reply, Some((acked, replication.replicas)))
            }
            None => (self.conn.run(&call).await?, None),
        };
        let base = opts.fence_base(0);
        let epoch = |f: u64| Fence::new(f.saturating_add(base));
        Ok(Revocation {
            fence: epoch(reply.fence),
            deposed: reply.holder.map(|holder| Deposed {
                holder,
                fence: reply.held_fence.map(epoch),
            }),
            replicas,
        })
    }

    /// Renews a batch of leases of one ttl (one [`BatchGroup`]): one code
    /// per lease, in order. Mutexes go in one compare-and-pexpire call,
    /// semaphore permits in one more.
    pub(crate) async fn renew_many(
        &self,
        leases: &[&Granted],
        ttl: Duration,
    ) -> Result<Vec<Checked>> {
        let (permits, mutexes): (Vec<Indexed<'_>>, Vec<Indexed<'_>>) = leases
            .iter()
            .copied()
            .enumerate()
            .partition(|(_, g)| g.is_permit());
        let mut codes = vec![Checked::Done; leases.len()];
        for (codes_of, (i, _)) in [
            (self.renew_mutexes(&mutexes, ttl).await?, &mutexes),
            (self.renew_permits(&permits, ttl).await?, &permits),
        ]
        .iter()
        .flat_map(|(got, of)| got.iter().zip(of.iter()))
        {
            codes[*i] = *codes_of;
        }
        if let Some(first) = leases.first() {
            self.server_clocks
                .check(&self.conn, self.batch_group(first), first.key())
                .await;
        }
        Ok(codes)
    }

    /// One compare-and-pexpire script call for mutex leases.
    async fn renew_mutexes(&self, leases: &[Indexed<'_>], ttl: Duration) -> Result<Vec<Checked>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let holds = leases
            .iter()
            .map(|(_, g)| g.redis())
            .collect::<Result<Vec<&RedisHold>>>()?;
        let pairs: Vec<(&str, &str)> = holds
            .iter()
            .map(|h| (h.lock.as_str(), h.value.as_str()))
            .collect();
        let call = ExtendMany {
            leases: &pairs,
            ttl,
        };
        self.renew_batch(&call, leases).await
    }

    /// One renewal script call for semaphore permits.
    async fn renew_permits(&self, leases: &[Indexed<'_>], ttl: Duration) -> Result<Vec<Checked>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let permits = leases
            .iter()
            .map(|(_, g)| {
                g.permit()
                    .map(|h| (h.lock.as_str(), h.field, h.ident.as_str()))
            })
            .collect::<Result<Vec<PermitRef<'_>>>>()?;
        let call = SemExtend {
            permits: &permits,
            ttl,
        };
        self.renew_batch(&call, leases).await
    }

    /// Runs the batched renewal `call` of `leases` (not empty): one code
    /// per lease, in order. The keeper batches only leases that wait for
    /// the same replicas, so the first one's stand for all.
    async fn renew_batch<C: ScriptCall<Reply = NotExtended>>(
        &self,
        call: &C,
        leases: &[Indexed<'_>],
    ) -> Result<Vec<Checked>> {
        let Some((_, first)) = leases.first() else {
            return Ok(Vec::new());
        };
        self.renew(call, &first.name, first.replication())
            .await?
            .per_lease(leases.len())
            .map_err(|e| Error::UnexpectedReply(e.to_string()))
    }

    /// Compare-and-delete of a permit's slot; wakes the first waiters.
    async fn release_permit(&self, granted: &Granted) -> Result<Checked> {
        let hold = granted.permit()?;
        let call = SemRelease {
            lock: &hold.lock,
            mint: hold.mint,
            pass_on: PassOn {
                publish: self.conn.publish(),
            },
            what: SemLeaving::Permit {
                field: hold.field,
                ident: &hold.ident,
            },
        };
        match self.conn.run(&call).await? {
            1 => Ok(Checked::Done),
            0 => Ok(Checked::NotOurs(crate::error::LossReason::Expired)),
            -1 => Ok(Checked::NotOurs(crate::error::LossReason::TakenOver)),
            other => Err(Error::UnexpectedReply(format!(
                "a semaphore release returned the unknown code {other}"
            ))),
        }
    }

    /// Which of this client's renewals may share a script call with
    /// `granted`'s.
    pub(crate) fn batch_group(&self, granted: &Granted) -> BatchGroup {
        self.conn.batch_group(granted.key())
    }

    /// The keys of lock `name` in `layout`; the guide layout is refused on
    /// a Cluster, where its keys would land in different slots.
    pub(crate) fn lock_keys(
        &self,
        prefix: &str,
        name: &str,
        layout: KeyLayout,
    ) -> Result<LockKeys> {
        if layout == KeyLayout::Guide && self.conn.topology() == Topology::Cluster {
            return Err(Error::InvalidOption(
                "the guide layout (lock:NAME) cannot be used on Redis Cluster: a lock's keys would land in different slots; use the default layout (lock:{NAME})".into(),
            ));
        }
        LockKeys::new(prefix, layout, name)
    }

    /// The state of lock `keys` (one atomic script), fences shown in the
    /// epoch of `defaults`.
    pub(crate) async fn inspect(
        &self,
        keys: &LockKeys,
        layout: KeyLayout,
        defaults: &LockOptions,
    ) -> Result<LockState> {
        let base = defaults.fence_base(0);
        let epoch = |f: Fence| Fence::new(f.get().saturating_add(base));
        let reply = match self.conn.run(&Inspect::of(keys)).await {
            Ok(reply) => reply,
            // A hash at the lock key: a semaphore (or data fencelock did
            // not write, which its snapshot shows as nothing held).
            Err(e @ Error::WrongType { .. }) => {
                return self.inspect_semaphore(keys, defaults, e).await;
            }
            Err(e) => return Err(e),
        };
        let last_fence = reply
            .last_fence
            .and_then(|f| f.parse::<Fence>().ok())
            .map(epoch);
        Ok(match reply.value {
            None => LockState::Free { last_fence },
            Some(value) => {
                let (token, fence) = wire::parse_lock_value(&value, layout);
                LockState::Held {
                    holder: holder_id(token),
                    fence: fence.map(epoch).or(match layout {
                        KeyLayout::HashTagged => None,
                        KeyLayout::Guide => last_fence,
                    }),
                    remaining: reply.remaining,
                }
            }
        })
    }

    /// The state of semaphore or read-write lock `keys` (one atomic
    /// script), after a mutex's inspect met `wrong_type`: given back when
    /// the key is neither's (another type, or a hash without their marks).
    async fn inspect_semaphore(
        &self,
        keys: &LockKeys,
        defaults: &LockOptions,
        wrong_type: Error,
    ) -> Result<LockState> {
        let base = defaults.fence_base(0);
        let epoch = |f: Fence| Fence::new(f.get().saturating_add(base));
        let snapshot = self.conn.run(&SemInspect::of(keys)).await?;
        if !snapshot.is_semaphore && !snapshot.is_rwlock {
            return Err(wrong_type);
        }
        let last_fence = snapshot
            .last_fence
            .and_then(|f| f.parse::<Fence>().ok())
            .map(epoch);
        if snapshot.slots.is_empty() {
            return Ok(LockState::Free { last_fence });
        }
        let rw_holder = |s: &SlotEntry| RwHolder {
            holder: holder_id(&s.token),
            fence: s.fence.map(epoch),
            remaining: s.remaining,
        };
        if snapshot.is_rwlock {
            return Ok(LockState::RwLock {
                writer: snapshot
                    .slots
                    .iter()
                    .find(|s| s.field == PermitField::Writer)
                    .map(rw_holder),
                readers: snapshot
                    .slots
                    .iter()
                    .filter(|s| matches!(s.field, PermitField::Reader(_)))
                    .map(rw_holder)
                    .collect(),
                last_fence,
            });
        }
        Ok(match snapshot.permits {
            None => LockState::Free { last_fence },
            Some(permits) => LockState::Semaphore {
                permits,
                holders: snapshot
                    .slots
                    .into_iter()
                    .filter_map(|s| match s.field {
                        PermitField::Slot(slot) => Some(PermitHolder {
                            slot,
                            holder: holder_id(&s.token),
                            fence: s.fence.map(epoch),
                            remaining: s.remaining,
                        }),
                        PermitField::Writer | PermitField::Reader(_) => None,
                    })
                    .collect(),
                last_fence,
            },
        })
    }

    /// How many waiters are queued for lock `keys`.
    pub(crate) async fn waiters(&self, keys: &LockKeys) -> Result<u64> {
        self.conn
            .cmd(&keys.queue(), redis::cmd("ZCARD").arg(keys.queue()))
            .await
    }

    /// The held locks under `prefix` in `layout` whose names match the
    /// glob `pattern`, sorted (`SCAN` on every master).
    pub(crate) async fn lock_names(
        &self,
        prefix: &str,
        pattern: &str,
        layout: KeyLayout,
    ) -> Result<Vec<String>> {
        // Mutexes are strings, semaphores hashes.
        let pattern = lock_key_pattern(prefix, layout, pattern);
        let mut keys = self.conn.scan(&pattern, Some("string")).await?;
        if layout == KeyLayout::HashTagged {
            keys.extend(self.conn.scan(&pattern, Some("hash")).await?);
        }
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|key| lock_name_of(prefix, layout, key))
            .map(str::to_owned)
            .collect();
        names.sort_unstable();
        Ok(names)
    }
}

impl RedisEngine {
    /// Runs a renewal `call` (of lock `name`'s lease, or a batch led by it),
    /// with its `WAIT` when the grant waited for `replication`: acknowledged
    /// by too few replicas, the renewal does not count (the lease keeps its
    /// earlier deadline, and the keeper retries), since a failover could
    /// lose it and expire the lock on the new primary before the deadline
    /// the client would compute from it.
    async fn renew<C: ScriptCall>(
        &self,
        call: &C,
        name: &str,
        replication: Option<crate::options::Replication>,
    ) -> Result<C::Reply> {
        let Some(replication) = replication else {
            return self.conn.run(call).await;
        };
        let (reply, acked) = self
            .conn
            .run_replicated(call, replication.replicas, replication.timeout)
            .await?;
        if acked < replication.replicas {
            return Err(Error::RenewalNotReplicated {
                name: name.to_owned(),
                acked,
                wanted: replication.replicas,
            });
        }
        Ok(reply)
    }
}
