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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fencelock_servers::redis_admin::{probe, run_command, server_url};
use fencelock_servers::{DebugCommand, Probe, RedisRole, RedisTarget};
use redis::{FromRedisValue, RedisResult, Value};

use crate::server_process::{Pausable, PausedGuard, panic_message};
use crate::tls::{CertKey, TestCerts, TlsConfig, TlsFiles, install_crypto_provider};

pub use fencelock_servers::Persistence;

/// Environment variable that overrides the `redis-server` binary (a path, or
/// a name looked up on `PATH`).
pub const REDIS_SERVER_BIN_ENV: &str = fencelock_servers::REDIS_SERVER.env;

/// Environment variable that overrides the `redis-cli` binary (used by
/// [`crate::RedisCluster::cli`]).
pub const REDIS_CLI_BIN_ENV: &str = fencelock_servers::REDIS_CLI.env;

/// Default timeout of [`RedisServer::cmd`] and [`RedisServer::try_cmd`].
const CMD_TIMEOUT: Duration = Duration::from_secs(2);

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

/// A `redis-server` child process on `127.0.0.1`, in its own temporary
/// directory: a [`fencelock_servers::RedisServer`] with the testkit's
/// configuration, TLS certificates and admin commands. Dropping it kills the
/// process (SIGCONT, SIGKILL, wait) and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    inner: fencelock_servers::RedisServer,
    config: RedisConfig,
    tls_files: Option<TlsFiles>,
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
        if config.tls.is_some() {
            install_crypto_provider();
        }
        let inner = fencelock_servers::RedisServer::start(servers_config(&config))
            .unwrap_or_else(|error| panic!("{}", panic_message(&error)));
        let tls_files = config.tls.as_ref().map(|_| TlsFiles::in_dir(inner.dir()));
        RedisServer {
            inner,
            config,
            tls_files,
        }
    }

    /// A node a `fencelock-servers` set-up started (plain: Sentinel and
    /// Cluster nodes), with the configuration it was started with.
    pub(crate) fn from_inner(inner: fencelock_servers::RedisServer) -> RedisServer {
        let started = inner.config();
        let config = RedisConfig {
            extra_args: started.args.clone(),
            persistence: started.persistence,
            password: started.password.clone(),
            conf_lines: started.conf_lines.clone(),
            tls: None,
        };
        RedisServer {
            inner,
            config,
            tls_files: None,
        }
    }

    /// A `redis://` URL on a free loopback port where nothing listens, for
    /// tests of an unreachable server.
    pub fn client_url_unreachable() -> String {
        let port = fencelock_servers::free_port().unwrap_or_else(|error| panic!("{error}"));
        format!("redis://127.0.0.1:{port}/")
    }

    /// The TCP port the server listens on (stable across
    /// [`RedisServer::restart`]).
    pub fn port(&self) -> u16 {
        self.inner.port()
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        self.inner.addr()
    }

    /// The URL for clients: `redis://127.0.0.1:PORT/`, or
    /// `redis://:PASSWORD@127.0.0.1:PORT/` (password percent-encoded) when a
    /// password is configured; `rediss://…` for a TLS server.
    pub fn url(&self) -> String {
        self.inner.url()
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
            .with_arg(self.port().to_string());
        if let Some(password) = &self.config.password {
            config = config.with_arg("--masterauth").with_arg(password.clone());
        }
        let replica = RedisServer::start_with(config);
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            // The replica says its link is up once it loaded the snapshot,
            // but the primary holds back the command stream until the
            // replica's first acknowledgement, which can take up to a second:
            // a write's `WAIT` in between counts nothing. Linked means a
            // propagated message (`PUBLISH` reaches replicas and touches no
            // key) was acknowledged by every replica.
            let info: String = replica.query(&["INFO", "replication"]);
            if info.contains("master_link_status:up") {
                let primary_info: String = self.query(&["INFO", "replication"]);
                let online = format!("port={},state=online,", replica.port());
                let replicas = primary_info.matches(",state=online,").count();
                let _: i64 = self.query(&["PUBLISH", "fencelock-testkit:link", "probe"]);
                let acked: i64 = self.query(&["WAIT", &replicas.to_string(), "100"]);
                if primary_info.contains(&online)
                    && acked >= i64::try_from(replicas).unwrap_or(i64::MAX)
                {
                    return replica;
                }
            }
            assert!(
                Instant::now() < give_up,
                "the replica of port {} never linked:\n{info}",
                self.port()
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

    /// The process id of the current server process (after
    /// [`RedisServer::kill`], of the killed one).
    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// The configuration the server was started with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The server's working directory (data files, log).
    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    /// The contents of the server's log file (empty if there is none yet).
    pub fn log(&self) -> String {
        self.inner.log()
    }

    /// The last lines of the server's log, for panic messages.
    pub(crate) fn log_tail(&self) -> String {
        fencelock_servers::files::log_tail(&self.inner.log_path())
    }

    /// Whether the process is frozen by [`RedisServer::pause`] (the kernel
    /// reports it as stopped).
    pub fn is_paused(&self) -> bool {
        self.inner.is_paused()
    }

    /// Whether the server process has not exited (a paused server is
    /// running).
    pub fn is_running(&mut self) -> bool {
        self.inner.is_running()
    }

    /// Freezes the server with SIGSTOP: it keeps its port and connections but
    /// answers nothing until [`RedisServer::resume`]. Returns once the kernel
    /// reports the process as stopped. Does nothing if it was killed.
    ///
    /// # Panics
    ///
    /// Panics if it is still not stopped after 5 seconds.
    pub fn pause(&self) {
        if let Err(error) = self.inner.pause() {
            panic!("{error}");
        }
    }

    /// Resumes a server frozen by [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.inner.resume();
    }

    /// Pauses the server until the returned guard is dropped.
    pub fn pause_guard(&self) -> PausedGuard<'_, RedisServer> {
        PausedGuard::new(self)
    }

    /// Kills the server with SIGKILL (no shutdown, no final fsync) and reaps
    /// it. Idempotent.
    pub fn kill(&mut self) {
        self.inner.kill();
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
        if let Err(error) = self.inner.restart() {
            panic!(
                "redis-server could not be restarted: {}",
                panic_message(&error)
            );
        }
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
    /// # Errors
    ///
    /// The connection error, an error reply, or an empty `args`.
    pub fn try_cmd_timeout(&self, args: &[&str], timeout: Duration) -> RedisResult<Value> {
        let client = admin_client(
            self.port(),
            &self.config,
            self.tls_certs().map(|certs| &certs.client),
        )?;
        run_command(&client, args, timeout)
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

/// The `fencelock-servers` configuration of `config`: a data node with
/// `DEBUG` enabled, and for a TLS server the files of its certificates and
/// a probe that reaches it over TLS.
pub(crate) fn servers_config(config: &RedisConfig) -> fencelock_servers::RedisConfig {
    let probe = config.tls.as_ref().map(|tls| {
        let (config, client) = (config.clone(), tls.certs.client.clone());
        Probe::new(move |target: &RedisTarget| {
            let client =
                admin_client(target.port, &config, Some(&client)).map_err(|e| e.to_string())?;
            probe(&client, target.pid)
        })
    });
    fencelock_servers::RedisConfig {
        role: RedisRole::Data,
        persistence: config.persistence,
        debug: DebugCommand::Yes,
        password: config.password.clone(),
        conf_lines: config.conf_lines.clone(),
        args: config.extra_args.clone(),
        tls: config.tls.as_ref().map(TlsConfig::server_tls),
        probe,
        ..fencelock_servers::RedisConfig::default()
    }
}

/// The client of the testkit's own admin commands and readiness probe: the
/// server's URL, and for a TLS server one that presents the client
/// certificate but does not check the server's (so it also reaches a server
/// that presents a bad leaf on purpose).
fn admin_client(
    port: u16,
    config: &RedisConfig,
    client_cert: Option<&CertKey>,
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

/// The `redis-cli` binary: [`REDIS_CLI_BIN_ENV`] if set, else `redis-cli`
/// next to the `redis-server` in use, else on `PATH`.
///
/// # Panics
///
/// Panics if none is found.
pub(crate) fn redis_cli_bin() -> PathBuf {
    let server = fencelock_servers::REDIS_SERVER
        .locate()
        .unwrap_or_else(|_| PathBuf::from("redis-server"));
    fencelock_servers::REDIS_CLI
        .locate_beside(&server)
        .unwrap_or_else(|error| panic!("{error}"))
}
