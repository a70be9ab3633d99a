//! Orphan-safe child processes for tests: [`spawn_guarded`] and
//! [`GuardedChild`], a thin wrapper of [`fencelock_servers::GuardedChild`]
//! whose [`GuardedChild::stop`] panics instead of returning an error.
//!
//! Children are forked from `fencelock-servers`' single long-lived spawner
//! thread with `PR_SET_PDEATHSIG = SIGKILL`, so they die with the test
//! process even when it is killed with SIGKILL (for example by nextest on a
//! timeout), and [`GuardedChild`]'s `Drop` kills and reaps them on the
//! normal path.
//!
//! ```no_run
//! use std::io::{BufRead, BufReader, Write};
//! use std::process::{Command, Stdio};
//!
//! let mut command = Command::new("cat");
//! command.stdin(Stdio::piped()).stdout(Stdio::piped());
//! let mut child = fencelock_testkit::spawn_guarded(command);
//! let mut stdin = child.take_stdin().expect("stdin was piped");
//! let mut stdout = BufReader::new(child.take_stdout().expect("stdout was piped"));
//! writeln!(stdin, "hello").expect("write to cat");
//! let mut line = String::new();
//! stdout.read_line(&mut line).expect("read from cat");
//! assert_eq!(line, "hello\n");
//! ```

use std::io;
use std::ops::{Deref, DerefMut};
use std::process::Command;

pub use fencelock_servers::child::{process_alive, process_state, wait_process_gone};

/// Spawns `command` as an orphan-safe child process.
///
/// The command's stdio is used as configured: the default is to inherit the
/// test's stdin/stdout/stderr, which nextest may report as a leak, so set
/// [`std::process::Stdio::null`], a file, or [`std::process::Stdio::piped`]
/// (then use `take_stdin` / `take_stdout`).
///
/// # Panics
///
/// Panics if the process cannot be spawned (for example, the program does not
/// exist); use [`try_spawn_guarded`] to handle that error.
pub fn spawn_guarded(command: Command) -> GuardedChild {
    let program = command.get_program().to_string_lossy().into_owned();
    try_spawn_guarded(command)
        .unwrap_or_else(|error| panic!("failed to spawn guarded child `{program}`: {error}"))
}

/// Like [`spawn_guarded`], but returns the spawn error instead of panicking.
pub fn try_spawn_guarded(command: Command) -> io::Result<GuardedChild> {
    fencelock_servers::GuardedChild::spawn(command).map(GuardedChild)
}

/// A child process that is killed and reaped when dropped, and killed by the
/// kernel if the test process dies first: every method of
/// [`fencelock_servers::GuardedChild`] (`pid`, `signal`, `cont`, `kill`,
/// `try_wait`, `wait_timeout`, `take_stdin`, …), with a panicking
/// [`GuardedChild::stop`].
///
/// Created by [`spawn_guarded`].
#[derive(Debug)]
pub struct GuardedChild(fencelock_servers::GuardedChild);

impl GuardedChild {
    /// Freezes the child with SIGSTOP and returns once the kernel reports it
    /// as stopped (or it is dead).
    ///
    /// # Panics
    ///
    /// Panics if the child is still not stopped after 5 seconds.
    pub fn stop(&self) {
        if let Err(error) = self.0.stop() {
            panic!("child {error}");
        }
    }
}

impl From<fencelock_servers::GuardedChild> for GuardedChild {
    fn from(child: fencelock_servers::GuardedChild) -> Self {
        GuardedChild(child)
    }
}

impl Deref for GuardedChild {
    type Target = fencelock_servers::GuardedChild;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for GuardedChild {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
