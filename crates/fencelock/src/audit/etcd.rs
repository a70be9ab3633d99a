//! The audit of an etcd cluster: what each member reports about itself
//! (health, leader, version, database size), the alarms, etcd's shortest
//! lease against the ttl, and the round trip. Rows are pure functions of
//! what was read, tested without etcd.

use std::time::Duration;

use tokio::time::Instant;

use super::report::{Audit, Check};
use crate::error::Result;
use crate::options::LockOptions;
use crate::store::etcd::{EtcdConn, Status, is_transient};

/// etcd's default database quota (`--quota-backend-bytes` 0 means 2 GiB).
const DEFAULT_QUOTA: i64 = 2 * 1024 * 1024 * 1024;

/// How long one probe may take: one member's `Status`, the member list,
/// the alarms, the lease probe. Probes of different members run at once,
/// so with a member paused the audit ends within [`AUDIT_TIME`].
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// What the whole audit may take: two probe timeouts (one for the member
/// list, one for the members' and the cluster's probes, which run at
/// once). The linearizable reads are retried within it while an election
/// (a member just died, a leader moved) refuses them.
const AUDIT_TIME: Duration = Duration::from_secs(4);

/// A member as `MemberList` names it, and what its `Status` said.
pub(super) struct MemberReport {
    pub(super) name: String,
    pub(super) endpoint: String,
    pub(super) status: std::result::Result<Status, String>,
}

/// What the probes through the connection found: a row's input, or why it
/// could not be read.
struct ClusterProbes {
    rtt: std::result::Result<Vec<Duration>, String>,
    alarms: std::result::Result<Vec<String>, String>,
    shortest: std::result::Result<Duration, String>,
}

/// Runs the audit of the etcd cluster behind `conn`. Every probe is
/// bounded: a member that does not answer is a row (health), not a failed
/// audit; only a cluster of which no member answers fails it.
pub(crate) async fn run(conn: &EtcdConn, opts: &LockOptions) -> Result<Audit> {
    let started = Instant::now();
    let list = member_list(conn).await?;
    let deadline = started + AUDIT_TIME;
    let (members, cluster) = tokio::join!(members(conn, &list), cluster_probes(conn, deadline));
    let mut rows = vec![
        members_row(&members),
        health(&members),
        leader(&members),
        version(&members),
        match &cluster.alarms {
            Ok(alarms) => db_size(&members, alarms),
            Err(e) => db_size_unread(&members, e),
        },
        match cluster.shortest {
            Ok(shortest) => lease(shortest, opts.ttl_value()),
            Err(e) => Check::warn(
                "lease",
                format!("not measured: {e}"),
                "audit again once the cluster has a quorum",
            ),
        },
    ];
    rows.push(match &cluster.rtt {
        Ok(rtt) => super::checks::rtt(rtt, opts.ttl_value()).renamed_reads(),
        Err(e) => Check::fail(
            "rtt",
            format!("no linearizable read answered: {e}"),
            "restore the quorum (bring a majority of the members back): without it nothing is granted, renewed or released",
        ),
    });
    Ok(Audit::new(conn.url(), rows))
}

/// The member list, from whichever listed member answers first (each
/// asked at once, within [`PROBE_TIMEOUT`]; a member without a quorum
/// still answers it).
///
/// # Errors
/// The last member's error when none answers.
async fn member_list(conn: &EtcdConn) -> Result<etcd_client::MemberListResponse> {
    let asks = conn.endpoints().map(|endpoint| {
        Box::pin(async move {
            let ask = async {
                let mut client = conn.member(endpoint).await?;
                client
                    .member_list()
                    .await
                    .map_err(|e| conn.error(e, "listing the members"))
            };
            match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
                Ok(list) => list,
                Err(_) => Err(conn.error(
                    etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(format!(
                        "no answer from {endpoint} within {PROBE_TIMEOUT:?}"
                    ))),
                    "listing the members",
                )),
            }
        })
    });
    futures_util::future::select_ok(asks)
        .await
        .map(|(list, _)| list)
}

/// `call`, given at most `limit`.
async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> std::result::Result<T, etcd_client::Error> {
    match tokio::time::timeout(limit, call).await {
        Ok(reply) => reply,
        Err(_) => Err(etcd_client::Error::GRpcStatus(
            tonic::Status::deadline_exceeded(format!("no answer within {limit:?}")),
        )),
    }
}

/// The probes sent through the connection (to any member that answers),
/// all at once, each by `deadline`.
async fn cluster_probes(conn: &EtcdConn, deadline: Instant) -> ClusterProbes {
    let limit = || deadline.saturating_duration_since(Instant::now());
    let alarms = async {
        bounded(limit(), conn.alarms())
            .await
            .map(|a| {
                a.alarms()
                    .iter()
                    .map(|m| format!("{:?} on {:x}", m.alarm(), m.member_id()))
                    .collect::<Vec<_>>()
            })
            .map_err(|e| conn.error(e, "reading the alarms").to_string())
    };
    let shortest = async {
        shortest_lease(conn, limit().min(PROBE_TIMEOUT))
            .await
            .map_err(|e| e.to_string())
    };
    let (rtt, alarms, shortest) = tokio::join!(round_trips(conn, deadline), alarms, shortest);
    ClusterProbes {
        rtt: rtt.map_err(|e| e.to_string()),
        alarms,
        shortest,
    }
}

impl Check {
    /// The `rtt` row, saying it measured reads rather than PINGs.
    fn renamed_reads(mut self) -> Self {
        self.found = self.found.replace("PINGs", "linearizable reads");
        self.fix = self
            .fix
            .map(|f| f.replace("closer to Redis", "closer to etcd"));
        self
    }
}

/// Every member of `list`, each asked for its `Status` on its first client
/// URL, all at once, each within [`PROBE_TIMEOUT`].
async fn members(conn: &EtcdConn, list: &etcd_client::MemberListResponse) -> Vec<MemberReport> {
    let asks = list.members().iter().map(|member| async move {
        let name = if member.name().is_empty() {
            format!("{:x} (not started)", member.id())
        } else {
            member.name().to_owned()
        };
        let Some(endpoint) = member.client_urls().first().cloned() else {
            return MemberReport {
                name,
                endpoint: String::new(),
                status: Err("no client URL (not started yet)".to_owned()),
            };
        };
        let status = member_status(conn, &endpoint).await;
        MemberReport {
            name,
            endpoint,
            status,
        }
    });
    futures_util::future::join_all(asks).await
}

async fn member_status(conn: &EtcdConn, endpoint: &str) -> std::result::Result<Status, String> {
    let ask = async {
        let mut client = conn.member(endpoint).await.map_err(|e| e.to_string())?;
        client.status().await.map_err(|e| e.to_string())
    };
    let reply = tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .map_err(|_| format!("no answer within {PROBE_TIMEOUT:?}"))??;
    let header = reply.header();
    Ok(Status {
        endpoint: endpoint.to_owned(),
        member_id: header.map_or(0, etcd_client::ResponseHeader::member_id),
        leader: reply.leader(),
        version: reply.version().to_owned(),
        db_size: reply.db_size(),
        raft_term: header.map_or(0, etcd_client::ResponseHeader::raft_term),
        revision: header.map_or(0, etcd_client::ResponseHeader::revision),
        errors: reply.errors().to_vec(),
    })
}

/// The round trips of a few linearizable reads (a quorum round each),
/// sorted, read by `deadline`.
///
/// An election in progress (a member just died, a leader moved) refuses
/// reads for a moment: they are retried until the deadline, so the audit
/// reports the cluster after the election instead of failing.
async fn round_trips(conn: &EtcdConn, deadline: Instant) -> Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(super::checks::PINGS);
    let key = format!("{}fencelock-doctor-rtt", conn.namespace());
    for _ in 0..super::checks::PINGS {
        loop {
            let sent = Instant::now();
            let left = deadline.saturating_duration_since(sent);
            match bounded(left, conn.get(&key, None)).await {
                Ok(_) => {
                    samples.push(sent.elapsed());
                    break;
                }
                Err(e)
                    if is_transient(&e)
                        && Instant::now() + Duration::from_millis(100) < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(conn.error(e, "reading")),
            }
        }
    }
    samples.sort();
    Ok(samples)
}

/// etcd's shortest lease: the ttl it grants for a 1 s request (a lease of
/// its own, revoked at once), within `limit`.
async fn shortest_lease(conn: &EtcdConn, limit: Duration) -> Result<Duration> {
    let lease = bounded(limit, conn.lease_grant(1))
        .await
        .map_err(|e| conn.error(e, "granting a probe lease"))?;
    let _ = bounded(PROBE_TIMEOUT, conn.lease_revoke(lease.id())).await;
    Ok(Duration::from_secs(lease.ttl().unsigned_abs()))
}

fn answering(members: &[MemberReport]) -> impl Iterator<Item = &Status> {
    members.iter().filter_map(|m| m.status.as_ref().ok())
}

pub(super) fn members_row(members: &[MemberReport]) -> Check {
    const NAME: &str = "members";
    let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
    let found = format!("{} member(s): {}", members.len(), names.join(", "));
    match members.len() {
        1 => Check::warn(
            NAME,
            format!("{found}: no fault tolerance"),
            "run 3 (or 5) members: with one, its crash stops every lock, and its disk holds the only copy",
        ),
        n if n % 2 == 0 => Check::warn(
            NAME,
            format!("{found}: an even number tolerates no more failures than one member less"),
            "run an odd number of members (3 or 5)",
        ),
        _ => Check::ok(NAME, found),
    }
}

pub(super) fn health(members: &[MemberReport]) -> Check {
    const NAME: &str = "health";
    let down: Vec<String> = members
        .iter()
        .filter_map(|m| match &m.status {
            Ok(s) if s.errors.is_empty() => None,
            Ok(s) => Some(format!("{} ({})", m.name, s.errors.join("; "))),
            Err(e) => Some(format!("{} at {} ({e})", m.name, m.endpoint)),
        })
        .collect();
    let up = members.len() - down.len();
    let quorum = members.len() / 2 + 1;
    let found = format!("{up} of {} members answer", members.len());
    if down.is_empty() {
        Check::ok(NAME, found)
    } else if up >= quorum {
        Check::warn(
            NAME,
            format!("{found}; down: {}", down.join(", ")),
            "bring the members back: one more failure may stop every lock",
        )
    } else {
        Check::fail(
            NAME,
            format!("{found}; down: {}: no quorum", down.join(", ")),
            "bring a majority of the members back: without a quorum nothing is granted, renewed or released",
        )
    }
}

pub(super) fn leader(members: &[MemberReport]) -> Check {
    const NAME: &str = "leader";
    let leaders: Vec<u64> = {
        let mut ids: Vec<u64> = answering(members).map(|s| s.leader).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let named = |id: u64| {
        members
            .iter()
            .find(|m| m.status.as_ref().is_ok_and(|s| s.member_id == id))
            .map_or_else(|| format!("{id:x}"), |m| m.name.clone())
    };
    match leaders.as_slice() {
        [id] if *id != 0 => {
            let term = answering(members).map(|s| s.raft_term).max().unwrap_or(0);
            Check::ok(NAME, format!("{} leads (raft term {term})", named(*id)))
        }
        [] | [0] => Check::fail(
            NAME,
            "no member knows a leader",
            "restore the quorum: without a leader nothing is granted, renewed or released",
        ),
        many => Check::fail(
            NAME,
            format!(
                "members disagree on the leader: {}",
                many.iter()
                    .map(|id| named(*id))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "check the network between the members (a partition is being resolved)",
        ),
    }
}

pub(super) fn version(members: &[MemberReport]) -> Check {
    const NAME: &str = "version";
    let mut versions: Vec<&str> = answering(members).map(|s| s.version.as_str()).collect();
    versions.sort_unstable();
    versions.dedup();
    let revision = answering(members).map(|s| s.revision).max().unwrap_or(0);
    let found = format!("etcd {}, revision {revision}", versions.join(", "));
    let old = versions.iter().any(|v| {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (3, 4)
    });
    if versions.is_empty() {
        Check::warn(NAME, "no member answered", "bring the members back")
    } else if old {
        Check::warn(
            NAME,
            format!("{found}: older than 3.4, which fencelock is tested with"),
            "upgrade etcd to 3.4 or newer",
        )
    } else if versions.len() > 1 {
        Check::warn(
            NAME,
            format!("{found}: mixed versions"),
            "finish the rolling upgrade",
        )
    } else {
        Check::ok(NAME, found)
    }
}

pub(super) fn db_size(members: &[MemberReport], alarms: &[String]) -> Check {
    const NAME: &str = "db size";
    let largest = answering(members).map(|s| s.db_size).max().unwrap_or(0);
    let found = format!(
        "largest {:.1} MiB of a {} GiB quota",
        largest as f64 / (1024.0 * 1024.0),
        DEFAULT_QUOTA / (1024 * 1024 * 1024)
    );
    if !alarms.is_empty() {
        return Check::fail(
            NAME,
            format!("{found}; alarms: {}", alarms.join(", ")),
            "compact and defragment (etcdctl compact, etcdctl defrag), then etcdctl alarm disarm: etcd refuses writes while NOSPACE is raised",
        );
    }
    if largest > DEFAULT_QUOTA / 10 * 8 {
        Check::warn(
            NAME,
            format!("{found}: above 80 %"),
            "compact and defragment, or raise --quota-backend-bytes, before etcd refuses writes",
        )
    } else {
        Check::ok(NAME, found)
    }
}

/// The `db size` row when the alarms could not be read.
fn db_size_unread(members: &[MemberReport], why: &str) -> Check {
    let row = db_size(members, &[]);
    Check::warn(
        "db size",
        format!("{}; the alarms could not be read: {why}", row.found()),
        "audit again once the cluster has a quorum",
    )
}

pub(super) fn lease(shortest: Duration, ttl: Duration) -> Check {
    const NAME: &str = "lease";
    let found = format!(
        "etcd's shortest lease is {} s, ttl {}",
        shortest.as_secs(),
        humanish(ttl)
    );
    if shortest > ttl {
        Check::warn(
            NAME,
            format!(
                "{found}: a crashed holder keeps its lock for {} s",
                shortest.as_secs()
            ),
            "use a ttl of at least etcd's shortest lease (1.5 election timeouts, rounded up to whole seconds): fencelock's own deadline is the ttl, etcd's is longer",
        )
    } else {
        Check::ok(NAME, found)
    }
}

fn humanish(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Status as Outcome;

    fn member(name: &str, id: u64, leader: u64, version: &str) -> MemberReport {
        MemberReport {
            name: name.to_owned(),
            endpoint: format!("http://{name}:2379"),
            status: Ok(Status {
                endpoint: format!("http://{name}:2379"),
                member_id: id,
                leader,
                version: version.to_owned(),
                db_size: 1 << 20,
                raft_term: 3,
                revision: 42,
                errors: Vec::new(),
            }),
        }
    }

    fn down(name: &str) -> MemberReport {
        MemberReport {
            name: name.to_owned(),
            endpoint: format!("http://{name}:2379"),
            status: Err("connection refused".to_owned()),
        }
    }

    #[test]
    fn three_healthy_members_pass() {
        let m = [
            member("a", 1, 2, "3.4.23"),
            member("b", 2, 2, "3.4.23"),
            member("c", 3, 2, "3.4.23"),
        ];
        assert_eq!(members_row(&m).status(), Outcome::Ok);
        assert_eq!(health(&m).status(), Outcome::Ok);
        let l = leader(&m);
        assert_eq!(l.status(), Outcome::Ok);
        assert!(l.found().starts_with("b leads"), "{}", l.found());
        assert_eq!(version(&m).status(), Outcome::Ok);
        assert_eq!(db_size(&m, &[]).status(), Outcome::Ok);
    }

    #[test]
    fn a_lost_quorum_fails_and_a_lost_minority_warns() {
        let one_down = [
            member("a", 1, 1, "3.4.23"),
            member("b", 2, 1, "3.4.23"),
            down("c"),
        ];
        assert_eq!(health(&one_down).status(), Outcome::Warn);
        let two_down = [member("a", 1, 0, "3.4.23"), down("b"), down("c")];
        assert_eq!(health(&two_down).status(), Outcome::Fail);
        assert_eq!(leader(&two_down).status(), Outcome::Fail);
    }

    #[test]
    fn single_members_old_versions_alarms_and_long_leases_are_named() {
        assert_eq!(
            members_row(&[member("a", 1, 1, "3.4.23")]).status(),
            Outcome::Warn
        );
        assert_eq!(
            version(&[member("a", 1, 1, "3.3.9")]).status(),
            Outcome::Warn
        );
        assert_eq!(
            db_size(&[member("a", 1, 1, "3.4.23")], &["Nospace on 1".into()]).status(),
            Outcome::Fail
        );
        assert_eq!(
            lease(Duration::from_secs(2), Duration::from_millis(500)).status(),
            Outcome::Warn
        );
        assert_eq!(
            lease(Duration::from_secs(1), Duration::from_secs(10)).status(),
            Outcome::Ok
        );
        let split = [member("a", 1, 1, "3.4.23"), member("b", 2, 2, "3.4.23")];
        assert_eq!(leader(&split).status(), Outcome::Fail);
    }
}
