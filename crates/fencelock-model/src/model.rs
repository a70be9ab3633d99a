//! The lock protocol as a stateright [`Model`]: clients that take one
//! name's lock, register their fence at a counter resource, read it, write
//! it plus one and release (the torture workers' cycle), interleaved in
//! every order with the passing of time and the faults of [`Faults`]; and
//! the torture checkers as properties over every reachable state.
//!
//! A client's actions follow the engine: a grant's validity starts when
//! the grant was *sent* (here: the tick the script ran), minus the drift
//! margin; a retried grant keeps its token (a lost reply: the script ran,
//! the client was not told); a waiting client retries (a woken or handed
//! over waiter asks the store with its own grant, which gives a handed lock
//! back); a renewal that finds the lock gone or another's ends the lease.
//! A client may be paused between any two of its steps for any number of
//! ticks: the worst case, since a paused process cannot check its lease.

use stateright::{Model, Property};

use crate::store::{Broken, Change, FenceMode, Grant, PassedOn, Resource, Store, Token, WaitMode};

/// The faults a configuration may inject (each at most once per run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A grant's reply is lost: the script ran, the client retries with the
    /// same token.
    pub lost_reply: bool,
    /// A restart that loses every key (no persistence).
    pub lose_data: bool,
    /// A failover to a replica that missed the last write to the lock's
    /// keys.
    pub failover: bool,
    /// The server clock steps back by two ticks.
    pub clock_back: bool,
    /// The server clock jumps forward by two ticks.
    pub clock_forward: bool,
    /// A revoke of whoever holds the lock, sealing the resource at the
    /// revocation fence (unless `revoke_without_seal`).
    pub revoke: bool,
}

/// What is checked: the clients, their bounds, the faults and the broken
/// rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockModel {
    /// How many clients (at most 4).
    pub clients: u8,
    /// Lock cycles per client.
    pub cycles: u8,
    /// The lease, in ticks.
    pub ttl: u32,
    /// The drift margin the client takes off its lease, in ticks.
    pub drift: u32,
    /// A waiter's lease, in ticks.
    pub waiter_lease: u32,
    /// The last tick.
    pub max_ticks: u32,
    /// Fence mode.
    pub fence_mode: FenceMode,
    /// Wait mode of every client.
    pub wait_mode: WaitMode,
    /// Faults that may happen.
    pub faults: Faults,
    /// Broken store or resource rules (negative controls).
    pub broken: Broken,
    /// Negative control: read-modify-write without registering the fence
    /// before the read.
    pub write_only: bool,
    /// Negative control: the revoke fault deposes without sealing.
    pub revoke_without_seal: bool,
    /// What waits for the replica (`--replicas`, `WAIT`) before the client
    /// is told: with the failover fault, a write the client waited for is
    /// on the replica that takes over.
    pub replicas: Replicated,
    /// Hand-over wake-ups: a release that hands the lock to a waiter sends
    /// it the fence, read any number of steps later; the waiter takes the
    /// lock from the message when it is fresh (the engine's
    /// `handover_is_fresh`: above the fence seen at its last refusal, the
    /// lease counted from that refusal), else confirms it with a
    /// compare-and-pexpire first. Off: a handed waiter learns of the lock
    /// with its next grant call only.
    pub handover_wakeups: bool,
    /// Negative control: every hand-over wake-up is trusted, stale ones too.
    pub trust_every_handover: bool,
}

/// Which writes the client waits for the replica to acknowledge
/// (`LockOptions::wait_for_replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Replicated {
    /// None (no `--replicas`): a failover may lose any write not yet
    /// replicated, and mutual exclusion is excused across it.
    #[default]
    Nothing,
    /// Grants and revokes only: a renewal the replica missed is lost in a
    /// failover, and the lock expires there at its older expiry.
    Grants,
    /// Grants, revokes and renewals: a lease is never longer on the client
    /// than on the replica, and mutual exclusion must hold across a
    /// failover.
    GrantsAndRenewals,
}

impl Default for LockModel {
    fn default() -> Self {
        LockModel {
            clients: 2,
            cycles: 1,
            ttl: 2,
            drift: 0,
            waiter_lease: 2,
            max_ticks: 5,
            fence_mode: FenceMode::Clock,
            wait_mode: WaitMode::Notify,
            faults: Faults::default(),
            broken: Broken::default(),
            write_only: false,
            revoke_without_seal: false,
            replicas: Replicated::Nothing,
            handover_wakeups: false,
            trust_every_handover: false,
        }
    }
}

/// Where a client is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Not holding; may try to take the lock (`waiting`: refused before).
    Idle {
        /// Refused before, so queued (notify, fair) or retrying (poll).
        waiting: bool,
    },
    /// The guide's two-command acquire took the lock with `SET NX` at tick
    /// `sent`; the `INCR` that gives its fence is still to come. `before`:
    /// the last grant's fence at the `SET NX`.
    HalfGranted {
        /// When the `SET NX` ran.
        sent: u32,
        /// The last grant's fence then.
        before: Option<u64>,
    },
    /// Holding a lease with `fence`, valid until `deadline` (by its own
    /// clock), at `step` of its work.
    Holding {
        /// Its fence.
        fence: u64,
        /// Its local deadline (sent time + ttl − drift).
        deadline: u32,
        /// What it does next.
        step: Step,
    },
    /// Every cycle done.
    Done,
}

/// A holder's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// Register the fence at the resource (before reading).
    Register,
    /// Read the resource.
    Read,
    /// Write the value read plus one.
    Write(u8),
    /// Release the lock.
    Release,
}

/// One client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// Its phase.
    pub phase: Phase,
    /// Cycles done.
    pub cycles: u8,
    /// Its lock was revoked (its lease no longer counts as valid).
    pub revoked: bool,
    /// The fence stored when its last attempt was refused, and that
    /// attempt's tick (with [`LockModel::handover_wakeups`]).
    pub refused: Option<(Option<u64>, u32)>,
    /// A hand-over wake-up not yet read: the fence it carries (with
    /// [`LockModel::handover_wakeups`]; delayed any number of steps, so it
    /// may be stale when read).
    pub inbox: Option<u64>,
}

/// The whole system at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The tick.
    pub now: u32,
    /// The lock's keys.
    pub store: Store,
    /// The lock's keys as the replica has them: one write behind (for a
    /// failover), when the failover fault is on.
    pub replica: Option<Store>,
    /// The counter resource.
    pub resource: Resource,
    /// The clients.
    pub clients: Vec<Client>,
    /// Faults used so far.
    pub used: Faults,
    /// The last write the resource accepted: (fence, holder).
    pub last_accepted: Option<(u64, Token)>,
    /// A write was accepted with a fence below an accepted one (C1).
    pub fence_below_accepted: bool,
    /// Two different holders were accepted with one fence (C2).
    pub shared_fence: bool,
    /// Increments acknowledged to their writers.
    pub acked: u8,
    /// The fence of the last new grant, in grant order.
    pub last_grant: Option<u64>,
    /// A grant got a fence not above the one before it.
    pub fence_went_back: bool,
    /// A renewal re-created a lock that had ended (a zombie renewal).
    pub zombie: bool,
    /// Two clients in their critical sections with valid leases.
    pub overlap: bool,
    /// The head a free lock has been reserved for (refusing other fair
    /// callers), and since when.
    pub reserved_for: Option<(Token, u32)>,
    /// The revocation fence of the revoke, once it returned.
    pub revocation: Option<u64>,
    /// A write was accepted after the revoke with a fence at or below the
    /// revocation fence (the deposed holder's, or an earlier one's).
    pub deposed_write: bool,
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes by one tick.
    Tick,
    /// Client `i` sends a grant (and hears the reply).
    Grant(u8),
    /// Client `i`'s grant runs, and its reply is lost.
    GrantReplyLost(u8),
    /// Client `i` sends the `INCR` of the guide's two-command acquire.
    Incr(u8),
    /// Client `i` renews its lease.
    Renew(u8),
    /// Client `i` does its next step of work (register, read, write, release).
    Work(u8),
    /// Client `i`, waiting, reads its hand-over wake-up.
    Wakeup(u8),
    /// Client `i`, waiting, gives up its place (its acquisition ends).
    Leave(u8),
    /// The server restarts without its data.
    LoseData,
    /// A replica missing the last write takes over.
    Failover,
    /// The server clock steps back.
    ClockBack,
    /// The server clock jumps forward.
    ClockForward,
    /// A supervisor revokes the lock.
    Revoke,
}

/// Clients are interchangeable: a state with two clients' places swapped
/// (their tokens in the store, the queue, the replica and the resource
/// with them) checks the same. The representative orders the clients by
/// their own state, so that symmetric states are explored once
/// (`checker().symmetry()`, the opt-in run's larger configurations).
impl stateright::Representative for State {
    fn representative(&self) -> Self {
        let mut order: Vec<usize> = (0..self.clients.len()).collect();
        order.sort_by_key(|&i| self.clients[i]);
        let mut new_index = vec![0u8; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new as u8;
        }
        let map = |t: Token| -> Token {
            match new_index.get(usize::from(t / 16)) {
                Some(&i) if t != crate::store::REVOKED => token(i, t % 16),
                _ => t,
            }
        };
        let map_store = |store: &Store| -> Store {
            let mut store = store.clone();
            if let Some(h) = &mut store.lock {
                h.token = map(h.token);
            }
            for w in &mut store.queue {
                w.token = map(w.token);
            }
            store
        };
        let mut next = self.clone();
        next.clients = order.iter().map(|&i| self.clients[i]).collect();
        next.store = map_store(&self.store);
        next.replica = self.replica.as_ref().map(map_store);
        next.resource.holder = self.resource.holder.map(map);
        next.last_accepted = self.last_accepted.map(|(f, t)| (f, map(t)));
        next
    }
}

/// The token of client `i`'s acquisition number `cycle` (a retry keeps it).
pub fn token(i: u8, cycle: u8) -> Token {
    i * 16 + cycle
}

impl LockModel {
    fn excused_by_data_loss(&self, state: &State) -> bool {
        state.used.lose_data || state.used.failover
    }

    /// Whether mutual exclusion is excused: across a data loss, or a
    /// failover when the client did not wait for the replica.
    fn exclusion_excused(&self, state: &State) -> bool {
        state.used.lose_data || (state.used.failover && self.replicas == Replicated::Nothing)
    }

    /// Whether client `i`'s lease is valid now (its own clock).
    fn valid(state: &State, i: usize) -> bool {
        let c = &state.clients[i];
        matches!(c.phase, Phase::Holding { deadline, .. } if state.now < deadline) && !c.revoked
    }

    fn after_grant(&self, next: &mut State, i: usize, fence: u64, retry: bool) {
        if !retry {
            if next.last_grant.is_some_and(|last| fence <= last) {
                next.fence_went_back = true;
            }
            next.last_grant = Some(fence);
        }
        let step = if self.write_only {
            Step::Read
        } else {
            Step::Register
        };
        next.clients[i].phase = Phase::Holding {
            fence,
            deadline: (next.now + self.ttl).saturating_sub(self.drift),
            step,
        };
        next.clients[i].revoked = false;
    }

    /// Records a write the resource accepted (a seal is nobody's: it may
    /// take an equal fence, which is its purpose).
    fn accepted(next: &mut State, fence: u64, holder: Token) {
        if let Some((last, last_holder)) = next.last_accepted {
            if fence < last {
                next.fence_below_accepted = true;
            }
            if fence == last
                && holder != last_holder
                && holder != crate::store::REVOKED
                && last_holder != crate::store::REVOKED
            {
                next.shared_fence = true;
            }
        }
        next.last_accepted = Some((fence, holder));
    }

    fn end_cycle(&self, next: &mut State, i: usize) {
        let c = &mut next.clients[i];
        c.cycles += 1;
        c.revoked = false;
        c.refused = None;
        c.inbox = None;
        c.phase = if c.cycles >= self.cycles {
            Phase::Done
        } else {
            Phase::Idle { waiting: false }
        };
    }

    fn record_pass_on(&self, next: &mut State, passed: PassedOn) {
        // The hand-over's wake-up, to the waiter whose token it names.
        if let PassedOn::Handed(tok, fence) = passed
            && self.handover_wakeups
            && let Some(c) = next
                .clients
                .iter_mut()
                .enumerate()
                .find(|(j, c)| token(*j as u8, c.cycles) == tok)
                .map(|(_, c)| c)
            && c.phase == (Phase::Idle { waiting: true })
        {
            c.inbox = Some(fence);
        }
        // A hand-over is a grant in grant order (the waiter learns of it
        // with its next grant call, or its wake-up).
        if let PassedOn::Handed(_, fence) = passed {
            if next.last_grant.is_some_and(|last| fence <= last) {
                next.fence_went_back = true;
            }
            next.last_grant = Some(fence);
        }
    }

    /// What every transition checks afterwards: expiry bookkeeping, zombies,
    /// overlaps, and how long the lock has refused while free.
    fn settle(&self, next: &mut State) {
        next.store.expire(next.now);
        let valid: usize = (0..next.clients.len())
            .filter(|&i| Self::valid(next, i))
            .count();
        if valid > 1 {
            next.overlap = true;
        }
        // A free lock is reserved for the first queued waiter whose lease
        // has not ended (grant.lua's live_head), when it is fair.
        let head = next
            .store
            .queue
            .iter()
            .find(|w| w.lease_end > next.now)
            .filter(|w| w.mode == WaitMode::Fair && next.store.lock.is_none())
            .map(|w| w.token);
        next.reserved_for = match (head, next.reserved_for) {
            (None, _) => None,
            (Some(t), Some((held_for, since))) if t == held_for => Some((t, since)),
            (Some(t), _) => Some((t, next.now)),
        };
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let store = Store::new(self.fence_mode, self.broken);
        vec![State {
            now: 0,
            replica: self.faults.failover.then(|| store.clone()),
            store,
            resource: Resource::default(),
            clients: vec![
                Client {
                    phase: Phase::Idle { waiting: false },
                    cycles: 0,
                    revoked: false,
                    refused: None,
                    inbox: None,
                };
                usize::from(self.clients)
            ],
            used: Faults::default(),
            last_accepted: None,
            fence_below_accepted: false,
            shared_fence: false,
            acked: 0,
            last_grant: None,
            fence_went_back: false,
            zombie: false,
            overlap: false,
            reserved_for: None,
            revocation: None,
            deposed_write: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.max_ticks {
            actions.push(Action::Tick);
        }
        for (i, c) in state.clients.iter().enumerate() {
            let i = i as u8;
            match c.phase {
                Phase::Idle { waiting } => {
                    actions.push(Action::Grant(i));
                    if self.faults.lost_reply && !state.used.lost_reply {
                        actions.push(Action::GrantReplyLost(i));
                    }
                    if waiting && self.wait_mode != WaitMode::Poll {
                        actions.push(Action::Leave(i));
                    }
                    if waiting && c.inbox.is_some() {
                        actions.push(Action::Wakeup(i));
                    }
                }
                Phase::HalfGranted { .. } => actions.push(Action::Incr(i)),
                Phase::Holding { step, .. } => {
                    actions.push(Action::Work(i));
                    if step != Step::Release {
                        actions.push(Action::Renew(i));
                    }
                }
                Phase::Done => {}
            }
        }
        let f = self.faults;
        let u = state.used;
        if f.lose_data && !u.lose_data && state.now < self.max_ticks {
            actions.push(Action::LoseData);
        }
        if f.failover && !u.failover && state.now < self.max_ticks {
            actions.push(Action::Failover);
        }
        if f.clock_back && !u.clock_back {
            actions.push(Action::ClockBack);
        }
        if f.clock_forward && !u.clock_forward {
            actions.push(Action::ClockForward);
        }
        if f.revoke && !u.revoke {
            actions.push(Action::Revoke);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        let before = state.store.clone();
        let now = state.now;
        match action {
            Action::Tick => next.now += 1,
            Action::Grant(i) | Action::GrantReplyLost(i) => {
                let i = usize::from(i);
                let c = next.clients[i];
                let tok = token(i as u8, c.cycles);
                let reply = next.store.grant(
                    now,
                    tok,
                    self.ttl,
                    self.wait_mode,
                    self.wait_mode != WaitMode::Poll,
                    self.waiter_lease,
                );
                if action == Action::GrantReplyLost(i as u8) {
                    next.used.lost_reply = true;
                    if let Grant::Granted(f) = reply {
                        // The client never heard: this grant is new, and
                        // its retry gets it back.
                        if !self.broken.two_command_acquire {
                            if next.last_grant.is_some_and(|last| f <= last) {
                                next.fence_went_back = true;
                            }
                            next.last_grant = Some(f);
                        }
                    }
                    next.clients[i].phase = Phase::Idle { waiting: true };
                } else {
                    match reply {
                        Grant::Granted(_) if self.broken.two_command_acquire => {
                            let retry = before.live_lock(now).is_some_and(|h| h.token == tok);
                            if retry {
                                return None;
                            }
                            next.clients[i].phase = Phase::HalfGranted {
                                sent: now,
                                before: next.last_grant,
                            };
                        }
                        Grant::Granted(f) => {
                            // A retry by the holding token, or a hand-over
                            // to it, is no new grant.
                            let retry = before.live_lock(now).is_some_and(|h| h.token == tok);
                            self.after_grant(&mut next, i, f, retry);
                        }
                        Grant::Held(seen) | Grant::Reserved(seen) => {
                            next.clients[i].phase = Phase::Idle { waiting: true };
                            if self.handover_wakeups {
                                next.clients[i].refused = Some((seen, now));
                            }
                        }
                    }
                }
            }
            Action::Incr(i) => {
                let i = usize::from(i);
                let Phase::HalfGranted { sent, before } = next.clients[i].phase else {
                    return None;
                };
                let f = next.store.finish_two_command_grant();
                // In grant order this grant came at its SET NX: a grant made
                // since then must have a higher fence than this one.
                if next.last_grant != before && next.last_grant.is_some_and(|later| later <= f) {
                    next.fence_went_back = true;
                }
                if next.last_grant == before {
                    next.last_grant = Some(f);
                }
                let step = if self.write_only {
                    Step::Read
                } else {
                    Step::Register
                };
                // Its lease started at the SET NX.
                next.clients[i].phase = Phase::Holding {
                    fence: f,
                    deadline: (sent + self.ttl).saturating_sub(self.drift),
                    step,
                };
            }
            Action::Renew(i) => {
                let i = usize::from(i);
                let Phase::Holding { fence, step, .. } = next.clients[i].phase else {
                    return None;
                };
                let tok = token(i as u8, next.clients[i].cycles);
                let lock_fence = if self.broken.two_command_acquire {
                    next.store.live_lock(now).map_or(fence, |h| h.fence)
                } else {
                    fence
                };
                let ours_before = before.live_lock(now).is_some_and(|h| h.token == tok);
                match next.store.extend(now, tok, lock_fence, self.ttl) {
                    1 => {
                        if !ours_before {
                            next.zombie = true;
                        }
                        next.clients[i].phase = Phase::Holding {
                            fence,
                            deadline: (now + self.ttl).saturating_sub(self.drift),
                            step,
                        };
                    }
                    // Lost: the loss signal stops the work.
                    _ => self.end_cycle(&mut next, i),
                }
            }
            Action::Work(i) => {
                let i = usize::from(i);
                let Phase::Holding {
                    fence,
                    deadline,
                    step,
                } = next.clients[i].phase
                else {
                    return None;
                };
                let tok = token(i as u8, next.clients[i].cycles);
                let ge = self.broken.ge_check;
                let holding = |step| Phase::Holding {
                    fence,
                    deadline,
                    step,
                };
                match step {
                    Step::Register => {
                        if next.resource.write(fence, tok, Change::Register, ge) {
                            Self::accepted(&mut next, fence, tok);
                            next.clients[i].phase = holding(Step::Read);
                        } else {
                            next.clients[i].phase = holding(Step::Release);
                        }
                    }
                    Step::Read => {
                        next.clients[i].phase = holding(Step::Write(next.resource.value));
                    }
                    Step::Write(v) => {
                        if next
                            .resource
                            .write(fence, tok, Change::Write(v.saturating_add(1)), ge)
                        {
                            Self::accepted(&mut next, fence, tok);
                            next.acked += 1;
                            if next.revocation.is_some_and(|r| fence <= r) {
                                next.deposed_write = true;
                            }
                        }
                        next.clients[i].phase = holding(Step::Release);
                    }
                    Step::Release => {
                        let lock_fence = if self.broken.two_command_acquire {
                            next.store.live_lock(now).map_or(fence, |h| h.fence)
                        } else {
                            fence
                        };
                        let (_, passed) = next.store.release(now, tok, lock_fence);
                        self.record_pass_on(&mut next, passed);
                        self.end_cycle(&mut next, i);
                    }
                }
            }
            Action::Wakeup(i) => {
                let i = usize::from(i);
                let c = next.clients[i];
                let (Some(fence), Some((seen, refused_at))) = (c.inbox, c.refused) else {
                    return None;
                };
                next.clients[i].inbox = None;
                let tok = token(i as u8, c.cycles);
                let step = if self.write_only {
                    Step::Read
                } else {
                    Step::Register
                };
                // handover_deadline: counted from the refused attempt,
                // taken only with a quarter of the hand-over lease left.
                let deadline = (refused_at + self.ttl).saturating_sub(self.drift);
                if deadline.saturating_sub(now) * 4 < self.ttl {
                    // Let go: its next attempt picks the lock up if it is
                    // still there.
                } else if self.trust_every_handover
                    || fencelock::testing::handover_is_fresh(seen, fencelock::Fence::new(fence))
                {
                    next.clients[i].phase = Phase::Holding {
                        fence,
                        deadline,
                        step,
                    };
                } else if next.store.extend(now, tok, fence, self.ttl) == 1 {
                    // Confirmed: the lease counts from the confirmation.
                    next.clients[i].phase = Phase::Holding {
                        fence,
                        deadline: (now + self.ttl).saturating_sub(self.drift),
                        step,
                    };
                }
            }
            Action::Leave(i) => {
                let i = usize::from(i);
                let tok = token(i as u8, next.clients[i].cycles);
                let (_, passed) = next.store.leave(now, tok);
                self.record_pass_on(&mut next, passed);
                // The acquisition gave up (timed out, cancelled): its cycle
                // ends, and the next one has a new token, as in the engine.
                // (Keeping the token would also let three fair clients hand
                // the lock around by leaving and queueing again, minting
                // fences forever without time passing.)
                self.end_cycle(&mut next, i);
            }
            Action::LoseData => {
                // A restart takes time: the clock has moved on when the
                // server takes commands again.
                next.used.lose_data = true;
                next.store.lose_data();
                next.now += 1;
            }
            Action::Failover => {
                // A failover takes time too.
                next.now += 1;
                next.used.failover = true;
                if let Some(replica) = &state.replica {
                    let mut promoted = replica.clone();
                    promoted.clock_step = next.store.clock_step;
                    next.store = promoted;
                }
            }
            Action::ClockBack => {
                next.used.clock_back = true;
                next.store.clock_step -= 2 * crate::store::CLOCK_PER_TICK as i64;
            }
            Action::ClockForward => {
                next.used.clock_forward = true;
                next.store.clock_step += 2 * crate::store::CLOCK_PER_TICK as i64;
            }
            Action::Revoke => {
                next.used.revoke = true;
                let (fence, deposed, passed) = next.store.revoke(now);
                if let Some((t, _)) = deposed {
                    let holder = next
                        .clients
                        .iter()
                        .enumerate()
                        .position(|(i, c)| token(i as u8, c.cycles) == t);
                    if let Some(i) = holder {
                        next.clients[i].revoked = true;
                    }
                }
                if !self.revoke_without_seal {
                    let ge = self.broken.ge_check;
                    if next
                        .resource
                        .write(fence, crate::store::REVOKED, Change::Seal, ge)
                    {
                        Self::accepted(&mut next, fence, crate::store::REVOKED);
                    }
                }
                // The revocation fence is minted in grant order.
                if next.last_grant.is_some_and(|last| fence <= last) {
                    next.fence_went_back = true;
                }
                next.last_grant = Some(fence);
                next.revocation = Some(fence);
                self.record_pass_on(&mut next, passed);
            }
        }
        let waited = match action {
            // A grant heard by its client (a new one or a retry: either
            // way the client waited for the replica before going on).
            Action::Grant(i) => {
                self.replicas != Replicated::Nothing
                    && matches!(next.clients[usize::from(i)].phase, Phase::Holding { .. })
            }
            Action::Revoke => self.replicas != Replicated::Nothing,
            Action::Renew(i) => {
                self.replicas == Replicated::GrantsAndRenewals
                    && matches!(next.clients[usize::from(i)].phase, Phase::Holding { .. })
            }
            _ => false,
        };
        if let Some(replica) = &mut next.replica
            && !matches!(action, Action::Failover | Action::LoseData)
        {
            if waited {
                // `WAIT`: the replica has every write up to this one.
                *replica = next.store.clone();
            } else if next.store != before {
                // The replica has every write but the last.
                *replica = before;
            }
        }
        self.settle(&mut next);
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
                s.resource.value == s.acked
            }),
            // C4: mutual exclusion among valid holders (excused across a
            // data loss or a failover, as documented).
            Property::always("C4 mutual exclusion", |m: &LockModel, s: &State| {
                !s.overlap || m.exclusion_excused(s)
            }),
            // C6: fences strictly increase in grant order (counter fences
            // excused across a data loss or failover).
            // C6: fences strictly increase in grant order. Excused: counter
            // fences across a data loss or failover; clock fences only
            // across a data loss or failover with a clock that stepped back
            // (docs/design.md §2.3's assumption).
            Property::always("C6 fences increase", |m: &LockModel, s: &State| {
                !s.fence_went_back
                    || (m.excused_by_data_loss(s)
                        && (m.fence_mode == FenceMode::Counter || s.used.clock_back))
            }),
            // C7: no renewal re-creates a lock that ended.
            Property::always("C7 no zombie renewal", |_, s: &State| !s.zombie),
            // Revoke: once a revoke returned, no write with a fence at or
            // below its revocation fence is accepted.
            Property::always("revoked holders are refused", |_, s: &State| {
                !s.deposed_write
            }),
            // Bounded liveness: a free lock stays reserved for one fair
            // head (refusing the others) for at most a waiter lease: the
            // head takes it or is dropped. (It stays reserved longer only
            // for one head after another, each letting its own waiter lease
            // run out, paused: a later head that acts in time takes it.)
            Property::always(
                "a free lock is reserved for one head at most a waiter lease",
                |m: &LockModel, s: &State| {
                    s.reserved_for
                        .is_none_or(|(_, since)| s.now - since <= m.waiter_lease)
                },
            ),
            // Every client can finish, and every fault is reached.
            Property::sometimes("every cycle done", |_, s: &State| {
                s.clients.iter().all(|c| c.phase == Phase::Done) && s.acked > 0
            }),
            // Every configured fault is reached (else a fault's checks would
            // pass by never running).
            Property::sometimes("every fault happened", |m: &LockModel, s: &State| {
                s.used == m.faults
            }),
        ]
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.now <= self.max_ticks
    }
}
