//! A fenced semaphore, modelled ahead of its scripts as their
//! specification: N permits, each a **slot** `0..N` with its own holder,
//! fences minted from the name's one clock-floored counter, and resources
//! that keep one `(fence, holder)` pair **per slot**.
//!
//! Why slots: one fence per name cannot fence N concurrent holders. A stale
//! permit's fence can sit between two live ones, so no single stored fence
//! refuses it without also refusing a live permit. With a pair per slot, a
//! permit's write is checked against its own slot's history only: a stale
//! holder of slot `s` is refused once the next holder of `s` registered,
//! and two live permits never refuse each other. The use case is "N
//! workers, each owning the partition of its slot" (the resource's data is
//! partitioned by slot).
//!
//! The protocol, one atomic transition per script-to-be:
//! - **grant**: a retry by a token that holds a slot gets that slot and
//!   fence back; otherwise the lowest free slot is taken with a fence
//!   minted as the mutex mints (`max(last + 1, clock)`); with every slot
//!   held, refused;
//! - **release** and **extend**: compare the slot's value (token and
//!   fence), then delete or re-expire it; never re-create it;
//! - **fenced write / register** on the resource, per slot, with the
//!   mutex's rule (above the slot's stored fence, or equal and the same
//!   holder).
//!
//! Clients poll (the wait queue is the mutex's, unchanged, and not part of
//! what slots add); faults: a lost grant reply (the retry keeps its token),
//! pauses anywhere, leases expiring between calls.

use stateright::{Model, Property};

use crate::store::{Change, Held, Resource, Token};

/// What a semaphore keeps in the store: each slot's permit (its field of
/// the semaphore key, with the permit's deadline) and the name's fence key.
/// Its methods are the scripts' transitions (`sem_grant.lua`,
/// `sem_extend.lua`, `sem_release.lua`); the differential test holds the
/// real scripts to them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SemStore {
    /// Each slot's permit.
    pub slots: Vec<Option<Held>>,
    /// The last fence issued for the name.
    pub fence_key: Option<u64>,
}

/// What a semaphore grant did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemGranted {
    /// The slot.
    pub slot: u8,
    /// Its fence.
    pub fence: u64,
    /// A retry by the token that holds the slot: the same slot and fence.
    pub retry: bool,
}

impl SemStore {
    /// `permits` free slots, no fence issued.
    pub fn new(permits: u8) -> Self {
        SemStore {
            slots: vec![None; usize::from(permits)],
            fence_key: None,
        }
    }

    /// The permit in `slot` if it has not lapsed at `now`.
    pub fn live(&self, slot: usize, now: u32) -> Option<Held> {
        self.slots
            .get(slot)
            .copied()
            .flatten()
            .filter(|h| h.expires_at > now)
    }

    /// The grant: a retry by a token that holds a slot gets that slot and
    /// fence back, its lease restarted; otherwise the lowest free slot with
    /// a fence minted as the mutex mints (`max(last + 1, clock)`, the clock
    /// `clock`); `None` when every slot is held. `past_permits`: the broken
    /// grant that adds a slot when all are held.
    pub fn grant(
        &mut self,
        tok: Token,
        now: u32,
        ttl: u32,
        clock: u64,
        past_permits: bool,
    ) -> Option<SemGranted> {
        for slot in 0..self.slots.len() {
            if let Some(h) = self.live(slot, now)
                && h.token == tok
            {
                self.slots[slot] = Some(Held {
                    expires_at: now + ttl,
                    ..h
                });
                return Some(SemGranted {
                    slot: slot as u8,
                    fence: h.fence,
                    retry: true,
                });
            }
        }
        let free = (0..self.slots.len()).find(|&slot| self.live(slot, now).is_none());
        let slot = match free {
            Some(slot) => slot,
            None if past_permits => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return None,
        };
        let fence = (self.fence_key.unwrap_or(0) + 1).max(clock);
        self.fence_key = Some(fence);
        self.slots[slot] = Some(Held {
            token: tok,
            fence,
            expires_at: now + ttl,
        });
        Some(SemGranted {
            slot: slot as u8,
            fence,
            retry: false,
        })
    }

    /// The renewal of `tok`'s permit with `fence` in `slot`, compared and
    /// never revived once lapsed: 1 renewed, 0 lapsed or gone, -1 another
    /// holder's live permit (`unchecked`: the broken renewal of any permit
    /// there).
    pub fn renew(
        &mut self,
        slot: u8,
        (tok, fence): (Token, u64),
        now: u32,
        ttl: u32,
        unchecked: bool,
    ) -> i8 {
        let at = usize::from(slot);
        match self.live(at, now) {
            Some(h) if unchecked || (h.token == tok && h.fence == fence) => {
                self.slots[at] = Some(Held {
                    expires_at: now + ttl,
                    ..h
                });
                1
            }
            Some(_) => -1,
            None => 0,
        }
    }

    /// The release of `tok`'s permit with `fence` in `slot`: 1 released,
    /// 0 when the slot's permit lapsed (whoever held it) or is gone, -1
    /// another holder's live permit. `unchecked`: the broken release that
    /// deletes any permit there.
    pub fn release(&mut self, slot: u8, tok: Token, fence: u64, now: u32, unchecked: bool) -> i8 {
        let at = usize::from(slot);
        let Some(h) = self.live(at, now) else {
            // A lapsed permit is free whoever held it.
            if let Some(gone) = self.slots.get_mut(at) {
                *gone = None;
            }
            return 0;
        };
        if !unchecked && (h.token != tok || h.fence != fence) {
            return -1;
        }
        self.slots[at] = None;
        1
    }
}

/// Deliberately broken rules (negative controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SemBroken {
    /// The resource keeps one fence and holder for all slots (a mutex's
    /// resource): a live permit with a lower fence is refused.
    pub one_fence_for_all_slots: bool,
    /// The grant takes a slot past the permit count when all are held.
    pub ignore_permits: bool,
    /// Release deletes the slot whoever holds it.
    pub unchecked_release: bool,
}

/// The semaphore model: clients, permits, bounds, faults.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SemaphoreModel {
    /// Clients (at most 4).
    pub clients: u8,
    /// Permits (slots).
    pub permits: u8,
    /// Cycles per client.
    pub cycles: u8,
    /// The lease, in ticks.
    pub ttl: u32,
    /// The last tick.
    pub max_ticks: u32,
    /// A grant's reply may be lost once (the script ran; the client
    /// retries with the same token).
    pub lost_reply: bool,
    /// Broken rules.
    pub broken: SemBroken,
}

impl Default for SemaphoreModel {
    fn default() -> Self {
        SemaphoreModel {
            clients: 3,
            permits: 2,
            cycles: 1,
            ttl: 2,
            max_ticks: 4,
            lost_reply: false,
            broken: SemBroken::default(),
        }
    }
}

/// A permit holder's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemStep {
    /// Register the fence at its slot of the resource.
    Register,
    /// Read its slot's value.
    Read,
    /// Write the value read plus one.
    Write(u8),
    /// Release the permit.
    Release,
}

/// Where a client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemPhase {
    /// Not holding.
    Idle,
    /// Holding `slot` with `fence`, valid until `deadline`.
    Holding {
        /// Its slot.
        slot: u8,
        /// Its fence.
        fence: u64,
        /// Its local deadline.
        deadline: u32,
        /// What it does next.
        step: SemStep,
    },
    /// Every cycle done.
    Done,
}

/// One client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SemClient {
    /// Its phase.
    pub phase: SemPhase,
    /// Cycles done.
    pub cycles: u8,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SemState {
    /// The tick.
    pub now: u32,
    /// The semaphore's key and its fence key.
    pub store: SemStore,
    /// The resource: each slot's partition, fence and holder (with
    /// `one_fence_for_all_slots`, slot 0's fence and holder stand for all).
    pub resource: Vec<Resource>,
    /// The clients.
    pub clients: Vec<SemClient>,
    /// The lost reply was used.
    pub lost_used: bool,
    /// Increments acknowledged per slot.
    pub acked: Vec<u8>,
    /// The last accepted (fence, holder) per slot.
    pub last_accepted: Vec<Option<(u64, Token)>>,
    /// The fence of the last new grant.
    pub last_grant: Option<u64>,
    /// Violations seen (sticky flags).
    pub flags: SemFlags,
}

/// What went wrong along the way (each property reads one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SemFlags {
    /// More valid holders than permits.
    pub over_permits: bool,
    /// Two valid holders of one slot.
    pub slot_shared: bool,
    /// A write accepted in a slot with a fence below an accepted one.
    pub fence_below_accepted: bool,
    /// Two holders accepted in one slot with one fence.
    pub shared_fence: bool,
    /// A grant's fence not above the one before it.
    pub fence_went_back: bool,
    /// A valid holder's register or write refused.
    pub valid_refused: bool,
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemAction {
    /// Time passes.
    Tick,
    /// Client `i` asks for a permit.
    Grant(u8),
    /// Client `i`'s grant runs and its reply is lost.
    GrantReplyLost(u8),
    /// Client `i` renews.
    Renew(u8),
    /// Client `i` does its next step.
    Work(u8),
}

fn token(i: u8, cycle: u8) -> Token {
    i * 16 + cycle
}

impl SemaphoreModel {
    fn valid(s: &SemState, i: usize) -> Option<u8> {
        match s.clients[i].phase {
            SemPhase::Holding { slot, deadline, .. } if s.now < deadline => Some(slot),
            _ => None,
        }
    }

    /// The resource index a slot's fence is checked at.
    fn fence_index(&self, slot: u8) -> usize {
        if self.broken.one_fence_for_all_slots {
            0
        } else {
            usize::from(slot)
        }
    }

    /// A fenced change of `slot` by the holder `tok` of `fence`: checked at
    /// the slot's pair (or the one shared pair), applied to the slot's
    /// partition. Returns whether it was accepted, and records it.
    fn fenced(&self, s: &mut SemState, slot: u8, fence: u64, tok: Token, change: Change) -> bool {
        let at = self.fence_index(slot);
        let mut check = s.resource[at];
        if !check.write(fence, tok, Change::Register, false) {
            return false;
        }
        s.resource[at].fence = check.fence;
        s.resource[at].holder = check.holder;
        if let Change::Write(v) = change {
            s.resource[usize::from(slot)].value = v;
        }
        let last = &mut s.last_accepted[usize::from(slot)];
        if let Some((f, t)) = *last {
            if fence < f {
                s.flags.fence_below_accepted = true;
            }
            if fence == f && t != tok {
                s.flags.shared_fence = true;
            }
        }
        *last = Some((fence, tok));
        true
    }

    fn end_cycle(&self, s: &mut SemState, i: usize) {
        let c = &mut s.clients[i];
        c.cycles += 1;
        c.phase = if c.cycles >= self.cycles {
            SemPhase::Done
        } else {
            SemPhase::Idle
        };
    }
}

impl Model for SemaphoreModel {
    type State = SemState;
    type Action = SemAction;

    fn init_states(&self) -> Vec<SemState> {
        let n = usize::from(self.permits);
        vec![SemState {
            now: 0,
            store: SemStore::new(self.permits),
            resource: vec![Resource::default(); n],
            clients: vec![
                SemClient {
                    phase: SemPhase::Idle,
                    cycles: 0,
                };
                usize::from(self.clients)
            ],
            lost_used: false,
            acked: vec![0; n],
            last_accepted: vec![None; n],
            last_grant: None,
            flags: SemFlags::default(),
        }]
    }

    fn actions(&self, s: &SemState, actions: &mut Vec<SemAction>) {
        if s.now < self.max_ticks {
            actions.push(SemAction::Tick);
        }
        for (i, c) in s.clients.iter().enumerate() {
            let i = i as u8;
            match c.phase {
                SemPhase::Idle => {
                    actions.push(SemAction::Grant(i));
                    if self.lost_reply && !s.lost_used {
                        actions.push(SemAction::GrantReplyLost(i));
                    }
                }
                SemPhase::Holding { step, .. } => {
                    actions.push(SemAction::Work(i));
                    if step != SemStep::Release {
                        actions.push(SemAction::Renew(i));
                    }
                }
                SemPhase::Done => {}
            }
        }
    }

    fn next_state(&self, s: &SemState, action: SemAction) -> Option<SemState> {
        let mut next = s.clone();
        match action {
            SemAction::Tick => next.now += 1,
            SemAction::Grant(i) | SemAction::GrantReplyLost(i) => {
                let i = usize::from(i);
                let tok = token(i as u8, next.clients[i].cycles);
                let clock = u64::from(next.now) * 10;
                let granted =
                    next.store
                        .grant(tok, next.now, self.ttl, clock, self.broken.ignore_permits);
                if let Some(SemGranted {
                    fence,
                    retry: false,
                    ..
                }) = granted
                {
                    if next.last_grant.is_some_and(|last| fence <= last) {
                        next.flags.fence_went_back = true;
                    }
                    next.last_grant = Some(fence);
                }
                if action == SemAction::GrantReplyLost(i as u8) {
                    next.lost_used = true;
                } else if let Some(SemGranted { slot, fence, .. }) = granted {
                    next.clients[i].phase = SemPhase::Holding {
                        slot,
                        fence,
                        deadline: next.now + self.ttl,
                        step: SemStep::Register,
                    };
                }
                // The slots a broken grant added have no resource yet.
                while next.resource.len() < next.store.slots.len() {
                    next.resource.push(Resource::default());
                    next.acked.push(0);
                    next.last_accepted.push(None);
                }
            }
            SemAction::Renew(i) => {
                let i = usize::from(i);
                let SemPhase::Holding {
                    slot, fence, step, ..
                } = next.clients[i].phase
                else {
                    return None;
                };
                let tok = token(i as u8, next.clients[i].cycles);
                if next
                    .store
                    .renew(slot, (tok, fence), next.now, self.ttl, false)
                    == 1
                {
                    next.clients[i].phase = SemPhase::Holding {
                        slot,
                        fence,
                        deadline: next.now + self.ttl,
                        step,
                    };
                } else {
                    // Lost: the loss signal stops the work.
                    self.end_cycle(&mut next, i);
                }
            }
            SemAction::Work(i) => {
                let i = usize::from(i);
                let SemPhase::Holding {
                    slot,
                    fence,
                    deadline,
                    step,
                } = next.clients[i].phase
                else {
                    return None;
                };
                let tok = token(i as u8, next.clients[i].cycles);
                let valid = next.now < deadline;
                let holding = |step| SemPhase::Holding {
                    slot,
                    fence,
                    deadline,
                    step,
                };
                match step {
                    SemStep::Register => {
                        if self.fenced(&mut next, slot, fence, tok, Change::Register) {
                            next.clients[i].phase = holding(SemStep::Read);
                        } else {
                            next.flags.valid_refused |= valid;
                            next.clients[i].phase = holding(SemStep::Release);
                        }
                    }
                    SemStep::Read => {
                        let v = next.resource[usize::from(slot)].value;
                        next.clients[i].phase = holding(SemStep::Write(v));
                    }
                    SemStep::Write(v) => {
                        let change = Change::Write(v.saturating_add(1));
                        if self.fenced(&mut next, slot, fence, tok, change) {
                            next.acked[usize::from(slot)] += 1;
                        } else {
                            next.flags.valid_refused |= valid;
                        }
                        next.clients[i].phase = holding(SemStep::Release);
                    }
                    SemStep::Release => {
                        // Only a live permit is released (a lapsed one's
                        // field is gone below as its key would be).
                        if next.store.live(usize::from(slot), next.now).is_some() {
                            let now = next.now;
                            next.store.release(
                                slot,
                                tok,
                                fence,
                                now,
                                self.broken.unchecked_release,
                            );
                        }
                        self.end_cycle(&mut next, i);
                    }
                }
            }
        }
        // Expired slot keys are gone.
        let now = next.now;
        for slot in &mut next.store.slots {
            if slot.is_some_and(|h| h.expires_at <= now) {
                *slot = None;
            }
        }
        let valid: Vec<u8> = (0..next.clients.len())
            .filter_map(|i| Self::valid(&next, i))
            .collect();
        if valid.len() > usize::from(self.permits) {
            next.flags.over_permits = true;
        }
        let mut seen = valid.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() < valid.len() {
            next.flags.slot_shared = true;
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "never more valid holders than permits",
                |_, s: &SemState| !s.flags.over_permits,
            ),
            Property::always("one valid holder per slot", |_, s: &SemState| {
                !s.flags.slot_shared
            }),
            Property::always(
                "C1 per slot: fences accepted in order",
                |_, s: &SemState| !s.flags.fence_below_accepted,
            ),
            Property::always("C2 per slot: one holder per fence", |_, s: &SemState| {
                !s.flags.shared_fence
            }),
            Property::always(
                "C3 per slot: no acknowledged write lost",
                |_, s: &SemState| {
                    s.acked
                        .iter()
                        .zip(&s.resource)
                        .all(|(acked, r)| r.value == *acked)
                },
            ),
            Property::always("C6 fences increase", |_, s: &SemState| {
                !s.flags.fence_went_back
            }),
            Property::always("a valid permit is never refused", |_, s: &SemState| {
                !s.flags.valid_refused
            }),
            Property::sometimes(
                "every permit taken at once",
                |m: &SemaphoreModel, s: &SemState| {
                    (0..s.clients.len())
                        .filter(|&i| SemaphoreModel::valid(s, i).is_some())
                        .count()
                        == usize::from(m.permits)
                },
            ),
            Property::sometimes("every cycle done", |_, s: &SemState| {
                s.clients.iter().all(|c| c.phase == SemPhase::Done)
                    && s.acked.iter().any(|&a| a > 0)
            }),
        ]
    }

    fn within_boundary(&self, s: &SemState) -> bool {
        s.now <= self.max_ticks
    }
}
