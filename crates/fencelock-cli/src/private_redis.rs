//! A private redis-server for commands run without `--redis`: a
//! [`fencelock_servers::RedisServer`] started from PATH on a free loopback
//! port with its own temporary directory, stopped when dropped (and by the
//! kernel if this process dies first).
//!
//! `fencelock torture` also pauses, kills and restarts it (same port, same
//! directory, with or without its data), so it can be started with an
//! append-only file and with `DEBUG` enabled ([`Options`]). Its replicated
//! topologies (`torture_topology`) start Sentinel set-ups and Clusters
//! through `fencelock-servers` and keep every node as a [`PrivateRedis`]
//! ([`PrivateRedis::from_server`]).
//!
//! Starting and starting again block while the server comes up: they run
//! on a blocking thread ([`off_runtime`]), so the runtime's other tasks go
//! on meanwhile.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use fencelock_servers::{DebugCommand, Persistence, RedisConfig, RedisServer};

use crate::exit;

/// How a private server is configured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options {
    /// Persist every write before replying (`appendonly yes`,
    /// `appendfsync always`), so a kill -9 and restart loses nothing.
    pub(crate) aof: bool,
    /// `enable-debug-command local` (for `DEBUG SLEEP`).
    pub(crate) debug: bool,
}

impl Options {
    /// The `fencelock-servers` configuration of a data node with these
    /// options. An append-only file goes to `/dev/shm` when it exists (a
    /// kill -9 of the process loses nothing there either, and fsync is
    /// cheap).
    pub(crate) fn config(self) -> RedisConfig {
        let mut config = RedisConfig::default().with_dir_prefix("fencelock-redis");
        if self.aof {
            config = config
                .with_persistence(Persistence::AofAlways)
                .with_args(["--save", ""]);
            config.dir_in = shm();
        }
        if self.debug {
            config = config.with_debug(DebugCommand::Local);
        }
        config
    }
}

/// `/dev/shm`, when this machine has it.
pub(crate) fn shm() -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    shm.is_dir().then(|| shm.to_path_buf())
}

/// A running private redis-server.
#[derive(Debug)]
pub(crate) struct PrivateRedis {
    server: Arc<Mutex<RedisServer>>,
    url: String,
    port: u16,
}

impl PrivateRedis {
    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.server.lock().unwrap_or_else(|p| p.into_inner()).pid()
    }

    /// Starts redis-server and waits until it answers.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts redis-server configured with `options` and waits until it
    /// answers.
    pub(crate) async fn start_with(options: Options) -> anyhow::Result<Self> {
        let config = options.config();
        let server = start_blocking(move || RedisServer::start(config))
            .await?
            .map_err(redis_error)?;
        Ok(Self::from_server(server))
    }

    /// A server `fencelock-servers` started (a node of a set-up).
    pub(crate) fn from_server(server: RedisServer) -> Self {
        PrivateRedis {
            url: server.url(),
            port: server.port(),
            server: Arc::new(Mutex::new(server)),
        }
    }

    /// The Redis to use: `given`, or else a private server started now
    /// (returned too, so the caller can stop it when done).
    pub(crate) async fn unless_given(
        given: Option<&str>,
    ) -> anyhow::Result<(String, Option<Self>)> {
        Ok(match given {
            Some(url) => (url.to_string(), None),
            None => {
                let server = Self::start().await?;
                (server.url().to_string(), Some(server))
            }
        })
    }

    /// The server's URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The server's port (on 127.0.0.1).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGSTOP: the server stops answering (and expiring keys) until
    /// resumed.
    pub(crate) fn pause(&self) -> anyhow::Result<()> {
        locked(&self.server)?
            .pause()
            .context("cannot stop redis-server")
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) -> anyhow::Result<()> {
        locked(&self.server)?.resume();
        Ok(())
    }

    /// kill -9, `down` later a new server on the same port and directory:
    /// with the data it had persisted (`keep_data`), or with none (its files
    /// removed first), as a server without persistence comes back.
    pub(crate) async fn restart(&mut self, keep_data: bool, down: Duration) -> anyhow::Result<()> {
        self.kill().await;
        tokio::time::sleep(down).await;
        self.start_again(keep_data, &[]).await
    }

    /// kill -9, and wait for the process (it stays down until
    /// [`PrivateRedis::start_again`]).
    pub(crate) async fn kill(&mut self) {
        if let Ok(mut server) = locked(&self.server) {
            server.kill();
        }
    }

    /// Starts the server again on its port and directory after a
    /// [`PrivateRedis::kill`], with its persisted data (`keep_data`) or
    /// without (its data files removed; its configuration and cluster
    /// membership kept), with `extra` arguments for this start only
    /// (`--replicaof HOST PORT`); returns once it answers.
    pub(crate) async fn start_again(
        &mut self,
        keep_data: bool,
        extra: &[String],
    ) -> anyhow::Result<()> {
        let extra = extra.to_vec();
        off_runtime(&self.server, move |server| {
            if !keep_data {
                server.wipe_data()?;
            }
            server.start_again(&extra)
        })
        .await?
        .map_err(anyhow::Error::new)
    }

    /// Stops the server and waits for it.
    pub(crate) async fn stop(mut self) {
        let _ = self.resume();
        self.kill().await;
    }
}

/// The server or member behind `shared`, locked.
pub(crate) fn locked<T>(shared: &Mutex<T>) -> anyhow::Result<std::sync::MutexGuard<'_, T>> {
    shared
        .lock()
        .map_err(|_| anyhow::anyhow!("a private server's handle was poisoned"))
}

/// Runs `f` on the server behind `shared` on a blocking thread (starting a
/// server waits until it answers), so the runtime's other tasks go on.
pub(crate) async fn off_runtime<T: Send + 'static, R: Send + 'static>(
    shared: &Arc<Mutex<T>>,
    f: impl FnOnce(&mut T) -> R + Send + 'static,
) -> anyhow::Result<R> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || locked(&shared).map(|mut server| f(&mut server)))
        .await
        .context("a private server's start was cancelled")?
}

/// Runs `start` — the start of a server or a set-up, which blocks until it
/// answers — on a blocking thread, so the runtime's other tasks go on.
pub(crate) async fn start_blocking<T: Send + 'static>(
    start: impl FnOnce() -> fencelock_servers::Result<T> + Send + 'static,
) -> anyhow::Result<fencelock_servers::Result<T>> {
    tokio::task::spawn_blocking(start)
        .await
        .context("a private server's start was cancelled")
}

/// A `fencelock-servers` error of a private redis-server: a missing
/// binary is a configuration error (exit 78) that says how to install it.
pub(crate) fn redis_error(e: fencelock_servers::Error) -> anyhow::Error {
    server_error(
        e,
        fencelock_servers::REDIS_SERVER,
        "or pass --redis URL to use a running Redis",
    )
}

/// A `fencelock-servers` error of a private server of `binary`: a missing
/// binary is a configuration error (exit 78) naming it (as its environment
/// variable gave it), its package, and what to do `instead`.
pub(crate) fn server_error(
    e: fencelock_servers::Error,
    binary: fencelock_servers::Binary,
    instead: &str,
) -> anyhow::Error {
    if !e.is_missing_binary() {
        return anyhow::Error::new(e);
    }
    let bin = std::env::var(binary.env)
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| binary.name.into());
    exit::fail(
        exit::CONFIG,
        format!(
            "{bin} not found on PATH: install it with `apt-get install -y {}`, {instead}",
            binary.package
        ),
    )
}
