//! The permission probe: fencelock's own operations, run on a probe lock
//! under the client's prefix, and what the server refused.
//!
//! An ACL user's permissions cannot be read without permissions of their
//! own (`ACL GETUSER`; `ACL DRYRUN` needs Redis 7.2), so the probe does what
//! fencelock does: load a script, grant, renew, inspect, queue a waiter,
//! release (which hands the lock over to it), leave, write and register a
//! fenced hash and read it, publish and subscribe on a wake-up channel,
//! `SCAN` and `ZCARD` (for `top`). Each refusal is a [`Missing`] permission
//! named as [`Error::NoPermission`] names it. A script stops at its first
//! refused command, so one run may not find every missing permission.
//!
//! Everything runs on keys of a name of its own (`fencelock-doctor-ID`), so
//! no real lock is touched, and without metrics or stats. The keys are
//! deleted at the end; keys the user may not delete expire (the lock after
//! its ttl, the queue after two waiter leases, a clock fence after its
//! retention), except a counter fence key and the probe hash.

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::holder::new_token;
use crate::keys::glob_escape;
use crate::keys::{KeyLayout, LockKeys};
use crate::options::{LockOptions, WaitMode};
use crate::store::redis::ops::{
    Change, Extend, FencedWrite, Grant, GrantReply, Inspect, Leave, Mint, PassOn, PermitGrant,
    PermitGrantReply, PermitKind, Publish, Release, SemExtend, SemInspect, SemLeaving, SemRelease,
};
use crate::store::redis::scripts;
use crate::store::redis::wire::{QueueMember, lock_value, wake_channel};
use crate::store::redis::{Event, PubSub, RedisConn};

/// Lock operations: without them locks do not work (FAIL).
const LOCKS: &str = "taking, renewing and releasing locks";
/// Waiting in a queue: notify and fair waiters are refused without it.
const QUEUE: &str = "waiting in notify and fair mode";
/// Reading a lock's state.
const STATUS: &str = "fencelock status and top";
/// Fenced Redis hashes.
const HASHES: &str = "fenced Redis hashes (FencedHash, fencelock read/write/update)";
/// What the semaphore's calls are for.
const SEMAPHORES: &str = "semaphores (permits: grant, renewal, release, status)";
/// Pub/sub wake-ups.
const WAKEUPS: &str = "wake-ups: waiters poll instead";
/// `fencelock top` (and the audit's fence scan).
pub(super) const TOP: &str = "fencelock top and the audit's fence scan";
/// `INFO`.
pub(super) const INFO: &str = "the eviction warning at connect and the audit's server checks";

/// The ttl of the probe lock: if the user may not delete it, it is gone
/// soon anyway.
const PROBE_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// What a missing permission breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    /// Locks themselves: a FAIL.
    Locks(&'static str),
    /// A feature that degrades or fails while locks keep working: a WARN.
    Feature(&'static str),
}

/// A refused operation.
#[derive(Debug, Clone)]
pub(super) struct Missing {
    /// What the user may not do, e.g. "run the command ZADD".
    pub(super) detail: String,
    /// What to add to its rule, e.g. "+zadd".
    pub(super) fix: String,
    pub(super) need: Need,
}

/// What the probe found.
#[derive(Debug, Clone, Default)]
pub(super) struct ProbeReport {
    /// Refused permissions, one per fix, the most severe need kept.
    pub(super) missing: Vec<Missing>,
    /// Operations that failed for another reason.
    pub(super) failures: Vec<String>,
    /// Probe keys that could not be deleted.
    pub(super) leftover: Vec<String>,
    /// The channel pattern of the prefix (`&lock:*`), named for any refused
    /// channel: a refused subscription does not say which channel it was.
    channels: Option<String>,
}

impl ProbeReport {
    /// Records the refusal `e` (a [`Error::NoPermission`]).
    pub(super) fn refused(&mut self, e: &Error, need: Need) {
        let Error::NoPermission { detail, fix } = e else {
            return;
        };
        // "a key pattern that covers it, such as ~lock:*": the rule part.
        let fix = fix
            .rsplit_once("such as ")
            .map_or(fix.as_str(), |(_, part)| part);
        let fix = match &self.channels {
            Some(channels) if fix.starts_with('&') => channels.as_str(),
            _ => fix,
        };
        match self.missing.iter_mut().find(|m| m.fix == fix) {
            Some(known) => {
                if matches!(need, Need::Locks(_)) {
                    known.need = need;
                }
            }
            None => self.missing.push(Missing {
                detail: detail.clone(),
                fix: fix.to_owned(),
                need,
            }),
        }
    }

    /// The value of `result`, or `None` after recording why there is none.
    /// A connection error ends the probe.
    fn note<T>(&mut self, result: Result<T>, need: Need) -> Result<Option<T>> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(e @ Error::NoPermission { .. }) => {
                self.refused(&e, need);
                Ok(None)
            }
            // A reply of the server (READONLY, say) is a finding; only a
            // lost connection ends the probe.
            Err(e) if e.is_connection() && !is_server_reply(&e) => Err(e),
            Err(e) => {
                let what = match need {
                    Need::Locks(what) | Need::Feature(what) => what,
                };
                self.failures.push(format!("{what} failed: {e}"));
                Ok(None)
            }
        }
    }
}

/// Whether `e` is a reply of the server that the client treats as
/// transient (`READONLY`, `MASTERDOWN`, `LOADING`, …), not a lost
/// connection.
fn is_server_reply(e: &Error) -> bool {
    matches!(e, Error::Unreachable { source, .. } if source.code().is_some())
}

/// Runs the probe for locks under `prefix` taken with `opts`.
pub(super) async fn run(conn: &RedisConn, prefix: &str, opts: &LockOptions) -> Result<ProbeReport> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let keys = LockKeys::new(prefix, opts.layout, &format!("fencelock-doctor-{id}"))?;
    // Under the prefix, and no other lock's key in either layout.
    let resource = format!("{}:probe", keys.lock());
    let opts = opts.clone().ttl(PROBE_TTL);
    let mut report = ProbeReport {
        channels: Some(format!("&{}*", glob_escape(prefix))),
        ..ProbeReport::default()
    };

    report.note(
        conn.cmd::<String>(
            keys.lock(),
            // The inspect script's source: `SCRIPT LOAD` is probed even when
            // the server has every script cached already.
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(scripts::INSPECT.source),
        )
        .await,
        Need::Locks(LOCKS),
    )?;
    let fence = locks(conn, &keys, &opts, &id, &mut report).await?;
    // A semaphore of its own (a hash where the probe lock is a string), in
    // the layout semaphores use.
    let sem_keys = LockKeys::new(
        prefix,
        KeyLayout::HashTagged,
        &format!("fencelock-doctor-{id}-permits"),
    )?;
    semaphores(conn, &sem_keys, &opts, &mut report).await?;
    fenced_hash(conn, &resource, fence, &mut report).await?;
    wakeups(conn, &keys, &id, &mut report).await?;
    report.note(
        conn.cmd::<(u64, Vec<String>)>(
            "",
            redis::cmd("SCAN")
                .arg(0)
                .arg("MATCH")
                .arg(glob_escape(keys.lock()))
                .arg("COUNT")
                .arg(10),
        )
        .await,
        Need::Feature(TOP),
    )?;
    report.note(
        conn.cmd::<u64>(&keys.queue(), redis::cmd("ZCARD").arg(keys.queue()))
            .await,
        Need::Feature(TOP),
    )?;

    // Each lock's keys share a Cluster slot, two locks' need not: one DEL
    // per lock.
    let probe_keys = [
        keys.lock(),
        &keys.fence(),
        &keys.queue(),
        &keys.waiters(),
        &resource,
    ];
    let sem_probe_keys = [sem_keys.lock(), &sem_keys.fence()];
    for (lock, all) in [
        (keys.lock(), &probe_keys[..]),
        (sem_keys.lock(), &sem_probe_keys[..]),
    ] {
        let deleted = report.note(
            conn.cmd::<u64>(lock, redis::cmd("DEL").arg(all)).await,
            Need::Locks(LOCKS),
        )?;
        if deleted.is_none() {
            report.leftover.extend(all.iter().map(|k| (*k).to_owned()));
        }
    }
    Ok(report)
}

/// Grant, renew, inspect; a fair waiter queues; the release hands the lock
/// over to it; it leaves (releasing what it was handed). Returns the probe
/// lock's fence if it was granted.
async fn locks(
    conn: &RedisConn,
    keys: &LockKeys,
    opts: &LockOptions,
    id: &str,
    report: &mut ProbeReport,
) -> Result<Option<Fence>> {
    let mint = Mint::new(opts);
    let holder = new_token();
    let waiter = new_token();
    let granted = report.note(
        conn.run(&grant(keys, opts, &holder, WaitMode::Poll, None))
            .await,
        Need::Locks(LOCKS),
    )?;
    let fence = match granted {
        Some(GrantReply::Granted(fence)) => fence,
        Some(other) => {
            report.failures.push(format!(
                "the probe lock {} was not granted ({other:?})",
                keys.lock()
            ));
            return Ok(None);
        }
        None => return Ok(None),
    };
    let value = lock_value(&holder, fence, opts.layout);
    report.note(
        conn.run(&Extend {
            key: keys.lock(),
            value: &value,
            ttl: opts.ttl,
        })
        .await,
        Need::Locks(LOCKS),
    )?;
    report.note(conn.run(&Inspect::of(keys)).await, Need::Locks(STATUS))?;
    let member = QueueMember {
        client: id.to_owned(),
        waiter: 1,
        mode: WaitMode::Fair,
        ttl: opts.ttl,
        handover: opts.handover_lease(),
        token: waiter.clone(),
        access: None,
    };
    let queued = report.note(
        conn.run(&grant(keys, opts, &waiter, WaitMode::Fair, Some(&member)))
            .await,
        Need::Locks(QUEUE),
    )?;
    let pass_on = PassOn {
        publish: conn.publish(),
    };
    report.note(
        conn.run(&Release {
            lock: keys.lock(),
            mint,
            pass_on,
            value: &value,
            wake_first: false,
        })
        .await,
        Need::Locks(LOCKS),
    )?;
    if queued.is_some() {
        report.note(
            conn.run(&Leave {
                keys,
                mint,
                pass_on,
                member: &member,
            })
            .await,
            Need::Locks(QUEUE),
        )?;
    }
    Ok(Some(fence))
}

/// A permit of a semaphore of one: grant, renew, inspect, release.
async fn semaphores(
    conn: &RedisConn,
    keys: &LockKeys,
    opts: &LockOptions,
    report: &mut ProbeReport,
) -> Result<()> {
    let holder = new_token();
    let granted = report.note(
        conn.run(&PermitGrant {
            keys,
            mint: Mint::new(opts),
            token: &holder,
            ttl: opts.ttl,
            wait_mode: WaitMode::Poll,
            kind: PermitKind::Slots(1),
            member: None,
            waiter_lease: opts.waiter_lease,
            queued: false,
        })
        .await,
        Need::Feature(SEMAPHORES),
    )?;
    let Some(PermitGrantReply::Granted { fence, field }) = granted else {
        if let Some(other) = granted {
            report.failures.push(format!(
                "the probe semaphore {} was not granted ({other:?})",
                keys.lock()
            ));
        }
        return Ok(());
    };
    let ident = lock_value(&holder, fence, KeyLayout::HashTagged);
    report.note(
        conn.run(&SemExtend {
            permits: &[(keys.lock(), field, &ident)],
            ttl: opts.ttl,
        })
        .await,
        Need::Feature(SEMAPHORES),
    )?;
    report.note(
        conn.run(&SemInspect::of(keys)).await,
        Need::Feature(SEMAPHORES),
    )?;
    report.note(
        conn.run(&SemRelease {
            lock: keys.lock(),
            mint: Mint::new(opts),
            pass_on: PassOn {
                publish: conn.publish(),
            },
            what: SemLeaving::Permit {
                field,
                ident: &ident,
            },
        })
        .await,
        Need::Feature(SEMAPHORES),
    )?;
    Ok(())
}

/// A first grant attempt of `token`.
fn grant<'a>(
    keys: &'a LockKeys,
    opts: &LockOptions,
    token: &'a str,
    wait_mode: WaitMode,
    member: Option<&'a QueueMember>,
) -> Grant<'a> {
    Grant {
        keys,
        mint: Mint::new(opts),
        token,
        ttl: opts.ttl,
        wait_mode,
        member,
        waiter_lease: opts.waiter_lease,
        queued: false,
    }
}

/// A fenced write, a registration and a read of the probe hash.
async fn fenced_hash(
    conn: &RedisConn,
    resource: &str,
    fence: Option<Fence>,
    report: &mut ProbeReport,
) -> Result<()> {
    let fence = fence.unwrap_or(Fence::new(1));
    let holder = new_token();
    for change in [Change::Write("fencelock doctor"), Change::Register] {
        report.note(
            conn.run(&FencedWrite {
                key: resource,
                fence,
                holder: &holder,
                change,
            })
            .await,
            Need::Feature(HASHES),
        )?;
    }
    report.note(
        conn.cmd::<Vec<Option<String>>>(resource, redis::cmd("HMGET").arg(resource).arg("value"))
            .await,
        Need::Feature(HASHES),
    )?;
    Ok(())
}

/// A publish on the probe's wake-up channel (nobody listens), and a
/// subscription to it on a pub/sub connection of its own.
async fn wakeups(
    conn: &RedisConn,
    keys: &LockKeys,
    id: &str,
    report: &mut ProbeReport,
) -> Result<()> {
    let channel = wake_channel(keys, id);
    let publish = match conn.publish() {
        Publish::Publish => "PUBLISH",
        Publish::SPublish => "SPUBLISH",
    };
    report.note(
        conn.cmd::<u64>(&channel, redis::cmd(publish).arg(&channel).arg("0"))
            .await,
        Need::Feature(WAKEUPS),
    )?;
    let Some(pubsub) = report.note(
        PubSub::connect(conn, |_: Event| {}).await,
        Need::Feature(WAKEUPS),
    )?
    else {
        return Ok(());
    };
    if report
        .note(pubsub.subscribe(&channel).await, Need::Feature(WAKEUPS))?
        .is_some()
    {
        report.note(pubsub.unsubscribe(&channel).await, Need::Feature(WAKEUPS))?;
    }
    Ok(())
}
