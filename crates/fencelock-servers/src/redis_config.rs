//! How a [`crate::RedisServer`] is started: [`RedisConfig`] — its role
//! ([`RedisRole`]), persistence ([`Persistence`]), `DEBUG`
//! ([`DebugCommand`]), password, config file, arguments, TLS, port,
//! directory and readiness probe.

use std::path::PathBuf;

use crate::probe::{Probe, RedisTarget};
use crate::tls::ServerTls;

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
    /// The redis-server arguments.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Persistence::None => &["--save", "", "--appendonly", "no"],
            Persistence::AofAlways => &["--appendonly", "yes", "--appendfsync", "always"],
            Persistence::AofEverySec => &["--appendonly", "yes", "--appendfsync", "everysec"],
        }
    }
}

/// What a redis-server process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RedisRole {
    /// A data node: `redis-server redis.conf …`.
    #[default]
    Data,
    /// A sentinel: `redis-server sentinel.conf --sentinel …`.
    Sentinel,
}

impl RedisRole {
    /// The name of its config file in the server's directory.
    pub fn conf_file(self) -> &'static str {
        match self {
            RedisRole::Data => "redis.conf",
            RedisRole::Sentinel => "sentinel.conf",
        }
    }
}

/// Whether a data node takes the `DEBUG` command (`DEBUG SLEEP`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DebugCommand {
    /// redis-server's default: refused.
    #[default]
    Default,
    /// From loopback connections only (`--enable-debug-command local`).
    Local,
    /// From everyone (`--enable-debug-command yes`).
    Yes,
}

/// How to start a [`crate::RedisServer`]. The default: a plain data node
/// without persistence, password or config lines, on any free port, in a
/// directory `fencelock-redis-…` in the system's temporary directory.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Data node or sentinel.
    pub role: RedisRole,
    /// What a data node persists.
    pub persistence: Persistence,
    /// `--enable-debug-command` of a data node.
    pub debug: DebugCommand,
    /// If set, `--requirepass`; [`crate::RedisServer::url`] includes it.
    pub password: Option<String>,
    /// Lines of the config file (`redis.conf` or `sentinel.conf`, given as
    /// the first argument), written once before the first start: what the
    /// server itself may rewrite (`replicaof`, a sentinel's state).
    /// Command-line settings override it.
    pub conf_lines: Vec<String>,
    /// Further arguments, after the crate's own (so they override them).
    pub args: Vec<String>,
    /// If set, the server listens only on TLS (`--port 0 --tls-port P`).
    pub tls: Option<ServerTls>,
    /// Pick a port whose cluster bus port (`port + 10000`) is free too.
    pub cluster_bus: bool,
    /// Where the server's directory is made (else the system's temporary
    /// directory, also when this one is not writable).
    pub dir_in: Option<PathBuf>,
    /// The prefix of the directory's name.
    pub dir_prefix: String,
    /// The readiness probe; `None`: the crate's own (plain connection,
    /// `INFO server` names this process, `PING` answers).
    pub probe: Option<Probe<RedisTarget>>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            role: RedisRole::Data,
            persistence: Persistence::None,
            debug: DebugCommand::Default,
            password: None,
            conf_lines: Vec::new(),
            args: Vec::new(),
            tls: None,
            cluster_bus: false,
            dir_in: None,
            dir_prefix: "fencelock-redis-".to_owned(),
            probe: None,
        }
    }
}

impl RedisConfig {
    /// Sets [`RedisConfig::persistence`].
    pub fn with_persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Sets [`RedisConfig::debug`].
    pub fn with_debug(mut self, debug: DebugCommand) -> Self {
        self.debug = debug;
        self
    }

    /// Sets [`RedisConfig::password`].
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Appends arguments to [`RedisConfig::args`].
    pub fn with_args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Appends one line to [`RedisConfig::conf_lines`].
    pub fn with_conf_line(mut self, line: impl Into<String>) -> Self {
        self.conf_lines.push(line.into());
        self
    }

    /// Sets [`RedisConfig::dir_in`].
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir_in = Some(dir.into());
        self
    }

    /// Sets [`RedisConfig::dir_prefix`].
    pub fn with_dir_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dir_prefix = prefix.into();
        self
    }
}
