//! The deployment audit: [`LockClient::audit`](crate::LockClient::audit)
//! checks whether the Redis behind a client provides what fencelock's
//! guarantees assume, and says what to change where it does not. The
//! `fencelock doctor` command prints the same audit. An etcd cluster gets
//! rows of its own (feature `etcd`; see "On etcd" below).
//!
//! | check | reads | OK | WARN | FAIL |
//! |---|---|---|---|---|
//! | `topology` | `INFO server` (`redis_mode`) | a standalone server | | a Cluster node or a Sentinel behind a plain `redis://` URL |
//! | `version` | `INFO server` | Redis 7.0 or newer | | older than 7.0 |
//! | `role` | `INFO replication` | a master | | a replica |
//! | `replication` | `INFO replication` (masters only) | no replicas, or `min-replicas-to-write` set | replicas without `min-replicas-to-write` (advisory) | `min-replicas-to-write` set with no good replica: writes are refused |
//! | `eviction` | `INFO memory` | no memory limit, or `noeviction` | any other policy with a limit (advisory) | |
//! | `persistence` | `INFO persistence`, `CONFIG GET appendfsync` (counter fences only) | clock fences; counter fences with `appendfsync always` | counter fences with another `appendfsync`, or one the user may not read | counter fences without the append-only file |
//! | `clock` | `TIME` and this host's clock | within 1 s | more than 1 s apart (advisory) | |
//! | `fences` | `SCAN`, `MGET`, `TIME` | the server clock is past every stored clock fence | | a clock fence ahead of the server clock |
//! | `permissions` | fencelock's own operations on a probe lock under the prefix (see below) | every operation ran | a feature is refused (wake-ups, fenced hashes, `top`, `INFO`); not probed on a replica | a lock operation is refused |
//! | `rtt` | median of 5 `PING`s | under 1/20 of the ttl | more (advisory) | |
//!
//! The permission probe grants, renews and inspects a lock of its own
//! (`PREFIX{fencelock-doctor-ID}`), queues a fair waiter, releases (handing
//! the lock over) and leaves, writes, registers and reads a fenced hash
//! next to it, publishes and subscribes on its wake-up channel, and runs
//! `SCAN` and `ZCARD`; it deletes its keys afterwards, and touches no other
//! lock. It counts in no metrics or stats. A script stops at its first
//! refused command, so fix what it names and audit again.
//!
//! *Advisory* checks never fail: they name a weaker guarantee or a
//! degraded feature, not a broken one. A check that cannot be read (the
//! user may not run `INFO`, say) is a WARN that says which permission to
//! add.
//!
//! The audit is a list of rows with one format: Sentinel and Cluster add
//! rows (a check per master is named `CHECK@HOST:PORT`, e.g.
//! `role@10.0.0.5:6379`; deployment-wide rows such as a Sentinel quorum
//! get names of their own) without changing what a row is.
//!
//! ## On etcd
//!
//! | check | reads | OK | WARN | FAIL |
//! |---|---|---|---|---|
//! | `members` | `MemberList` | an odd number, at least 3 | one member (no fault tolerance), or an even number | |
//! | `health` | `Status` of every member's client URL | every member answers | a minority does not | a majority does not: no quorum, no locks |
//! | `leader` | `Status` of every member | all agree on one leader | | no leader, or members disagree |
//! | `version` | `Status` | etcd 3.4 or newer on every member | older, or mixed versions | |
//! | `db size` | `Status`, `Alarm` | under 80 % of the quota (2 GiB unless set) | above | a `NOSPACE` or `CORRUPT` alarm: writes refused |
//! | `lease` | a 1 s lease granted and revoked | etcd's shortest lease is at most the ttl | longer: a crashed holder's lock lasts that long, not the ttl | |
//! | `rtt` | median of 5 linearizable reads | under 1/20 of the ttl | more (advisory) | |
//!
//! | module | concern |
//! |---|---|
//! | `checks` | each row from what the server reported: pure functions, tested without Redis |
//! | `probe` | the permission probe: fencelock's operations on a probe lock, and what was refused |
//! | `etcd` | the rows of an etcd cluster (feature `etcd`) |

mod checks;
#[cfg(feature = "etcd")]
mod etcd;
mod probe;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::backend::{Backend, Node, RedisConn};
use crate::error::{Error, Result};
use crate::options::{FenceMode, LockOptions};
use checks::{ClockReading, FenceScan};

/// How a check came out. Ordered from best to worst, so the worst of several
/// is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// The deployment provides what fencelock assumes.
    Ok,
    /// Locks work and stay safe as far as fencelock can tell, but a
    /// guarantee is weaker than it could be, a feature is degraded, or the
    /// check could not be read.
    Warn,
    /// A guarantee fencelock documents does not hold here, or locks cannot
    /// work at all.
    Fail,
}

impl Status {
    /// `OK`, `WARN` or `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of an [`Audit`]: what was checked, how it came out, what was
/// found and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    name: String,
    status: Status,
    found: String,
    fix: Option<String>,
}

impl Check {
    pub(crate) fn ok(name: &str, found: impl Into<String>) -> Self {
        Check {
            name: name.to_owned(),
            status: Status::Ok,
            found: found.into(),
            fix: None,
        }
    }

    pub(crate) fn warn(name: &str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Check::ok(name, found)
        }
    }

    pub(crate) fn fail(name: &str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            status: Status::Fail,
            ..Check::warn(name, found, fix)
        }
    }

    /// The same check, named for one node of a multi-node deployment.
    fn at(mut self, node: &str) -> Self {
        self.name = format!("{}@{node}", self.name);
        self
    }

    /// The check's name (`version`, `role`, … see the module docs); a check
    /// of one node of a multi-node deployment is named `CHECK@HOST:PORT`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it came out.
    pub fn status(&self) -> Status {
        self.status
    }

    /// What was found, in a sentence (never a password).
    pub fn found(&self) -> &str {
        &self.found
    }

    /// What to change, for a WARN or a FAIL.
    pub fn fix(&self) -> Option<&str> {
        self.fix.as_deref()
    }
}

/// The result of [`LockClient::audit`](crate::LockClient::audit): one
/// [`Check`] per row, in a fixed order.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencelock::Error> {
/// use fencelock::{LockClient, audit::Status};
///
/// let client = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let audit = client.audit().await?;
/// for check in audit.checks().iter().filter(|c| c.status() != Status::Ok) {
///     eprintln!("{} {}: {} ({})", check.status(), check.name(), check.found(), check.fix().unwrap_or(""));
/// }
/// if audit.worst() == Status::Fail {
///     // refuse to start
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Audit {
    url: String,
    checks: Vec<Check>,
}

impl Audit {
    /// The audited URL, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every row, in order.
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// The row named `name`, if the audit has one.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The worst status of all rows ([`Status::Ok`] if there are none).
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }
}

/// How many `PING`s the round-trip time is the median of.
const PINGS: usize = 5;

/// A reply, or the permission the user lacks to get it.
enum Reading<T> {
    Got(T),
    Refused(Error),
}

/// Keeps a refusal (a missing permission) as a [`Reading`]; any other error
/// ends the audit.
fn reading<T>(result: Result<T>) -> Result<Reading<T>> {
    match result {
        Ok(value) => Ok(Reading::Got(value)),
        Err(e @ Error::NoPermission { .. }) => Ok(Reading::Refused(e)),
        Err(e) => Err(e),
    }
}

/// Runs the audit of the deployment behind `backend` for locks under
/// `prefix` taken with `opts` (its fence mode, layout and ttl).
pub(crate) async fn run(backend: &Backend, prefix: &str, opts: &LockOptions) -> Result<Audit> {
    #[cfg(feature = "etcd")]
    if let Some(conn) = backend.etcd() {
        return Ok(Audit {
            url: backend.url().to_owned(),
            checks: etcd::run(conn, opts).await?,
        });
    }
    let conn = backend.redis()?;
    let rtt = round_trips(conn).await?;
    // The rows of every master: one server, the master behind Sentinel, or
    // each master of a Cluster (its rows named `CHECK@HOST:PORT`).
    let masters = conn.masters().await?;
    let mut rows = Vec::new();
    let mut replica = false;
    let mut info_refused = None;
    for (i, node) in masters.iter().enumerate() {
        let (node_rows, info) = server_rows(conn, node, prefix, opts).await?;
        if i == 0 {
            rows.push(match &info {
                Reading::Got(info) => checks::topology(info, conn.topology(), masters.len()),
                Reading::Refused(_) => checks::unreadable("topology", "INFO", "+info"),
            });
        }
        replica |= matches!(&info, Reading::Got(info) if checks::is_replica(info));
        if masters.len() > 1 {
            rows.extend(node_rows.into_iter().map(|row| row.at(&node.addr)));
        } else {
            rows.extend(node_rows);
        }
        if i == 0
            && let Reading::Refused(e) = info
        {
            info_refused = Some(e);
        }
    }
    if replica {
        // Every probe write would be refused (READONLY), telling nothing
        // about the user.
        rows.push(Check::warn(
            "permissions",
            "not probed: a replica refuses fencelock's writes",
            "audit the master",
        ));
    } else {
        let mut probe = probe::run(backend, prefix, opts).await?;
        if let Some(e) = &info_refused {
            probe.refused(e, probe::Need::Feature(probe::INFO));
        }
        rows.push(checks::permissions(&probe));
    }
    rows.push(checks::rtt(&rtt, opts.ttl));
    Ok(Audit {
        url: backend.url().to_owned(),
        checks: rows,
    })
}

/// The rows of one master: what its `INFO` shows (version, role,
/// replication, eviction, persistence), its clock, and its clock fences
/// under `prefix`; and its `INFO` reply.
async fn server_rows(
    conn: &RedisConn,
    node: &Node,
    prefix: &str,
    opts: &LockOptions,
) -> Result<(Vec<Check>, Reading<String>)> {
    let info = reading(conn.on_node::<String>(node, &redis::cmd("INFO")).await)?;
    let mut rows = Vec::new();
    match &info {
        Reading::Got(info) => {
            rows.push(checks::version(info));
            rows.push(checks::role(info));
            rows.extend(checks::replication(info));
            rows.push(checks::eviction(info));
            // appendfsync is not in INFO; CONFIG GET is read only when it
            // matters, so the README's rule (without it) audits clean.
            let fsync = if opts.fence_mode == FenceMode::Counter && checks::aof_enabled(info) {
                let reply = conn
                    .on_node::<Vec<String>>(
                        node,
                        redis::cmd("CONFIG").arg("GET").arg("appendfsync"),
                    )
                    .await;
                Some(reading(reply)?)
            } else {
                None
            };
            rows.push(checks::persistence(info, opts.fence_mode, fsync.as_ref()));
        }
        Reading::Refused(_) => {
            for name in ["version", "role", "eviction", "persistence"] {
                rows.push(checks::unreadable(name, "INFO", "+info"));
            }
        }
    }
    rows.push(match reading(clock(conn, node).await)? {
        Reading::Got(clock) => checks::clock(&clock),
        Reading::Refused(_) => checks::unreadable("clock", "TIME", "+time"),
    });
    rows.push(match reading(scan_fences(conn, node, prefix).await)? {
        Reading::Got((scan, now_us)) => checks::fences(&scan, now_us, prefix),
        Reading::Refused(e) => checks::refused("fences", &e),
    });
    Ok((rows, info))
}

/// The round trips of a few `PING`s, sorted. The first one fails the audit
/// if Redis cannot be reached.
async fn round_trips(conn: &RedisConn) -> Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let sent = Instant::now();
        conn.cmd::<String>("", &redis::cmd("PING")).await?;
        samples.push(sent.elapsed());
    }
    samples.sort();
    Ok(samples)
}

/// The server's clock (`TIME`) against this host's, read around it.
async fn clock(conn: &RedisConn, node: &Node) -> Result<ClockReading> {
    let before = unix_micros(SystemTime::now());
    let (secs, micros): (u64, u64) = conn.on_node(node, &redis::cmd("TIME")).await?;
    let after = unix_micros(SystemTime::now());
    Ok(ClockReading {
        server_us: secs.saturating_mul(1_000_000).saturating_add(micros),
        local_before_us: before,
        local_after_us: after,
    })
}

/// Microseconds since the Unix epoch (0 for a clock before it).
fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Every fence key under `prefix` on `node` (`SCAN … MATCH PREFIX*:fence`,
/// both layouts) and the highest clock fence among them; then the node's
/// clock, read *after* the scan, so that no fence granted during the scan
/// can be ahead of it on a sound server.
async fn scan_fences(conn: &RedisConn, node: &Node, prefix: &str) -> Result<(FenceScan, u64)> {
    let pattern = format!("{}*:fence", checks::glob_escape(prefix));
    let mut scan = FenceScan::default();
    let keys = conn.scan_node(node, &pattern, "string").await?;
    // GETs in a pipeline, not one MGET: on a Cluster the keys of one node
    // span many slots.
    for batch in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for key in batch {
            pipe.cmd("GET").arg(key);
        }
        let values: Vec<Option<String>> = conn.pipeline_on_node(node, &pipe).await?;
        for (key, value) in batch.iter().zip(values) {
            scan.add(key, value.as_deref());
        }
    }
    let (secs, micros): (u64, u64) = conn.on_node(node, &redis::cmd("TIME")).await?;
    Ok((scan, secs.saturating_mul(1_000_000).saturating_add(micros)))
}
