//! The benchmark scenarios of docs/design.md §6: each is measured in one
//! function here and returns its typed result.
//!
//! `uncontended` and `many` are one kind of measurement ([`Cycles`]):
//! fencelock and its references (the fenced floor, the unfenced reference,
//! PING) take turns in short slices (A B C D, B C D A, …), each round
//! giving every contestant the same measuring time, so a noisy second of
//! the machine falls on all of them; each round yields its own ratios, and a
//! record reports their median and spread over the rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use fencelock::{LockClient, LockOptions, WaitMode};
use tokio::time::Instant;

use crate::conn::{Opener, RefConn, Tls, Topology};
use crate::error::{Error, Result};
use crate::floor::{self, Cycler};
use crate::measure::{
    ServerCounters, Spread, heap_bytes, jain, process_cpu, quantile, redis_benchmark_ping, spread,
};
use crate::placement::{self, Placement};
use crate::url::RedisUrl;

/// Settings shared by the scenarios of one run.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) url: RedisUrl,
    pub(crate) tls: Tls,
    pub(crate) prefix: String,
    /// Names this run's keys (`bench:{run_id}:…`) apart from other runs'.
    pub(crate) run_id: String,
    /// Measuring time of each contestant in each round.
    pub(crate) duration: Duration,
    /// Rounds of every scenario (`--repeat`).
    pub(crate) rounds: usize,
    /// Length of one slice of an interleaved round.
    pub(crate) slice: Duration,
    pub(crate) options: LockOptions,
}

impl Setup {
    pub(crate) async fn client(&self) -> Result<LockClient> {
        let mut builder = LockClient::builder(self.url.raw())
            .prefix(&self.prefix)
            .defaults(self.options.clone());
        if let Some(ca) = &self.tls.ca {
            builder = builder.tls_ca(ca);
        }
        if let Some((cert, key)) = &self.tls.client {
            builder = builder.tls_client_cert(cert, key);
        }
        Ok(builder.connect().await?)
    }

    async fn opener(&self) -> Result<Opener> {
        Opener::new(&self.url, &self.tls).await
    }

    /// The Redis key of lock `name` in the default layout.
    fn lock_key(&self, name: &str) -> String {
        format!("{}{{{name}}}", self.prefix)
    }
}

/// One contestant of a [`Cycles`] measurement, over all rounds.
#[derive(Debug, Clone)]
pub struct Contestant {
    /// Cycles (or PINGs) per second: median and spread over the rounds.
    pub per_s: Spread,
    /// The first half of a cycle (acquire, grant, PING) in µs, sorted.
    pub first_us: Vec<f64>,
    /// The second half (release) in µs, sorted (empty for PING).
    pub second_us: Vec<f64>,
    /// Redis CPU µs per cycle (all masters).
    pub redis_cpu_us_per_cycle: f64,
    /// This process's CPU µs per cycle (the client side: every contestant
    /// runs on one thread, so 1 / this bounds its rate).
    pub client_cpu_us_per_cycle: f64,
    /// Redis commands per cycle (a script's own calls included).
    pub commands_per_cycle: f64,
    /// Socket reads Redis made per cycle: how well the client batched its
    /// requests into writes (fewer is cheaper for both sides).
    pub reads_per_cycle: f64,
}

impl Contestant {
    /// The `q`-quantile of the first half, in µs.
    pub fn first_us(&self, q: f64) -> f64 {
        quantile(&self.first_us, q)
    }

    /// The `q`-quantile of the second half, in µs.
    pub fn second_us(&self, q: f64) -> f64 {
        quantile(&self.second_us, q)
    }
}

/// `uncontended` (one task, one name, one connection) or `many` (one task
/// per name, all sharing one client or connection): acquire + release
/// cycles of fencelock next to its references, interleaved.
#[derive(Debug, Clone)]
pub struct Cycles {
    /// The deployment measured.
    pub topology: Topology,
    /// Where the measuring thread ran relative to Redis.
    pub placement: Placement,
    /// The wait mode of fencelock's lock options.
    pub mode: WaitMode,
    /// Tasks, each on a name of its own (1 for `uncontended`).
    pub tasks: usize,
    /// Interleaved rounds measured.
    pub rounds: usize,
    /// fencelock.
    pub fencelock: Contestant,
    /// The fenced floor (two bare scripts).
    pub floor: Contestant,
    /// The unfenced reference (`SET NX PX` + compare-and-delete).
    pub unfenced: Contestant,
    /// `PING` on the same kind of connection, to the lock's server, from as
    /// many tasks.
    pub ping: Contestant,
    /// `PING`s per second that `redis-benchmark -c TASKS` (C) measured in
    /// each round, if it is installed and can reach the server.
    pub redis_benchmark_ping_per_s: Option<Spread>,
    /// fencelock ÷ floor, per round.
    pub ratio_to_floor: Spread,
    /// fencelock ÷ unfenced, per round.
    pub ratio_to_unfenced: Spread,
    /// fencelock ÷ (PING ÷ 2): the share of the 2-round-trip bound.
    pub ratio_to_bound: Spread,
    /// The floor's share of the 2-round-trip bound.
    pub floor_ratio_to_bound: Spread,
    /// The unfenced reference's share of the 2-round-trip bound.
    pub unfenced_ratio_to_bound: Spread,
    /// fencelock ÷ (redis-benchmark's PING ÷ 2).
    pub ratio_to_benchmark_bound: Option<Spread>,
}

impl Cycles {
    /// fencelock's Redis CPU per cycle ÷ the floor's.
    pub fn redis_cpu_ratio_to_floor(&self) -> f64 {
        self.fencelock.redis_cpu_us_per_cycle / self.floor.redis_cpu_us_per_cycle
    }
}

/// Accumulated over one contestant's slices of one round (or of all).
#[derive(Debug, Default)]
struct Tally {
    cycles: u64,
    time: Duration,
    first_us: Vec<f64>,
    second_us: Vec<f64>,
    cpu_s: f64,
    client_cpu: Duration,
    commands: u64,
    reads: u64,
}

/// Most latency samples kept per contestant.
const MAX_SAMPLES: usize = 2_000_000;

impl Tally {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.time.as_secs_f64().max(1e-9)
    }

    fn absorb(&mut self, other: Tally) {
        self.cycles += other.cycles;
        self.time += other.time;
        self.cpu_s += other.cpu_s;
        self.client_cpu += other.client_cpu;
        self.commands += other.commands;
        self.reads += other.reads;
        let room = MAX_SAMPLES.saturating_sub(self.first_us.len());
        self.first_us.extend(other.first_us.into_iter().take(room));
        let room = MAX_SAMPLES.saturating_sub(self.second_us.len());
        self.second_us
            .extend(other.second_us.into_iter().take(room));
    }
}

/// Runs `cycler` until `until`, in the calling task.
async fn run_until(cycler: &mut Cycler, until: Instant, tally: &mut Tally) -> Result<()> {
    loop {
        let (first, second) = cycler.cycle().await?;
        tally.cycles += 1;
        if tally.first_us.len() < MAX_SAMPLES {
            tally.first_us.push(first.as_secs_f64() * 1e6);
            if !second.is_zero() {
                tally.second_us.push(second.as_secs_f64() * 1e6);
            }
        }
        if Instant::now() >= until {
            return Ok(());
        }
    }
}

/// One slice of a contestant: its cyclers (one per task) run until
/// `slice` has passed; one cycler runs in the calling task, more run as
/// one task each.
async fn slice(cyclers: &mut Vec<Cycler>, length: Duration, probe: &mut RefConn) -> Result<Tally> {
    let before = ServerCounters::read(probe).await?;
    let client_before = process_cpu();
    let started = Instant::now();
    let until = started + length;
    let mut tally = Tally::default();
    if cyclers.len() == 1 {
        run_until(&mut cyclers[0], until, &mut tally).await?;
    } else {
        let handles: Vec<_> = cyclers
            .drain(..)
            .map(|mut c| {
                tokio::spawn(async move {
                    let mut t = Tally::default();
                    let r = run_until(&mut c, until, &mut t).await;
                    (c, t, r)
                })
            })
            .collect();
        for h in handles {
            let (c, t, r) = h.await?;
            r?;
            cyclers.push(c);
            tally.absorb(t);
        }
    }
    tally.time = started.elapsed();
    tally.client_cpu = process_cpu().saturating_sub(client_before);
    let after = ServerCounters::read(probe).await?;
    let (commands, cpu_s) = before.delta(after);
    tally.cpu_s = cpu_s;
    tally.commands = commands;
    tally.reads = after.reads_since(before);
    Ok(tally)
}

/// `uncontended` (`tasks` = 1) or `many`: fencelock and its references on
/// names of their own, interleaved in slices, `setup.rounds` times.
pub(crate) async fn cycles(
    setup: &Setup,
    scenario: &str,
    tasks: usize,
    placement: &Placement,
) -> Result<Cycles> {
    // Measured on a single-threaded runtime, as a program driving one
    // connection would run (a multi-threaded one adds a cross-thread
    // wake-up to every reply), every contestant on the same one.
    let (setup, scenario, placement) = (setup.clone(), scenario.to_string(), placement.clone());
    let pin = placement.client_cpu();
    on_current_thread(pin, move |rt| {
        rt.block_on(cycles_on(&setup, &scenario, tasks, placement))
    })
    .await
}

/// Runs `work` on a thread of its own with a single-threaded runtime of its
/// own, as a program driving its connections from one thread would; pinned
/// to CPU `pin` if given (a thread of its own: a pinned thread of the
/// blocking pool would stay pinned for whatever it runs next).
async fn on_current_thread<T: Send + 'static>(
    pin: Option<usize>,
    work: impl FnOnce(&tokio::runtime::Runtime) -> Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fencelock-bench".into())
        .spawn(move || {
            let run = || {
                if let Some(cpu) = pin {
                    placement::pin_this_thread(cpu)?;
                }
                work(
                    &tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?,
                )
            };
            let _ = tx.send(run());
        })
        .map_err(|e| Error::failed(format!("cannot start the measuring thread: {e}")))?;
    rx.await
        .map_err(|_| Error::failed("the measuring thread ended without a result"))?
}

/// Which path [`crate::count_cycles`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CyclePath {
    /// fencelock's `acquire` + `release`.
    Fencelock,
    /// The fenced floor's two scripts.
    Floor,
    /// `SET NX PX`, then compare-and-delete.
    Unfenced,
}

/// Exactly `n` uncontended cycles of `path` on one connection, after the
/// same 20 warm-up cycles as the scenarios, on a single-threaded runtime.
pub(crate) async fn count(setup: &Setup, path: CyclePath, n: u64) -> Result<()> {
    let setup = setup.clone();
    on_current_thread(None, move |rt| rt.block_on(count_on(&setup, path, n))).await
}

async fn count_on(setup: &Setup, path: CyclePath, n: u64) -> Result<()> {
    let name = format!("bench:{}:count", setup.run_id);
    let mut cycler = match path {
        CyclePath::Fencelock => {
            let client = setup.client().await?;
            Cycler::Fencelock {
                opts: client.options(),
                client,
                name,
            }
        }
        CyclePath::Floor | CyclePath::Unfenced => {
            let opener = setup.opener().await?;
            let [floor, unfenced, _ping] =
                floor::references(&opener, &setup.lock_key(&name)).await?;
            if path == CyclePath::Floor {
                floor
            } else {
                unfenced
            }
        }
    };
    for _ in 0..20u64.saturating_add(n) {
        cycler.cycle().await?;
    }
    Ok(())
}

async fn cycles_on(
    setup: &Setup,
    scenario: &str,
    tasks: usize,
    placement: Placement,
) -> Result<Cycles> {
    let opener = setup.opener().await?;
    let client = setup.client().await?;
    let opts = client.options();
    let names: Vec<String> = (0..tasks)
        .map(|i| format!("bench:{}:{scenario}:{i}", setup.run_id))
        .collect();
    // [fencelock, floor, unfenced, ping], one cycler per task each. With
    // one task each reference has its own connection; with many, all tasks
    // of a reference share one, as fencelock's share its client's.
    let mut contestants: Vec<Vec<Cycler>> = vec![Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let shared = opener.open().await?;
    for name in &names {
        contestants[0].push(Cycler::Fencelock {
            client: client.clone(),
            opts: opts.clone(),
            name: name.clone(),
        });
        let key = setup.lock_key(name);
        let refs = if tasks == 1 {
            floor::references(&opener, &key).await?
        } else {
            floor::references_on(&shared, &key)
        };
        for (i, r) in refs.into_iter().enumerate() {
            contestants[i + 1].push(r);
        }
    }
    let mut probe = opener.open().await?;
    // Warm up: scripts loaded, connections open.
    for cyclers in &mut contestants {
        for c in cyclers.iter_mut() {
            for _ in 0..20 {
                c.cycle().await?;
            }
        }
    }
    let bench_target = opener
        .benchmark_target(&mut probe, &setup.lock_key(&names[0]))
        .await
        .ok();
    let slices = (setup.duration.as_secs_f64() / setup.slice.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let slice_len = setup.duration / slices as u32;
    let rounds = setup.rounds.max(1);
    let mut per_round: Vec<[f64; 4]> = Vec::with_capacity(rounds);
    let mut benchmark: Vec<f64> = Vec::new();
    let mut totals: [Tally; 4] = Default::default();
    for _ in 0..rounds {
        let mut round: [Tally; 4] = Default::default();
        for s in 0..slices {
            // Rotate who goes first, so no contestant always follows the
            // same one.
            for k in 0..4 {
                let i = (s + k) % 4;
                let t = slice(&mut contestants[i], slice_len, &mut probe).await?;
                round[i].absorb(t);
            }
        }
        per_round.push([
            round[0].rate(),
            round[1].rate(),
            round[2].rate(),
            round[3].rate(),
        ]);
        if let Some(target) = &bench_target {
            let requests = round[3].cycles;
            if let Some(rate) = redis_benchmark_ping(target, tasks, requests).await {
                benchmark.push(rate);
            }
        }
        for (total, r) in totals.iter_mut().zip(round) {
            total.absorb(r);
        }
    }
    let column = |i: usize| -> Vec<f64> { per_round.iter().map(|r| r[i]).collect() };
    let ratio = |a: usize, b: usize, scale: f64| -> Spread {
        spread(
            &per_round
                .iter()
                .map(|r| r[a] / (r[b] * scale))
                .collect::<Vec<_>>(),
        )
    };
    let benchmark_ratio = (benchmark.len() == per_round.len()).then(|| {
        spread(
            &per_round
                .iter()
                .zip(&benchmark)
                .map(|(r, b)| r[0] / (b / 2.0))
                .collect::<Vec<_>>(),
        )
    });
    let mut contestant = |i: usize| {
        let t = std::mem::take(&mut totals[i]);
        let mut first = t.first_us;
        let mut second = t.second_us;
        first.sort_by(f64::total_cmp);
        second.sort_by(f64::total_cmp);
        let n = t.cycles.max(1) as f64;
        Contestant {
            per_s: spread(&column(i)),
            first_us: first,
            second_us: second,
            redis_cpu_us_per_cycle: t.cpu_s * 1e6 / n,
            client_cpu_us_per_cycle: t.client_cpu.as_secs_f64() * 1e6 / n,
            commands_per_cycle: t.commands as f64 / n,
            reads_per_cycle: t.reads as f64 / n,
        }
    };
    Ok(Cycles {
        topology: opener.topology,
        placement,
        mode: opts.wait_mode_value(),
        tasks,
        rounds,
        fencelock: contestant(0),
        floor: contestant(1),
        unfenced: contestant(2),
        ping: contestant(3),
        redis_benchmark_ping_per_s: (!benchmark.is_empty()).then(|| spread(&benchmark)),
        ratio_to_floor: ratio(0, 1, 1.0),
        ratio_to_unfenced: ratio(0, 2, 1.0),
        ratio_to_bound: ratio(0, 3, 0.5),
        floor_ratio_to_bound: ratio(1, 3, 0.5),
        unfenced_ratio_to_bound: ratio(2, 3, 0.5),
        ratio_to_benchmark_bound: benchmark_ratio,
    })
}

/// `contended`, one wait mode: workers (threads with their own runtime and
/// connections) contending for one name.
#[derive(Debug, Clone)]
pub struct Contended {
    /// The wait mode of every worker.
    pub mode: WaitMode,
    /// Workers contending.
    pub workers: usize,
    /// Rounds measured (each with its own handoff floor).
    pub rounds: usize,
    /// The hold asked for, in ms.
    pub hold_ms: f64,
    /// The hold measured per completion, in ms.
    pub real_hold_ms: f64,
    /// Critical sections completed.
    pub completions: u64,
    /// Completions per second.
    pub completions_per_s: f64,
    /// The share of the time the lock was held (median over the rounds).
    pub utilization: f64,
    /// Acquire waits in ms, sorted.
    pub waits_ms: Vec<f64>,
    /// Hand-overs (release → grant to a different worker) in ms, sorted.
    pub handoffs_ms: Vec<f64>,
    /// Jain's fairness index over the completions per worker.
    pub jain_fairness: f64,
    /// Redis commands per completion.
    pub commands_per_completion: f64,
    /// Redis CPU ms per 1,000 completions.
    pub redis_cpu_ms_per_1k: f64,
    /// Times a worker was granted the lock while another held it: must be 0.
    pub overlaps: u64,
    /// The share of grants that went back to the worker that released.
    pub same_worker_share: f64,
    /// The handoff floor (median, ms; median over the rounds).
    pub handoff_floor_ms: f64,
    /// utilization ÷ its bound, per round.
    pub utilization_to_bound: Spread,
}

impl Contended {
    /// The `q`-quantile (0..=1) of the acquire waits, in ms (NaN without
    /// samples).
    pub fn wait_ms(&self, q: f64) -> f64 {
        quantile(&self.waits_ms, q)
    }

    /// The `q`-quantile (0..=1) of the hand-overs, in ms (NaN without
    /// samples).
    pub fn handoff_ms(&self, q: f64) -> f64 {
        quantile(&self.handoffs_ms, q)
    }

    /// The utilization a hand-over taking the handoff floor allows with this
    /// run's real hold.
    pub fn utilization_bound(&self) -> f64 {
        self.real_hold_ms / (self.real_hold_ms + self.handoff_floor_ms)
    }

    /// Merges the rounds of one mode into one record: samples and counts
    /// pooled, utilization and floors as medians, the ratio's spread.
    pub(crate) fn merge(rounds: Vec<Contended>) -> Option<Contended> {
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|r| r.utilization / r.utilization_bound())
            .collect();
        let median = |f: &dyn Fn(&Contended) -> f64| {
            spread(&rounds.iter().map(f).collect::<Vec<_>>()).median
        };
        let utilization = median(&|r| r.utilization);
        let handoff_floor_ms = median(&|r| r.handoff_floor_ms);
        let jain_fairness = median(&|r| r.jain_fairness);
        let same_worker_share = median(&|r| r.same_worker_share);
        let completions_per_s = median(&|r| r.completions_per_s);
        let completions: u64 = rounds.iter().map(|r| r.completions).sum();
        let weight = |f: &dyn Fn(&Contended) -> f64| {
            rounds
                .iter()
                .map(|r| f(r) * r.completions as f64)
                .sum::<f64>()
                / completions.max(1) as f64
        };
        let real_hold_ms = weight(&|r| r.real_hold_ms);
        let commands_per_completion = weight(&|r| r.commands_per_completion);
        let redis_cpu_ms_per_1k = weight(&|r| r.redis_cpu_ms_per_1k);
        let n = rounds.len();
        let mut rounds = rounds.into_iter();
        let mut merged = rounds.next()?;
        for r in rounds {
            merged.waits_ms.extend(r.waits_ms);
            merged.handoffs_ms.extend(r.handoffs_ms);
            merged.overlaps += r.overlaps;
        }
        merged.waits_ms.sort_by(f64::total_cmp);
        merged.handoffs_ms.sort_by(f64::total_cmp);
        Some(Contended {
            rounds: n,
            completions,
            completions_per_s,
            utilization,
            handoff_floor_ms,
            jain_fairness,
            same_worker_share,
            real_hold_ms,
            commands_per_completion,
            redis_cpu_ms_per_1k,
            utilization_to_bound: spread(&ratios),
            ..merged
        })
    }
}

/// One completed critical section.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Section {
    pub(crate) worker: usize,
    /// A read-write lock's reader (`false`: a writer, a mutex's or a
    /// permit's holder).
    pub(crate) read: bool,
    pub(crate) requested: Instant,
    pub(crate) granted: Instant,
    pub(crate) released: Instant,
}

/// What the workers of a contended run share: how many are inside the
/// critical section, how often two were, and when to stop.
#[derive(Clone, Copy)]
pub(crate) struct Counters<'a> {
    /// Holders inside (a read-write lock's: readers).
    pub(crate) inside: &'a AtomicI64,
    /// A read-write lock's writers inside (unused otherwise).
    pub(crate) writers: &'a AtomicI64,
    pub(crate) overlaps: &'a AtomicI64,
    pub(crate) stop: &'a AtomicBool,
    /// How many may be inside at once: 1 for a mutex, the permits of a
    /// semaphore; one more inside is an overlap.
    pub(crate) capacity: i64,
}

/// One contended worker (on Redis or etcd): acquire, hold `hold` (blocking
/// the worker's own thread: `nanosleep` is precise, a tokio timer sleeps
/// about 1 ms too long), release, until told to stop; every critical
/// section timed, and any overlap with another worker counted.
pub(crate) async fn contend(
    client: &LockClient,
    name: &str,
    opts: &LockOptions,
    hold: Duration,
    worker: usize,
    counters: Counters<'_>,
) -> Result<Vec<Section>> {
    let mut sections = Vec::new();
    while !counters.stop.load(Ordering::Relaxed) {
        let requested = Instant::now();
        let lease = client.acquire(name, opts).await?;
        let granted = Instant::now();
        if counters.inside.fetch_add(1, Ordering::SeqCst) >= counters.capacity {
            counters.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(hold);
        counters.inside.fetch_sub(1, Ordering::SeqCst);
        let released = Instant::now();
        lease.release().await?;
        sections.push(Section {
            worker,
            read: false,
            requested,
            granted,
            released,
        });
    }
    Ok(sections)
}

/// One read-write lock worker: as [`contend`], each critical section a
/// read lease with probability `reads` % (drawn from a generator seeded by
/// the worker), else the write lease. A writer inside while anyone else
/// is, or a reader inside while a writer is, is an overlap.
pub(crate) async fn contend_rw(
    client: &LockClient,
    name: &str,
    opts: &LockOptions,
    hold: Duration,
    worker: usize,
    counters: Counters<'_>,
    reads: u32,
) -> Result<Vec<Section>> {
    let lock = client.rwlock(name)?;
    // xorshift64*, seeded per worker: the same mix of sides every run.
    let mut state = (worker as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut percent = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % 100
    };
    let (readers, writers) = (counters.inside, counters.writers);
    let mut sections = Vec::new();
    while !counters.stop.load(Ordering::Relaxed) {
        let read = percent() < u64::from(reads);
        let requested = Instant::now();
        let lease = if read {
            lock.read(opts).await?
        } else {
            lock.write(opts).await?
        };
        let granted = Instant::now();
        let (mine, other) = if read {
            (readers, writers)
        } else {
            (writers, readers)
        };
        let before = mine.fetch_add(1, Ordering::SeqCst);
        if other.load(Ordering::SeqCst) > 0 || (!read && before > 0) {
            counters.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(hold);
        mine.fetch_sub(1, Ordering::SeqCst);
        let released = Instant::now();
        lease.release().await?;
        sections.push(Section {
            worker,
            read,
            requested,
            granted,
            released,
        });
    }
    Ok(sections)
}

/// The handoff floor of one round of `contended`.
pub(crate) async fn handoff_floor(setup: &Setup, hold: Duration) -> Result<f64> {
    let opener = setup.opener().await?;
    floor::handoff_ms(
        &setup.url,
        &opener,
        &format!("{}bench:{}:floor", setup.prefix, setup.run_id),
        hold,
        200,
    )
    .await
}

/// Measures one wait mode for one round; `handoff_floor_ms` is the floor
/// measured for the round, stored with the result.
pub(crate) async fn contended(
    setup: &Setup,
    mode: WaitMode,
    workers: usize,
    hold: Duration,
    handoff_floor_ms: f64,
) -> Result<Contended> {
    let name = format!("bench:{}:contended:{}", setup.run_id, mode_name(mode));
    let on = contended_on(
        setup,
        &name,
        mode,
        workers,
        hold,
        handoff_floor_ms,
        Holders::Mutex,
    );
    Ok(on.await?.0)
}

/// What the workers of [`contended_on`] take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holders {
    /// A mutex.
    Mutex,
    /// One of this many permits of a semaphore.
    Permits(u32),
    /// A read lease (with this probability in %) or the write lease of a
    /// read-write lock.
    ReadWrite(u32),
}

/// [`contended`] on lock `name`, a mutex, a semaphore of `permits`
/// permits (then up to that many workers hold at once, an overlap is one
/// more, and the utilization is per permit: held time ÷ (elapsed ×
/// permits)) or a read-write lock (readers share it, a writer holds it
/// alone; the utilization is then the mean number of holders at once);
/// with every critical section.
pub(crate) async fn contended_on(
    setup: &Setup,
    name: &str,
    mode: WaitMode,
    workers: usize,
    hold: Duration,
    handoff_floor_ms: f64,
    holders: Holders,
) -> Result<(Contended, Vec<Section>)> {
    let name = name.to_string();
    let mut opts = setup
        .options
        .clone()
        .wait_mode(mode)
        .wait(Duration::from_secs(60));
    if let Holders::Permits(n) = holders {
        opts = opts.permits(n);
    }
    let capacity = match holders {
        Holders::Permits(n) => i64::from(n),
        _ => 1,
    };
    let inside = Arc::new(AtomicI64::new(0));
    let writers_inside = Arc::new(AtomicI64::new(0));
    let overlaps = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Each worker is a thread with its own single-threaded runtime and its
    // own client, as separate worker processes would be: a wake-up reaches
    // the worker's own thread, not a task shared out among the runtime
    // threads of one process. The hold blocks that thread on purpose
    // (`nanosleep` is precise; a tokio timer sleeps about 1 ms too long).
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
    let go = Arc::new(tokio::sync::Notify::new());
    let threads: Vec<_> = (0..workers)
        .map(|worker| {
            let (setup, name, opts) = (setup.clone(), name.clone(), opts.clone());
            let (inside, overlaps, stop) = (inside.clone(), overlaps.clone(), stop.clone());
            let writers_inside = writers_inside.clone();
            let (ready_tx, go) = (ready_tx.clone(), go.clone());
            std::thread::spawn(move || -> Result<Vec<Section>> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    // Ready is signalled even when connecting failed, so the
                    // start never waits for a worker that is gone.
                    let started = go.notified();
                    let client = setup.client().await;
                    let _ = ready_tx.send(());
                    let client = client?;
                    started.await;
                    let counters = Counters {
                        inside: &inside,
                        writers: &writers_inside,
                        overlaps: &overlaps,
                        stop: &stop,
                        capacity,
                    };
                    match holders {
                        Holders::ReadWrite(reads) => {
                            contend_rw(&client, &name, &opts, hold, worker, counters, reads).await
                        }
                        _ => contend(&client, &name, &opts, hold, worker, counters).await,
                    }
                })
            })
        })
        .collect();
    drop(ready_tx);
    for _ in 0..workers {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let mut probe = setup.opener().await?.open().await?;
    let before = ServerCounters::read(&mut probe).await?;
    let started = Instant::now();
    go.notify_waiters();
    tokio::time::sleep(setup.duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut sections = Vec::new();
    for t in threads {
        let joined = tokio::task::spawn_blocking(move || t.join()).await?;
        sections.extend(joined.map_err(|_| Error::failed("a bench worker panicked"))??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = ServerCounters::read(&mut probe).await?;
    let (commands, cpu_s) = before.delta(after);

    sections.sort_by_key(|s| s.granted);
    let completions = sections.len() as u64;
    let held: f64 = sections
        .iter()
        .map(|s| (s.released - s.granted).as_secs_f64())
        .sum();
    let mut waits_ms: Vec<f64> = sections
        .iter()
        .map(|s| (s.granted - s.requested).as_secs_f64() * 1e3)
        .collect();
    waits_ms.sort_by(f64::total_cmp);
    let mut handoffs_ms = Vec::new();
    let mut same = 0u64;
    for pair in sections.windows(2) {
        if pair[0].worker == pair[1].worker {
            same += 1;
        } else {
            handoffs_ms.push(
                pair[1]
                    .granted
                    .saturating_duration_since(pair[0].released)
                    .as_secs_f64()
                    * 1e3,
            );
        }
    }
    handoffs_ms.sort_by(f64::total_cmp);
    let mut counts = vec![0u64; workers];
    for s in &sections {
        counts[s.worker] += 1;
    }
    let per_1k = |x: f64| {
        if completions == 0 {
            f64::NAN
        } else {
            x / completions as f64 * 1000.0
        }
    };
    let real_hold_ms = if completions == 0 {
        0.0
    } else {
        held / completions as f64 * 1e3
    };
    let utilization = held / elapsed / capacity as f64;
    let contended = Contended {
        mode,
        workers,
        rounds: 1,
        hold_ms: hold.as_secs_f64() * 1e3,
        real_hold_ms,
        completions,
        completions_per_s: completions as f64 / elapsed,
        utilization,
        waits_ms,
        handoffs_ms,
        jain_fairness: jain(&counts),
        commands_per_completion: per_1k(commands as f64) / 1000.0,
        redis_cpu_ms_per_1k: per_1k(cpu_s * 1e3),
        overlaps: overlaps.load(Ordering::SeqCst) as u64,
        same_worker_share: if completions < 2 {
            0.0
        } else {
            same as f64 / (completions - 1) as f64
        },
        handoff_floor_ms,
        utilization_to_bound: Spread::one(
            utilization / (real_hold_ms / (real_hold_ms + handoff_floor_ms)),
        ),
    };
    Ok((contended, sections))
}

/// `semaphore`: workers contending for the permits of one fenced semaphore
/// (`LockOptions::permits`), next to the same workers on a mutex, in fair
/// mode, each round measuring both in turn after its handoff floor.
#[derive(Debug, Clone)]
pub struct Semaphore {
    /// The semaphore's permits.
    pub permits: u32,
    /// The semaphore's workers and their figures (fair mode, merged over
    /// the rounds as `contended`'s: the median rate and fairness, waits of
    /// every round; utilization per permit).
    pub semaphore: Contended,
    /// The same workers and hold on a mutex (fair mode).
    pub mutex: Contended,
    /// Semaphore completions ÷ mutex completions, per round (the ideal is
    /// the permit count, while the hold dominates a cycle).
    pub ratio_to_mutex: Spread,
    /// Jain's fairness index of the semaphore's completions per worker, per
    /// round.
    pub jain_fairness: Spread,
}

/// One round of `semaphore`: the semaphore of `permits` and a mutex, one
/// after the other, fair mode, `workers` workers holding `hold`.
pub(crate) async fn semaphore_round(
    setup: &Setup,
    permits: u32,
    workers: usize,
    hold: Duration,
    handoff_floor_ms: f64,
    round: usize,
) -> Result<(Contended, Contended)> {
    let base = format!("bench:{}:semaphore:{round}", setup.run_id);
    let (semaphore, _) = contended_on(
        setup,
        &base,
        WaitMode::Fair,
        workers,
        hold,
        handoff_floor_ms,
        Holders::Permits(permits),
    )
    .await?;
    let (mutex, _) = contended_on(
        setup,
        &format!("{base}:mutex"),
        WaitMode::Fair,
        workers,
        hold,
        handoff_floor_ms,
        Holders::Mutex,
    )
    .await?;
    Ok((semaphore, mutex))
}

impl Semaphore {
    /// The record of `rounds` rounds of [`semaphore_round`] (none: `None`).
    pub(crate) fn merge(permits: u32, rounds: Vec<(Contended, Contended)>) -> Option<Semaphore> {
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|(s, m)| s.completions_per_s / m.completions_per_s)
            .collect();
        let jains: Vec<f64> = rounds.iter().map(|(s, _)| s.jain_fairness).collect();
        let (semaphores, mutexes): (Vec<Contended>, Vec<Contended>) = rounds.into_iter().unzip();
        Some(Semaphore {
            permits,
            semaphore: Contended::merge(semaphores)?,
            mutex: Contended::merge(mutexes)?,
            ratio_to_mutex: spread(&ratios),
            jain_fairness: spread(&jains),
        })
    }
}

/// `rwlock`: workers taking one fenced read-write lock
/// (`LockClient::rwlock`), a read lease with probability `reads_percent`
/// % each time and the write lease otherwise, next to the same workers on
/// a mutex, in fair mode (in notify and poll a stream of readers can keep
/// the writers out), each round measuring both in turn after its handoff
/// floor and Redis's own round trip.
#[derive(Debug, Clone)]
pub struct ReadWrite {
    /// The share of read leases, in %.
    pub reads_percent: u32,
    /// The read-write lock's workers and their figures over every critical
    /// section, reads and writes (fair mode, merged over the rounds as
    /// `contended`'s; its utilization is the mean number of holders at
    /// once).
    pub rwlock: Contended,
    /// The same workers and hold on a mutex (fair mode).
    pub mutex: Contended,
    /// Read completions per second (median over the rounds).
    pub reads_per_s: f64,
    /// Write completions per second (median over the rounds).
    pub writes_per_s: f64,
    /// Readers' acquire waits in ms, sorted (every round).
    pub read_waits_ms: Vec<f64>,
    /// Writers' acquire waits in ms, sorted (every round).
    pub write_waits_ms: Vec<f64>,
    /// Read-write lock completions ÷ mutex completions, per round.
    pub ratio_to_mutex: Spread,
    /// Redis's round trip: the median of 200 `PING`s on one connection to
    /// the lock's node, in ms (median over the rounds).
    pub round_trip_ms: f64,
    /// The round-trip bound: completions per second if no worker ever
    /// waited, each taking the measured hold and two round trips (grant,
    /// release): workers ÷ (hold + 2 × round trip); median over the rounds.
    pub round_trip_bound_per_s: f64,
    /// Read-write lock completions ÷ the round-trip bound, per round.
    pub ratio_to_round_trip_bound: Spread,
    /// Mutex completions ÷ the round-trip bound, per round.
    pub mutex_ratio_to_round_trip_bound: Spread,
}

impl ReadWrite {
    /// The `q`-quantile (0..=1) of the readers' waits, in ms.
    pub fn read_wait_ms(&self, q: f64) -> f64 {
        quantile(&self.read_waits_ms, q)
    }

    /// The `q`-quantile (0..=1) of the writers' waits, in ms.
    pub fn write_wait_ms(&self, q: f64) -> f64 {
        quantile(&self.write_waits_ms, q)
    }
}

/// One round of [`ReadWrite`]: what [`ReadWrite::merge`] takes.
#[derive(Debug, Clone)]
pub(crate) struct ReadWriteRound {
    rwlock: Contended,
    mutex: Contended,
    reads_per_s: f64,
    writes_per_s: f64,
    read_waits_ms: Vec<f64>,
    write_waits_ms: Vec<f64>,
    round_trip_ms: f64,
    round_trip_bound_per_s: f64,
}

/// The median of 200 `PING`s (after 20) on one plain connection to the
/// node of `key`, in ms: Redis's own round trip, as the references
/// measure it.
async fn round_trip_ms(setup: &Setup, key: &str) -> Result<f64> {
    let conn = setup.opener().await?.open().await?;
    let mut ping = Cycler::Ping {
        conn,
        key: key.to_string(),
    };
    for _ in 0..20 {
        ping.cycle().await?;
    }
    let mut samples = Vec::with_capacity(200);
    for _ in 0..200 {
        samples.push(ping.cycle().await?.0.as_secs_f64() * 1e3);
    }
    samples.sort_by(f64::total_cmp);
    Ok(quantile(&samples, 0.5))
}

/// One round of `rwlock`: Redis's round trip, the read-write lock with
/// `reads` % read leases, then a mutex, fair mode, `workers` workers
/// holding `hold`.
pub(crate) async fn rwlock_round(
    setup: &Setup,
    reads: u32,
    workers: usize,
    hold: Duration,
    handoff_floor_ms: f64,
    round: usize,
) -> Result<ReadWriteRound> {
    let base = format!("bench:{}:rwlock:{round}", setup.run_id);
    let round_trip_ms = round_trip_ms(setup, &setup.lock_key(&base)).await?;
    let (rwlock, sections) = contended_on(
        setup,
        &base,
        WaitMode::Fair,
        workers,
        hold,
        handoff_floor_ms,
        Holders::ReadWrite(reads),
    )
    .await?;
    let (mutex, _) = contended_on(
        setup,
        &format!("{base}:mutex"),
        WaitMode::Fair,
        workers,
        hold,
        handoff_floor_ms,
        Holders::Mutex,
    )
    .await?;
    let elapsed = if rwlock.completions_per_s > 0.0 {
        rwlock.completions as f64 / rwlock.completions_per_s
    } else {
        f64::NAN
    };
    let waits = |read: bool| {
        let mut w: Vec<f64> = sections
            .iter()
            .filter(|s| s.read == read)
            .map(|s| (s.granted - s.requested).as_secs_f64() * 1e3)
            .collect();
        w.sort_by(f64::total_cmp);
        w
    };
    let (read_waits_ms, write_waits_ms) = (waits(true), waits(false));
    let round_trip_bound_per_s =
        workers as f64 / ((rwlock.real_hold_ms + 2.0 * round_trip_ms) / 1e3);
    Ok(ReadWriteRound {
        reads_per_s: read_waits_ms.len() as f64 / elapsed,
        writes_per_s: write_waits_ms.len() as f64 / elapsed,
        rwlock,
        mutex,
        read_waits_ms,
        write_waits_ms,
        round_trip_ms,
        round_trip_bound_per_s,
    })
}

impl ReadWrite {
    /// The record of `rounds` rounds of [`rwlock_round`] (none: `None`).
    pub(crate) fn merge(reads_percent: u32, rounds: Vec<ReadWriteRound>) -> Option<ReadWrite> {
        let per_round =
            |f: &dyn Fn(&ReadWriteRound) -> f64| spread(&rounds.iter().map(f).collect::<Vec<_>>());
        let ratio_to_mutex = per_round(&|r| r.rwlock.completions_per_s / r.mutex.completions_per_s);
        let ratio_to_round_trip_bound =
            per_round(&|r| r.rwlock.completions_per_s / r.round_trip_bound_per_s);
        let mutex_ratio_to_round_trip_bound =
            per_round(&|r| r.mutex.completions_per_s / r.round_trip_bound_per_s);
        let reads_per_s = per_round(&|r| r.reads_per_s).median;
        let writes_per_s = per_round(&|r| r.writes_per_s).median;
        let round_trip_ms = per_round(&|r| r.round_trip_ms).median;
        let round_trip_bound_per_s = per_round(&|r| r.round_trip_bound_per_s).median;
        let mut read_waits_ms = Vec::new();
        let mut write_waits_ms = Vec::new();
        let mut rwlocks = Vec::with_capacity(rounds.len());
        let mut mutexes = Vec::with_capacity(rounds.len());
        for r in rounds {
            read_waits_ms.extend(r.read_waits_ms);
            write_waits_ms.extend(r.write_waits_ms);
            rwlocks.push(r.rwlock);
            mutexes.push(r.mutex);
        }
        read_waits_ms.sort_by(f64::total_cmp);
        write_waits_ms.sort_by(f64::total_cmp);
        Some(ReadWrite {
            reads_percent,
            rwlock: Contended::merge(rwlocks)?,
            mutex: Contended::merge(mutexes)?,
            reads_per_s,
            writes_per_s,
            read_waits_ms,
            write_waits_ms,
            ratio_to_mutex,
            round_trip_ms,
            round_trip_bound_per_s,
            ratio_to_round_trip_bound,
            mutex_ratio_to_round_trip_bound,
        })
    }
}

/// `held`: one client holding many auto-renewed leases.
#[derive(Debug, Clone)]
pub struct Held {
    /// The deployment measured.
    pub topology: Topology,
    /// Leases held.
    pub leases: usize,
    /// Their ttl in ms (renewed every third of it).
    pub ttl_ms: f64,
    /// Leases acquired per second while taking them (64 tasks).
    pub acquired_per_s: f64,
    /// How long the leases were watched while held, in s.
    pub window_s: f64,
    /// Client heap growth per lease held (the leases, their guards and the
    /// keeper's registry), in bytes.
    pub client_bytes_per_lease: f64,
    /// Client CPU while holding, as a share of one core.
    pub client_cpu_share: f64,
    /// Redis CPU while holding (renewals), as a share of one core.
    pub redis_cpu_share: f64,
    /// Redis commands per second while holding (a script's own calls
    /// included).
    pub redis_commands_per_s: f64,
    /// The worst renewal lag seen, in ms.
    pub renewal_lag_max_ms: f64,
    /// Leases lost (must be 0).
    pub leases_lost: u64,
}

/// The server's counters. When Redis restarted while the leases were held
/// (before or during the watch), the probe's connection broke: a new one,
/// opened within `patience` (the server may still be starting), reads the
/// restarted server, whose counters start again from 0 (so the deltas are
/// 0, not negative); the leases it lost are counted by `leases_lost`.
async fn counters_across_a_restart(
    probe: &mut RefConn,
    opener: &Opener,
    patience: Duration,
) -> Result<ServerCounters> {
    if let Ok(counters) = ServerCounters::read(probe).await {
        return Ok(counters);
    }
    // A window too long to add to the clock waits as long as it takes.
    let give_up = Instant::now().checked_add(patience);
    loop {
        let reopened = match opener.open().await {
            Ok(mut conn) => ServerCounters::read(&mut conn).await.map(|c| (conn, c)),
            Err(e) => Err(e),
        };
        match reopened {
            Ok((conn, counters)) => {
                *probe = conn;
                return Ok(counters);
            }
            Err(e) if give_up.is_some_and(|t| Instant::now() >= t) => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Tasks taking (and releasing) the leases of `held`.
const HELD_TASKS: usize = 64;

pub(crate) async fn held(setup: &Setup, leases: usize, ttl: Duration) -> Result<Held> {
    let setup = setup.clone();
    on_current_thread(None, move |rt| rt.block_on(held_on(&setup, leases, ttl))).await
}

async fn held_on(setup: &Setup, leases: usize, ttl: Duration) -> Result<Held> {
    let opener = setup.opener().await?;
    let mut probe = opener.open().await?;
    let client = setup.client().await?;
    let opts = client.options().ttl(ttl);
    let run = format!("bench:{}:held{leases}", setup.run_id);
    let heap_before = heap_bytes();
    let started = Instant::now();
    let handles: Vec<_> = (0..HELD_TASKS.min(leases.max(1)))
        .map(|t| {
            let (client, opts, run) = (client.clone(), opts.clone(), run.clone());
            tokio::spawn(async move {
                let mut held = Vec::new();
                for i in (t..leases).step_by(HELD_TASKS) {
                    held.push(client.acquire(&format!("{run}:{i}"), &opts).await?);
                }
                Ok::<_, Error>(held)
            })
        })
        .collect();
    let mut held = Vec::with_capacity(leases);
    for h in handles {
        held.extend(h.await??);
    }
    let acquired_per_s = leases as f64 / started.elapsed().as_secs_f64();
    let bytes = heap_bytes().saturating_sub(heap_before);
    // Watch at least one ttl, so every lease is renewed three times.
    let window = setup.duration.max(ttl);
    let before = counters_across_a_restart(&mut probe, &opener, window).await?;
    let cpu_before = process_cpu();
    let watch = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = watch.elapsed().as_secs_f64();
    let cpu = process_cpu().saturating_sub(cpu_before).as_secs_f64();
    let after = counters_across_a_restart(&mut probe, &opener, window).await?;
    let (commands, redis_cpu) = before.delta(after);
    let lost = held.iter().filter(|l| l.is_lost()).count() as u64;
    let lag = client
        .stats()
        .worst_renewal_lag()
        .map_or(Duration::ZERO, |(_, lag)| lag);
    // Release them all, 64 at a time.
    let mut chunks: Vec<Vec<fencelock::Lease>> = (0..HELD_TASKS).map(|_| Vec::new()).collect();
    for (i, l) in held.into_iter().enumerate() {
        chunks[i % HELD_TASKS].push(l);
    }
    let releases: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            tokio::spawn(async move {
                for l in chunk {
                    // A lost lease has nothing left to release, and may
                    // fail trying (the server it was held on restarted):
                    // it is counted in `leases_lost` already.
                    let lost = l.is_lost();
                    match l.release().await {
                        Err(e) if !lost => return Err(e.into()),
                        _ => {}
                    }
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for r in releases {
        r.await??;
    }
    Ok(Held {
        topology: opener.topology,
        leases,
        ttl_ms: ttl.as_secs_f64() * 1e3,
        acquired_per_s,
        window_s: elapsed,
        client_bytes_per_lease: bytes as f64 / leases.max(1) as f64,
        client_cpu_share: cpu / elapsed,
        redis_cpu_share: redis_cpu / elapsed,
        redis_commands_per_s: commands as f64 / elapsed,
        renewal_lag_max_ms: lag.as_secs_f64() * 1e3,
        leases_lost: lost,
    })
}

/// The name of a wait mode, as on the command line and in reports.
pub fn mode_name(mode: WaitMode) -> &'static str {
    match mode {
        WaitMode::Poll => "poll",
        WaitMode::Fair => "fair",
        _ => "notify",
    }
}
