//! The rows of a replica a failover could promote (behind Sentinel, or in a
//! Cluster): what it would bring to the master's place. Its clock against
//! the highest clock fence the masters store (a promoted replica whose
//! clock is behind issues fences below ones already issued once a fence
//! key is lost), its version, memory policy, persistence and the
//! `min-replicas-to-write` it would enforce. Each row is named
//! `CHECK@HOST:PORT`. A replica with `replica-priority 0` is never
//! promoted and gets one OK row; one that cannot be reached gets one WARN
//! row, and the audit goes on.

use std::time::SystemTime;

use super::checks::{self, ClockReading, FenceScan, unix_micros};
use super::report::{Check, Reading, reading};
use crate::error::{Error, Result};
use crate::options::{FenceMode, LockOptions};
use crate::store::redis::{RedisConn, Replica, ReplicaConn};

/// The name of the row that says whether a replica was audited.
const NAME: &str = "replica";

/// The rows of `replica`, checked against `fences`, the masters' scan.
pub(super) async fn rows(
    conn: &RedisConn,
    replica: &Replica,
    fences: &FenceScan,
    prefix: &str,
    opts: &LockOptions,
) -> Result<Vec<Check>> {
    let addr = replica.addr();
    match audit(conn, replica, fences, prefix, opts).await {
        Ok(rows) => Ok(rows.into_iter().map(|row| row.at(&addr)).collect()),
        // A replica that does not answer is not the deployment failing: the
        // masters still grant. Its row says it was not audited.
        Err(e) if e.is_connection() => Ok(vec![unreachable(replica, &e).at(&addr)]),
        Err(e) => Err(e),
    }
}

/// The WARN row of a replica that could not be reached.
fn unreachable(replica: &Replica, e: &Error) -> Check {
    let listed = if replica.down {
        "listed as down"
    } else {
        "listed as a replica"
    };
    Check::warn(
        NAME,
        format!(
            "{listed}, not reachable from here ({e}): not audited, and a failover may still promote it"
        ),
        "bring it back (or remove it from the deployment), then audit again",
    )
}

async fn audit(
    conn: &RedisConn,
    replica: &Replica,
    fences: &FenceScan,
    prefix: &str,
    opts: &LockOptions,
) -> Result<Vec<Check>> {
    let node = conn.connect_replica(replica).await?;
    let info = reading(node.cmd::<String>(&redis::cmd("INFO")).await)?;
    let mut rows = Vec::new();
    match &info {
        Reading::Got(info) if checks::never_promoted(info) => {
            return Ok(vec![Check::ok(
                NAME,
                "replica-priority 0: never promoted, not audited",
            )]);
        }
        Reading::Got(info) => {
            rows.push(Check::ok(NAME, "a replica a failover could promote"));
            rows.push(checks::version(info));
            rows.push(checks::promoted_replication(info));
            rows.push(checks::eviction(info));
            let fsync = if opts.fence_mode == FenceMode::Counter && checks::aof_enabled(info) {
                let reply = node
                    .cmd::<Vec<String>>(redis::cmd("CONFIG").arg("GET").arg("appendfsync"))
                    .await;
                Some(reading(reply)?)
            } else {
                None
            };
            rows.push(checks::persistence(info, opts.fence_mode, fsync.as_ref()));
        }
        Reading::Refused(_) => {
            for name in ["version", "replication", "eviction", "persistence"] {
                rows.push(checks::unreadable(name, "INFO", "+info"));
            }
        }
    }
    match reading(clock(&node).await)? {
        Reading::Got(clock) => {
            rows.push(checks::clock(&clock, opts.ttl));
            rows.push(checks::fences(fences, clock.server_us, prefix));
        }
        Reading::Refused(_) => {
            rows.push(checks::unreadable("clock", "TIME", "+time"));
            rows.push(checks::unreadable("fences", "TIME", "+time"));
        }
    }
    Ok(rows)
}

/// The replica's clock (`TIME`) against this host's, read around it.
async fn clock(node: &ReplicaConn) -> Result<ClockReading> {
    let before = unix_micros(SystemTime::now());
    let (secs, micros): (u64, u64) = node.cmd(&redis::cmd("TIME")).await?;
    let after = unix_micros(SystemTime::now());
    Ok(ClockReading {
        server_us: secs.saturating_mul(1_000_000).saturating_add(micros),
        local_before_us: before,
        local_after_us: after,
    })
}
