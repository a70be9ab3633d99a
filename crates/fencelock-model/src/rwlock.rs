//! The fenced read-write lock on Redis (docs/design.md §2.12): its hash as
//! the scripts see it, each script one atomic transition of [`RwStore`]
//! (`rw_grant.lua`; `sem_release.lua` and `sem_extend.lua`, which release
//! and renew its holders as permits of the hash), and [`RwModel`]: clients
//! that take either side, a resource with fenced writes and validated reads,
//! and the lock's promises as properties over every reachable state.
//!
//! The hash: the writer in field `w` as `TOKEN:FENCE:DEADLINE`, each
//! reader in `rN` (the lowest free number) as `TOKEN:EPOCH:DEADLINE`, the
//! mark `rw`; a holder past its deadline counts as free in every script and
//! is deleted by the next grant or release that meets it. Readers share
//! the name, a writer holds it alone. A writer mints its fence from the
//! name's one clock-floored counter (`max(last + 1, clock)`); a reader's
//! epoch is the last fence issued (minted when there is none), so every
//! writer granted after it has a greater fence and a **validated read**
//! (read, then compare the resource's stored fence with the epoch: `Clean`
//! iff absent or `<=`) is `Torn` once such a writer has written.
//!
//! Fair mode (§3.7) is modelled too: the wait queue in arrival order with
//! each waiter's lease, a writer waiting for every live waiter ahead of it,
//! a reader for a live writer ahead of it, dead waiters dropped where the
//! scripts drop them, and the queue keys' own expiry.
//!
//! Written from the scripts branch for branch; `tests/rwlock_differential.rs`
//! holds the real scripts to [`RwStore`]. Not modelled: the other kinds of
//! a name (a mutex's string, a semaphore's permit count: `KindConflict`,
//! nothing changed), revoke, wake-up messages (clients retry at any time,
//! which covers a wake-up at any time and a lost one).

use std::fmt;

use stateright::{Model, Property};

use crate::store::{CLOCK_PER_TICK, Change, Held, Resource, Token, WaitMode};

/// A holder's field of the hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RwField {
    /// `w`: the writer.
    Writer,
    /// `rN`: a reader.
    Reader(u8),
}

impl RwField {
    /// Reads `w` or `rN`.
    pub fn parse(field: &str) -> Option<Self> {
        if field == "w" {
            return Some(RwField::Writer);
        }
        field.strip_prefix('r')?.parse().ok().map(RwField::Reader)
    }

    /// Whether it is the writer's.
    pub fn is_writer(self) -> bool {
        self == RwField::Writer
    }
}

impl fmt::Display for RwField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RwField::Writer => f.write_str("w"),
            RwField::Reader(n) => write!(f, "r{n}"),
        }
    }
}

/// A queued waiter: its member (token and side) and its waiter lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RwWaiter {
    /// Its token.
    pub token: Token,
    /// It waits to write (its member says `w`).
    pub writer: bool,
    /// The tick its waiter lease ends (live while after `now`).
    pub lease_end: u32,
}

/// Deliberately broken rules (negative controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RwBroken {
    /// The grant lets a reader in while a writer holds.
    pub reader_under_writer: bool,
    /// A writer does not mint: it takes the last fence issued again (a new
    /// one only when there is none).
    pub writer_reuses_fence: bool,
    /// A reader's grant does not mint when the fence key is missing: its
    /// epoch is 0.
    pub epoch_without_mint: bool,
    /// In fair mode a reader goes in past the writers queued ahead of it.
    pub reader_skips_queue: bool,
    /// A validated read skips the check: always `Clean`.
    pub unvalidated_read: bool,
}

/// One grant call (`PermitGrant`'s arguments, `PermitKind::Side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwCall {
    /// The caller's token.
    pub token: Token,
    /// A writer (`w`) or a reader (`r`).
    pub writer: bool,
    /// The wait mode.
    pub wait: WaitMode,
    /// The caller has a queue member (it may queue).
    pub member: bool,
    /// An earlier attempt may have queued it (its place goes when granted).
    pub queued: bool,
    /// The lease, in ticks.
    pub ttl: u32,
    /// The waiter lease, in ticks.
    pub waiter_lease: u32,
}

/// What a grant replied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwReply {
    /// `{1, fence, field}`: a writer's fence or a reader's epoch.
    Granted {
        /// The field.
        field: RwField,
        /// The fence (epoch).
        fence: u64,
        /// A retry by the token that holds that side: its field and fence
        /// back, its lease restarted.
        retry: bool,
    },
    /// `{0, soonest, last}`: a holder the caller cannot share with.
    Held {
        /// Ticks until the soonest such holder lapses.
        soonest: u32,
        /// The fence stored.
        last: Option<u64>,
    },
    /// `{2, 0, last}`: a live waiter ahead in the fair queue conflicts.
    Reserved {
        /// The fence stored.
        last: Option<u64>,
    },
}

/// The keys of one read-write lock: its hash (with the key's own expiry),
/// the fence key, the wait queue with the waiter leases (and their keys'
/// expiry). Keys expire when `now` is past their expiry, as Redis's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RwStore {
    /// The hash exists until this tick (`None`: no hash).
    pub hash_expires_at: Option<u32>,
    /// `w`.
    pub writer: Option<Held>,
    /// `r0`, `r1`, … (no trailing `None`).
    pub readers: Vec<Option<Held>>,
    /// `LOCK:fence`: the last fence issued.
    pub fence_key: Option<u64>,
    /// `LOCK:queue` with `LOCK:waiters`, in arrival order.
    pub queue: Vec<RwWaiter>,
    /// The queue keys exist until this tick (`None` while the queue is
    /// empty: Redis deletes an empty sorted set).
    pub queue_expires_at: Option<u32>,
    /// The broken rules in force.
    pub broken: RwBroken,
}

/// How many live waiters `sem_release.lua` looks for at most.
const WAKE_HEADS: usize = 16;
/// How many dead waiters one `live_heads` call drops at most.
const MAX_DROPPED: usize = 64;

impl RwStore {
    /// No keys.
    pub fn new(broken: RwBroken) -> Self {
        RwStore {
            hash_expires_at: None,
            writer: None,
            readers: Vec::new(),
            fence_key: None,
            queue: Vec::new(),
            queue_expires_at: None,
            broken,
        }
    }

    /// Drops the keys that have expired at `now`.
    pub fn expire(&mut self, now: u32) {
        if self.hash_expires_at.is_some_and(|e| now > e) {
            self.hash_expires_at = None;
            self.writer = None;
            self.readers.clear();
        }
        if self.queue_expires_at.is_some_and(|e| now > e) {
            self.queue.clear();
            self.queue_expires_at = None;
        }
    }

    /// Whether the hash exists at `now`.
    pub fn hash_exists(&self, now: u32) -> bool {
        self.hash_expires_at.is_some_and(|e| now <= e)
    }

    /// The holder in `field`, lapsed or not.
    pub fn get(&self, field: RwField) -> Option<Held> {
        match field {
            RwField::Writer => self.writer,
            RwField::Reader(n) => self.readers.get(usize::from(n)).copied().flatten(),
        }
    }

    /// The holder in `field`, lapsed or not, to change.
    pub fn get_mut(&mut self, field: RwField) -> Option<&mut Held> {
        match field {
            RwField::Writer => self.writer.as_mut(),
            RwField::Reader(n) => self
                .readers
                .get_mut(usize::from(n))
                .and_then(|h| h.as_mut()),
        }
    }

    fn set(&mut self, field: RwField, held: Option<Held>) {
        match field {
            RwField::Writer => self.writer = held,
            RwField::Reader(n) => {
                let n = usize::from(n);
                if held.is_some() && self.readers.len() <= n {
                    self.readers.resize(n + 1, None);
                }
                if let Some(slot) = self.readers.get_mut(n) {
                    *slot = held;
                }
                while self.readers.last() == Some(&None) {
                    self.readers.pop();
                }
            }
        }
    }

    /// Every field present (lapsed or not): the writer first, then the
    /// readers in order.
    pub fn fields(&self) -> Vec<(RwField, Held)> {
        let mut out: Vec<(RwField, Held)> = self
            .writer
            .map(|h| (RwField::Writer, h))
            .into_iter()
            .collect();
        for (n, h) in self.readers.iter().enumerate() {
            if let Some(h) = h {
                out.push((RwField::Reader(n as u8), *h));
            }
        }
        out
    }

    /// The holder in `field` if it has not lapsed at `now`.
    pub fn live(&self, field: RwField, now: u32) -> Option<Held> {
        self.get(field).filter(|h| h.expires_at > now)
    }

    /// The holders that have not lapsed at `now`.
    pub fn live_holders(&self, now: u32) -> Vec<(RwField, Held)> {
        let mut live = self.fields();
        live.retain(|(_, h)| h.expires_at > now);
        live
    }

    /// `mint` (common.lua): `max(last + 1, clock)` (a counter's `INCR` is
    /// the same with `clock` 0), stored.
    fn mint(&mut self, clock: u64) -> u64 {
        let fence = (self.fence_key.unwrap_or(0) + 1).max(clock);
        self.fence_key = Some(fence);
        fence
    }

    fn position(&self, token: Token, writer: bool) -> Option<usize> {
        self.queue
            .iter()
            .position(|w| w.token == token && w.writer == writer)
    }

    /// `dequeue`.
    fn dequeue(&mut self, token: Token, writer: bool) {
        if let Some(at) = self.position(token, writer) {
            self.queue.remove(at);
        }
        if self.queue.is_empty() {
            self.queue_expires_at = None;
        }
    }

    /// `enqueue_member`: joins the queue at its end or keeps its place,
    /// with its waiter lease renewed; the queue keys live at least two
    /// waiter leases more.
    fn enqueue(&mut self, call: &RwCall, now: u32) {
        if !call.member {
            return;
        }
        let at = match self.position(call.token, call.writer) {
            Some(at) => at,
            None => {
                self.queue.push(RwWaiter {
                    token: call.token,
                    writer: call.writer,
                    lease_end: 0,
                });
                self.queue.len() - 1
            }
        };
        self.queue[at].lease_end = now + call.waiter_lease;
        let keep = now + 2 * call.waiter_lease;
        self.queue_expires_at = Some(self.queue_expires_at.map_or(keep, |e| e.max(keep)));
    }

    /// `hold`: `field` held by the caller with `fence` until ttl from now;
    /// the hash lives as long as its latest holder; a queued caller leaves
    /// the queue.
    fn hold(&mut self, call: &RwCall, field: RwField, fence: u64, now: u32) {
        let until = now + call.ttl;
        self.set(
            field,
            Some(Held {
                token: call.token,
                fence,
                expires_at: until,
            }),
        );
        self.hash_expires_at = Some(self.hash_expires_at.map_or(until, |e| e.max(until)));
        if call.queued && call.member {
            self.dequeue(call.token, call.writer);
        }
    }

    /// `conflict_ahead`: whether a live waiter ahead of the caller (every
    /// waiter, when it has no place) conflicts with it (any for a writer, a
    /// writer for a reader); dead conflicting waiters met on the way go.
    fn conflict_ahead(&mut self, call: &RwCall, now: u32) -> bool {
        let upto = if call.member {
            self.position(call.token, call.writer)
                .unwrap_or(self.queue.len())
        } else {
            self.queue.len()
        };
        let ahead: Vec<RwWaiter> = self.queue[..upto].to_vec();
        for entry in ahead {
            if call.writer || entry.writer {
                if entry.lease_end > now {
                    return true;
                }
                self.dequeue(entry.token, entry.writer);
            }
        }
        false
    }

    /// `rw_grant.lua` at tick `now`, the server clock `clock` (0 for
    /// counter fences).
    pub fn grant(&mut self, call: &RwCall, now: u32, clock: u64) -> RwReply {
        self.expire(now);
        let last = self.fence_key;
        let (mut writer_live, mut live) = (false, 0usize);
        let mut soonest: Option<u32> = None;
        let mut mine = None;
        let mut lapsed = Vec::new();
        for (field, h) in self.fields() {
            if h.expires_at > now {
                live += 1;
                writer_live |= field.is_writer();
                if call.writer || field.is_writer() {
                    let left = h.expires_at - now;
                    soonest = Some(soonest.map_or(left, |s| s.min(left)));
                }
                if h.token == call.token && field.is_writer() == call.writer {
                    mine = Some((field, h.fence));
                }
            } else {
                lapsed.push(field);
            }
        }
        if let Some((field, fence)) = mine {
            self.hold(call, field, fence, now);
            return RwReply::Granted {
                field,
                fence,
                retry: true,
            };
        }
        // Past every refusal that says nothing was changed: lapsed holders
        // go (the hash, with its mark, stays).
        for field in lapsed {
            self.set(field, None);
        }
        let writer_blocks = writer_live && (call.writer || !self.broken.reader_under_writer);
        if writer_blocks || (call.writer && live > 0) {
            if call.wait != WaitMode::Poll {
                self.enqueue(call, now);
            }
            return RwReply::Held {
                soonest: soonest.unwrap_or(0),
                last,
            };
        }
        if call.wait == WaitMode::Fair
            && (call.writer || !self.broken.reader_skips_queue)
            && self.conflict_ahead(call, now)
        {
            self.enqueue(call, now);
            return RwReply::Reserved { last };
        }
        let (field, fence) = if call.writer {
            let fence = match last {
                Some(last) if self.broken.writer_reuses_fence => last,
                _ => self.mint(clock),
            };
            (RwField::Writer, fence)
        } else {
            let epoch = match last {
                Some(last) => last,
                None if self.broken.epoch_without_mint => 0,
                None => self.mint(clock),
            };
            let n = (0..=u8::MAX)
                .find(|&n| self.get(RwField::Reader(n)).is_none())
                .unwrap_or(u8::MAX);
            (RwField::Reader(n), epoch)
        };
        self.hold(call, field, fence, now);
        RwReply::Granted {
            field,
            fence,
            retry: false,
        }
    }

    /// The rest of `sem_release.lua` once it has changed something, with
    /// the hash there: nobody live holds it, it goes; no writer holds it,
    /// the waiters are woken (the dead ones met on the way dropped).
    fn after_release(&mut self, now: u32) {
        let live = self.live_holders(now);
        if live.is_empty() {
            self.hash_expires_at = None;
            self.writer = None;
            self.readers.clear();
        }
        let writer = live.iter().any(|(f, _)| f.is_writer());
        if !writer && !self.queue.is_empty() {
            // live_heads(16): dead waiters go until 16 live ones are found.
            let (mut heads, mut index, mut dropped) = (0, 0, 0);
            while heads < WAKE_HEADS && dropped < MAX_DROPPED {
                let Some(entry) = self.queue.get(index) else {
                    break;
                };
                if entry.lease_end > now {
                    heads += 1;
                    index += 1;
                } else {
                    self.queue.remove(index);
                    dropped += 1;
                }
            }
            if self.queue.is_empty() {
                self.queue_expires_at = None;
            }
        }
    }

    /// `sem_release.lua` of the holder in `field` granted to `token` with
    /// `fence`: 1 released, 0 when it had lapsed (whoever held it) or is
    /// gone, -1 another holder's live one (untouched).
    pub fn release(&mut self, field: RwField, token: Token, fence: u64, now: u32) -> i8 {
        self.expire(now);
        let Some(h) = self.get(field) else {
            return 0;
        };
        let lapsed = h.expires_at <= now;
        if !lapsed && (h.token != token || h.fence != fence) {
            return -1;
        }
        self.set(field, None);
        self.after_release(now);
        if lapsed { 0 } else { 1 }
    }

    /// `sem_release.lua` of a waiter leaving: 1 if it was queued, 0
    /// otherwise.
    pub fn leave(&mut self, token: Token, writer: bool, now: u32) -> i8 {
        self.expire(now);
        let queued = self.position(token, writer).is_some();
        self.dequeue(token, writer);
        if self.hash_exists(now) {
            self.after_release(now);
        }
        i8::from(queued)
    }

    /// `sem_extend.lua` of one holder: 1 renewed to ttl from now, 0 when
    /// it lapsed or is gone (never revived), -1 another holder's live one.
    pub fn extend(
        &mut self,
        field: RwField,
        (token, fence): (Token, u64),
        now: u32,
        ttl: u32,
    ) -> i8 {
        self.expire(now);
        let Some(h) = self.get_mut(field) else {
            return 0;
        };
        if h.expires_at <= now {
            return 0;
        }
        if h.token != token || h.fence != fence {
            return -1;
        }
        h.expires_at = now + ttl;
        let until = now + ttl;
        self.hash_expires_at = Some(self.hash_expires_at.map_or(until, |e| e.max(until)));
        1
    }

    /// Writes states that no script can tell apart the same way (the
    /// exhaustive model's reduction; each step is exact):
    /// - a lapsed holder is never revived and its token and fence are never
    ///   read again (a release or renewal of it says 0 whoever held it),
    ///   and a dead waiter's lease only matters as dead: both are written
    ///   with 0;
    /// - with the queue empty, lapsed holders and the hash's existence are
    ///   observable only by the wake-ups of a queue that is not there, and
    ///   any grant that could queue someone first deletes the lapsed holders
    ///   (and the hash then takes ttl from now): they go, and so does a hash
    ///   without holders;
    /// - `poll_only` (nobody ever queues): the hash's own expiry is never
    ///   observable either.
    pub fn settle(&mut self, now: u32, poll_only: bool) {
        self.expire(now);
        let lapsed = Held {
            token: 0,
            fence: 0,
            expires_at: 0,
        };
        for h in self
            .writer
            .iter_mut()
            .chain(self.readers.iter_mut().flatten())
        {
            if h.expires_at <= now {
                *h = lapsed;
            }
        }
        for w in &mut self.queue {
            if w.lease_end <= now {
                w.lease_end = 0;
            }
        }
        if self.queue.is_empty() {
            for (field, h) in self.fields() {
                if h.expires_at <= now {
                    self.set(field, None);
                }
            }
            if self.fields().is_empty() {
                self.hash_expires_at = None;
            } else if poll_only {
                self.hash_expires_at = Some(u32::MAX);
            }
        }
    }
}

/// What a client takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Always a reader.
    Reader,
    /// Always a writer.
    Writer,
    /// Either side, chosen at each acquisition.
    Either,
}

/// The read-write lock model: clients, bounds, faults, broken rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RwModel {
    /// Each client's role (at most 8 clients).
    pub roles: Vec<Role>,
    /// Acquisitions per client.
    pub cycles: u8,
    /// The lease, in ticks.
    pub ttl: u32,
    /// The last tick.
    pub max_ticks: u32,
    /// Counter fences (`INCR`) instead of clock-floored ones.
    pub counter: bool,
    /// Fair mode (the wait queue); poll otherwise.
    pub fair: bool,
    /// The waiter lease, in ticks (fair mode).
    pub waiter_lease: u32,
    /// A grant's reply may be lost once (poll mode: the script ran, the
    /// client retries with the same token).
    pub lost_reply: bool,
    /// The fence key may be lost once (clock fences), as its retention
    /// ends it: only after the clock has passed every fence issued.
    pub lose_fence_key: bool,
    /// Broken rules.
    pub broken: RwBroken,
}

impl Default for RwModel {
    fn default() -> Self {
        RwModel {
            roles: vec![Role::Writer, Role::Reader, Role::Reader],
            cycles: 1,
            ttl: 2,
            max_ticks: 4,
            counter: false,
            fair: false,
            waiter_lease: 2,
            lost_reply: false,
            lose_fence_key: false,
            broken: RwBroken::default(),
        }
    }
}

/// A writer's next step (a fenced read-modify-write, as the mutex's
/// holders do: register, read, write the value read plus one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriterStep {
    /// Register its fence at the resource.
    Register,
    /// Read the value.
    Read,
    /// Write the value read plus one.
    Write(u8),
    /// Release.
    Release,
}

/// A reader's next step (a validated read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReaderStep {
    /// Read the resource. `later`: a writer granted after this reader has
    /// had a write accepted.
    Read {
        /// A later writer has written.
        later: bool,
    },
    /// Compare the resource's stored fence with the epoch. What was true
    /// at the read: a write fenced above the epoch had been applied
    /// (`above`), a writer granted after this reader had written (`later`).
    Validate {
        /// A write above the epoch came before the read.
        above: bool,
        /// A later writer's write came before the read.
        later: bool,
    },
    /// Release; `torn`: what the validation said.
    Release {
        /// The read was `Torn`.
        torn: bool,
    },
}

/// Where a client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwPhase {
    /// Not holding, not queued.
    Idle,
    /// Refused in fair mode, queued (it retries with `queued`).
    Waiting {
        /// Its side.
        writer: bool,
        /// The tick its waiter lease ends (0 once ended).
        lease_end: u32,
        /// Its waiter lease has never ended since it first queued.
        kept: bool,
    },
    /// Holding the writer's field.
    Writing {
        /// Its fence.
        fence: u64,
        /// Its local deadline.
        deadline: u32,
        /// What it does next.
        step: WriterStep,
        /// The clients that were readers about to read when it was
        /// granted (bit per client).
        before: u8,
    },
    /// Holding a reader's field.
    Reading {
        /// Its reader number.
        field: u8,
        /// Its epoch.
        epoch: u64,
        /// Its local deadline.
        deadline: u32,
        /// What it does next.
        step: ReaderStep,
    },
    /// Every acquisition done.
    Done,
}

/// One client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RwClient {
    /// Its phase.
    pub phase: RwPhase,
    /// Acquisitions done.
    pub cycles: u8,
}

/// What went wrong along the way (each property reads one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RwFlags {
    /// Two valid writers at once.
    pub two_writers: bool,
    /// A valid writer and a valid reader at once.
    pub writer_with_reader: bool,
    /// A writer's fence not above an earlier grant's fence or epoch.
    pub writer_fence_not_above: bool,
    /// A reader's epoch below an earlier writer's fence.
    pub epoch_below_writer: bool,
    /// A `Clean` read after a write fenced above its epoch.
    pub clean_above_epoch: bool,
    /// A `Clean` read after a write of a writer granted after the reader.
    pub clean_after_later_writer: bool,
    /// A valid writer's register or write refused.
    pub valid_writer_refused: bool,
    /// Fair mode: a grant past a live conflicting waiter that queued
    /// before the caller.
    pub fair_overtaken: bool,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RwState {
    /// The tick.
    pub now: u32,
    /// The lock's keys.
    pub store: RwStore,
    /// The resource (a counter, its stored fence and holder).
    pub resource: Resource,
    /// The clients.
    pub clients: Vec<RwClient>,
    /// Fair mode: the waiting clients in the order they first queued.
    pub arrivals: Vec<u8>,
    /// The lost reply was used.
    pub lost_used: bool,
    /// The fence key was lost.
    pub key_lost: bool,
    /// Increments acknowledged.
    pub acked: u8,
    /// The highest fence of an accepted write.
    pub max_written: Option<u64>,
    /// The highest epoch granted.
    pub max_epoch: Option<u64>,
    /// The highest writer's fence granted.
    pub max_wfence: Option<u64>,
    /// Violations seen (sticky).
    pub flags: RwFlags,
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwAction {
    /// Time passes.
    Tick,
    /// Client `i` asks for a side (`true`: write).
    Grant(u8, bool),
    /// Client `i`'s grant runs and its reply is lost.
    GrantReplyLost(u8, bool),
    /// Client `i` renews.
    Renew(u8),
    /// Client `i` does its next step.
    Work(u8),
    /// The fence key is lost.
    LoseFenceKey,
}

fn token(i: u8, cycle: u8) -> Token {
    i * 16 + cycle
}

fn bit(i: usize) -> u8 {
    1 << i
}

impl RwModel {
    fn clock(&self, now: u32) -> u64 {
        if self.counter {
            0
        } else {
            u64::from(now) * CLOCK_PER_TICK
        }
    }

    /// Valid writers and valid readers at `s.now`.
    fn valid(s: &RwState) -> (usize, usize) {
        let (mut w, mut r) = (0, 0);
        for c in &s.clients {
            match c.phase {
                RwPhase::Writing { deadline, .. } if s.now < deadline => w += 1,
                RwPhase::Reading { deadline, .. } if s.now < deadline => r += 1,
                _ => {}
            }
        }
        (w, r)
    }

    fn sides(&self, i: usize) -> &'static [bool] {
        match self.roles[i] {
            Role::Reader => &[false],
            Role::Writer => &[true],
            Role::Either => &[false, true],
        }
    }

    fn end_cycle(&self, s: &mut RwState, i: usize) {
        Self::leave_read_step(s, i);
        s.arrivals.retain(|&a| usize::from(a) != i);
        let c = &mut s.clients[i];
        c.cycles += 1;
        c.phase = if c.cycles >= self.cycles {
            RwPhase::Done
        } else {
            RwPhase::Idle
        };
    }

    /// Client `i` no longer waits to read: no writer's write marks it.
    fn leave_read_step(s: &mut RwState, i: usize) {
        for c in &mut s.clients {
            if let RwPhase::Writing { before, .. } = &mut c.phase {
                *before &= !bit(i);
            }
        }
    }

    /// The checks of a grant that was not a retry, by client `i`.
    fn fresh_grant(&self, s: &mut RwState, i: usize, writer: bool, fence: u64) {
        if writer {
            if s.max_epoch.is_some_and(|e| fence <= e) || s.max_wfence.is_some_and(|f| fence <= f) {
                s.flags.writer_fence_not_above = true;
            }
            s.max_wfence = Some(s.max_wfence.map_or(fence, |f| f.max(fence)));
        } else {
            if s.max_wfence.is_some_and(|f| fence < f) {
                s.flags.epoch_below_writer = true;
            }
            s.max_epoch = Some(s.max_epoch.map_or(fence, |e| e.max(fence)));
        }
        if self.fair {
            let mine = s.arrivals.iter().position(|&a| usize::from(a) == i);
            for (at, &other) in s.arrivals.iter().enumerate() {
                let other = usize::from(other);
                if other == i || mine.is_some_and(|m| m < at) {
                    continue;
                }
                if let RwPhase::Waiting {
                    writer: w,
                    kept: true,
                    ..
                } = s.clients[other].phase
                    && (writer || w)
                {
                    s.flags.fair_overtaken = true;
                }
            }
        }
    }

    fn grant(&self, s: &mut RwState, i: usize, writer: bool, lost: bool) {
        let tok = token(i as u8, s.clients[i].cycles);
        let waiting = matches!(s.clients[i].phase, RwPhase::Waiting { .. });
        let call = RwCall {
            token: tok,
            writer,
            wait: if self.fair {
                WaitMode::Fair
            } else {
                WaitMode::Poll
            },
            member: self.fair,
            queued: waiting,
            ttl: self.ttl,
            waiter_lease: self.waiter_lease,
        };
        let reply = s.store.grant(&call, s.now, self.clock(s.now));
        if let RwReply::Granted {
            fence,
            retry: false,
            ..
        } = reply
        {
            self.fresh_grant(s, i, writer, fence);
        }
        if lost {
            s.lost_used = true;
            return;
        }
        match reply {
            RwReply::Granted { field, fence, .. } => {
                s.arrivals.retain(|&a| usize::from(a) != i);
                let deadline = s.now + self.ttl;
                s.clients[i].phase = match field {
                    RwField::Writer => {
                        let mut before = 0;
                        for (j, c) in s.clients.iter().enumerate() {
                            if let RwPhase::Reading {
                                step: ReaderStep::Read { .. },
                                ..
                            } = c.phase
                            {
                                before |= bit(j);
                            }
                        }
                        RwPhase::Writing {
                            fence,
                            deadline,
                            step: WriterStep::Register,
                            before,
                        }
                    }
                    RwField::Reader(n) => RwPhase::Reading {
                        field: n,
                        epoch: fence,
                        deadline,
                        step: ReaderStep::Read { later: false },
                    },
                };
            }
            RwReply::Held { .. } | RwReply::Reserved { .. } if self.fair => {
                let kept = match s.clients[i].phase {
                    RwPhase::Waiting { kept, .. } => kept,
                    _ => {
                        s.arrivals.push(i as u8);
                        true
                    }
                };
                s.clients[i].phase = RwPhase::Waiting {
                    writer,
                    lease_end: s.now + self.waiter_lease,
                    kept,
                };
            }
            RwReply::Held { .. } | RwReply::Reserved { .. } => {}
        }
    }

    fn renew(&self, s: &mut RwState, i: usize) {
        let tok = token(i as u8, s.clients[i].cycles);
        let now = s.now;
        match &mut s.clients[i].phase {
            RwPhase::Writing {
                fence, deadline, ..
            } => {
                if s.store
                    .extend(RwField::Writer, (tok, *fence), now, self.ttl)
                    == 1
                {
                    *deadline = now + self.ttl;
                    return;
                }
            }
            RwPhase::Reading {
                field,
                epoch,
                deadline,
                ..
            } => {
                if s.store
                    .extend(RwField::Reader(*field), (tok, *epoch), now, self.ttl)
                    == 1
                {
                    *deadline = now + self.ttl;
                    return;
                }
            }
            _ => return,
        }
        // Lost: the loss signal stops the work.
        self.end_cycle(s, i);
    }

    fn work_writer(&self, s: &mut RwState, i: usize) {
        let RwPhase::Writing {
            fence,
            deadline,
            step,
            before,
        } = s.clients[i].phase
        else {
            return;
        };
        let tok = token(i as u8, s.clients[i].cycles);
        let valid = s.now < deadline;
        let next = |step| RwPhase::Writing {
            fence,
            deadline,
            step,
            before,
        };
        match step {
            WriterStep::Register => {
                if s.resource.write(fence, tok, Change::Register, false) {
                    s.clients[i].phase = next(WriterStep::Read);
                } else {
                    s.flags.valid_writer_refused |= valid;
                    s.clients[i].phase = next(WriterStep::Release);
                }
            }
            WriterStep::Read => s.clients[i].phase = next(WriterStep::Write(s.resource.value)),
            WriterStep::Write(v) => {
                if s.resource
                    .write(fence, tok, Change::Write(v.saturating_add(1)), false)
                {
                    s.acked += 1;
                    s.max_written = Some(s.max_written.map_or(fence, |f| f.max(fence)));
                    for (j, c) in s.clients.iter_mut().enumerate() {
                        if before & bit(j) != 0
                            && let RwPhase::Reading {
                                step: ReaderStep::Read { later },
                                ..
                            } = &mut c.phase
                        {
                            *later = true;
                        }
                    }
                } else {
                    s.flags.valid_writer_refused |= valid;
                }
                s.clients[i].phase = next(WriterStep::Release);
            }
            WriterStep::Release => {
                s.store.release(RwField::Writer, tok, fence, s.now);
                self.end_cycle(s, i);
            }
        }
    }

    fn work_reader(&self, s: &mut RwState, i: usize) {
        let RwPhase::Reading {
            field,
            epoch,
            deadline,
            step,
        } = s.clients[i].phase
        else {
            return;
        };
        let tok = token(i as u8, s.clients[i].cycles);
        let next = |step| RwPhase::Reading {
            field,
            epoch,
            deadline,
            step,
        };
        match step {
            ReaderStep::Read { later } => {
                let above = s.max_written.is_some_and(|f| f > epoch);
                Self::leave_read_step(s, i);
                s.clients[i].phase = next(ReaderStep::Validate { above, later });
            }
            ReaderStep::Validate { above, later } => {
                let clean =
                    self.broken.unvalidated_read || s.resource.fence.is_none_or(|f| f <= epoch);
                if clean && above {
                    s.flags.clean_above_epoch = true;
                }
                if clean && later {
                    s.flags.clean_after_later_writer = true;
                }
                s.clients[i].phase = next(ReaderStep::Release { torn: !clean });
            }
            ReaderStep::Release { .. } => {
                s.store.release(RwField::Reader(field), tok, epoch, s.now);
                self.end_cycle(s, i);
            }
        }
    }
}

impl Model for RwModel {
    type State = RwState;
    type Action = RwAction;

    fn init_states(&self) -> Vec<RwState> {
        vec![RwState {
            now: 0,
            store: RwStore::new(self.broken),
            resource: Resource::default(),
            clients: vec![
                RwClient {
                    phase: RwPhase::Idle,
                    cycles: 0,
                };
                self.roles.len()
            ],
            arrivals: Vec::new(),
            lost_used: false,
            key_lost: false,
            acked: 0,
            max_written: None,
            max_epoch: None,
            max_wfence: None,
            flags: RwFlags::default(),
        }]
    }

    fn actions(&self, s: &RwState, actions: &mut Vec<RwAction>) {
        if s.now < self.max_ticks {
            actions.push(RwAction::Tick);
        }
        if self.lose_fence_key
            && !s.key_lost
            && !self.counter
            && s.store
                .fence_key
                .is_some_and(|f| f < u64::from(s.now) * CLOCK_PER_TICK)
        {
            actions.push(RwAction::LoseFenceKey);
        }
        for (i, c) in s.clients.iter().enumerate() {
            let n = i as u8;
            match c.phase {
                RwPhase::Idle => {
                    for &writer in self.sides(i) {
                        actions.push(RwAction::Grant(n, writer));
                        if self.lost_reply && !self.fair && !s.lost_used {
                            actions.push(RwAction::GrantReplyLost(n, writer));
                        }
                    }
                }
                RwPhase::Waiting { writer, .. } => actions.push(RwAction::Grant(n, writer)),
                RwPhase::Writing { step, .. } => {
                    actions.push(RwAction::Work(n));
                    if step != WriterStep::Release {
                        actions.push(RwAction::Renew(n));
                    }
                }
                RwPhase::Reading { step, .. } => {
                    actions.push(RwAction::Work(n));
                    if !matches!(step, ReaderStep::Release { .. }) {
                        actions.push(RwAction::Renew(n));
                    }
                }
                RwPhase::Done => {}
            }
        }
    }

    fn next_state(&self, s: &RwState, action: RwAction) -> Option<RwState> {
        let mut next = s.clone();
        match action {
            RwAction::Tick => {
                next.now += 1;
                let now = next.now;
                for c in &mut next.clients {
                    if let RwPhase::Waiting {
                        lease_end, kept, ..
                    } = &mut c.phase
                        && *lease_end <= now
                    {
                        *lease_end = 0;
                        *kept = false;
                    }
                }
            }
            RwAction::Grant(i, writer) => self.grant(&mut next, usize::from(i), writer, false),
            RwAction::GrantReplyLost(i, writer) => {
                self.grant(&mut next, usize::from(i), writer, true)
            }
            RwAction::Renew(i) => self.renew(&mut next, usize::from(i)),
            RwAction::Work(i) => {
                let i = usize::from(i);
                match next.clients[i].phase {
                    RwPhase::Writing { .. } => self.work_writer(&mut next, i),
                    RwPhase::Reading { .. } => self.work_reader(&mut next, i),
                    _ => return None,
                }
            }
            RwAction::LoseFenceKey => {
                next.store.fence_key = None;
                next.key_lost = true;
            }
        }
        let now = next.now;
        next.store.settle(now, !self.fair);
        let (writers, readers) = Self::valid(&next);
        if writers > 1 {
            next.flags.two_writers = true;
        }
        if writers > 0 && readers > 0 {
            next.flags.writer_with_reader = true;
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("no two valid writers", |_, s: &RwState| {
                !s.flags.two_writers
            }),
            Property::always("no valid writer with a valid reader", |_, s: &RwState| {
                !s.flags.writer_with_reader
            }),
            Property::always(
                "a writer's fence is above every earlier writer's fence and reader's epoch",
                |_, s: &RwState| !s.flags.writer_fence_not_above,
            ),
            Property::always(
                "a reader's epoch is at least every earlier writer's fence",
                |_, s: &RwState| !s.flags.epoch_below_writer,
            ),
            Property::always(
                "a Clean read saw no write fenced above its epoch",
                |_, s: &RwState| !s.flags.clean_above_epoch,
            ),
            Property::always(
                "a Clean read saw no write of a writer granted after it",
                |_, s: &RwState| !s.flags.clean_after_later_writer,
            ),
            Property::always("C3: no acknowledged write lost", |_, s: &RwState| {
                s.resource.value == s.acked
            }),
            Property::always("a valid writer is never refused", |_, s: &RwState| {
                !s.flags.valid_writer_refused
            }),
            Property::sometimes("a validated read is Torn", |_, s: &RwState| {
                s.clients.iter().any(|c| {
                    matches!(
                        c.phase,
                        RwPhase::Reading {
                            step: ReaderStep::Release { torn: true },
                            ..
                        }
                    )
                })
            }),
            Property::sometimes("a validated read is Clean", |_, s: &RwState| {
                s.clients.iter().any(|c| {
                    matches!(
                        c.phase,
                        RwPhase::Reading {
                            step: ReaderStep::Release { torn: false },
                            ..
                        }
                    )
                })
            }),
            Property::sometimes("every acquisition done", |_, s: &RwState| {
                s.clients.iter().all(|c| c.phase == RwPhase::Done) && s.acked > 0
            }),
        ];
        let readers = self.roles.iter().filter(|r| **r != Role::Writer).count();
        if readers > 1 {
            properties.push(Property::sometimes(
                "two valid readers at once",
                |_, s: &RwState| Self::valid(s).1 > 1,
            ));
        }
        let writers = self.roles.iter().filter(|r| **r != Role::Reader).count();
        if self.fair {
            properties.push(Property::always(
                "fair order: no grant past a live conflicting waiter queued before",
                |_, s: &RwState| !s.flags.fair_overtaken,
            ));
        }
        // A reader holding, a writer and a later reader queued: three
        // clients.
        if self.fair && self.roles.len() > 2 && readers > 1 && writers > 0 {
            properties.push(Property::sometimes(
                "a queued writer keeps a later reader out while readers hold",
                |_, s: &RwState| {
                    let live = s.store.live_holders(s.now);
                    let readers_only = !live.is_empty() && live.iter().all(|(f, _)| !f.is_writer());
                    let waiting = |i: u8, w: bool| {
                        matches!(
                            s.clients[usize::from(i)].phase,
                            RwPhase::Waiting { writer, kept: true, .. } if writer == w
                        )
                    };
                    let writer_at = s.arrivals.iter().position(|&i| waiting(i, true));
                    let reader_at = s.arrivals.iter().rposition(|&i| waiting(i, false));
                    readers_only && matches!((writer_at, reader_at), (Some(w), Some(r)) if w < r)
                },
            ));
        }
        properties
    }

    fn within_boundary(&self, s: &RwState) -> bool {
        s.now <= self.max_ticks
    }
}
