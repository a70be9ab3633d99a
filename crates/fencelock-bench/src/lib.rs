//! # fencelock-bench
//!
//! The engine of `fencelock bench`: the benchmark of docs/design.md §6 against a
//! real Redis, every figure next to that Redis's own round-trip rate and
//! next to the floors any fenced lock has on it, all from the same run.
//!
//! [`run`] measures the scenarios of a [`Config`] one after the other and
//! returns a [`Report`]: a [`Header`] and one [`Record`] per scenario (and
//! per wait mode of `contended`). A [`Renderer`] shows the report as the
//! human table or as JSON lines, also while it grows (through an
//! [`Observer`]); [`Report::svg`] draws the `--plot` figure.
//!
//! The Redis URL is never shown with its password: the header, `Debug` of a
//! [`Config`] and every [`Error`] name the server by its redacted URL
//! (`redis://user:***@host`, `unix:///path?pass=***`).
//!
//! The engine uses only the public API of the `fencelock` library; the
//! references are its own bare scripts and commands on plain connections of
//! the same type as the library's (one server, TLS, Cluster), measured in
//! the same run, interleaved with fencelock in short slices, `--repeat`
//! rounds, each round giving its own ratios (reported as median and
//! spread).
//!
//! | module | concern |
//! |---|---|
//! | `scenarios` | uncontended and many ([`Cycles`]), contended (per wait mode), held, semaphore (the permits of a fenced semaphore next to a mutex, [`Semaphore`]), rwlock (readers and writers of a fenced read-write lock next to a mutex and to Redis's round trip, [`ReadWrite`]): each measured in one function, with its typed result |
//! | `floor` | the references: the fenced floor, the unfenced reference, PING, the handoff floor |
//! | `conn` | plain connections of the library's type (TLS, Cluster routed to the lock's node) |
//! | `placement` | [`Placement`]: the client on Redis's CPU or on another, pinned when the bench started its own server |
//! | `measure` | INFO counters, `redis-benchmark`, process CPU and heap, statistics |
//! | `report` | [`Report`], [`Header`], [`Record`], [`Measurement`] |
//! | `render` | [`Renderer`] and [`Report::render`]: the human table and the JSON lines, the only place either is written |
//! | `plot` | the `--plot` SVG |
//! | `url` | the Redis URL under test, shown only redacted |
//! | `etcd` | feature `etcd`: the scenarios on an etcd cluster, next to etcd's own read, write and bare-lock rates ([`run_etcd`], `EtcdReport`) |
//! | `error` | [`Error`] and [`ErrorKind`] |

mod conn;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod floor;
mod measure;
mod placement;
mod plot;
mod render;
mod report;
mod scenarios;
mod url;

use std::time::Duration;

use fencelock::{LockOptions, WaitMode};

pub use conn::{Tls, Topology};
pub use error::{Error, ErrorKind, Result};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdContended, EtcdMany, EtcdReport, EtcdUncontended, run_etcd};
pub use measure::Spread;
pub use placement::Placement;
pub use render::{Format, Renderer};
pub use report::{Header, Measurement, Record, Report};
pub use scenarios::{
    Contended, Contestant, CyclePath, Cycles, Held, ReadWrite, Semaphore, mode_name,
};

use scenarios::Setup;
use url::RedisUrl;

/// A scenario of docs/design.md §6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scenario {
    /// One connection, acquire + release of one name: [`Cycles`].
    Uncontended,
    /// Workers contending for one name, per wait mode: [`Contended`].
    Contended,
    /// Many tasks on many names sharing one client: [`Cycles`].
    Many,
    /// One client holding many auto-renewed leases: [`Held`].
    Held,
    /// Workers contending for the permits of one fenced semaphore, next to
    /// the same workers on a mutex, fair mode: [`Semaphore`].
    Semaphore,
    /// Workers taking read leases (mostly) and write leases of one fenced
    /// read-write lock, next to the same workers on a mutex and to Redis's
    /// round trip, fair mode: [`ReadWrite`].
    RwLock,
}

/// What to measure, and on which Redis. `Debug` shows the URL redacted.
#[derive(Debug, Clone)]
pub struct Config {
    url: RedisUrl,
    /// The key prefix of the lock client (and of the floors' keys).
    pub prefix: String,
    /// TLS files for a `rediss` URL (the lock client's and the
    /// references').
    pub tls: Tls,
    /// The scenarios, measured in this order.
    pub scenarios: Vec<Scenario>,
    /// Measuring time of each contestant (and of each wait mode) in each
    /// round.
    pub duration: Duration,
    /// Rounds of each scenario (`--repeat`): the records give the median
    /// and spread of the per-round figures.
    pub rounds: usize,
    /// Length of one slice of an interleaved round.
    pub slice: Duration,
    /// The lock options of every scenario (`contended` sets its own wait
    /// mode and a long wait).
    pub options: LockOptions,
    /// Wait modes of `contended`, measured in this order.
    pub modes: Vec<WaitMode>,
    /// Workers of `contended`, each a thread with its own runtime and
    /// connections.
    pub workers: usize,
    /// How long each `contended` worker holds the lock.
    pub hold: Duration,
    /// Tasks (and names) of `many`.
    pub tasks: usize,
    /// Leases of `held`, one record per number.
    pub leases: Vec<usize>,
    /// The ttl of `held`'s leases.
    pub held_ttl: Duration,
    /// Permits of `semaphore`'s semaphore.
    pub permits: u32,
    /// Workers of `semaphore` (on the semaphore, then on the mutex it is
    /// compared with), each a thread as `contended`'s; they hold
    /// [`Config::hold`].
    pub semaphore_workers: usize,
    /// Workers of `rwlock` (on the read-write lock, then on the mutex it is
    /// compared with), each a thread as `contended`'s; they hold
    /// [`Config::hold`].
    pub rwlock_workers: usize,
    /// The share of read leases of `rwlock`, in %.
    pub rwlock_reads: u32,
    /// The pid of a redis-server this run may pin (one the caller started
    /// for it): `uncontended` and `many` are then measured once with the
    /// client on that server's CPU and once on another ([`Placement`]).
    /// `None`: nothing is pinned, and the records say so.
    pub pin_redis: Option<u32>,
}

impl Config {
    /// The defaults of `fencelock bench` on the Redis at `redis_url`:
    /// uncontended, contended (every wait mode), many and held (1,000
    /// leases, ttl 10 s); 2 s per contestant and round, 5 rounds, slices of
    /// 100 ms; 8 workers holding 1 ms, 64 tasks; `semaphore` (when asked
    /// for): 4 permits, 16 workers; `rwlock` (when asked for): 16 workers,
    /// 90 % read leases.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Config {
            url: RedisUrl::new(redis_url),
            tls: Tls::default(),
            prefix: fencelock::DEFAULT_PREFIX.to_string(),
            scenarios: vec![
                Scenario::Uncontended,
                Scenario::Contended,
                Scenario::Many,
                Scenario::Held,
            ],
            duration: Duration::from_secs(2),
            rounds: 5,
            slice: Duration::from_millis(100),
            options: LockOptions::default(),
            modes: vec![WaitMode::Poll, WaitMode::Notify, WaitMode::Fair],
            workers: 8,
            hold: Duration::from_millis(1),
            tasks: 64,
            leases: vec![1000],
            held_ttl: Duration::from_secs(10),
            permits: 4,
            semaphore_workers: 16,
            rwlock_workers: 16,
            rwlock_reads: 90,
            pin_redis: None,
        }
    }

    /// The Redis URL with its password replaced by `***`.
    pub fn redis(&self) -> &str {
        self.url.shown()
    }
}

/// Follows a run as it goes: what is being measured, and the report as it
/// grows. Every method does nothing unless overridden; `()` observes nothing.
pub trait Observer {
    /// A measurement starts that should take about `expected`; `what` names
    /// it ("uncontended", "handoff floor", "contended fair", …).
    fn measuring(&mut self, what: &str, expected: Duration) {
        let _ = (what, expected);
    }

    /// The measurement announced last has ended, with a result or not.
    fn measured(&mut self) {}

    /// The report has grown: called once with the header alone before
    /// anything is measured, then after each new record.
    fn updated(&mut self, report: &Report) {
        let _ = report;
    }
}

impl Observer for () {}

/// The longest measuring time per contestant and round, and the longest
/// hold: beyond these a run is never useful, and the engine's time
/// arithmetic (rounds × contestants × duration) stays far from overflowing.
const MAX_DURATION: Duration = Duration::from_secs(3600);
const MAX_HOLD: Duration = Duration::from_secs(60);
const MAX_WORKERS: usize = 1024;
const MAX_TASKS: usize = 100_000;
const MAX_ROUNDS: usize = 1000;
const MAX_LEASES: usize = 10_000_000;

impl Config {
    /// Refuses settings no run can use, naming the one that is wrong
    /// ([`ErrorKind::InvalidInput`]); [`run`] checks it first, callers may
    /// check before they start a server.
    ///
    /// # Errors
    /// The first setting that is wrong.
    pub fn check(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::new(ErrorKind::InvalidInput, message));
        if self.workers == 0
            || self.tasks == 0
            || self.rounds == 0
            || self.semaphore_workers == 0
            || self.rwlock_workers == 0
        {
            return invalid("workers, tasks and repeat must be at least 1".into());
        }
        if self.permits == 0 || self.permits > fencelock::MAX_PERMITS {
            return invalid(format!(
                "--permits {}: from 1 to {}",
                self.permits,
                fencelock::MAX_PERMITS
            ));
        }
        // Each worker is a thread, each task a lock name, each lease an
        // entry held at once: bounds a machine can take.
        for (flag, value, max) in [
            ("--workers", self.workers, MAX_WORKERS),
            ("--workers", self.semaphore_workers, MAX_WORKERS),
            ("--workers", self.rwlock_workers, MAX_WORKERS),
            ("--tasks", self.tasks, MAX_TASKS),
            ("--repeat", self.rounds, MAX_ROUNDS),
        ] {
            if value > max {
                return invalid(format!("{flag} {value}: at most {max}"));
            }
        }
        if self.rwlock_reads > 100 {
            return invalid(format!(
                "--reads {}: the share of read leases is a percentage, 0 to 100",
                self.rwlock_reads
            ));
        }
        if let Some(n) = self.leases.iter().find(|n| **n == 0 || **n > MAX_LEASES) {
            return invalid(format!("--leases {n}: from 1 to {MAX_LEASES}"));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return invalid(format!(
                "--duration {}: must be more than 0 and at most {}",
                humantime::format_duration(self.duration),
                humantime::format_duration(MAX_DURATION)
            ));
        }
        if self.hold > MAX_HOLD {
            return invalid(format!(
                "--hold {}: at most {}",
                humantime::format_duration(self.hold),
                humantime::format_duration(MAX_HOLD)
            ));
        }
        Ok(())
    }
}

/// Runs exactly `n` uncontended acquire + release cycles of `path` on one
/// connection to the Redis of `config` (after 20 warm-up cycles), and
/// nothing else: for counting the client's instructions per cycle
/// (`scripts/client-cost` runs it under callgrind for two values of `n`;
/// the difference divided by theirs is one cycle's cost, free of this
/// machine's noise).
///
/// # Errors
/// The first failure; the message names the Redis without its password.
pub async fn count_cycles(config: &Config, path: CyclePath, n: u64) -> Result<()> {
    let setup = setup_of(config);
    scenarios::count(&setup, path, n)
        .await
        .map_err(|e| e.shown_for(&config.url))
}

/// Where `uncontended` and `many` run their client: both regimes with the
/// server of [`Config::pin_redis`] pinned to its CPU, else unpinned; and a
/// note when a regime could not be measured.
fn placements(config: &Config) -> Result<(Vec<Placement>, Option<String>)> {
    let allowed = placement::allowed_cpus()?;
    let Some(pid) = config.pin_redis else {
        return Ok((vec![Placement::Unpinned { allowed }], None));
    };
    let (regimes, note) = placement::regimes(&allowed);
    if let Some(cpu) = regimes.first().and_then(Placement::redis_cpu) {
        placement::pin_process(pid, cpu)?;
    }
    Ok((regimes, note))
}

/// The setup of one run of `config`, with a new run id.
fn setup_of(config: &Config) -> Setup {
    Setup {
        url: config.url.clone(),
        tls: config.tls.clone(),
        prefix: config.prefix.clone(),
        run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        duration: config.duration,
        rounds: config.rounds,
        slice: config.slice,
        options: config.options.clone(),
    }
}

/// Runs the scenarios of `config` in order and returns their report; on the
/// first failure, returns the error (the records measured until then have
/// reached `observer`).
pub async fn run(config: &Config, observer: &mut impl Observer) -> Result<Report> {
    run_scenarios(config, observer)
        .await
        .map_err(|e| e.shown_for(&config.url))
}

async fn run_scenarios(config: &Config, observer: &mut impl Observer) -> Result<Report> {
    config.check()?;
    let setup = setup_of(config);
    let (placements, placement_note) = placements(config)?;
    let mut report = Report::new(Header {
        redis: config.url.shown().to_string(),
        duration: config.duration,
        rounds: config.rounds,
        placement_note,
    });
    observer.updated(&report);
    let cycles_time = config.duration * 4 * config.rounds as u32;
    for (step, scenario) in config.scenarios.iter().enumerate() {
        match scenario {
            Scenario::Uncontended => {
                for placement in &placements {
                    let r = measure(
                        observer,
                        "uncontended",
                        cycles_time,
                        scenarios::cycles(&setup, "uncontended", 1, placement),
                    )
                    .await?;
                    add(&mut report, observer, step, Measurement::Uncontended(r));
                }
            }
            Scenario::Contended => {
                let mut per_mode: Vec<Vec<Contended>> =
                    config.modes.iter().map(|_| Vec::new()).collect();
                for round in 0..config.rounds {
                    let handoff_floor = measure(
                        observer,
                        &format!("handoff floor, round {}", round + 1),
                        config.hold * 200,
                        scenarios::handoff_floor(&setup, config.hold),
                    )
                    .await?;
                    for (m, &mode) in config.modes.iter().enumerate() {
                        let r = measure(
                            observer,
                            &format!("contended {}, round {}", mode_name(mode), round + 1),
                            config.duration,
                            scenarios::contended(
                                &setup,
                                mode,
                                config.workers,
                                config.hold,
                                handoff_floor,
                            ),
                        )
                        .await?;
                        per_mode[m].push(r);
                    }
                }
                for rounds in per_mode {
                    if let Some(r) = Contended::merge(rounds) {
                        add(&mut report, observer, step, Measurement::Contended(r));
                    }
                }
            }
            Scenario::Many => {
                for placement in &placements {
                    let r = measure(
                        observer,
                        "many",
                        cycles_time,
                        scenarios::cycles(&setup, "many", config.tasks, placement),
                    )
                    .await?;
                    add(&mut report, observer, step, Measurement::Many(r));
                }
            }
            Scenario::Semaphore => {
                let what = format!("semaphore of {} permits and mutex", config.permits);
                let rounds =
                    rounds_after_floors(&setup, config, observer, &what, |floor, round| {
                        scenarios::semaphore_round(
                            &setup,
                            config.permits,
                            config.semaphore_workers,
                            config.hold,
                            floor,
                            round,
                        )
                    })
                    .await?;
                if let Some(r) = Semaphore::merge(config.permits, rounds) {
                    add(&mut report, observer, step, Measurement::Semaphore(r));
                }
            }
            Scenario::RwLock => {
                let what = format!(
                    "read-write lock ({} % reads) and mutex",
                    config.rwlock_reads
                );
                let rounds =
                    rounds_after_floors(&setup, config, observer, &what, |floor, round| {
                        scenarios::rwlock_round(
                            &setup,
                            config.rwlock_reads,
                            config.rwlock_workers,
                            config.hold,
                            floor,
                            round,
                        )
                    })
                    .await?;
                if let Some(r) = ReadWrite::merge(config.rwlock_reads, rounds) {
                    add(&mut report, observer, step, Measurement::RwLock(r));
                }
            }
            Scenario::Held => {
                for &leases in &config.leases {
                    let r = measure(
                        observer,
                        &format!("held {leases}"),
                        config.duration.max(config.held_ttl),
                        scenarios::held(&setup, leases, config.held_ttl),
                    )
                    .await?;
                    add(&mut report, observer, step, Measurement::Held(r));
                }
            }
        }
    }
    Ok(report)
}

/// Adds a record to `report` and shows `observer` the grown report.
fn add(report: &mut Report, observer: &mut impl Observer, step: usize, measurement: Measurement) {
    report.records.push(Record { step, measurement });
    observer.updated(report);
}

/// `work`, announced to `observer`.
/// `config.rounds` rounds of a scenario measured beside the mutex (`what`),
/// each after its own handoff floor (in ms), which `round` gets with the
/// round's number.
async fn rounds_after_floors<T, Fut>(
    setup: &Setup,
    config: &Config,
    observer: &mut impl Observer,
    what: &str,
    mut round: impl FnMut(f64, usize) -> Fut,
) -> Result<Vec<T>>
where
    Fut: Future<Output = Result<T>>,
{
    let mut rounds = Vec::with_capacity(config.rounds);
    for r in 0..config.rounds {
        let floor = measure(
            observer,
            &format!("handoff floor, round {}", r + 1),
            config.hold * 200,
            scenarios::handoff_floor(setup, config.hold),
        )
        .await?;
        let label = format!("{what}, round {}", r + 1);
        rounds.push(measure(observer, &label, config.duration * 2, round(floor, r)).await?);
    }
    Ok(rounds)
}

async fn measure<T>(
    observer: &mut impl Observer,
    what: &str,
    expected: Duration,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    observer.measuring(what, expected);
    let out = work.await;
    observer.measured();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_shows_its_url_redacted() {
        let config = Config::new("redis://bench:s3cret-pw@127.0.0.1:7000/");
        assert_eq!(config.redis(), "redis://bench:***@127.0.0.1:7000/");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret-pw"), "{debug}");
        assert!(
            debug.contains("redis://bench:***@127.0.0.1:7000/"),
            "{debug}"
        );
    }
}
