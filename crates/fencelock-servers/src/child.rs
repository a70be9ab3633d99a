//! Orphan-safe child processes: [`GuardedChild`], and what `/proc` says of
//! a process ([`process_alive`], [`process_state`], [`children_of`]).
//!
//! Children are forked from the crate's single long-lived spawner thread
//! with `PR_SET_PDEATHSIG = SIGKILL`, so they die with this process even
//! when it is killed with SIGKILL, and [`GuardedChild`]'s `Drop` kills and
//! reaps them on the normal path.

use std::fmt;
use std::io;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::spawner;

/// How often polling loops in this module look again.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// How long [`GuardedChild::stop`] waits for the kernel to report the child
/// as stopped.
pub const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// A child process that is killed and reaped when dropped, and killed by the
/// kernel if this process dies first.
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
    /// Spawns `command` as an orphan-safe child process. Its stdio is used
    /// as configured (the default inherits this process's).
    ///
    /// # Errors
    ///
    /// The spawn error (for example, the program does not exist).
    pub fn spawn(command: Command) -> io::Result<GuardedChild> {
        let program = command.get_program().to_string_lossy().into_owned();
        let child = spawner::spawn(command)?;
        Ok(GuardedChild {
            child,
            status: None,
            program,
        })
    }

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
            let _ = signal::kill(nix_pid(self.pid()), signal);
        }
    }

    /// Freezes the child with SIGSTOP and returns once the kernel reports it
    /// as stopped (or it is dead).
    ///
    /// # Errors
    ///
    /// [`Error::NotStopped`] if it is still not stopped after
    /// [`STOP_DEADLINE`].
    pub fn stop(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP);
        if self.status.is_some() {
            return Ok(());
        }
        wait_stopped(self.pid(), &self.program)
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

    /// The exit status if the child has exited, without reaping it (so it
    /// works through a shared reference).
    pub fn peek_status(&self) -> Option<ExitStatus> {
        use std::os::unix::process::ExitStatusExt as _;
        if self.status.is_some() {
            return self.status;
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(nix_pid(self.pid())), flags) {
            Ok(WaitStatus::Exited(_, code)) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
            Ok(WaitStatus::Signaled(_, signal, _)) => Some(ExitStatus::from_raw(signal as i32)),
            _ => None,
        }
    }

    /// Whether the child has not exited yet (a stopped child is running).
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Whether the kernel reports the child as stopped (SIGSTOP).
    pub fn is_stopped(&self) -> bool {
        self.status.is_none() && matches!(process_state(self.pid()), Some('T' | 't'))
    }

    /// Takes the child's stdin, if it was piped and not taken yet.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Takes the child's stdout, if it was piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Takes the child's stderr, if it was piped and not taken yet.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }
}

impl Drop for GuardedChild {
    fn drop(&mut self) {
        // Never panics: `kill` ignores signal and wait errors.
        let _ = self.kill();
    }
}

/// Waits until the kernel reports process `pid` as stopped or gone.
///
/// # Errors
///
/// [`Error::NotStopped`] (naming `program`) after [`STOP_DEADLINE`].
pub fn wait_stopped(pid: u32, program: &str) -> Result<()> {
    let deadline = Instant::now() + STOP_DEADLINE;
    loop {
        match process_state(pid) {
            // Stopped, traced, or dead: nothing left to wait for.
            None | Some('T' | 't' | 'Z' | 'X') => return Ok(()),
            Some(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(Error::NotStopped {
                program: program.to_owned(),
                pid,
                waited: STOP_DEADLINE,
            });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Whether a process with this pid exists and has not terminated.
///
/// A zombie (terminated, not yet reaped) counts as not alive. Linux only:
/// reads `/proc/<pid>/stat`.
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
pub fn process_state(pid: u32) -> Option<char> {
    stat_fields(pid)?.chars().next()
}

/// Every live process whose parent is `parent` (read from `/proc`).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// The parent pid from `/proc/<pid>/stat` (the field after the state).
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.split_whitespace().nth(1)?.parse().ok()
}

/// The fields of `/proc/<pid>/stat` after the command name. The name in
/// parentheses may contain spaces or ')': the fields start after the last
/// ')'.
fn stat_fields(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    Some(after_name.trim_start().to_owned())
}

/// `pid` as nix's [`Pid`].
pub fn nix_pid(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_of_self_is_our_parent() {
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
        assert!(process_alive(std::process::id()));
    }
}
