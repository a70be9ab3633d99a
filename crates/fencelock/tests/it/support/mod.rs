//! What the tests share: a redis-server with a connected client, two
//! clients contending for one lock (`fixture`), reads of keys as they are in
//! Redis, polling with a deadline, the guide's scripts, process entry
//! points, and the lock worker process.

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod fixture;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod worker;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use fencelock::LockClient;
use fencelock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// Upper bound for anything the tests poll for.
pub(crate) const POLL_DEADLINE: Duration = Duration::from_secs(10);

/// The guide's fenced write script, verbatim (`fence >= stored`, no holder).
pub(crate) const GUIDE_FENCED_WRITE: &str = "
local current = tonumber(redis.call('hget', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < current then return 0 end
redis.call('hset', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

/// A redis-server of its own and a client connected to it.
pub(crate) struct TestRedis {
    pub(crate) server: RedisServer,
    pub(crate) client: LockClient,
}

impl TestRedis {
    /// A fresh server (no persistence, no password) and a client.
    pub(crate) async fn start() -> Result<Self> {
        Self::on(RedisServer::start()).await
    }

    /// A client of `server`.
    pub(crate) async fn on(server: RedisServer) -> Result<Self> {
        let client = lock_client(&server).await?;
        Ok(TestRedis { server, client })
    }
}

/// A lock client of `server` with default settings, on a connection of its
/// own.
pub(crate) async fn lock_client(server: &RedisServer) -> Result<LockClient> {
    Ok(LockClient::connect(&server.url()).await?)
}

/// A plain async connection to `server`.
pub(crate) async fn connect(server: &RedisServer) -> Result<MultiplexedConnection> {
    Ok(redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?)
}

/// Reads of keys as they are in Redis, through the server's admin
/// connection.
pub(crate) trait Keys {
    /// `GET key`.
    fn get(&self, key: &str) -> Option<String>;
    /// `EXISTS key`.
    fn exists(&self, key: &str) -> bool;
    /// `PTTL key` (-2 absent, -1 no expiry).
    fn pttl(&self, key: &str) -> i64;
    /// `HGETALL key`.
    fn hgetall(&self, key: &str) -> HashMap<String, String>;
    /// `DBSIZE`.
    fn dbsize(&self) -> i64;
}

impl Keys for RedisServer {
    fn get(&self, key: &str) -> Option<String> {
        self.query(&["GET", key])
    }

    fn exists(&self, key: &str) -> bool {
        self.query::<i64>(&["EXISTS", key]) == 1
    }

    fn pttl(&self, key: &str) -> i64 {
        self.query(&["PTTL", key])
    }

    fn hgetall(&self, key: &str) -> HashMap<String, String> {
        self.query(&["HGETALL", key])
    }

    fn dbsize(&self) -> i64 {
        self.query(&["DBSIZE"])
    }
}

/// A log writer shared with the test: install [`Captured::subscriber`],
/// then read what was logged with [`Captured::text`].
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    /// A log subscriber writing into this capture, without colours: events
    /// up to `level`, and the span events `spans` (`FmtSpan::NONE`: none).
    pub(crate) fn subscriber(
        &self,
        level: tracing::Level,
        spans: tracing_subscriber::fmt::format::FmtSpan,
    ) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(level)
            .with_span_events(spans)
            .finish()
    }

    /// Everything logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// Polls `check` every 5 ms until it returns `Some`; fails after `limit`.
pub(crate) async fn poll<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let give_up = Instant::now() + limit;
    loop {
        if let Some(out) = check() {
            return Ok(out);
        }
        if Instant::now() >= give_up {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `check` (async) every 20 ms until it returns `Some`; fails after
/// `limit`.
pub(crate) async fn poll_async<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let give_up = Instant::now() + limit;
    loop {
        if let Some(out) = check().await? {
            return Ok(out);
        }
        if Instant::now() >= give_up {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `cond` every 5 ms until it holds and returns how long that took;
/// fails after `limit`.
pub(crate) async fn poll_until(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    poll(what, limit, || cond().then(|| start.elapsed())).await
}

/// Polls until `key` no longer exists (a lease expired in Redis).
pub(crate) async fn wait_key_gone(server: &RedisServer, key: &str) -> Result<()> {
    poll_until(&format!("{key} to expire"), POLL_DEADLINE, || {
        !server.exists(key)
    })
    .await
    .map(drop)
}

/// A command that re-runs this test binary as the process entry point
/// `entry` (a test function in `module`, given as `module_path!()`), with
/// `env` set so the entry knows its job. Libtest prints a line or two of its
/// own on stdout before the entry runs (`-q` keeps it to those).
pub(crate) fn entry_command(module: &str, entry: &str, env: (&str, &str)) -> Command {
    // module_path!() starts with the binary's crate name; test names do not.
    let path = match module.split_once("::") {
        Some((_, rest)) => format!("{rest}::{entry}"),
        None => entry.to_owned(),
    };
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["--exact", &path, "--nocapture", "--test-threads=1", "-q"])
        .env(env.0, env.1);
    command
}
