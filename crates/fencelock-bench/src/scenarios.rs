//! The benchmark scenarios of DESIGN.md §6: each is measured in one
//! function here and returns its typed result.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use fencelock::{LockClient, LockOptions, WaitMode};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::floor::{self, Floor};
use crate::measure::{ServerCounters, jain, ping_rate, ping_rate_parallel, quantile};
use crate::url::RedisUrl;

/// Settings shared by the scenarios of one run.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) url: RedisUrl,
    pub(crate) prefix: String,
    /// Names this run's keys (`bench:{run_id}:…`) apart from other runs'.
    pub(crate) run_id: String,
    pub(crate) duration: Duration,
    pub(crate) options: LockOptions,
}

impl Setup {
    async fn client(&self) -> Result<LockClient> {
        Ok(LockClient::builder(self.url.raw())
            .prefix(&self.prefix)
            .defaults(self.options.clone())
            .connect()
            .await?)
    }
}

/// `uncontended`: one connection, acquire + release of one name in
/// sequence, next to `PING` on one connection.
#[derive(Debug, Clone)]
pub struct Uncontended {
    /// Acquire + release cycles per second.
    pub cycles_per_s: f64,
    /// Sequential `PING`s per second on one connection.
    pub redis_ping_per_s: f64,
    /// `cycles_per_s` ÷ (`redis_ping_per_s` ÷ 2): the share of the
    /// 2-round-trip bound reached.
    pub ratio_to_bound: f64,
    /// The wait mode of the lock options used.
    pub mode: WaitMode,
    /// The fenced floor on one connection, same runtime.
    pub floor: Floor,
}

impl Uncontended {
    /// The fenced floor's share of the 2-round-trip bound.
    pub fn floor_ratio_to_bound(&self) -> f64 {
        self.floor.cycles_per_s / (self.redis_ping_per_s / 2.0)
    }

    /// The share of the fenced floor that fencelock reaches.
    pub fn ratio_to_floor(&self) -> f64 {
        self.cycles_per_s / self.floor.cycles_per_s
    }
}

pub(crate) async fn uncontended(setup: &Setup) -> Result<Uncontended> {
    // One connection used by one task in sequence: measured on a
    // single-threaded runtime, as such a program would run (a multi-threaded
    // one adds a cross-thread wake-up to every reply), PING included.
    let (setup, name) = (setup.clone(), format!("bench:{}:uncontended", setup.run_id));
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(uncontended_on(&setup, &name))
    })
    .await?
}

async fn uncontended_on(setup: &Setup, name: &str) -> Result<Uncontended> {
    let ping = ping_rate(&setup.url, setup.duration / 2).await?;
    let floor = floor::fenced(
        &setup.url,
        &format!("{}{name}:floor:", setup.prefix),
        1,
        setup.duration / 2,
    )
    .await?;
    let client = setup.client().await?;
    let opts = client.options();
    // Warm up: scripts loaded, connections open.
    for _ in 0..100 {
        client.acquire(name, &opts).await?.release().await?;
    }
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < setup.duration {
        client.acquire(name, &opts).await?.release().await?;
        n += 1;
    }
    let cycles = n as f64 / started.elapsed().as_secs_f64();
    Ok(Uncontended {
        cycles_per_s: cycles,
        redis_ping_per_s: ping,
        ratio_to_bound: cycles / (ping / 2.0),
        mode: opts.wait_mode_value(),
        floor,
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
    /// The hold asked for, in ms.
    pub hold_ms: f64,
    /// The hold measured per completion, in ms.
    pub real_hold_ms: f64,
    /// Critical sections completed.
    pub completions: u64,
    /// Completions per second.
    pub completions_per_s: f64,
    /// The share of the time the lock was held.
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
    /// The handoff floor of this run (median, ms), measured once for all
    /// wait modes.
    pub handoff_floor_ms: f64,
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
}

/// One completed critical section.
#[derive(Debug, Clone, Copy)]
struct Section {
    worker: usize,
    requested: Instant,
    granted: Instant,
    released: Instant,
}

/// Measures one wait mode; `handoff_floor_ms` is the floor measured for the
/// whole scenario, stored with the result.
pub(crate) async fn contended(
    setup: &Setup,
    mode: WaitMode,
    workers: usize,
    hold: Duration,
    handoff_floor_ms: f64,
) -> Result<Contended> {
    let name = format!("bench:{}:contended:{}", setup.run_id, mode_name(mode));
    let opts = setup
        .options
        .clone()
        .wait_mode(mode)
        .wait(Duration::from_secs(60));
    let inside = Arc::new(AtomicI64::new(0));
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
                    let mut sections = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let requested = Instant::now();
                        let lease = client.acquire(&name, &opts).await?;
                        let granted = Instant::now();
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::sleep(hold);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let released = Instant::now();
                        lease.release().await?;
                        sections.push(Section {
                            worker,
                            requested,
                            granted,
                            released,
                        });
                    }
                    Ok::<_, Error>(sections)
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
    let before = ServerCounters::read(&setup.url).await?;
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
    let after = ServerCounters::read(&setup.url).await?;
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
    Ok(Contended {
        mode,
        workers,
        hold_ms: hold.as_secs_f64() * 1e3,
        real_hold_ms: if completions == 0 {
            0.0
        } else {
            held / completions as f64 * 1e3
        },
        completions,
        completions_per_s: completions as f64 / elapsed,
        utilization: held / elapsed,
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
    })
}

/// `many`: many tasks on as many names, all sharing one client (one
/// multiplexed connection), next to `PING` from as many connections.
#[derive(Debug, Clone)]
pub struct Many {
    /// Tasks, each on a name of its own.
    pub tasks: usize,
    /// Acquire + release cycles per second, all tasks together.
    pub cycles_per_s: f64,
    /// `PING`s per second from `tasks` connections, each sequential.
    pub redis_ping_c64_per_s: f64,
    /// `cycles_per_s` ÷ (`redis_ping_c64_per_s` ÷ 2).
    pub ratio_to_bound: f64,
    /// Redis CPU µs per cycle.
    pub redis_cpu_us_per_cycle: f64,
    /// Redis commands per cycle.
    pub commands_per_cycle: f64,
    /// The fenced floor with as many tasks on one connection.
    pub floor: Floor,
}

impl Many {
    /// The fenced floor's share of the bound.
    pub fn floor_ratio_to_bound(&self) -> f64 {
        self.floor.cycles_per_s / (self.redis_ping_c64_per_s / 2.0)
    }

    /// The share of the fenced floor that fencelock reaches.
    pub fn ratio_to_floor(&self) -> f64 {
        self.cycles_per_s / self.floor.cycles_per_s
    }
}

pub(crate) async fn many(setup: &Setup, tasks: usize) -> Result<Many> {
    let ping = ping_rate_parallel(&setup.url, tasks, setup.duration / 2).await?;
    let floor = floor::fenced(
        &setup.url,
        &format!("{}bench:{}:many-floor:", setup.prefix, setup.run_id),
        tasks,
        setup.duration / 2,
    )
    .await?;
    let client = setup.client().await?;
    let opts = client.options();
    let stop = Arc::new(AtomicBool::new(false));
    let before = ServerCounters::read(&setup.url).await?;
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (client, opts, stop) = (client.clone(), opts.clone(), stop.clone());
            let name = format!("bench:{}:many:{i}", setup.run_id);
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    client.acquire(&name, &opts).await?.release().await?;
                    n += 1;
                }
                Ok::<_, Error>(n)
            })
        })
        .collect();
    tokio::time::sleep(setup.duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for h in handles {
        total += h.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = ServerCounters::read(&setup.url).await?;
    let (commands, cpu_s) = before.delta(after);
    let cycles = total as f64 / elapsed;
    Ok(Many {
        tasks,
        cycles_per_s: cycles,
        redis_ping_c64_per_s: ping,
        ratio_to_bound: cycles / (ping / 2.0),
        redis_cpu_us_per_cycle: cpu_s * 1e6 / total.max(1) as f64,
        commands_per_cycle: commands as f64 / total.max(1) as f64,
        floor,
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
