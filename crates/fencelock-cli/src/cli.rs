//! The top of the command line, `fencelock [OPTIONS] <COMMAND>`: the
//! binary's own help page (examples, exit codes) and the list of its
//! subcommands.
//!
//! A subcommand's arguments are its `…Args` struct, in its module of
//! [`crate::commands`] beside the code that executes them: the struct's doc
//! comment is the subcommand's about line, its `after_help` the rest of its
//! help page. The options every subcommand takes are [`GlobalOptions`].

use clap::{Parser, Subcommand};

use crate::commands::bench::BenchArgs;
use crate::commands::demo::DemoArgs;
use crate::commands::doctor::DoctorArgs;
use crate::commands::read::ReadArgs;
use crate::commands::revoke::RevokeArgs;
use crate::commands::run::RunArgs;
use crate::commands::status::StatusArgs;
use crate::commands::top::TopArgs;
use crate::commands::torture::TortureArgs;
use crate::commands::update::UpdateArgs;
use crate::commands::write::WriteArgs;
use crate::global_options::GlobalOptions;

/// Distributed locks with fencing tokens on Redis or etcd.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    about = "Distributed locks with fencing tokens on Redis or etcd",
    after_help = HELP
)]
pub(crate) struct Cli {
    /// The options every subcommand takes.
    #[command(flatten)]
    pub(crate) global: GlobalOptions,
    /// The subcommand, with its own arguments.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The rest of `fencelock --help`: examples, and the exit codes of every
/// subcommand.
const HELP: &str = "\
Examples:
  fencelock run nightly-report -- ./report.sh --date today
  fencelock run --no-wait migrate -- sqlx migrate run
  fencelock status nightly-report
  fencelock revoke invoice-42 --resource invoice:42   # take it away, fence out its holder
  fencelock doctor              # is this Redis fit for locks?
  fencelock --url etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379 run job -- ./job.sh
  fencelock write invoice:42 closed --fence \"$FENCELOCK_FENCE\"
  fencelock run counter -- fencelock update counter -- sh -c 'read v; echo $(( ${v:-0} + 1 ))'
  fencelock run --read config -- fencelock read --validate config:data
  fencelock demo                # the guide's scenario on a private redis-server

Exit codes:
  run: the command's own code, 128+N if it died of signal N, 126 not executable
       (or its #! interpreter is missing), 127 not found, 75 lock not acquired
       (--conflict-exit-code), 76 lock lost while the command ran
  write, update, read --register: 0 done, 3 rejected as stale (nothing written),
       64 inside `run --read` (a reader's write epoch is not a write fence)
  read --validate: 0 clean, 75 torn (a writer came in after the reader's
       epoch: read again)
  revoke: 0 a holder deposed, 75 the lock was free (resources sealed all the
       same), 4 done but fewer replicas than --replicas acknowledged it
  doctor: 0 every check passed, 1 warnings, 2 failures
  update: the command's own code if it failed, 65 its output is not text
  all: 64 usage, 69 Redis or etcd unreachable, 70 internal error, 78 bad configuration
       (wrong password, a missing ACL permission, a key of the wrong type, a
       database that does not exist, redis-server missing, a lock name held as
       another kind of lock: `run --permits`, `run --read` or `run --write` on
       a mutex, `run` on a semaphore or a read-write lock, and so on, or
       another permit count)";

/// The subcommands, in the order `fencelock --help` lists them.
// A variant has no doc comment: clap would show it in place of the about
// line that the variant's `…Args` struct carries.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    Run(RunArgs),
    Status(StatusArgs),
    Read(ReadArgs),
    Write(WriteArgs),
    Update(UpdateArgs),
    Revoke(RevokeArgs),
    Top(TopArgs),
    Doctor(DoctorArgs),
    Bench(BenchArgs),
    Demo(DemoArgs),
    Torture(TortureArgs),
    /// A worker process of `fencelock torture` (internal).
    #[command(name = "torture-worker", hide = true)]
    TortureWorker,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap prints `[env: NAME=value]` in --help unless told not to: the
    /// Redis URL (password) and FENCELOCK_TOKEN (the holder's secret)
    /// would be shown.
    #[test]
    fn help_never_shows_environment_values() {
        fn check(command: &clap::Command, path: &str) {
            for arg in command.get_arguments() {
                if arg.get_env().is_some() {
                    assert!(
                        arg.is_hide_env_values_set(),
                        "{path} --{}: hide_env_values",
                        arg.get_id()
                    );
                }
            }
            for sub in command.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&super::Cli::command(), "fencelock");
    }
}
