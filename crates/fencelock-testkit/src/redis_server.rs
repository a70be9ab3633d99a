//! Real `redis-server` processes for tests: [`RedisServer`], configured by
//! [`RedisConfig`] and [`Persistence`].
//!
//! Each server listens on `127.0.0.1` on a free port, keeps its data, log and
//! stdout/stderr in its own temporary directory, and is killed when the
//! [`RedisServer`] is dropped or the test process dies (see
//! [`crate::process`]). It can be frozen ([`RedisServer::pause`]), killed
//! ([`RedisServer::kill`]) and restarted on the same port and directory
//! ([`RedisServer::restart`]) to inject faults.
//!
//! With [`RedisConfig::with_tls`] the server listens only on TLS, with
//! certificates generated for the test (see [`crate::tls`]).
//!
//! ```no_run
//! use fencelock_testkit::{Persistence, RedisConfig, RedisServer};
//!
//! let mut server = RedisServer::start_with(RedisConfig {
//!     persistence: Persistence::AofAlways,
//!     ..RedisConfig::default()
//! });
//! server.cmd(&["SET", "k", "v"]);
//! server.restart();
//! assert_eq!(server.query::<Option<String>>(&["GET", "k"]), Some("v".to_owned()));
//! ```

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisResult, Value};
use tempfile::TempDir;

use crate::process::GuardedChild;
pub use crate::server_process::PausedGuard;
use crate::server_process::{
    LaunchError, Pausable, StartFailure, append_file, find_on_path, is_executable,
    launch_until_ready, log_tail, read_lossy, start_on_free_port,
};
use crate::tls::{TestCerts, TlsConfig, TlsFiles, install_crypto_provider};
use crate::{free_cluster_port, free_port};

/// Environment variable that overrides the `redis-server` binary (a path, or
/// a name looked up on `PATH`).
pub const REDIS_SERVER_BIN_ENV: &str = "FENCELOCK_REDIS_SERVER_BIN";

/// Environment variable that overrides the `redis-cli` binary (used to
/// create clusters).
pub const REDIS_CLI_BIN_ENV: &str = "FENCELOCK_REDIS_CLI_BIN";

const NOT_FOUND_MESSAGE: &str = "redis-server not found on PATH: install it with `apt-get install -y redis-server` (or set FENCELOCK_REDIS_SERVER_BIN)";

/// How long a freshly spawned server has to answer `PING`.
const READY_DEADLINE: Duration = Duration::from_secs(10);
/// Per-attempt connect/read timeout of the readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Default timeout of [`RedisServer::cmd`] and [`RedisServer::try_cmd`].
const CMD_TIMEOUT: Duration = Duration::from_secs(2);
/// How many fresh ports [`RedisServer::start_with`] tries.
const START_ATTEMPTS: u32 = 5;
/// How many times [`RedisServer::restart`] retries the same port.
const RESTART_ATTEMPTS: u32 = 10;

const LOG_FILE: &str = "redis.log";
const CONF_FILE: &str = "redis.conf";
const SENTINEL_CONF_FILE: &str = "sentinel.conf";
const TLS_DIR: &str = "tls";
const STDOUT_FILE: &str = "redis.stdout";
const STDERR_FILE: &str = "redis.stderr";

/// What the server persists to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// Nothing: `--save "" --appendonly no`. A restart loses all data.
    #[default]
    None,
    /// Append-only file fsynced on every write:
    /// `--appendonly yes --appendfsync always`. A restart (even after
    /// SIGKILL) keeps every acknowledged write.
    AofAlways,
    /// Append-only file fsynced once per second:
    /// `--appendonly yes --appendfsync everysec`.
    AofEverySec,
}

impl Persistence {
    fn args(self) -> &'static [&'static str] {
        match self {
            Persistence::None => &["--save", "", "--appendonly", "no"],
            Persistence::AofAlways => &["--appendonly", "yes", "--appendfsync", "always"],
            Persistence::AofEverySec => &["--appendonly", "yes", "--appendfsync", "everysec"],
        }
    }
}

/// How to start a [`RedisServer`]. `RedisConfig::default()` is an
/// unauthenticated plaintext server without persistence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisConfig {
    /// Extra command-line arguments, appended after the testkit's own (so
    /// they override them), e.g. `["--maxmemory", "10mb"]`.
    pub extra_args: Vec<String>,
    /// What the server persists; see [`Persistence`].
    pub persistence: Persistence,
    /// If set, the server requires this password (`--requirepass`), and
    /// [`RedisServer::url`] includes it.
    pub password: Option<String>,
    /// Lines of the server's config file (`redis.conf` in its directory,
    /// given as the first argument), e.g. `"replicaof 127.0.0.1 7000"`.
    /// It is written once, before the first start; `CONFIG REWRITE` (which
    /// Sentinel also sends) updates it, and [`RedisServer::restart`] reads
    /// it again. Command-line settings — the testkit's own and
    /// [`RedisConfig::extra_args`] — override it, so put settings that the
    /// server may rewrite at run time (such as `replicaof`) here instead.
    pub conf_lines: Vec<String>,
    /// If set, the server listens only on TLS with these certificates (see
    /// [`TlsConfig`]); [`RedisServer::url`] is then `rediss://`.
    pub tls: Option<TlsConfig>,
}

impl RedisConfig {
    /// Sets [`RedisConfig::persistence`].
    pub fn with_persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Sets [`RedisConfig::password`].
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Appends one argument to [`RedisConfig::extra_args`].
    pub fn with_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Appends one line to [`RedisConfig::conf_lines`].
    pub fn with_conf_line(mut self, line: impl Into<String>) -> Self {
        self.conf_lines.push(line.into());
        self
    }

    /// Sets [`RedisConfig::tls`]: the server listens only on TLS.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// What a [`RedisServer`] process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A data node: `redis-server redis.conf …`.
    Server,
    /// A Sentinel: `redis-server sentinel.conf --sentinel …`.
    Sentinel,
}

/// How a [`RedisServer`] picks its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortPick {
    /// Any free port ([`free_port`]).
    Any,
    /// A free port whose cluster bus port (`port + 10000`) is free too.
    ClusterBus,
}

/// The less common ways to start a server, used by the topologies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch<'a> {
    pub(crate) kind: Kind,
    pub(crate) ports: PortPick,
    /// Where the server's temporary directory is made (else the system's
    /// temporary directory).
    pub(crate) parent_dir: Option<&'a Path>,
    /// The prefix of the directory's name.
    pub(crate) dir_prefix: &'a str,
}

impl Default for Launch<'_> {
    fn default() -> Self {
        Launch {
            kind: Kind::Server,
            ports: PortPick::Any,
            parent_dir: None,
            dir_prefix: "fencelock-redis-",
        }
    }
}

/// A `redis-server` child process on `127.0.0.1`, in its own temporary
/// directory. Dropping it kills the process (SIGCONT, SIGKILL, wait) and
/// removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    /// The current (or last, if killed) process. Dropped before `dir`.
    child: GuardedChild,
    port: u16,
    config: RedisConfig,
    kind: Kind,
    tls_files: Option<TlsFiles>,
    bin: PathBuf,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server with [`RedisConfig::default`] and waits until it
    /// answers `PING`.
    ///
    /// # Panics
    ///
    /// See [`RedisServer::start_with`].
    pub fn start() -> RedisServer {
        RedisServer::start_with(RedisConfig::default())
    }

    /// Starts a server with `config` on a free port and waits (up to 10 s)
    /// until it answers `PING`. If the server exits early (for example the
    /// port was taken in the meantime), retries on a new port, up to 5 times.
    ///
    /// # Panics
    ///
    /// Panics if `redis-server` cannot be found (see [`REDIS_SERVER_BIN_ENV`]),
    /// or the server does not become ready; the message includes its log.
    pub fn start_with(config: RedisConfig) -> RedisServer {
        RedisServer::start_launch(config, Launch::default())
    }

    /// [`RedisServer::start_with`], with the choices of [`Launch`].
    pub(crate) fn start_launch(config: RedisConfig, how: Launch<'_>) -> RedisServer {
        let bin = redis_server_bin();
        let builder = tempfile::Builder::new().prefix(how.dir_prefix).clone();
        let dir = match how.parent_dir {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .expect("failed to create a temporary directory for redis-server");
        let conf_name = match how.kind {
            Kind::Server => CONF_FILE,
            Kind::Sentinel => SENTINEL_CONF_FILE,
        };
        let mut conf = config.conf_lines.join("\n");
        conf.push('\n');
        let conf_path = dir.path().join(conf_name);
        std::fs::write(&conf_path, conf)
            .unwrap_or_else(|error| panic!("failed to write {}: {error}", conf_path.display()));
        let tls_files = config
            .tls
            .as_ref()
            .map(|tls| TlsFiles::write(&dir.path().join(TLS_DIR), tls));
        if tls_files.is_some() {
            install_crypto_provider();
        }
        let pick = match how.ports {
            PortPick::Any => free_port,
            PortPick::ClusterBus => free_cluster_port,
        };
        let started = start_on_free_port("redis-server", START_ATTEMPTS, pick, |port| {
            launch(
                &bin,
                &config,
                how.kind,
                tls_files.as_ref(),
                port,
                dir.path(),
            )
        });
        let headline = match started {
            Ok((port, child)) => {
                return RedisServer {
                    child,
                    port,
                    config,
                    kind: how.kind,
                    tls_files,
                    bin,
                    dir,
                };
            }
            Err(StartFailure::Fatal(port, error)) => describe(&error, &bin, port),
            Err(StartFailure::Exhausted(failures)) => {
                format!("redis-server failed to start {START_ATTEMPTS} times:\n{failures}")
            }
        };
        panic!("{}", failure_report(&headline, dir.path()))
    }

    /// A `redis://` URL on a free loopback port where nothing listens, for
    /// tests of an unreachable server.
    pub fn client_url_unreachable() -> String {
        format!("redis://127.0.0.1:{}/", free_port())
    }

    /// The TCP port the server listens on (stable across
    /// [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The URL for clients: `redis://127.0.0.1:PORT/`, or
    /// `redis://:PASSWORD@127.0.0.1:PORT/` (password percent-encoded) when a
    /// password is configured; `rediss://…` for a TLS server.
    pub fn url(&self) -> String {
        server_url(
            self.scheme(),
            self.port,
            self.config.password.as_deref(),
            false,
        )
    }

    /// Starts a plaintext replica of this server (`--replicaof`) and waits
    /// until its link is up.
    ///
    /// # Panics
    ///
    /// Panics if the replica cannot start or does not link within 10 s.
    pub fn start_replica(&self) -> RedisServer {
        let mut config = RedisConfig::default()
            .with_arg("--replicaof")
            .with_arg("127.0.0.1")
            .with_arg(self.port.to_string());
        if let Some(password) = &self.config.password {
            config = config.with_arg("--masterauth").with_arg(password.clone());
        }
        let replica = RedisServer::start_with(config);
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let info: String = replica.query(&["INFO", "replication"]);
            if info.contains("master_link_status:up") {
                return replica;
            }
            assert!(
                Instant::now() < give_up,
                "the replica of port {} never linked:\n{info}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server listens on TLS ([`RedisConfig::tls`]).
    pub fn is_tls(&self) -> bool {
        self.config.tls.is_some()
    }

    /// For a TLS server, the PEM files written into its directory: the CA to
    /// trust, the client certificate and key for mutual TLS, and more (see
    /// [`TlsFiles`]). `None` for a plaintext server.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls_files.as_ref()
    }

    /// For a TLS server, its certificates in memory (PEM), including the bad
    /// variants for negative tests. `None` for a plaintext server.
    pub fn tls_certs(&self) -> Option<&TestCerts> {
        self.config.tls.as_ref().map(|tls| &tls.certs)
    }

    /// A redis-rs client for [`RedisServer::url`]. For a TLS server it
    /// trusts [`TestCerts::ca`] (checking the server's certificate and name
    /// as any client would) and presents [`TestCerts::client`], so it works
    /// with every [`crate::ClientAuth`] setting.
    ///
    /// # Panics
    ///
    /// Panics if redis-rs rejects the URL or the certificates.
    pub fn client(&self) -> redis::Client {
        let result = match self.tls_certs() {
            Some(certs) => {
                install_crypto_provider();
                redis::Client::build_with_tls(
                    self.url(),
                    TestCerts::redis_tls(&certs.ca.cert_pem, Some(&certs.client)),
                )
            }
            None => redis::Client::open(self.url()),
        };
        result.unwrap_or_else(|error| panic!("redis client for {}: {error}", self.url()))
    }

    fn scheme(&self) -> &'static str {
        if self.is_tls() { "rediss" } else { "redis" }
    }

    /// The process id of the current server process (after
    /// [`RedisServer::kill`], of the killed one).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The configuration the server was started with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The server's working directory (data files, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The contents of the server's log file (empty if there is none yet).
    pub fn log(&self) -> String {
        read_lossy(&self.dir.path().join(LOG_FILE))
    }

    /// The last lines of the server's log, for panic messages.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join(LOG_FILE))
    }

    /// Whether the process is frozen by [`RedisServer::pause`] (the kernel
    /// reports it as stopped).
    pub fn is_paused(&self) -> bool {
        matches!(crate::process::process_state(self.pid()), Some('T' | 't'))
    }

    /// Whether the server process has not exited (a paused server is
    /// running).
    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// Freezes the server with SIGSTOP: it keeps its port and connections but
    /// answers nothing until [`RedisServer::resume`]. Returns once the kernel
    /// reports the process as stopped. Does nothing if it was killed.
    pub fn pause(&self) {
        self.child.stop();
    }

    /// Resumes a server frozen by [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.child.cont();
    }

    /// Pauses the server until the returned guard is dropped.
    pub fn pause_guard(&self) -> PausedGuard<'_> {
        PausedGuard::new(self)
    }

    /// Kills the server with SIGKILL (no shutdown, no final fsync) and reaps
    /// it. Idempotent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Kills the server if it is running (SIGKILL), then starts it again on
    /// the same port, in the same directory, with the same configuration, and
    /// waits until it answers `PING`. Data survives only as far as the
    /// [`Persistence`] mode saved it.
    ///
    /// # Panics
    ///
    /// Panics if the server cannot be started on the same port again (after a
    /// few retries) or does not become ready; the message includes its log.
    pub fn restart(&mut self) {
        self.kill();
        let mut failures = String::new();
        for attempt in 1..=RESTART_ATTEMPTS {
            match launch(
                &self.bin,
                &self.config,
                self.kind,
                self.tls_files.as_ref(),
                self.port,
                self.dir.path(),
            ) {
                Ok(child) => {
                    self.child = child;
                    return;
                }
                Err(LaunchError::Exited(status)) => {
                    let _ = writeln!(
                        failures,
                        "attempt {attempt}: redis-server exited early ({status})"
                    );
                    std::thread::sleep(Duration::from_millis(50) * attempt);
                }
                Err(error) => panic!(
                    "{}",
                    failure_report(&describe(&error, &self.bin, self.port), self.dir.path())
                ),
            }
        }
        panic!(
            "{}",
            failure_report(
                &format!(
                    "redis-server could not be restarted on port {} after {RESTART_ATTEMPTS} attempts:\n{failures}",
                    self.port
                ),
                self.dir.path()
            )
        )
    }

    /// Runs one command on a fresh synchronous connection (authenticated if
    /// needed) with a 2 s timeout, e.g. `server.cmd(&["SET", "k", "v"])`.
    ///
    /// # Panics
    ///
    /// Panics if the command fails (connection error, timeout, or an error
    /// reply); use [`RedisServer::try_cmd`] to inspect errors.
    pub fn cmd(&self, args: &[&str]) -> Value {
        self.try_cmd(args)
            .unwrap_or_else(|error| panic!("redis command {args:?} failed: {error}"))
    }

    /// Script calls (`EVALSHA` + `EVAL`) the server has executed, from
    /// `INFO commandstats`: each fencelock grant attempt, renewal, release
    /// and fenced write is one, so tests count round trips with it.
    pub fn script_calls(&self) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]);
        ["cmdstat_evalsha:", "cmdstat_eval:"]
            .iter()
            .map(|prefix| {
                info.lines()
                    .find_map(|l| l.strip_prefix(prefix))
                    .and_then(|rest| rest.strip_prefix("calls="))
                    .and_then(|rest| rest.split(',').next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Like [`RedisServer::cmd`], converting the reply, e.g.
    /// `server.query::<Option<String>>(&["GET", "k"])`.
    ///
    /// # Panics
    ///
    /// Panics if the command fails or the reply does not convert to `T`.
    pub fn query<T: FromRedisValue>(&self, args: &[&str]) -> T {
        let value = self.cmd(args);
        redis::from_redis_value(value).unwrap_or_else(|error| {
            panic!("redis command {args:?}: unexpected reply type: {error}")
        })
    }

    /// Runs one command with a 2 s timeout and returns the reply or the error
    /// (error replies such as `WRONGTYPE` are errors).
    pub fn try_cmd(&self, args: &[&str]) -> RedisResult<Value> {
        self.try_cmd_timeout(args, CMD_TIMEOUT)
    }

    /// Runs one command on a fresh connection; `timeout` bounds the connect
    /// and, separately, the request (so a paused server fails after about
    /// `timeout` instead of hanging).
    ///
    /// # Panics
    ///
    /// Panics if `args` is empty.
    pub fn try_cmd_timeout(&self, args: &[&str], timeout: Duration) -> RedisResult<Value> {
        let client = admin_client(
            self.port,
            &self.config,
            self.tls_certs().map(|certs| &certs.client),
        )?;
        run_cmd(&client, args, timeout)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGCONT + SIGKILL + wait; never panics. The directory is removed
        // afterwards, when `dir` is dropped.
        self.kill();
    }
}

impl Pausable for RedisServer {
    fn pause(&self) {
        RedisServer::pause(self);
    }

    fn resume(&self) {
        RedisServer::resume(self);
    }
}

/// A launch failure of the server on `port`, for a panic message.
fn describe(error: &LaunchError, bin: &Path, port: u16) -> String {
    match error {
        LaunchError::Spawn(error) if error.kind() == io::ErrorKind::NotFound => {
            format!("{NOT_FOUND_MESSAGE} [tried {}]", bin.display())
        }
        LaunchError::Spawn(error) => {
            format!("failed to spawn {}: {error}", bin.display())
        }
        LaunchError::Exited(status) => {
            format!("redis-server on port {port} exited early ({status})")
        }
        LaunchError::NotReady(last_error) => format!(
            "redis-server on port {port} did not answer PING within {READY_DEADLINE:?} (last error: {last_error})"
        ),
    }
}

/// Spawns one redis-server (or Sentinel) on `port` and waits until it
/// answers `PING`.
fn launch(
    bin: &Path,
    config: &RedisConfig,
    kind: Kind,
    tls: Option<&TlsFiles>,
    port: u16,
    dir: &Path,
) -> Result<GuardedChild, LaunchError> {
    let mut command = Command::new(bin);
    match kind {
        Kind::Server => command.arg(dir.join(CONF_FILE)),
        Kind::Sentinel => command.arg(dir.join(SENTINEL_CONF_FILE)).arg("--sentinel"),
    };
    command.arg("--bind").arg("127.0.0.1");
    match tls {
        Some(files) => {
            let client_auth = config.tls.as_ref().map(|tls| tls.client_auth);
            command
                .args(["--port", "0"])
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&files.server_cert)
                .arg("--tls-key-file")
                .arg(&files.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&files.ca_cert)
                .arg("--tls-auth-clients")
                .arg(client_auth.unwrap_or_default().arg());
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
    if kind == Kind::Server {
        command
            .args(["--enable-debug-command", "yes"])
            // Debian's default diskless-sync delay (5 s) would hold back
            // every replica that links to this server.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(config.persistence.args());
    }
    if let Some(password) = &config.password {
        command.arg("--requirepass").arg(password);
    }
    command
        .args(&config.extra_args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(append_file(&dir.join(STDOUT_FILE)))
        .stderr(append_file(&dir.join(STDERR_FILE)));

    let client_cert = config.tls.as_ref().map(|tls| &tls.certs.client);
    launch_until_ready(command, READY_DEADLINE, |child| {
        let client = admin_client(port, config, client_cert).map_err(|e| e.to_string())?;
        probe(&client, child.pid())
    })
}

/// The client of the testkit's own admin commands and readiness probe: the
/// server's URL, and for a TLS server one that presents the client
/// certificate but does not check the server's (so it also reaches a server
/// that presents a bad leaf on purpose).
fn admin_client(
    port: u16,
    config: &RedisConfig,
    client_cert: Option<&crate::tls::CertKey>,
) -> RedisResult<redis::Client> {
    match &config.tls {
        Some(tls) => {
            install_crypto_provider();
            let url = server_url("rediss", port, config.password.as_deref(), true);
            redis::Client::build_with_tls(
                url,
                TestCerts::redis_tls(&tls.certs.ca.cert_pem, client_cert),
            )
        }
        None => redis::Client::open(server_url("redis", port, config.password.as_deref(), false)),
    }
}

/// Checks that the server at `url` is the process `pid` (not another test's
/// server that took the port) and answers `PING` (not still loading).
fn probe(client: &redis::Client, pid: u32) -> Result<(), String> {
    let mut con = client
        .get_connection_with_timeout(PROBE_TIMEOUT)
        .map_err(|e| e.to_string())?;
    con.set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    con.set_write_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let info: redis::InfoDict = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .map_err(|e| e.to_string())?;
    let server_pid: Option<u32> = info.get("process_id");
    if server_pid != Some(pid) {
        return Err(format!(
            "the port is served by another process (process_id {server_pid:?}, expected {pid})"
        ));
    }
    redis::cmd("PING")
        .query::<String>(&mut con)
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn run_cmd(client: &redis::Client, args: &[&str], timeout: Duration) -> RedisResult<Value> {
    let (name, rest) = args
        .split_first()
        .expect("a redis command needs at least its name");
    let mut con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    let mut cmd = redis::cmd(name);
    for arg in rest {
        cmd.arg(*arg);
    }
    cmd.query(&mut con)
}

/// `SCHEME://[:PASSWORD@]127.0.0.1:PORT/`, with `#insecure` (no check of
/// the server's certificate) if `insecure`.
fn server_url(scheme: &str, port: u16, password: Option<&str>, insecure: bool) -> String {
    let auth = match password {
        Some(password) => format!(":{}@", percent_encode_userinfo(password)),
        None => String::new(),
    };
    let fragment = if insecure { "#insecure" } else { "" };
    format!("{scheme}://{auth}127.0.0.1:{port}/{fragment}")
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// `headline`, followed by the server's log, stdout and stderr.
fn failure_report(headline: &str, dir: &Path) -> String {
    crate::server_process::failure_report(headline, dir, &[LOG_FILE, STDOUT_FILE, STDERR_FILE])
}

/// The `redis-server` binary: [`REDIS_SERVER_BIN_ENV`] if set, else
/// `redis-server` on `PATH`.
fn redis_server_bin() -> PathBuf {
    resolve_bin(
        std::env::var_os(REDIS_SERVER_BIN_ENV),
        std::env::var_os("PATH"),
    )
}

/// The `redis-cli` binary: [`REDIS_CLI_BIN_ENV`] if set, else `redis-cli`
/// next to the `redis-server` in use, else on `PATH`.
pub(crate) fn redis_cli_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os(REDIS_CLI_BIN_ENV).filter(|bin| !bin.is_empty()) {
        return PathBuf::from(bin);
    }
    let beside_server = redis_server_bin().with_file_name("redis-cli");
    if is_executable(&beside_server) {
        return beside_server;
    }
    find_on_path(Path::new("redis-cli"), std::env::var_os("PATH").as_deref()).unwrap_or_else(|| {
        panic!("redis-cli not found on PATH: install it with `apt-get install -y redis-tools` (or set {REDIS_CLI_BIN_ENV})")
    })
}

fn resolve_bin(overridden: Option<OsString>, path: Option<OsString>) -> PathBuf {
    match overridden.filter(|bin| !bin.is_empty()) {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            if bin.components().count() > 1 {
                assert!(
                    is_executable(&bin),
                    "{REDIS_SERVER_BIN_ENV}={} is not an executable file",
                    bin.display()
                );
                bin
            } else {
                find_on_path(&bin, path.as_deref()).unwrap_or_else(|| {
                    panic!(
                        "{REDIS_SERVER_BIN_ENV}={} was not found on PATH",
                        bin.display()
                    )
                })
            }
        }
        None => find_on_path(Path::new("redis-server"), path.as_deref())
            .unwrap_or_else(|| panic!("{NOT_FOUND_MESSAGE}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(
        expected = "redis-server not found on PATH: install it with `apt-get install -y redis-server` (or set FENCELOCK_REDIS_SERVER_BIN)"
    )]
    fn missing_binary_panics_with_install_hint() {
        let empty = tempfile::tempdir().expect("tempdir");
        resolve_bin(None, Some(empty.path().as_os_str().to_owned()));
    }

    #[test]
    #[should_panic(expected = "is not an executable file")]
    fn override_to_missing_path_panics() {
        resolve_bin(Some("/nonexistent/redis-server".into()), None);
    }

    #[test]
    fn override_path_is_used() {
        assert_eq!(
            resolve_bin(Some("/bin/sh".into()), None),
            PathBuf::from("/bin/sh")
        );
    }

    #[test]
    fn url_encodes_password() {
        assert_eq!(
            server_url("redis", 7000, None, false),
            "redis://127.0.0.1:7000/"
        );
        assert_eq!(
            server_url("redis", 7000, Some("p@ss:w/rd"), false),
            "redis://:p%40ss%3Aw%2Frd@127.0.0.1:7000/"
        );
        assert_eq!(
            server_url("rediss", 7000, None, true),
            "rediss://127.0.0.1:7000/#insecure"
        );
    }
}
