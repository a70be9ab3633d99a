//! Orphan-safe child processes for tests: [`spawn_guarded`] and [`GuardedChild`].
//!
//! Children are forked from the crate's single long-lived spawner thread with
//! `PR_SET_PDEATHSIG = SIGKILL`, so they die with the test process even when
//! it is killed with SIGKILL (for example by nextest on a timeout), and
//! [`GuardedChild`]'s `Drop` kills and reaps them on the normal path.
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

use std::fmt;
use std::io;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::spawner;

/// How often polling loops in this module look again.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// How long [`GuardedChild::stop`] waits for the kernel to report the child
/// as stopped.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// Spawns `command` as an orphan-safe child process.
///
/// The command's stdio is used as configured: the default is to inherit the
/// test's stdin/stdout/stderr, which nextest may report as a leak, so set
/// [`std::process::Stdio::null`], a file, or [`std::process::Stdio::piped`]
/// (then use [`GuardedChild::take_stdin`] / [`GuardedChild::take_stdout`]).
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
    let program = command.get_program().to_string_lossy().into_owned();
    let child = spawner::spawn(command)?;
    Ok(GuardedChild {
        child,
        status: None,
        program,
    })
}

/// A child process that is killed and reaped when dropped, and killed by the
/// kernel if the test process dies first.
///
/// Created by [`spawn_guarded`].
pub struct GuardedChild {
    child: Child,
    /// Set once the child has been reaped; after that its pid may belong to
    /// another process, so no more signals are sent.
    status: Option<ExitStatus>,
    program: String,
}

impl fmt::Debug for GuardedChild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedChild")
            .field("program", &self.program)
            .field("pid", &self.child.id())
            .field("status", &self.status)
            .finish()
    }
}

impl GuardedChild {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The program this child runs, as given to the [`Command`].
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Sends `signal` to the child. Does nothing once the child has been
    /// reaped (its pid could have been reused). Errors (the child already
    /// exited) are ignored.
    pub fn signal(&self, signal: Signal) {
        if self.status.is_none() {
            let _ = signal::kill(self.nix_pid(), signal);
        }
    }

    /// Freezes the child with SIGSTOP and returns once the kernel reports it
    /// as stopped (or it is dead).
    ///
    /// # Panics
    ///
    /// Panics if the child is still not stopped after 5 seconds.
    pub fn stop(&self) {
        self.signal(Signal::SIGSTOP);
        if self.status.is_some() {
            return;
        }
        let deadline = Instant::now() + STOP_DEADLINE;
        loop {
            match process_state(self.pid()) {
                // Stopped, traced, or dead: nothing left to wait for.
                None | Some('T' | 't' | 'Z' | 'X') => return,
                Some(_) => {}
            }
            assert!(
                Instant::now() < deadline,
                "child `{}` (pid {}) did not stop within {STOP_DEADLINE:?} of SIGSTOP",
                self.program,
                self.pid()
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Resumes a child frozen by [`GuardedChild::stop`] (SIGCONT).
    pub fn cont(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Kills the child with SIGKILL and reaps it. Idempotent: returns the
    /// exit status, also when the child had already exited.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if let Some(status) = self.status {
            return Some(status);
        }
        // SIGKILL also ends a stopped process; SIGCONT first is harmless and
        // makes the intent obvious in traces.
        self.signal(Signal::SIGCONT);
        self.signal(Signal::SIGKILL);
        match self.child.wait() {
            Ok(status) => {
                self.status = Some(status);
                Some(status)
            }
            Err(_) => None,
        }
    }

    /// Returns the exit status if the child has exited (reaping it), or
    /// `None` if it is still running (or stopped).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.status
    }

    /// Waits up to `timeout` for the child to exit; returns its exit status,
    /// or `None` if it is still running when the time is up.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Whether the child has not exited yet (a stopped child is running).
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Takes the child's stdin, if it was configured as
    /// [`std::process::Stdio::piped`] and not taken yet.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Takes the child's stdout, if it was configured as
    /// [`std::process::Stdio::piped`] and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Takes the child's stderr, if it was configured as
    /// [`std::process::Stdio::piped`] and not taken yet.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    fn nix_pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }
}

impl Drop for GuardedChild {
    fn drop(&mut self) {
        // Never panics: `kill` ignores signal and wait errors.
        let _ = self.kill();
    }
}

/// Whether a process with this pid exists and has not terminated.
///
/// A zombie (terminated, not yet reaped — e.g. an orphan whose new parent
/// does not reap it) counts as not alive. Linux only: reads `/proc/<pid>/stat`.
pub fn process_alive(pid: u32) -> bool {
    !matches!(process_state(pid), None | Some('Z' | 'X'))
}

/// Waits up to `timeout` for [`process_alive`] to become false; returns
/// whether the process is gone.
pub fn wait_process_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !process_alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...), or
/// `None` if there is no such process.
pub(crate) fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may contain spaces or ')': the state
    // is the first field after the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.trim_start().chars().next()
}
