//! One redis-server process (data node or sentinel): [`RedisServer`], on a
//! free loopback port in its own temporary directory, configured by
//! [`RedisConfig`]. It can be frozen ([`RedisServer::pause`]), killed
//! ([`RedisServer::kill`]), have its data wiped
//! ([`RedisServer::wipe_data`]) and be started again on the same port and
//! directory ([`RedisServer::restart`], [`RedisServer::start_again`]).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::Value;
use tempfile::TempDir;

use crate::binary::REDIS_SERVER;
use crate::child::GuardedChild;
use crate::error::{Error, Result};
use crate::files::{append_file, last_line, read_lossy, temp_dir, write_lines};
use crate::port::{free_cluster_port, free_port};
use crate::probe::RedisTarget;
use crate::redis_admin::{probe, query, server_url};
use crate::redis_config::{DebugCommand, RedisConfig, RedisRole};
use crate::tls::{TLS_DIR, TlsPaths};
use crate::wait::{Launch, launch, retry_exited, start_on_free_port};

/// The server's log, in its directory.
pub const LOG_FILE: &str = "redis.log";
/// Its stdout.
pub const STDOUT_FILE: &str = "redis.stdout";
/// Its stderr.
pub const STDERR_FILE: &str = "redis.stderr";
/// What a restart without data keeps: the logs, and the configuration
/// (roles, cluster membership, TLS files), which is no data.
const KEPT: [&str; 7] = [
    LOG_FILE,
    STDOUT_FILE,
    STDERR_FILE,
    "redis.conf",
    "sentinel.conf",
    "nodes.conf",
    TLS_DIR,
];

/// How long a freshly spawned server has to become ready.
pub const READY_DEADLINE: Duration = Duration::from_secs(10);
/// How many fresh ports [`RedisServer::start`] tries.
const START_ATTEMPTS: u32 = 5;
/// How many times [`RedisServer::start_again`] tries the same port.
const RESTART_ATTEMPTS: u32 = 10;

/// A redis-server child process on `127.0.0.1`, in its own temporary
/// directory. Dropping it kills the process (SIGCONT, SIGKILL, wait) and
/// removes the directory; the kernel kills it if this process dies first.
#[derive(Debug)]
pub struct RedisServer {
    /// The current (or last, if killed) process. Dropped before `dir`.
    child: GuardedChild,
    port: u16,
    config: RedisConfig,
    bin: PathBuf,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server with `config` on a free port and waits (up to 10 s)
    /// until it is ready. If it exits early (its port was taken in the
    /// meantime), tries a new port, up to 5 times.
    ///
    /// # Errors
    ///
    /// [`Error::MissingBinary`] if redis-server cannot be found (see
    /// [`crate::binary::REDIS_SERVER`]), [`Error::File`] for its directory,
    /// [`Error::Exited`] or [`Error::NotReady`] with its log.
    pub fn start(config: RedisConfig) -> Result<RedisServer> {
        let bin = REDIS_SERVER.locate()?;
        let dir = temp_dir(&config.dir_prefix, config.dir_in.as_deref())?;
        write_lines(
            &dir.path().join(config.role.conf_file()),
            &config.conf_lines,
        )?;
        if let Some(tls) = &config.tls {
            tls.write(dir.path())?;
        }
        let pick = if config.cluster_bus {
            free_cluster_port
        } else {
            free_port
        };
        let (port, child) = start_on_free_port(START_ATTEMPTS, pick, |port| {
            spawn(&bin, &config, port, dir.path(), &[])
        })?;
        tracing::debug!(port, pid = child.pid(), role = ?config.role, "redis-server started");
        Ok(RedisServer {
            child,
            port,
            config,
            bin,
            dir,
        })
    }

    /// The TCP port the server listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://[:PASSWORD@]127.0.0.1:PORT/` (`rediss://` on TLS).
    pub fn url(&self) -> String {
        let scheme = if self.config.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        server_url(scheme, self.port, self.config.password.as_deref(), false)
    }

    /// The process id of the current process (after
    /// [`RedisServer::kill`], of the killed one).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The configuration the server was started with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The server's directory (data files, config file, log, TLS files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its TLS files, for a TLS server.
    pub fn tls_paths(&self) -> Option<TlsPaths> {
        self.config
            .tls
            .as_ref()
            .map(|_| TlsPaths::in_dir(self.dir.path()))
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// The contents of its log (empty if there is none yet).
    pub fn log(&self) -> String {
        read_lossy(&self.log_path())
    }

    /// The last line of its log.
    pub fn last_log_line(&self) -> String {
        last_line(&self.log_path())
    }

    /// Whether the process has not exited (a paused server is running).
    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// Whether the kernel reports the process as stopped (paused).
    pub fn is_paused(&self) -> bool {
        self.child.is_stopped()
    }

    /// Freezes the server with SIGSTOP: it keeps its port and connections
    /// but answers nothing until [`RedisServer::resume`]. Returns once the
    /// kernel reports it stopped. Does nothing if it was killed.
    ///
    /// # Errors
    ///
    /// [`Error::NotStopped`] if it does not stop within 5 s.
    pub fn pause(&self) -> Result<()> {
        self.child.stop()
    }

    /// Resumes a server frozen by [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.child.cont();
    }

    /// Kills the server with SIGKILL (no shutdown, no final fsync) and
    /// reaps it. Idempotent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Kills the server if it runs, then starts it again on the same port
    /// and directory with the same configuration
    /// ([`RedisServer::start_again`] without extra arguments).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start_again`].
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.start_again(&[])
    }

    /// Starts the server again after [`RedisServer::kill`], on its port and
    /// directory, with `extra` arguments for this start only (`--replicaof
    /// HOST PORT`), and waits until it is ready; retries while it exits
    /// early (the port may take a moment to be free), up to 10 times.
    ///
    /// # Errors
    ///
    /// The last [`Error::Exited`], or [`Error::NotReady`], with its log.
    pub fn start_again(&mut self, extra: &[String]) -> Result<()> {
        self.kill();
        let child = retry_exited(RESTART_ATTEMPTS, || {
            spawn(&self.bin, &self.config, self.port, self.dir.path(), extra)
        })?;
        tracing::debug!(
            port = self.port,
            pid = child.pid(),
            "redis-server started again"
        );
        self.child = child;
        Ok(())
    }

    /// Removes the server's data (every file of its directory but the logs
    /// and the configuration: config file, `nodes.conf`, TLS files), as a
    /// server without persistence comes back. Call it while it is killed.
    ///
    /// # Errors
    ///
    /// [`Error::File`] if the directory cannot be read.
    pub fn wipe_data(&self) -> Result<()> {
        let entries = std::fs::read_dir(self.dir.path()).map_err(|source| Error::File {
            path: self.dir.path().to_owned(),
            source,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if KEPT.iter().any(|kept| name == *kept) {
                continue;
            }
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
        Ok(())
    }

    /// Runs one command on a fresh plain connection (with the password)
    /// bounded by `timeout`, the reply converted to `T`. Not for TLS
    /// servers.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] naming the command and the server.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str], timeout: Duration) -> Result<T> {
        query(&self.plain_url(), args, timeout).map_err(|message| Error::Command {
            what: format!("redis-server on port {}", self.port),
            message,
        })
    }

    /// [`RedisServer::query`] returning the raw reply.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::query`].
    pub fn command(&self, args: &[&str], timeout: Duration) -> Result<Value> {
        self.query(args, timeout)
    }

    fn plain_url(&self) -> String {
        server_url("redis", self.port, self.config.password.as_deref(), false)
    }
}

/// Spawns one redis-server (or sentinel) on `port` in `dir` and waits until
/// it is ready.
fn spawn(
    bin: &Path,
    config: &RedisConfig,
    port: u16,
    dir: &Path,
    extra: &[String],
) -> Result<GuardedChild> {
    let mut command = Command::new(bin);
    command.arg(dir.join(config.role.conf_file()));
    if config.role == RedisRole::Sentinel {
        command.arg("--sentinel");
    }
    command.arg("--bind").arg("127.0.0.1");
    match &config.tls {
        Some(tls) => {
            let paths = TlsPaths::in_dir(dir);
            command
                .args(["--port", "0"])
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&paths.cert)
                .arg("--tls-key-file")
                .arg(&paths.key)
                .arg("--tls-ca-cert-file")
                .arg(&paths.ca)
                .arg("--tls-auth-clients")
                .arg(tls.client_auth.redis_arg());
        }
        None => {
            command.arg("--port").arg(port.to_string());
        }
    }
    command
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(LOG_FILE))
        .args(["--daemonize", "no"])
        .args(["--protected-mode", "no"]);
    if config.role == RedisRole::Data {
        match config.debug {
            DebugCommand::Default => {}
            DebugCommand::Local => {
                command.args(["--enable-debug-command", "local"]);
            }
            DebugCommand::Yes => {
                command.args(["--enable-debug-command", "yes"]);
            }
        }
        // Debian's default diskless-sync delay (5 s) would hold back every
        // replica that links to this server.
        command
            .args(["--repl-diskless-sync-delay", "0"])
            .args(config.persistence.args());
    }
    if let Some(password) = &config.password {
        command.arg("--requirepass").arg(password);
    }
    command
        .args(&config.args)
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(append_file(&dir.join(STDOUT_FILE))?)
        .stderr(append_file(&dir.join(STDERR_FILE))?)
        // Not in the caller's process group: a terminal's Ctrl-C is the
        // caller's to handle, and servers are stopped in order.
        .process_group(0);
    let what = match config.role {
        RedisRole::Data => format!("redis-server on port {port}"),
        RedisRole::Sentinel => format!("redis sentinel on port {port}"),
    };
    let plain = server_url("redis", port, config.password.as_deref(), false);
    let files = [
        dir.join(LOG_FILE),
        dir.join(STDOUT_FILE),
        dir.join(STDERR_FILE),
    ];
    let logs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let launch_of = Launch {
        server: &what,
        port,
        deadline: READY_DEADLINE,
        logs: &logs,
    };
    launch(command, launch_of, |child| {
        let target = RedisTarget {
            port,
            pid: child.pid(),
            dir: dir.to_owned(),
        };
        match &config.probe {
            Some(custom) => custom.check(&target),
            None => {
                let client = redis::Client::open(plain.as_str()).map_err(|e| e.to_string())?;
                probe(&client, target.pid)
            }
        }
    })
}
