//! The read-write lock's scripts cannot drift from the model's store
//! ([`RwStore`], the transitions the read-write lock model checks): seeded
//! random operation sequences run against the real `rw_grant.lua`,
//! `sem_release.lua` and `sem_extend.lua` on a real redis-server and
//! against [`RwStore`], every reply and the keys compared after each
//! operation. Each deliberately broken script that concerns a read-write
//! lock must be caught.
//!
//! How the two are held together:
//! - **Calls** are built by the library's own operation types
//!   ([`ProtocolScripts`]): the arguments are what the engine sends.
//! - **Tokens**: the model's token `n` is `tokN` in Redis; a caller's queue
//!   member is its token and side.
//! - **Fences**: counter-mode fences are compared exactly; a clock-mode
//!   fence a grant minted must be above every fence issued before, and the
//!   model mints with the clock the script read (the real fence is
//!   `max(last + 1, clock)`, so the model's equals it exactly when the rule
//!   holds). A reader's epoch is compared exactly.
//! - **Time** is the harness's: leases and waiter leases are a minute long
//!   and each operation is one tick of the model; a holder lapses, or a
//!   waiter's lease ends, on both sides at once (its deadline or lease end
//!   set in the past in Redis, to now in the model).
//! - **Keys compared**: every field of the hash, lapsed ones included, with
//!   its token, fence and whether it is live; whether the hash exists; the fence
//!   key; the queue in order, each member's side and whether its waiter
//!   lease is live.
//!
//! The seeds take turns over clock and counter fences and the poll, notify
//! and fair wait modes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::testing::{ProtocolScripts, QueueMember, ScriptMutation};
use fencelock::{Access, FenceMode, KeyLayout, LockKeys, LockOptions, WaitMode};
use fencelock_model::rwlock::{RwBroken, RwCall, RwField, RwReply, RwStore};
use fencelock_model::store::{self, Token};
use fencelock_testkit::RedisServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;
use redis::aio::MultiplexedConnection;

/// Operations per seed.
const OPS: usize = 400;
/// Seeds of the real scripts (each pair of fence modes under each wait
/// mode, four times).
const SEEDS: u64 = 24;
/// Callers.
const TOKENS: u8 = 4;
/// The model's lease and waiter lease, in ticks: nothing lapses but what
/// the harness lapses.
const TTL: u32 = 1_000_000;
/// The real leases.
const LEASE: Duration = Duration::from_secs(60);

fn token_text(t: Token) -> String {
    format!("tok{t}")
}

fn access(writer: bool) -> Access {
    if writer { Access::Write } else { Access::Read }
}

fn side(writer: bool) -> &'static str {
    if writer { "w" } else { "r" }
}

/// One operation; a caller is a token and a side (`true`: the writer's).
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A grant attempt.
    Grant(Token, bool),
    /// The release of what the caller was last granted, in its field or
    /// (a stale or wrong call) in another.
    Release(Token, bool, bool),
    /// Renewals of these callers' last grants in one call (bit `2t + w`).
    Extend(u8),
    /// The holder in this field lapses.
    Lapse(RwField),
    /// The caller's waiter lease ends.
    WaiterLapse(Token, bool),
    /// The caller leaves the queue.
    Leave(Token, bool),
    /// The fence key is lost (clock fences: its retention ended).
    LoseFenceKey,
}

/// One seed's run: the real scripts, the model, and what each caller was
/// last granted.
struct Run {
    scripts: ProtocolScripts,
    conn: MultiplexedConnection,
    model: RwStore,
    counter: bool,
    wait: WaitMode,
    /// The same, as the model names it.
    model_wait: store::WaitMode,
    last: BTreeMap<(Token, bool), (RwField, u64)>,
    /// Callers that an attempt may have queued (cleared by a grant).
    queued: BTreeSet<(Token, bool)>,
    now: u32,
    issued: u64,
    /// The outcomes reached (a clean run must reach every one).
    reached: BTreeSet<String>,
}

impl Run {
    fn key(&self) -> &str {
        self.scripts.keys().lock()
    }

    fn member(&self, tok: Token, writer: bool) -> Option<QueueMember> {
        (self.wait != WaitMode::Poll).then(|| QueueMember {
            client: format!("c{tok}"),
            waiter: u64::from(tok) * 2 + u64::from(writer),
            mode: self.wait,
            ttl: LEASE,
            handover: LEASE,
            token: token_text(tok),
            access: Some(access(writer)),
        })
    }

    async fn now_ms(&mut self) -> Result<u64> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut self.conn).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// The hash in Redis: every holder field → (token, fence, live).
    async fn real_fields(&mut self, now_ms: u64) -> Result<BTreeMap<String, (String, u64, bool)>> {
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.key())
            .query_async(&mut self.conn)
            .await?;
        let mut out = BTreeMap::new();
        for (field, value) in fields {
            if field == "rw" {
                ensure!(value == "1", "the mark is {value:?}");
                continue;
            }
            let mut parts = value.rsplitn(3, ':');
            let deadline: u64 = parts.next().context("deadline")?.parse()?;
            let fence: u64 = parts.next().context("fence")?.parse()?;
            let token = parts.next().context("token")?.to_owned();
            out.insert(field, (token, fence, deadline > now_ms));
        }
        Ok(out)
    }

    /// The model's hash, as [`Run::real_fields`] reads Redis's (a lapsed
    /// holder keeps its token and fence on both sides: the harness moves
    /// only its deadline).
    fn model_fields(&self) -> BTreeMap<String, (String, u64, bool)> {
        self.model
            .fields()
            .into_iter()
            .map(|(f, h)| {
                (
                    f.to_string(),
                    (token_text(h.token), h.fence, h.expires_at > self.now),
                )
            })
            .collect()
    }

    /// The queue in Redis: (token, writer, waiter lease live) in order.
    async fn real_queue(&mut self, now_ms: u64) -> Result<Vec<(String, bool, bool)>> {
        let keys = self.scripts.keys().clone();
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.queue())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn)
            .await?;
        let mut out = Vec::new();
        for m in members {
            let member: QueueMember = m.parse()?;
            let lease_end: Option<u64> = redis::cmd("ZSCORE")
                .arg(keys.waiters())
                .arg(&m)
                .query_async(&mut self.conn)
                .await?;
            out.push((
                member.token,
                member.access == Some(Access::Write),
                lease_end.is_some_and(|e| e > now_ms),
            ));
        }
        Ok(out)
    }

    fn random_op(&self, rng: &mut StdRng) -> Op {
        let caller = |rng: &mut StdRng| (rng.random_range(0..TOKENS), rng.random_bool(0.4));
        let queues = self.wait != WaitMode::Poll;
        loop {
            return match rng.random_range(0..20) {
                0..=7 => {
                    let (t, w) = caller(rng);
                    Op::Grant(t, w)
                }
                8..=10 => {
                    let (t, w) = caller(rng);
                    Op::Release(t, w, rng.random_range(0..5) == 0)
                }
                11..=13 => Op::Extend(rng.random_range(1..=u8::MAX)),
                14 | 15 => Op::Lapse(if rng.random_bool(0.3) {
                    RwField::Writer
                } else {
                    RwField::Reader(rng.random_range(0..3))
                }),
                16 | 17 if queues => {
                    let (t, w) = caller(rng);
                    Op::WaiterLapse(t, w)
                }
                18 if queues => {
                    let (t, w) = caller(rng);
                    Op::Leave(t, w)
                }
                19 if !self.counter => Op::LoseFenceKey,
                _ => continue,
            };
        }
    }

    /// Runs `op` on both sides; `Err` is a mismatch (or a failure).
    async fn step(&mut self, op: Op) -> Result<()> {
        self.now += 1;
        match op {
            Op::Grant(tok, writer) => self.grant(tok, writer).await?,
            Op::Release(tok, writer, wrong) => {
                let Some(&(field, fence)) = self.last.get(&(tok, writer)) else {
                    return Ok(());
                };
                let field = match (wrong, field) {
                    (false, f) => f,
                    (true, RwField::Writer) => RwField::Reader(0),
                    (true, RwField::Reader(0)) => RwField::Writer,
                    (true, RwField::Reader(n)) => RwField::Reader(n - 1),
                };
                let real: i64 = self
                    .scripts
                    .rw_release(&field.to_string(), &token_text(tok), fence)
                    .invoke_async(&mut self.conn)
                    .await?;
                let model = self.model.release(field, tok, fence, self.now);
                ensure!(
                    real == i64::from(model),
                    "release of {field} replied {real}, the model {model}"
                );
                self.reached.insert(format!("release {real}"));
            }
            Op::Extend(mask) => {
                let holders: Vec<(Token, RwField, u64)> = self
                    .last
                    .iter()
                    .filter(|((t, w), _)| mask & (1 << (2 * t + u8::from(*w))) != 0)
                    .map(|(&(t, _), &(f, fence))| (t, f, fence))
                    .collect();
                if holders.is_empty() {
                    return Ok(());
                }
                let texts: Vec<(String, String)> = holders
                    .iter()
                    .map(|(t, f, _)| (f.to_string(), token_text(*t)))
                    .collect();
                let call: Vec<(&str, &str, u64)> = holders
                    .iter()
                    .zip(&texts)
                    .map(|((_, _, fence), (f, t))| (f.as_str(), t.as_str(), *fence))
                    .collect();
                let not_extended: Vec<i64> = self
                    .scripts
                    .rw_extend(&call)
                    .invoke_async(&mut self.conn)
                    .await?;
                let mut real = vec![1i64; holders.len()];
                for pair in not_extended.chunks_exact(2) {
                    let i = usize::try_from(pair[0] - 1)?;
                    *real.get_mut(i).context("extend named no holder")? = pair[1];
                }
                for (i, (tok, field, fence)) in holders.iter().enumerate() {
                    let model = self.model.extend(*field, (*tok, *fence), self.now, TTL);
                    ensure!(
                        real[i] == i64::from(model),
                        "extend of tok{tok} in {field} replied {}, the model {model}",
                        real[i]
                    );
                    self.reached.insert(format!("extend {model}"));
                }
            }
            Op::Lapse(field) => {
                let name = field.to_string();
                let held: Option<String> = redis::cmd("HGET")
                    .arg(self.key())
                    .arg(&name)
                    .query_async(&mut self.conn)
                    .await?;
                if let Some(held) = held
                    && let Some((ident, _)) = held.rsplit_once(':')
                {
                    let _: () = redis::cmd("HSET")
                        .arg(self.key())
                        .arg(&name)
                        .arg(format!("{ident}:1"))
                        .query_async(&mut self.conn)
                        .await?;
                }
                let now = self.now;
                if let Some(h) = self.model.get_mut(field) {
                    h.expires_at = h.expires_at.min(now);
                }
            }
            Op::WaiterLapse(tok, writer) => {
                let Some(member) = self.member(tok, writer) else {
                    return Ok(());
                };
                let waiters = self.scripts.keys().waiters();
                // XX: only a member that is there.
                let _: () = redis::cmd("ZADD")
                    .arg(&waiters)
                    .arg("XX")
                    .arg(1)
                    .arg(member.to_string())
                    .query_async(&mut self.conn)
                    .await?;
                let now = self.now;
                for w in &mut self.model.queue {
                    if (w.token, w.writer) == (tok, writer) {
                        w.lease_end = w.lease_end.min(now);
                    }
                }
            }
            Op::Leave(tok, writer) => {
                let Some(member) = self.member(tok, writer) else {
                    return Ok(());
                };
                let real: i64 = self
                    .scripts
                    .rw_leave(&member)
                    .invoke_async(&mut self.conn)
                    .await?;
                let model = self.model.leave(tok, writer, self.now);
                ensure!(
                    real == i64::from(model),
                    "leave of tok{tok} ({}) replied {real}, the model {model}",
                    side(writer)
                );
                self.queued.remove(&(tok, writer));
                self.reached.insert(format!("leave {real}"));
            }
            Op::LoseFenceKey => {
                let _: () = redis::cmd("DEL")
                    .arg(self.scripts.keys().fence())
                    .query_async(&mut self.conn)
                    .await?;
                self.model.fence_key = None;
            }
        }
        self.compare().await
    }

    async fn grant(&mut self, tok: Token, writer: bool) -> Result<()> {
        let member = self.member(tok, writer);
        let queued = member.is_some() && self.queued.contains(&(tok, writer));
        let reply: Vec<Value> = self
            .scripts
            .rw_grant_waiting(&token_text(tok), access(writer), member.as_ref(), queued)
            .invoke_async(&mut self.conn)
            .await?;
        let call = RwCall {
            token: tok,
            writer,
            wait: self.model_wait,
            member: member.is_some(),
            queued,
            ttl: TTL,
            waiter_lease: TTL,
        };
        let before = self.model.fence_key;
        let code = int(reply.first())?;
        let who = format!("tok{tok} ({})", side(writer));
        match code {
            1 => {
                let fence = u64::try_from(int(reply.get(1))?)?;
                let field = match reply.get(2) {
                    Some(v) => redis::from_redis_value::<String>(v.clone())?,
                    None => bail!("a grant without a field: {reply:?}"),
                };
                let field = RwField::parse(&field).context("not a read-write lock's field")?;
                // The model mints with the clock the script read: the real
                // fence, if it minted.
                let clock = if self.counter { 0 } else { fence };
                let model = self.model.grant(&call, self.now, clock);
                let RwReply::Granted {
                    field: f,
                    fence: m,
                    retry,
                } = model
                else {
                    bail!("{who} granted {field} with {fence}, the model {model:?}");
                };
                ensure!(
                    (f, m) == (field, fence),
                    "{who} granted {field} with {fence}, the model {f} with {m}"
                );
                let minted = self.model.fence_key != before;
                if minted {
                    ensure!(
                        fence > self.issued,
                        "{who}: fence {fence} not above {}",
                        self.issued
                    );
                    self.issued = fence;
                }
                if !writer && !retry {
                    ensure!(
                        Some(fence) == self.model.fence_key,
                        "{who}: epoch {fence}, the last fence issued {:?}",
                        self.model.fence_key
                    );
                }
                let kind = match (retry, minted, writer) {
                    (true, _, _) => "retry",
                    (false, true, false) => "with a minted epoch",
                    (false, _, _) => "new",
                };
                self.reached
                    .insert(format!("grant {} {kind}", side(writer)));
                self.last.insert((tok, writer), (field, fence));
                self.queued.remove(&(tok, writer));
            }
            0 | 2 => {
                let last = match reply.get(2) {
                    None | Some(Value::Nil) => None,
                    Some(v) => Some(redis::from_redis_value::<String>(v.clone())?.parse::<u64>()?),
                };
                let model = self.model.grant(&call, self.now, 0);
                match (code, model) {
                    (0, RwReply::Held { soonest, last: l }) => {
                        let ms = int(reply.get(1))?;
                        ensure!(
                            last == l && soonest > 0 && (1..=60_000).contains(&ms),
                            "{who} refused (held, {ms} ms, last {last:?}), the model {model:?}"
                        );
                        self.reached.insert(format!("held {}", side(writer)));
                    }
                    (2, RwReply::Reserved { last: l }) => {
                        ensure!(
                            last == l,
                            "{who} refused (reserved, last {last:?}), the model {model:?}"
                        );
                        self.reached.insert(format!("reserved {}", side(writer)));
                    }
                    _ => bail!("{who} refused ({reply:?}), the model {model:?}"),
                }
                if member.is_some() {
                    self.queued.insert((tok, writer));
                }
            }
            _ => bail!("{who}: grant replied {reply:?}"),
        }
        Ok(())
    }

    /// The keys on both sides after an operation.
    async fn compare(&mut self) -> Result<()> {
        let now_ms = self.now_ms().await?;
        let (real, model) = (self.real_fields(now_ms).await?, self.model_fields());
        ensure!(real == model, "the hash: real {real:?}, model {model:?}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(self.key())
            .query_async(&mut self.conn)
            .await?;
        ensure!(
            exists == self.model.hash_exists(self.now),
            "the hash exists: real {exists}, model {}",
            !exists
        );
        let fence_key: Option<u64> = redis::cmd("GET")
            .arg(self.scripts.keys().fence())
            .query_async(&mut self.conn)
            .await?;
        ensure!(
            fence_key == self.model.fence_key,
            "fence key: real {fence_key:?}, model {:?}",
            self.model.fence_key
        );
        let real = self.real_queue(now_ms).await?;
        let model: Vec<(String, bool, bool)> = self
            .model
            .queue
            .iter()
            .map(|w| (token_text(w.token), w.writer, w.lease_end > self.now))
            .collect();
        ensure!(real == model, "the queue: real {real:?}, model {model:?}");
        if model.iter().any(|(_, _, live)| !live) {
            self.reached.insert("a dead waiter in the queue".into());
        }
        Ok(())
    }
}

fn int(v: Option<&Value>) -> Result<i64> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => bail!("expected an integer, got {other:?}"),
    }
}

/// One seed: `Ok(None)` when every operation agreed, `Ok(Some(why))` at
/// the first mismatch; the outcomes it reached go to `reached`.
async fn run_seed(
    server: &RedisServer,
    seed: u64,
    mutation: Option<ScriptMutation>,
    reached: &mut BTreeSet<String>,
) -> Result<Option<String>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let counter = seed % 2 == 1;
    let (wait, model_wait) = [
        (WaitMode::Poll, store::WaitMode::Poll),
        (WaitMode::Notify, store::WaitMode::Notify),
        (WaitMode::Fair, store::WaitMode::Fair),
    ][(seed / 2 % 3) as usize];
    let opts = LockOptions::default()
        .ttl(LEASE)
        .waiter_lease(LEASE)
        .wait_mode(wait)
        .fence_mode(if counter {
            FenceMode::Counter
        } else {
            FenceMode::Clock
        });
    let keys = LockKeys::new("lock:", KeyLayout::HashTagged, &format!("rw{seed}"))?;
    let mut scripts = ProtocolScripts::new(keys, opts);
    if let Some(m) = mutation {
        scripts = scripts.mutated(m)?;
    }
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    // Each run starts from nothing (runs reuse seeds under each mutation).
    let _: () = redis::cmd("FLUSHDB").query_async(&mut conn).await?;
    let mut run = Run {
        scripts,
        conn,
        model: RwStore::new(RwBroken::default()),
        counter,
        wait,
        model_wait,
        last: BTreeMap::new(),
        queued: BTreeSet::new(),
        now: 0,
        issued: 0,
        reached: BTreeSet::new(),
    };
    for i in 0..OPS {
        let op = run.random_op(&mut rng);
        if let Err(e) = run.step(op).await {
            return Ok(Some(format!(
                "seed {seed} ({wait:?}), op {i} {op:?}: {e:#}"
            )));
        }
    }
    reached.append(&mut run.reached);
    Ok(None)
}

fn rt() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

#[test]
fn the_rwlock_scripts_agree_with_the_model_on_every_operation() -> Result<()> {
    let server = RedisServer::start();
    rt()?.block_on(async {
        let mut reached = BTreeSet::new();
        for seed in 0..SEEDS {
            if let Some(mismatch) = run_seed(&server, seed, None, &mut reached).await? {
                bail!("{mismatch}");
            }
        }
        // Not vacuous: every kind of outcome was compared.
        let every = [
            "grant w new",
            "grant w retry",
            "grant r new",
            "grant r with a minted epoch",
            "grant r retry",
            "held w",
            "held r",
            "reserved w",
            "reserved r",
            "release 1",
            "release 0",
            "release -1",
            "extend 1",
            "extend 0",
            "extend -1",
            "leave 1",
            "leave 0",
            "a dead waiter in the queue",
        ];
        for kind in every {
            ensure!(
                reached.contains(kind),
                "never reached: {kind} (reached {reached:?})"
            );
        }
        Ok(())
    })
}

/// The script mutations that break a read-write lock's scripts: its grant's
/// mint, and the compare of the release and the renewal it shares with the
/// semaphore.
const RW_MUTATIONS: [ScriptMutation; 3] = [
    ScriptMutation::MintWithoutIncrement,
    ScriptMutation::ReleaseWithoutTokenCheck,
    ScriptMutation::ExtendWithoutTokenCheck,
];

#[test]
fn each_broken_rwlock_script_is_caught() -> Result<()> {
    let server = RedisServer::start();
    rt()?.block_on(async {
        for mutation in RW_MUTATIONS {
            let mut caught = None;
            for seed in 0..SEEDS {
                if let Some(m) =
                    run_seed(&server, 100 + seed, Some(mutation), &mut BTreeSet::new()).await?
                {
                    caught = Some(m);
                    break;
                }
            }
            let Some(m) = caught else {
                bail!("{mutation:?} went unnoticed in {SEEDS} seeds");
            };
            eprintln!("{mutation:?}: caught at {m}");
        }
        Ok(())
    })
}
