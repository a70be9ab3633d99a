//! Coalescing: the grants (and the releases) of one client that arrive
//! while [`IN_FLIGHT`] others of their kind are in flight go to Redis
//! together, as one script call.
//!
//! Redis spends a fixed cost on every script call (a few µs: the `EVALSHA`
//! lookup, the Lua call, the reply) on top of the calls the script makes.
//! Many tasks taking and releasing locks through one client pay it once per
//! operation; a batch pays it once per batch.
//!
//! A client's [`Coalescer`] (owned by its engine, next to its connection)
//! has one [`Lane`] per kind (grants, releases), with one group per
//! [`batch group`](RedisConn::batch_group) (a Cluster slot; one group off a
//! Cluster, where any keys may share a script):
//! - a call that finds fewer than [`IN_FLIGHT`] calls of its group in
//!   flight goes alone, at once, with its own script and reply, exactly as
//!   it would without a lane: a lone caller is never delayed;
//! - while [`IN_FLIGHT`] are in flight, further calls of the group queue;
//!   when one of those has replied, everything queued (up to
//!   [`MAX_BATCH`]) goes as one batch call (`grant_many.lua`,
//!   `release_many.lua`) in its place, sent by a task of its own (a caller
//!   that gives up never strands the others), which then sends what queued
//!   meanwhile, until nothing is queued. A single queued call is sent back
//!   to go alone, with its own script;
//! - a batch settles each item with its own script's common case and
//!   sends back the items it cannot settle (a queue to pass a lock on to,
//!   a key of another type, a retry, …), having written nothing for them:
//!   they go alone through their own script, which decides and names what
//!   is wrong. An item's error is that item's; a failed batch call fails
//!   each of its items as their own call would have failed (retryable if
//!   the connection is the problem);
//! - a caller that left before its batch was sent is left out of it; one
//!   that left while its batch was under way gets nothing, and a lock the
//!   batch granted it is released right after the batch, on the same
//!   connection ([`Kind::orphaned`]).
//!
//! Calls that wait for replicas (`WAIT`) never come here: the `WAIT` must
//! follow exactly their own writes. A grant's lease is timed from before
//! the caller entered the lane, no later than Redis runs its batch.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::cluster_routing::Slot;
use tokio::sync::oneshot;

use super::conn::RedisConn;
use super::ops::{
    Batched, Grant, GrantItem, GrantMany, GrantReply, PassOn, Release, ReleaseItem, ReleaseMany,
};
#[cfg(feature = "testing")]
use super::scripts::BatchFault;
use super::scripts::{self, Lua};
use super::wire::lock_value;
use crate::error::{Error, Result};
use crate::store::Checked;

/// Calls of one group that go to Redis at once, alone or as batches,
/// before further calls queue. One would halve the throughput of many
/// tasks on one client: each batch would wait for the round trip of the
/// one before it, while Redis idles. A few keep Redis busy and still
/// gather what arrives meanwhile into batches.
pub(crate) const IN_FLIGHT: usize = 16;

/// Most calls in one batch: a batch of 128 grants holds Redis for a few
/// hundred µs, and a bigger one would delay every other client's calls for
/// longer than a lone call takes.
pub(crate) const MAX_BATCH: usize = 128;

/// A kind of call that can be batched: what a queued call keeps, and how a
/// batch of them is sent.
pub(super) trait Kind: Send + Sync + 'static {
    /// A queued call (owned: the caller's borrow is not `'static`).
    type Item: Send + Sync + 'static;
    /// The reply of one call.
    type Reply: Send + 'static;

    /// Sends `items` (one group) as one call; one outcome per item, in
    /// order, whatever happens.
    fn run_batch(
        &self,
        conn: &RedisConn,
        items: &[Self::Item],
    ) -> impl Future<Output = Vec<Outcome<Self::Reply>>> + Send;

    /// Undoes what `outcome` left behind for a caller that is gone (its
    /// future was dropped while its batch was in flight): nothing to undo
    /// unless the call took something that only its caller would give
    /// back.
    fn orphaned(
        &self,
        conn: &RedisConn,
        item: &Self::Item,
        outcome: Outcome<Self::Reply>,
    ) -> impl Future<Output = ()> + Send;
}

/// What a batch did for one caller.
#[derive(Debug)]
pub(super) enum Outcome<R> {
    /// Settled: the caller's reply.
    Done(R),
    /// The caller sends its call alone, through its own script.
    Alone,
    /// The caller's call failed.
    Failed(Error),
}

/// The grants of a client.
#[derive(Debug, Default)]
pub(super) struct Grants {
    /// A deliberately broken batch grant script (feature `testing`).
    #[cfg(feature = "testing")]
    fault: Mutex<Option<&'static Lua>>,
    /// A gate each batch of grants waits at before it is sent (feature
    /// `testing`: the tests of callers that leave while their batch is
    /// under way).
    #[cfg(feature = "testing")]
    gate: Mutex<Option<BatchGate>>,
}

/// Holds batches of grants before they are sent (feature `testing`): a
/// batch that arrives says so on `reached`, then waits for a permit of
/// `open`.
#[cfg(feature = "testing")]
#[derive(Debug, Clone)]
pub struct BatchGate {
    /// Notified as each batch arrives at the gate.
    pub reached: Arc<tokio::sync::Notify>,
    /// One permit lets one batch through.
    pub open: Arc<tokio::sync::Semaphore>,
}

#[cfg(feature = "testing")]
impl Default for BatchGate {
    /// Closed: no permit yet.
    fn default() -> Self {
        BatchGate {
            reached: Arc::default(),
            open: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl Grants {
    /// The script batched grants run.
    fn script(&self) -> &'static Lua {
        #[cfg(feature = "testing")]
        if let Some(broken) = *self.fault.lock().unwrap_or_else(|p| p.into_inner()) {
            return broken;
        }
        &scripts::GRANT_MANY
    }
}

/// The releases of a client.
#[derive(Debug, Default)]
pub(super) struct Releases;

impl Kind for Grants {
    type Item = GrantItem;
    type Reply = GrantReply;

    async fn run_batch(&self, conn: &RedisConn, items: &[GrantItem]) -> Vec<Outcome<GrantReply>> {
        #[cfg(feature = "testing")]
        {
            let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(gate) = gate {
                gate.reached.notify_one();
                if let Ok(permit) = gate.open.acquire().await {
                    permit.forget();
                }
            }
        }
        let call = GrantMany {
            items,
            script: self.script(),
        };
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        outcomes(conn, &keys, conn.invoke(&call).await.map(|r| r.0))
    }

    /// A lock granted to a caller that is gone is released at once (sent
    /// after the batch that granted it, on the same connection), rather
    /// than held by nobody for its ttl.
    async fn orphaned(&self, conn: &RedisConn, item: &GrantItem, outcome: Outcome<GrantReply>) {
        let Outcome::Done(GrantReply::Granted(fence)) = outcome else {
            return;
        };
        let value = lock_value(&item.token, fence, item.mint.layout());
        let release = Release {
            lock: &item.lock,
            mint: item.mint,
            pass_on: PassOn {
                publish: conn.publish(),
            },
            value: &value,
            wake_first: false,
        };
        let _ = conn.run(&release).await;
    }
}

impl Kind for Releases {
    type Item = ReleaseItem;
    type Reply = Checked;

    async fn run_batch(&self, conn: &RedisConn, items: &[ReleaseItem]) -> Vec<Outcome<Checked>> {
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        outcomes(conn, &keys, conn.invoke(&ReleaseMany { items }).await)
    }

    /// A release whose caller is gone has done its work.
    async fn orphaned(&self, _: &RedisConn, _: &ReleaseItem, _: Outcome<Checked>) {}
}

/// The outcome of each item (lock key `keys[i]`) of a batch call that
/// replied `replied`.
fn outcomes<R>(
    conn: &RedisConn,
    keys: &[&str],
    replied: std::result::Result<Vec<Batched<R>>, redis::RedisError>,
) -> Vec<Outcome<R>> {
    match replied {
        Ok(replies) if replies.len() == keys.len() => replies
            .into_iter()
            .zip(keys)
            .map(|(reply, key)| match reply {
                Batched::Done(r) => Outcome::Done(r),
                Batched::Alone => Outcome::Alone,
                Batched::Failed(text) => Outcome::Failed(conn.item_error(&text, key)),
            })
            .collect(),
        Ok(replies) => {
            let got = replies.len();
            keys.iter()
                .map(|_| {
                    Outcome::Failed(Error::UnexpectedReply(format!(
                        "a batch of {} calls returned {got} replies",
                        keys.len()
                    )))
                })
                .collect()
        }
        // Each item fails as its own call would have (the error names its
        // own key; a connection problem is retryable).
        Err(e) => keys
            .iter()
            .map(|key| Outcome::Failed(conn.map_error(e.clone(), &[key])))
            .collect(),
    }
}

/// A queued call and where its outcome goes.
struct Waiting<K: Kind> {
    item: K::Item,
    reply: oneshot::Sender<Outcome<K::Reply>>,
}

/// A group with calls in flight: how many, and the calls queued behind
/// them.
struct Busy<K: Kind> {
    in_flight: usize,
    queued: Vec<Waiting<K>>,
}

/// The busy groups of a lane (a fast hasher: every call looks its group up
/// and most leave it again).
type Groups<K> = HashMap<Option<Slot>, Busy<K>, foldhash::fast::RandomState>;

/// The calls of one kind of one client (see the module docs): per group,
/// present while calls of the group are in flight, how many and the calls
/// queued behind them.
///
/// A lane with nothing in flight lets one call of the one group off a
/// Cluster go without the map (`idle_call`): a lone caller, the most common
/// one, then touches two atomics instead of the mutex and the map twice. It
/// is still counted: a call that enters the map while it is in flight
/// counts it in (adopts it), so the group's count is exact, as the limit of
/// [`IN_FLIGHT`] needs.
pub(super) struct Lane<K: Kind> {
    kind: K,
    groups: Mutex<Groups<K>>,
    /// How many groups the map holds (written under its mutex).
    busy: AtomicUsize,
    /// The call that went without the map: [`NO_IDLE_CALL`],
    /// [`IDLE_CALL`] or [`IDLE_CALL_ADOPTED`].
    idle: AtomicU8,
}

/// No call is in flight without the map.
const NO_IDLE_CALL: u8 = 0;
/// A call of the group `None` is in flight without the map, counted nowhere.
const IDLE_CALL: u8 = 1;
/// That call is counted in the map's entry of `None`: it leaves through it.
const IDLE_CALL_ADOPTED: u8 = 2;

impl<K: Kind> std::fmt::Debug for Lane<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("in_flight", &self.lock().len())
            .finish()
    }
}

/// What is next for a group one of whose calls in flight replied.
enum Next<K: Kind> {
    /// Nothing queued: one call fewer in flight.
    Idle,
    /// One call queued: it goes alone (one call fewer in flight).
    One(Waiting<K>),
    /// A batch to send in the replied call's place.
    Batch(Vec<Waiting<K>>),
}

impl<K: Kind + Default> Lane<K> {
    fn new() -> Arc<Self> {
        Arc::new(Lane {
            kind: K::default(),
            groups: Mutex::new(HashMap::default()),
            busy: AtomicUsize::new(0),
            idle: AtomicU8::new(NO_IDLE_CALL),
        })
    }
}

impl<K: Kind> Lane<K> {
    fn lock(&self) -> MutexGuard<'_, Groups<K>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call of `group` may go without the map: the map is empty
    /// and no other call went without it. Each side writes its own atomic
    /// before it reads the other's (all `SeqCst`), so a call that enters the
    /// map meanwhile either sees this one (and adopts it) or is seen (and
    /// this one withdraws and takes the map too).
    fn idle_call(&self, group: Option<Slot>) -> bool {
        if group.is_some() || self.busy.load(SeqCst) != 0 {
            return false;
        }
        if self
            .idle
            .compare_exchange(NO_IDLE_CALL, IDLE_CALL, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        if self.busy.load(SeqCst) == 0 {
            return true;
        }
        // Withdrawn, unless a call in the map already counted it in.
        self.idle
            .compare_exchange(IDLE_CALL, NO_IDLE_CALL, SeqCst, SeqCst)
            .is_err()
    }

    /// A call that went without the map has ended: counted nowhere, it
    /// just goes; adopted, it leaves the map's count as any call in flight
    /// does (sending on what queued behind it).
    fn idle_call_done(self: &Arc<Self>, conn: &RedisConn) {
        if self
            .idle
            .compare_exchange(IDLE_CALL, NO_IDLE_CALL, SeqCst, SeqCst)
            .is_err()
        {
            self.hand_on(None, conn);
            self.idle.store(NO_IDLE_CALL, SeqCst);
        }
    }

    /// One call of `group` is no longer in flight and takes nothing queued
    /// along: with none left in flight, the group is idle, and whatever is
    /// still queued (only when a batch's task or runtime ended early) is
    /// dropped, so those callers go alone.
    fn done(&self, group: Option<Slot>) {
        let mut groups = self.lock();
        leave(&mut groups, group);
        self.busy.store(groups.len(), SeqCst);
    }

    /// Runs one call of `group`: alone at once (`alone`) if fewer than
    /// [`IN_FLIGHT`] of the group are in flight; otherwise queued (`item`
    /// makes its queued form) and settled by a batch, or sent back to go
    /// alone.
    pub(super) async fn call<Alone>(
        self: &Arc<Self>,
        conn: &RedisConn,
        group: Option<Slot>,
        item: impl FnOnce() -> K::Item,
        alone: impl FnOnce() -> Alone,
    ) -> Result<K::Reply>
    where
        Alone: Future<Output = Result<K::Reply>>,
    {
        if self.idle_call(group) {
            let _in_flight = IdleCall { lane: self, conn };
            return alone().await;
        }
        let queued = {
            let mut groups = self.lock();
            let groups_before = groups.len();
            match groups.entry(group) {
                Entry::Vacant(idle) => {
                    // Written before the idle call is looked at (see
                    // `idle_call`).
                    self.busy.store(groups_before + 1, SeqCst);
                    let adopted = group.is_none()
                        && self
                            .idle
                            .compare_exchange(IDLE_CALL, IDLE_CALL_ADOPTED, SeqCst, SeqCst)
                            .is_ok();
                    idle.insert(Busy {
                        in_flight: 1 + usize::from(adopted),
                        queued: Vec::new(),
                    });
                    None
                }
                Entry::Occupied(mut busy) if busy.get().in_flight < IN_FLIGHT => {
                    busy.get_mut().in_flight += 1;
                    None
                }
                Entry::Occupied(mut busy) => {
                    let (reply, queued) = oneshot::channel();
                    busy.get_mut().queued.push(Waiting {
                        item: item(),
                        reply,
                    });
                    Some(queued)
                }
            }
        };
        let Some(queued) = queued else {
            // In flight until this guard drops (replied, failed or given
            // up): then whatever queued behind this call is sent.
            let _in_flight = InFlight {
                lane: self,
                group,
                conn,
            };
            return alone().await;
        };
        match queued.await {
            Ok(Outcome::Done(reply)) => Ok(reply),
            Ok(Outcome::Failed(e)) => Err(e),
            // The batch's task ended without settling it (its runtime shut
            // down): alone, it gets its own answer.
            Ok(Outcome::Alone) | Err(_) => alone().await,
        }
    }

    /// Takes what is queued for `group`, one of whose calls in flight
    /// replied: a batch to send in its place, or (nothing or one queued)
    /// one call fewer in flight.
    fn take(&self, group: Option<Slot>) -> Next<K> {
        let mut groups = self.lock();
        // One look-up: a lone caller (nothing queued) passes here on every
        // call.
        let Entry::Occupied(mut busy) = groups.entry(group) else {
            return Next::Idle;
        };
        let queue = &mut busy.get_mut().queued;
        // Callers that gave up are not sent.
        queue.retain(|w| !w.reply.is_closed());
        if queue.len() >= 2 {
            return Next::Batch(queue.drain(..queue.len().min(MAX_BATCH)).collect());
        }
        // At most one was queued, and nothing is now: the call that
        // replied leaves the group (the one queued goes alone, uncounted).
        let one = queue.pop();
        let left = busy.get().in_flight.saturating_sub(1);
        if left == 0 {
            busy.remove();
            self.busy.store(groups.len(), SeqCst);
        } else {
            busy.get_mut().in_flight = left;
        }
        match one {
            Some(one) => Next::One(one),
            None => Next::Idle,
        }
    }

    /// Sends on what queued behind a call of `group` that is no longer in
    /// flight.
    fn hand_on(self: &Arc<Self>, group: Option<Slot>, conn: &RedisConn) {
        match self.take(group) {
            Next::Idle => {}
            Next::One(one) => {
                let _ = one.reply.send(Outcome::Alone);
            }
            Next::Batch(batch) => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(send_batches(self.clone(), group, conn.clone(), batch));
                }
                // No runtime to send from: the batch's callers go alone
                // (their replies dropped with it).
                Err(_) => self.done(group),
            },
        }
    }
}

/// One call of `group` leaves flight: with none left, the group is idle
/// and removed (dropping anything still queued, whose callers then go
/// alone).
fn leave<K: Kind>(groups: &mut Groups<K>, group: Option<Slot>) {
    if let Entry::Occupied(mut busy) = groups.entry(group) {
        let left = busy.get().in_flight.saturating_sub(1);
        if left == 0 {
            busy.remove();
        } else {
            busy.get_mut().in_flight = left;
        }
    }
}

/// A call in flight that went without the map (`Lane::idle_call`).
struct IdleCall<'a, K: Kind> {
    lane: &'a Arc<Lane<K>>,
    conn: &'a RedisConn,
}

impl<K: Kind> Drop for IdleCall<'_, K> {
    fn drop(&mut self) {
        self.lane.idle_call_done(self.conn);
    }
}

/// A lone call in flight: when it drops, what queued behind it is sent.
struct InFlight<'a, K: Kind> {
    lane: &'a Arc<Lane<K>>,
    group: Option<Slot>,
    conn: &'a RedisConn,
}

impl<K: Kind> Drop for InFlight<'_, K> {
    fn drop(&mut self) {
        self.lane.hand_on(self.group, self.conn);
    }
}

/// Sends `batch` (of `group`), then each batch that queued meanwhile, until
/// the group is idle.
async fn send_batches<K: Kind>(
    lane: Arc<Lane<K>>,
    group: Option<Slot>,
    conn: RedisConn,
    mut batch: Vec<Waiting<K>>,
) {
    // If this task is dropped before it is done (its runtime shut down),
    // its call must not stay in flight.
    let mut stranded = Stranded {
        lane: &lane,
        group,
        armed: true,
    };
    loop {
        let (items, replies): (Vec<K::Item>, Vec<_>) =
            batch.into_iter().map(|w| (w.item, w.reply)).unzip();
        let outcomes = lane.kind.run_batch(&conn, &items).await;
        for ((reply, outcome), item) in replies.into_iter().zip(outcomes).zip(&items) {
            if let Err(outcome) = reply.send(outcome) {
                lane.kind.orphaned(&conn, item, outcome).await;
            }
        }
        batch = match lane.take(group) {
            Next::Batch(next) => next,
            Next::One(one) => {
                let _ = one.reply.send(Outcome::Alone);
                break;
            }
            Next::Idle => break,
        };
    }
    stranded.armed = false;
}

/// Takes a batch task's call out of flight if the task ends early.
struct Stranded<'a, K: Kind> {
    lane: &'a Lane<K>,
    group: Option<Slot>,
    armed: bool,
}

impl<K: Kind> Drop for Stranded<'_, K> {
    fn drop(&mut self) {
        if self.armed {
            self.lane.done(self.group);
        }
    }
}

/// The lanes of one client: its engine holds one, next to its connection.
#[derive(Debug)]
pub(crate) struct Coalescer {
    grants: Arc<Lane<Grants>>,
    releases: Arc<Lane<Releases>>,
}

impl Coalescer {
    pub(crate) fn new() -> Self {
        Coalescer {
            grants: Lane::new(),
            releases: Lane::new(),
        }
    }

    /// One grant attempt on `conn`: batched with the client's concurrent
    /// grants of its slot when it is of the kind a batch settles, alone (at
    /// once) otherwise.
    pub(crate) async fn grant(&self, conn: &RedisConn, call: &Grant<'_>) -> Result<GrantReply> {
        if !call.batchable() {
            return conn.run(call).await;
        }
        self.grants
            .call(
                conn,
                conn.batch_group(call.keys.lock()),
                || GrantItem::from(call),
                || conn.run(call),
            )
            .await
    }

    /// One release on `conn`: batched with the client's concurrent
    /// releases of its slot.
    pub(crate) async fn release(&self, conn: &RedisConn, call: &Release<'_>) -> Result<Checked> {
        self.releases
            .call(
                conn,
                conn.batch_group(call.lock),
                || ReleaseItem::from(call),
                || conn.run(call),
            )
            .await
    }

    /// Makes batched grants run `fault`'s broken script (the negative
    /// controls of the tests; `None`: the real one again).
    #[cfg(feature = "testing")]
    pub(crate) fn break_grants(&self, fault: Option<BatchFault>) {
        *self
            .grants
            .kind
            .fault
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = fault.map(scripts::broken);
    }

    /// Makes batches of grants wait at `gate` before they are sent (`None`:
    /// no more).
    #[cfg(feature = "testing")]
    pub(crate) fn gate_grants(&self, gate: Option<BatchGate>) {
        *self
            .grants
            .kind
            .gate
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = gate;
    }
}
