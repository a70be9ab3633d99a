//! A process driven line by line over stdin/stdout: [`Worker`].
//!
//! The tests of `fencelock` run a lock holder in a process of its own (their
//! test binary re-run as a worker entry point, which documents the line
//! protocol), so a test can freeze the holder — renewal task included — with
//! SIGSTOP ([`Worker::stop`]) and wake it with SIGCONT ([`Worker::cont`]).
//! This module knows nothing of that protocol: it starts the process, skips
//! what it prints before its `ready` line (a re-run test binary prints a
//! line or two of its own first), and then trades one line for one line.
//!
//! ```no_run
//! use std::process::Command;
//! use fencelock_testkit::Worker;
//!
//! let mut worker = Worker::start(Command::new("my-worker"));
//! assert_eq!(worker.send("ping"), "pong");
//! worker.stop(); // frozen: it answers nothing until `cont`
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::process::{GuardedChild, spawn_guarded};

/// How long [`Worker::send`] waits for a reply line.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running worker process: stdin and stdout piped, stderr to a temporary
/// file (shown when a reply times out). Killed when dropped.
#[derive(Debug)]
pub struct Worker {
    child: GuardedChild,
    stdin: ChildStdin,
    replies: mpsc::Receiver<String>,
    stderr: File,
}

impl Worker {
    /// Starts `command` (its stdin, stdout and stderr are set here) and
    /// waits for its `ready` line, skipping any line before it.
    ///
    /// # Panics
    ///
    /// Panics if the process cannot be started, or if it does not print
    /// `ready` within [`REPLY_TIMEOUT`] (with its stderr in the message).
    pub fn start(mut command: Command) -> Worker {
        let stderr = tempfile::tempfile().expect("failed to create a file for the worker's stderr");
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(
            stderr
                .try_clone()
                .expect("failed to duplicate the worker's stderr file"),
        );
        let mut child = spawn_guarded(command);
        let stdin = child.take_stdin().expect("the worker's stdin was piped");
        let stdout = child.take_stdout().expect("the worker's stdout was piped");
        let (tx, replies) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("worker-{}-stdout", child.pid()))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .expect("failed to start the worker's stdout reader thread");
        let mut worker = Worker {
            child,
            stdin,
            replies,
            stderr,
        };
        let started = std::time::Instant::now();
        loop {
            let left = REPLY_TIMEOUT.saturating_sub(started.elapsed());
            if worker.recv(left, "the `ready` line") == "ready" {
                break;
            }
        }
        worker
    }

    /// Sends one command line and returns the reply line (without the
    /// newline), waiting up to [`REPLY_TIMEOUT`].
    ///
    /// # Panics
    ///
    /// Panics with the command, the worker's state and its stderr if no reply
    /// arrives in time (for example, the worker is frozen) or it exited.
    pub fn send(&mut self, line: &str) -> String {
        self.send_timeout(line, REPLY_TIMEOUT)
    }

    /// Like [`Worker::send`] with an explicit reply timeout (for commands
    /// that wait, such as `acquire` with a wait or `wait-lost`).
    ///
    /// # Panics
    ///
    /// As [`Worker::send`].
    pub fn send_timeout(&mut self, line: &str, timeout: Duration) -> String {
        self.post(line);
        self.recv(timeout, &format!("the reply to {line:?}"))
    }

    /// Sends one command line without waiting for its reply, for a command
    /// that blocks (such as an `acquire` that waits) while the test does
    /// something else; read the reply later with [`Worker::reply`], or never
    /// (e.g. when the worker is killed while it waits).
    ///
    /// # Panics
    ///
    /// Panics if the line cannot be written (the worker exited).
    pub fn post(&mut self, line: &str) {
        let sent = writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush());
        if let Err(error) = sent {
            panic!(
                "failed to send {line:?} to worker (pid {}): {error}{}",
                self.pid(),
                self.stderr_report()
            );
        }
    }

    /// Waits up to `timeout` for the next reply line (to a command sent with
    /// [`Worker::post`]).
    ///
    /// # Panics
    ///
    /// As [`Worker::send`].
    pub fn reply(&mut self, timeout: Duration) -> String {
        self.recv(timeout, "the reply to a posted command")
    }

    /// Kills the worker with SIGKILL (no release, no leaving a wait queue)
    /// and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The worker process, for signals.
    pub fn child(&self) -> &GuardedChild {
        &self.child
    }

    /// Freezes the worker with SIGSTOP (its renewal task too) and returns
    /// once the kernel reports it stopped.
    pub fn stop(&self) {
        self.child.stop();
    }

    /// Resumes a worker frozen by [`Worker::stop`] (SIGCONT).
    pub fn cont(&self) {
        self.child.cont();
    }

    fn recv(&mut self, timeout: Duration, what: &str) -> String {
        match self.replies.recv_timeout(timeout) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "worker (pid {}, state {}) sent no line within {timeout:?}: waited for {what}{}",
                self.pid(),
                crate::process::process_state(self.pid())
                    .map_or_else(|| "gone".to_owned(), String::from),
                self.stderr_report()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait_timeout(Duration::from_secs(1));
                panic!(
                    "worker (pid {}) closed its stdout (exit status {status:?}) while the test waited for {what}{}",
                    self.pid(),
                    self.stderr_report()
                )
            }
        }
    }

    fn stderr_report(&mut self) -> String {
        let mut text = String::new();
        let _ = self.stderr.seek(SeekFrom::Start(0));
        let _ = self.stderr.read_to_string(&mut text);
        if text.trim().is_empty() {
            String::new()
        } else {
            format!("\n--- worker stderr ---\n{}", text.trim_end())
        }
    }
}
