//! A permit's grant attempt on Redis: a semaphore's slot
//! (`sem_grant.lua`) or a read-write lock's reader or writer
//! (`rw_grant.lua`), each a field of the name's hash. The wait around it is
//! the mutex's (`acquire.rs`); renewals and the release are the permit
//! calls in `mod.rs`.

use tokio::time::Instant;

use super::RedisEngine;
use super::acquire::{Refused, Standing, unusable};
use crate::engine::grant::{Acquired, Granted};
use crate::engine::timing::drift;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::options::{Access, LockOptions, Primitive};
use crate::store::redis::ops::{Mint, PermitGrant, PermitGrantReply, PermitKind};

impl RedisEngine {
    /// One grant attempt of a permit of `kind`: the lease, or the refusal.
    /// A grant it gives back but cannot release goes to `unreleased`, as a
    /// mutex's does.
    pub(super) async fn attempt_permit(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
        (kind, standing): (PermitKind, Standing<'_>),
        unreleased: &mut Option<Granted>,
    ) -> Result<std::result::Result<Acquired, Refused>> {
        let ttl = opts.ttl;
        let sent = Instant::now();
        let grant = PermitGrant {
            keys,
            mint: Mint::new(opts),
            token,
            ttl,
            wait_mode: opts.wait_mode,
            kind,
            member: standing.member,
            waiter_lease: opts.waiter_lease,
            queued: standing.queued,
        };
        let (reply, acked) = match opts.replication {
            Some(replication) => {
                let (reply, acked) = self
                    .conn
                    .run_replicated(&grant, replication.replicas, replication.timeout)
                    .await?;
                (reply, Some(acked))
            }
            None => (self.conn.run(&grant).await?, None),
        };
        let held = match reply {
            PermitGrantReply::Granted { fence, field } => {
                let granted = Granted::on_redis_permit(name, keys, token, (fence, field), opts);
                let deadline = sent + ttl - drift(ttl);
                if let Some(refusal) = unusable(name, opts, acked, sent, deadline) {
                    Box::pin(self.give_back(granted, unreleased)).await;
                    return Err(refusal);
                }
                tracing::debug!(lock = %name, fence = %granted.fence, ?field, "acquired");
                return Ok(Ok(Acquired {
                    granted,
                    deadline,
                    renew_now: false,
                }));
            }
            PermitGrantReply::Held { remaining, seen } => {
                return Ok(Err(Refused { remaining, seen }));
            }
            PermitGrantReply::Reserved { seen } => {
                return Ok(Err(Refused {
                    remaining: None,
                    seen,
                }));
            }
            PermitGrantReply::HeldAsMutex => Primitive::Mutex,
            PermitGrantReply::HeldAsSemaphore(held) => {
                if let PermitKind::Slots(asked) = kind {
                    return Err(Error::PermitsConflict {
                        name: name.to_owned(),
                        held,
                        asked,
                    });
                }
                Primitive::Semaphore(held)
            }
            PermitGrantReply::HeldAsRwLock => Primitive::RwLock(Access::Write),
        };
        Err(Error::KindConflict {
            name: name.to_owned(),
            held: held.kind(),
            asked: opts.primitive().kind(),
        })
    }
}
