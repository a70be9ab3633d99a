//! Measuring instruments: Redis's INFO counters, `redis-benchmark`, this
//! process's CPU time and heap, and summary statistics.

use std::time::Duration;

use crate::conn::RefConn;
use crate::error::{Error, Result};

/// Redis-side counters from `INFO`, summed over every master.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ServerCounters {
    pub(crate) commands: u64,
    /// Socket reads Redis processed (each client write costs at least one).
    pub(crate) reads: u64,
    /// CPU seconds of the main threads (user + system).
    pub(crate) cpu_s: f64,
    /// How many `INFO` replies were summed (each adds one command).
    nodes: u64,
}

impl ServerCounters {
    pub(crate) async fn read(conn: &mut RefConn) -> Result<Self> {
        let info = conn.info_all_masters().await?;
        let sum = |name: &str| -> Vec<f64> {
            info.lines()
                .filter_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
                .filter_map(|v| v.trim().parse::<f64>().ok())
                .collect()
        };
        let commands = sum("total_commands_processed");
        if commands.is_empty() {
            return Err(Error::failed("INFO lacks total_commands_processed"));
        }
        let cpu = |main: &str, all: &str| -> f64 {
            let main = sum(main);
            if main.is_empty() {
                sum(all).iter().sum()
            } else {
                main.iter().sum()
            }
        };
        Ok(ServerCounters {
            commands: commands.iter().sum::<f64>() as u64,
            reads: sum("total_reads_processed").iter().sum::<f64>() as u64,
            cpu_s: cpu("used_cpu_user_main_thread", "used_cpu_user")
                + cpu("used_cpu_sys_main_thread", "used_cpu_sys"),
            nodes: commands.len() as u64,
        })
    }

    /// Work done between `self` and `later`, less the INFO calls of `later`.
    pub(crate) fn delta(self, later: ServerCounters) -> (u64, f64) {
        (
            later.commands.saturating_sub(self.commands + later.nodes),
            (later.cpu_s - self.cpu_s).max(0.0),
        )
    }

    /// Socket reads between `self` and `later`, less those of the INFO
    /// calls of `later`.
    pub(crate) fn reads_since(self, earlier: ServerCounters) -> u64 {
        self.reads.saturating_sub(earlier.reads + self.nodes)
    }
}

/// CPU time (user + system) this process has used so far, to the
/// nanosecond (`/proc`'s ticks of 10 ms are too coarse for a slice).
pub(crate) fn process_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given, which
    // lives on this stack frame for the whole call.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Bytes this process has allocated and not freed (glibc's `mallinfo2`:
/// every arena plus mmapped chunks), or its resident set where that is not
/// available.
pub(crate) fn heap_bytes() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics; it takes
        // no pointer and returns a plain struct.
        let info = unsafe { libc::mallinfo2() };
        (info.uordblks + info.hblkhd) as u64
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * 4096)
    }
}

/// `PING`s per second that `redis-benchmark` (the C client shipped with
/// Redis) measures with `clients` connections reaching `target` (its
/// address arguments), sending about `requests` PINGs; `None` when it is
/// not installed or fails.
pub(crate) async fn redis_benchmark_ping(
    target: &[String],
    clients: usize,
    requests: u64,
) -> Option<f64> {
    let out = tokio::process::Command::new("redis-benchmark")
        .args(target)
        .args(["-c", &clients.to_string()])
        .args(["-n", &requests.max(1000).to_string()])
        .args(["-t", "ping_mbulk", "--csv"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // "test","rps",…  then  "PING_MBULK","18656.72",…
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("\"PING"))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
}

/// The `q`-quantile (0..=1) of `sorted`, in the samples' unit.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median, smallest and largest of `values` (NaN without any).
pub(crate) fn spread(values: &[f64]) -> Spread {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    Spread {
        median: quantile(&sorted, 0.5),
        min: sorted.first().copied().unwrap_or(f64::NAN),
        max: sorted.last().copied().unwrap_or(f64::NAN),
    }
}

/// A figure measured once per round: its median over the rounds, and the
/// smallest and largest round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The median over the rounds.
    pub median: f64,
    /// The smallest round.
    pub min: f64,
    /// The largest round.
    pub max: f64,
}

impl Spread {
    /// One round's figure.
    pub fn one(v: f64) -> Self {
        Spread {
            median: v,
            min: v,
            max: v,
        }
    }
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
    fn jain_quantiles_and_spreads() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain(&[20, 0, 0, 0]) - 0.25).abs() < 1e-9);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        let s = spread(&[0.9, 0.7, f64::NAN, 1.1]);
        assert_eq!((s.median, s.min, s.max), (0.9, 0.7, 1.1));
        assert!(spread(&[]).median.is_nan());
    }

    #[test]
    fn this_process_has_a_heap_and_cpu_time() {
        let before = heap_bytes();
        let block = vec![7u8; 1 << 20];
        assert!(heap_bytes() >= before + (1 << 19), "{before}");
        drop(block);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(process_cpu() > Duration::ZERO);
    }
}
