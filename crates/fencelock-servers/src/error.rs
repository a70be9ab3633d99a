//! [`Error`]: why a server could not be started, stopped or set up, naming
//! the one thing that failed (a binary and the Debian package providing it,
//! a port, a server and the last line of its log, a command).

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// The result of every fallible step of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a step of starting, stopping or setting up a server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A server binary is neither named by its environment variable nor on
    /// `PATH`.
    #[error(
        "{binary} not found on PATH: install it with `apt-get install -y {package}` (or set {env})"
    )]
    MissingBinary {
        /// The program, e.g. `redis-server`.
        binary: &'static str,
        /// The Debian package that provides it, e.g. `redis-server`.
        package: &'static str,
        /// The environment variable that names another binary.
        env: &'static str,
    },
    /// The binary an environment variable names is not an executable file
    /// (nor a program found on `PATH`).
    #[error("{env}={} is not an executable file", path.display())]
    NotExecutable {
        /// The environment variable.
        env: &'static str,
        /// What it names.
        path: PathBuf,
    },
    /// A program could not be started (`fork`/`exec` failed).
    #[error("cannot start {}: {source}", binary.display())]
    Spawn {
        /// The program.
        binary: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A directory or file a server needs could not be made or written.
    #[error("cannot write {}: {source}", path.display())]
    File {
        /// The directory or file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// No free loopback port was found.
    #[error("no free loopback port: {reason}")]
    NoFreePort {
        /// What went wrong.
        reason: String,
    },
    /// A server exited before it was ready (its port taken, a bad
    /// setting, a missing library).
    #[error("{server} exited during start-up ({status}){}", last_line(log))]
    Exited {
        /// The server, e.g. `redis-server on port 41234`.
        server: String,
        /// Its port.
        port: u16,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log.
        log: String,
    },
    /// A server kept running but did not answer its readiness probe in
    /// time.
    #[error("{server} was not ready within {waited:?} ({last}){}", last_line(log))]
    NotReady {
        /// The server.
        server: String,
        /// Its port.
        port: u16,
        /// How long it was given.
        waited: Duration,
        /// The last probe's error.
        last: String,
        /// The last lines of its log.
        log: String,
    },
    /// A process did not stop (SIGSTOP) in time.
    #[error("{program} (pid {pid}) did not stop within {waited:?} of SIGSTOP")]
    NotStopped {
        /// The program.
        program: String,
        /// Its process id.
        pid: u32,
        /// How long it was given.
        waited: Duration,
    },
    /// A command sent to a running server failed.
    #[error("{what}: {message}")]
    Command {
        /// The command and where it went, e.g. `CLUSTER MEET on
        /// 127.0.0.1:41234`.
        what: String,
        /// The error.
        message: String,
    },
    /// A set-up (Sentinel, Cluster, etcd members) did not reach the state
    /// waited for in time.
    #[error("timed out after {waited:?} waiting for {what}: {last}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// The last check's error, with the log lines that explain it.
        last: String,
    },
    /// A set-up was asked for that cannot run (an even number of etcd
    /// members, a quorum larger than the sentinels, …).
    #[error("invalid set-up: {0}")]
    Config(String),
}

impl Error {
    /// The last lines of the failed server's log, when the error is about
    /// one server ([`Error::Exited`], [`Error::NotReady`]).
    pub fn log(&self) -> Option<&str> {
        match self {
            Error::Exited { log, .. } | Error::NotReady { log, .. } => Some(log),
            _ => None,
        }
    }

    /// The port of the failed server, when the error is about one.
    pub fn port(&self) -> Option<u16> {
        match self {
            Error::Exited { port, .. } | Error::NotReady { port, .. } => Some(*port),
            _ => None,
        }
    }

    /// Whether a server binary is missing or not executable: a
    /// configuration problem of the machine rather than a failure.
    pub fn is_missing_binary(&self) -> bool {
        matches!(
            self,
            Error::MissingBinary { .. } | Error::NotExecutable { .. }
        )
    }
}

/// `": LINE"` with the last non-empty line of `log`, or nothing.
fn last_line(log: &str) -> String {
    match log.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!(": {}", line.trim()),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_its_package() {
        let error = Error::MissingBinary {
            binary: "etcd",
            package: "etcd-server",
            env: "FENCELOCK_ETCD_BIN",
        };
        assert_eq!(
            error.to_string(),
            "etcd not found on PATH: install it with `apt-get install -y etcd-server` (or set FENCELOCK_ETCD_BIN)"
        );
        assert!(error.is_missing_binary());
    }

    #[test]
    fn last_line_skips_trailing_blank_lines() {
        assert_eq!(last_line("a\nb\n\n"), ": b");
        assert_eq!(last_line(""), "");
    }
}
