//! A private redis-server for commands run without `--redis`: started from
//! PATH on a free loopback port with its own temporary directory, stopped
//! when dropped (and by the kernel if this process dies first).

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

use crate::exit;

/// A running private redis-server.
#[derive(Debug)]
pub(crate) struct PrivateRedis {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts redis-server and waits until it answers.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let bin =
            std::env::var("FENCELOCK_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let dir =
            tempfile::tempdir().context("cannot create a temporary directory for redis-server")?;
        let port = free_port()?;
        let mut cmd = Command::new(&bin);
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .arg("--logfile")
        .arg(dir.path().join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
        crate::child::die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                exit::fail(
                    exit::CONFIG,
                    format!("{bin} not found on PATH: install it with `apt-get install -y redis-server`, or pass --redis URL to use a running Redis"),
                )
            } else {
                anyhow::Error::new(e).context(format!("cannot start {bin}"))
            }
        })?;
        let url = format!("redis://127.0.0.1:{port}/");
        let mut server = PrivateRedis {
            child,
            url,
            _dir: dir,
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

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let addr = self
            .url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_string();
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log =
                    std::fs::read_to_string(self._dir.path().join("redis.log")).unwrap_or_default();
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
        let _ = self.child.kill().await;
    }
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
