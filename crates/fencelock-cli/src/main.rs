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
//! | `exit` | exit codes (sysexits-style, as in the README) |
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
        Err(e) if e.use_stderr() => {
            eprintln!("{}", redact::scrub(&usage_line(&e)));
            return ExitCode::from(exit::USAGE);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::from(exit::OK);
        }
    };
    redact::remember(&connect::url(&cli.global));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCELOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(redact::Stderr)
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
            Command::Update(args) => inspect::update(&cli.global, args).await,
            Command::Doctor(args) => doctor::run(&cli.global, args).await,
            Command::Bench(args) => bench::run(&cli.global, args).await,
            Command::Demo(args) => demo::run(&cli.global, args).await,
            Command::Torture(args) => torture::run(&cli.global, args).await,
            Command::TortureWorker => torture::worker().await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = exit::code_for(&e);
            eprintln!("fencelock: {}", redact::scrub(&exit::one_line(&e)));
            ExitCode::from(code)
        }
    }
}

/// A clap usage error as one line that names what is wrong and where to look:
/// `fencelock: missing required argument <NAME> (see fencelock run --help)`.
fn usage_line(e: &clap::Error) -> String {
    let message = if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let names: Vec<String> = <Cli as clap::CommandFactory>::command()
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_string())
            .collect();
        format!("no command given: use one of {}", names.join(", "))
    } else {
        error_message(&e.render().to_string())
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("fencelock: {message} (see {} --help)", command_path(&args))
}

/// clap's message, with the arguments it lists on the lines after a heading
/// that ends with `:` (the missing ones, for instance) on the same line.
fn error_message(rendered: &str) -> String {
    let mut lines = rendered.lines().map(str::trim_end);
    let first = lines
        .by_ref()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid usage")
        .trim_start_matches("error: ");
    let mut items = Vec::new();
    if first.ends_with(':') {
        items.extend(
            lines
                .take_while(|l| l.starts_with(char::is_whitespace) && !l.trim().is_empty())
                .map(str::trim),
        );
    }
    match (first, items.as_slice()) {
        ("the following required arguments were not provided:", [one]) => {
            format!("missing required argument {one}")
        }
        ("the following required arguments were not provided:", many) if !many.is_empty() => {
            format!("missing required arguments {}", many.join(", "))
        }
        (first, []) => first.to_string(),
        (first, items) => format!("{} {}", first.trim_end_matches(':'), items.join(", ")),
    }
}

/// `fencelock SUBCOMMAND` if the command line names one, else `fencelock`:
/// the help page that explains the error.
fn command_path(args: &[String]) -> String {
    let command = <Cli as clap::CommandFactory>::command();
    // Global options that take a separate value (`--prefix run` names no
    // subcommand).
    let with_value: Vec<String> = command
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_positional())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let mut skip = false;
    for arg in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if arg == "--" {
            break;
        }
        if with_value.contains(arg) {
            skip = true;
            continue;
        }
        if let Some(sub) = command
            .get_subcommands()
            .find(|c| c.get_name() == arg && !c.is_hide_set())
        {
            return format!("fencelock {}", sub.get_name());
        }
    }
    "fencelock".to_string()
}

#[cfg(test)]
mod tests {
    use super::{command_path, error_message};

    #[test]
    fn usage_lines_name_the_argument_and_the_command() {
        let rendered = "error: the following required arguments were not provided:\n  <NAME>\n\nUsage: fencelock run --ttl <DURATION> <NAME> [-- <CMD>...]\n\nFor more information, try '--help'.\n";
        assert_eq!(error_message(rendered), "missing required argument <NAME>");
        let rendered = "error: the following required arguments were not provided:\n  --fence <N>\n  <VALUE>\n\nUsage: fencelock write <RESOURCE> <VALUE>\n";
        assert_eq!(
            error_message(rendered),
            "missing required arguments --fence <N>, <VALUE>"
        );
        assert_eq!(
            error_message("error: unexpected argument '--x' found\n\n  tip: ...\n"),
            "unexpected argument '--x' found"
        );
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command_path(&args(&["--prefix", "run", "status"])),
            "fencelock status"
        );
        assert_eq!(
            command_path(&args(&["--ttl", "1s", "run"])),
            "fencelock run"
        );
        assert_eq!(command_path(&args(&["bogus", "--", "run"])), "fencelock");
    }
}
