//! The lock recipe on etcd as a stateright [`Model`] ([`EtcdLockModel`]):
//! one lock name's keys, the leases they live on and a fenced etcd key
//! ([`Etcd`]); clients that take the lock, register their fence at the
//! fenced key, read it, write it plus one and release (the torture
//! workers' cycle), interleaved in every order with the passing of time
//! and the faults of [`Faults`]; and the properties of the Redis model
//! ([`crate::model`]) over every reachable state.
//!
//! # What is modelled, from which code
//!
//! Written from `crates/fencelock/src/store/etcd/` and
//! `crates/fencelock/src/engine/etcd/`, branch for branch. Each request to
//! etcd is one atomic transition: etcd applies a transaction atomically,
//! and a put on a lease that is gone fails the whole transaction.
//!
//! - **The keyspace** ([`Etcd`]): the revision, which every write bumps (a
//!   lock key created, put or deleted, a fenced write, a seal; a lease that
//!   expires with keys on it deletes them in one write, as etcd's lessor
//!   revokes it); the lock's keys in create-revision order, each with its
//!   lease; the live leases and the tick each expires. Lease grants and
//!   keep-alives are not writes. A lease expires when its tick comes, and
//!   its keys with it; a keep-alive of a lease that is gone fails, so
//!   nothing brings a key back but a put.
//! - **Sessions** (`engine/etcd/session.rs`): a client has a holder
//!   session (one lease of the ttl, kept across its cycles) and, with a
//!   [`EtcdLockModel::waiter_lease`] shorter than the ttl, a waiter session.
//!   An attempt takes each session as it is if it may be alive and is fresh
//!   (`fresh_for`: most of the ttl left), keeps it alive first if it may be
//!   alive but is not fresh, and grants a new lease if it may be gone or
//!   that keep-alive finds it gone ([`Action::Prepare`]). A session's local
//!   deadline is the send time of its grant or latest successful
//!   keep-alive plus its length minus the drift margin, and only moves
//!   forward; a session whose deadline passed is never kept alive again.
//! - **Keys** (`store/etcd/keys.rs`, `holder_key`): one per acquisition,
//!   `NAME/LEASE/ACQ`. The model names a key by its client and acquisition
//!   number ([`KeyName`]): the lease in the name is the client's own
//!   session, and the number is new for every attempt, as is the token, so
//!   the holder id an acquisition writes to the fenced key is its key's
//!   name too.
//! - **The grant** (`store/etcd/grant.rs`): `queue_txn` creates the key on
//!   the holder's session if its create revision is 0 and reads the first
//!   key and the two newest, else reads the key and the first key (a
//!   resent transaction finds the key it created: [`Etcd::queue_txn`]).
//!   With a waiter session, `try_or_queue_txn` creates the key on the
//!   holder's session if no key exists under the prefix, else puts it on
//!   the waiter session (a put keeps the create revision of a key a resent
//!   transaction created) and reads it, the first key and the two newest
//!   ([`Etcd::try_or_queue_txn`]). First means the first key by create
//!   revision is ours; the fence is that create revision (`fence_of`; the
//!   epoch's base is one constant added to every fence and is left out).
//! - **The attempt** (`engine/etcd/acquire.rs`, `attempt`, `send_grant`,
//!   `wait_turn`): `sent` is taken before the first send. A lost reply is
//!   sent again with the same key while the holder session's local
//!   deadline has not passed, else the attempt fails and its key is
//!   deleted (`OwnKey`). `LeaseGone` keeps both sessions alive (which
//!   marks the one that is gone), deletes the key by its name (a send
//!   whose reply was lost may have created it: the first finding) and
//!   starts a new attempt. Queued, a waiter watches the key just before
//!   its own and looks again when that key is deleted ([`Action::Look`],
//!   `look`: our key gone → a new attempt; no key before ours → first;
//!   else watch the key before ours; a linearizable read on the holder's
//!   session, a serializable one on the waiter session, where `attach`
//!   compares the key next: the second finding), keeping its sessions
//!   alive meanwhile ([`Action::KeepAlive`]; one that is gone, or past its
//!   local deadline, ends the attempt, and its key is deleted). A waiter
//!   that became first takes `sent` then and, with a waiter session,
//!   moves its key to the holder's session ([`Action::Attach`], `attach`,
//!   compared by create revision; refused: a new attempt, the key
//!   deleted). The lock's local deadline is the holder session's, capped
//!   at `sent + ttl − drift`; a grant with no tick of it left is too late
//!   (`arrived_too_late`: the key is deleted, and a new attempt made).
//! - **A held lock** (`engine/etcd/mod.rs`, `store/etcd/held.rs`): the
//!   renewal ([`Action::Renew`], `keep_alive`) sends nothing once the
//!   lock's or the session's local deadline passed (then the key is
//!   deleted if the session may still live, `deadline_passed`); else it
//!   keeps the session alive and reads the key: the lease gone ends the
//!   lock (`Expired`), the key gone or re-created too (`TakenOver`), else
//!   the deadline moves to the renewal's send time + ttl − drift. A loss
//!   ends the cycle, as in the Redis model. The release deletes the key if
//!   it still has the holder's create revision; the session stays.
//! - **The fenced key** (`store/etcd/fenced.rs`, `resource/etcd_key.rs`):
//!   `write` is the rule transaction (the key absent; its fence lower; the
//!   same fence and holder); `register` is `update` with the value kept (a
//!   read-modify-write whose write compares the mod revision, one step
//!   here). With [`EtcdLockModel::held_writes`], both compare the writer's
//!   lock key first (`write_held`, `update_held`: it must exist with the
//!   create revision it was granted at).
//! - **The revoke** (`store/etcd/revoke.rs`, `EtcdEngine::revoke`,
//!   `FencedKey::seal`): the first key by create revision is deleted
//!   whoever's it is; the revocation fence is the first key left's create
//!   revision minus one, else the deleting write's revision, else (the lock
//!   was free) the store's revision; the fenced key is then sealed at it
//!   (recorded with the holder `revoked` unless a greater fence is stored:
//!   an equal one is taken over).
//!
//! # Faults
//!
//! - A client may be paused between any two of its steps for any number
//!   of ticks (every interleaving with [`Action::Tick`]), so past its
//!   lease: its leases expire and their keys go.
//! - A lease expires between two calls of its client: a grant sent on a
//!   session that expired after it was prepared, a keep-alive or renewal
//!   that finds it gone, an `attach` of a key that went with the waiter
//!   lease.
//! - [`Faults::lost_reply`]: a grant transaction runs, its reply is lost,
//!   and the client sends it again with the same key (once per run).
//! - [`Faults::revoke`]: a revoke and its seal (once per run).
//! - [`Faults::stale_look`]: one `look` of a waiter on the waiter session
//!   is served by a member that has not applied the last write yet: its
//!   serializable read, which `look` trusts when it shows our key, since
//!   `attach` compares the key before the waiter is told (once per run). A
//!   waiter on the holder's session reads linearizably: no stale look.
//!
//! etcd commits every write to a majority (Raft) before it replies, so an
//! acknowledged write is never lost: unlike the Redis model there is no
//! data-loss or failover fault, and no server clock to step (leases count
//! on the leader's monotonic clock).
//!
//! # Properties
//!
//! As in the Redis model: C1 (no write accepted with a fence below an
//! accepted one), C2 (no two holders accepted with one fence), C3 (no
//! acknowledged increment lost, with the fence registered before the read
//! by `FencedKey::register`), C4 (mutual exclusion among holders valid by
//! their own local deadline; a revoked lease ends at the revoke), C6
//! (fences strictly increase in grant order: the order in which the first
//! key changes, as torture's observer sees holders; a revocation fence is
//! at or above the deposed holder's and below the next holder's), C7 (no
//! renewal re-creates a key), and revoked holders refused (once the revoke
//! returned, no write with a fence at or below its revocation fence is
//! accepted). Nothing is excused. Then two of etcd's own:
//!
//! - *no grant of a revoked key*: no client is told it holds a key a
//!   revoke has deleted;
//! - bounded liveness, *the lock passes within the drift margin*: the
//!   first key by create revision, which etcd's order makes the holder as
//!   soon as the keys before it are gone, is an acquisition's that still
//!   uses it (sending, waiting, moving or holding it), but for at most the
//!   drift margin. Every path that gives a key up deletes it at once,
//!   except a key left on a session whose local deadline passed, which
//!   etcd expires at most the drift margin later. The first waiter's
//!   watch ends with the deletion of the key before it, so its next step
//!   takes the lock; how long a paused waiter takes to make that step is
//!   its pause, not the recipe.
//!
//! `sometimes` properties show that every cycle can finish, every
//! configured fault happens, a holder outlives its lease (its lease, and
//! its key, expired between two of its calls), and a waiter gets the lock
//! after waiting (on a waiter session: after moving its key).
//!
//! # Where the model is coarser than the code
//!
//! - Time is ticks. The drift margin is whole ticks (the code's
//!   `ttl / 100 + 2 ms`), the same for both sessions, and "too late" is
//!   "no tick left" (a tenth of the ttl is less than a tick). A session's
//!   lease is the ttl (the code rounds it up to whole seconds, and etcd
//!   may raise it to its minimum: keys then live longer, which only delays
//!   the next holder).
//! - A lease ends exactly at its tick. etcd revokes an expired lease a
//!   little later, and a new leader extends every lease: keys live longer
//!   than the clients count, never shorter (a keep-alive of an expired
//!   lease waits for its revocation and fails).
//! - Each request is atomic and answered at once, and only a grant's reply
//!   is lost. Retry loops of transient errors are one step: `depose`'s
//!   re-read of a changed holder, `update`'s of a changed key,
//!   `move_to_session`'s and the release's resends. Preparing both
//!   sessions is one step, and so are the look, the watch and its check
//!   that the watched key is still there (a deletion between them is seen
//!   by that check in the code). Keep-alives while waiting may come at any
//!   step (the code sends them every third of the shorter session), and
//!   renewals at any step while holding (every third of the ttl).
//! - One lock per session: a client's other locks, which keep a shared
//!   session alive in the code, are not modelled, nor two tasks of one
//!   process on one name. Every client waits (`acquire`); `try_acquire`'s
//!   `try_txn` is not modelled, nor the wait's own timeout. A key deletion
//!   of a give-up is sent at once and never fails (the code retries it in
//!   the background while the session may live).
//! - The revoke and its seal are one step, as in the Redis model (the code
//!   seals after the deposing transaction returned; the revoke rule speaks
//!   of the time it returned). Its deposal is sent once, as in the code.
//! - Lease ids are per client (`client * 64 + n`); etcd's are unique and
//!   carry no order, which is what the lease-id control relies on.
//! - States are kept small without changing what can happen: revisions are
//!   relabelled after every step ([`relabel_revisions`]), a new lease or
//!   acquisition takes the smallest number nothing refers to any more, a
//!   client that is done forgets its sessions, and a lease with no key
//!   that no session refers to is dropped (its expiry deletes nothing).
//!   Traces are printed with etcd's own revisions ([`EtcdLockModel::relabel`]
//!   off).
//!
//! # Findings, fixed
//!
//! The checker found two counterexamples in the recipe as it was first
//! written; both are fixed in the library, and each old rule is a
//! [`Broken`] switch that brings its counterexample back
//! (`tests/etcd.rs`):
//!
//! - **A key orphaned after `LeaseGone` blocked the lock** (a waiter
//!   session and a lost reply; [`Broken::keep_key_on_lease_gone`]). The
//!   first `try_or_queue_txn` finds no key and creates the client's key on
//!   the holder's session; its reply is lost. By the resend the waiter
//!   session has expired (nothing keeps it alive during `send_grant`'s
//!   resends, which go on while the holder session lives: an etcd out of
//!   reach for longer than `WAITER_LEASE`, or a pause), so the resend's
//!   put on it fails the whole transaction (`LeaseGone`). `attempt` cleared
//!   `own` ("the caller created nothing"), and the key of the first send
//!   stayed, first, on the holder's session, which the `LeaseGone` branch
//!   had just kept alive. The next attempt took that same session, queued
//!   behind the orphan and kept the session alive while it waited (as do
//!   the client's other locks of the same ttl): nobody held the lock and
//!   nobody got it until the client stopped keeping its session alive.
//!   "The lock passes within the drift margin" failed. The attempt now
//!   deletes its key by name before it queues again.
//! - **A revoked waiter was told that it held** (a revoke and a stale look;
//!   [`Broken::serializable_holder_look`]). A waiter's key has just become
//!   first (the key before it went), and the revoke deletes it before the
//!   waiter looked; the waiter's serializable `look` is served by a member
//!   that has not applied the revoke, shows its key first, and the waiter
//!   was told it held the lock after the revoke returned, with a fence at
//!   or below the revocation fence. The seal refused its writes (so would
//!   `write_held`), C4 ends a revoked lease at the revoke, and its first
//!   renewal found the key gone; "no grant of a revoked key" failed. The
//!   look of a waiter on the holder's session is now linearizable; on the
//!   waiter session a stale look that shows the key first is followed by
//!   `attach`, which compares the key's create revision and finds it gone
//!   (checked with a stale look and a revoke on the waiter session).
//!
//! # Negative controls
//!
//! Each switch in [`Broken`] is a mistake the code says it avoids, or one
//! of the two old rules above; with it, the checker must find a
//! counterexample (`tests/etcd.rs`).

use stateright::{Model, Property};

/// The name of one acquisition's key (`NAME/LEASE/ACQ`): the client that
/// created it and the number of its acquisition. It is also the holder id
/// that acquisition writes to the fenced key (one token per attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyName {
    /// The client.
    pub client: u8,
    /// Its acquisition number (a new one for every attempt).
    pub acq: u8,
}

/// The holder a seal records (`REVOKED_HOLDER`): no acquisition has it.
pub const REVOKED: KeyName = KeyName {
    client: u8::MAX,
    acq: u8::MAX,
};

/// An etcd lease id: the client that granted it and its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId {
    /// The client.
    pub client: u8,
    /// Its number among the client's leases: the smallest that no live
    /// lease and no session of the client has (an id nothing refers to
    /// any more is as good as a new one).
    pub n: u8,
}

impl LeaseId {
    /// The id as a number (`client * 64 + n`): unique, in no grant order.
    pub fn number(self) -> u32 {
        u32::from(self.client) * 64 + u32::from(self.n)
    }
}

/// A key under the lock's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// Its name.
    pub name: KeyName,
    /// The lease it is attached to.
    pub lease: LeaseId,
    /// Its create revision (kept by a put on the existing key).
    pub create: u32,
}

/// A live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Its id.
    pub id: LeaseId,
    /// The tick it expires (kept alive: moved to the keep-alive's tick +
    /// its length).
    pub expires: u32,
}

/// The fenced etcd key (`FencedKey`): `FENCE:HOLDER:VALUE`, absent until
/// the first accepted write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FencedKey {
    /// The value (a counter).
    pub value: u8,
    /// The stored fence (`None`: the key does not exist).
    pub fence: Option<u32>,
    /// The stored holder id.
    pub holder: Option<KeyName>,
}

impl FencedKey {
    /// The rule transaction's three branches (`rule_txn`): the key is
    /// absent, the stored fence is lower, or it is equal and the holder
    /// the same; with `ge_check`, an equal fence from anyone.
    pub fn accepts(&self, fence: u32, holder: KeyName, ge_check: bool) -> bool {
        match self.fence {
            None => true,
            Some(stored) if fence > stored => true,
            Some(stored) if fence == stored => ge_check || self.holder == Some(holder),
            Some(_) => false,
        }
    }
}

/// What a fenced write changes when accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Set the value.
    Write(u8),
    /// Record fence and holder only (`FencedKey::register`).
    Register,
}

/// What a grant transaction found (`Found`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Found {
    /// Our key is first: granted at this create revision.
    First(u32),
    /// Our key waits at this create revision; the key just before it, when
    /// the transaction read it.
    Queued {
        /// Our key's create revision.
        revision: u32,
        /// The key just before ours, if read.
        predecessor: Option<KeyName>,
    },
    /// The lease the key was to be put on is gone: nothing was written.
    LeaseGone,
}

/// Where our key stands (`Look`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Look {
    /// Our key (with our create revision) is gone.
    Gone,
    /// No key before ours.
    First,
    /// This key is just before ours.
    Behind(KeyName, u32),
}

/// `look`: our key and the one just before it, among `keys` (the keys
/// with a create revision up to ours, newest first, two at most).
pub fn look(keys: &[Key], name: KeyName, revision: u32) -> Look {
    if !keys.iter().any(|k| k.name == name && k.create == revision) {
        return Look::Gone;
    }
    match keys.iter().rev().find(|k| k.create < revision) {
        Some(before) => Look::Behind(before.name, before.create),
        None => Look::First,
    }
}

/// One etcd cluster as one lock name's requests see it: linearizable, no
/// acknowledged write lost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Etcd {
    /// The store's revision (the last write's).
    pub revision: u32,
    /// The keys under the lock's prefix, in create-revision order.
    pub keys: Vec<Key>,
    /// The live leases.
    pub leases: Vec<Lease>,
    /// The fenced key (outside the lock's prefix, `in_lock_space`).
    pub resource: FencedKey,
}

impl Default for Etcd {
    fn default() -> Self {
        Self::new()
    }
}

impl Etcd {
    /// An empty cluster (an empty etcd is at revision 1).
    pub fn new() -> Self {
        Etcd {
            revision: 1,
            keys: Vec::new(),
            leases: Vec::new(),
            resource: FencedKey::default(),
        }
    }

    fn bump(&mut self) -> u32 {
        self.revision += 1;
        self.revision
    }

    /// Whether lease `id` is alive.
    pub fn lease_alive(&self, id: LeaseId) -> bool {
        self.leases.iter().any(|l| l.id == id)
    }

    /// The key `name`, if it exists.
    pub fn key(&self, name: KeyName) -> Option<Key> {
        self.keys.iter().find(|k| k.name == name).copied()
    }

    /// Whether key `name` exists with create revision `create`.
    pub fn has(&self, name: KeyName, create: u32) -> bool {
        self.key(name).is_some_and(|k| k.create == create)
    }

    /// The first key by create revision: the holder's.
    pub fn first(&self) -> Option<Key> {
        self.keys.first().copied()
    }

    /// `LeaseGrant`: a new lease that expires at `expires` (the leases are
    /// kept in id order).
    pub fn grant_lease(&mut self, id: LeaseId, expires: u32) {
        self.leases.push(Lease { id, expires });
        self.leases.sort_by_key(|l| l.id);
    }

    /// `LeaseKeepAlive`: false if the lease is gone (it never comes back).
    pub fn keep_alive(&mut self, id: LeaseId, expires: u32) -> bool {
        match self.leases.iter_mut().find(|l| l.id == id) {
            Some(l) => {
                l.expires = l.expires.max(expires);
                true
            }
            None => false,
        }
    }

    /// A put of key `name` attached to `lease`: creates it, or keeps its
    /// create revision and moves it to `lease`. `None`: the lease is gone,
    /// nothing was written. Returns the key's create revision.
    pub fn put_key(&mut self, name: KeyName, lease: LeaseId) -> Option<u32> {
        if !self.lease_alive(lease) {
            return None;
        }
        let revision = self.bump();
        match self.keys.iter_mut().find(|k| k.name == name) {
            Some(k) => {
                k.lease = lease;
                Some(k.create)
            }
            None => {
                self.keys.push(Key {
                    name,
                    lease,
                    create: revision,
                });
                Some(revision)
            }
        }
    }

    /// A plain delete of key `name` (`delete_key`); whether it existed.
    pub fn delete_key(&mut self, name: KeyName) -> bool {
        let Some(at) = self.keys.iter().position(|k| k.name == name) else {
            return false;
        };
        self.keys.remove(at);
        self.bump();
        true
    }

    /// The leases whose tick has come end, each deleting its keys in one
    /// write. Returns whether a key went.
    pub fn expire(&mut self, now: u32) -> bool {
        let ended: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|l| l.expires <= now)
            .map(|l| l.id)
            .collect();
        let mut deleted = false;
        for id in ended {
            self.leases.retain(|l| l.id != id);
            let before = self.keys.len();
            self.keys.retain(|k| k.lease != id);
            if self.keys.len() < before {
                self.bump();
                deleted = true;
            }
        }
        deleted
    }

    /// `queue_txn`: create our key on `lease` if its create revision is 0
    /// and read the first key and the two newest; else read our key and
    /// the first key. With `no_wait` (a negative control), our key is
    /// taken for the holder's whenever it exists.
    pub fn queue_txn(&mut self, name: KeyName, lease: LeaseId, no_wait: bool) -> Found {
        let first_is_ours = |etcd: &Etcd| no_wait || etcd.first().is_some_and(|f| f.name == name);
        match self.key(name) {
            None => {
                let Some(revision) = self.put_key(name, lease) else {
                    return Found::LeaseGone;
                };
                if first_is_ours(self) {
                    return Found::First(revision);
                }
                // Newest first: ours, then the one before it.
                let predecessor = self
                    .keys
                    .iter()
                    .rev()
                    .take(2)
                    .find(|k| k.name != name)
                    .map(|k| k.name);
                Found::Queued {
                    revision,
                    predecessor,
                }
            }
            Some(own) if first_is_ours(self) => Found::First(own.create),
            Some(own) => Found::Queued {
                revision: own.create,
                predecessor: None,
            },
        }
    }

    /// `try_or_queue_txn`: if no key exists, create ours on the holder's
    /// `lease`; else put ours on the `waiter` lease (a put keeps the create
    /// revision of a key a resent transaction created) and read it, the
    /// first key and the two newest. Also says whether the key is on the
    /// waiter lease.
    pub fn try_or_queue_txn(
        &mut self,
        name: KeyName,
        lease: LeaseId,
        waiter: LeaseId,
        no_wait: bool,
    ) -> (Found, bool) {
        if self.keys.is_empty() {
            return match self.put_key(name, lease) {
                Some(revision) => (Found::First(revision), false),
                None => (Found::LeaseGone, false),
            };
        }
        let Some(revision) = self.put_key(name, waiter) else {
            return (Found::LeaseGone, false);
        };
        if no_wait || self.first().is_some_and(|f| f.name == name) {
            return (Found::First(revision), true);
        }
        // `predecessor_of`: known when ours is the newest.
        let mut newest = self.keys.iter().rev();
        let ours_newest = newest
            .next()
            .is_some_and(|k| k.name == name && k.create == revision);
        let predecessor = newest.next().filter(|_| ours_newest).map(|k| k.name);
        (
            Found::Queued {
                revision,
                predecessor,
            },
            true,
        )
    }

    /// `attach`: moves our key to `lease` if it still has create revision
    /// `revision` and the lease lives.
    pub fn attach(&mut self, name: KeyName, revision: u32, lease: LeaseId) -> bool {
        if !self.has(name, revision) {
            return false;
        }
        self.put_key(name, lease).is_some()
    }

    /// The release (`release_now`): deletes our key if it still has create
    /// revision `revision`.
    pub fn release(&mut self, name: KeyName, revision: u32) -> bool {
        if !self.has(name, revision) {
            return false;
        }
        self.delete_key(name)
    }

    /// `depose` and `EtcdEngine::revoke`: deletes the first key (whoever's)
    /// and returns it with the revocation fence: the first key left's
    /// create revision minus one, else the deleting write's revision, else
    /// (the lock was free) the current revision. `above_waiters` (a
    /// negative control) seals at the deleting write's revision even with
    /// a key left.
    pub fn depose(&mut self, above_waiters: bool) -> (Option<Key>, u32) {
        let Some(holder) = self.first() else {
            return (None, self.revision);
        };
        self.keys.remove(0);
        let revision = self.bump();
        let fence = match self.first() {
            Some(next) if !above_waiters => next.create.saturating_sub(1),
            _ => revision,
        };
        (Some(holder), fence)
    }

    /// `write_key`: the fence rule, and with `owner` first the writer's
    /// lock key (`write_held`: it must exist with that create revision).
    /// Whether the change was applied.
    pub fn fenced_write(
        &mut self,
        fence: u32,
        holder: KeyName,
        change: Change,
        ge_check: bool,
        owner: Option<(KeyName, u32)>,
    ) -> bool {
        if let Some((name, revision)) = owner
            && !self.has(name, revision)
        {
            return false;
        }
        if !self.resource.accepts(fence, holder, ge_check) {
            return false;
        }
        self.bump();
        self.resource.fence = Some(fence);
        self.resource.holder = Some(holder);
        if let Change::Write(v) = change {
            self.resource.value = v;
        }
        true
    }

    /// `FencedKey::seal`: records `fence` with the holder [`REVOKED`],
    /// keeping the value, unless a greater fence is stored.
    pub fn seal(&mut self, fence: u32) -> bool {
        if self.resource.fence.is_some_and(|stored| stored > fence) {
            return false;
        }
        self.bump();
        self.resource.fence = Some(fence);
        self.resource.holder = Some(REVOKED);
        true
    }
}

/// The faults a configuration may inject (each at most once per run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A grant transaction's reply is lost: it ran, and the client sends
    /// it again with the same key.
    pub lost_reply: bool,
    /// A revoke of whoever holds the lock, and the seal of the fenced key
    /// at the revocation fence.
    pub revoke: bool,
    /// A waiter's serializable `look` (on the waiter session) is served by
    /// a member that has not applied the last write yet.
    pub stale_look: bool,
}

/// Deliberately broken rules, each a negative control: a mistake the code
/// says it avoids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Broken {
    /// The holder test does not wait for the keys ahead: a client takes
    /// the lock as soon as its own key exists (the recipe: the holder is
    /// the key with the lowest create revision, later keys are waiters).
    /// Caught by C4.
    pub no_wait: bool,
    /// A resent grant creates a new key (a new name) instead of finding
    /// the one its lost reply created (`send_grant`: "a grant whose reply
    /// was lost finds the key it created: one key per acquisition, so
    /// retrying is safe"). The first key is then nobody's, and the client
    /// waits behind it, keeping it alive: caught by the bounded liveness.
    pub new_key_on_resend: bool,
    /// The fence is the holder session's lease id instead of the key's
    /// create revision (lease ids are unique but in no grant order, and a
    /// session serves many locks). Caught by C6.
    pub fence_from_lease: bool,
    /// The fenced key accepts `fence >= stored`, ignoring the holder. A
    /// revoke seals at the deposed holder's own fence when a waiter queued
    /// just behind it (design §2.10: "the seal must take an equal fence"),
    /// so the deposed holder's writes get through: caught by the revoke
    /// rule.
    pub ge_check: bool,
    /// Read-modify-write without registering the fence before the read.
    /// Caught by C3.
    pub write_only: bool,
    /// The revoke deposes without sealing. Caught by the revoke rule.
    pub revoke_without_seal: bool,
    /// The renewal puts the key again on its lease (a put re-creates a
    /// deleted key) instead of keeping the lease alive and reading the key
    /// (design §2.2: a renewal never re-creates the lock). Caught by C7.
    pub recreating_renewal: bool,
    /// `LeaseGone` clears the attempt's key as if nothing had been created
    /// (`own.clear()`, the recipe before its fix): a key an earlier send
    /// whose reply was lost created on the holder's session stays, first
    /// and nobody's. Caught by the bounded liveness.
    pub keep_key_on_lease_gone: bool,
    /// A waiter on the holder's session trusts a serializable look that
    /// shows its key (the recipe before its fix): a member that has not
    /// applied a revoke of its key tells it that it holds. Caught by "no
    /// grant of a revoked key".
    pub serializable_holder_look: bool,
    /// The revocation fence is the deleting write's revision even when a
    /// key is left (`EtcdEngine::revoke`: "a key created now would queue
    /// behind the waiters, and its fence would lie above theirs, so sealing
    /// at it would refuse the waiters too"). Caught by C6: the next
    /// holder's fence is below the revocation fence.
    pub revoke_above_waiters: bool,
}

/// What is checked: the clients, their bounds, the faults and the broken
/// rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EtcdLockModel {
    /// How many clients.
    pub clients: u8,
    /// Lock cycles per client.
    pub cycles: u8,
    /// The lock's ttl and its session's lease, in ticks.
    pub ttl: u32,
    /// The drift margin a client takes off every local deadline, in ticks.
    pub drift: u32,
    /// The waiter session's lease in ticks (`WAITER_LEASE`), used when it
    /// is shorter than the ttl; `None`: waiters queue on the holder's
    /// session (a ttl of at most `WAITER_LEASE`).
    pub waiter_lease: Option<u32>,
    /// The last tick.
    pub max_ticks: u32,
    /// Register and write compare the writer's lock key (`update_held`,
    /// `write_held`).
    pub held_writes: bool,
    /// Faults that may happen.
    pub faults: Faults,
    /// Broken rules (negative controls).
    pub broken: Broken,
    /// Relabel the revisions in every state (see [`relabel_revisions`]):
    /// the same behaviours in far fewer states. Off, the states keep
    /// etcd's own revision numbers (to print a trace found with it on).
    pub relabel: bool,
}

impl Default for EtcdLockModel {
    fn default() -> Self {
        EtcdLockModel {
            clients: 2,
            cycles: 1,
            ttl: 2,
            drift: 0,
            waiter_lease: None,
            max_ticks: 5,
            held_writes: false,
            faults: Faults::default(),
            broken: Broken::default(),
            relabel: true,
        }
    }
}

/// A session as its client knows it (`Session`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Session {
    /// Its lease.
    pub lease: LeaseId,
    /// Its local deadline: before it, etcd cannot have expired the lease.
    pub valid_until: u32,
}

/// A holder's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Register the fence at the fenced key (before reading).
    Register,
    /// Read the fenced key.
    Read,
    /// Write the value read plus one.
    Write(u8),
    /// Release the lock.
    Release,
}

/// Where a client is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before an attempt: its sessions are prepared next.
    Idle,
    /// The grant transaction is to be sent (`first_sent`: when it was
    /// first sent, if its reply was lost).
    Sending {
        /// The first send's tick, once sent.
        first_sent: Option<u32>,
    },
    /// Queued at `revision`, watching the key just before (name, create
    /// revision) until it is deleted, or about to look.
    Waiting {
        /// Our key's create revision.
        revision: u32,
        /// The key watched.
        watching: Option<(KeyName, u32)>,
        /// Our key is on the waiter session.
        on_waiter: bool,
    },
    /// First, the key to be moved to the holder's session.
    Attaching {
        /// Our key's create revision.
        revision: u32,
        /// Where the lock's local deadline counts from.
        sent: u32,
        /// It waited in the queue before.
        waited: bool,
    },
    /// Holding the lock with key create revision `revision` and `fence`,
    /// valid until `deadline` by its own clock.
    Holding {
        /// Its key's create revision.
        revision: u32,
        /// Its fence.
        fence: u32,
        /// Its local deadline.
        deadline: u32,
        /// What it does next.
        step: Step,
        /// It waited in the queue before it was told.
        waited: bool,
    },
    /// Every cycle done.
    Done,
}

/// One client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its phase.
    pub phase: Phase,
    /// Cycles done.
    pub cycles: u8,
    /// Its current acquisition's number (its key's name).
    pub acq: u8,
    /// Its holder session, while it may be alive.
    pub session: Option<Session>,
    /// Its waiter session, while it may be alive.
    pub waiter: Option<Session>,
}

impl Client {
    /// Its current acquisition's key name.
    pub fn key(&self, i: u8) -> KeyName {
        KeyName {
            client: i,
            acq: self.acq,
        }
    }
}

/// The whole system at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The tick.
    pub now: u32,
    /// The cluster.
    pub etcd: Etcd,
    /// The lock's keys as a member one write behind has them, while a
    /// stale look may still happen.
    pub behind: Option<Vec<Key>>,
    /// The clients.
    pub clients: Vec<Client>,
    /// Faults used so far.
    pub used: Faults,
    /// The last write the fenced key accepted: (fence, holder).
    pub last_accepted: Option<(u32, KeyName)>,
    /// A write was accepted with a fence below an accepted one (C1).
    pub fence_below_accepted: bool,
    /// Two different holders were accepted with one fence (C2).
    pub shared_fence: bool,
    /// Increments acknowledged to their writers.
    pub acked: u8,
    /// The fence of the last holder in the store's order (the first key's
    /// as it changed), or of the last revoke.
    pub last_fence: Option<u32>,
    /// A holder in the store's order had a fence not above the one before
    /// (or a revoke's fence fell below the deposed holder's) (C6).
    pub fence_went_back: bool,
    /// A renewal re-created a key that had gone (C7).
    pub zombie: bool,
    /// Two clients valid holders at once (C4).
    pub overlap: bool,
    /// Since when the first key has been no live acquisition's.
    pub stuck_since: Option<u32>,
    /// The revocation fence, once the revoke returned.
    pub revocation: Option<u32>,
    /// The key the revoke deleted (name, create revision).
    pub deposed: Option<(KeyName, u32)>,
    /// A write was accepted after the revoke with a fence at or below the
    /// revocation fence.
    pub deposed_write: bool,
    /// A client was told it holds a key the revoke had deleted.
    pub told_revoked: bool,
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes by one tick; leases whose tick came expire.
    Tick,
    /// Client `i` starts an attempt: a new acquisition, its sessions made
    /// fresh (kept, kept alive, or granted).
    Prepare(u8),
    /// Client `i` sends its grant transaction (again, after a lost reply).
    Grant(u8),
    /// Client `i`'s grant transaction runs, and its reply is lost.
    GrantReplyLost(u8),
    /// Client `i`, waiting, looks where its key stands (the watched key is
    /// gone, or none is watched).
    Look(u8),
    /// As [`Action::Look`], a serializable read served by a member one
    /// write behind.
    StaleLook(u8),
    /// Client `i`, waiting, keeps its sessions alive.
    KeepAlive(u8),
    /// Client `i`, first, moves its key to the holder's session.
    Attach(u8),
    /// Client `i` does its next step of work (register, read, write,
    /// release).
    Work(u8),
    /// Client `i`'s keeper renews its lock.
    Renew(u8),
    /// A supervisor revokes the lock and seals the fenced key.
    Revoke,
}

/// A session made fresh for a lock of `length` (`fresh`): kept if it may be
/// alive and has most of `length` left, kept alive first if it may be
/// alive, else a new lease.
fn fresh(
    etcd: &mut Etcd,
    current: Option<Session>,
    other: Option<Session>,
    client: u8,
    length: u32,
    drift: u32,
    now: u32,
) -> Session {
    if let Some(s) = current
        && now < s.valid_until
    {
        let wanted = length.saturating_sub(drift).saturating_sub(length / 3);
        if s.valid_until - now >= wanted {
            return s;
        }
        if etcd.keep_alive(s.lease, now + length) {
            return Session {
                lease: s.lease,
                valid_until: s.valid_until.max(now + length.saturating_sub(drift)),
            };
        }
    }
    let taken = |id: LeaseId| {
        etcd.lease_alive(id) || [current, other].iter().flatten().any(|s| s.lease == id)
    };
    let id = (0..=u8::MAX)
        .map(|n| LeaseId { client, n })
        .find(|&id| !taken(id))
        .unwrap_or(LeaseId { client, n: u8::MAX });
    etcd.grant_lease(id, now + length);
    Session {
        lease: id,
        valid_until: now + length.saturating_sub(drift),
    }
}

/// One keep-alive of a session (`Session::keep_alive`): `None` when its
/// local deadline passed or etcd says it is gone (never used again).
fn keep_session(
    etcd: &mut Etcd,
    session: Option<Session>,
    length: u32,
    drift: u32,
    now: u32,
) -> Option<Session> {
    let s = session?;
    if now >= s.valid_until || !etcd.keep_alive(s.lease, now + length) {
        return None;
    }
    Some(Session {
        lease: s.lease,
        valid_until: s.valid_until.max(now + length.saturating_sub(drift)),
    })
}

impl EtcdLockModel {
    /// The waiter session's length, when waiters use one.
    fn short_waiter(&self) -> Option<u32> {
        self.waiter_lease.filter(|&w| w < self.ttl)
    }

    /// The fence a key stands for (its create revision; the lease id with
    /// [`Broken::fence_from_lease`]).
    fn fence_of(&self, key: &Key) -> u32 {
        if self.broken.fence_from_lease {
            key.lease.number()
        } else {
            key.create
        }
    }

    /// Whether client `i` is a valid holder now: holding before its local
    /// deadline, its key not revoked.
    fn valid(state: &State, i: usize) -> bool {
        let name = state.clients[i].key(i as u8);
        matches!(state.clients[i].phase, Phase::Holding { revision, deadline, .. }
            if state.now < deadline && state.deposed != Some((name, revision)))
    }

    /// Whether a key is its acquisition's, still in use (sending, waiting,
    /// moving or holding).
    fn in_use(state: &State, key: &Key) -> bool {
        state
            .clients
            .get(usize::from(key.name.client))
            .is_some_and(|c| {
                c.acq == key.name.acq
                    && matches!(
                        c.phase,
                        Phase::Sending { .. }
                            | Phase::Waiting { .. }
                            | Phase::Attaching { .. }
                            | Phase::Holding { .. }
                    )
            })
    }

    /// A new acquisition number for client `i`: the smallest that nothing
    /// in the state refers to (no key, stale view, fenced key, watch or
    /// revoke), which is as good as a new one.
    fn free_acq(state: &State, i: u8) -> u8 {
        let used = |name: KeyName| {
            state.etcd.keys.iter().any(|k| k.name == name)
                || state
                    .behind
                    .as_ref()
                    .is_some_and(|keys| keys.iter().any(|k| k.name == name))
                || state.etcd.resource.holder == Some(name)
                || state.last_accepted.is_some_and(|(_, h)| h == name)
                || state.deposed.is_some_and(|(d, _)| d == name)
                || state.clients.iter().any(|c| {
                    matches!(c.phase, Phase::Waiting { watching: Some((w, _)), .. } if w == name)
                })
        };
        (1..u8::MAX)
            .find(|&acq| !used(KeyName { client: i, acq }))
            .unwrap_or(u8::MAX)
    }

    /// The attempt ends without the lock: its key is deleted (`OwnKey`),
    /// and a new attempt follows.
    fn give_up(next: &mut State, i: usize) {
        let name = next.clients[i].key(i as u8);
        next.etcd.delete_key(name);
        next.clients[i].phase = Phase::Idle;
    }

    fn end_cycle(&self, next: &mut State, i: usize) {
        let c = &mut next.clients[i];
        c.cycles += 1;
        if c.cycles >= self.cycles {
            // A client that is done never acts again: what it knows of its
            // sessions and acquisitions can no longer matter.
            *c = Client {
                phase: Phase::Done,
                cycles: c.cycles,
                acq: 0,
                session: None,
                waiter: None,
            };
        } else {
            c.phase = Phase::Idle;
        }
    }

    /// The client is told it holds the key it created at `revision`; its
    /// local deadline counts from `sent`. Too late: the key is deleted and
    /// a new attempt follows.
    fn tell(&self, next: &mut State, i: usize, revision: u32, sent: u32, waited: bool) {
        let now = next.now;
        let name = next.clients[i].key(i as u8);
        let Some(session) = next.clients[i].session else {
            Self::give_up(next, i);
            return;
        };
        let deadline = session
            .valid_until
            .min(sent + self.ttl.saturating_sub(self.drift));
        if deadline <= now {
            Self::give_up(next, i);
            return;
        }
        let fence = if self.broken.fence_from_lease {
            session.lease.number()
        } else {
            revision
        };
        if next.deposed == Some((name, revision)) {
            next.told_revoked = true;
        }
        let step = if self.broken.write_only {
            Step::Read
        } else {
            Step::Register
        };
        next.clients[i].phase = Phase::Holding {
            revision,
            fence,
            deadline,
            step,
            waited,
        };
    }

    /// What a grant transaction's reply makes the client do.
    fn on_found(&self, next: &mut State, i: usize, found: Found, on_waiter: bool, sent: u32) {
        let now = next.now;
        match found {
            Found::LeaseGone => {
                // Which lease is gone: a keep-alive of each tells (and marks
                // it). A send whose reply was lost may have created the key:
                // it is deleted by its name (`own.remove_now()`), unless the
                // old rule assumes nothing was created (`own.clear()`).
                let c = next.clients[i];
                next.clients[i].session =
                    keep_session(&mut next.etcd, c.session, self.ttl, self.drift, now);
                if let Some(w) = self.short_waiter() {
                    next.clients[i].waiter =
                        keep_session(&mut next.etcd, c.waiter, w, self.drift, now);
                }
                if self.broken.keep_key_on_lease_gone {
                    next.clients[i].phase = Phase::Idle;
                } else {
                    Self::give_up(next, i);
                }
            }
            Found::First(revision) if on_waiter => {
                next.clients[i].phase = Phase::Attaching {
                    revision,
                    sent,
                    waited: false,
                };
            }
            Found::First(revision) => self.tell(next, i, revision, sent, false),
            Found::Queued {
                revision,
                predecessor,
            } => {
                let watching =
                    predecessor.and_then(|p| next.etcd.key(p).map(|k| (k.name, k.create)));
                // A predecessor already gone: its watch's check finds it
                // gone, and the waiter looks.
                next.clients[i].phase = Phase::Waiting {
                    revision,
                    watching,
                    on_waiter,
                };
            }
        }
    }

    /// Sends the grant transaction (`send_grant`), first or again after a
    /// lost reply (`first_sent`); `lost`: its reply is lost.
    fn send_grant(&self, next: &mut State, i: usize, first_sent: Option<u32>, lost: bool) {
        if first_sent.is_some() && self.broken.new_key_on_resend {
            next.clients[i].acq += 1;
        }
        let sent = first_sent.unwrap_or(next.now);
        let c = next.clients[i];
        let name = c.key(i as u8);
        let (Some(session), waiter) = (c.session, c.waiter) else {
            Self::give_up(next, i);
            return;
        };
        let (found, on_waiter) = match (self.short_waiter(), waiter) {
            (Some(_), Some(w)) => {
                next.etcd
                    .try_or_queue_txn(name, session.lease, w.lease, self.broken.no_wait)
            }
            _ => (
                next.etcd
                    .queue_txn(name, session.lease, self.broken.no_wait),
                false,
            ),
        };
        if lost {
            next.used.lost_reply = true;
            next.clients[i].phase = Phase::Sending {
                first_sent: Some(sent),
            };
        } else {
            self.on_found(next, i, found, on_waiter, sent);
        }
    }

    /// The look's outcome.
    fn on_look(&self, next: &mut State, i: usize, seen: Look) {
        let Phase::Waiting {
            revision,
            on_waiter,
            ..
        } = next.clients[i].phase
        else {
            return;
        };
        match seen {
            Look::Gone => Self::give_up(next, i),
            Look::First => {
                if on_waiter {
                    next.clients[i].phase = Phase::Attaching {
                        revision,
                        sent: next.now,
                        waited: true,
                    };
                } else {
                    self.tell(next, i, revision, next.now, true);
                }
            }
            Look::Behind(name, create) => {
                next.clients[i].phase = Phase::Waiting {
                    revision,
                    watching: Some((name, create)),
                    on_waiter,
                };
            }
        }
    }

    /// Records a write the fenced key accepted (a seal is nobody's: it may
    /// take an equal fence, which is its purpose).
    fn accepted(next: &mut State, fence: u32, holder: KeyName) {
        if let Some((last, last_holder)) = next.last_accepted {
            if fence < last {
                next.fence_below_accepted = true;
            }
            if fence == last && holder != last_holder && holder != REVOKED && last_holder != REVOKED
            {
                next.shared_fence = true;
            }
        }
        next.last_accepted = Some((fence, holder));
        if holder != REVOKED && next.revocation.is_some_and(|r| fence <= r) {
            next.deposed_write = true;
        }
    }

    /// What every transition checks afterwards: overlaps (C4), the store's
    /// holder order (C6), and how long the first key has been unused.
    fn settle(&self, next: &mut State, first_before: Option<Key>) {
        let valid = (0..next.clients.len())
            .filter(|&i| Self::valid(next, i))
            .count();
        if valid > 1 {
            next.overlap = true;
        }
        let first = next.etcd.first();
        let changed = first.map(|k| (k.name, k.create)) != first_before.map(|k| (k.name, k.create));
        if changed && let Some(k) = first {
            let f = self.fence_of(&k);
            if next.last_fence.is_some_and(|last| f <= last) {
                next.fence_went_back = true;
            }
            next.last_fence = Some(f);
        }
        let unused = first.is_some_and(|k| !Self::in_use(next, &k));
        next.stuck_since = match (unused, next.stuck_since) {
            (false, _) => None,
            (true, None) => Some(next.now),
            (true, since) => since,
        };
    }
}

impl std::fmt::Display for KeyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == REVOKED {
            return write!(f, "revoked");
        }
        write!(f, "c{}/{}", self.client, self.acq)
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L{}.{}", self.client, self.n)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Phase::Idle => write!(f, "idle"),
            Phase::Sending { first_sent: None } => write!(f, "sending"),
            Phase::Sending {
                first_sent: Some(t),
            } => write!(f, "resending (first sent at {t})"),
            Phase::Waiting {
                revision,
                watching,
                on_waiter,
            } => {
                write!(f, "waiting at {revision}")?;
                if on_waiter {
                    write!(f, " on the waiter session")?;
                }
                match watching {
                    Some((name, create)) => write!(f, ", watching {name}@{create}"),
                    None => write!(f, ", looking"),
                }
            }
            Phase::Attaching { revision, .. } => write!(f, "first at {revision}, moving its key"),
            Phase::Holding {
                revision,
                fence,
                deadline,
                step,
                ..
            } => write!(
                f,
                "holding {revision} (fence {fence}, valid until {deadline}, next {step:?})"
            ),
            Phase::Done => write!(f, "done"),
        }
    }
}

/// One line: the tick, the store's revision, the keys (name@create on
/// lease), the leases (id until tick), the fenced key, and each client
/// (acquisition, phase, sessions).
impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "t{} rev {} keys [", self.now, self.etcd.revision)?;
        for (at, k) in self.etcd.keys.iter().enumerate() {
            let sep = if at == 0 { "" } else { " " };
            write!(f, "{sep}{}@{} on {}", k.name, k.create, k.lease)?;
        }
        write!(f, "] leases [")?;
        for (at, l) in self.etcd.leases.iter().enumerate() {
            let sep = if at == 0 { "" } else { " " };
            write!(f, "{sep}{} until {}", l.id, l.expires)?;
        }
        let r = self.etcd.resource;
        write!(f, "] fenced key ")?;
        match (r.fence, r.holder) {
            (Some(fence), Some(holder)) => write!(f, "{} by {holder} at {fence}", r.value)?,
            _ => write!(f, "absent")?,
        }
        for (i, c) in self.clients.iter().enumerate() {
            write!(f, " | c{i}/{} {}", c.acq, c.phase)?;
            if let Some(s) = c.session {
                write!(f, ", session {} until {}", s.lease, s.valid_until)?;
            }
            if let Some(s) = c.waiter {
                write!(f, ", waiter {} until {}", s.lease, s.valid_until)?;
            }
        }
        if let Some(fence) = self.revocation {
            write!(f, " | revoked at {fence}")?;
        }
        Ok(())
    }
}

/// Calls `f` on every revision in `state`: the store's, the keys' create
/// revisions (also in the stale view), the fences (a holder's, the fenced
/// key's, the last accepted, the last holder's, the revocation fence) and
/// the revisions clients and the revoke remember.
fn each_revision(state: &mut State, f: &mut impl FnMut(&mut u32)) {
    f(&mut state.etcd.revision);
    for k in &mut state.etcd.keys {
        f(&mut k.create);
    }
    for k in state.behind.iter_mut().flatten() {
        f(&mut k.create);
    }
    if let Some(fence) = &mut state.etcd.resource.fence {
        f(fence);
    }
    for c in &mut state.clients {
        match &mut c.phase {
            Phase::Waiting {
                revision, watching, ..
            } => {
                f(revision);
                if let Some((_, create)) = watching {
                    f(create);
                }
            }
            Phase::Attaching { revision, .. } => f(revision),
            Phase::Holding {
                revision, fence, ..
            } => {
                f(revision);
                f(fence);
            }
            Phase::Idle | Phase::Sending { .. } | Phase::Done => {}
        }
    }
    if let Some((fence, _)) = &mut state.last_accepted {
        f(fence);
    }
    for r in [&mut state.last_fence, &mut state.revocation]
        .into_iter()
        .flatten()
    {
        f(r);
    }
    if let Some((_, create)) = &mut state.deposed {
        f(create);
    }
}

/// Relabels the revisions in `state`, a canonical form applied after every
/// step when [`EtcdLockModel::relabel`] is on: their order is kept, and
/// which of them are one apart; every larger gap becomes two, and the
/// smallest revision becomes one. No transition tells the two states
/// apart: transitions compare revisions, add one to the store's (a write),
/// and once take one from a create revision (the revoke's fence, in the
/// gap just below that key, which a gap of two still has room for); the
/// absolute numbers are never used.
pub fn relabel_revisions(state: &mut State) {
    let mut seen = Vec::new();
    each_revision(state, &mut |r| seen.push(*r));
    seen.sort_unstable();
    seen.dedup();
    let mut mapped = Vec::with_capacity(seen.len());
    let mut label = 1;
    for (at, &r) in seen.iter().enumerate() {
        if at > 0 {
            label += (r - seen[at - 1]).min(2);
        }
        mapped.push(label);
    }
    each_revision(state, &mut |r| {
        if let Ok(at) = seen.binary_search(r) {
            *r = mapped[at];
        }
    });
}

impl Model for EtcdLockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let etcd = Etcd::new();
        vec![State {
            now: 0,
            behind: self.faults.stale_look.then(|| etcd.keys.clone()),
            etcd,
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    cycles: 0,
                    acq: 0,
                    session: None,
                    waiter: None,
                };
                usize::from(self.clients)
            ],
            used: Faults::default(),
            last_accepted: None,
            fence_below_accepted: false,
            shared_fence: false,
            acked: 0,
            last_fence: None,
            fence_went_back: false,
            zombie: false,
            overlap: false,
            stuck_since: None,
            revocation: None,
            deposed: None,
            deposed_write: false,
            told_revoked: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.max_ticks {
            actions.push(Action::Tick);
        }
        for (i, c) in state.clients.iter().enumerate() {
            let i = i as u8;
            match c.phase {
                Phase::Idle => actions.push(Action::Prepare(i)),
                Phase::Sending { .. } => {
                    actions.push(Action::Grant(i));
                    if self.faults.lost_reply && !state.used.lost_reply {
                        actions.push(Action::GrantReplyLost(i));
                    }
                }
                Phase::Waiting {
                    watching,
                    on_waiter,
                    ..
                } => {
                    let watch_ended =
                        watching.is_none_or(|(name, create)| !state.etcd.has(name, create));
                    if watch_ended {
                        actions.push(Action::Look(i));
                        // Only a serializable look can be stale: on the
                        // waiter session (`attach` compares the key next),
                        // or on the holder's with the old rule.
                        let serializable = on_waiter || self.broken.serializable_holder_look;
                        if serializable
                            && state
                                .behind
                                .as_ref()
                                .is_some_and(|keys| *keys != state.etcd.keys)
                        {
                            actions.push(Action::StaleLook(i));
                        }
                    }
                    actions.push(Action::KeepAlive(i));
                }
                Phase::Attaching { .. } => actions.push(Action::Attach(i)),
                Phase::Holding { step, .. } => {
                    actions.push(Action::Work(i));
                    if step != Step::Release {
                        actions.push(Action::Renew(i));
                    }
                }
                Phase::Done => {}
            }
        }
        if self.faults.revoke && !state.used.revoke {
            actions.push(Action::Revoke);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        let now = state.now;
        let (ttl, drift) = (self.ttl, self.drift);
        match action {
            Action::Tick => {
                next.now += 1;
                next.etcd.expire(next.now);
            }
            Action::Prepare(i) => {
                let i = usize::from(i);
                let mut c = next.clients[i];
                c.acq = Self::free_acq(&next, i as u8);
                c.session = Some(fresh(
                    &mut next.etcd,
                    c.session,
                    c.waiter,
                    i as u8,
                    ttl,
                    drift,
                    now,
                ));
                if let Some(w) = self.short_waiter() {
                    c.waiter = Some(fresh(
                        &mut next.etcd,
                        c.waiter,
                        c.session,
                        i as u8,
                        w,
                        drift,
                        now,
                    ));
                }
                c.phase = Phase::Sending { first_sent: None };
                next.clients[i] = c;
            }
            Action::Grant(i) | Action::GrantReplyLost(i) => {
                let i = usize::from(i);
                let Phase::Sending { first_sent } = next.clients[i].phase else {
                    return None;
                };
                // A resend goes while the holder session's local deadline
                // has not passed; else the attempt fails.
                let too_late = first_sent.is_some()
                    && next.clients[i].session.is_none_or(|s| now >= s.valid_until);
                if too_late {
                    Self::give_up(&mut next, i);
                } else {
                    let lost = action == Action::GrantReplyLost(i as u8);
                    self.send_grant(&mut next, i, first_sent, lost);
                }
            }
            Action::Look(i) | Action::StaleLook(i) => {
                let i = usize::from(i);
                let Phase::Waiting { revision, .. } = next.clients[i].phase else {
                    return None;
                };
                let name = next.clients[i].key(i as u8);
                let mut seen = look(&next.etcd.keys, name, revision);
                if action == Action::StaleLook(i as u8) {
                    next.used.stale_look = true;
                    let stale = next
                        .behind
                        .as_ref()
                        .map_or(Look::Gone, |keys| look(keys, name, revision));
                    // A serializable read that shows our key is trusted;
                    // one that does not is read again, linearizably.
                    if stale != Look::Gone {
                        seen = stale;
                    }
                }
                self.on_look(&mut next, i, seen);
            }
            Action::KeepAlive(i) => {
                let i = usize::from(i);
                let Phase::Waiting { on_waiter, .. } = next.clients[i].phase else {
                    return None;
                };
                let c = next.clients[i];
                let holder = keep_session(&mut next.etcd, c.session, ttl, drift, now);
                let mut alive = holder.is_some();
                next.clients[i].session = holder;
                if on_waiter && let Some(w) = self.short_waiter() {
                    let waiter = keep_session(&mut next.etcd, c.waiter, w, drift, now);
                    alive &= waiter.is_some();
                    next.clients[i].waiter = waiter;
                }
                if !alive {
                    Self::give_up(&mut next, i);
                }
            }
            Action::Attach(i) => {
                let i = usize::from(i);
                let Phase::Attaching {
                    revision,
                    sent,
                    waited,
                } = next.clients[i].phase
                else {
                    return None;
                };
                let c = next.clients[i];
                let name = c.key(i as u8);
                let moved = c
                    .session
                    .is_some_and(|s| next.etcd.attach(name, revision, s.lease));
                if moved {
                    self.tell(&mut next, i, revision, sent, waited);
                } else {
                    Self::give_up(&mut next, i);
                }
            }
            Action::Work(i) => {
                let i = usize::from(i);
                let Phase::Holding {
                    revision,
                    fence,
                    deadline,
                    step,
                    waited,
                } = next.clients[i].phase
                else {
                    return None;
                };
                let name = next.clients[i].key(i as u8);
                let ge = self.broken.ge_check;
                let owner = self.held_writes.then_some((name, revision));
                let holding = |step| Phase::Holding {
                    revision,
                    fence,
                    deadline,
                    step,
                    waited,
                };
                match step {
                    Step::Register => {
                        if next
                            .etcd
                            .fenced_write(fence, name, Change::Register, ge, owner)
                        {
                            Self::accepted(&mut next, fence, name);
                            next.clients[i].phase = holding(Step::Read);
                        } else {
                            next.clients[i].phase = holding(Step::Release);
                        }
                    }
                    Step::Read => {
                        next.clients[i].phase = holding(Step::Write(next.etcd.resource.value));
                    }
                    Step::Write(v) => {
                        let change = Change::Write(v.saturating_add(1));
                        if next.etcd.fenced_write(fence, name, change, ge, owner) {
                            Self::accepted(&mut next, fence, name);
                            next.acked += 1;
                        }
                        next.clients[i].phase = holding(Step::Release);
                    }
                    Step::Release => {
                        next.etcd.release(name, revision);
                        self.end_cycle(&mut next, i);
                    }
                }
            }
            Action::Renew(i) => {
                let i = usize::from(i);
                let Phase::Holding {
                    revision,
                    fence,
                    deadline,
                    step,
                    waited,
                } = next.clients[i].phase
                else {
                    return None;
                };
                let c = next.clients[i];
                let name = c.key(i as u8);
                let had_key = state.etcd.key(name).is_some();
                let session_may_live = c.session.is_some_and(|s| now < s.valid_until);
                if now >= deadline || !session_may_live {
                    // Deadline passed: no request; the key is deleted if
                    // the session may live on (`deadline_passed`).
                    if session_may_live {
                        next.etcd.release(name, revision);
                    }
                    self.end_cycle(&mut next, i);
                } else {
                    let session = keep_session(&mut next.etcd, c.session, ttl, drift, now);
                    next.clients[i].session = session;
                    match session {
                        // The lease is gone: every key on it expired.
                        None => self.end_cycle(&mut next, i),
                        Some(s) => {
                            if self.broken.recreating_renewal {
                                next.etcd.put_key(name, s.lease);
                            }
                            let ours = next.etcd.key(name).is_some_and(|k| {
                                k.create == revision || self.broken.recreating_renewal
                            });
                            if ours {
                                if !had_key {
                                    next.zombie = true;
                                }
                                next.clients[i].phase = Phase::Holding {
                                    revision,
                                    fence,
                                    deadline: deadline.max(now + ttl.saturating_sub(drift)),
                                    step,
                                    waited,
                                };
                            } else {
                                // Gone or re-created: taken over.
                                self.end_cycle(&mut next, i);
                            }
                        }
                    }
                }
            }
            Action::Revoke => {
                next.used.revoke = true;
                let (deposed, fence) = next.etcd.depose(self.broken.revoke_above_waiters);
                next.deposed = deposed.map(|k| (k.name, k.create));
                // The revocation fence is at or above every holder's fence
                // so far (equal: the deposed holder's, which the seal takes
                // over), and every later holder's must be above it.
                if next.last_fence.is_some_and(|last| fence < last) {
                    next.fence_went_back = true;
                }
                next.last_fence = Some(fence);
                next.revocation = Some(fence);
                if !self.broken.revoke_without_seal && next.etcd.seal(fence) {
                    Self::accepted(&mut next, fence, REVOKED);
                }
            }
        }
        if next.behind.is_some() {
            if next.used.stale_look {
                next.behind = None;
            } else if next.etcd.revision != state.etcd.revision {
                next.behind = Some(state.etcd.keys.clone());
            }
        }
        self.settle(&mut next, state.etcd.first());
        // A lease with no key that no client holds as a session can no
        // longer be observed (its expiry deletes nothing): forgotten.
        let State { etcd, clients, .. } = &mut next;
        etcd.leases.retain(|l| {
            etcd.keys.iter().any(|k| k.lease == l.id)
                || clients.iter().any(|c| {
                    [c.session, c.waiter]
                        .iter()
                        .flatten()
                        .any(|s| s.lease == l.id)
                })
        });
        // Lease ids are not revisions: with fences from them, revisions
        // are left as they are.
        if self.relabel && !self.broken.fence_from_lease {
            relabel_revisions(&mut next);
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // C1: no write accepted with a fence below an accepted one.
            Property::always("C1 fences accepted in order", |_, s: &State| {
                !s.fence_below_accepted
            }),
            // C2: no two different holders accepted with the same fence.
            Property::always("C2 one holder per fence", |_, s: &State| !s.shared_fence),
            // C3: no acknowledged increment lost.
            Property::always("C3 no acknowledged write lost", |_, s: &State| {
                s.etcd.resource.value == s.acked
            }),
            // C4: mutual exclusion among valid holders (nothing excused).
            Property::always("C4 mutual exclusion", |_, s: &State| !s.overlap),
            // C6: fences strictly increase in the store's holder order.
            Property::always("C6 fences increase", |_, s: &State| !s.fence_went_back),
            // C7: no renewal re-creates a key that had gone.
            Property::always("C7 no zombie renewal", |_, s: &State| !s.zombie),
            // Revoke: once it returned, no write with a fence at or below
            // its revocation fence is accepted.
            Property::always("revoked holders are refused", |_, s: &State| {
                !s.deposed_write
            }),
            // No client is told it holds a key the revoke deleted.
            Property::always("no grant of a revoked key", |_, s: &State| !s.told_revoked),
            // Bounded liveness: the first key is an acquisition's in use,
            // but for at most the drift margin (a key left on a session
            // whose local deadline passed goes with its lease that long
            // after).
            Property::always(
                "the lock passes within the drift margin",
                |m: &EtcdLockModel, s: &State| {
                    s.stuck_since.is_none_or(|since| s.now - since <= m.drift)
                },
            ),
            Property::sometimes("every cycle done", |_, s: &State| {
                s.clients.iter().all(|c| c.phase == Phase::Done) && s.acked > 0
            }),
            Property::sometimes("every fault happened", |m: &EtcdLockModel, s: &State| {
                s.used == m.faults
            }),
            // A client paused past its lease: its lease expired, and its
            // key with it, between two of its calls while it holds.
            Property::sometimes("a holder outlived its lease", |_, s: &State| {
                s.clients.iter().any(|c| {
                    matches!(c.phase, Phase::Holding { .. })
                        && c.session.is_some_and(|x| !s.etcd.lease_alive(x.lease))
                })
            }),
            // The wait's path: a waiter told it holds after its look found
            // no key before its own (and, on a waiter session, after its
            // key moved to the holder's session).
            Property::sometimes("a waiter got the lock after waiting", |_, s: &State| {
                s.clients
                    .iter()
                    .any(|c| matches!(c.phase, Phase::Holding { waited: true, .. }))
            }),
        ]
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.now <= self.max_ticks
    }
}
