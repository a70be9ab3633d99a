//! The recipe on etcd (feature `etcd`): the same fenced lock on a
//! consensus store. The calls it makes are the etcd store's
//! (`store::etcd`); what is decided here is which, and when.
//!
//! # The protocol
//!
//! It is etcd's own lock recipe (`concurrency.Mutex` on a
//! `concurrency.Session`, which `etcdctl lock` and etcd's Lock RPC use),
//! with fencelock's guarantees around it:
//!
//! - **A session per client and lease length.** A client grants one lease
//!   per ttl in whole seconds (rounded up: etcd leases count seconds, and
//!   etcd may raise a short one to its minimum, 1.5 election timeouts) and
//!   shares it among every lock it holds with that ttl (`session.rs`). It is
//!   never the server's default lease: etcd's Lock RPC called without a
//!   lease grants a 60 s lease that nobody keeps alive, and the lock then
//!   silently expires after 60 s. The keeper task (`lease::keeper`) keeps
//!   it alive at ttl/3 through each held lock's renewal, which also reads
//!   the lock's key: a lock taken over is lost alone, a session lost loses
//!   every lock held on it at once (each one's loss signal fires).
//! - **Every acquisition has a key of its own**:
//!   `NAMESPACE PREFIX NAME/LEASE/ACQ`, the session's lease id and a number
//!   the client gives each acquisition (in hex), attached to the session.
//!   Two tasks of one client on one name never share a key, so never both
//!   believe they hold the lock. Older clients' keys (`NAME/LEASE`, a lease
//!   per holder) live under the same prefix: old and new clients exclude
//!   each other.
//! - **The grant is one transaction** that creates the key if it does not
//!   exist, and reads who is first. The holder is the key with the lowest
//!   create revision under `NAMESPACE PREFIX NAME/`: later keys are
//!   waiters. A retried grant (the reply was lost) finds the key it created
//!   and uses it: one key per acquisition, never two. An uncontended cycle
//!   is two Raft commits: this transaction and the release's delete.
//! - **The fence is the holder key's create revision** (plus the fence
//!   epoch's base, [`crate::LockOptions::fence_epoch`], 1 × 2^53 unless
//!   set). Revisions grow cluster-wide with every write and survive leader
//!   changes, and the holders of a name hold keys in create-revision order,
//!   so each holder's fence is above every earlier holder's. It is a
//!   property of the key, readable by anyone (`status`), the same on every
//!   retry, and a transaction can compare it (the fenced write inside etcd,
//!   [`crate::FencedKey::write_held`]). The *response header* revision,
//!   which `etcdctl lock` exports as `ETCD_LOCK_REV`, is a different number
//!   (after a wait it is the revision of a later read): the two must never be
//!   mixed, or a later holder's fence can be below an earlier one's.
//! - **Waiting watches the predecessor**: the waiter's key stays in the
//!   queue; it watches the key created just before its own for its deletion
//!   (a watch from now, then a read that the key is still there, so no
//!   deletion is missed and the watch is one etcd serves at once), then
//!   looks again. First come, first served by construction.
//!   Every wait mode waits this way (`poll`, `notify` and `fair` alike).
//!   The look that finds the waiter first reads linearizably, unless its
//!   key is on the waiter session: then the move to the holder's session,
//!   which compares the key's create revision, decides. A member that has
//!   not applied a revoke yet (it deletes the first key, the waiter's once
//!   the key before it went) still shows the waiter's key first: the
//!   waiter is never told it holds a key a revoke has deleted.
//! - **A waiter's key is on a short lease.** With a ttl longer than
//!   `WAITER_LEASE` (2 s), one transaction creates the key on the holder's
//!   session if nobody holds or waits, else on the client's waiter session
//!   (a 2 s lease kept alive by its waiters); such a key moves to the
//!   holder's session (a put that keeps its create revision, so its place
//!   and fence) once it is first. A contended grant is then three Raft
//!   commits (queue, move, release), a free one two. A waiter whose process dies
//!   leaves its key for the waiter lease, not the ttl.
//! - **Giving up deletes the key**: a wait that runs out before it returns
//!   `Timeout`, a refusal or failure and a dropped future in the background
//!   (tracked by the client's `Cleanups`, which `LockClient::flush` waits
//!   for), again while the deletion fails and the session may live. A
//!   resent grant that finds a session gone (`LeaseGone`) deletes the key
//!   too before it queues again: the send whose reply was lost may have
//!   created it on the holder's session, which lives on, and it would stay
//!   first, nobody's.
//! - **Loss**: a keep-alive that finds the session gone, a holder key that
//!   is gone or re-created, or the local monotonic deadline passing first
//!   (then the key is deleted in the background: the session may live on
//!   for the client's other locks). A session is never kept alive past its
//!   own local deadline, so whatever is left on it goes with it.
//! - **Revoke** deletes the holder's key, whoever holds it (one
//!   transaction that compares its create revision), and reads the first
//!   key left; the revocation fence lies just below that key's create
//!   revision (see `EtcdEngine::revoke`).
//! - **Release** deletes the key if it still has the holder's create
//!   revision; a release that fails is sent again in the background while
//!   the session may live. The session stays for the client's next lock.
//!
//! # Semaphores
//!
//! A grant of [`crate::LockOptions::permits`] takes one of N slots, with
//! the same sessions, renewal, loss signal and release as the mutex
//! (`semaphore.rs`; the transactions are `store/etcd/semaphore.rs`):
//!
//! - **A key per slot**, `NAMESPACE PREFIX NAME/sem/N/slot/S`, on the
//!   holder's session, its value the holder id; **the fence is its create
//!   revision** in the fence epoch. Revisions grow cluster-wide, so fences
//!   grow in grant order across all slots of the name, and the next holder
//!   of a slot always has a higher fence than the last.
//! - **The grant is one transaction** that creates the chosen slot's key if
//!   it does not exist (so never two holders in a slot, never more than N)
//!   and the name has no key outside `sem/N/` (no mutex: `KindConflict`; no
//!   other count: `PermitsConflict`; the count is part of every key, so
//!   nothing holds it when the last holder is gone). On failure it reads
//!   the name, and the next decision is made from that read. A retried
//!   grant finds its slot by its holder id, which is the attempt's own.
//! - **Waiting is first come, first served across all permits**, in every
//!   wait mode: a waiter has a key `NAME/sem/N/wait/LEASE/ACQ` (on the
//!   waiter session, as a mutex's waiter), ordered by create revision, and
//!   a slot is taken only when fewer waiters older than the taker exist
//!   than free slots (a newcomer counts every waiter); the transaction's
//!   compares keep that rule at commit time. Waiters watch every deletion
//!   under `sem/N/` and read again after each; no polling.
//! - **Renewal, loss, release** are the mutex's: a keep-alive of the
//!   session and a read of the slot key's create revision; a release, and
//!   the background clean-up of a lease whose deadline passed, delete the
//!   key only if it still has the holder's create revision; an abandoned
//!   attempt gives back a slot it may have taken by comparing the holder
//!   id.
//! - **A mutex never meets a semaphore**: the mutex's grant transactions
//!   compare that the name has no `sem/` key (see `store/etcd/grant.rs`);
//!   a revoke (a mutex's) of a semaphore's name is refused.
//!
//! # Read-write locks
//!
//! A grant of [`crate::LockOptions::access`] ([`crate::LockClient::rwlock`])
//! is a reader or the writer of a read-write lock (`rwlock.rs`, which
//! argues each step; the transactions are `store/etcd/rwlock.rs`), with
//! the mutex's sessions, renewal, loss signal and release:
//!
//! - **A key per acquisition**, `NAMESPACE PREFIX NAME/rw/r/LEASE/ACQ` for
//!   a reader and `… /rw/w/LEASE/ACQ` for a writer, ordered by create
//!   revision in one queue. A writer holds once no key of the lock is
//!   older than its own, a reader once no writer's key is.
//! - **Fences**: a writer's is its key's create revision in the fence
//!   epoch (as a mutex's); a reader's write epoch is its own key's create
//!   revision in the same epoch.
//! - **Waiting** watches the newest key in the way for its deletion; each
//!   look compares the waiter's own key in the same read-only transaction.
//! - **Kinds**: the three kinds' grant transactions each compare that no
//!   key of the other two is under the name (`KindConflict`, nothing
//!   written). A revoke of a read-write lock deletes all its keys in one
//!   transaction and seals at that transaction's revision.
//!
//! | file | concern |
//! |---|---|
//! | `session.rs` | the client's sessions: granting, sharing and keeping them alive |
//! | `acquire.rs` | the key of an acquisition, the grant, the wait for the predecessor, giving up |
//! | `attempt.rs` | what an attempt of either kind works with: its inputs, the key it leaves to delete, the sessions a waiter keeps alive, the fence of a revision |
//! | `semaphore.rs` | a semaphore's permit: the slot to take, the queue across permits, the wait for a deletion |
//! | `rwlock.rs` | a read-write lock's reader or writer: the join, the wait for the keys in its way, the fences |
//! | `wait.rs` | a mutex's and a read-write lock's waiter: the keys in its way, the watch for their deletion, the move to the holder's session |
//! | `mod.rs` | a held lease's renewal and release, `inspect`, `top`'s names, the waiters |

mod acquire;
mod attempt;
mod rwlock;
mod semaphore;
mod session;
mod wait;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

pub(crate) use session::Session;

use super::cleanup::Cleanups;
use super::grant::{Acquired, EtcdHold, Granted};
use super::inspect::{LockState, PermitHolder, RwHolder};
use super::revoke::{Deposed, Revocation};
use crate::error::{Error, LossReason, Result};
use crate::fence::Fence;
use crate::keys::{KeyLayout, LockKeys, check_name};
use crate::options::{ETCD_DEFAULT_FENCE_EPOCH, FENCE_EPOCH_SIZE, LockOptions};
use crate::store::Checked;
use crate::store::etcd::{EtcdConn, Held, HeldKey, RwShown, depose, lock_prefix};

/// The etcd side of one client: its connection and its sessions.
#[derive(Debug)]
pub(crate) struct EtcdEngine {
    pub(crate) conn: EtcdConn,
    /// The deletions of abandoned keys and the releases of dropped leases
    /// still running.
    pub(crate) cleanups: Cleanups,
    sessions: session::Sessions,
}

impl EtcdEngine {
    pub(crate) fn new(conn: EtcdConn) -> Self {
        EtcdEngine {
            conn,
            cleanups: Cleanups::default(),
            sessions: session::Sessions::default(),
        }
    }

    /// Deletes the holder key of lock `keys` (whoever holds it), which
    /// lets the next key in the queue through, and returns the revocation
    /// fence: just below the next holder's key (its create revision minus
    /// one, at or above the deposed holder's), or the revision at which
    /// the lock was seen free. The fence is not a new key's: a key created
    /// now would queue behind the waiters, and its fence would lie above
    /// theirs, so sealing at it would refuse the waiters too. Nothing
    /// holds a fence between the deposed holder's and the next one's.
    ///
    /// A read-write lock's keys all go (its writer or all its readers, and
    /// its waiters, who queue again), and the fence is the deleting
    /// transaction's revision: above every deposed reader's epoch, so
    /// their validated reads are torn once sealed (see `rwlock.rs`). The
    /// holder reported is the oldest: the writer, or the first reader.
    ///
    /// A name held as a semaphore is refused ([`Error::KindConflict`]),
    /// and nothing is deleted.
    pub(crate) async fn revoke(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
    ) -> Result<Revocation> {
        if opts.replication.is_some() {
            return Err(Error::InvalidOption(
                "waiting for replicas is for Redis: etcd commits every revoke to a majority of its members before it answers".into(),
            ));
        }
        let deposal = Box::pin(depose(&self.conn, name, keys.lock())).await?;
        let sealed_at = deposal.next.map_or(deposal.revision, |next| next - 1);
        let deposed = match deposal.holder {
            Some((holder, created)) => Some(Deposed {
                holder,
                fence: Some(attempt::fence_of(created, opts)?),
            }),
            None => None,
        };
        Ok(Revocation {
            fence: attempt::fence_of(sealed_at, opts)?,
            deposed,
            replicas: None,
        })
    }

    /// Takes lock `name` (its keys' prefix is `keys.lock`): once if `wait`
    /// is false or the wait is zero, else waiting until the options'
    /// deadline.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: &LockKeys,
        opts: &LockOptions,
        wait: bool,
    ) -> Result<Acquired> {
        // Boxed: etcd's request futures are large, and this one would
        // otherwise sit on the caller's stack.
        Box::pin(acquire::acquire(
            &self.conn,
            &self.cleanups,
            &self.sessions,
            name,
            keys,
            opts,
            wait,
        ))
        .await
    }

    /// One renewal: a keep-alive of the holder's session and a read of its
    /// key.
    pub(crate) async fn extend(&self, granted: &Granted) -> Result<Checked> {
        let hold = granted.etcd()?;
        let mut codes = self.keep_alive(&hold.session, &[hold]).await?;
        Ok(codes.pop().unwrap_or(Checked::NotOurs(LossReason::Expired)))
    }

    /// One keep-alive of `session` and a read of each of `holds` (keys on
    /// it), sent together; the session's deadline moves forward, or it is
    /// given up when etcd says it is gone. A session whose own local
    /// deadline passed is never kept alive again: its locks are lost.
    async fn keep_alive(&self, session: &Session, holds: &[&EtcdHold]) -> Result<Vec<Checked>> {
        let sent = Instant::now();
        if !session.may_be_alive(sent) {
            return Ok(vec![
                Checked::NotOurs(LossReason::DeadlinePassed);
                holds.len()
            ]);
        }
        let keys: Vec<HeldKey<'_>> = holds.iter().map(|h| held_key(h)).collect();
        let codes = self.conn.keep_alive(session.id, &keys).await?;
        if codes.contains(&Checked::NotOurs(LossReason::Expired)) {
            session.mark_gone();
        } else {
            session.renewed(sent);
        }
        Ok(codes)
    }

    /// Deletes the holder's key if it is still its own. A release that did
    /// not reach etcd is sent again in the background while the session may
    /// live (the client's other locks keep it alive, and the key with it).
    pub(crate) async fn release(&self, granted: &Granted) -> Result<Checked> {
        let hold = granted.etcd()?;
        let released = self.conn.release(held_key(hold)).await;
        if let Err(e) = &released
            && e.is_retryable()
        {
            self.release_in_background(hold);
        }
        released
    }

    /// `granted`'s local deadline passed: its key is deleted in the
    /// background if its session may live on.
    pub(crate) fn deadline_passed(&self, granted: &Granted) {
        if let Ok(hold) = granted.etcd() {
            self.release_in_background(hold);
        }
    }

    /// Sends the release of `hold` again until it reaches etcd or the
    /// session may be gone.
    fn release_in_background(&self, hold: &EtcdHold) {
        if !hold.session.may_be_alive(Instant::now()) {
            return;
        }
        let conn = self.conn.clone();
        let (key, session, revision) = (hold.key.clone(), hold.session.clone(), hold.revision);
        self.cleanups.spawn(async move {
            loop {
                let held = HeldKey {
                    key: &key,
                    lease: session.id,
                    revision,
                };
                match conn.release(held).await {
                    Err(e) if e.is_retryable() && session.may_be_alive(Instant::now()) => {
                        tokio::time::sleep(RELEASE_RETRY).await;
                    }
                    _ => return,
                }
            }
        });
    }

    /// One keep-alive per session and a read of each holder's key, all
    /// sent at once; one code per lease, in order (an error fails the
    /// batch: each lease retries).
    pub(crate) async fn renew_many(&self, leases: &[&Granted]) -> Result<Vec<Checked>> {
        let holds = leases
            .iter()
            .map(|g| g.etcd())
            .collect::<Result<Vec<&EtcdHold>>>()?;
        // By session, each with the places of its holds in the batch.
        let mut by_session: HashMap<i64, (Arc<Session>, Vec<usize>)> = HashMap::new();
        for (i, h) in holds.iter().enumerate() {
            by_session
                .entry(h.session.id)
                .or_insert_with(|| (h.session.clone(), Vec::new()))
                .1
                .push(i);
        }
        let replies = futures_util::future::join_all(by_session.values().map(|(session, at)| {
            let group: Vec<&EtcdHold> = at.iter().map(|i| holds[*i]).collect();
            async move { (at, self.keep_alive(session, &group).await) }
        }))
        .await;
        let mut codes = vec![Checked::NotOurs(LossReason::Expired); holds.len()];
        for (at, reply) in replies {
            for (i, code) in at.iter().zip(reply?) {
                codes[*i] = code;
            }
        }
        Ok(codes)
    }

    /// The keys of lock `name`: `lock` is the prefix of the lock's keys
    /// (`NAMESPACE PREFIX NAME/`, `/` and `%` in the name escaped); each
    /// holder or waiter has the key `lock` + `LEASE/ACQ`; the other
    /// fields are empty (etcd needs no fence key, queue or channel).
    pub(crate) fn keys(&self, prefix: &str, name: &str) -> Result<LockKeys> {
        check_name(name)?;
        Ok(LockKeys::from_lock_key(lock_prefix(
            self.conn.namespace(),
            prefix,
            name,
        )))
    }

    /// The keys of lock `name` for a call: the guide layout does not exist
    /// on etcd.
    pub(crate) fn lock_keys(
        &self,
        prefix: &str,
        name: &str,
        layout: KeyLayout,
    ) -> Result<LockKeys> {
        if layout == KeyLayout::Guide {
            return Err(Error::InvalidOption(
                "the guide layout (lock:NAME in Redis) does not exist on etcd: use the default layout".into(),
            ));
        }
        self.keys(prefix, name)
    }

    /// Who holds lock `keys`: the key with the lowest create revision (its
    /// value is the holder id), the fence its create revision in the epoch
    /// of `defaults`, `remaining` its lease's time to live (whole seconds);
    /// `last_fence` of a free lock is `None`, etcd keeps no fence per name.
    /// A semaphore shows the holder of each slot the same way, a
    /// read-write lock its writer or its readers (each reader's fence its
    /// write epoch); their `last_fence` is `None` too.
    pub(crate) async fn inspect(
        &self,
        keys: &LockKeys,
        defaults: &LockOptions,
    ) -> Result<LockState> {
        let fence_of = |revision: i64| {
            u64::try_from(revision)
                .ok()
                .filter(|r| *r < FENCE_EPOCH_SIZE)
                .map(|r| Fence::new(defaults.fence_base(ETCD_DEFAULT_FENCE_EPOCH) + r))
        };
        let unknown = || "unknown".to_owned();
        Ok(match self.conn.holder(keys.lock()).await? {
            None => LockState::Free { last_fence: None },
            Some(Held::Mutex(holder)) => LockState::Held {
                holder: holder.id.unwrap_or_else(unknown),
                fence: fence_of(holder.revision),
                remaining: Some(holder.remaining),
            },
            Some(Held::Semaphore { permits, slots }) => LockState::Semaphore {
                permits,
                holders: slots
                    .into_iter()
                    .map(|s| PermitHolder {
                        slot: s.slot,
                        holder: s.holder.unwrap_or_else(unknown),
                        fence: fence_of(s.revision),
                        remaining: s.remaining,
                    })
                    .collect(),
                last_fence: None,
            },
            Some(Held::RwLock { writer, readers }) => {
                let shown = |h: RwShown| RwHolder {
                    holder: h.holder.unwrap_or_else(unknown),
                    fence: fence_of(h.revision),
                    remaining: h.remaining,
                };
                LockState::RwLock {
                    writer: writer.map(shown),
                    readers: readers.into_iter().map(shown).collect(),
                    last_fence: None,
                }
            }
        })
    }

    /// How many wait behind the holder of lock `keys`.
    pub(crate) async fn waiters(&self, keys: &LockKeys) -> Result<u64> {
        self.conn.waiters(keys.lock()).await
    }

    /// The names of the locks under `prefix` (after the URL's namespace)
    /// that have a key and match the glob `pattern`, sorted.
    pub(crate) async fn lock_names(&self, prefix: &str, pattern: &str) -> Result<Vec<String>> {
        let names_prefix = format!("{}{prefix}", self.conn.namespace());
        self.conn.lock_names(&names_prefix, pattern).await
    }
}

/// Pause before sending a failed release again in the background.
const RELEASE_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// What the store needs of a held etcd lease.
fn held_key(hold: &EtcdHold) -> HeldKey<'_> {
    HeldKey {
        key: &hold.key,
        lease: hold.session.id,
        revision: hold.revision,
    }
}
