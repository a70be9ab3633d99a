//! A permit of a fenced semaphore on etcd
//! ([`crate::LockOptions::permits`]): one attempt, from the first read to
//! the slot's key (the loop around it, its deadline and what it leaves to
//! delete are the mutex's, `acquire.rs`).
//! The transactions are `store/etcd/semaphore.rs`; the keys `sem/N/slot/S`
//! and `sem/N/wait/LEASE/ACQ` under the name (`store/etcd/keys.rs`).
//!
//! # The rule every grant keeps
//!
//! A slot is taken only when **fewer waiters older than the taker exist
//! than free slots** (a taker not in the queue counts every waiter as
//! older), and then the taker of rank `k` (`k` older waiters) takes the
//! `k`-th lowest free slot, so waiters granted together do not compete for
//! one slot. That is first come, first served across all permits: a slot
//! that frees goes to the oldest waiter, never to a newcomer.
//!
//! Each grant is one transaction whose compares make the rule hold when it
//! commits, not only when its read was made:
//!
//! - a taker **not queued** compares that no key of the semaphore was
//!   created since its read (a range compare of mod revisions: keys are
//!   never modified after their creation), so the slots and the waiters
//!   are the ones it saw, less any that left, which only frees slots and
//!   shortens the queue;
//! - a **waiter** compares only that its own key is still there (deleted
//!   in the same transaction): waiters created since its read are younger
//!   and do not count; a grant of an older waiter takes one free slot and
//!   one older waiter away, which keeps its rank below the free slots; and
//!   a grant of anyone younger, made under the rule, left more free slots
//!   than the waiter's rank (the younger one counted the waiter as older).
//!   So, by induction over the grants in commit order, its rule still holds.
//!
//! Both also compare that the slot's key does not exist (so never two
//! holders in one slot, and never more than N: there are N slot keys) and
//! that the name has no key outside `sem/N/` (no mutex, no other count).
//! When several slots free at once, the waiters they go to may commit in
//! either order: fences follow commits, and the order of those waiters
//! among themselves is not promised. A dead waiter holds up the ones
//! behind it until its key's lease runs out (the waiter lease, as for the
//! mutex).
//!
//! # Waiting
//!
//! A waiter watches every deletion under `sem/N/` (a slot freed, a waiter
//! gone: the two things that can make its rule true), from the moment it
//! has queued; it then reads the name again, and after each deletion. A
//! watch is kept open for the whole wait, so a deletion between a read and
//! the wait is not missed. No polling. Every [`WaitMode`](crate::WaitMode)
//! waits this way, as the etcd mutex does.

use std::sync::Arc;

use tokio::time::Instant;

use super::attempt::{Attempt, OwnKey, TXN_RETRY, WaitSessions, fence_and_deadline};
use super::session::{Session, WAITER_LEASE};
use crate::engine::grant::{Acquired, EtcdHold, Granted};
use crate::error::{Error, Result};
use crate::holder::{holder_id, new_token};
use crate::store::etcd::{
    Deletions, EtcdConn, Foreign, SemKeys, SemState, Sent, Taker, queue_permit, read_permits,
    take_slot, watch_deletions,
};

/// How many slots a taker not in the queue may try for before it queues
/// (or, trying once, is refused): each failed try means someone else took
/// a slot or queued since its read.
const FRESH_TRIES: usize = 3;

/// Pause before watching again when a watch could not be created.
const WATCH_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// What to do next, from one read of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// Another kind or count holds the name.
    Conflict(Foreign),
    /// This attempt holds `slot` (a take whose reply was lost).
    Ours { slot: u32, revision: i64 },
    /// The waiter's key is gone (its session expired): queue again.
    Gone,
    /// Take this slot.
    Take(u32),
    /// Wait (queue first, if not queued).
    Wait,
}

/// The decision of a taker holding `holder` on `lease` (waiting at
/// `(key, revision)` if queued), from `state`, for `permits`.
fn decide(
    state: &SemState,
    permits: u32,
    holder: &str,
    lease: i64,
    queued: Option<(&str, i64)>,
) -> Decision {
    if let Some(foreign) = &state.foreign {
        return Decision::Conflict(foreign.clone());
    }
    // The holder id is this attempt's own (a fresh token), and the lease
    // its session's: such a slot key can only be this attempt's.
    if let Some(ours) = state
        .slots
        .iter()
        .find(|s| s.holder.as_deref() == Some(holder) && s.lease == lease)
    {
        return Decision::Ours {
            slot: ours.slot,
            revision: ours.revision,
        };
    }
    let older = match queued {
        Some((key, revision)) => {
            if !state
                .waiters
                .iter()
                .any(|(k, r)| k == key && *r == revision)
            {
                return Decision::Gone;
            }
            state.waiters.iter().filter(|(_, r)| *r < revision).count()
        }
        None => state.waiters.len(),
    };
    // Slots are sorted: walk the free ones in order up to the rank.
    let mut taken = state.slots.iter().map(|s| s.slot).peekable();
    let mut free = (0..permits).filter(|slot| {
        while taken.next_if(|t| t < slot).is_some() {}
        taken.next_if_eq(slot).is_none()
    });
    match free.nth(older) {
        Some(slot) => Decision::Take(slot),
        None => Decision::Wait,
    }
}

/// The error for what holds the name instead.
fn conflict(name: &str, permits: u32, foreign: Foreign) -> Error {
    match foreign {
        Foreign::Mutex => Error::KindConflict {
            name: name.to_owned(),
            held: "mutex",
            asked: "semaphore",
        },
        Foreign::RwLock => Error::KindConflict {
            name: name.to_owned(),
            held: "read-write lock",
            asked: "semaphore",
        },
        Foreign::Permits(held) => Error::PermitsConflict {
            name: name.to_owned(),
            held,
            asked: permits,
        },
        Foreign::Malformed(key) => Error::UnexpectedReply(format!(
            "semaphore {:?} cannot be used: the key {:?} among its keys in etcd is not one fencelock writes; delete it",
            shorten(name),
            shorten(&key)
        )),
    }
}

/// `text`, cut to 200 characters for a message.
fn shorten(text: &str) -> String {
    let mut out: String = text.chars().take(200).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Where the attempt waits in the queue.
struct Queued {
    key: String,
    revision: i64,
    /// The waiter session its key is on, if not the holder's.
    waiter: Option<Arc<Session>>,
}

/// Sends one transaction, again while it fails transiently and `session`
/// lives: every semaphore transaction finds what an earlier send of it
/// did (its waiter key by name, its slot by the holder id).
async fn send<F, Fut>(name: &str, session: &Session, mut txn: F) -> Result<Sent>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Sent>>,
{
    loop {
        match txn().await {
            Err(e) if e.is_retryable() && Instant::now() + TXN_RETRY < session.valid_until() => {
                tracing::debug!(lock = %name, error = %e, "etcd semaphore transaction failed; sending it again");
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => return other,
        }
    }
}

/// One attempt at a permit of `permits`: `Ok(None)` if a session was lost
/// (the caller tries again on one that lives).
pub(super) async fn attempt(
    to: &Attempt<'_>,
    permits: u32,
    own: &mut OwnKey,
) -> Result<Option<Acquired>> {
    let (conn, name, opts) = (to.conn, to.name, to.opts);
    let ttl = opts.ttl_value();
    let token = new_token();
    let holder = holder_id(&token);
    let session = to.sessions.holder(conn, ttl).await?;
    let keys = SemKeys::new(to.keys.lock(), permits);
    let mut state = read_permits(conn, &keys).await?;
    let mut queued: Option<Queued> = None;
    let mut watch: Option<Deletions> = None;
    let mut next_keep_alive = None;
    let mut sent: Option<Instant> = None;
    let mut fresh_tries = 0;
    loop {
        let standing = queued.as_ref().map(|q| (q.key.as_str(), q.revision));
        let mut decision = decide(&state, permits, &holder, session.id, standing);
        if queued.is_none() && fresh_tries >= FRESH_TRIES && matches!(decision, Decision::Take(_)) {
            decision = Decision::Wait;
        }
        match decision {
            Decision::Conflict(foreign) => {
                own.remove_now().await;
                return Err(conflict(name, permits, foreign));
            }
            Decision::Gone => {
                own.remove_now().await;
                return Ok(None);
            }
            Decision::Ours { slot, revision } => {
                let Some(sent) = sent else {
                    return Err(Error::UnexpectedReply(format!(
                        "etcd: slot {slot} of semaphore {:?} holds this attempt's holder id before it was asked for",
                        shorten(name)
                    )));
                };
                return granted(to, &keys, (slot, revision), (token, session), sent, own);
            }
            Decision::Take(slot) => {
                own.claim(&keys.slot(slot), &holder, &session);
                let taker = match &queued {
                    Some(q) => Taker::Queued {
                        key: &q.key,
                        revision: q.revision,
                    },
                    None => {
                        fresh_tries += 1;
                        Taker::Fresh {
                            seen: state.revision,
                        }
                    }
                };
                let at = Instant::now();
                sent = Some(at);
                let take = || take_slot(conn, &keys, slot, &holder, session.id, taker);
                match send(name, &session, take).await? {
                    Sent::Done(revision, _) => {
                        return granted(to, &keys, (slot, revision), (token, session), at, own);
                    }
                    Sent::Failed(seen) => state = seen,
                    Sent::LeaseGone => {
                        session.keep_alive(conn).await?;
                        own.remove_now().await;
                        return Ok(None);
                    }
                }
            }
            Decision::Wait if !to.wait => {
                own.remove_now().await;
                tracing::debug!(lock = %name, "contended");
                return Err(Error::Contended {
                    name: name.to_owned(),
                    remaining: None,
                });
            }
            Decision::Wait => match &queued {
                None => {
                    let (q, seen) = match join_queue(to, &keys, &holder, &session, own).await? {
                        Some(joined) => joined,
                        None => {
                            own.remove_now().await;
                            return Ok(None);
                        }
                    };
                    state = seen;
                    queued = q;
                }
                Some(q) => {
                    let leases = WaitSessions {
                        holder: &session,
                        waiter: q.waiter.as_deref(),
                    };
                    let every = leases.every();
                    let keep_alive_at =
                        next_keep_alive.get_or_insert_with(|| Instant::now() + every);
                    if let Some(deletions) = watch.as_mut() {
                        match wait_for_deletion(conn, deletions, &leases, keep_alive_at).await? {
                            Woken::Deletion => {}
                            Woken::WatchEnded => watch = None,
                            Woken::SessionGone => {
                                own.remove_now().await;
                                return Ok(None);
                            }
                        }
                    }
                    if watch.is_none() {
                        // From now on: the read below sees every deletion
                        // before it, the watch every one after it.
                        watch = watch_deletions(conn, keys.base()).await?;
                        if watch.is_none() {
                            // Not created: read and watch again after a
                            // pause, not in a busy loop against etcd.
                            tokio::time::sleep(WATCH_RETRY).await;
                        }
                    }
                    state = read_permits(conn, &keys).await?;
                }
            },
        }
    }
}

/// Queues the attempt: its waiter key on the client's waiter session when
/// the ttl is longer than [`WAITER_LEASE`] (a waiter that dies holds up
/// the queue for that long at most), else on the holder's. Returns where
/// it waits (`None` inside when the transaction found something in the
/// way, which the caller's next decision tells) and the name's keys as
/// the transaction saw them; `Ok(None)`: a session is gone.
async fn join_queue(
    to: &Attempt<'_>,
    keys: &SemKeys,
    holder: &str,
    session: &Arc<Session>,
    own: &mut OwnKey,
) -> Result<Option<(Option<Queued>, SemState)>> {
    let conn = to.conn;
    let waiter = if to.opts.ttl_value() > WAITER_LEASE {
        Some(to.sessions.waiter(conn).await?)
    } else {
        None
    };
    let on = waiter.as_ref().unwrap_or(session);
    let key = keys.waiter(on.id, to.sessions.next_acquisition());
    own.set(&key, on);
    let sent = send(to.name, on, || {
        queue_permit(conn, keys, &key, holder, on.id)
    })
    .await?;
    let (revision, state) = match sent {
        Sent::Done(revision, Some(state)) => (Some(revision), state),
        Sent::Done(revision, None) => (Some(revision), read_permits(conn, keys).await?),
        // An earlier send whose reply was lost may have queued the key.
        Sent::Failed(state) => (
            state
                .waiters
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, r)| *r),
            state,
        ),
        Sent::LeaseGone => {
            // Which lease is gone: a keep-alive tells (and marks it).
            session.keep_alive(conn).await?;
            if let Some(w) = &waiter {
                w.keep_alive(conn).await?;
            }
            return Ok(None);
        }
    };
    let queued = revision.map(|revision| Queued {
        key,
        revision,
        waiter,
    });
    Ok(Some((queued, state)))
}

/// Why a wait ended.
enum Woken {
    /// A key of the semaphore was deleted: read again.
    Deletion,
    /// The watch ended: watch again, then read again.
    WatchEnded,
    /// A session the waiter needs is gone.
    SessionGone,
}

/// Waits for the next deletion, keeping the sessions alive every third
/// of the shorter one (`keep_alive_at` is when the next keep-alive is due;
/// it carries over from one wait to the next).
async fn wait_for_deletion(
    conn: &EtcdConn,
    deletions: &mut Deletions,
    leases: &WaitSessions<'_>,
    keep_alive_at: &mut Instant,
) -> Result<Woken> {
    let every = leases.every();
    loop {
        tokio::select! {
            deleted = deletions.next() => {
                return Ok(if deleted { Woken::Deletion } else { Woken::WatchEnded });
            }
            () = tokio::time::sleep_until(*keep_alive_at) => {
                match leases.keep_alive(conn).await {
                    Ok(true) => *keep_alive_at = Instant::now() + every,
                    Ok(false) => return Ok(Woken::SessionGone),
                    Err(e) => {
                        if Instant::now() >= leases.valid_until() {
                            return Err(e);
                        }
                        *keep_alive_at = Instant::now() + every / 4;
                    }
                }
            }
        }
    }
}

/// The permit of `slot`, whose key was created at `revision` by a take
/// sent at `sent`; refused as too late (and the slot given back, by
/// `own`) when most of its ttl is gone.
fn granted(
    to: &Attempt<'_>,
    keys: &SemKeys,
    (slot, revision): (u32, i64),
    (token, session): (String, Arc<Session>),
    sent: Instant,
    own: &mut OwnKey,
) -> Result<Option<Acquired>> {
    let (name, opts) = (to.name, to.opts);
    // Too late: `own` gives the slot back.
    let (fence, deadline) = fence_and_deadline(name, opts, revision, &session, sent)?;
    own.clear();
    tracing::debug!(lock = %name, %fence, slot, "acquired");
    let granted = Granted::on_etcd(
        name,
        fence,
        opts,
        EtcdHold {
            key: keys.slot(slot),
            token,
            session,
            revision,
            slot: Some(slot),
            access: None,
        },
    );
    Ok(Some(Acquired {
        granted,
        deadline,
        renew_now: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(slots: &[u32], waiters: &[i64]) -> SemState {
        SemState {
            revision: 100,
            foreign: None,
            slots: slots
                .iter()
                .map(|&slot| crate::store::etcd::SlotHeld {
                    slot,
                    holder: Some(format!("h{slot}")),
                    revision: 10 + i64::from(slot),
                    lease: 1,
                })
                .collect(),
            waiters: waiters.iter().map(|&r| (format!("w{r}"), r)).collect(),
        }
    }

    #[test]
    fn the_lowest_free_slot_goes_to_the_oldest_waiter() {
        // Free: nobody waits, the lowest free slot.
        assert_eq!(
            decide(&state(&[], &[]), 3, "me", 9, None),
            Decision::Take(0)
        );
        assert_eq!(
            decide(&state(&[0, 2], &[]), 3, "me", 9, None),
            Decision::Take(1)
        );
        assert_eq!(
            decide(&state(&[0, 1, 2], &[]), 3, "me", 9, None),
            Decision::Wait
        );
        // One free slot, one waiter: the waiter's, not a newcomer's.
        assert_eq!(
            decide(&state(&[0, 2], &[50]), 3, "me", 9, None),
            Decision::Wait
        );
        assert_eq!(
            decide(&state(&[0, 2], &[50]), 3, "me", 9, Some(("w50", 50))),
            Decision::Take(1)
        );
        // Two free slots, two waiters: each its own, by rank.
        let two = state(&[1], &[50, 60]);
        assert_eq!(
            decide(&two, 3, "me", 9, Some(("w50", 50))),
            Decision::Take(0)
        );
        assert_eq!(
            decide(&two, 3, "me", 9, Some(("w60", 60))),
            Decision::Take(2)
        );
        assert_eq!(decide(&two, 3, "me", 9, None), Decision::Wait);
        // Three waiters, two free: the youngest waits.
        let three = state(&[1], &[50, 60, 70]);
        assert_eq!(
            decide(&three, 3, "me", 9, Some(("w70", 70))),
            Decision::Wait
        );
    }

    #[test]
    fn a_lost_reply_a_lost_key_and_a_conflict_are_told() {
        let mut held = state(&[0], &[]);
        held.slots[0].holder = Some("me".into());
        held.slots[0].lease = 9;
        assert_eq!(
            decide(&held, 2, "me", 9, None),
            Decision::Ours {
                slot: 0,
                revision: 10
            }
        );
        // The same id on another lease is not this attempt's.
        assert_eq!(decide(&held, 2, "me", 8, None), Decision::Take(1));
        assert_eq!(
            decide(&state(&[], &[50]), 2, "me", 9, Some(("w40", 40))),
            Decision::Gone
        );
        let mut other = state(&[0], &[]);
        other.foreign = Some(Foreign::Permits(4));
        assert_eq!(
            decide(&other, 2, "me", 9, None),
            Decision::Conflict(Foreign::Permits(4))
        );
    }

    #[test]
    fn conflicts_are_typed_and_name_the_key() {
        assert!(matches!(
            conflict("n", 2, Foreign::Mutex),
            Error::KindConflict {
                held: "mutex",
                asked: "semaphore",
                ..
            }
        ));
        assert!(matches!(
            conflict("n", 2, Foreign::Permits(3)),
            Error::PermitsConflict {
                held: 3,
                asked: 2,
                ..
            }
        ));
        let huge = "é".repeat(10_000);
        let text = conflict(&huge, 2, Foreign::Malformed("k/sem/x".into())).to_string();
        assert!(text.contains("k/sem/x") && text.len() < 1_000, "{text}");
    }
}
