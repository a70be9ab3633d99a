//! Measuring instruments: Redis's own round-trip rate, its INFO counters,
//! and summary statistics.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::url::RedisUrl;

/// Opens a plain connection for measurements (not through fencelock).
pub(crate) async fn connection(url: &RedisUrl) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(url.raw())
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("bad Redis URL {url}: {e}")))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Error::connecting(url, e))
}

/// Sequential `PING`s per second on one connection for `duration`.
pub(crate) async fn ping_rate(url: &RedisUrl, duration: Duration) -> Result<f64> {
    let mut conn = connection(url).await?;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < duration {
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// `PING`s per second from `clients` connections, each sequential (what
/// `redis-benchmark -c N PING` measures).
pub(crate) async fn ping_rate_parallel(
    url: &RedisUrl,
    clients: usize,
    duration: Duration,
) -> Result<f64> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(connection(url).await?);
    }
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < duration {
                    if redis::cmd("PING")
                        .query_async::<String>(&mut conn)
                        .await
                        .is_err()
                    {
                        break;
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0u64;
    for t in tasks {
        total += t.await?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Redis-side counters from `INFO`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerCounters {
    pub(crate) commands: u64,
    /// CPU seconds of the main thread (user + system).
    pub(crate) cpu_s: f64,
}

impl ServerCounters {
    pub(crate) async fn read(url: &RedisUrl) -> Result<Self> {
        let mut conn = connection(url).await?;
        let info: String = redis::cmd("INFO").arg("all").query_async(&mut conn).await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
                .map(|v| v.trim().to_string())
        };
        let commands = field("total_commands_processed")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::failed("INFO lacks total_commands_processed"))?;
        let cpu = |main: &str, all: &str| {
            field(main)
                .or_else(|| field(all))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let cpu_s = cpu("used_cpu_user_main_thread", "used_cpu_user")
            + cpu("used_cpu_sys_main_thread", "used_cpu_sys");
        Ok(ServerCounters { commands, cpu_s })
    }

    /// Work done between `self` and `later`, less the one INFO of `later`.
    pub(crate) fn delta(self, later: ServerCounters) -> (u64, f64) {
        (
            later.commands.saturating_sub(self.commands + 1),
            later.cpu_s - self.cpu_s,
        )
    }
}

/// The `q`-quantile (0..=1) of `sorted`, in the samples' unit.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Jain's fairness index of per-worker counts: 1 when all are equal, 1/n
/// when one worker did everything.
pub(crate) fn jain(counts: &[u64]) -> f64 {
    let n = counts.len() as f64;
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if squares == 0.0 {
        0.0
    } else {
        sum * sum / (n * squares)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_and_quantiles() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain(&[20, 0, 0, 0]) - 0.25).abs() < 1e-9);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
    }
}
