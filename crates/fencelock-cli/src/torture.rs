//! `fencelock torture`: the command line of the safety harness
//! (`fencelock-torture`). Flags become a [`Config`]; the topology is a
//! private single redis-server ([`crate::torture_topology::Single`]) or the
//! deployment given with `--redis`; workers are this binary again
//! (`torture-worker`), tied to this process by the parent-death signal;
//! the report goes to stdout (a progress line to stderr on a terminal);
//! violations exit 1.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use fencelock_torture::{
    Config, ErrorKind, History, Launcher, NemesisKind, Progress, Remote, Report, ResourceKind,
    Status, Variant,
};
use tokio_util::sync::CancellationToken;

use crate::cli::{Global, WaitModeArg, parse_duration};
use crate::exit;
use crate::torture_topology::Single;

pub(crate) const HELP: &str = "\
Workers are separate processes (this binary again), each running lease
cycles on the lock names: acquire, register the fence at the resource,
read the counter, work up to --hold, write counter + 1, release. The
resource records every accepted write in an audit log in the same script
(Redis) or transaction (Postgres). Nemeses are injected one at a time on a
schedule fixed by --seed. At the end the checkers read the whole history:

  C1 no write accepted with a fence lower than an accepted one
  C2 no two different holders accepted with the same fence
  C3 no acknowledged write lost (counter = acknowledged increments)
  C4 no two workers in their critical sections while both leases were valid
  C5 a lost lease is signalled within one renewal interval of being visible
  C6 fences strictly increase in grant order (clock mode: across restarts)
  C7 no lock key re-created after it ended (no zombie renewals)

Nemeses (--nemesis, comma-separated; default: every one available):
  server side, on the private redis-server only: pause-server (SIGSTOP past
  the ttl), kill-restart (kill -9, restart with its data), kill-wipe (kill
  -9, restart empty: no persistence), debug-sleep, client-pause,
  script-flush
  client side, also with --redis: pause-worker (SIGSTOP a holder past the
  ttl), client-kill (CLIENT KILL of workers' connections), proxy-delay,
  proxy-blackhole, proxy-swallow (reply dropped after the command ran),
  proxy-reset

With --redis URL only client-side nemeses run, every key is under a random
prefix (below --prefix) and deleted at the end.

Negative controls (--unsafe VARIANT[,VARIANT...] or all) run deliberately
BROKEN variants instead of fencelock, each with the nemeses that expose it
(unless --nemesis is given), and stop once the checkers catch it:
  two-command-acquire  SET NX then INCR (the guide's acquire)
  ge-check             resource accepts fence >= stored, ignoring the holder
  write-only-check     read-modify-write without registering the fence first
  unchecked-release    release by plain DEL
  recreating-renewal   renewal re-creates an expired key, even after release

Examples:
  fencelock torture
  fencelock torture --duration 30m --seed 42 --history torture.jsonl
  fencelock torture --check torture.jsonl
  fencelock torture --unsafe all
  fencelock --redis redis://10.0.0.5:6379 torture --nemesis pause-worker,proxy-delay

Exit codes: 0 no violation, 1 a violation (also for a caught --unsafe
control), 64 usage, 69 Redis unreachable, 78 bad configuration.";

/// Options of `torture`.
#[derive(Debug, Args)]
pub(crate) struct TortureArgs {
    /// How long the workload and the nemeses run.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) duration: Duration,
    /// Worker processes.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub(crate) workers: usize,
    /// Lock names (each with its own resource).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) names: usize,
    /// How workers wait for a held lock.
    #[arg(long, value_enum, default_value_t = WaitModeArg::Notify, value_name = "MODE")]
    pub(crate) mode: WaitModeArg,
    /// Lease ttl (renewed every third of it); pauses and delays scale with it.
    #[arg(long, default_value = "300ms", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ttl: Duration,
    /// Longest work between a worker's read and its write.
    #[arg(long, default_value = "50ms", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) hold: Duration,
    /// The protected resource.
    #[arg(long, value_enum, default_value_t = ResourceArg::Redis)]
    pub(crate) resource: ResourceArg,
    /// Postgres URL for --resource postgres (two tables are created and
    /// dropped at the end).
    #[arg(
        long,
        env = "FENCELOCK_PG_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) pg_url: Option<String>,
    /// Nemeses, comma-separated (`none` for none; default: every one
    /// available).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub(crate) nemesis: Option<Vec<String>>,
    /// Mean quiet time between two nemeses.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) nemesis_interval: Duration,
    /// Seed of the nemesis schedule and the workers' choices (default:
    /// random, shown in the report).
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,
    /// Run negative controls (BROKEN variants) instead of fencelock:
    /// comma-separated names, or `all`.
    #[arg(long = "unsafe", value_delimiter = ',', value_name = "VARIANT")]
    pub(crate) unsafe_variants: Option<Vec<String>>,
    /// The topology started for the run (`--redis URL` uses that deployment
    /// instead).
    #[arg(long, value_enum, default_value_t = TopologyArg::Single)]
    pub(crate) topology: TopologyArg,
    /// Write the history (JSON lines) to FILE as it is recorded.
    #[arg(long, value_name = "FILE")]
    pub(crate) history: Option<PathBuf>,
    /// Check a saved history instead of running.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["unsafe_variants", "history"])]
    pub(crate) check: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Resources on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ResourceArg {
    /// A Redis hash and an audit list, written by one script.
    Redis,
    /// A Postgres row and an audit table, written in one transaction.
    Postgres,
}

/// Topologies on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TopologyArg {
    /// One private redis-server.
    Single,
}

/// `fencelock torture-worker`: a worker process.
pub(crate) async fn worker() -> anyhow::Result<u8> {
    fencelock_torture::worker::main().await.map_err(failure)?;
    Ok(exit::OK)
}

/// This binary again, as a worker that dies with this process.
struct SelfLauncher;

impl Launcher for SelfLauncher {
    fn worker(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.arg("torture-worker")
            // Not in the terminal's process group: Ctrl-C is ours to handle.
            .process_group(0)
            .env_remove("FENCELOCK_LOG");
        crate::child::die_with_parent(&mut cmd);
        cmd
    }
}

/// The progress line on stderr.
struct Line;

impl Progress for Line {
    fn tick(&mut self, s: &Status) {
        eprint!(
            "\r\x1b[2K  torture: {:.0}/{:.0} s, {} cycles, {} writes acknowledged, {} nemeses{}",
            s.elapsed.as_secs_f64(),
            s.duration.as_secs_f64(),
            s.ops,
            s.acknowledged,
            s.nemeses,
            s.last_nemesis
                .map(|k| format!(" (last: {k})"))
                .unwrap_or_default()
        );
    }
}

fn usage(message: impl Into<String>) -> anyhow::Error {
    exit::fail(exit::USAGE, message)
}

fn nemeses(list: &Option<Vec<String>>) -> anyhow::Result<Option<Vec<NemesisKind>>> {
    let Some(list) = list else { return Ok(None) };
    if list.iter().any(|n| n == "none") {
        return Ok(Some(Vec::new()));
    }
    if list.iter().any(|n| n == "all") {
        return Ok(None);
    }
    list.iter()
        .map(|n| {
            NemesisKind::parse(n.trim()).ok_or_else(|| {
                let known: Vec<&str> = NemesisKind::ALL.iter().map(|k| k.name()).collect();
                usage(format!(
                    "--nemesis {n}: no such nemesis (use {}, all or none)",
                    known.join(", ")
                ))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

fn variants(list: &Option<Vec<String>>) -> anyhow::Result<Vec<Option<Variant>>> {
    let Some(list) = list else {
        return Ok(vec![None]);
    };
    if list.iter().any(|n| n == "all") {
        return Ok(Variant::ALL.into_iter().map(Some).collect());
    }
    list.iter()
        .map(|n| {
            Variant::parse(n.trim()).map(Some).ok_or_else(|| {
                let known: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
                usage(format!(
                    "--unsafe {n}: no such negative control (use {} or all)",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

fn failure(e: fencelock_torture::Error) -> anyhow::Error {
    let code = match e.kind() {
        ErrorKind::Usage => exit::USAGE,
        ErrorKind::Unreachable => exit::UNAVAILABLE,
        ErrorKind::History => exit::DATA,
        _ => exit::SOFTWARE,
    };
    exit::fail(code, e.to_string())
}

/// `fencelock torture`.
pub(crate) async fn run(global: &Global, args: &TortureArgs) -> anyhow::Result<u8> {
    if let Some(path) = &args.check {
        let history = History::read(path).map_err(failure)?;
        let report = Report::from_history(&history);
        return Ok(show(&[report], args.json));
    }
    if args.workers == 0 || args.names == 0 {
        return Err(usage("--workers and --names must be at least 1"));
    }
    let kinds = nemeses(&args.nemesis)?;
    let runs = variants(&args.unsafe_variants)?;
    let resource = match (args.resource, &args.pg_url) {
        (ResourceArg::Redis, _) => ResourceKind::Redis,
        (ResourceArg::Postgres, Some(url)) => ResourceKind::Postgres { url: url.clone() },
        (ResourceArg::Postgres, None) => {
            return Err(usage(
                "--resource postgres needs --pg-url URL (or FENCELOCK_PG_URL): a database in which the run may create two tables, dropped at the end; fencelock torture does not start a Postgres server itself (initdb refuses to run as root, and a private one would not be the deployment you want to test)",
            ));
        }
    };
    if crate::connect::is_etcd(global) {
        return Err(usage(
            "torture runs against Redis (its audited resource, checkers and server nemeses use Redis); on etcd, the library's etcd tests cover the same properties",
        ));
    }
    let given = crate::connect::given_url(global);
    if let Some(list) = &kinds
        && given.is_some()
        && let Some(k) = list.iter().find(|k| k.needs_server_control())
    {
        return Err(usage(format!(
            "--nemesis {}: needs control of the Redis server, which --redis never gives (client-side nemeses: pause-worker, client-kill, proxy-delay, proxy-blackhole, proxy-swallow, proxy-reset)",
            k.name()
        )));
    }
    let seed = args.seed.unwrap_or_else(|| {
        let b = uuid::Uuid::new_v4().into_bytes();
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) % 1_000_000
    });
    let interrupt = CancellationToken::new();
    {
        let interrupt = interrupt.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "\nfencelock torture: interrupted; stopping the workers and checking what ran"
                );
                interrupt.cancel();
            }
        });
    }
    let mut reports = Vec::new();
    for variant in &runs {
        if interrupt.is_cancelled() {
            break;
        }
        let mut config = Config::new();
        config.duration = args.duration;
        config.workers = args.workers;
        config.names = args.names;
        config.ttl = args.ttl;
        config.hold = args.hold;
        config.mode = args.mode.into();
        config.fence_mode = global
            .fence_mode
            .map_or(fencelock::FenceMode::Clock, Into::into);
        config.resource = resource.clone();
        config.nemeses = kinds.clone();
        config.nemesis_interval = args.nemesis_interval;
        config.seed = seed;
        config.variant = *variant;
        config.stop_on_violation = variant.is_some();
        config.prefix = format!("{}torture:", global.prefix);
        config.history = args.history.as_ref().map(|p| match (variant, runs.len()) {
            (Some(v), n) if n > 1 => {
                let mut name = p.clone().into_os_string();
                name.push(format!(".{}", v.name()));
                PathBuf::from(name)
            }
            _ => p.clone(),
        });
        let mut progress: Box<dyn Progress> = if std::io::stderr().is_terminal() {
            Box::new(Line)
        } else {
            Box::new(())
        };
        let report = match &given {
            Some(url) => {
                let mut remote = Remote::new(url.clone());
                fencelock_torture::run(
                    &config,
                    &mut remote,
                    &SelfLauncher,
                    progress.as_mut(),
                    interrupt.clone(),
                )
                .await
            }
            None => {
                let TopologyArg::Single = args.topology;
                let mut single = Single::start().await?;
                let report = fencelock_torture::run(
                    &config,
                    &mut single,
                    &SelfLauncher,
                    progress.as_mut(),
                    interrupt.clone(),
                )
                .await;
                single.stop().await;
                report
            }
        };
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K");
        }
        reports.push(report.map_err(failure)?);
    }
    Ok(show(&reports, args.json))
}

/// Prints the reports; the exit code: 1 if any found a violation.
fn show(reports: &[Report], json: bool) -> u8 {
    let controls = reports.len() > 1;
    if json {
        let value = if controls {
            serde_json::json!({
                "controls": reports.iter().map(Report::to_json).collect::<Vec<_>>(),
                "caught": reports.iter().filter(|r| r.violations() > 0).count(),
                "of": reports.len(),
            })
        } else {
            reports.first().map(Report::to_json).unwrap_or_default()
        };
        println!("{value}");
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                println!("{}", "-".repeat(72));
            }
            print!("{}", r.to_text());
        }
        if controls {
            println!("\nnegative controls:");
            for r in reports {
                let name = r
                    .header
                    .as_ref()
                    .and_then(|h| h.unsafe_variant.clone())
                    .unwrap_or_default();
                match r.first_violation_s() {
                    Some(s) => println!(
                        "  {name:<20} caught by {} after {s:.1} s",
                        r.caught_by().join(", ")
                    ),
                    None => println!("  {name:<20} NOT CAUGHT"),
                }
            }
        }
    }
    if reports.iter().any(|r| r.violations() > 0) {
        exit::FAILED
    } else {
        exit::OK
    }
}
