//! Waiting for servers: [`poll_until`] (bounded polling), [`launch`] (spawn
//! a server and wait until its probe answers) and [`start_on_free_port`]
//! (retry on fresh ports while a server exits early).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::child::GuardedChild;
use crate::error::{Error, Result};
use crate::files::logs_tail;

/// How often readiness probes and other polling loops look again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `check` every [`POLL_INTERVAL`] until it returns `Ok` or `timeout`
/// has passed; then returns the last error. `check` runs at least once.
///
/// # Errors
///
/// The last error of `check`.
pub fn poll_until<T, E>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// What a [`launch`] starts: the server's name for errors, its port, how
/// long it has to become ready, and its log.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The server, e.g. `redis-server on port 41234`.
    pub server: &'a str,
    /// Its port.
    pub port: u16,
    /// How long it has to answer its probe.
    pub deadline: Duration,
    /// Its log files (log, stdout, stderr), whose tails the errors quote.
    pub logs: &'a [&'a Path],
}

/// Spawns `command` (stdio already redirected by the caller) as a guarded
/// child and polls `probe` until it returns `Ok`, the child exits, or the
/// deadline has passed. On failure the child is killed.
///
/// # Errors
///
/// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`], with the tail
/// of the log.
pub fn launch(
    command: Command,
    what: Launch<'_>,
    mut probe: impl FnMut(&GuardedChild) -> Result<(), String>,
) -> Result<GuardedChild> {
    let binary = Path::new(command.get_program()).to_owned();
    let mut child =
        GuardedChild::spawn(command).map_err(|source| Error::Spawn { binary, source })?;
    let deadline = Instant::now() + what.deadline;
    loop {
        if let Some(status) = child.try_wait() {
            return Err(Error::Exited {
                server: what.server.to_owned(),
                port: what.port,
                status,
                log: logs_tail(what.logs),
            });
        }
        let last = match probe(&child) {
            Ok(()) => {
                tracing::debug!(server = what.server, pid = child.pid(), "ready");
                return Ok(child);
            }
            Err(error) => error,
        };
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                server: what.server.to_owned(),
                port: what.port,
                waited: what.deadline,
                last,
                log: logs_tail(what.logs),
            });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Calls `launch` with a port from `pick_port` until a server stays up,
/// trying a fresh port whenever the server exits early (another process
/// took the port in the meantime), at most `attempts` times.
///
/// # Errors
///
/// The first error another port would not fix, or the last
/// [`Error::Exited`].
pub fn start_on_free_port(
    attempts: u32,
    mut pick_port: impl FnMut() -> Result<u16>,
    mut launch: impl FnMut(u16) -> Result<GuardedChild>,
) -> Result<(u16, GuardedChild)> {
    let mut attempt = 1;
    loop {
        let port = pick_port()?;
        match launch(port) {
            Ok(child) => return Ok((port, child)),
            Err(error @ Error::Exited { .. }) if attempt < attempts => {
                tracing::debug!(%error, attempt, "exited early; trying another port");
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Calls `launch` until it succeeds, sleeping `50 ms × attempt` after each
/// early exit (the port of a killed server may take a moment to be free
/// again), at most `attempts` times.
///
/// # Errors
///
/// The first error a retry would not fix, or the last [`Error::Exited`].
pub fn retry_exited<T>(attempts: u32, mut launch: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 1;
    loop {
        match launch() {
            Err(error @ Error::Exited { .. }) if attempt < attempts => {
                tracing::debug!(%error, attempt, "exited early; trying again");
                std::thread::sleep(Duration::from_millis(50) * attempt);
                attempt += 1;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_until_returns_the_last_error_after_the_deadline() {
        let mut calls = 0;
        let result: Result<(), String> = poll_until(Duration::from_millis(50), || {
            calls += 1;
            Err(format!("attempt {calls}"))
        });
        assert_eq!(result, Err(format!("attempt {calls}")));
        assert!(calls >= 2);
        assert_eq!(poll_until(Duration::ZERO, || Ok::<_, String>(7)), Ok(7));
    }
}
