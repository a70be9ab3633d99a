//! The `fencelock` command-line tool.
//!
//! | module | concern |
//! |---|---|
//! | `cli` | command-line syntax (clap) and global options |
//! | `connect` | global options to a connected client and lock options |
//! | `run` | `fencelock run`: a supervised command under a lock |
//! | `inspect` | `status`, `read`, `write` |
//! | `top` | `fencelock top`: a live view of the locks under a pattern (SCAN) |
//! | `diagnostics` | `run --metrics-addr` (Prometheus endpoint) and `run --verbose` (worst lag) |
//! | `exit` | exit codes (sysexits-style, as in the README) |
//! | `child` | child processes that die with `fencelock` |
//! | `private_redis` | a private redis-server for commands run without `--redis` |
//! | `bench` | `fencelock bench`: speed and fairness next to Redis's own round trip |
//! | `demo` | `fencelock demo`: the guide's scenario with a printed timeline |

// A command-line tool prints its results on stdout.
#![allow(clippy::print_stdout)]

mod bench;
mod child;
mod cli;
mod connect;
mod demo;
mod diagnostics;
mod exit;
mod inspect;
mod private_redis;
mod run;
mod top;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // Usage errors are one line that says what to do, like every error.
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid usage");
            eprintln!(
                "fencelock: {} (see fencelock --help)",
                first.trim_start_matches("error: ")
            );
            return ExitCode::from(exit::USAGE);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::from(exit::OK);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCELOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
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
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Run(args) => run::run(&cli.global, args).await,
            Command::Top(args) => top::run(&cli.global, args).await,
            Command::Status(args) => inspect::status(&cli.global, args).await,
            Command::Read(args) => inspect::read(&cli.global, args).await,
            Command::Write(args) => inspect::write(&cli.global, args).await,
            Command::Bench(args) => bench::run(&cli.global, args).await,
            Command::Demo(args) => demo::run(&cli.global, args).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = exit::code_for(&e);
            eprintln!("fencelock: {}", exit::one_line(&e));
            ExitCode::from(code)
        }
    }
}
