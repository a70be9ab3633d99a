//! Where the measuring thread runs relative to redis-server.
//!
//! On loopback the cost of a round trip depends on it: a client on Redis's
//! own CPU is woken directly when the reply is written (a round trip close
//! to the bare work of both sides), one on another CPU waits for that CPU
//! to wake from idle. Unpinned, a run lands in either regime from one
//! process to the next, and its ratios mix the two. So when the bench
//! started its own redis-server, it pins that server's threads to one CPU
//! and measures `uncontended` and `many` once per regime: the client on
//! Redis's CPU, then on another ([`Placement`]). A server given by URL is
//! not touched: the record says the client ran unpinned, and on which CPUs
//! it was allowed to.
//!
//! CPUs are picked from this process's affinity mask (a cpuset may lack
//! CPU 0): Redis gets the first allowed CPU, the other regime the second.
//! With one allowed CPU only the same-CPU regime exists, and the run says
//! so ([`plan`]).

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

use crate::error::{Error, Result};

/// Where the client thread of a record ran.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// Not pinned: the client could run on any of `allowed`; where Redis
    /// ran is not known (a server given by URL, or `--no-pin`).
    Unpinned {
        /// The CPUs this process may run on.
        allowed: Vec<usize>,
    },
    /// Pinned on Redis's own CPU.
    SameCpu {
        /// The CPU of both.
        cpu: usize,
    },
    /// Pinned on another CPU than Redis's.
    OtherCpu {
        /// The client's CPU.
        cpu: usize,
        /// Redis's CPU.
        redis_cpu: usize,
    },
}

impl Placement {
    /// The regime's name in the JSON lines: `unpinned`, `same_cpu` or
    /// `other_cpu`.
    pub fn name(&self) -> &'static str {
        match self {
            Placement::Unpinned { .. } => "unpinned",
            Placement::SameCpu { .. } => "same_cpu",
            Placement::OtherCpu { .. } => "other_cpu",
        }
    }

    /// The CPU the client is pinned to, if it is.
    pub fn client_cpu(&self) -> Option<usize> {
        match self {
            Placement::Unpinned { .. } => None,
            Placement::SameCpu { cpu } | Placement::OtherCpu { cpu, .. } => Some(*cpu),
        }
    }

    /// Redis's CPU, if the bench pinned it.
    pub fn redis_cpu(&self) -> Option<usize> {
        match self {
            Placement::Unpinned { .. } => None,
            Placement::SameCpu { cpu } => Some(*cpu),
            Placement::OtherCpu { redis_cpu, .. } => Some(*redis_cpu),
        }
    }

    /// For the human table: `client on Redis's CPU 0`.
    pub fn describe(&self) -> String {
        match self {
            Placement::Unpinned { allowed } => format!(
                "client unpinned (allowed CPUs {}), Redis's CPU unknown",
                cpu_list(allowed)
            ),
            Placement::SameCpu { cpu } => format!("client on Redis's CPU {cpu}"),
            Placement::OtherCpu { cpu, redis_cpu } => {
                format!("client on CPU {cpu}, Redis on CPU {redis_cpu}")
            }
        }
    }
}

/// `0-3,6`: CPUs as `taskset -c` writes them.
fn cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The CPUs this process may run on, in order.
pub(crate) fn allowed_cpus() -> Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))
        .map_err(|e| Error::failed(format!("cannot read this process's CPU affinity: {e}")))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// The regimes to measure given the `allowed` CPUs, and the CPU Redis is
/// pinned to: both regimes with two CPUs or more, the same-CPU one alone
/// (and the note saying why) with one.
pub(crate) fn regimes(allowed: &[usize]) -> (Vec<Placement>, Option<String>) {
    match allowed {
        [] => (
            vec![Placement::Unpinned {
                allowed: Vec::new(),
            }],
            Some("no CPU affinity could be read: not pinned".into()),
        ),
        [only] => (
            vec![Placement::SameCpu { cpu: *only }],
            Some(format!(
                "one CPU ({only}) is allowed: the client ran on Redis's CPU only, the other-CPU regime was skipped"
            )),
        ),
        [redis, other, ..] => (
            vec![
                Placement::SameCpu { cpu: *redis },
                Placement::OtherCpu {
                    cpu: *other,
                    redis_cpu: *redis,
                },
            ],
            None,
        ),
    }
}

/// Pins every thread of process `pid` (a redis-server this bench started)
/// to `cpu`.
pub(crate) fn pin_process(pid: u32, cpu: usize) -> Result<()> {
    let set = one_cpu(cpu)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| {
        Error::failed(format!(
            "cannot list the threads of redis-server {pid}: {e}"
        ))
    })?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        sched_setaffinity(Pid::from_raw(tid), &set).map_err(|e| {
            Error::failed(format!(
                "cannot pin redis-server {pid} (thread {tid}) to CPU {cpu}: {e}"
            ))
        })?;
    }
    Ok(())
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin_this_thread(cpu: usize) -> Result<()> {
    sched_setaffinity(Pid::from_raw(0), &one_cpu(cpu)?)
        .map_err(|e| Error::failed(format!("cannot pin the measuring thread to CPU {cpu}: {e}")))
}

fn one_cpu(cpu: usize) -> Result<CpuSet> {
    let mut set = CpuSet::new();
    set.set(cpu)
        .map_err(|e| Error::failed(format!("CPU {cpu} cannot be pinned to: {e}")))?;
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cpus_or_more_give_both_regimes_on_the_first_two_allowed() {
        // A cpuset without CPU 0: Redis gets the first allowed CPU.
        let (regimes, note) = regimes(&[2, 5, 7]);
        assert_eq!(
            regimes,
            [
                Placement::SameCpu { cpu: 2 },
                Placement::OtherCpu {
                    cpu: 5,
                    redis_cpu: 2
                }
            ]
        );
        assert_eq!(note, None);
    }

    #[test]
    fn one_cpu_skips_the_other_regime_and_says_so() {
        let (regimes, note) = regimes(&[3]);
        assert_eq!(regimes, [Placement::SameCpu { cpu: 3 }]);
        assert!(note.is_some_and(|n| n.contains("skipped")));
    }

    #[test]
    fn placements_describe_themselves() {
        let unpinned = Placement::Unpinned {
            allowed: vec![0, 1, 2, 3, 6],
        };
        assert_eq!(unpinned.name(), "unpinned");
        assert!(
            unpinned.describe().contains("0-3,6"),
            "{}",
            unpinned.describe()
        );
        assert_eq!(unpinned.client_cpu(), None);
        let other = Placement::OtherCpu {
            cpu: 1,
            redis_cpu: 0,
        };
        assert_eq!((other.client_cpu(), other.redis_cpu()), (Some(1), Some(0)));
        assert_eq!(other.describe(), "client on CPU 1, Redis on CPU 0");
    }
}
