//! Each row of the audit from what the server reported: pure functions of
//! `INFO` text, clock readings and scanned fences, tested without Redis.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::probe::{Need, ProbeReport};
use super::report::{Check, Reading};
use crate::error::Error;
use crate::options::FenceMode;
use crate::store::redis::{Topology, info_field, memory_policy};

/// The oldest Redis fencelock's scripts are built and tested on.
/// How many round trips (`PING`s, or reads on etcd) the `rtt` row is the
/// median of.
pub(super) const PINGS: usize = 5;

const MIN_VERSION: (u32, u32) = (7, 0);

/// Two clocks further apart than this are not both synchronised: hosts kept
/// by NTP agree within milliseconds. A server clock that is off will be
/// stepped back into place some day, and clock fences only survive a lost
/// fence key if the server clock has not stepped back by more than the time
/// since the last grant; a Sentinel failover, which loses fence keys that
/// did not replicate, takes 2.5–3 s (measured). One second leaves that
/// margin.
pub(crate) const CLOCK_SKEW_WARN: Duration = Duration::from_secs(1);

/// The round trip above which the lease budget suffers: a fraction of the
/// ttl. Each grant spends one round trip of the lease before the holder can
/// start; renewal starts at a third of the ttl, and the two thirds left must
/// cover the renewal's round trip, its retries and the process's own pauses.
/// At a twentieth of the ttl per round trip a few retries already eat a
/// large part of that (a LAN round trip is well under a millisecond).
pub(crate) const RTT_WARN_FRACTION: u32 = 20;

/// Fences at or above this (µs since the Unix epoch: September 2001) are
/// clock fences; counter fences count up from 1.
const CLOCK_FENCE_FLOOR: u64 = 1_000_000_000_000_000;

/// A row that could not be read because the user may not run `command`.
pub(super) fn unreadable(name: &str, command: &str, permission: &str) -> Check {
    Check::warn(
        name,
        format!("unknown: the user may not run {command}"),
        format!("add {permission} to the user's ACL rule to audit this"),
    )
}

/// A row that could not be read because of the refusal `e`.
pub(super) fn refused(name: &str, e: &Error) -> Check {
    match e {
        Error::NoPermission { detail, fix } => Check::warn(
            name,
            format!("unknown: the user may not {detail}"),
            format!("add {fix} to the user's ACL rule to audit this"),
        ),
        other => Check::warn(name, format!("unknown: {other}"), "see the error"),
    }
}

/// What kind of server the URL reached.
pub(super) fn topology(info: &str, topology: Topology, masters: usize) -> Check {
    const NAME: &str = "topology";
    match (topology, info_field(info, "redis_mode")) {
        (Topology::Cluster, _) => Check::ok(NAME, format!("a Redis Cluster of {masters} masters")),
        (Topology::Sentinel, _) => Check::ok(NAME, "the master the sentinels name"),
        (_, Some("cluster")) => Check::fail(
            NAME,
            "a Redis Cluster node used as one server",
            "use a redis+cluster://HOST:PORT[,HOST:PORT…] URL",
        ),
        (_, Some("sentinel")) => Check::fail(
            NAME,
            "a Sentinel, not a data server",
            "use a redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME URL",
        ),
        (_, Some(mode)) => Check::ok(NAME, format!("one {mode} server")),
        (_, None) => Check::warn(
            NAME,
            "unknown: INFO shows no redis_mode",
            "check that the URL names a Redis server",
        ),
    }
}

/// The Redis version against [`MIN_VERSION`].
pub(super) fn version(info: &str) -> Check {
    const NAME: &str = "version";
    let Some(version) = info_field(info, "redis_version") else {
        return Check::warn(
            NAME,
            "unknown: INFO shows no redis_version",
            "run Redis 7.0 or newer",
        );
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().flatten(), parts.next().flatten());
    match major.zip(minor) {
        Some(found) if found >= MIN_VERSION => Check::ok(NAME, format!("Redis {version}")),
        Some(_) => Check::fail(
            NAME,
            format!(
                "Redis {version}: fencelock's scripts need 7.0 (their error replies, TIME before writes, SPUBLISH for Cluster wake-ups)"
            ),
            "upgrade to Redis 7.0 or newer",
        ),
        None => Check::warn(
            NAME,
            format!("unknown version {version:?}"),
            "run Redis 7.0 or newer",
        ),
    }
}

/// A master, or a replica (which cannot take locks).
pub(super) fn role(info: &str) -> Check {
    const NAME: &str = "role";
    match info_field(info, "role") {
        Some("master") => Check::ok(NAME, "master"),
        Some("slave") => {
            let master = match (
                info_field(info, "master_host"),
                info_field(info, "master_port"),
            ) {
                (Some(host), Some(port)) => format!("{host}:{port}"),
                _ => "its master".to_owned(),
            };
            Check::fail(
                NAME,
                format!(
                    "a replica of {master}: it refuses writes (READONLY), or keeps them to itself where its master never sees them"
                ),
                format!(
                    "point the URL at the master ({master}), or use a redis+sentinel:// URL that follows failovers"
                ),
            )
        }
        other => Check::warn(
            NAME,
            format!("unknown role {:?}", other.unwrap_or("")),
            "point the URL at a Redis master",
        ),
    }
}

/// Whether the server says it is a replica.
pub(super) fn is_replica(info: &str) -> bool {
    info_field(info, "role") == Some("slave")
}

/// On a master with replicas: whether `min-replicas-to-write` keeps a
/// master that lost its replicas from granting (`None` on a replica).
pub(super) fn replication(info: &str) -> Option<Check> {
    const NAME: &str = "replication";
    if info_field(info, "role") != Some("master") {
        return None;
    }
    let replicas: u64 = info_field(info, "connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // Redis shows this field only while min-replicas-to-write is set.
    let good: Option<u64> = info_field(info, "min_slaves_good_slaves").and_then(|n| n.parse().ok());
    Some(match (replicas, good) {
        (_, Some(0)) => Check::fail(
            NAME,
            format!(
                "min-replicas-to-write is set and no replica is good ({replicas} connected): every write, so every grant, is refused (NOREPLICAS)"
            ),
            "bring the replicas back, or lower min-replicas-to-write",
        ),
        (_, Some(good)) => Check::ok(
            NAME,
            format!(
                "{replicas} replica(s), min-replicas-to-write set ({good} good): a master cut off from its replicas stops granting"
            ),
        ),
        (0, None) => Check::ok(NAME, "no replicas"),
        (replicas, None) => Check::warn(
            NAME,
            format!(
                "{replicas} replica(s) and min-replicas-to-write 0: after a failover the old master keeps granting for seconds (about 10 s measured with Sentinel) and two masters can issue the same fence"
            ),
            "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 1 on every master (and in redis.conf)",
        ),
    })
}

/// On a replica a failover could promote: whether it would stop granting
/// once cut off from its own replicas (`min-replicas-to-write`, which
/// Redis shows in `INFO` only while it is set).
pub(super) fn promoted_replication(info: &str) -> Check {
    const NAME: &str = "replication";
    if info_field(info, "min_slaves_good_slaves").is_some() {
        Check::ok(
            NAME,
            "min-replicas-to-write set: once promoted, it stops granting when cut off from its replicas",
        )
    } else {
        Check::warn(
            NAME,
            "min-replicas-to-write 0: once promoted, it keeps granting when cut off from its replicas, as a master without it does",
            "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 1 on every replica too (and in redis.conf): a replica keeps its own setting when promoted",
        )
    }
}

/// Whether a replica is never promoted (`replica-priority 0`).
pub(super) fn never_promoted(info: &str) -> bool {
    info_field(info, "slave_priority") == Some("0")
}

/// Whether an evicting memory policy can delete held locks.
pub(super) fn eviction(info: &str) -> Check {
    const NAME: &str = "eviction";
    match memory_policy(info) {
        Some(memory) if memory.evicts() => Check::warn(
            NAME,
            format!(
                "maxmemory-policy {} with maxmemory {} bytes: Redis may evict a held lock and let a second holder in",
                memory.policy, memory.limit
            ),
            "CONFIG SET maxmemory-policy noeviction (and in redis.conf)",
        ),
        Some(memory) if memory.limit == 0 => Check::ok(
            NAME,
            format!("no memory limit (maxmemory-policy {})", memory.policy),
        ),
        Some(memory) => Check::ok(NAME, format!("maxmemory-policy {}", memory.policy)),
        None => Check::warn(
            NAME,
            "unknown: INFO shows no maxmemory_policy",
            "set maxmemory-policy noeviction",
        ),
    }
}

/// Whether the append-only file is on.
pub(super) fn aof_enabled(info: &str) -> bool {
    info_field(info, "aof_enabled") == Some("1")
}

/// Whether the server keeps what the fence mode needs across a restart.
/// `fsync` is the `CONFIG GET appendfsync` reply, read only for counter
/// fences with the append-only file on.
pub(super) fn persistence(
    info: &str,
    mode: FenceMode,
    fsync: Option<&Reading<Vec<String>>>,
) -> Check {
    const NAME: &str = "persistence";
    const FIX: &str = "CONFIG SET appendonly yes and CONFIG SET appendfsync always (and in redis.conf), or use clock fences";
    let aof = aof_enabled(info);
    if info_field(info, "aof_enabled").is_none() {
        return Check::warn(
            NAME,
            "unknown: INFO shows no aof_enabled",
            "check that appendonly is yes and appendfsync always for counter fences",
        );
    }
    if aof && info_field(info, "aof_last_write_status") == Some("err") {
        return Check::fail(
            NAME,
            "the last write to the append-only file failed: acknowledged grants may not be on disk",
            "fix the disk Redis writes to (see its log)",
        );
    }
    match mode {
        FenceMode::Clock => Check::ok(
            NAME,
            if aof {
                "append-only file on; clock fences do not need it".to_owned()
            } else {
                "no append-only file: clock fences do not need one (they stay above every earlier fence after a restart), but a restart frees held locks (their fences still refuse the old holders)".to_owned()
            },
        ),
        FenceMode::Counter if !aof => Check::fail(
            NAME,
            "counter fences without the append-only file: a restart loses the counters, and fences start again from 1 below ones already issued",
            FIX,
        ),
        FenceMode::Counter => match fsync {
            Some(Reading::Got(reply)) => match reply.get(1).map(String::as_str) {
                Some("always") => Check::ok(
                    NAME,
                    "counter fences with appendonly yes and appendfsync always",
                ),
                Some(policy) => Check::warn(
                    NAME,
                    format!(
                        "counter fences with appendfsync {policy}: a crash of the host can lose the last fences issued (up to a second of them), and fences then repeat"
                    ),
                    "CONFIG SET appendfsync always (and in redis.conf)",
                ),
                None => Check::warn(
                    NAME,
                    "appendonly yes, appendfsync unknown (CONFIG GET gave no value)",
                    "check that appendfsync is always",
                ),
            },
            _ => Check::warn(
                NAME,
                "counter fences with appendonly yes; appendfsync unknown: the user may not run CONFIG GET",
                "check that appendfsync is always (CONFIG GET needs +config|get, which the README's rule leaves out: it can read passwords)",
            ),
        },
    }
}

/// The server's clock read between two readings of this host's clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClockReading {
    pub(super) server_us: u64,
    pub(super) local_before_us: u64,
    pub(super) local_after_us: u64,
}

/// Microseconds since the Unix epoch (0 for a clock before it).
pub(super) fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The server clock against this host's, within the uncertainty of the
/// round trip, and the jumps of the server clock locks taken with `ttl`
/// tolerate: a lease is renewed every third of its ttl and the server
/// expires it by its own clock, so a jump forward of two thirds of the ttl
/// or more can expire a held lease before its holder renews it (the next
/// holder gets in while the first still runs); a step back matters only to
/// clock fences, and only beyond the time since a lock's last grant.
pub(super) fn clock(reading: &ClockReading, ttl: Duration) -> Check {
    const NAME: &str = "clock";
    let midpoint = reading.local_before_us / 2 + reading.local_after_us / 2;
    let uncertainty = reading
        .local_after_us
        .saturating_sub(reading.local_before_us)
        / 2;
    let (apart, direction) = if reading.server_us >= midpoint {
        (reading.server_us - midpoint, "ahead of")
    } else {
        (midpoint - reading.server_us, "behind")
    };
    let found = format!(
        "the server clock is {} {direction} this host's (±{}); tolerated: any steady offset, a jump forward under {} (2/3 of the ttl {}; a larger one can expire held leases early), a step back under the time since a lock's last grant (clock fences)",
        show(Duration::from_micros(apart)),
        show(Duration::from_micros(uncertainty)),
        show(ttl * 2 / 3),
        show(ttl)
    );
    if Duration::from_micros(apart.saturating_sub(uncertainty)) > CLOCK_SKEW_WARN {
        Check::warn(
            NAME,
            found,
            "synchronise both clocks (NTP: chrony or systemd-timesyncd); clock fences come from the server clock, and a clock that is off gets stepped back some day",
        )
    } else {
        Check::ok(NAME, found)
    }
}

/// What a scan of the fence keys found.
#[derive(Debug, Clone, Default)]
pub(super) struct FenceScan {
    /// Fence keys seen.
    pub(super) keys: u64,
    /// Clock fences among them.
    pub(super) clock_fences: u64,
    /// The highest clock fence and its key.
    pub(super) highest: Option<(u64, String)>,
}

impl FenceScan {
    /// Counts fence key `key` holding `value`.
    pub(super) fn add(&mut self, key: &str, value: Option<&str>) {
        self.keys += 1;
        let Some(fence) = value.and_then(|v| v.parse::<u64>().ok()) else {
            return;
        };
        if fence < CLOCK_FENCE_FLOOR {
            return;
        }
        self.clock_fences += 1;
        if self.highest.as_ref().is_none_or(|(h, _)| fence > *h) {
            self.highest = Some((fence, key.to_owned()));
        }
    }

    /// Adds the scan of another node.
    pub(super) fn merge(&mut self, other: FenceScan) {
        self.keys += other.keys;
        self.clock_fences += other.clock_fences;
        if let Some((fence, key)) = other.highest
            && self.highest.as_ref().is_none_or(|(h, _)| fence > *h)
        {
            self.highest = Some((fence, key));
        }
    }
}

/// The server clock (`now_us`, read after the scan) against the highest
/// stored clock fence.
pub(super) fn fences(scan: &FenceScan, now_us: u64, prefix: &str) -> Check {
    const NAME: &str = "fences";
    let Some((highest, key)) = &scan.highest else {
        return Check::ok(
            NAME,
            format!(
                "no clock fences under {prefix} ({} fence key(s))",
                scan.keys
            ),
        );
    };
    if *highest > now_us {
        return Check::fail(
            NAME,
            format!(
                "the server clock is {} behind the highest clock fence ({key} = {highest}): new grants still get that fence + 1 while the key exists, but once a fence key is lost (expiry, eviction, a restart without persistence, a failover) the next fence comes from this clock and goes backwards, below fences already issued: a stale holder's higher fence then beats the new holder at the resource",
                show(Duration::from_micros(highest - now_us))
            ),
            "find why this server's clock is behind (a failover to a server whose clock is slow, a clock stepped back) and fix it (NTP); until the clock passes the fence keep the fence keys (no FLUSHALL, persistence on)",
        );
    }
    Check::ok(
        NAME,
        format!(
            "the server clock is past all {} clock fence(s) under {prefix} (the highest, {key}, by {})",
            scan.clock_fences,
            show(Duration::from_micros(now_us - highest))
        ),
    )
}

/// The permission probe's findings.
pub(super) fn permissions(probe: &ProbeReport) -> Check {
    const NAME: &str = "permissions";
    if probe.missing.is_empty() && probe.failures.is_empty() {
        let mut found = "the user ran every operation fencelock uses: grant, renew, queue, hand over, release, fenced write, wake-ups, SCAN, INFO".to_owned();
        if !probe.leftover.is_empty() {
            found.push_str(&format!(
                "; the probe's keys {} are left to expire",
                probe.leftover.join(", ")
            ));
        }
        return Check::ok(NAME, found);
    }
    let mut found: Vec<String> = probe
        .missing
        .iter()
        .map(|m| {
            let needed = match m.need {
                Need::Locks(what) => what.to_owned(),
                Need::Feature(what) => what.to_owned(),
            };
            format!("{} (needed for {needed})", m.detail)
        })
        .collect();
    if !found.is_empty() {
        found[0] = format!("the user may not {}", found[0]);
    }
    found.extend(probe.failures.iter().cloned());
    let fixes: Vec<&str> = probe.missing.iter().map(|m| m.fix.as_str()).collect();
    let fix = if fixes.is_empty() {
        "see the error".to_owned()
    } else {
        format!(
            "add {} to the user's ACL rule (the README's \"Redis permissions\" has the whole rule), then run the audit again: each operation stops at its first refusal",
            fixes.join(" ")
        )
    };
    let failed = !probe.failures.is_empty()
        || probe
            .missing
            .iter()
            .any(|m| matches!(m.need, Need::Locks(_)));
    if failed {
        Check::fail(NAME, found.join("; "), fix)
    } else {
        Check::warn(NAME, found.join("; "), fix)
    }
}

/// The median of sorted round-trip samples against the ttl.
pub(super) fn rtt(sorted: &[Duration], ttl: Duration) -> Check {
    const NAME: &str = "rtt";
    let Some(median) = sorted.get(sorted.len() / 2).copied() else {
        return Check::warn(NAME, "not measured", "run the audit again");
    };
    let max = sorted.last().copied().unwrap_or(median);
    let found = format!(
        "median {} of {} PINGs (max {}), ttl {}",
        show(median),
        sorted.len(),
        show(max),
        show(ttl)
    );
    if median > ttl / RTT_WARN_FRACTION {
        Check::warn(
            NAME,
            format!("{found}: a round trip above 1/{RTT_WARN_FRACTION} of the ttl"),
            "raise the ttl, or run closer to Redis",
        )
    } else {
        Check::ok(NAME, found)
    }
}

/// A duration for people: `0.12 ms`, `12.3 ms`, `4.2 s`, `2.5 min`, `3.0 h`.
fn show(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1.0 {
        let ms = secs * 1000.0;
        if ms < 1.0 {
            format!("{ms:.2} ms")
        } else {
            format!("{ms:.1} ms")
        }
    } else if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    }
}

#[cfg(test)]
mod tests;
