//! The `fencelock` command-line tool.
//!
//! Laid out like cargo's commands: `main` parses the command line and hands
//! the subcommand to its module in `commands/`, which holds the
//! subcommand's arguments (its `…Args` struct, whose doc comments are its
//! `--help`) and `exec`, the function that carries it out. What several
//! commands use lives beside `commands/`; none of it imports a command.
//!
//! | file | concern |
//! |---|---|
//! | `main.rs` | process setup (the watchdog's re-entry, logging, the runtime), parsing, dispatch to a command's `exec`, the exit code |
//! | `cli.rs` | the top of the command line: `fencelock --help` (examples, exit codes) and the list of subcommands |
//! | `global_options.rs` | the options every subcommand takes: `--url`, the TLS files, `--prefix`, `--layout`, `--fence-mode`, `--fence-epoch` |
//! | `arg_values.rs` | argument values several subcommands share: durations, wait modes |
//! | `usage_error.rs` | clap's usage errors as one line that names what is wrong and the help page to read |
//! | `commands.rs` | the subcommands' modules, and how each is laid out |
//! | `commands/run.rs` | `fencelock run`: a supervised command under a lock (a mutex, a semaphore's permit, or a read-write lock's side) |
//! | `commands/status.rs` | `fencelock status`: whether a lock is held, by whom, its fence and time left |
//! | `commands/read.rs` | `fencelock read`: a fenced resource's value, optionally registering the caller's fence first or validating the read against a reader's write epoch |
//! | `commands/write.rs` | `fencelock write`: a fenced write |
//! | `commands/revoke.rs` | `fencelock revoke`: take a lock away and seal resources against its holder |
//! | `commands/update.rs` | `fencelock update`: a fenced read-modify-write through a command |
//! | `commands/top.rs` | `fencelock top`: a live view of the locks under a pattern (SCAN) |
//! | `commands/doctor.rs` | `fencelock doctor`: the library's deployment audit, one line per check |
//! | `commands/bench.rs` | `fencelock bench`: speed and fairness next to Redis's own round trip |
//! | `commands/demo.rs` | `fencelock demo`: the guide's scenario with a printed timeline |
//! | `commands/torture.rs` | `fencelock torture`: the safety harness (engine: `fencelock-torture`) and its hidden `torture-worker` |
//! | `connect.rs` | global options to a connected client and lock options |
//! | `fenced_resource.rs` | what `read`, `write` and `update` share: the resource (a Redis hash or an etcd key), the writer's fence and token, a refusal as stale, the refusal of a reader's write epoch as a fence |
//! | `semaphore_view.rs` | how `status` and `top` show a semaphore's holders, one per slot |
//! | `rwlock_view.rs` | how `status` and `top` show a read-write lock's writer and readers |
//! | `diagnostics.rs` | `run --metrics-addr` (Prometheus endpoint) and `run --verbose` (worst lag) |
//! | `exit.rs` | exit codes (sysexits-style, as in the README) and the one-line error that ends the process |
//! | `redact.rs` | credentials kept out of every output: URLs shown without passwords, messages and logs scrubbed |
//! | `child.rs` | child processes that die with `fencelock`; why a command could not start |
//! | `watchdog.rs` | the process between `run` and its command that ties the command tree to the lock |
//! | `private_redis.rs` | a private redis-server for commands run without `--redis` |
//! | `private_etcd.rs` | a private 3-member etcd cluster for `torture --topology etcd` |
//! | `torture_topology.rs` | the topologies `torture` starts itself; `--topology single` (one redis-server for the locks, one for the resource) |
//! | `torture_topology/sentinel.rs` | `torture --topology sentinel`: a primary, 2 replicas and 3 sentinels |
//! | `torture_topology/cluster.rs` | `torture --topology cluster`: 3 masters with a replica each |
//! | `torture_topology/etcd.rs` | `torture --topology etcd`: 3 etcd members |

// A command-line tool prints its results on stdout.
#![allow(clippy::print_stdout)]

mod arg_values;
mod child;
mod cli;
mod commands;
mod connect;
mod diagnostics;
mod exit;
mod fenced_resource;
mod global_options;
mod private_etcd;
mod private_redis;
mod redact;
mod rwlock_view;
mod semaphore_view;
mod torture_topology;
mod usage_error;
mod watchdog;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::commands::{
    bench, demo, doctor, read, revoke, run, status, top, torture, update, write,
};

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
        Command::Run(args) => run::exec(global, args).await,
        Command::Status(args) => status::exec(global, args).await,
        Command::Read(args) => read::exec(global, args).await,
        Command::Write(args) => write::exec(global, args).await,
        Command::Update(args) => update::exec(global, args).await,
        Command::Revoke(args) => revoke::exec(global, args).await,
        Command::Top(args) => top::exec(global, args).await,
        Command::Doctor(args) => doctor::exec(global, args).await,
        Command::Bench(args) => bench::exec(global, args).await,
        Command::Demo(args) => demo::exec(global, args).await,
        Command::Torture(args) => torture::exec(global, args).await,
        Command::TortureWorker => torture::worker().await,
    }
}
