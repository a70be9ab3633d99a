//! The audit of a Redis deployment: the rows of every master (what its
//! `INFO` shows, its clock, its clock fences), the permission probe, and the
//! round trip.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::checks::{self, ClockReading, FenceScan, PINGS, unix_micros};
use super::report::{Audit, Check, Reading, reading};
use super::{probe, promotable};
use crate::error::Result;
use crate::keys::glob_escape;
use crate::options::{FenceMode, LockOptions};
use crate::store::redis::{Node, RedisConn};

/// Runs the audit of the Redis deployment behind `conn` for locks under
/// `prefix` taken with `opts` (its fence mode, layout and ttl).
pub(crate) async fn run(conn: &RedisConn, prefix: &str, opts: &LockOptions) -> Result<Audit> {
    let rtt = round_trips(conn).await?;
    // The rows of every master: one server, the master behind Sentinel, or
    // each master of a Cluster (its rows named `CHECK@HOST:PORT`).
    let masters = conn.masters().await?;
    let mut rows = Vec::new();
    let mut replica = false;
    let mut info_refused = None;
    let mut fences = FenceScan::default();
    let mut scan_refused = None;
    for (i, node) in masters.iter().enumerate() {
        let audited = server_rows(conn, node, prefix, opts).await?;
        let info = audited.info;
        if i == 0 {
            rows.push(match &info {
                Reading::Got(info) => checks::topology(info, conn.topology(), masters.len()),
                Reading::Refused(_) => checks::unreadable("topology", "INFO", "+info"),
            });
        }
        replica |= matches!(&info, Reading::Got(info) if checks::is_replica(info));
        if masters.len() > 1 {
            rows.extend(audited.rows.into_iter().map(|row| row.at(&node.addr)));
        } else {
            rows.extend(audited.rows);
        }
        if i == 0
            && let Reading::Refused(e) = info
        {
            info_refused = Some(e);
        }
        match audited.fences {
            Reading::Got(scan) => fences.merge(scan),
            Reading::Refused(e) => scan_refused = Some(e),
        }
    }
    // The replicas a failover could promote: what they would bring to the
    // master's place (their clock against the fences already issued, their
    // memory policy, persistence and min-replicas-to-write).
    for node in conn.replicas().await? {
        rows.extend(promotable::rows(conn, &node, &fences, prefix, opts).await?);
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
        let mut probe = probe::run(conn, prefix, opts).await?;
        if let Some(e) = &info_refused {
            probe.refused(e, probe::Need::Feature(probe::INFO));
        }
        if let Some(e) = &scan_refused {
            probe.refused(e, probe::Need::Feature(probe::TOP));
        }
        rows.push(checks::permissions(&probe));
    }
    rows.push(checks::rtt(&rtt, opts.ttl));
    Ok(Audit::new(conn.url(), rows))
}

/// What the audit of one master found.
struct Audited {
    /// Its rows.
    rows: Vec<Check>,
    /// Its `INFO` reply.
    info: Reading<String>,
    /// Its clock fences under the prefix.
    fences: Reading<FenceScan>,
}

/// The rows of one master: what its `INFO` shows (version, role,
/// replication, eviction, persistence), its clock, and its clock fences
/// under `prefix`.
async fn server_rows(
    conn: &RedisConn,
    node: &Node,
    prefix: &str,
    opts: &LockOptions,
) -> Result<Audited> {
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
        Reading::Got(clock) => checks::clock(&clock, opts.ttl),
        Reading::Refused(_) => checks::unreadable("clock", "TIME", "+time"),
    });
    let fences = match reading(scan_fences(conn, node, prefix).await)? {
        Reading::Got((scan, now_us)) => {
            rows.push(checks::fences(&scan, now_us, prefix));
            Reading::Got(scan)
        }
        Reading::Refused(e) => {
            rows.push(checks::refused("fences", &e));
            Reading::Refused(e)
        }
    };
    Ok(Audited { rows, info, fences })
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

/// Every fence key under `prefix` on `node` (`SCAN … MATCH PREFIX*:fence`,
/// both layouts) and the highest clock fence among them; then the node's
/// clock, read *after* the scan, so that no fence granted during the scan
/// can be ahead of it on a sound server.
async fn scan_fences(conn: &RedisConn, node: &Node, prefix: &str) -> Result<(FenceScan, u64)> {
    let pattern = format!("{}*:fence", glob_escape(prefix));
    let mut scan = FenceScan::default();
    let keys = conn.scan_node(node, &pattern, Some("string")).await?;
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
