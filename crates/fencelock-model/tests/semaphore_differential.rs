//! The semaphore's scripts cannot drift from the model's semaphore store
//! ([`SemStore`], the transitions the semaphore model checks): random
//! operation sequences (seeded) run against the real `sem_grant.lua`,
//! `sem_release.lua` and `sem_extend.lua` on a real redis-server and
//! against [`SemStore`], every reply and the live permits and fence key
//! compared after each operation. Each deliberately broken script that
//! concerns a semaphore ([`ScriptMutation::breaks_semaphore`]) must be
//! caught.
//!
//! How the two are held together:
//! - **Calls** are built by the library's own operation types
//!   ([`ProtocolScripts`]): the arguments are what the engine sends.
//! - **Tokens**: the model's token `n` is `tokN` in Redis.
//! - **Fences**: counter-mode fences are compared exactly; a clock-mode
//!   fence must be above every fence issued before, and the model mints
//!   with the clock the script read (the real fence is `max(last + 1,
//!   clock)`, so the model's equals it exactly when the rule holds).
//! - **Time** is the harness's: permits are a minute long, and an
//!   operation makes one lapse on both sides at once (its deadline set in
//!   the past in Redis, its expiry to now in the model). Only live permits
//!   are compared (Redis drops lapsed fields lazily).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::testing::{ProtocolScripts, ScriptMutation};
use fencelock::{FenceMode, KeyLayout, LockKeys, LockOptions};
use fencelock_model::semaphore::SemStore;
use fencelock_model::store::Token;
use fencelock_testkit::RedisServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;
use redis::aio::MultiplexedConnection;

/// Operations per seed.
const OPS: usize = 300;
/// Seeds of the real scripts (clock and counter fences in turn).
const SEEDS: u64 = 12;
/// Callers.
const TOKENS: u8 = 5;
/// The model's lease, in ticks: nothing lapses but what the harness lapses.
const TTL: u32 = 1_000_000;

fn token_text(t: Token) -> String {
    format!("tok{t}")
}

/// One operation.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A grant attempt by a token.
    Grant(Token),
    /// The release of a token's last permit, in its slot or (a stale or
    /// wrong call) in the next one.
    Release(Token, bool),
    /// Renewals of these tokens' last permits in one call.
    Extend(u8),
    /// The permit in a slot lapses.
    Lapse(u8),
}

/// One seed's run: the real scripts, the model, and what each token was
/// last granted (slot, store fence).
struct Run {
    scripts: ProtocolScripts,
    conn: MultiplexedConnection,
    model: SemStore,
    permits: u8,
    counter: bool,
    last: BTreeMap<Token, (u8, u64)>,
    now: u32,
    issued: u64,
    /// The reply kinds reached (a clean run must reach every one).
    reached: BTreeSet<String>,
}

impl Run {
    fn key(&self) -> &str {
        self.scripts.keys().lock()
    }

    /// The live permits in Redis: slot → (token, fence).
    async fn real_live(&mut self) -> Result<BTreeMap<u8, (String, u64)>> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut self.conn).await?;
        let now_ms = secs * 1000 + micros / 1000;
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.key())
            .query_async(&mut self.conn)
            .await?;
        let mut live = BTreeMap::new();
        for (field, value) in fields {
            if field == "permits" {
                continue;
            }
            let mut parts = value.rsplitn(3, ':');
            let deadline: u64 = parts.next().context("deadline")?.parse()?;
            let fence: u64 = parts.next().context("fence")?.parse()?;
            let token = parts.next().context("token")?.to_owned();
            if deadline > now_ms {
                live.insert(field.parse()?, (token, fence));
            }
        }
        Ok(live)
    }

    fn model_live(&self) -> BTreeMap<u8, (String, u64)> {
        (0..self.model.slots.len())
            .filter_map(|slot| {
                self.model
                    .live(slot, self.now)
                    .map(|h| (slot as u8, (token_text(h.token), h.fence)))
            })
            .collect()
    }

    fn random_op(&self, rng: &mut StdRng) -> Op {
        match rng.random_range(0..10) {
            0..=3 => Op::Grant(rng.random_range(0..TOKENS)),
            4..=6 => Op::Release(rng.random_range(0..TOKENS), rng.random_range(0..5) == 0),
            7 | 8 => Op::Extend(rng.random_range(1..(1 << TOKENS))),
            _ => Op::Lapse(rng.random_range(0..self.permits)),
        }
    }

    /// Runs `op` on both sides; `Err` is a mismatch (or a failure).
    async fn step(&mut self, op: Op) -> Result<()> {
        self.now += 1;
        match op {
            Op::Grant(tok) => {
                let reply: Vec<Value> = self
                    .scripts
                    .sem_grant(&token_text(tok), u32::from(self.permits))
                    .invoke_async(&mut self.conn)
                    .await?;
                let code = int(reply.first())?;
                if code == 1 {
                    let fence = u64::try_from(int(reply.get(1))?)?;
                    let slot = u8::try_from(int(reply.get(2))?)?;
                    let retry = self.last.get(&tok).is_some_and(|&(s, f)| {
                        (s, f) == (slot, fence)
                            && self.model.live(usize::from(s), self.now).is_some()
                    });
                    // The model mints with the clock the script read: the
                    // real fence, if it is a new one.
                    let clock = if self.counter || retry { 0 } else { fence };
                    let model = self
                        .model
                        .grant(tok, self.now, TTL, clock, false)
                        .context("the scripts granted, the model refused")?;
                    ensure!(
                        (model.slot, model.fence, model.retry) == (slot, fence, retry),
                        "granted slot {slot} fence {fence} (retry {retry}), the model {model:?}"
                    );
                    self.reached.insert(format!("grant retry={retry}"));
                    if !retry {
                        ensure!(
                            fence > self.issued,
                            "fence {fence} not above {}",
                            self.issued
                        );
                        self.issued = fence;
                    }
                    self.last.insert(tok, (slot, fence));
                } else {
                    ensure!(code == 0, "grant replied {reply:?}");
                    let model = self.model.grant(tok, self.now, TTL, 0, false);
                    ensure!(model.is_none(), "the scripts refused, the model {model:?}");
                    self.reached.insert("grant refused".into());
                }
            }
            Op::Release(tok, wrong) => {
                let Some(&(slot, fence)) = self.last.get(&tok) else {
                    return Ok(());
                };
                let slot = if wrong {
                    (slot + 1) % self.permits
                } else {
                    slot
                };
                let real: i64 = self
                    .scripts
                    .sem_release(u32::from(slot), &token_text(tok), fence)
                    .invoke_async(&mut self.conn)
                    .await?;
                let model = self.model.release(slot, tok, fence, self.now, false);
                ensure!(
                    real == i64::from(model),
                    "release replied {real}, the model {model}"
                );
                self.reached.insert(format!("release {real}"));
            }
            Op::Extend(mask) => {
                let permits: Vec<(Token, u8, u64)> = self
                    .last
                    .iter()
                    .filter(|(t, _)| mask & (1 << **t) != 0)
                    .map(|(t, &(s, f))| (*t, s, f))
                    .collect();
                if permits.is_empty() {
                    return Ok(());
                }
                let texts: Vec<String> = permits.iter().map(|(t, _, _)| token_text(*t)).collect();
                let call: Vec<(u32, &str, u64)> = permits
                    .iter()
                    .zip(&texts)
                    .map(|((_, s, f), t)| (u32::from(*s), t.as_str(), *f))
                    .collect();
                let not_extended: Vec<i64> = self
                    .scripts
                    .sem_extend(&call)
                    .invoke_async(&mut self.conn)
                    .await?;
                let mut real = vec![1i64; permits.len()];
                for pair in not_extended.chunks_exact(2) {
                    let i = usize::try_from(pair[0] - 1)?;
                    *real.get_mut(i).context("extend named no permit")? = pair[1];
                }
                for (i, (tok, slot, fence)) in permits.iter().enumerate() {
                    let model = self
                        .model
                        .renew(*slot, (*tok, *fence), self.now, TTL, false);
                    ensure!(
                        real[i] == i64::from(model),
                        "extend of tok{tok} slot {slot} replied {}, the model {model}",
                        real[i]
                    );
                    self.reached.insert(format!("extend {model}"));
                }
            }
            Op::Lapse(slot) => {
                let field = slot.to_string();
                let held: Option<String> = redis::cmd("HGET")
                    .arg(self.key())
                    .arg(&field)
                    .query_async(&mut self.conn)
                    .await?;
                if let Some(held) = held
                    && let Some((ident, _)) = held.rsplit_once(':')
                {
                    let _: () = redis::cmd("HSET")
                        .arg(self.key())
                        .arg(&field)
                        .arg(format!("{ident}:1"))
                        .query_async(&mut self.conn)
                        .await?;
                }
                if let Some(h) = self
                    .model
                    .slots
                    .get_mut(usize::from(slot))
                    .and_then(|h| h.as_mut())
                {
                    h.expires_at = h.expires_at.min(self.now);
                }
            }
        }
        let (real, model) = (self.real_live().await?, self.model_live());
        ensure!(
            real == model,
            "live permits: real {real:?}, model {model:?}"
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
/// the first mismatch; the reply kinds it reached go to `reached`.
async fn run_seed(
    server: &RedisServer,
    seed: u64,
    mutation: Option<ScriptMutation>,
    reached: &mut BTreeSet<String>,
) -> Result<Option<String>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let counter = seed % 2 == 1;
    let permits = 1 + (seed % 3) as u8;
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(60))
        .fence_mode(if counter {
            FenceMode::Counter
        } else {
            FenceMode::Clock
        });
    let keys = LockKeys::new("lock:", KeyLayout::HashTagged, &format!("sem{seed}"))?;
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
        model: SemStore::new(permits),
        permits,
        counter,
        last: BTreeMap::new(),
        now: 0,
        issued: 0,
        reached: BTreeSet::new(),
    };
    for i in 0..OPS {
        let op = run.random_op(&mut rng);
        if let Err(e) = run.step(op).await {
            return Ok(Some(format!("seed {seed}, op {i} {op:?}: {e:#}")));
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
fn the_semaphore_scripts_agree_with_the_model_on_every_operation() -> Result<()> {
    let server = RedisServer::start();
    rt()?.block_on(async {
        let mut reached = BTreeSet::new();
        for seed in 0..SEEDS {
            if let Some(mismatch) = run_seed(&server, seed, None, &mut reached).await? {
                bail!("{mismatch}");
            }
        }
        // Not vacuous: every kind of reply was compared.
        let every = [
            "grant retry=false",
            "grant retry=true",
            "grant refused",
            "release 1",
            "release 0",
            "release -1",
            "extend 1",
            "extend 0",
            "extend -1",
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

#[test]
fn each_broken_semaphore_script_is_caught() -> Result<()> {
    let server = RedisServer::start();
    rt()?.block_on(async {
        let mutations = ScriptMutation::ALL
            .into_iter()
            .filter(|m| m.breaks_semaphore());
        let mut checked = 0;
        for mutation in mutations {
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
            checked += 1;
        }
        ensure!(checked == 4, "{checked} semaphore mutations checked");
        Ok(())
    })
}
