//! The `fencelock` command-line tool.
//!
//! | module | concern |
//! |---|---|
//! | `cli` | command-line syntax (clap) and global options |
//! | `connect` | global options to a connected client and lock options |
//! | `run` | `fencelock run`: a supervised command under a lock |
//! | `inspect` | `status`, `read`, `write`, `update` |
//! | `top` | `fencelock top`: a live view of the locks under a pattern (SCAN) |
//! | `doctor` | `fencelock doctor`: the library's deployment audit, one line per check |
//! | `diagnostics` | `run --metrics-addr` (Prometheus endpoint) and `run --verbose` (worst lag) |
//! | `usage_error` | clap's usage errors as one line that names what is wrong and the help page to read |
//! | `exit` | exit codes (sysexits-style, as in the README) and the one-line error that ends the process |
//! | `redact` | credentials kept out of every output: URLs shown without passwords, messages and logs scrubbed |
//! | `child` | child processes that die with `fencelock`; why a command could not start |
//! | `watchdog` | the process between `run` and its command that ties the command tree to the lock |
//! | `private_redis` | a private redis-server for commands run without `--redis` |
//! | `bench` | `fencelock bench`: speed and fairness next to Redis's own round trip |
//! | `demo` | `fencelock demo`: the guide's scenario with a printed timeline |
//! | `torture` | `fencelock torture`: the safety harness (engine: `fencelock-torture`) and its hidden `torture-worker` |
//! | `torture_topology` | the topologies `torture` starts itself: a single redis-server, a Sentinel, a Cluster |

// A command-line tool prints its results on stdout.
#![allow(clippy::print_stdout)]

mod bench;
mod child;
mod cli;
mod connect;
mod demo;
mod diagnostics;
mod doctor;
mod exit;
mod inspect;
mod private_etcd;
mod private_redis;
mod redact;
mod run;
mod top;
mod torture;
mod torture_topology;
mod usage_error;
mod watchdog;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    // `run` starts this binary again as the watchdog of its command: no
    // command-line parsing, no runtime, no threads.
    let mut raw = std::env::args_os().skip(1);
    if raw.next().as_deref() == Some(std::ffi::OsStr::new(watchdog::ARG)) {
        return ExitCode::from(watchdog::main(raw.collect()));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error::report(&e)),
    };
    redact::remember(&connect::url(&cli.global));
    install_logging();
    // One thread for the commands (children forked from it die with it, see
    // `child`); the benchmark needs real parallelism between its workers.
    let mut builder = match &cli.command {
        Command::Bench(_) => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime
        .block_on(dispatch(&cli))
        .unwrap_or_else(|e| exit::report(&e));
    ExitCode::from(code)
}

/// Logs as `FENCELOCK_LOG` asks (off by default), on stderr, scrubbed of
/// credentials.
fn install_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCELOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(redact::Stderr)
        .init();
}

/// Runs the subcommand: its exit code, or the error that ends the process.
async fn dispatch(cli: &Cli) -> anyhow::Result<u8> {
    let global = &cli.global;
    match &cli.command {
        Command::Run(args) => run::run(global, args).await,
        Command::Top(args) => top::run(global, args).await,
        Command::Status(args) => inspect::status(global, args).await,
        Command::Read(args) => inspect::read(global, args).await,
        Command::Write(args) => inspect::write(global, args).await,
        Command::Update(args) => inspect::update(global, args).await,
        Command::Doctor(args) => doctor::run(global, args).await,
        Command::Bench(args) => bench::run(global, args).await,
        Command::Demo(args) => demo::run(global, args).await,
        Command::Torture(args) => torture::run(global, args).await,
        Command::TortureWorker => torture::worker().await,
    }
}
