//! Replaying an observed history through the store's transitions: does
//! some order of its operations, each taking effect at one instant between
//! its invocation and its completion, make every observed outcome the one
//! the scripts give? And if not, which is the first operation no such
//! order explains?
//!
//! The history is a list of [`Event`]s: an operation ([`Op`]) with the
//! time it was invoked, the time it completed (if it did) and what was
//! observed ([`Outcome`]). [`explain`] answers with a [`Verdict`]:
//! [`Verdict::Explained`], [`Verdict::Unexplained`] (the first operation
//! that cannot be explained, and why) or [`Verdict::Unknown`] (the search
//! exceeded its [`Bounds`] before deciding).
//!
//! # The search
//!
//! A linearizability search in the manner of Wing & Gong and Lowe's
//! just-in-time linearization, with the store's transitions
//! ([`Store::grant`], [`Store::release`], [`Store::revoke`],
//! [`Resource::write`]) as the specification. Events are visited in time
//! order. A set of configurations is kept: a state of the keys and the
//! open operations that already took effect in it. When an operation
//! completes, every configuration in which it has not yet taken effect is
//! extended by every order of open operations (and of the store's own
//! steps: an expiry, a failover) that ends with it, each required to give
//! its observed outcome; configurations revisited with the same state and
//! the same set of operations taken are kept once (memoized). The first
//! completion that leaves no configuration is the first operation the
//! store cannot explain: every prefix before it is explained, and no
//! extension is. Read-only operations (an observation of the lock key, a
//! read of the resource) that agree with a configuration's state take
//! effect at once: doing so never loses an explanation. A configuration
//! that can never meet the recorded outcome of an operation still open is
//! dropped (a grant whose fence is not above the fence key, with no data
//! loss or failover left before it completes to lower the key; a write
//! recorded as accepted below the resource's fence): this too loses no
//! explanation, but can notice a contradiction before the step that makes
//! it, so a search that finds one is run again without dropping any, and
//! the step reported is the exact first one (if that search exceeds the
//! bounds, the verdict is unknown, the contradiction in its reason).
//!
//! Each lock name is searched on its own (names share no key), and within
//! a name its lock keys and its audited resource separately: no
//! transition touches both (a revoke's seal is a write of the resource;
//! it may then be ordered before the revoke's deposing, which only widens
//! what is explained).
//!
//! # Soundness: what is allowed, so that a real history is never
//! "unexplained"
//!
//! - **Time.** Redis expires a key by its own clock, which the history does
//!   not record. A lock key may expire (a nondeterministic step) only once
//!   [`Params::min_lifetime`] has passed since a lower bound of the moment
//!   its script ran: the latest invocation among the operations ordered
//!   before it (each operation takes effect after its own invocation, and
//!   after every operation ordered before it). `min_lifetime` is the
//!   shortest lease any script sets (the ttl, or a hand-over lease) less
//!   the documented drift allowance (ttl / 100 + 2 ms: clock rates, timer
//!   lateness, Redis's millisecond truncation). Renewals are not recorded:
//!   they only move the expiry later, and a key may stay as long as the
//!   history needs it (a key kept too long is not checked).
//! - **Fences.** The server clock (clock fences) and the unobserved
//!   increments (counter fences: grants nobody was told of) are unknown:
//!   the store's mint is run with the server clock chosen to give the
//!   observed fence, so a grant must carry a fence above the last one
//!   issued, and nothing more is required of it. The fence key is tracked
//!   as a lower bound.
//! - **Grants nobody was told of.** An acquisition is many script calls:
//!   a hand-over whose lease ended before the waiter took it, or a grant
//!   that came too late, leaves a grant with the waiter's token that its
//!   acquisition never reports; a request delayed in the network can run
//!   after its acquisition gave up. Such *hidden* grants are taken only
//!   where the history shows them: an observation of the lock key (or a
//!   revoke's deposed holder) naming a holder that is not in the store.
//!   A holder with a recorded acquisition may hold such a grant once that
//!   acquisition was invoked; a holder the history never names (an
//!   acquisition that failed or never completed) once any such
//!   acquisition was invoked. A hidden grant may end at any moment (its
//!   acquisition released it, or it expired).
//! - **Indeterminate operations** (no reply: a timeout, a lost reply, a
//!   killed connection, an operation the run's end cut short) may take
//!   effect at any moment after their invocation, or never; they stay
//!   open until they can no longer change any configuration (a release
//!   whose lock is gone, a resource write below the stored fence). A
//!   failed acquisition is only a possible source of hidden grants (the
//!   grants that it could have made restrict, and are taken where seen).
//! - **Faults.** A restart that lost the data ([`Op::LoseData`]) empties
//!   the keys at one instant of its window. A failover ([`Op::Failover`])
//!   may replace the store by a stale copy at any instant of its window,
//!   any number of times: the lock key becomes unknown (any value; the
//!   next operation that depends on it decides which) and the fence key
//!   drops to the floor the history guarantees. A server clock jump
//!   ([`Op::ClockJump`]) may expire the current key at once. A restart
//!   with its data (`appendfsync always`) loses only writes nobody was
//!   told of: indeterminate operations, which may take no effect anyway.
//! - **Queues** (notify and fair waiters) are not recorded: they are left
//!   out. A queue only restricts who may be granted (a fair head's
//!   reservation) or hands a lock over inside a release, which is the same
//!   as the release followed by the waiter's grant.
//!
//! - **Releases sent twice.** A client that resends a call (a Cluster
//!   connection after an I/O error) may have its release run twice: with
//!   [`Params::repeated_releases`], "not ours" may follow its own deletion.
//!
//! # Bounds
//!
//! Both are sliding windows, so a long history is decided piece by piece:
//! at most [`Bounds::max_open`] operations open at once (invoked and not
//! completed, or indeterminate and still able to take effect), and at most
//! [`Bounds::max_states`] states visited to explain one operation. Past
//! either, that search (a name's lock keys, or its resource) stops with
//! [`Verdict::Unknown`], naming the step: everything before it was
//! explained, nothing after it is judged; the other searches go on. A
//! bound never makes a verdict "unexplained".

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;

use crate::store::{Broken, Change, FenceMode, Grant, Held, REVOKED, Resource, Store, Token};

/// A holder (one grant's token), as the caller numbers them.
pub type Holder = u32;

/// The holder a revoke's seal records (`REVOKED_HOLDER`): no grant has it.
pub const SEALED: Holder = Holder::MAX;

/// One operation of the history: what was asked, when, and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Who ran it (for the report only: a worker, the observer, a nemesis).
    pub client: u32,
    /// The lock name it concerns (and that name's audited resource); `None`
    /// for a fault of the whole store (a data loss, a failover, a clock
    /// jump), which concerns every name.
    pub name: Option<u32>,
    /// When it was invoked (any monotonic unit; µs in torture).
    pub invoked: i64,
    /// When it completed; `None`: never (indeterminate, whatever
    /// `outcome` says).
    pub completed: Option<i64>,
    /// What it did.
    pub op: Op,
    /// What was observed.
    pub outcome: Outcome,
}

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// One acquisition (every grant attempt of it) with `holder`'s token:
    /// [`Outcome::Granted`], or [`Outcome::Unknown`] when it failed or never
    /// completed.
    Acquire {
        /// Its token.
        holder: Holder,
    },
    /// A compare-and-delete of `holder`'s grant with `fence`:
    /// [`Outcome::Released`], [`Outcome::NotOurs`] or [`Outcome::Unknown`].
    Release {
        /// The grant's token.
        holder: Holder,
        /// The grant's fence.
        fence: u64,
    },
    /// A read of the lock key: [`Outcome::Lock`].
    Observe,
    /// A revoke (deposes whoever holds the lock, mints the revocation
    /// fence): [`Outcome::Revoked`] or [`Outcome::Unknown`].
    Revoke,
    /// A fenced registration at the resource (fence and holder only):
    /// [`Outcome::Accepted`], [`Outcome::Stale`] or [`Outcome::Unknown`].
    Register {
        /// The writer's token.
        holder: Holder,
        /// Its fence.
        fence: u64,
    },
    /// A fenced write of `value` at the resource: as [`Op::Register`].
    Write {
        /// The writer's token.
        holder: Holder,
        /// Its fence.
        fence: u64,
        /// The value written.
        value: i64,
    },
    /// A read of the resource's value: [`Outcome::Value`].
    Read,
    /// A revoke's seal of the resource at the revocation fence: as
    /// [`Op::Register`], with the holder [`SEALED`].
    Seal {
        /// The revocation fence.
        fence: u64,
    },
    /// A read of the resource's whole state: [`Outcome::Resource`].
    Final,
    /// A restart that lost every key, at one instant between invocation and
    /// completion: [`Outcome::Done`].
    LoseData,
    /// A failover to a replica that may lack the last writes, at any
    /// instant between invocation and completion ([`Outcome::Done`]).
    Failover {
        /// A fence the promoted replica holds for certain (the last grant
        /// every replica acknowledged), if any.
        floor: Option<u64>,
    },
    /// The server clock jumped forward (every current key may expire at
    /// once): [`Outcome::Done`].
    ClockJump,
}

/// A lock key's value: its holder and, where the layout stores it, fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seen {
    /// The holder in the key.
    pub holder: Holder,
    /// The fence in the key, if the value carries one.
    pub fence: Option<u64>,
}

/// Whom a revoke reported deposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deposed {
    /// Not reported.
    Unknown,
    /// The lock was free.
    Nobody,
    /// This holder's lock.
    Holder(Seen),
}

/// What an operation was observed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No reply: it may or may not have taken effect.
    Unknown,
    /// An acquisition's grant, with this fence.
    Granted(u64),
    /// A release deleted the lock.
    Released,
    /// A release found the lock gone or another's.
    NotOurs,
    /// The resource applied a registration, a write or a seal.
    Accepted,
    /// The resource refused it as stale.
    Stale,
    /// A read of the resource gave this value.
    Value(i64),
    /// A read of the lock key found this (`None`: absent).
    Lock(Option<Seen>),
    /// A revoke's reply.
    Revoked {
        /// The revocation fence, if told.
        fence: Option<u64>,
        /// Whom it deposed.
        deposed: Deposed,
    },
    /// A read of the resource's state.
    Resource {
        /// Its value.
        value: i64,
        /// Its fence.
        fence: Option<u64>,
        /// Its holder ([`SEALED`] after a seal).
        holder: Option<Holder>,
    },
    /// A fault that happened.
    Done,
}

/// What the store's timing allows: see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The shortest a lock key can live after the script that set it, in
    /// the history's time unit: the shortest lease a script sets (the
    /// ttl, or a hand-over lease) less the drift allowance.
    pub min_lifetime: i64,
    /// Whether a release's script may run more than once (a client that
    /// resends a call, as a Cluster connection does after an I/O error): a
    /// "not ours" may then follow its own deletion.
    pub repeated_releases: bool,
    /// How holders are named in the report (indexed by [`Holder`]; missing
    /// ones are `holder N`).
    pub labels: Vec<String>,
    /// How many time units make a second, for showing times in the report
    /// (`None`: shown as they are).
    pub units_per_second: Option<f64>,
}

impl Params {
    /// Parameters with the given shortest key lifetime.
    pub fn new(min_lifetime: i64) -> Self {
        Params {
            min_lifetime,
            repeated_releases: false,
            labels: Vec::new(),
            units_per_second: None,
        }
    }

    /// A time as the report shows it.
    fn time(&self, t: i64) -> String {
        match self.units_per_second {
            Some(per) if per > 0.0 => format!("{:.3} s", t as f64 / per),
            _ => t.to_string(),
        }
    }

    fn label(&self, holder: Holder) -> String {
        if holder == SEALED {
            return "the revoke's seal".to_string();
        }
        self.labels
            .get(holder as usize)
            .cloned()
            .unwrap_or_else(|| format!("holder {holder}"))
    }
}

/// How far a search may go before it answers [`Verdict::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// At most this many operations open at once in one search (invoked and
    /// not yet completed, or indeterminate and still able to take effect):
    /// a sliding window, at most 64.
    pub max_open: usize,
    /// At most this many states visited to explain one operation (every
    /// order of the operations open with it, from every configuration
    /// kept), and at most this many configurations kept between two
    /// operations: a sliding bound too.
    pub max_states: u64,
}

impl Default for Bounds {
    /// 64 open operations, 1,000,000 states per operation.
    fn default() -> Self {
        Bounds {
            max_open: 64,
            max_states: 1_000_000,
        }
    }
}

/// The answer of a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations gives every observed outcome.
    Explained {
        /// States visited.
        states: u64,
    },
    /// The first operation (by completion) that no order explains.
    Unexplained {
        /// Its index in the events.
        step: usize,
        /// Why, in words.
        why: String,
        /// States visited.
        states: u64,
    },
    /// The search exceeded its bounds before deciding (everything before
    /// `step` was explained).
    Unknown {
        /// Where it stopped: the event being processed, if any.
        step: Option<usize>,
        /// Which bound, in words.
        why: String,
        /// States visited.
        states: u64,
    },
}

impl Verdict {
    /// States visited.
    pub fn states(&self) -> u64 {
        match self {
            Verdict::Explained { states }
            | Verdict::Unexplained { states, .. }
            | Verdict::Unknown { states, .. } => *states,
        }
    }
}

/// Replays `events` through the store's transitions; the first operation
/// that cannot be explained across every name, else whether the bounds
/// stopped a search, else explained.
pub fn explain(events: &[Event], params: &Params, bounds: &Bounds) -> Verdict {
    let each = explain_each(events, params, bounds);
    let states = each.iter().map(|(_, v)| v.states()).sum();
    let completion = |step: usize| {
        events
            .get(step)
            .map_or(i64::MAX, |e| e.completed.unwrap_or(e.invoked))
    };
    let first = each
        .iter()
        .filter_map(|(_, v)| match v {
            Verdict::Unexplained { step, why, .. } => Some((completion(*step), *step, why)),
            _ => None,
        })
        .min_by_key(|(at, step, _)| (*at, *step));
    if let Some((_, step, why)) = first {
        return Verdict::Unexplained {
            step,
            why: why.clone(),
            states,
        };
    }
    let unknown = each.iter().find_map(|(_, v)| match v {
        Verdict::Unknown { step, why, .. } => Some((*step, why.clone())),
        _ => None,
    });
    match unknown {
        Some((step, why)) => Verdict::Unknown { step, why, states },
        None => Verdict::Explained { states },
    }
}

/// [`explain`] for each lock name on its own (names in ascending order),
/// its lock keys and its resource together.
pub fn explain_each(events: &[Event], params: &Params, bounds: &Bounds) -> Vec<(u32, Verdict)> {
    let mut names: Vec<u32> = events.iter().filter_map(|e| e.name).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let lock = search(|| LockKeys::new(events, name, params), events, name, bounds);
            let resource = search(|| Audited { params }, events, name, bounds);
            (name, combine(events, lock, resource))
        })
        .collect()
}

/// One component's search: pruned (states that can never meet the
/// recorded outcome of an operation still open are dropped), and, when
/// that finds a contradiction, again without pruning, so that the step
/// reported is the first whose completion leaves nothing (the pruned
/// search can notice earlier, from an outcome still to come).
fn search<C: Component>(
    component: impl Fn() -> C,
    events: &[Event],
    name: u32,
    bounds: &Bounds,
) -> Verdict {
    let pruned = Sweep::new(component(), events, name, bounds, true).run();
    let Verdict::Unexplained {
        why, states: first, ..
    } = pruned
    else {
        return pruned;
    };
    match Sweep::new(component(), events, name, bounds, false).run() {
        Verdict::Unexplained { step, why, states } => Verdict::Unexplained {
            step,
            why,
            states: first + states,
        },
        // The history cannot be explained, but where exactly is past the
        // bounds: unknown, with what was found.
        Verdict::Unknown {
            step: stopped,
            why: bound,
            states,
        } => Verdict::Unknown {
            step: stopped,
            why: format!(
                "{bound}; the history is not explained (no order met the outcomes recorded for operations still open before that: {why}), but where it first fails is past the bounds"
            ),
            states: first + states,
        },
        // Pruning never loses an explanation; were it to, the exact
        // search decides.
        Verdict::Explained { states } => Verdict::Explained {
            states: first + states,
        },
    }
}

/// One name's verdict from its two searches.
fn combine(events: &[Event], a: Verdict, b: Verdict) -> Verdict {
    let states = a.states() + b.states();
    let at = |step: usize| {
        events
            .get(step)
            .map_or(i64::MAX, |e| e.completed.unwrap_or(e.invoked))
    };
    match (a, b) {
        (
            Verdict::Unexplained {
                step: s1, why: w1, ..
            },
            Verdict::Unexplained {
                step: s2, why: w2, ..
            },
        ) => {
            let (step, why) = if (at(s1), s1) <= (at(s2), s2) {
                (s1, w1)
            } else {
                (s2, w2)
            };
            Verdict::Unexplained { step, why, states }
        }
        (Verdict::Unexplained { step, why, .. }, _)
        | (_, Verdict::Unexplained { step, why, .. }) => Verdict::Unexplained { step, why, states },
        (Verdict::Unknown { step, why, .. }, _) | (_, Verdict::Unknown { step, why, .. }) => {
            Verdict::Unknown { step, why, states }
        }
        _ => Verdict::Explained { states },
    }
}

/// Where a step is taken: a lower bound of its instant (`now`, the latest
/// invocation among the operations ordered before it) and the time of the
/// event being processed (`t`, an upper bound).
#[derive(Debug, Clone, Copy)]
struct Clock {
    now: i64,
    t: i64,
}

/// A state and a lower bound of its instant.
type Next<S> = (S, i64);

/// One of the two independent parts of a name: its lock keys, or its
/// resource.
trait Component {
    type State: Clone + Eq + Hash + std::fmt::Debug;

    fn initial(&self) -> Self::State;

    /// Whether `op` belongs to this part.
    fn owns(&self, op: &Op) -> bool;

    /// Whether `e` is a window of faults rather than an operation
    /// (a failover): open from invocation to completion.
    fn window(&self, e: &Event) -> bool {
        let _ = e;
        false
    }

    /// The states after `e` takes effect in `state` with its observed
    /// outcome (any outcome, for an indeterminate one), or why it cannot.
    fn apply(
        &self,
        e: &Event,
        state: &Self::State,
        c: Clock,
    ) -> Result<Vec<Next<Self::State>>, String>;

    /// The store's own steps from `state` at `c` (`open`: the windows open).
    fn internal(&self, state: &Self::State, c: Clock, open: &[&Event]) -> Vec<Next<Self::State>>;

    /// The states a window leaves possible when it closes, besides `state`.
    fn close(&self, e: &Event, state: &Self::State) -> Vec<Self::State> {
        let _ = (e, state);
        Vec::new()
    }

    /// Whether the indeterminate `e` can no longer change any of `states`
    /// (nor a state reached from them).
    fn retired(&self, e: &Event, states: &[&Self::State]) -> bool;

    /// Whether `state` can never explain `pending`, an operation still
    /// to complete with a recorded outcome, whatever happens before its
    /// completion from the event at `t` on (a fence below one that never
    /// comes down). Pruning such states loses no explanation.
    fn doomed(&self, state: &Self::State, pending: &Event, t: i64) -> bool {
        let _ = (state, pending, t);
        false
    }
}

/// The lock keys of one name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Lock {
    /// No key (or an expired one).
    Free,
    /// A key.
    Held {
        holder: Holder,
        /// `None`: not known (a hidden grant in a layout without fences).
        fence: Option<u64>,
        /// A lower bound of when its script ran (its expiry is at least
        /// `min_lifetime` later).
        since: i64,
        /// A grant nobody was told of: it may end at any moment.
        hidden: bool,
    },
    /// Anything (after a failover): the next operation decides.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Keys {
    lock: Lock,
    /// The fence key is at least this (0: absent or unknown).
    floor: u64,
}

/// Tokens for the store's transitions: the acting holder, and the others.
const ACTOR: Token = 1;
const OTHER: Token = 2;

struct LockKeys<'a> {
    params: &'a Params,
    /// Each known holder's acquisition: invoked, and its fence if granted.
    sources: HashMap<Holder, (i64, Option<u64>)>,
    /// The first invocation of an acquisition that failed or never
    /// completed: from then on a holder the history never names may hold
    /// the lock.
    anonymous_from: Option<i64>,
    /// The windows of the faults that lower the fence key (a data loss, a
    /// failover): (invoked, completed).
    resets: Vec<(i64, Option<i64>)>,
}

impl<'a> LockKeys<'a> {
    fn new(events: &[Event], name: u32, params: &'a Params) -> Self {
        let mut sources: HashMap<Holder, (i64, Option<u64>)> = HashMap::new();
        let mut anonymous_from: Option<i64> = None;
        for e in events.iter().filter(|e| e.name == Some(name)) {
            let Op::Acquire { holder } = e.op else {
                continue;
            };
            match (e.outcome, e.completed) {
                (Outcome::Granted(f), Some(_)) => {
                    sources.insert(holder, (e.invoked, Some(f)));
                }
                _ => {
                    sources.entry(holder).or_insert((e.invoked, None));
                    anonymous_from = Some(anonymous_from.map_or(e.invoked, |a| a.min(e.invoked)));
                }
            }
        }
        let resets = events
            .iter()
            .filter(|e| e.name.is_none_or(|n| n == name))
            .filter(|e| matches!(e.op, Op::LoseData | Op::Failover { .. }))
            .map(|e| (e.invoked, e.completed))
            .collect();
        LockKeys {
            params,
            sources,
            anonymous_from,
            resets,
        }
    }

    /// The store's view of `keys` for `actor` (ACTOR its own grant, OTHER
    /// anyone else's), with the server clock chosen as `clock`.
    fn store(&self, keys: &Keys, actor: Holder, unknown_fence: u64, clock: u64) -> Store {
        let mut store = Store::new(FenceMode::Clock, Broken::default());
        store.lock = match keys.lock {
            Lock::Held { holder, fence, .. } => Some(Held {
                token: if holder == actor { ACTOR } else { OTHER },
                fence: fence.unwrap_or(unknown_fence),
                expires_at: u32::MAX,
            }),
            Lock::Free | Lock::Unknown => None,
        };
        store.fence_key = (keys.floor > 0).then_some(keys.floor);
        store.clock_step = i64::try_from(clock).unwrap_or(i64::MAX);
        store
    }

    /// Why the key held by someone else stands in the way.
    fn held_by(&self, keys: &Keys) -> String {
        match keys.lock {
            Lock::Held {
                holder,
                fence,
                since,
                hidden,
            } => {
                let fence = fence.map_or(String::new(), |f| format!(" (fence {f})"));
                let expiry = since.saturating_add(self.params.min_lifetime);
                let how = if hidden {
                    ", a grant nobody was told of".to_string()
                } else {
                    format!(
                        ", which could not have expired before {}",
                        self.params.time(expiry)
                    )
                };
                format!(
                    "the lock was held by {}{fence}{how}",
                    self.params.label(holder)
                )
            }
            Lock::Free => "the lock was free".to_string(),
            Lock::Unknown => "the lock was unknown".to_string(),
        }
    }

    /// A grant to `holder` that nobody was told of, with `fence` if seen,
    /// taken before the observation `e` (see the module docs).
    fn hidden_grant(
        &self,
        keys: &Keys,
        holder: Holder,
        fence: Option<u64>,
        e: &Event,
        c: Clock,
    ) -> Result<Next<Keys>, String> {
        let before = e.completed.unwrap_or(i64::MAX);
        let from = match self.sources.get(&holder) {
            Some(&(_, Some(f))) if Some(f) == fence => {
                return Err(format!(
                    "{}'s own grant (fence {f}) was not in the store",
                    self.params.label(holder)
                ));
            }
            Some(&(invoked, _)) if invoked <= before => invoked,
            Some(_) => {
                return Err(format!(
                    "{} had not asked for the lock yet",
                    self.params.label(holder)
                ));
            }
            None => match self.anonymous_from {
                Some(invoked) if invoked <= before => invoked,
                _ => {
                    return Err(format!(
                        "{} holds no recorded grant, and no acquisition had failed that could have made one",
                        self.params.label(holder)
                    ));
                }
            },
        };
        let mut store = self.store(keys, holder, 0, fence.unwrap_or(0));
        match store.grant(0, ACTOR, 1, crate::store::WaitMode::Poll, false, 0) {
            Grant::Granted(g) if fence.is_none_or(|f| f == g) => {
                let since = c.now.max(from);
                Ok((
                    Keys {
                        lock: Lock::Held {
                            holder,
                            fence,
                            since,
                            hidden: true,
                        },
                        floor: store.fence_key.unwrap_or(0).max(keys.floor),
                    },
                    since,
                ))
            }
            Grant::Granted(_) => Err(format!(
                "fence {} is not above the last fence issued (at least {})",
                fence.unwrap_or(0),
                keys.floor
            )),
            Grant::Held(_) | Grant::Reserved(_) => Err(self.held_by(keys)),
        }
    }

    /// The key holds `holder`'s grant with `fence` (if known): as it is,
    /// or resolved from unknown, or by a hidden grant.
    fn holding(&self, keys: &Keys, seen: Seen, e: &Event, c: Clock) -> Result<Next<Keys>, String> {
        let compatible = |f: Option<u64>| match (f, seen.fence) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        match keys.lock {
            Lock::Held {
                holder,
                fence,
                since,
                hidden,
            } if holder == seen.holder && compatible(fence) => Ok((
                Keys {
                    lock: Lock::Held {
                        holder,
                        fence: fence.or(seen.fence),
                        since,
                        hidden,
                    },
                    floor: keys.floor.max(seen.fence.unwrap_or(0)),
                },
                c.now,
            )),
            Lock::Unknown => Ok((
                Keys {
                    lock: Lock::Held {
                        holder: seen.holder,
                        fence: seen.fence,
                        since: i64::MIN,
                        hidden: true,
                    },
                    floor: keys.floor.max(seen.fence.unwrap_or(0)),
                },
                c.now,
            )),
            Lock::Free => self.hidden_grant(keys, seen.holder, seen.fence, e, c),
            Lock::Held { .. } => Err(self.held_by(keys)),
        }
    }

    fn acquire(
        &self,
        keys: &Keys,
        holder: Holder,
        fence: u64,
        e: &Event,
        c: Clock,
    ) -> Result<Vec<Next<Keys>>, String> {
        let since = c.now.max(e.invoked);
        let granted = |floor: u64| {
            vec![(
                Keys {
                    lock: Lock::Held {
                        holder,
                        fence: Some(fence),
                        since,
                        hidden: false,
                    },
                    floor: floor.max(fence),
                },
                since,
            )]
        };
        if keys.lock == Lock::Unknown {
            // Free, or this holder's own grant already.
            return Ok(granted(keys.floor));
        }
        let mut store = self.store(keys, holder, fence, fence);
        match store.grant(0, ACTOR, 1, crate::store::WaitMode::Poll, false, 0) {
            Grant::Granted(g) if g == fence => Ok(granted(store.fence_key.unwrap_or(0))),
            Grant::Granted(g) if matches!(keys.lock, Lock::Held { .. }) => Err(format!(
                "the lock already held {}'s grant with fence {g}, which a retry gets back",
                self.params.label(holder)
            )),
            Grant::Granted(_) => Err(format!(
                "fence {fence} is not above the last fence issued (at least {})",
                keys.floor
            )),
            Grant::Held(_) | Grant::Reserved(_) => Err(self.held_by(keys)),
        }
    }

    fn release(
        &self,
        keys: &Keys,
        holder: Holder,
        fence: u64,
        outcome: Outcome,
        c: Clock,
    ) -> Result<Vec<Next<Keys>>, String> {
        let freed = || Keys {
            lock: Lock::Free,
            floor: keys.floor,
        };
        if keys.lock == Lock::Unknown {
            return Ok(match outcome {
                Outcome::Released => vec![(freed(), c.now)],
                // Anything but this grant: still unknown.
                Outcome::NotOurs => vec![(keys.clone(), c.now)],
                _ => vec![(freed(), c.now)],
            });
        }
        let mut store = self.store(keys, holder, fence, 0);
        let (code, _) = store.release(0, ACTOR, fence);
        match (outcome, code) {
            (Outcome::Released, 1) => Ok(vec![(freed(), c.now)]),
            (Outcome::Released, _) => Err(match keys.lock {
                Lock::Free => "the lock was gone (expired, released or deposed)".to_string(),
                _ => self.held_by(keys),
            }),
            (Outcome::NotOurs, 1) if self.params.repeated_releases => Ok(vec![(freed(), c.now)]),
            (Outcome::NotOurs, 1) => Err(format!(
                "its lock (fence {fence}) was still in the store{}",
                match keys.lock {
                    Lock::Held { since, .. } => format!(
                        " and could not have expired before {}",
                        self.params
                            .time(since.saturating_add(self.params.min_lifetime))
                    ),
                    _ => String::new(),
                }
            )),
            (Outcome::NotOurs, _) => Ok(vec![(keys.clone(), c.now)]),
            // Indeterminate: its effect, if any.
            (_, 1) => Ok(vec![(freed(), c.now)]),
            _ => Ok(Vec::new()),
        }
    }

    fn revoke(
        &self,
        keys: &Keys,
        fence: Option<u64>,
        deposed: Deposed,
        e: &Event,
        c: Clock,
    ) -> Result<Vec<Next<Keys>>, String> {
        let (before, now) = match deposed {
            Deposed::Unknown => (keys.clone(), c.now),
            Deposed::Nobody => match keys.lock {
                Lock::Free | Lock::Unknown => (
                    Keys {
                        lock: Lock::Free,
                        floor: keys.floor,
                    },
                    c.now,
                ),
                Lock::Held { .. } => {
                    return Err(format!(
                        "{}: the revoke would have deposed it",
                        self.held_by(keys)
                    ));
                }
            },
            Deposed::Holder(seen) => self.holding(keys, seen, e, c)?,
        };
        let unknown = fence.is_none();
        let mut store = self.store(&before, SEALED, 0, fence.unwrap_or(0));
        let (minted, _) = store.depose(0);
        if !unknown && Some(minted) != fence {
            return Err(format!(
                "revocation fence {} is not above the last fence issued (at least {})",
                fence.unwrap_or(0),
                before.floor
            ));
        }
        Ok(vec![(
            Keys {
                lock: Lock::Free,
                floor: store.fence_key.unwrap_or(0).max(before.floor),
            },
            now.max(e.invoked),
        )])
    }
}

impl Component for LockKeys<'_> {
    type State = Keys;

    fn initial(&self) -> Keys {
        Keys {
            lock: Lock::Free,
            floor: 0,
        }
    }

    fn owns(&self, op: &Op) -> bool {
        matches!(
            op,
            Op::Acquire { .. }
                | Op::Release { .. }
                | Op::Observe
                | Op::Revoke
                | Op::LoseData
                | Op::Failover { .. }
                | Op::ClockJump
        )
    }

    fn window(&self, e: &Event) -> bool {
        matches!(e.op, Op::Failover { .. })
    }

    fn apply(&self, e: &Event, keys: &Keys, c: Clock) -> Result<Vec<Next<Keys>>, String> {
        let determinate = e.completed.is_some() && e.outcome != Outcome::Unknown;
        // It takes effect after its invocation, and so does every step
        // ordered after it.
        let c = Clock {
            now: c.now.max(e.invoked),
            t: c.t,
        };
        match (e.op, e.outcome) {
            (Op::Acquire { holder }, Outcome::Granted(fence)) if determinate => {
                self.acquire(keys, holder, fence, e, c)
            }
            // A failed acquisition is only a source of hidden grants.
            (Op::Acquire { .. }, _) => Ok(Vec::new()),
            (Op::Release { holder, fence }, outcome) => {
                let outcome = if determinate {
                    outcome
                } else {
                    Outcome::Unknown
                };
                self.release(keys, holder, fence, outcome, c)
            }
            (Op::Observe, Outcome::Lock(None)) => match keys.lock {
                Lock::Free | Lock::Unknown => Ok(vec![(
                    Keys {
                        lock: Lock::Free,
                        floor: keys.floor,
                    },
                    c.now,
                )]),
                Lock::Held { .. } => Err(self.held_by(keys)),
            },
            (Op::Observe, Outcome::Lock(Some(seen))) => {
                self.holding(keys, seen, e, c).map(|n| vec![n])
            }
            (Op::Revoke, Outcome::Revoked { fence, deposed }) if determinate => {
                self.revoke(keys, fence, deposed, e, c)
            }
            (Op::Revoke, _) => self.revoke(keys, None, Deposed::Unknown, e, c),
            (Op::LoseData, _) => {
                let mut store = self.store(keys, SEALED, 0, 0);
                store.lose_data();
                Ok(vec![(
                    Keys {
                        lock: Lock::Free,
                        floor: store.fence_key.unwrap_or(0),
                    },
                    c.now.max(e.invoked),
                )])
            }
            (Op::ClockJump, _) => Ok(vec![(
                Keys {
                    lock: match keys.lock {
                        Lock::Held {
                            holder,
                            fence,
                            hidden,
                            ..
                        } => Lock::Held {
                            holder,
                            fence,
                            since: i64::MIN,
                            hidden,
                        },
                        ref other => other.clone(),
                    },
                    floor: keys.floor,
                },
                c.now,
            )]),
            (op, outcome) => Err(format!("{op:?} cannot have the outcome {outcome:?}")),
        }
    }

    fn internal(&self, keys: &Keys, c: Clock, open: &[&Event]) -> Vec<Next<Keys>> {
        let mut next = Vec::new();
        if let Lock::Held { since, hidden, .. } = keys.lock {
            let expiry = since.saturating_add(self.params.min_lifetime);
            let free = Keys {
                lock: Lock::Free,
                floor: keys.floor,
            };
            if hidden {
                next.push((free, c.now));
            } else if c.t >= expiry {
                next.push((free, c.now.max(expiry)));
            }
        }
        let floor = open
            .iter()
            .filter_map(|e| match e.op {
                Op::Failover { floor } => Some(floor.unwrap_or(0)),
                _ => None,
            })
            .min();
        if let Some(floor) = floor {
            let stale = Keys {
                lock: Lock::Unknown,
                floor: keys.floor.min(floor),
            };
            if stale != *keys {
                next.push((stale, c.now));
            }
        }
        next
    }

    fn close(&self, e: &Event, keys: &Keys) -> Vec<Keys> {
        match e.op {
            Op::Failover { floor } => vec![Keys {
                lock: Lock::Unknown,
                floor: keys.floor.min(floor.unwrap_or(0)),
            }],
            _ => Vec::new(),
        }
    }

    fn retired(&self, e: &Event, states: &[&Keys]) -> bool {
        match e.op {
            // Only this grant's key, unhidden, could still be deleted by it
            // (an unknown key may be taken as free anyway, a hidden one
            // may end anyway); and that key never comes back.
            Op::Release { holder, fence } => !states.iter().any(|k| {
                matches!(k.lock, Lock::Held { holder: h, fence: f, hidden: false, .. }
                    if h == holder && f.is_none_or(|f| f == fence))
            }),
            Op::Acquire { .. } | Op::Observe => true,
            _ => false,
        }
    }

    fn doomed(&self, keys: &Keys, pending: &Event, t: i64) -> bool {
        let (Op::Acquire { holder }, Outcome::Granted(fence)) = (pending.op, pending.outcome)
        else {
            return false;
        };
        if fence > keys.floor {
            return false;
        }
        let retry = match keys.lock {
            Lock::Held {
                holder: h,
                fence: f,
                ..
            } => h == holder && f.is_none_or(|f| f == fence),
            Lock::Unknown => true,
            Lock::Free => false,
        };
        // The fence key only comes down by a fault still to come before
        // the grant completes.
        let done = pending.completed.unwrap_or(i64::MAX);
        let reset = self
            .resets
            .iter()
            .any(|&(from, to)| from <= done && to.is_none_or(|to| to >= t));
        !retry && !reset
    }
}

/// The audited resource of one name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Stored {
    value: i64,
    fence: Option<u64>,
    holder: Option<Holder>,
}

struct Audited<'a> {
    params: &'a Params,
}

impl Audited<'_> {
    fn describe(&self, s: &Stored) -> String {
        match (s.fence, s.holder) {
            (Some(f), Some(h)) => format!("fence {f} from {}", self.params.label(h)),
            (Some(f), None) => format!("fence {f}"),
            _ => "no fence".to_string(),
        }
    }

    /// `fenced_write.lua` on `s`: whether it applies, and the state after.
    fn write(&self, s: &Stored, holder: Holder, fence: u64, change: Change) -> (bool, Stored) {
        let token = |h: Holder| {
            if h == SEALED {
                REVOKED
            } else if h == holder {
                ACTOR
            } else {
                OTHER
            }
        };
        let mut r = Resource {
            value: 0,
            fence: s.fence,
            holder: s.holder.map(token),
        };
        let actor = if change == Change::Seal {
            REVOKED
        } else {
            ACTOR
        };
        if !r.write(fence, actor, change, false) {
            return (false, s.clone());
        }
        (
            true,
            Stored {
                value: s.value,
                fence: r.fence,
                holder: Some(if change == Change::Seal {
                    SEALED
                } else {
                    holder
                }),
            },
        )
    }
}

impl Component for Audited<'_> {
    type State = Stored;

    fn initial(&self) -> Stored {
        Stored {
            value: 0,
            fence: None,
            holder: None,
        }
    }

    fn owns(&self, op: &Op) -> bool {
        matches!(
            op,
            Op::Register { .. } | Op::Write { .. } | Op::Read | Op::Seal { .. } | Op::Final
        )
    }

    fn apply(&self, e: &Event, s: &Stored, c: Clock) -> Result<Vec<Next<Stored>>, String> {
        let determinate = e.completed.is_some() && e.outcome != Outcome::Unknown;
        let now = c.now.max(e.invoked);
        let (holder, fence, change, value) = match e.op {
            Op::Register { holder, fence } => (holder, fence, Change::Register, None),
            Op::Write {
                holder,
                fence,
                value,
            } => (holder, fence, Change::Write(0), Some(value)),
            Op::Seal { fence } => (SEALED, fence, Change::Seal, None),
            Op::Read => {
                return match e.outcome {
                    Outcome::Value(v) if v == s.value => Ok(vec![(s.clone(), c.now)]),
                    Outcome::Value(_) => Err(format!("the resource held the value {}", s.value)),
                    _ if !determinate => Ok(Vec::new()),
                    other => Err(format!("a read cannot have the outcome {other:?}")),
                };
            }
            Op::Final => {
                return match e.outcome {
                    Outcome::Resource {
                        value,
                        fence,
                        holder,
                    } if value == s.value && fence == s.fence && holder == s.holder => {
                        Ok(vec![(s.clone(), c.now)])
                    }
                    Outcome::Resource { .. } => Err(format!(
                        "the resource held the value {} with {}",
                        s.value,
                        self.describe(s)
                    )),
                    _ if !determinate => Ok(Vec::new()),
                    other => Err(format!("a read cannot have the outcome {other:?}")),
                };
            }
            op => return Err(format!("{op:?} is not an operation of the resource")),
        };
        let (applied, mut after) = self.write(s, holder, fence, change);
        if applied && let Some(v) = value {
            after.value = v;
        }
        match (determinate, e.outcome, applied) {
            (true, Outcome::Accepted, true) => Ok(vec![(after, now)]),
            (true, Outcome::Accepted, false) => Err(format!(
                "the resource held {}, which refuses fence {fence}",
                self.describe(s)
            )),
            (true, Outcome::Stale, false) => Ok(vec![(after, now)]),
            (true, Outcome::Stale, true) => Err(format!(
                "the resource held {}, which accepts fence {fence}",
                self.describe(s)
            )),
            (true, other, _) => Err(format!("a fenced write cannot have the outcome {other:?}")),
            // Indeterminate: its effect, if it has one.
            (false, _, true) if after != *s => Ok(vec![(after, now)]),
            (false, _, _) => Ok(Vec::new()),
        }
    }

    fn internal(&self, _: &Stored, _: Clock, _: &[&Event]) -> Vec<Next<Stored>> {
        Vec::new()
    }

    fn retired(&self, e: &Event, states: &[&Stored]) -> bool {
        // The stored fence never goes down: a write below it is refused
        // from then on.
        let fence = match e.op {
            Op::Register { fence, .. } | Op::Write { fence, .. } | Op::Seal { fence } => fence,
            _ => return true,
        };
        states.iter().all(|s| s.fence.is_some_and(|f| f > fence))
    }

    fn doomed(&self, s: &Stored, pending: &Event, _: i64) -> bool {
        // The stored fence never comes down: a write below it (or at it,
        // from another holder) is refused from then on.
        let (holder, fence, change) = match pending.op {
            Op::Register { holder, fence } | Op::Write { holder, fence, .. } => {
                (holder, fence, Change::Register)
            }
            Op::Seal { fence } => (SEALED, fence, Change::Seal),
            _ => return false,
        };
        pending.outcome == Outcome::Accepted && !self.write(s, holder, fence, change).0
    }
}

/// The configurations of one search: a state, the open operations that
/// took effect in it (a bit per slot), and the lowest instant it can be
/// at (lower is more permissive, so a state reached twice keeps the lower).
type Configs<S> = HashMap<(S, u64), i64>;

fn keep<S: Eq + Hash>(configs: &mut Configs<S>, key: (S, u64), now: i64) -> bool {
    match configs.entry(key) {
        Entry::Occupied(mut o) => {
            if now < *o.get() {
                o.insert(now);
                true
            } else {
                false
            }
        }
        Entry::Vacant(v) => {
            v.insert(now);
            true
        }
    }
}

/// What the sweep does at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mark {
    Invoke,
    Complete,
}

/// The just-in-time search of one component of one name.
struct Sweep<'e, C: Component> {
    component: C,
    events: &'e [Event],
    /// (time, what, event index), in time order.
    timeline: Vec<(i64, Mark, usize)>,
    bounds: &'e Bounds,
    /// The event in each slot of the open operations.
    slots: Vec<Option<usize>>,
    configs: Configs<C::State>,
    states: u64,
    /// Whether states that can never meet an open operation's recorded
    /// outcome are dropped.
    prune: bool,
}

/// Whether `e` has a recorded outcome to meet (else it may take effect or
/// not, at any time after its invocation).
fn determinate(e: &Event) -> bool {
    e.completed.is_some() && e.outcome != Outcome::Unknown
}

/// Why a search stopped.
enum Stop {
    Unexplained(usize, String),
    Unknown(Option<usize>, String),
}

impl<'e, C: Component> Sweep<'e, C> {
    fn new(component: C, events: &'e [Event], name: u32, bounds: &'e Bounds, prune: bool) -> Self {
        let mut timeline = Vec::new();
        for (i, e) in events.iter().enumerate() {
            if !component.owns(&e.op) || e.name.is_some_and(|n| n != name) {
                continue;
            }
            timeline.push((e.invoked, Mark::Invoke, i));
            let closes = determinate(e) || (component.window(e) && e.completed.is_some());
            if closes && let Some(done) = e.completed {
                timeline.push((done.max(e.invoked), Mark::Complete, i));
            }
        }
        // Invocations first at equal times: operations that may overlap
        // are taken to (the more permissive reading).
        timeline.sort();
        let mut configs = HashMap::new();
        configs.insert((component.initial(), 0u64), i64::MIN);
        Sweep {
            component,
            events,
            timeline,
            bounds,
            slots: Vec::new(),
            configs,
            states: 0,
            prune,
        }
    }

    fn run(mut self) -> Verdict {
        let timeline = std::mem::take(&mut self.timeline);
        for &(t, mark, i) in &timeline {
            let done = match mark {
                Mark::Invoke => self.invoke(i),
                Mark::Complete if self.component.window(&self.events[i]) => {
                    self.close(i);
                    Ok(())
                }
                Mark::Complete => self.complete(i, t),
            };
            if let Err(stop) = done {
                return match stop {
                    Stop::Unexplained(step, why) => Verdict::Unexplained {
                        step,
                        why,
                        states: self.states,
                    },
                    Stop::Unknown(step, why) => Verdict::Unknown {
                        step,
                        why,
                        states: self.states,
                    },
                };
            }
            self.settle(t);
        }
        Verdict::Explained {
            states: self.states,
        }
    }

    fn slot_of(&self, i: usize) -> Option<usize> {
        self.slots.iter().position(|s| *s == Some(i))
    }

    fn open(&self) -> Vec<&'e Event> {
        let events = self.events;
        self.slots
            .iter()
            .flatten()
            .filter(|&&i| self.component.window(&events[i]))
            .map(|&i| &events[i])
            .collect()
    }

    fn invoke(&mut self, i: usize) -> Result<(), Stop> {
        let free = self.slots.iter().position(Option::is_none);
        match free {
            Some(s) => self.slots[s] = Some(i),
            None if self.slots.len() < self.bounds.max_open.min(64) => self.slots.push(Some(i)),
            None => {
                return Err(Stop::Unknown(
                    Some(i),
                    format!(
                        "more than {} operations open at once",
                        self.bounds.max_open.min(64)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A window closes: each configuration may also be left in the states
    /// the window's fault leaves possible.
    fn close(&mut self, i: usize) {
        let Some(s) = self.slot_of(i) else { return };
        let mut next = HashMap::new();
        for ((state, bits), now) in std::mem::take(&mut self.configs) {
            for after in self.component.close(&self.events[i], &state) {
                keep(&mut next, (after, bits), now);
            }
            keep(&mut next, (state, bits), now);
        }
        self.configs = next;
        self.slots[s] = None;
    }

    /// Operation `i` completes at `t`: every configuration in which it has
    /// not taken effect yet is extended, by every order of open operations
    /// and internal steps, until it has.
    fn complete(&mut self, i: usize, t: i64) -> Result<(), Stop> {
        let Some(slot) = self.slot_of(i) else {
            return Ok(());
        };
        let bit = 1u64 << slot;
        let open = self.open();
        let before = std::mem::take(&mut self.configs);
        let mut next: Configs<C::State> = HashMap::new();
        // Why the operation failed: in the configurations as they stood,
        // and after other orders.
        let mut stood: HashMap<String, u64> = HashMap::new();
        let mut reasons: HashMap<String, u64> = HashMap::new();
        let mut visited: Configs<C::State> = HashMap::new();
        let mut queue: Vec<(C::State, u64, i64, bool)> = Vec::new();
        for ((state, bits), now) in &before {
            if bits & bit != 0 {
                keep(&mut next, (state.clone(), bits & !bit), *now);
            } else if keep(&mut visited, (state.clone(), *bits), *now) {
                queue.push((state.clone(), *bits, *now, true));
            }
        }
        let events = self.events;
        let target = &events[i];
        let mut tried = 0u64;
        while let Some((state, bits, now, as_stood)) = queue.pop() {
            self.states += 1;
            tried += 1;
            if tried > self.bounds.max_states {
                return Err(Stop::Unknown(
                    Some(i),
                    format!(
                        "more than {} states visited to explain one operation",
                        self.bounds.max_states
                    ),
                ));
            }
            let c = Clock { now, t };
            match self.component.apply(target, &state, c) {
                Ok(after) => {
                    for (s, n) in after {
                        keep(&mut next, (s, bits & !bit), n);
                    }
                }
                Err(why) if as_stood => *stood.entry(why).or_default() += 1,
                Err(why) => *reasons.entry(why).or_default() += 1,
            }
            for (j, open_slot) in self.slots.iter().enumerate() {
                let Some(k) = *open_slot else { continue };
                if j == slot || bits & (1 << j) != 0 {
                    continue;
                }
                let e = &events[k];
                if self.component.window(e) {
                    continue;
                }
                let Ok(after) = self.component.apply(e, &state, c) else {
                    continue;
                };
                for (s, n) in after {
                    if !determinate(e) && s == state {
                        continue;
                    }
                    let bits = bits | (1 << j);
                    if !self.doomed(&s, bits, t) && keep(&mut visited, (s.clone(), bits), n) {
                        queue.push((s, bits, n, false));
                    }
                }
            }
            for (s, n) in self.component.internal(&state, c, &open) {
                if !self.doomed(&s, bits, t) && keep(&mut visited, (s.clone(), bits), n) {
                    queue.push((s, bits, n, false));
                }
            }
        }
        if next.is_empty() {
            let others = open_count(&self.slots).saturating_sub(1);
            return Err(Stop::Unexplained(i, why(stood, reasons, others, tried)));
        }
        if next.len() as u64 > self.bounds.max_states {
            return Err(Stop::Unknown(
                Some(i),
                format!(
                    "more than {} configurations to keep after one operation",
                    self.bounds.max_states
                ),
            ));
        }
        self.configs = next;
        self.slots[slot] = None;
        Ok(())
    }

    /// Whether `state`, with the open operations of `bits` taken, can
    /// never explain an open operation still to complete.
    fn doomed(&self, state: &C::State, bits: u64, t: i64) -> bool {
        self.prune
            && self.slots.iter().enumerate().any(|(j, open)| {
                open.is_some_and(|k| {
                    let e = &self.events[k];
                    bits & (1 << j) == 0
                        && determinate(e)
                        && !self.component.window(e)
                        && self.component.doomed(state, e, t)
                })
            })
    }

    /// After each event: read-only operations that agree with a state take
    /// effect in it at once; indeterminate operations that can no longer
    /// change anything are closed.
    fn settle(&mut self, t: i64) {
        let events = self.events;
        let open: Vec<(usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(j, s)| s.map(|k| (j, k)))
            .collect();
        let mut next: Configs<C::State> = HashMap::new();
        for ((state, mut bits), now) in std::mem::take(&mut self.configs) {
            for &(j, k) in &open {
                let e = &events[k];
                if bits & (1 << j) != 0 || !determinate(e) || self.component.window(e) {
                    continue;
                }
                let c = Clock { now, t };
                if let Ok(after) = self.component.apply(e, &state, c)
                    && after.len() == 1
                    && after[0].0 == state
                {
                    bits |= 1 << j;
                }
            }
            keep(&mut next, (state, bits), now);
        }
        for &(j, k) in &open {
            let e = &events[k];
            if determinate(e) || self.component.window(e) {
                continue;
            }
            let states: Vec<&C::State> = next.keys().map(|(s, _)| s).collect();
            if self.component.retired(e, &states) {
                self.slots[j] = None;
                let mask = !(1u64 << j);
                let mut merged = HashMap::new();
                for ((state, bits), now) in std::mem::take(&mut next) {
                    keep(&mut merged, (state, bits & mask), now);
                }
                next = merged;
            }
        }
        self.configs = next;
    }
}

/// Why an operation is unexplained: the most frequent reason in the
/// configurations as they stood, then what other orders ran into.
fn why(
    stood: HashMap<String, u64>,
    reasons: HashMap<String, u64>,
    others: usize,
    tried: u64,
) -> String {
    let ranked = |m: HashMap<String, u64>| {
        let mut v: Vec<(String, u64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    };
    let stood = ranked(stood);
    let reasons = ranked(reasons);
    let lead = stood.first().or(reasons.first()).map(|(w, _)| w.clone());
    let Some(lead) = lead else {
        return "no configuration was left to explain it".to_string();
    };
    let also: Vec<&str> = stood
        .iter()
        .chain(&reasons)
        .map(|(w, _)| w.as_str())
        .filter(|w| *w != lead)
        .take(2)
        .collect();
    if others == 0 && also.is_empty() {
        return lead;
    }
    let mut out = format!(
        "{lead}; nor does any order of the {others} other operation(s) open with it ({tried} state(s) tried)"
    );
    if !also.is_empty() {
        out += &format!(": {}", also.join("; "));
    }
    out
}

fn open_count(slots: &[Option<usize>]) -> usize {
    slots.iter().filter(|s| s.is_some()).count()
}
