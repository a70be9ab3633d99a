//! The model cannot drift from the scripts: random operation sequences
//! (seeded) run against the real Lua scripts on a real redis-server and
//! against the model's transitions ([`fencelock_model::store`]), every reply
//! and the resulting keys compared after each operation. Each deliberately
//! broken script ([`ScriptMutation`]) must be caught.
//!
//! How the two are held together:
//! - **Calls**: every script call is built by the library's own operation
//!   types ([`ProtocolScripts`]), so the arguments are what the engine sends.
//! - **Tokens** are normalised: the model's token `n` is `tokNNN` in Redis,
//!   and a resource's holder id (SHA-1 of the token) maps back to it.
//! - **Time**: the model's tick is a millisecond since the run began, and
//!   its server clock is set to the µs the script read. That instant is only
//!   known to lie between a `TIME` read before and one after the call, so
//!   the model runs at each candidate instant that could decide differently
//!   (both ends, the fence a clock-mode script minted, and each waiter's
//!   starvation and lease boundary inside the window), and the first that
//!   explains the reply and the keys wins. Clock-mode fences are compared
//!   exactly once the instant is taken from them, and only when they lie in
//!   the window (order and `TIME`); counter-mode fences exactly.
//! - **Expiry is driven by the harness**: leases are a minute long, and an
//!   operation deletes the lock (`DEL`) or ends a waiter's lease (its score
//!   set in the past), to both sides at once. Lock expiry instants are not
//!   compared (only whether the lock is there); queue arrival and waiter
//!   lease scores are compared within the call's window and then taken
//!   from Redis.
//! - **Not compared**: the wake-up messages (`PUBLISH`), which change no key.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::testing::{ProtocolScripts, QueueMember, ResourceChange, ScriptMutation};
use fencelock::{Fence, FenceMode, KeyLayout, LockKeys, LockOptions, STARVATION_THRESHOLD};
use fencelock_model::store::{self as model, Change, Grant, Resource, Store, Token};
use fencelock_testkit::RedisServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;
use redis::aio::MultiplexedConnection;

/// Operations per seed.
const OPS: usize = 400;
/// Seeds of the real scripts (clock and counter fences, the default and
/// the guide layout, in turn).
const SEEDS: u64 = 40;
/// The lease and waiter lease of every caller: long, so that only the
/// harness ends them.
const LEASE: Duration = Duration::from_secs(60);
/// The callers' wait modes.
const MODES: [fencelock::WaitMode; 3] = [
    fencelock::WaitMode::Poll,
    fencelock::WaitMode::Notify,
    fencelock::WaitMode::Fair,
];

fn model_mode(mode: fencelock::WaitMode) -> model::WaitMode {
    match mode {
        fencelock::WaitMode::Poll => model::WaitMode::Poll,
        fencelock::WaitMode::Notify => model::WaitMode::Notify,
        _ => model::WaitMode::Fair,
    }
}

fn token_text(token: Token) -> String {
    format!("tok{token:03}")
}

/// A caller: one wait mode, one acquisition (token) at a time, and the
/// last lock value it was granted (kept when stale, to release or extend
/// with it later).
struct Caller {
    mode: fencelock::WaitMode,
    scripts: ProtocolScripts,
    token: Token,
    member: Option<QueueMember>,
    granted: Option<u64>,
}

/// What one side replied, normalised so that both sides print alike.
type Reply = String;

/// The keys of one name and the resource, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Keys {
    /// The holder, and the fence its value carries (none in the guide
    /// layout, whose value is the bare token).
    lock: Option<(Token, Option<u64>)>,
    fence: Option<u64>,
    /// Queue members in order: token and mode.
    queue: Vec<(Token, model::WaitMode)>,
    resource: (Option<u64>, Option<Token>, u8),
}

/// The keys as read: lock value, fence, queue and waiter leases with their
/// scores, and the resource's fence, holder and value.
type RawKeys = (
    Option<String>,
    Option<u64>,
    Vec<(String, u64)>,
    Vec<(String, i64)>,
    (Option<u64>, Option<String>, Option<u8>),
);

/// The time-derived scores of the queue, compared within a window.
#[derive(Debug, Clone, Default)]
struct Scores {
    /// Per token: arrival (µs) and lease end (ms since the run began).
    by_token: HashMap<Token, (u64, i64)>,
}

/// One operation of a sequence.
#[derive(Debug, Clone)]
enum Op {
    Grant {
        caller: usize,
        with_member: bool,
    },
    GrantMany {
        callers: Vec<usize>,
    },
    Release {
        caller: usize,
    },
    ReleaseMany {
        callers: Vec<usize>,
    },
    Extend {
        caller: usize,
    },
    ExtendMany {
        callers: Vec<usize>,
    },
    Leave {
        caller: usize,
    },
    Revoke,
    Write {
        caller: usize,
        fence: u64,
        change: u8,
    },
    NewAcquisition {
        caller: usize,
    },
    ExpireLock,
    EndWaiterLease {
        token: Token,
    },
    FenceAhead,
    LoseData,
}

struct Run {
    conn: MultiplexedConnection,
    keys: LockKeys,
    resource: String,
    mode: FenceMode,
    callers: Vec<Caller>,
    store: Store,
    res: Resource,
    scores: Scores,
    base_ms: i64,
    next_token: Token,
    holders: HashMap<String, Token>,
    /// Every fence either side minted (stale fences for writes).
    fences: BTreeSet<u64>,
    ttl_ticks: u32,
    ops: usize,
    /// How often each kind of outcome was seen (the sequences must reach
    /// every branch that matters, or agreeing would prove little).
    seen: std::collections::BTreeMap<&'static str, usize>,
}

/// The first disagreement: the operation and both sides.
struct Mismatch {
    step: usize,
    op: Op,
    real: String,
    model: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}: {:?}\n  real:  {}\n  model: {}",
            self.step, self.op, self.real, self.model
        )
    }
}

async fn time_us(conn: &mut MultiplexedConnection) -> Result<u64> {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(s * 1_000_000 + us)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

fn grant_reply(g: Option<Grant>) -> Reply {
    match g {
        None => "alone".into(),
        Some(Grant::Granted(f)) => format!("granted {f}"),
        Some(Grant::Held(last)) => format!("held last={last:?}"),
        Some(Grant::Reserved(last)) => format!("reserved last={last:?}"),
    }
}

impl Run {
    async fn new(
        server: &RedisServer,
        seed: u64,
        mutation: Option<ScriptMutation>,
    ) -> Result<Self> {
        let mut conn = server.client().get_multiplexed_async_connection().await?;
        // Each run starts from nothing (the server is this test's own).
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
        // Seeds take turns: clock and counter fences, each in the default
        // layout and in the guide's.
        let mode = if seed.is_multiple_of(2) {
            FenceMode::Clock
        } else {
            FenceMode::Counter
        };
        let layout = if seed % 4 < 2 {
            KeyLayout::HashTagged
        } else {
            KeyLayout::Guide
        };
        let keys = LockKeys::new("diff:", layout, &format!("seed{seed}"))?;
        let resource = format!("diff:resource:{seed}");
        let mut callers = Vec::new();
        for (i, wait_mode) in MODES.into_iter().enumerate() {
            let opts = LockOptions::default()
                .layout(layout)
                .ttl(LEASE)
                .waiter_lease(LEASE)
                .fence_mode(mode)
                .wait_mode(wait_mode);
            let mut scripts = ProtocolScripts::new(keys.clone(), opts);
            if let Some(m) = mutation {
                scripts = scripts.mutated(m)?;
            }
            callers.push(Caller {
                mode: wait_mode,
                scripts,
                token: u8::try_from(i + 1)?,
                member: None,
                granted: None,
            });
        }
        let mut store = Store::new(
            match mode {
                FenceMode::Clock => model::FenceMode::Clock,
                _ => model::FenceMode::Counter,
            },
            model::Broken::default(),
        );
        store.starving = Some(u64::try_from(STARVATION_THRESHOLD.as_micros())?);
        store.bare = layout == KeyLayout::Guide;
        let base_ms = i64::try_from(time_us(&mut conn).await? / 1000)?;
        let mut run = Run {
            conn,
            keys,
            resource,
            mode,
            callers,
            store,
            res: Resource::default(),
            scores: Scores::default(),
            base_ms,
            next_token: 4,
            holders: HashMap::new(),
            fences: BTreeSet::new(),
            ttl_ticks: u32::try_from(LEASE.as_millis())?,
            ops: 0,
            seen: std::collections::BTreeMap::new(),
        };
        for i in 0..run.callers.len() {
            run.set_member(i);
        }
        Ok(run)
    }

    /// Caller `i`'s queue member for its current token (notify and fair).
    fn set_member(&mut self, i: usize) {
        let c = &mut self.callers[i];
        let text = token_text(c.token);
        self.holders.insert(fencelock::holder_id(&text), c.token);
        c.member = (c.mode != fencelock::WaitMode::Poll).then(|| QueueMember {
            client: format!("c{i}"),
            waiter: u64::from(c.token),
            mode: c.mode,
            ttl: LEASE,
            handover: LEASE,
            token: text,
            access: None,
        });
    }

    fn random_op(&self, rng: &mut StdRng) -> Op {
        let n = self.callers.len();
        let caller = rng.random_range(0..n);
        let some =
            |rng: &mut StdRng| -> Vec<usize> { (0..n).filter(|_| rng.random_bool(0.6)).collect() };
        match rng.random_range(0..100) {
            0..=21 => Op::Grant {
                caller,
                with_member: rng.random_bool(0.8),
            },
            // The engine batches only callers with no place in the queue
            // (`Grant::batchable`): never fair ones, never queued ones.
            22..=27 if self.mode == FenceMode::Clock => Op::GrantMany {
                callers: some(rng)
                    .into_iter()
                    .filter(|&i| {
                        let c = &self.callers[i];
                        c.mode != fencelock::WaitMode::Fair
                            && !self.store.queue.iter().any(|w| w.token == c.token)
                    })
                    .collect(),
            },
            22..=33 => Op::Release { caller },
            34..=39 => Op::ReleaseMany { callers: some(rng) },
            40..=46 => Op::Extend { caller },
            47..=50 => Op::ExtendMany { callers: some(rng) },
            51..=56 => Op::Leave { caller },
            57..=59 => Op::Revoke,
            60..=74 => {
                let fence = match rng.random_range(0..4) {
                    0 => self.callers[caller].granted.unwrap_or(1),
                    1 => rng.random_range(1..=120),
                    2 => 10u64.pow(rng.random_range(0..18)),
                    _ => {
                        let known: Vec<u64> = self.fences.iter().copied().collect();
                        let f = known.get(rng.random_range(0..known.len().max(1)));
                        f.map_or(1, |f| f + rng.random_range(0..2))
                    }
                };
                Op::Write {
                    caller,
                    fence,
                    change: rng.random_range(0..8),
                }
            }
            75..=84 => Op::NewAcquisition { caller },
            85..=89 => Op::ExpireLock,
            90..=93 => match self
                .store
                .queue
                .get(rng.random_range(0..=self.store.queue.len()))
            {
                Some(w) => Op::EndWaiterLease { token: w.token },
                None => Op::ExpireLock,
            },
            94..=97 => Op::FenceAhead,
            _ => Op::LoseData,
        }
    }

    /// Reads the keys and their scores from Redis.
    async fn real_keys(&mut self) -> Result<(Keys, Scores)> {
        let (lock, fence, queue, waiters, res): RawKeys = redis::pipe()
            .get(self.keys.lock())
            .get(self.keys.fence())
            .zrange_withscores(self.keys.queue(), 0, -1)
            .zrange_withscores(self.keys.waiters(), 0, -1)
            .cmd("HMGET")
            .arg(&self.resource)
            .arg("fence")
            .arg("holder")
            .arg("value")
            .query_async(&mut self.conn)
            .await?;
        let lock = match lock {
            None => None,
            Some(v) if self.store.bare => Some((self.token_of(&v)?, None)),
            Some(v) => {
                let (token, fence) = v.rsplit_once(':').context("a lock value without ':'")?;
                Some((self.token_of(token)?, Some(fence.parse()?)))
            }
        };
        let mut scores = Scores::default();
        let mut members = Vec::new();
        for (member, arrived) in queue {
            let m: QueueMember = member.parse()?;
            let token = self.token_of(&m.token)?;
            let lease_end = waiters
                .iter()
                .find(|(w, _)| *w == member)
                .map(|(_, end)| end - self.base_ms)
                .context("a queue member without a waiter lease")?;
            scores.by_token.insert(token, (arrived, lease_end));
            members.push((token, model_mode(m.mode)));
        }
        ensure!(
            waiters.len() == members.len(),
            "waiter leases of members not queued: {waiters:?}"
        );
        let holder = match res.1.as_deref() {
            None => None,
            Some(fencelock::REVOKED_HOLDER) => Some(model::REVOKED),
            Some(id) => Some(*self.holders.get(id).context("an unknown holder id")?),
        };
        let keys = Keys {
            lock,
            fence,
            queue: members,
            resource: (res.0, holder, res.2.unwrap_or(0)),
        };
        Ok((keys, scores))
    }

    fn token_of(&self, text: &str) -> Result<Token> {
        text.strip_prefix("tok")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("not a token of this run: {text:?}"))
    }

    fn model_keys(store: &Store, res: &Resource, now: u32) -> Keys {
        Keys {
            lock: store
                .live_lock(now)
                .map(|h| (h.token, (!store.bare).then_some(h.fence))),
            fence: store.fence_key,
            queue: store.queue.iter().map(|w| (w.token, w.mode)).collect(),
            resource: (res.fence, res.holder, res.value),
        }
    }

    fn value_of(&self, i: usize) -> Option<String> {
        let c = &self.callers[i];
        c.granted.map(|f| {
            let layout = if self.store.bare {
                KeyLayout::Guide
            } else {
                KeyLayout::HashTagged
            };
            fencelock::testing::lock_value(&token_text(c.token), Fence::new(f), layout)
        })
    }

    /// Runs the call `script` makes of caller `i`'s last lock value (its
    /// integer reply), or says it has none yet.
    async fn with_value(
        &self,
        i: usize,
        conn: &mut MultiplexedConnection,
        script: fn(&ProtocolScripts, &str) -> redis::ScriptInvocation<'static>,
    ) -> Result<Reply> {
        let Some(value) = self.value_of(i) else {
            return Ok("no value".into());
        };
        let n: i64 = script(&self.callers[i].scripts, &value)
            .invoke_async(conn)
            .await?;
        Ok(n.to_string())
    }

    /// Runs the batch `script` makes of `callers`' last lock values (those
    /// that have one); its reply, a list of integers.
    async fn with_values(
        &self,
        callers: &[usize],
        conn: &mut MultiplexedConnection,
        script: fn(&ProtocolScripts, &[&str]) -> redis::ScriptInvocation<'static>,
    ) -> Result<Reply> {
        let values: Vec<String> = callers.iter().filter_map(|&i| self.value_of(i)).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let codes: Vec<i64> = script(&self.callers[0].scripts, &values)
            .invoke_async(conn)
            .await?;
        Ok(format!("{codes:?}"))
    }

    /// Runs `op` on Redis; returns its normalised reply.
    async fn run_real(&mut self, op: &Op) -> Result<Reply> {
        let mut conn = self.conn.clone();
        let conn = &mut conn;
        let lock = self.keys.lock().to_owned();
        let reply = match op {
            Op::Grant {
                caller,
                with_member,
            } => {
                let c = &self.callers[*caller];
                let queued = self.store.queue.iter().any(|w| w.token == c.token);
                let member = c.member.as_ref().filter(|_| *with_member || queued);
                let v: Value = c
                    .scripts
                    .grant(&token_text(c.token), member, member.is_some())
                    .invoke_async(conn)
                    .await?;
                match &v {
                    Value::Int(f) => format!("granted {f}"),
                    Value::Array(a) => {
                        let last = a.get(2).and_then(int);
                        match a.first().and_then(int) {
                            Some(0) => format!("held last={last:?}"),
                            Some(2) => format!("reserved last={last:?}"),
                            _ => bail!("a grant reply of no known form: {v:?}"),
                        }
                    }
                    _ => bail!("a grant reply of no known form: {v:?}"),
                }
            }
            Op::GrantMany { callers } => {
                let tokens: Vec<String> = callers
                    .iter()
                    .map(|&i| token_text(self.callers[i].token))
                    .collect();
                let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
                let v: Value = self.callers[0]
                    .scripts
                    .grant_many(&tokens)
                    .invoke_async(conn)
                    .await?;
                let flat = items(&v);
                let mut out = Vec::new();
                for pair in flat.chunks(2) {
                    out.push(match (pair.first().and_then(int), pair.get(1)) {
                        (Some(1), Some(f)) => format!("granted {}", int(f).unwrap_or(-1)),
                        (Some(0), _) => "held".into(),
                        (Some(3), _) => "alone".into(),
                        _ => format!("{pair:?}"),
                    });
                }
                out.join(", ")
            }
            Op::Release { caller } => {
                self.with_value(*caller, conn, ProtocolScripts::release)
                    .await?
            }
            Op::ReleaseMany { callers } => {
                self.with_values(callers, conn, ProtocolScripts::release_many)
                    .await?
            }
            Op::Extend { caller } => {
                self.with_value(*caller, conn, ProtocolScripts::extend)
                    .await?
            }
            Op::ExtendMany { callers } => {
                self.with_values(callers, conn, ProtocolScripts::extend_many)
                    .await?
            }
            Op::Leave { caller } => match &self.callers[*caller].member {
                None => "no member".into(),
                Some(member) => {
                    let n: i64 = self.callers[*caller]
                        .scripts
                        .leave(member)
                        .invoke_async(conn)
                        .await?;
                    n.to_string()
                }
            },
            Op::Revoke => {
                let v: Value = self.callers[0].scripts.revoke().invoke_async(conn).await?;
                let a = items(&v);
                let holder = match a.get(1).and_then(text) {
                    None => None,
                    Some(id) => Some(*self.holders.get(&id).context("an unknown holder id")?),
                };
                format!(
                    "fence {:?} deposed {:?} at {:?}",
                    a.first().and_then(int),
                    holder,
                    a.get(2).and_then(int)
                )
            }
            Op::Write {
                caller,
                fence,
                change,
            } => {
                let c = &self.callers[*caller];
                let value = change.to_string();
                let change = match change {
                    0 => ResourceChange::Register,
                    1 => ResourceChange::Seal,
                    _ => ResourceChange::Write(&value),
                };
                let v: Value = c
                    .scripts
                    .fenced_write(
                        &self.resource,
                        Fence::new(*fence),
                        &token_text(c.token),
                        change,
                    )
                    .invoke_async(conn)
                    .await?;
                let a = items(&v);
                format!(
                    "accepted {:?} stored {:?}",
                    a.first().and_then(int) == Some(1),
                    a.get(1).and_then(int)
                )
            }
            Op::NewAcquisition { .. } => "new token".into(),
            Op::ExpireLock => {
                let _: () = redis::cmd("DEL").arg(&lock).query_async(conn).await?;
                "expired".into()
            }
            Op::EndWaiterLease { token } => {
                let member = self
                    .callers
                    .iter()
                    .filter_map(|c| c.member.as_ref())
                    .find(|m| m.token == token_text(*token));
                match member {
                    // A member of an earlier acquisition: its text is
                    // rebuilt from the queue.
                    None => {
                        let queue: Vec<String> = redis::cmd("ZRANGE")
                            .arg(self.keys.queue())
                            .arg(0)
                            .arg(-1)
                            .query_async(conn)
                            .await?;
                        let suffix = format!(":{}", token_text(*token));
                        let m = queue
                            .into_iter()
                            .find(|m| m.ends_with(&suffix))
                            .context("a queued token without a member")?;
                        let _: () = redis::cmd("ZADD")
                            .arg(self.keys.waiters())
                            .arg("XX")
                            .arg(1)
                            .arg(m)
                            .query_async(conn)
                            .await?;
                    }
                    Some(m) => {
                        let _: () = redis::cmd("ZADD")
                            .arg(self.keys.waiters())
                            .arg("XX")
                            .arg(1)
                            .arg(m.to_string())
                            .query_async(conn)
                            .await?;
                    }
                }
                "lease ended".into()
            }
            Op::FenceAhead => {
                // A fence key ahead of the clock (a clock that stepped back
                // after the last grant); in counter mode a few ahead.
                let ahead = match self.mode {
                    FenceMode::Clock => time_us(conn).await? + 10_000_000_000,
                    _ => self.store.fence_key.unwrap_or(0) + 3,
                };
                let _: () = redis::cmd("SET")
                    .arg(self.keys.fence())
                    .arg(ahead)
                    .query_async(conn)
                    .await?;
                format!("fence key {ahead}")
            }
            Op::LoseData => {
                let _: () = redis::cmd("DEL")
                    .arg(&lock)
                    .arg(self.keys.fence())
                    .arg(self.keys.queue())
                    .arg(self.keys.waiters())
                    .query_async(conn)
                    .await?;
                "lost".into()
            }
        };
        Ok(reply)
    }

    /// The model's tick at server instant `t_us`, with `store`'s clock set
    /// to read `t_us` then.
    fn at(&self, store: &mut Store, t_us: u64) -> u32 {
        let now =
            u32::try_from(i64::try_from(t_us / 1000).unwrap_or(0) - self.base_ms).unwrap_or(0);
        store.clock_step = i64::try_from(t_us).unwrap_or(0) - i64::from(now) * 10;
        now
    }

    /// Runs `op` on a copy of the model's store and resource at the server
    /// instant `t_us` (`revoke.lua` reads the clock a second time, for its
    /// `pass_on`: at `t2_us`); returns the reply and the new store and
    /// resource.
    fn run_model(
        &self,
        op: &Op,
        t_us: u64,
        t2_us: u64,
        real_reply: &str,
    ) -> (Reply, Store, Resource, u32) {
        let mut store = self.store.clone();
        let mut res = self.res;
        let now = self.at(&mut store, t_us);
        let ttl = self.ttl_ticks;
        let reply = match op {
            Op::Grant {
                caller,
                with_member,
            } => {
                let c = &self.callers[*caller];
                let queued = store.queue.iter().any(|w| w.token == c.token);
                let queues = c.member.is_some() && (*with_member || queued);
                let g = store.grant(now, c.token, ttl, model_mode(c.mode), queues, ttl);
                grant_reply(Some(g))
            }
            Op::GrantMany { callers } => callers
                .iter()
                .map(
                    |&i| match store.grant_batched(now, self.callers[i].token, ttl) {
                        Some(Grant::Held(_) | Grant::Reserved(_)) => "held".to_owned(),
                        other => grant_reply(other),
                    },
                )
                .collect::<Vec<_>>()
                .join(", "),
            Op::Release { caller } => match self.callers[*caller].granted {
                None => "no value".into(),
                Some(f) => store
                    .release(now, self.callers[*caller].token, f)
                    .0
                    .to_string(),
            },
            Op::ReleaseMany { callers } => {
                let codes: Vec<i64> = callers
                    .iter()
                    .filter_map(|&i| {
                        let c = &self.callers[i];
                        c.granted
                            .map(|f| store.release_batched(now, c.token, f).map_or(2, i64::from))
                    })
                    .collect();
                format!("{codes:?}")
            }
            Op::Extend { caller } => match self.callers[*caller].granted {
                None => "no value".into(),
                Some(f) => store
                    .extend(now, self.callers[*caller].token, f, ttl)
                    .to_string(),
            },
            Op::ExtendMany { callers } => {
                let mut pairs = Vec::new();
                let mut index = 0;
                for &i in callers {
                    let c = &self.callers[i];
                    let Some(f) = c.granted else { continue };
                    index += 1;
                    let code = store.extend(now, c.token, f, ttl);
                    if code != 1 {
                        pairs.push(index);
                        pairs.push(i64::from(code));
                    }
                }
                format!("{pairs:?}")
            }
            Op::Leave { caller } => match &self.callers[*caller].member {
                None => "no member".into(),
                Some(_) => store.leave(now, self.callers[*caller].token).0.to_string(),
            },
            Op::Revoke => {
                let (fence, deposed) = store.depose(now);
                let later = self.at(&mut store, t2_us);
                store.pass_on(later);
                format!(
                    "fence {:?} deposed {:?} at {:?}",
                    i64::try_from(fence).ok(),
                    deposed.map(|(t, _)| t),
                    deposed
                        .and_then(|(_, f)| f)
                        .and_then(|f| i64::try_from(f).ok())
                )
            }
            Op::Write {
                caller,
                fence,
                change,
            } => {
                let c = &self.callers[*caller];
                let before = res.fence;
                let change = match change {
                    0 => Change::Register,
                    1 => Change::Seal,
                    v => Change::Write(*v),
                };
                let holder = if change == Change::Seal {
                    model::REVOKED
                } else {
                    c.token
                };
                let accepted = res.write(*fence, holder, change, false);
                format!(
                    "accepted {accepted:?} stored {:?}",
                    before.and_then(|f| i64::try_from(f).ok())
                )
            }
            Op::NewAcquisition { .. } => "new token".into(),
            Op::ExpireLock => {
                store.lock = None;
                "expired".into()
            }
            Op::EndWaiterLease { token } => {
                if let Some(w) = store.queue.iter_mut().find(|w| w.token == *token) {
                    w.lease_end = 0;
                }
                "lease ended".into()
            }
            Op::FenceAhead => {
                // The value is the harness's choice, read from its reply.
                store.fence_key = real_reply
                    .strip_prefix("fence key ")
                    .and_then(|f| f.parse().ok());
                real_reply.to_owned()
            }
            Op::LoseData => {
                store.lose_data();
                "lost".into()
            }
        };
        (reply, store, res, now)
    }

    /// The instants the script may have read that could decide
    /// differently, in `[t0, t1]`.
    fn candidates(&self, t0: u64, t1: u64, real: &Keys) -> Vec<u64> {
        let mut out = vec![t0, t1];
        // A clock fence minted in this call is the instant itself (when it
        // is above the last fence + 1).
        if let Some(f) = real.fence {
            out.push(f);
        }
        let base_us = u64::try_from(self.base_ms).unwrap_or(0) * 1000;
        let starving = self.store.starving.unwrap_or(u64::MAX);
        for w in &self.store.queue {
            let b = w.arrived.saturating_add(starving);
            out.extend([b.saturating_sub(1), b]);
            let end = base_us + u64::from(w.lease_end) * 1000;
            out.extend([end.saturating_sub(1), end]);
        }
        out.retain(|t| (t0..=t1).contains(t));
        out.sort_unstable();
        out.dedup();
        out
    }

    /// One operation on both sides; `Err` is the first disagreement.
    async fn step(&mut self, step: usize, op: Op) -> Result<std::result::Result<(), Mismatch>> {
        let t0 = time_us(&mut self.conn).await?;
        let real_reply = self.run_real(&op).await?;
        let t1 = time_us(&mut self.conn).await?;
        let (real, real_scores) = self.real_keys().await?;
        self.ops += 1;
        let mut first = None;
        let instants = self.candidates(t0, t1, &real);
        // A revoke's revocation fence is the first instant it read.
        let mut firsts = instants.clone();
        if let Op::Revoke = op
            && let Some(f) = real_reply
                .strip_prefix("fence Some(")
                .and_then(|r| r.split(')').next())
                .and_then(|f| f.parse().ok())
                .filter(|f| (t0..=t1).contains(f))
        {
            firsts.push(f);
        }
        for &t in &firsts {
            let seconds = match op {
                Op::Revoke => instants.iter().copied().filter(|&t2| t2 >= t).collect(),
                _ => vec![t],
            };
            for t2 in seconds {
                let (reply, store, res, now) = self.run_model(&op, t, t2, &real_reply);
                let keys = Self::model_keys(&store, &res, now);
                if reply == real_reply && keys == real {
                    self.tally(&op, &real_reply, &store);
                    self.adopt(store, res, &real_scores, t0, t1, &op)?;
                    return Ok(Ok(()));
                }
                first.get_or_insert((reply, keys));
            }
        }
        let model = match first {
            Some((reply, keys)) => format!("{reply} | {keys:?}"),
            None => "no instant in the call's window".into(),
        };
        Ok(Err(Mismatch {
            step,
            op,
            real: format!("{real_reply} | {real:?}"),
            model,
        }))
    }

    /// Counts the kind of outcome `op` had (before the model takes `after`).
    fn tally(&mut self, op: &Op, reply: &str, after: &Store) {
        let before = self.store.live_lock(0).map(|h| h.token);
        let mut kinds = Vec::new();
        let word = reply.split(' ').next().unwrap_or("");
        match op {
            Op::Grant { .. } => kinds.push(match word {
                "granted" if before.is_some() => "grant: a retry gets its grant back",
                "granted" => "grant: granted",
                "held" => "grant: held by another",
                _ => "grant: reserved for the fair head",
            }),
            Op::GrantMany { .. } => {
                if reply.contains("granted") {
                    kinds.push("batched grant: granted");
                }
                if reply.contains("held") {
                    kinds.push("batched grant: held");
                }
                if reply.contains("alone") {
                    kinds.push("batched grant: sent back alone");
                }
            }
            Op::Release { .. } => kinds.push(match reply {
                "1" => "release: released",
                "0" => "release: absent",
                "-1" => "release: another's",
                _ => "release: no grant yet",
            }),
            Op::ReleaseMany { .. } => {
                if reply.contains('2') {
                    kinds.push("batched release: sent back alone");
                }
                if reply.contains('1') {
                    kinds.push("batched release: released or another's");
                }
            }
            Op::Extend { .. } | Op::ExtendMany { .. } if reply.contains('-') => {
                kinds.push("extend: another's");
            }
            Op::Leave { .. } if reply == "2" => kinds.push("leave: a lock handed over released"),
            Op::Revoke => kinds.push(if reply.contains("deposed None") {
                "revoke: free"
            } else {
                "revoke: deposed"
            }),
            Op::Write { .. } => kinds.push(if reply.starts_with("accepted true") {
                "write: accepted"
            } else {
                "write: refused"
            }),
            _ => {}
        }
        // A hand-over: the lock went to a waiter that was queued.
        if let Some(h) = after.live_lock(0)
            && before != Some(h.token)
            && let Some(w) = self.store.queue.iter().find(|w| w.token == h.token)
            && !matches!(op, Op::Grant { .. })
        {
            kinds.push(match w.mode {
                model::WaitMode::Fair => "hand-over: to a fair head",
                _ => "hand-over: to a starving notify head",
            });
        }
        // The guide layout's own branches (a bare value: the retry's fence
        // from the fence key, the compare by token alone).
        if self.store.bare {
            if kinds.contains(&"grant: a retry gets its grant back") {
                kinds.push("guide layout: a retry gets the fence key back");
            }
            if kinds.contains(&"release: released") {
                kinds.push("guide layout: a release by token");
            }
        }
        for kind in kinds {
            *self.seen.entry(kind).or_default() += 1;
        }
    }

    /// Takes the model's new state, with the time-derived scores Redis
    /// wrote (checked to lie in the call's window) and the callers' grants.
    fn adopt(
        &mut self,
        mut store: Store,
        res: Resource,
        real: &Scores,
        t0: u64,
        t1: u64,
        op: &Op,
    ) -> Result<()> {
        let window_ms = i64::try_from(t1 / 1000 - t0 / 1000)? + 1;
        for w in &mut store.queue {
            let (arrived, lease_end) = *real
                .by_token
                .get(&w.token)
                .context("a queued token without scores")?;
            let old = self.scores.by_token.get(&w.token);
            ensure!(
                old.is_some_and(|o| o.0 == arrived) || (t0..=t1).contains(&arrived),
                "{op:?}: the arrival of {} is {arrived}, outside [{t0}, {t1}]",
                w.token
            );
            ensure!(
                (i64::from(w.lease_end) - lease_end.max(0)).abs() <= window_ms,
                "{op:?}: the waiter lease of {} ends at {lease_end}, the model's at {}",
                w.token,
                w.lease_end
            );
            w.arrived = arrived;
            w.lease_end = u32::try_from(lease_end.max(0))?;
        }
        self.scores = real.clone();
        // What each caller was granted: a grant's reply, or a hand-over.
        if let Some(h) = store.lock {
            self.fences.insert(h.fence);
            if let Some(c) = self.callers.iter_mut().find(|c| c.token == h.token) {
                c.granted = Some(h.fence);
            }
        }
        if let Some(f) = store.fence_key {
            self.fences.insert(f);
        }
        if let Op::NewAcquisition { caller } = *op {
            self.callers[caller].token = self.next_token;
            self.callers[caller].granted = None;
            self.next_token = self.next_token.checked_add(1).context("out of tokens")?;
            self.set_member(caller);
        }
        self.store = store;
        self.res = res;
        Ok(())
    }
}

/// Runs seed `seed`; returns the operations run and the first mismatch.
async fn run_seed(
    server: &RedisServer,
    seed: u64,
    mutation: Option<ScriptMutation>,
    seen: &mut std::collections::BTreeMap<&'static str, usize>,
) -> Result<(usize, Option<Mismatch>)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut run = Run::new(server, seed, mutation).await?;
    let mut mismatch = None;
    for step in 0..OPS {
        let op = run.random_op(&mut rng);
        if let Err(m) = run.step(step, op).await? {
            mismatch = Some(m);
            break;
        }
    }
    for (kind, n) in &run.seen {
        *seen.entry(kind).or_default() += n;
    }
    Ok((run.ops, mismatch))
}

/// Every kind of outcome the sequences must reach.
const KINDS: [&str; 23] = [
    "guide layout: a retry gets the fence key back",
    "guide layout: a release by token",
    "grant: granted",
    "grant: a retry gets its grant back",
    "grant: held by another",
    "grant: reserved for the fair head",
    "batched grant: granted",
    "batched grant: held",
    "batched grant: sent back alone",
    "release: released",
    "release: absent",
    "release: another's",
    "batched release: sent back alone",
    "batched release: released or another's",
    "extend: another's",
    "leave: a lock handed over released",
    "revoke: free",
    "revoke: deposed",
    "write: accepted",
    "write: refused",
    "hand-over: to a fair head",
    "hand-over: to a starving notify head",
    "release: no grant yet",
];

fn rt() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

#[test]
fn the_real_scripts_agree_with_the_model_on_every_operation() -> Result<()> {
    let server = RedisServer::start();
    rt()?.block_on(async {
        let mut total = 0;
        let mut seen = std::collections::BTreeMap::new();
        for seed in 0..SEEDS {
            let (ops, mismatch) = run_seed(&server, seed, None, &mut seen).await?;
            total += ops;
            if let Some(m) = mismatch {
                bail!("seed {seed}: the scripts and the model disagree at {m}");
            }
        }
        eprintln!("{total} operations over {SEEDS} seeds agree; outcomes: {seen:#?}");
        ensure!(total == usize::try_from(SEEDS)? * OPS);
        for kind in KINDS {
            ensure!(seen.contains_key(kind), "no operation reached {kind:?}");
        }
        Ok(())
    })
}

#[test]
fn each_broken_script_is_caught() -> Result<()> {
    let server = RedisServer::start();
    rt()?.block_on(async {
        for mutation in ScriptMutation::ALL.into_iter().filter(|m| m.breaks_mutex()) {
            let mut caught = None;
            let mut total = 0;
            for seed in 0..SEEDS {
                let (ops, mismatch) = run_seed(
                    &server,
                    1000 + seed,
                    Some(mutation),
                    &mut Default::default(),
                )
                .await?;
                total += ops;
                if let Some(m) = mismatch {
                    caught = Some((seed, m));
                    break;
                }
            }
            let Some((seed, m)) = caught else {
                bail!("{mutation:?} went unnoticed in {total} operations");
            };
            eprintln!(
                "{mutation:?}: caught after {total} operations (seed {}): {m}",
                1000 + seed
            );
        }
        Ok(())
    })
}
