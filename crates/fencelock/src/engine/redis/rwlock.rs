//! A read-write lock's grant attempt on Redis (`rw_grant.lua`): a reader
//! or the writer, as a permit of the name's hash. The wait around it is
//! the mutex's (`acquire.rs`); renewals and the release are the
//! semaphore's permit calls (`mod.rs`).

use tokio::time::Instant;

use super::RedisEngine;
use super::acquire::{Refused, Standing, unusable};
use crate::engine::grant::{Acquired, Granted};
use crate::engine::timing::drift;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::options::{Access, LockOptions, Primitive};
use crate::store::redis::ops::{Mint, RwGrant, RwGrantReply};

impl RedisEngine {
    /// One grant attempt of a reader or the writer: the lease, or the
    /// refusal. A grant it gives back but cannot release goes to
    /// `unreleased`, as a mutex's does.
    pub(super) async fn attempt_rw(
        &self,
        name: &str,
        keys: &LockKeys,
        token: &str,
        opts: &LockOptions,
        (access, standing): (Access, Standing<'_>),
        unreleased: &mut Option<Granted>,
    ) -> Result<std::result::Result<Acquired, Refused>> {
        let ttl = opts.ttl;
        let sent = Instant::now();
        let grant = RwGrant {
            keys,
            mint: Mint::new(opts),
            token,
            ttl,
            wait_mode: opts.wait_mode,
            access,
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
            RwGrantReply::Granted { fence, field } => Ok(Granted::on_redis_permit(
                name,
                keys,
                token,
                (fence, field),
                opts,
            )),
            RwGrantReply::Held { remaining, seen } => return Ok(Err(Refused { remaining, seen })),
            RwGrantReply::Reserved { seen } => {
                return Ok(Err(Refused {
                    remaining: None,
                    seen,
                }));
            }
            RwGrantReply::HeldAsMutex => Err(Primitive::Mutex),
            RwGrantReply::HeldAsSemaphore(permits) => Err(Primitive::Semaphore(permits)),
        };
        let granted = held.map_err(|held| Error::KindConflict {
            name: name.to_owned(),
            held: held.kind(),
            asked: Primitive::RwLock(access).kind(),
        })?;
        let deadline = sent + ttl - drift(ttl);
        if let Some(refusal) = unusable(name, opts, acked, sent, deadline) {
            Box::pin(self.give_back(granted, unreleased)).await;
            return Err(refusal);
        }
        tracing::debug!(lock = %name, fence = %granted.fence, access = access.as_str(), "acquired");
        Ok(Ok(Acquired {
            granted,
            deadline,
            renew_now: false,
        }))
    }
}
