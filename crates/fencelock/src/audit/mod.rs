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
//! ## Replicas a failover could promote
//!
//! Behind Sentinel (the replicas the sentinels list) and in a Cluster
//! (every replica node), each replica gets rows of its own, named
//! `CHECK@HOST:PORT`, after the masters' rows: what it would bring to the
//! master's place once promoted.
//!
//! | check | reads | OK | WARN | FAIL |
//! |---|---|---|---|---|
//! | `replica` | `INFO replication` on the replica | a replica that could be promoted (its rows follow), or one with `replica-priority 0` (never promoted, not audited) | not reachable from this host: not audited | |
//! | `version`, `eviction`, `persistence`, `clock` | as on a master | as on a master | as on a master | as on a master |
//! | `replication` | `INFO replication` | `min-replicas-to-write` set: once promoted it stops granting when cut off | not set (advisory): a replica keeps its own setting when promoted | |
//! | `fences` | `TIME` on the replica | its clock is past the highest clock fence the masters store | | a clock fence ahead of its clock: once promoted, a lost fence key makes fences go backwards |
//!
//! The replicas are reached directly, with the URL's credentials and TLS
//! settings, at the address the sentinels or the Cluster announce.
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
//! | `rtt` | median of 5 linearizable reads | under 1/20 of the ttl | more (advisory) | none answered: no quorum |
//!
//! Every etcd probe is bounded (2 s): the members' `Status` calls run at
//! once, and the cluster's probes (alarms, lease, reads) go to any member
//! that answers, so with a member paused the audit ends within two probe
//! timeouts, and an unanswered probe is a row, not a failed audit. Only a
//! cluster of which no member answers the member list fails it.
//!
//! | module | concern |
//! |---|---|
//! | `report` | [`Audit`], its [`Check`] rows and their [`Status`] |
//! | `redis` | the audit of a Redis deployment: the rows of every master, the probe, the round trip |
//! | `checks` | each row from what the server reported: pure functions, tested without Redis |
//! | `promotable` | the rows of a replica a failover could promote |
//! | `probe` | the permission probe: fencelock's operations on a probe lock, and what was refused |
//! | `etcd` | the rows of an etcd cluster (feature `etcd`) |

mod checks;
#[cfg(feature = "etcd")]
mod etcd;
mod probe;
mod promotable;
mod redis;
mod report;

#[cfg(feature = "etcd")]
pub(crate) use etcd::run as etcd;
pub(crate) use redis::run as redis;
pub use report::{Audit, Check, Status};
