//! The `fencelock` command-line tool.
//!
//! | module | concern |
//! |---|---|
//! | `cli` | command-line syntax (clap) and global options |
//! | `exit` | exit codes (sysexits-style, as in the README) |
//! | `private_redis` | a private redis-server for commands run without `--redis` |
//! | `demo` | `fencelock demo`: the guide's scenario with a printed timeline |

// A command-line tool prints its results on stdout.
#![allow(clippy::print_stdout)]

mod cli;
mod demo;
mod exit;
mod private_redis;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            // clap formats help, version and usage errors itself.
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCELOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
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
