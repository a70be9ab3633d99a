//! `fencelock bench`: the command line of the benchmark engine
//! (`fencelock-bench`). Flags become a [`Config`], a private redis-server
//! is started unless `--url` names one (an `etcd://` URL runs the
//! scenarios on etcd, `fencelock_bench::run_etcd`), the report goes to stdout as it
//! grows (progress to stderr when it is a terminal), then the `--plot` file;
//! engine errors become exit codes.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use fencelock_bench::{Config, CyclePath, ErrorKind, Format, Observer, Renderer, Report, Scenario};

use crate::arg_values::{WaitModeArg, parse_duration};
use crate::exit;
use crate::global_options::GlobalOptions;
use crate::private_redis::PrivateRedis;

/// Measure speed and fairness against a real Redis (a private one unless
/// --url is given), next to that Redis's own round-trip rate; or against
/// etcd (--url etcd://…), next to etcd's read, write and bare-lock rates.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct BenchArgs {
    /// Scenarios to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ScenarioArg::Uncontended, ScenarioArg::Contended, ScenarioArg::Many, ScenarioArg::Held])]
    pub(crate) scenario: Vec<ScenarioArg>,
    /// Measuring time of each contestant (fencelock and each reference) and
    /// of each wait mode, per round.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) duration: Duration,
    /// Rounds of each scenario: every figure is the median over the rounds,
    /// with the smallest and largest round beside it. Within a round
    /// fencelock and its references take turns in short slices.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub(crate) repeat: usize,
    /// Leases held by the held scenario, comma-separated (one record each).
    #[arg(long, value_delimiter = ',', default_values_t = [1000usize], value_name = "N")]
    pub(crate) leases: Vec<usize>,
    /// Workers of the contended, semaphore and rwlock scenarios, each a
    /// thread with its own runtime and connections [default: 8 for
    /// contended, 16 for semaphore and rwlock].
    #[arg(long, value_name = "N")]
    pub(crate) workers: Option<usize>,
    /// Permits of the semaphore scenario's semaphore.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub(crate) permits: u32,
    /// The share of read leases of the rwlock scenario, in percent.
    #[arg(long, default_value_t = 90, value_name = "PERCENT")]
    pub(crate) reads: u32,
    /// How long each contended (and semaphore) worker holds the lock.
    #[arg(long, default_value = "1ms", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) hold: Duration,
    /// Wait modes of the contended scenario, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [WaitModeArg::Poll, WaitModeArg::Notify, WaitModeArg::Fair])]
    pub(crate) mode: Vec<WaitModeArg>,
    /// Tasks (and names) of the many scenario.
    #[arg(long, default_value_t = 64)]
    pub(crate) tasks: usize,
    /// One JSON object per line per scenario (and per wait mode) on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write an SVG of the acquire-wait and handoff distributions per mode.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// Run exactly N uncontended cycles of one --path (after 20 warm-up
    /// cycles) and nothing else, for counting instructions per cycle
    /// (scripts/client-cost); Redis only.
    #[arg(long, value_name = "N", conflicts_with_all = ["scenario", "plot", "json"])]
    pub(crate) cycles: Option<u64>,
    /// Leave the private redis-server and the measuring thread where the
    /// OS puts them. By default the bench pins its own server to one CPU and
    /// measures uncontended and many twice: with the client on that CPU and
    /// on another (a server given by --url is never pinned).
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// The path --cycles runs.
    #[arg(long, value_enum, default_value_t = PathArg::Fencelock, requires = "cycles")]
    pub(crate) path: PathArg,
}

/// What `--cycles` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PathArg {
    /// fencelock's acquire + release.
    Fencelock,
    /// The fenced floor's two bare scripts.
    Floor,
    /// The unfenced reference: SET NX PX, then compare-and-delete.
    Unfenced,
}

/// The rest of `fencelock bench --help`, after the options.
const HELP: &str = "\
Examples:
  fencelock bench
  fencelock bench --scenario uncontended,many --duration 2s --repeat 5 --json
  fencelock bench --scenario held --leases 1000,10000,100000
  fencelock bench --url redis+cluster://127.0.0.1:7000 --scenario uncontended,many
  fencelock bench --url rediss://127.0.0.1:6380 --tls-ca ca.pem --scenario uncontended,many
  fencelock bench --scenario contended --mode notify,fair --workers 32 --json
  fencelock bench --scenario contended --plot waits.svg
  fencelock bench --scenario semaphore --permits 4 --workers 16
  fencelock bench --scenario rwlock --reads 90 --workers 16
  fencelock --url etcd://127.0.0.1:2379 bench --duration 5s
  fencelock bench --cycles 2000 --path floor
  fencelock bench --scenario uncontended --no-pin

On etcd every wait mode waits in the same queue: contended is measured once
(--mode and --plot are for Redis).

The semaphore scenario: --workers workers (16) contend for the --permits
permits (4) of one fenced semaphore in fair mode, each holding --hold, and
the same workers then for a mutex, in turn in every round: completions per
second of both, their ratio (at most the permit count while the hold
dominates a cycle), Jain's fairness index across the workers, waits, and
the utilization per permit next to the handoff floor's bound; Redis only.

The rwlock scenario: --workers workers (16) take one fenced read-write
lock in fair mode, each time a read lease with probability --reads % (90)
and the write lease otherwise, each holding --hold, and the same workers
then a mutex, in turn in every round: completions per second of both
(reads and writes apart), their ratio, the readers' and writers' waits,
the mean holders at once, and both rates against the round-trip bound
from Redis's own PING round trip measured in the same round (workers /
(hold + 2 round trips): no worker ever waiting); Redis only.

Exit code 1 if two holders ever overlapped (more than the permits of the
semaphore scenario; a writer with another holder in the rwlock scenario)
or a held lease was lost.";

/// Benchmark scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ScenarioArg {
    /// One connection, acquire + release of one name.
    Uncontended,
    /// Workers contending for one name.
    Contended,
    /// Many tasks on many names sharing one client.
    Many,
    /// One client holding many auto-renewed leases.
    Held,
    /// Workers contending for the permits of one fenced semaphore, beside
    /// the same workers on a mutex.
    Semaphore,
    /// Workers taking read leases (--reads %) and write leases of one
    /// fenced read-write lock, beside the same workers on a mutex.
    Rwlock,
}

/// `fencelock bench`: exit 1 if two holders overlapped or a held lease was
/// lost.
pub(crate) async fn exec(global: &GlobalOptions, args: &BenchArgs) -> anyhow::Result<u8> {
    if args.workers == Some(0) || args.tasks == 0 || args.repeat == 0 {
        return Err(exit::fail(
            exit::USAGE,
            "--workers, --tasks and --repeat must be at least 1",
        ));
    }
    if args.leases.contains(&0) {
        return Err(exit::fail(exit::USAGE, "--leases must be at least 1"));
    }
    if global.tls_cert.is_some() != global.tls_key.is_some() {
        return Err(exit::fail(
            exit::USAGE,
            "--tls-cert and --tls-key go together",
        ));
    }
    if args.plot.is_some() && !args.scenario.contains(&ScenarioArg::Contended) {
        return Err(exit::fail(
            exit::USAGE,
            "--plot needs the contended scenario: add --scenario contended",
        ));
    }
    // An unwritable plot path is reported now, not after the whole run (an
    // existing plot is kept until the new one is written).
    if let Some(path) = &args.plot {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                exit::fail(
                    exit::USAGE,
                    format!("--plot {}: cannot create it: {e}", path.display()),
                )
            })?;
    }
    // Before a private server starts: the URL plays no part in the check.
    config(global, args, String::new())
        .check()
        .map_err(|e| exit::fail(exit::USAGE, e.to_string()))?;
    if crate::connect::is_etcd(global) {
        if args.cycles.is_some() {
            return Err(exit::fail(
                exit::USAGE,
                "--cycles is for Redis: it counts the client's work per cycle next to the floor's",
            ));
        }
        if args.plot.is_some() {
            return Err(exit::fail(
                exit::USAGE,
                "--plot is for Redis runs: on etcd every wait mode waits in the same queue",
            ));
        }
        if args.scenario.contains(&ScenarioArg::Semaphore) {
            return Err(exit::fail(
                exit::USAGE,
                "--scenario semaphore is measured on Redis only (its mutex reference and handoff floor are Redis's)",
            ));
        }
        if args.scenario.contains(&ScenarioArg::Rwlock) {
            return Err(exit::fail(
                exit::USAGE,
                "--scenario rwlock is measured on Redis only (its references are Redis's round trip and handoff floor)",
            ));
        }
        return run_etcd(config(global, args, crate::connect::url(global)), args).await;
    }
    let (url, private) =
        PrivateRedis::unless_given(crate::connect::given_url(global).as_deref()).await?;
    let result = match args.cycles {
        Some(n) => count(config(global, args, url), args.path, n).await,
        None => {
            let mut config = config(global, args, url);
            config.pin_redis = private
                .as_ref()
                .filter(|_| !args.no_pin)
                .map(PrivateRedis::pid);
            run_on(config, args).await
        }
    };
    if let Some(p) = private {
        p.stop().await;
    }
    result
}

/// The engine's configuration from the flags.
fn config(global: &GlobalOptions, args: &BenchArgs, url: String) -> Config {
    let mut config = Config::new(url);
    config.prefix = global.prefix.clone();
    config.tls = fencelock_bench::Tls {
        ca: global.tls_ca.clone(),
        client: global.tls_cert.clone().zip(global.tls_key.clone()),
    };
    config.scenarios = args
        .scenario
        .iter()
        .map(|s| match s {
            ScenarioArg::Uncontended => Scenario::Uncontended,
            ScenarioArg::Contended => Scenario::Contended,
            ScenarioArg::Many => Scenario::Many,
            ScenarioArg::Held => Scenario::Held,
            ScenarioArg::Semaphore => Scenario::Semaphore,
            ScenarioArg::Rwlock => Scenario::RwLock,
        })
        .collect();
    config.duration = args.duration;
    config.rounds = args.repeat;
    config.leases = args.leases.clone();
    config.options = fencelock::LockOptions::default()
        .layout(global.layout.into())
        .fence_mode(
            global
                .fence_mode
                .map_or(fencelock::FenceMode::Clock, Into::into),
        );
    config.modes = args.mode.iter().map(|&m| m.into()).collect();
    config.workers = args.workers.unwrap_or(config.workers);
    config.semaphore_workers = args.workers.unwrap_or(config.semaphore_workers);
    config.permits = args.permits;
    config.rwlock_workers = args.workers.unwrap_or(config.rwlock_workers);
    config.rwlock_reads = args.reads;
    config.hold = args.hold;
    config.tasks = args.tasks;
    config
}

/// `--cycles N`: exactly N cycles of one path, and a line saying so.
async fn count(config: Config, path: PathArg, n: u64) -> anyhow::Result<u8> {
    let (path, shown) = match path {
        PathArg::Fencelock => (CyclePath::Fencelock, "fencelock"),
        PathArg::Floor => (CyclePath::Floor, "floor"),
        PathArg::Unfenced => (CyclePath::Unfenced, "unfenced"),
    };
    fencelock_bench::count_cycles(&config, path, n)
        .await
        .map_err(failure)?;
    println!("{n} cycles of {shown} (after 20 warm-up cycles)");
    Ok(exit::OK)
}

async fn run_on(config: Config, args: &BenchArgs) -> anyhow::Result<u8> {
    let format = format(args);
    let mut output = Output::new(format);
    let report: Report = fencelock_bench::run(&config, &mut output)
        .await
        .map_err(failure)?;
    print!("{}", output.renderer.finish(&report));
    if let Some(path) = &args.plot {
        std::fs::write(path, report.svg())
            .with_context(|| format!("cannot write {}", path.display()))?;
        print!("{}", output.renderer.plot_written(path));
    }
    Ok(if report.overlaps() == 0 && report.leases_lost() == 0 {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// The scenarios on etcd: one report at the end (progress on stderr).
async fn run_etcd(mut config: Config, args: &BenchArgs) -> anyhow::Result<u8> {
    // The held scenario measures what a Redis client keeps per lease (one
    // keeper, batched renewals); on etcd each lease is a server lease.
    config.scenarios.retain(|s| *s != Scenario::Held);
    if config.scenarios.is_empty() {
        return Err(exit::fail(
            exit::USAGE,
            "--scenario held is measured on Redis only (on etcd every lease is a server-side lease of its own)",
        ));
    }
    let format = format(args);
    let mut output = Output::new(format);
    let report = fencelock_bench::run_etcd(&config, &mut output)
        .await
        .map_err(failure)?;
    print!("{}", report.render(format));
    Ok(if report.overlaps() == 0 {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// The report's format: JSON lines with `--json`, else the human table.
fn format(args: &BenchArgs) -> Format {
    if args.json {
        Format::JsonLines
    } else {
        Format::Text
    }
}

/// An engine error with the exit code of its kind (its message never
/// contains the Redis password).
fn failure(e: fencelock_bench::Error) -> anyhow::Error {
    let code = match e.kind() {
        ErrorKind::InvalidInput => exit::USAGE,
        ErrorKind::Auth => exit::CONFIG,
        ErrorKind::Unreachable => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    };
    exit::fail(code, e.to_string())
}

/// The report on stdout as it grows, progress on stderr.
struct Output {
    renderer: Renderer,
    progress: Option<Progress>,
}

impl Output {
    /// Nothing shown yet.
    fn new(format: Format) -> Self {
        Output {
            renderer: Renderer::new(format),
            progress: None,
        }
    }
}

impl Observer for Output {
    fn measuring(&mut self, what: &str, expected: Duration) {
        // Never on stdout, so `--json` output stays clean.
        if std::io::stderr().is_terminal() {
            self.progress = Some(Progress::show(what, expected));
        }
    }

    fn measured(&mut self) {
        if let Some(progress) = self.progress.take() {
            progress.clear();
        }
    }

    fn updated(&mut self, report: &Report) {
        print!("{}", self.renderer.update(report));
    }
}

/// "running WHAT… elapsed/expected s" on stderr, redrawn every 250 ms until
/// cleared.
struct Progress {
    done: Arc<Mutex<bool>>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Progress {
    fn show(what: &str, expected: Duration) -> Self {
        let done = Arc::new(Mutex::new(false));
        let ticker = {
            let (done, what) = (done.clone(), what.to_string());
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                loop {
                    {
                        let done = done.lock().unwrap_or_else(PoisonError::into_inner);
                        if *done {
                            break;
                        }
                        eprint!(
                            "\r\x1b[2K  running {what}… {:.0}/{:.0} s",
                            started.elapsed().as_secs_f64(),
                            expected.as_secs_f64()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        Progress { done, ticker }
    }

    /// Clears the line; nothing is drawn after this returns.
    fn clear(self) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        *done = true;
        eprint!("\r\x1b[2K");
        drop(done);
        self.ticker.abort();
    }
}
