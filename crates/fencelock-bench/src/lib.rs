//! # fencelock-bench
//!
//! The engine of `fencelock bench`: the benchmark of DESIGN.md §6 against a
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
//! floors are its own bare scripts on plain connections.
//!
//! | module | concern |
//! |---|---|
//! | `scenarios` | uncontended, contended (per wait mode), many: each measured in one function, with its typed result |
//! | `floor` | the fenced floor and the handoff floor: the bounds of the targets |
//! | `measure` | PING rates, INFO counters, statistics |
//! | `report` | [`Report`], [`Header`], [`Record`], [`Measurement`] |
//! | `render` | [`Renderer`]: the human table and the JSON lines, the only place either is written |
//! | `plot` | the `--plot` SVG |
//! | `url` | the Redis URL under test, shown only redacted |
//! | `etcd` | feature `etcd`: the scenarios on an etcd cluster, next to etcd's own read, write and bare-lock rates ([`run_etcd`], `EtcdReport`) |
//! | `error` | [`Error`] and [`ErrorKind`] |

mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod floor;
mod measure;
mod plot;
mod render;
mod report;
mod scenarios;
mod url;

use std::time::Duration;

use fencelock::{LockOptions, WaitMode};

pub use error::{Error, ErrorKind, Result};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdContended, EtcdMany, EtcdReport, EtcdUncontended, run_etcd};
pub use floor::Floor;
pub use render::{Format, Renderer};
pub use report::{Header, Measurement, Record, Report};
pub use scenarios::{Contended, Many, Uncontended, mode_name};

use scenarios::Setup;
use url::RedisUrl;

/// A scenario of DESIGN.md §6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scenario {
    /// One connection, acquire + release of one name: [`Uncontended`].
    Uncontended,
    /// Workers contending for one name, per wait mode: [`Contended`].
    Contended,
    /// Many tasks on many names sharing one client: [`Many`].
    Many,
}

/// What to measure, and on which Redis. `Debug` shows the URL redacted.
#[derive(Debug, Clone)]
pub struct Config {
    url: RedisUrl,
    /// The key prefix of the lock client (and of the floors' keys).
    pub prefix: String,
    /// The scenarios, measured in this order.
    pub scenarios: Vec<Scenario>,
    /// Measuring time of each scenario (and of each wait mode).
    pub duration: Duration,
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
}

impl Config {
    /// The defaults of `fencelock bench` on the Redis at `redis_url`: every
    /// scenario and wait mode, 10 s each, 8 workers holding 1 ms, 64 tasks.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Config {
            url: RedisUrl::new(redis_url),
            prefix: fencelock::DEFAULT_PREFIX.to_string(),
            scenarios: vec![Scenario::Uncontended, Scenario::Contended, Scenario::Many],
            duration: Duration::from_secs(10),
            options: LockOptions::default(),
            modes: vec![WaitMode::Poll, WaitMode::Notify, WaitMode::Fair],
            workers: 8,
            hold: Duration::from_millis(1),
            tasks: 64,
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

/// Runs the scenarios of `config` in order and returns their report; on the
/// first failure, returns the error (the records measured until then have
/// reached `observer`).
pub async fn run(config: &Config, observer: &mut impl Observer) -> Result<Report> {
    run_scenarios(config, observer)
        .await
        .map_err(|e| e.shown_for(&config.url))
}

async fn run_scenarios(config: &Config, observer: &mut impl Observer) -> Result<Report> {
    if config.workers == 0 || config.tasks == 0 {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "workers and tasks must be at least 1",
        ));
    }
    let setup = Setup {
        url: config.url.clone(),
        prefix: config.prefix.clone(),
        run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        duration: config.duration,
        options: config.options.clone(),
    };
    let mut report = Report::new(Header {
        redis: config.url.shown().to_string(),
        duration: config.duration,
    });
    observer.updated(&report);
    for (step, scenario) in config.scenarios.iter().enumerate() {
        match scenario {
            Scenario::Uncontended => {
                let r = measure(
                    observer,
                    "uncontended",
                    config.duration * 3 / 2,
                    scenarios::uncontended(&setup),
                )
                .await?;
                add(&mut report, observer, step, Measurement::Uncontended(r));
            }
            Scenario::Contended => {
                let handoff_floor = measure(
                    observer,
                    "handoff floor",
                    config.hold * 200,
                    floor::handoff_ms(
                        &setup.url,
                        &format!("{}bench:{}:floor", setup.prefix, setup.run_id),
                        config.hold,
                        200,
                    ),
                )
                .await?;
                for &mode in &config.modes {
                    let r = measure(
                        observer,
                        &format!("contended {}", mode_name(mode)),
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
                    add(&mut report, observer, step, Measurement::Contended(r));
                }
            }
            Scenario::Many => {
                let r = measure(
                    observer,
                    "many",
                    config.duration * 3 / 2,
                    scenarios::many(&setup, config.tasks),
                )
                .await?;
                add(&mut report, observer, step, Measurement::Many(r));
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
