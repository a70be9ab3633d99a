//! The store of one lock name as the scripts see it, and each script as one
//! atomic transition: [`Store::grant`] (`grant_free.lua` + `grant_fast.lua` + `grant.lua`),
//! [`Store::release`] (`release_free.lua` + `release_fast.lua` + `release.lua`, `pass_on`),
//! [`Store::extend`] (`extend.lua`; `extend_many.lua` is one per lease),
//! [`Store::leave`] (`leave.lua`), the batches' items
//! [`Store::grant_batched`] (`grant_many.lua`) and [`Store::release_batched`]
//! (`release_many.lua`),
//! [`Store::revoke`] (`revoke.lua`); and the fenced resource's
//! [`Resource::write`] (`fenced_write.lua`: write, register, seal).
//!
//! Written from the scripts, branch for branch; where the model is coarser
//! it says so. Time is a tick counter (`now`); the server clock the clock
//! fence reads is `now * CLOCK_PER_TICK` plus a step the model may apply
//! (a clock stepping back or jumping forward). Keys expire lazily, as in
//! Redis: a lock whose `expires_at` is not after `now` is absent.
//!
//! Each switch in [`Broken`] is one deliberately broken rule (a negative
//! control): the model must find a counterexample with it.

/// Server clock units per tick: a clock fence is `max(last + 1, clock)`.
pub const CLOCK_PER_TICK: u64 = 10;

/// A client's holder token (the model's clients number their tokens).
pub type Token = u8;

/// How fences are minted (`FenceMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceMode {
    /// `max(last + 1, server clock)`: never backwards while the clock is not.
    Clock,
    /// `INCR`: restarts after the fence key is lost.
    Counter,
}

/// How a caller waits (`WaitMode`): `poll` never queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitMode {
    /// Retry; never queued.
    Poll,
    /// Queued; woken by a release, takes the lock with its own grant.
    Notify,
    /// Queued in order; a release hands the lock to the head.
    Fair,
}

/// Deliberately broken rules, each a negative control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Broken {
    /// The guide's acquire: `SET NX` then `INCR` in two steps (a grant that
    /// lands between them reads the same fence).
    pub two_command_acquire: bool,
    /// The resource accepts `fence >= stored`, ignoring the holder.
    pub ge_check: bool,
    /// Release by plain `DEL`, without comparing the token.
    pub unchecked_release: bool,
    /// Renewal re-creates an absent lock (`SET PX` instead of `PEXPIRE`).
    pub recreating_renewal: bool,
    /// The mint forgets `+ 1`: `max(last, clock)`.
    pub mint_without_increment: bool,
    /// A revoke that deposes without minting a fence above the holder's
    /// (its seal is then at the holder's own fence and the next grant may
    /// repeat it).
    pub revoke_without_mint: bool,
    /// A queued waiter's lease never ends (its `waiters` entry never
    /// written): a paused head keeps a free lock reserved for ever.
    pub endless_waiter_lease: bool,
}

/// The lock key: its holder, fence and expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// Whose token the value carries.
    pub token: Token,
    /// The fence in the value (`TOKEN:FENCE`).
    pub fence: u64,
    /// The tick at which the key expires.
    pub expires_at: u32,
}

/// A queued waiter (a queue member and its waiter lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// Its token.
    pub token: Token,
    /// `notify` or `fair`.
    pub mode: WaitMode,
    /// The tick its waiter lease ends.
    pub lease_end: u32,
    /// Its lock ttl, in ticks (a hand-over sets the lock for it).
    pub ttl: u32,
    /// The server clock when it first queued (the queue's score), when the
    /// store hands over to starving notify waiters ([`Store::starving`]);
    /// 0 otherwise (so that arrival times do not split states the checks
    /// never read).
    pub arrived: u64,
}

/// The keys of one lock name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Store {
    /// `LOCK`.
    pub lock: Option<Held>,
    /// `LOCK:fence`: the last fence issued.
    pub fence_key: Option<u64>,
    /// `LOCK:queue` with `LOCK:waiters`, in arrival order.
    pub queue: Vec<Waiter>,
    /// How fences are minted.
    pub mode: FenceMode,
    /// Added to `now * CLOCK_PER_TICK`: a clock that stepped (back when
    /// negative).
    pub clock_step: i64,
    /// The broken rules in force.
    pub broken: Broken,
    /// The guide layout: the lock value is the bare token (no fence), so a
    /// retry by the holding token gets the fence key's value back, and a
    /// release or extend compares the token alone. Off: `TOKEN:FENCE`.
    pub bare: bool,
    /// After how many server clock units of waiting a notify head is handed
    /// the lock like a fair one (`STARVATION_THRESHOLD`); `None`: never.
    /// The exhaustive model leaves it off (a starving notify head's
    /// hand-over is the fair head's transition, which it checks); the
    /// differential test sets it, since the real scripts do hand over.
    pub starving: Option<u64>,
}

/// A grant's reply (`GrantReply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grant {
    /// Granted with this fence (also a retry by the holding token).
    Granted(u64),
    /// Held by another; the fence stored now.
    Held(Option<u64>),
    /// Free but reserved for the head of a fair queue.
    Reserved(Option<u64>),
}

/// What a release or leave passed on to the head waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PassedOn {
    /// Nobody was waiting (or every waiter's lease had ended).
    Nobody,
    /// A notify head was woken: it takes the lock with its own grant.
    Woken(Token),
    /// A fair head was handed the lock with this fence.
    Handed(Token, u64),
}

impl Store {
    /// An empty store.
    pub fn new(mode: FenceMode, broken: Broken) -> Self {
        Store {
            lock: None,
            fence_key: None,
            queue: Vec::new(),
            mode,
            clock_step: 0,
            broken,
            bare: false,
            starving: None,
        }
    }

    /// The server clock at tick `now`.
    pub fn clock(&self, now: u32) -> u64 {
        let base = i64::from(now) * CLOCK_PER_TICK as i64;
        u64::try_from(base + self.clock_step).unwrap_or(0)
    }

    /// The lock, if it has not expired at `now`.
    pub fn live_lock(&self, now: u32) -> Option<Held> {
        self.lock.filter(|h| h.expires_at > now)
    }

    /// Drops what has expired at `now` (Redis expires keys lazily; the
    /// model drops them before each transition, which every script would
    /// observe the same way).
    pub fn expire(&mut self, now: u32) {
        if self.lock.is_some_and(|h| h.expires_at <= now) {
            self.lock = None;
        }
    }

    /// `next_fence` and `store_fence`: mints and stores the next fence.
    fn mint(&mut self, now: u32) -> u64 {
        let last = self.fence_key.unwrap_or(0);
        let next = match self.mode {
            FenceMode::Counter => last + 1,
            FenceMode::Clock if self.broken.mint_without_increment => last.max(self.clock(now)),
            FenceMode::Clock => (last + 1).max(self.clock(now)),
        };
        self.fence_key = Some(next);
        next
    }

    fn position(&self, token: Token) -> Option<usize> {
        self.queue.iter().position(|w| w.token == token)
    }

    /// `enqueue`: joins the queue (or keeps its place) with a renewed
    /// waiter lease.
    fn enqueue(&mut self, token: Token, mode: WaitMode, ttl: u32, now: u32, waiter_lease: u32) {
        let lease_end = if self.broken.endless_waiter_lease {
            u32::MAX
        } else {
            now + waiter_lease
        };
        let arrived = if self.starving.is_some() {
            self.clock(now)
        } else {
            0
        };
        match self.position(token) {
            Some(i) => self.queue[i].lease_end = lease_end,
            None => self.queue.push(Waiter {
                token,
                mode,
                lease_end,
                ttl,
                arrived,
            }),
        }
    }

    /// `live_head`: the first waiter whose lease has not ended; dead ones
    /// are dropped.
    fn live_head(&mut self, now: u32) -> Option<Waiter> {
        while let Some(head) = self.queue.first().copied() {
            if head.lease_end > now {
                return Some(head);
            }
            self.queue.remove(0);
        }
        None
    }

    /// One grant attempt (`grant.lua`; `grant_free.lua` and `grant_fast.lua`
    /// are its common cases and decide the same). `queues`: the caller has a queue member
    /// (notify and fair waiters); `waiter_lease` in ticks.
    pub fn grant(
        &mut self,
        now: u32,
        token: Token,
        ttl: u32,
        mode: WaitMode,
        queues: bool,
        waiter_lease: u32,
    ) -> Grant {
        self.expire(now);
        let last = self.fence_key;
        if let Some(held) = self.lock {
            // The fence a retry gets back: the value's, or in the guide
            // layout the fence key's (none stored: not recognised as a
            // retry, `grant.lua`'s `mine` is nil).
            let mine = match self.bare {
                false => Some(held.fence),
                true => self.fence_key,
            };
            if let Some(fence) = mine.filter(|_| held.token == token) {
                // A retry (or a lock handed over): the same grant back, the
                // lease restarted.
                self.lock = Some(Held {
                    expires_at: now + ttl,
                    ..held
                });
                if let Some(i) = self.position(token) {
                    self.queue.remove(i);
                }
                return Grant::Granted(fence);
            }
            if queues && mode != WaitMode::Poll {
                self.enqueue(token, mode, ttl, now, waiter_lease);
            }
            return Grant::Held(last);
        }
        if mode == WaitMode::Fair
            && let Some(head) = self.live_head(now)
            && head.token != token
        {
            if queues {
                self.enqueue(token, mode, ttl, now, waiter_lease);
            }
            return Grant::Reserved(last);
        }
        let fence = if self.broken.two_command_acquire {
            // SET NX first; the INCR is `finish_two_command_grant`.
            self.fence_key.unwrap_or(0) + 1
        } else {
            self.mint(now)
        };
        self.lock = Some(Held {
            token,
            fence,
            expires_at: now + ttl,
        });
        if let Some(i) = self.position(token) {
            self.queue.remove(i);
        }
        Grant::Granted(fence)
    }

    /// Whether the lock value of `held` is the one granted to `token` with
    /// `fence` (in the guide layout the value is the token alone).
    fn is_value(&self, held: Held, token: Token, fence: u64) -> bool {
        held.token == token && (self.bare || held.fence == fence)
    }

    /// One item of a batched grant (`grant_many.lua`): the common case of
    /// a caller that never queues, decided as [`Store::grant`] decides it;
    /// `None` when the item is sent back to go alone, nothing written (a
    /// retry by the token that holds the lock).
    pub fn grant_batched(&mut self, now: u32, token: Token, ttl: u32) -> Option<Grant> {
        self.expire(now);
        if self.lock.is_some_and(|h| h.token == token) {
            return None;
        }
        Some(self.grant(now, token, ttl, WaitMode::Poll, false, 0))
    }

    /// The second command of the guide's two-command acquire: `INCR` of
    /// the fence key, whose result the caller takes as its fence.
    pub fn finish_two_command_grant(&mut self) -> u64 {
        let next = self.fence_key.unwrap_or(0) + 1;
        self.fence_key = Some(next);
        next
    }

    /// Compare-and-delete, then pass on (`release.lua`). Returns 1
    /// released, 0 absent, -1 another holder's; and what was passed on.
    pub fn release(&mut self, now: u32, token: Token, fence: u64) -> (i8, PassedOn) {
        self.expire(now);
        match self.lock {
            None => (0, PassedOn::Nobody),
            Some(h) if self.broken.unchecked_release || self.is_value(h, token, fence) => {
                self.lock = None;
                (1, self.pass_on(now))
            }
            Some(_) => (-1, PassedOn::Nobody),
        }
    }

    /// One item of a batched release (`release_many.lua`): compare and
    /// delete when nobody is queued (1), 0 absent, -1 another holder's;
    /// `None` when the lock is this holder's but a queue exists (dead
    /// waiters too): sent back to go alone, nothing written.
    pub fn release_batched(&mut self, now: u32, token: Token, fence: u64) -> Option<i8> {
        self.expire(now);
        match self.lock {
            None => Some(0),
            Some(h) if self.broken.unchecked_release || self.is_value(h, token, fence) => {
                if !self.queue.is_empty() {
                    return None;
                }
                self.lock = None;
                Some(1)
            }
            Some(_) => Some(-1),
        }
    }

    /// `pass_on`: after the lock became free, hand it to a fair head, or a
    /// notify head that has waited [`Store::starving`] (its fence minted
    /// here, the lock set for its hand-over lease, modelled as its ttl), or
    /// wake a notify head.
    pub fn pass_on(&mut self, now: u32) -> PassedOn {
        let Some(head) = self.live_head(now) else {
            return PassedOn::Nobody;
        };
        let starved = self
            .starving
            .is_some_and(|after| self.clock(now).saturating_sub(head.arrived) >= after);
        if head.mode != WaitMode::Fair && !starved {
            return PassedOn::Woken(head.token);
        }
        let fence = self.mint(now);
        self.lock = Some(Held {
            token: head.token,
            fence,
            expires_at: now + head.ttl,
        });
        self.queue.remove(0);
        PassedOn::Handed(head.token, fence)
    }

    /// Compare-and-pexpire (`extend.lua`): 1 extended, 0 absent, -1
    /// another holder's. Never re-creates an absent lock (unless broken).
    pub fn extend(&mut self, now: u32, token: Token, fence: u64, ttl: u32) -> i8 {
        self.expire(now);
        match self.lock {
            Some(h) if self.is_value(h, token, fence) => {
                self.lock = Some(Held {
                    expires_at: now + ttl,
                    ..h
                });
                1
            }
            Some(_) => -1,
            None if self.broken.recreating_renewal => {
                self.lock = Some(Held {
                    token,
                    fence,
                    expires_at: now + ttl,
                });
                1
            }
            None => 0,
        }
    }

    /// A waiter gives up (`leave.lua`): leaves the queue; a lock handed to
    /// it is released and passed on, as is a free lock. Returns 2 when a
    /// lock handed to it was released, 1 when it was queued, 0 otherwise;
    /// and what was passed on.
    pub fn leave(&mut self, now: u32, token: Token) -> (i8, PassedOn) {
        self.expire(now);
        let mut code = 0;
        if let Some(i) = self.position(token) {
            self.queue.remove(i);
            code = 1;
        }
        match self.lock {
            Some(h) if h.token == token => {
                self.lock = None;
                (2, self.pass_on(now))
            }
            None => (code, self.pass_on(now)),
            Some(_) => (code, PassedOn::Nobody),
        }
    }

    /// A revoke (`revoke.lua`): deletes the lock whoever holds it, mints
    /// the revocation fence and passes the lock on. Returns the revocation
    /// fence and the deposed holder (token, fence if known).
    pub fn revoke(&mut self, now: u32) -> (u64, Option<(Token, Option<u64>)>, PassedOn) {
        let (fence, deposed) = self.depose(now);
        (fence, deposed, self.pass_on(now))
    }

    /// The first half of a revoke: deletes the lock and mints the
    /// revocation fence. `revoke.lua` reads the server clock again for its
    /// `pass_on` ([`Store::pass_on`]), which the differential test runs at
    /// that second instant.
    pub fn depose(&mut self, now: u32) -> (u64, Option<(Token, Option<u64>)>) {
        self.expire(now);
        // The deposed holder's fence: the value's, or in the guide layout
        // the last fence issued.
        let deposed = self.lock.map(|h| {
            let fence = if self.bare {
                self.fence_key
            } else {
                Some(h.fence)
            };
            (h.token, fence)
        });
        let held_fence = self.lock.map(|h| h.fence);
        self.lock = None;
        let fence = if self.broken.revoke_without_mint {
            held_fence.unwrap_or(self.fence_key.unwrap_or(0))
        } else {
            self.mint(now)
        };
        (fence, deposed)
    }

    /// A restart that lost every key (no persistence).
    pub fn lose_data(&mut self) {
        self.lock = None;
        self.fence_key = None;
        self.queue.clear();
    }
}

/// What a fenced write does when accepted (`fenced_write.lua`'s `op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Set the value.
    Write(u8),
    /// Record fence and holder only.
    Register,
    /// A revoke's seal: record the fence with the holder "revoked", also
    /// over an equal fence.
    Seal,
}

/// The holder a seal records (`REVOKED_HOLDER`): no token equals it.
pub const REVOKED: Token = u8::MAX;

/// A fenced resource (`FencedHash`): value, fence, holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Resource {
    /// The value (a counter in the model).
    pub value: u8,
    /// The highest accepted fence.
    pub fence: Option<u64>,
    /// Who wrote it.
    pub holder: Option<Token>,
}

impl Resource {
    /// The fence rule (`fence_accepts`), or the `>=` of the guide with
    /// `ge_check`; a seal takes an equal fence too. Returns whether the
    /// change was applied.
    pub fn write(&mut self, fence: u64, holder: Token, change: Change, ge_check: bool) -> bool {
        let accepted = match self.fence {
            None => true,
            Some(stored) if fence > stored => true,
            Some(stored) if fence == stored => {
                ge_check || change == Change::Seal || self.holder == Some(holder)
            }
            Some(_) => false,
        };
        if !accepted {
            return false;
        }
        self.fence = Some(fence);
        self.holder = Some(if change == Change::Seal {
            REVOKED
        } else {
            holder
        });
        if let Change::Write(v) = change {
            self.value = v;
        }
        true
    }
}
