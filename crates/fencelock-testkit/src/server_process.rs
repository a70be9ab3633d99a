//! What every server type of the testkit shares: launching a server process
//! and waiting until it is ready (`launch_until_ready`, `LaunchError`),
//! retrying on fresh ports, pausing it for a scope ([`PausedGuard`] over
//! [`Pausable`]), bounded polling (`poll_until`), and reading its log files
//! for panic messages (`failure_report`, `log_tail`).
//!
//! Only [`Pausable`] and [`PausedGuard`] are public: every server type
//! ([`crate::RedisServer`], [`crate::PgServer`]) hands out a
//! `PausedGuard` from its `pause_guard` method.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::process::{GuardedChild, try_spawn_guarded};

/// How often readiness probes and other polling loops look again.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How many lines of a log [`log_tail`] keeps for a panic message.
pub(crate) const TAIL_LINES: usize = 40;

/// A server that can be frozen and resumed in place (SIGSTOP/SIGCONT), so
/// that [`PausedGuard`] can resume it when the guard goes out of scope.
pub trait Pausable {
    /// Freezes the server; returns once it is stopped.
    fn pause(&self);
    /// Resumes a server frozen by [`Pausable::pause`].
    fn resume(&self);
}

/// Keeps a server paused (SIGSTOP) until dropped, then resumes it.
/// Created by [`crate::RedisServer::pause_guard`] (the default type
/// parameter) and [`crate::PgServer::pause_guard`].
#[derive(Debug)]
#[must_use = "the server is resumed as soon as the guard is dropped"]
pub struct PausedGuard<'a, S: Pausable + ?Sized = crate::RedisServer> {
    server: &'a S,
}

impl<'a, S: Pausable + ?Sized> PausedGuard<'a, S> {
    /// Pauses `server` and returns the guard that resumes it.
    pub fn new(server: &'a S) -> Self {
        server.pause();
        PausedGuard { server }
    }
}

impl<S: Pausable + ?Sized> Drop for PausedGuard<'_, S> {
    fn drop(&mut self) {
        self.server.resume();
    }
}

/// Why [`launch_until_ready`] failed.
#[derive(Debug)]
pub(crate) enum LaunchError {
    /// The program could not be spawned.
    Spawn(io::Error),
    /// The server exited before it was ready (e.g. its port was taken).
    Exited(ExitStatus),
    /// The server is still running but was not ready within the deadline;
    /// the last probe error.
    NotReady(String),
}

/// Spawns `command` (stdio already redirected to files by the caller) as a
/// guarded child and polls `probe` until it returns `Ok`, the child exits,
/// or `deadline` has passed. On failure the child is killed (on drop).
pub(crate) fn launch_until_ready(
    command: Command,
    deadline: Duration,
    mut probe: impl FnMut(&GuardedChild) -> Result<(), String>,
) -> Result<GuardedChild, LaunchError> {
    let mut child = try_spawn_guarded(command).map_err(LaunchError::Spawn)?;
    let deadline = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait() {
            return Err(LaunchError::Exited(status));
        }
        let last_error = match probe(&child) {
            Ok(()) => return Ok(child),
            Err(error) => error,
        };
        if Instant::now() >= deadline {
            return Err(LaunchError::NotReady(last_error));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Why [`start_on_free_port`] gave up.
#[derive(Debug)]
pub(crate) enum StartFailure {
    /// A failure that another port would not fix, on this port.
    Fatal(u16, LaunchError),
    /// Every attempt exited early; one line per attempt.
    Exhausted(String),
}

/// Calls `launch` with a port from `pick_port` until a server stays up,
/// trying a fresh port whenever the server exits early (another process took
/// the port in the meantime), at most `attempts` times.
pub(crate) fn start_on_free_port(
    what: &str,
    attempts: u32,
    mut pick_port: impl FnMut() -> u16,
    mut launch: impl FnMut(u16) -> Result<GuardedChild, LaunchError>,
) -> Result<(u16, GuardedChild), StartFailure> {
    let mut failures = String::new();
    for attempt in 1..=attempts {
        let port = pick_port();
        match launch(port) {
            Ok(child) => return Ok((port, child)),
            Err(LaunchError::Exited(status)) => {
                let _ = writeln!(
                    failures,
                    "attempt {attempt}: {what} on port {port} exited early ({status})"
                );
            }
            Err(error) => return Err(StartFailure::Fatal(port, error)),
        }
    }
    Err(StartFailure::Exhausted(failures))
}

/// Polls `check` every [`POLL_INTERVAL`] until it returns `Ok` or `timeout`
/// has passed; then returns the last error. `check` runs at least once.
pub(crate) fn poll_until<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// Runs `command` to completion, at most `timeout` (then kills it), and
/// returns its stdout, or an error with its exit status and stderr.
pub(crate) fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<String, String> {
    use std::io::{Read as _, Seek as _};

    let program = command.get_program().to_string_lossy().into_owned();
    let mut out = tempfile::tempfile().map_err(|e| e.to_string())?;
    let mut err = tempfile::tempfile().map_err(|e| e.to_string())?;
    command
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err.try_clone().map_err(|e| e.to_string())?);
    let mut child = try_spawn_guarded(command).map_err(|e| format!("spawn {program}: {e}"))?;
    let status = child.wait_timeout(timeout);
    let read = |file: &mut File| {
        let mut text = String::new();
        let _ = file.seek(io::SeekFrom::Start(0));
        let _ = file.read_to_string(&mut text);
        text
    };
    let (stdout, stderr) = (read(&mut out), read(&mut err));
    match status {
        Some(status) if status.success() => Ok(stdout),
        Some(status) => Err(format!(
            "{program} failed ({status}): {}{}",
            stdout.trim(),
            stderr.trim()
        )),
        None => Err(format!(
            "{program} did not finish within {timeout:?} (killed); output so far: {}{}",
            stdout.trim(),
            stderr.trim()
        )),
    }
}

/// Opens `path` for appending, creating it (for a child's stdout/stderr).
///
/// # Panics
///
/// Panics if the file cannot be opened.
pub(crate) fn append_file(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|error| panic!("failed to open {}: {error}", path.display()))
}

/// The contents of `path` (invalid UTF-8 replaced), or `""` if unreadable.
pub(crate) fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> &str {
    let trimmed = text.trim_end();
    let mut start = trimmed.len();
    for _ in 0..lines {
        match trimmed[..start].rfind('\n') {
            Some(newline) => start = newline,
            None => return trimmed,
        }
    }
    trimmed[start..].trim_start_matches('\n')
}

/// The last [`TAIL_LINES`] lines of the file at `path` (empty if unreadable).
pub(crate) fn log_tail(path: &Path) -> String {
    tail(&read_lossy(path), TAIL_LINES).to_owned()
}

/// `headline`, followed by the named files of `dir` that are not empty.
pub(crate) fn failure_report(headline: &str, dir: &Path, files: &[&str]) -> String {
    let mut report = headline.trim_end().to_owned();
    for name in files {
        let contents = read_lossy(&dir.join(name));
        if !contents.trim().is_empty() {
            let _ = write!(report, "\n--- {name} ---\n{}", contents.trim_end());
        }
    }
    report
}

/// The first executable `name` in the directories of `path` (a `PATH`-style
/// list).
pub(crate) fn find_on_path(name: &Path, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a\nb\nc", 5), "a\nb\nc");
        assert_eq!(tail("", 3), "");
        assert_eq!(tail("only\n\n", 1), "only");
    }

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
