//! A reader or the writer of a fenced read-write lock on etcd
//! ([`crate::LockClient::rwlock`], [`crate::LockOptions::access`]): one
//! attempt, from the key's creation to the grant (the loop around it, its
//! deadline and what it leaves to delete are the mutex's, `acquire.rs`).
//! The transactions are `store/etcd/rwlock.rs`; the keys `rw/r/LEASE/ACQ`
//! and `rw/w/LEASE/ACQ` under the name (`store/etcd/keys.rs`).
//!
//! # The recipe
//!
//! It is etcd's `RWMutex` recipe (`client/v3/experimental/recipes`), with
//! the mutex's sessions, renewal, loss signal and release, and without
//! that recipe's two known bugs:
//!
//! - **A key per acquisition**, on the client's session for the ttl (a
//!   waiter's on the short waiter session, moved to the holder's once
//!   granted, as the mutex's), holding the holder id. Its create revision
//!   is its place in one queue of readers and writers.
//! - **A writer is granted when no key of the lock is older than its
//!   own; a reader when no writer's key is older than its own.** So the
//!   readers at the head of the queue hold together, a writer waits for
//!   every reader and writer ahead of it, and a reader that comes after a
//!   queued writer waits for that writer: first come, first served, in
//!   every [`WaitMode`](crate::WaitMode) (as the etcd mutex and semaphore).
//! - **Joining is one transaction** that creates the key on the holder's
//!   session if nothing is in its way (a free lock costs one transaction,
//!   as a mutex), else on the waiter session, and reads the newest key in
//!   its way. It also compares that no key of another kind is under the
//!   name (`KindConflict`, nothing written); the mutex's and the
//!   semaphore's grants compare the same the other way round.
//! - **Waiting watches the newest key in the way for its deletion**, then
//!   looks again. The look is one read-only transaction, linearizable,
//!   that **compares the waiter's own key still has its create revision**
//!   and reads the newest key still in its way: a waiter whose key is gone
//!   (its session expired or was revoked, or a revoke deleted it) is never
//!   told it holds the lock, whoever deleted the keys before it (etcd
//!   issue #16221: RWMutex granted such a waiter once its predecessors
//!   went). Each look either grants, finds the key gone, or names a key
//!   that exists, which is watched from now on (a watch, then a read that
//!   it is still there): the write path cannot spin (etcd issue #6408:
//!   RWMutex's writer could wait for its own key, or for keys that never
//!   go, and loop). A granted key on the waiter session moves to the
//!   holder's session with a transaction that compares its create
//!   revision again.
//! - **Fences.** A writer's fence is its key's create revision in the
//!   fence epoch, exactly as a mutex's. A reader's fence, its *write
//!   epoch*, is its own key's create revision in the same epoch: every
//!   writer whose key is older held (and was gone) before the reader was
//!   granted, so every fence such a writer wrote is below the epoch; every
//!   writer whose key is newer waits for the reader's key to go and has a
//!   greater revision, so its writes read as torn against the epoch.
//! - **Renewal, loss, release** are the mutex's: a keep-alive of the
//!   session and a read of the key's create revision; a delete comparing
//!   it. A release wakes whoever watched the key: the next writer, or the
//!   readers behind a writer.
//! - **Revoke** deletes every key of the lock, holders and waiters, in one
//!   transaction (`store/etcd/rwlock.rs`): its revision is the revocation
//!   fence, above every deposed writer's fence and reader's epoch, below
//!   every key created later. The waiters' keys go too, since one waiting
//!   right behind a reader may have the reader's revision plus one: no
//!   fence would lie between the reader's epoch (which the seal must be
//!   above, for its validated reads to be torn) and that waiter's. The
//!   waiters find their keys gone and queue again.

use std::sync::Arc;

use tokio::time::Instant;

use super::attempt::{Attempt, OwnKey, TXN_RETRY, WaitSessions, fence_and_deadline};
use super::session::{Session, WAITER_LEASE};
use super::wait::{Ahead, move_to_session, wait_turn};
use crate::engine::grant::{Acquired, EtcdHold, Granted};
use crate::error::{Error, Result};
use crate::holder::{holder_id, new_token};
use crate::options::{Access, Primitive};
use crate::store::etcd::{Foreign, Joined, Look, RwKeys, Standing, join_rw, look_rw};

/// The error for another kind of lock on the name.
fn conflict(name: &str, foreign: Foreign) -> Error {
    let held = match foreign {
        Foreign::Mutex => Primitive::Mutex,
        Foreign::Permits(permits) => Primitive::Semaphore(permits),
        Foreign::RwLock => Primitive::RwLock(Access::Write),
        Foreign::Malformed(key) => {
            let shown: String = key.chars().take(200).collect();
            return Error::UnexpectedReply(format!(
                "read-write lock {:?} cannot be used: the key {shown:?} among its keys in etcd is not one fencelock writes; delete it",
                name.chars().take(200).collect::<String>()
            ));
        }
    };
    Error::KindConflict {
        name: name.to_owned(),
        held: held.kind(),
        asked: Primitive::RwLock(Access::Write).kind(),
    }
}

/// Sends the join transaction, again while it fails transiently and
/// `session` lives (a resent join finds the key an earlier send created:
/// one key per acquisition). A resend that finds a lease gone may leave a
/// key an earlier send created on the holder's session: the caller
/// deletes it.
async fn send_join(
    to: &Attempt<'_>,
    keys: &RwKeys,
    (key, access): (&str, Access),
    holder: &str,
    session: &Session,
    queue_on: Option<&Session>,
) -> Result<Joined> {
    loop {
        let sent = join_rw(
            to.conn,
            keys,
            (key, access),
            holder,
            session.id,
            queue_on.map(|q| q.id),
        )
        .await;
        match sent {
            Err(e) if e.is_retryable() && Instant::now() + TXN_RETRY < session.valid_until() => {
                tracing::debug!(lock = %to.name, error = %e, "etcd read-write lock join failed; sending it again");
                tokio::time::sleep(TXN_RETRY).await;
            }
            Ok(Joined::LeaseGone) => {
                // Which lease is gone: a keep-alive tells (and marks it).
                session.keep_alive(to.conn).await?;
                if let Some(q) = queue_on {
                    q.keep_alive(to.conn).await?;
                }
                return Ok(Joined::LeaseGone);
            }
            other => return other,
        }
    }
}

/// One attempt at `access` of the read-write lock: `Ok(None)` if a session
/// or the attempt's key was lost while queued (the caller tries again, on
/// a session that lives, with a new key).
pub(super) async fn attempt(
    to: &Attempt<'_>,
    access: Access,
    own: &mut OwnKey,
) -> Result<Option<Acquired>> {
    let (conn, name, opts) = (to.conn, to.name, to.opts);
    let ttl = opts.ttl_value();
    let token = new_token();
    let holder = holder_id(&token);
    let acquisition = to.sessions.next_acquisition();
    let session = to.sessions.holder(conn, ttl).await?;
    let keys = RwKeys::new(to.keys.lock());
    let key = keys.key(access, session.id, acquisition);
    // A waiter with a ttl longer than the waiter lease queues on the
    // waiter session; one with a shorter ttl on the holder's.
    let waiter = if to.wait && ttl > WAITER_LEASE {
        Some(to.sessions.waiter(conn).await?)
    } else {
        None
    };
    let queue_on: Option<&Arc<Session>> = match (&waiter, to.wait) {
        (Some(short), _) => Some(short),
        (None, true) => Some(&session),
        (None, false) => None,
    };
    own.set(&key, &session);
    let mut sent = Instant::now();
    let joined = send_join(
        to,
        &keys,
        (&key, access),
        &holder,
        &session,
        queue_on.map(|q| &**q),
    )
    .await?;
    let (revision, standing, queued) = match joined {
        Joined::Placed {
            revision,
            standing,
            queued,
        } => (revision, standing, queued),
        Joined::Refused => {
            own.clear();
            tracing::debug!(lock = %name, access = access.as_str(), "contended");
            return Err(contended(name));
        }
        Joined::OtherKind(foreign) => {
            // Nothing was created by this send, and a key an earlier one
            // created would have kept the other kind out; deleted anyway,
            // by its name (it is this attempt's alone).
            own.remove_now().await;
            return Err(conflict(name, foreign));
        }
        Joined::LeaseGone => {
            // An earlier send whose reply was lost may have created the
            // key on the holder's session, which lives on: deleted by its
            // name before the next attempt.
            own.remove_now().await;
            return Ok(None);
        }
    };
    // The key is on the waiter session if this send (or an earlier one)
    // put it there.
    let on_waiter = waiter.as_ref().filter(|_| queued);
    let leases = WaitSessions {
        holder: &session,
        waiter: on_waiter.map(|w| &**w),
    };
    let granted = match standing {
        Standing::First => true,
        Standing::Behind(_) | Standing::Unknown if !to.wait => {
            // Trying once, with a key an earlier send created (its reply
            // was lost): granted only if nothing is in its way now.
            matches!(
                look_rw(conn, &keys, (&key, access), revision).await?,
                Look::First
            )
        }
        Standing::Behind(ahead) => {
            let ahead_of = Ahead::RwLock(&keys, access);
            let turn = wait_turn(conn, ahead_of, (&key, revision), Some(ahead), &leases).await?;
            sent = Instant::now();
            turn
        }
        Standing::Unknown => {
            let ahead_of = Ahead::RwLock(&keys, access);
            let turn = wait_turn(conn, ahead_of, (&key, revision), None, &leases).await?;
            sent = Instant::now();
            turn
        }
    };
    if !granted {
        if !to.wait {
            own.remove_now().await;
            return Err(contended(name));
        }
        // A session or the key is gone: `own` deletes what is left.
        return Ok(None);
    }
    if let Some(short) = on_waiter {
        // Granted now: the key moves to the holder's session.
        if !move_to_session(conn, &key, revision, &holder, &session, short).await? {
            return Ok(None);
        }
    }
    // Too late: `own` deletes the key.
    let (fence, deadline) = fence_and_deadline(name, opts, revision, &session, sent)?;
    own.clear();
    tracing::debug!(lock = %name, %fence, access = access.as_str(), "acquired");
    let granted = Granted::on_etcd(
        name,
        fence,
        opts,
        EtcdHold {
            key,
            token,
            session,
            revision,
            slot: None,
            access: Some(access),
        },
    );
    Ok(Some(Acquired {
        granted,
        deadline,
        renew_now: false,
    }))
}

/// The refusal of a try that found someone in the way.
fn contended(name: &str) -> Error {
    Error::Contended {
        name: name.to_owned(),
        remaining: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_name_the_kind_in_the_way() {
        for (foreign, held) in [
            (Foreign::Mutex, "mutex"),
            (Foreign::Permits(3), "semaphore"),
        ] {
            match conflict("n", foreign) {
                Error::KindConflict {
                    name,
                    held: got,
                    asked: "read-write lock",
                } => assert!(name == "n" && got == held),
                other => panic!("{other:?}"),
            }
        }
        let huge = "é".repeat(10_000);
        let text = conflict(&huge, Foreign::Malformed("k/x".into())).to_string();
        assert!(text.contains("k/x") && text.len() < 1_000, "{text}");
    }
}
