//! A private redis-server for commands run without `--redis`: started from
//! PATH on a free loopback port with its own temporary directory, stopped
//! when dropped (and by the kernel if this process dies first).
//!
//! `fencelock torture` also pauses, kills and restarts it (same port, same
//! directory, with or without its data), so it can be started with an
//! append-only file and with `DEBUG` enabled ([`Options`]).

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

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

/// A running private redis-server.
#[derive(Debug)]
pub(crate) struct PrivateRedis {
    child: Child,
    url: String,
    port: u16,
    options: Options,
    bin: String,
    dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts redis-server and waits until it answers.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts redis-server configured with `options` and waits until it
    /// answers. An append-only file goes to `/dev/shm` when it exists (a
    /// kill -9 of the process loses nothing there either, and fsync is
    /// cheap).
    pub(crate) async fn start_with(options: Options) -> anyhow::Result<Self> {
        let bin =
            std::env::var("FENCELOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let shm = std::path::Path::new("/dev/shm");
        let dir = if options.aof && shm.is_dir() {
            tempfile::Builder::new()
                .prefix("fencelock-redis")
                .tempdir_in(shm)
                .or_else(|_| tempfile::tempdir())
        } else {
            tempfile::tempdir()
        }
        .context("cannot create a temporary directory for redis-server")?;
        let port = free_port()?;
        let child = spawn(&bin, port, options, &dir)?;
        let url = format!("redis://127.0.0.1:{port}/");
        let mut server = PrivateRedis {
            child,
            url,
            port,
            options,
            bin,
            dir,
        };
        server.wait_ready().await?;
        Ok(server)
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

    fn pid(&self) -> Option<Pid> {
        self.child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
    }

    /// SIGSTOP: the server stops answering (and expiring keys) until
    /// resumed.
    pub(crate) fn pause(&self) -> anyhow::Result<()> {
        let pid = self.pid().context("redis-server is not running")?;
        kill(pid, Signal::SIGSTOP).context("cannot stop redis-server")?;
        Ok(())
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) -> anyhow::Result<()> {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGCONT).context("cannot continue redis-server")?;
        }
        Ok(())
    }

    /// kill -9, `down` later a new server on the same port and directory:
    /// with the data it had persisted (`keep_data`), or with none (its files
    /// removed first), as a server without persistence comes back.
    pub(crate) async fn restart(&mut self, keep_data: bool, down: Duration) -> anyhow::Result<()> {
        let _ = self.child.kill().await;
        tokio::time::sleep(down).await;
        if !keep_data {
            for entry in std::fs::read_dir(self.dir.path())?.flatten() {
                let name = entry.file_name();
                if name == "redis.log" {
                    continue;
                }
                let path = entry.path();
                let _ = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
        // The port is free again at once (the server set SO_REUSEADDR);
        // retry briefly in case the kernel is slow to release it.
        let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            self.child = spawn(&self.bin, self.port, self.options, &self.dir)?;
            match self.wait_ready().await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() > give_up => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log =
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                anyhow::bail!(
                    "redis-server exited at start ({status}): {}",
                    log.lines().last().unwrap_or("")
                );
            }
            if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() > give_up {
                anyhow::bail!("redis-server did not answer on {addr} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the server and waits for it.
    pub(crate) async fn stop(mut self) {
        let _ = self.resume();
        let _ = self.child.kill().await;
    }
}

/// Starts redis-server on `port` in `dir`; it dies with this process.
fn spawn(bin: &str, port: u16, options: Options, dir: &tempfile::TempDir) -> anyhow::Result<Child> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ]);
    if options.aof {
        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
    if options.debug {
        cmd.args(["--enable-debug-command", "local"]);
    }
    cmd.arg("--dir")
        .arg(dir.path())
        .arg("--logfile")
        .arg(dir.path().join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Not in our process group: a terminal's Ctrl-C is ours to handle,
        // and the server is stopped in order.
        .process_group(0)
        .kill_on_drop(true);
    crate::child::die_with_parent(&mut cmd);
    cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            exit::fail(
                exit::CONFIG,
                format!("{bin} not found on PATH: install it with `apt-get install -y redis-server`, or pass --redis URL to use a running Redis"),
            )
        } else {
            anyhow::Error::new(e).context(format!("cannot start {bin}"))
        }
    })
}

/// A free loopback port (never Redis's standard 6379).
fn free_port() -> anyhow::Result<u16> {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .context("cannot find a free loopback port")?
            .local_addr()?
            .port();
        if port != 6379 {
            return Ok(port);
        }
    }
}
