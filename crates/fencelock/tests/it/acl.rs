//! The README's ACL rule for a fencelock user ("Redis permissions", read
//! from the README by the testkit), on a real server:
//!
//! - a user with exactly that rule takes, waits for (poll, notify, fair),
//!   renews and releases locks, with counter fences too, and writes,
//!   registers and reads a fenced hash;
//! - a user missing one part of it gets `Error::NoPermission` naming that
//!   part and the rule to add, for every part a lock or fenced-hash
//!   operation needs; a background renewal refused for a missing `PEXPIRE`
//!   is a warning naming it (the lease is then lost at its deadline);
//! - a user that may write a lock key but not its fence key is refused
//!   naming the fence key, and no lock is left without its fence (every
//!   grant path; a release that cannot hand over still releases).
//!
//! The parts whose absence is not an error (pub/sub, `INFO`, `SCAN`/`ZCARD`
//! of `top`) are named by the audit (`audit.rs`) and the CLI
//! (`fencelock top`).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, FenceMode, KeyLayout, LockClient, LockOptions, LossReason, ReleaseOutcome, WaitMode,
};
use fencelock_testkit::RedisServer;
use fencelock_testkit::acl::readme_acl_rule;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::support::{Captured, POLL_DEADLINE, poll};

/// The README's rule without `part` (which it must have).
pub(crate) fn rule_without(part: &str) -> Vec<String> {
    let rule = readme_acl_rule();
    assert!(
        rule.iter().any(|p| p == part),
        "the README's rule has no {part}: {rule:?}"
    );
    rule.into_iter().filter(|p| p != part).collect()
}

/// Parts of the rule whose absence is no error of the library, with the
/// test that names them instead.
pub(crate) const NAMED_ELSEWHERE: [&str; 7] = [
    // Waiters fall back to polling: the audit names them.
    "&lock:*",
    "+subscribe",
    "+unsubscribe",
    // A release wakes waiters best effort: the audit names it.
    "+publish",
    // The eviction warning at connect is best effort: the audit names it.
    "+info",
    // `fencelock top` only: the CLI and the audit name them.
    "+scan",
    "+zcard",
];

#[tokio::test]
async fn a_user_with_the_readme_rule_runs_every_operation() -> Result<()> {
    let server = RedisServer::start();
    let url = server.acl_user("fencelock", &readme_acl_rule());
    let holder = LockClient::connect(&url).await?;
    let waiter = LockClient::connect(&url).await?;

    for mode in [WaitMode::Poll, WaitMode::Notify, WaitMode::Fair] {
        let name = format!("job-{mode:?}");
        let keys = holder.keys(&name, KeyLayout::HashTagged)?;
        let held = holder
            .try_acquire(&name, &LockOptions::default().ttl(Duration::from_secs(30)))
            .await?;
        let scripts_before = server.script_calls();
        let opts = LockOptions::default()
            .wait_mode(mode)
            .wait(Duration::from_secs(10));
        let task = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move { waiter.acquire(&name, &opts).await })
        };
        // A notify or fair waiter is queued only once it has subscribed to
        // its wake-up channel: with pub/sub refused it would poll instead.
        poll(
            &format!("{mode:?}: the waiter's attempt"),
            POLL_DEADLINE,
            || {
                let tried = server.script_calls() > scripts_before;
                let queued = server.query::<i64>(&["ZCARD", &keys.queue()]) == 1;
                (tried && (mode == WaitMode::Poll || queued)).then_some(())
            },
        )
        .await?;
        ensure!(!task.is_finished(), "{mode:?}: the waiter did not wait");
        let held_fence = held.fence();
        ensure!(held.release().await? == ReleaseOutcome::Released);
        let lease = tokio::time::timeout(POLL_DEADLINE, task)
            .await
            .context("the waiter was not granted the lock")???;
        ensure!(lease.fence() > held_fence, "{mode:?}");
        ensure!(matches!(
            holder.inspect(&name, KeyLayout::HashTagged).await?,
            fencelock::LockState::Held { .. }
        ));
        ensure!(lease.release().await? == ReleaseOutcome::Released);
    }

    // Background renewal: a 300 ms lease renewed every 100 ms.
    let lease = holder
        .try_acquire(
            "renewed",
            &LockOptions::default().ttl(Duration::from_millis(300)),
        )
        .await?;
    lease.extend().await?;
    poll("two background renewals", POLL_DEADLINE, || {
        let renewals = holder.stats().lock("renewed").map_or(0, |s| s.renewals_ok);
        (renewals >= 2).then_some(())
    })
    .await?;
    ensure!(!lease.is_lost());
    ensure!(lease.release().await? == ReleaseOutcome::Released);

    // Counter fences (INCR, PERSIST).
    let counter = LockOptions::default().fence_mode(FenceMode::Counter);
    let lease = holder.try_acquire("counted", &counter).await?;
    ensure!(lease.fence().get() == 1, "{}", lease.fence());
    ensure!(lease.release().await? == ReleaseOutcome::Released);

    // The fenced hash, under the resource key pattern of the rule.
    let lease = holder.try_acquire("invoice:1", &holder.options()).await?;
    let hash = holder.fenced_hash("invoice:1")?;
    ensure!(
        hash.register(lease.fence(), lease.token())
            .await?
            .is_accepted()
    );
    ensure!(
        hash.update(lease.fence(), lease.token(), |v| format!(
            "{}+1",
            v.unwrap_or("0")
        ))
        .await?
        .is_accepted()
    );
    ensure!(hash.read().await?.value.as_deref() == Some("0+1"));
    ensure!(lease.release().await? == ReleaseOutcome::Released);

    // A semaphore: grants, a renewal, a waiter woken by a release, status.
    let sem = holder.options().permits(1).ttl(Duration::from_secs(30));
    let permit = holder.try_acquire("pool", &sem).await?;
    permit.extend().await?;
    let task = {
        let (waiter, sem) = (waiter.clone(), sem.clone().wait(Duration::from_secs(10)));
        tokio::spawn(async move { waiter.acquire("pool", &sem).await })
    };
    let pool = holder.keys("pool", KeyLayout::HashTagged)?;
    poll("the semaphore's waiter to queue", POLL_DEADLINE, || {
        (server.query::<i64>(&["ZCARD", &pool.queue()]) == 1).then_some(())
    })
    .await?;
    ensure!(matches!(
        holder.inspect("pool", KeyLayout::HashTagged).await?,
        fencelock::LockState::Semaphore { permits: 1, .. }
    ));
    ensure!(permit.release().await? == ReleaseOutcome::Released);
    let next = tokio::time::timeout(POLL_DEADLINE, task)
        .await
        .context("the semaphore's waiter was not woken")???;
    ensure!(next.slot() == Some(0));
    ensure!(next.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// What a user missing one part of the rule tries, to meet the refusal.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    /// `LockClient::connect`.
    Connect,
    /// `LockClient::connect` to database 1 (`SELECT`).
    ConnectDb1,
    /// One grant of a free lock.
    Grant,
    /// One grant with counter fences.
    GrantCounter,
    /// `inspect`.
    Inspect,
    /// A grant, then `extend`.
    Extend,
    /// A grant, then `release`.
    Release,
    /// A grant, a waiter queued by the test, then `release` (which passes
    /// the lock on).
    ReleaseToWaiter,
    /// A notify waiter on a lock someone else holds (it queues).
    Wait,
    /// A notify waiter that queues, then takes the lock when the holder's
    /// lease runs out (and leaves the queue).
    WaitThenGrant,
    /// A fenced write to `invoice:1`.
    FencedWrite,
    /// A read of `invoice:1`.
    FencedRead,
    /// One grant of a semaphore's permit.
    SemGrant,
    /// A permit's grant, then its release.
    SemRelease,
    /// A permit's grant, then `extend`.
    SemExtend,
}

/// Runs `attempt` as the user at `url` and returns the error it met.
async fn refusal(server: &RedisServer, url: &str, attempt: Attempt) -> Result<Error> {
    let name = "job";
    let keys = fencelock::LockKeys::new("lock:", KeyLayout::HashTagged, name)?;
    let connected = match attempt {
        Attempt::ConnectDb1 => LockClient::connect(&format!("{url}1")).await,
        _ => LockClient::connect(url).await,
    };
    let client = match (attempt, connected) {
        (Attempt::Connect | Attempt::ConnectDb1, Err(e)) => return Ok(e),
        (_, connected) => connected?,
    };
    let opts = client.options();
    let outcome = match attempt {
        Attempt::Connect | Attempt::ConnectDb1 => bail!("connected"),
        Attempt::Grant => client.try_acquire(name, &opts).await.map(drop),
        Attempt::GrantCounter => client
            .try_acquire(name, &opts.fence_mode(FenceMode::Counter))
            .await
            .map(drop),
        Attempt::Inspect => client.inspect(name, KeyLayout::HashTagged).await.map(drop),
        Attempt::Extend => client.try_acquire(name, &opts).await?.extend().await,
        Attempt::Release => client
            .try_acquire(name, &opts)
            .await?
            .release()
            .await
            .map(drop),
        Attempt::ReleaseToWaiter => {
            let lease = client.try_acquire(name, &opts).await?;
            let member = "someone:1:notify:10000:100:0b5e7a9c-0000-4000-8000-000000000001";
            server.cmd(&["ZADD", &keys.queue(), "1", member]);
            server.cmd(&["ZADD", &keys.waiters(), "99999999999999", member]);
            lease.release().await.map(drop)
        }
        Attempt::Wait | Attempt::WaitThenGrant => {
            let ttl = match attempt {
                Attempt::Wait => "30000",
                _ => "300",
            };
            server.cmd(&["SET", keys.lock(), "someone:1", "PX", ttl]);
            let waiting = opts
                .wait_mode(WaitMode::Notify)
                .wait(Duration::from_secs(5));
            client.acquire(name, &waiting).await.map(drop)
        }
        Attempt::FencedWrite => {
            let hash = client.fenced_hash("invoice:1")?;
            hash.write(fencelock::Fence::new(1), "token", "v")
                .await
                .map(drop)
        }
        Attempt::FencedRead => client.fenced_hash("invoice:1")?.read().await.map(drop),
        Attempt::SemGrant => client.try_acquire(name, &opts.permits(2)).await.map(drop),
        Attempt::SemRelease => client
            .try_acquire(name, &opts.permits(2))
            .await?
            .release()
            .await
            .map(drop),
        Attempt::SemExtend => {
            client
                .try_acquire(name, &opts.permits(2))
                .await?
                .extend()
                .await
        }
    };
    outcome.err().context("not refused")
}

#[tokio::test]
async fn a_user_missing_one_part_of_the_rule_is_told_which() -> Result<()> {
    use Attempt::*;
    let server = RedisServer::start();
    // (part left out, what meets the refusal, detail, fix)
    let cases: &[(&str, Attempt, &str, &str)] = &[
        ("+ping", Connect, "run the command PING", "+ping"),
        ("+evalsha", Grant, "run the command EVALSHA", "+evalsha"),
        (
            "+script|load",
            Grant,
            "run the command SCRIPT|LOAD",
            "+script|load",
        ),
        ("~lock:*", Grant, "access the key \"lock:{job}\"", "~lock:*"),
        ("+get", Grant, "run the command GET", "+get"),
        ("+time", Grant, "run the command TIME", "+time"),
        ("+set", Grant, "run the command SET", "+set"),
        ("+incr", GrantCounter, "run the command INCR", "+incr"),
        (
            "+persist",
            GrantCounter,
            "run the command PERSIST",
            "+persist",
        ),
        ("+pttl", Inspect, "run the command PTTL", "+pttl"),
        ("+pexpire", Extend, "run the command PEXPIRE", "+pexpire"),
        ("+type", Wait, "run the command TYPE", "+type"),
        ("+del", Release, "run the command DEL", "+del"),
        (
            "+zrange",
            ReleaseToWaiter,
            "run the command ZRANGE",
            "+zrange",
        ),
        ("+zscore", Wait, "run the command ZSCORE", "+zscore"),
        ("+zadd", Wait, "run the command ZADD", "+zadd"),
        ("+zrem", WaitThenGrant, "run the command ZREM", "+zrem"),
        ("+hset", FencedWrite, "run the command HSET", "+hset"),
        ("+hmget", FencedRead, "run the command HMGET", "+hmget"),
        ("+hgetall", SemGrant, "run the command HGETALL", "+hgetall"),
        ("+hget", SemExtend, "run the command HGET", "+hget"),
        ("+hdel", SemRelease, "run the command HDEL", "+hdel"),
        (
            "~invoice:*",
            FencedWrite,
            "access the key \"invoice:1\"",
            "~invoice:*",
        ),
    ];
    let rule = readme_acl_rule();
    for part in &rule {
        ensure!(
            cases.iter().any(|c| c.0 == part) || NAMED_ELSEWHERE.contains(&part.as_str()),
            "no test leaves out {part} of the README's rule"
        );
    }
    for &(part, attempt, detail, fix) in cases {
        server.cmd(&["FLUSHALL"]);
        // Scripts are cached server-wide: a user without SCRIPT LOAD is only
        // refused once the cache is empty.
        server.cmd(&["SCRIPT", "FLUSH"]);
        let url = server.acl_user("app", &rule_without(part));
        let e = refusal(&server, &url, attempt)
            .await
            .with_context(|| format!("without {part}"))?;
        let Error::NoPermission {
            detail: got_detail,
            fix: got_fix,
        } = &e
        else {
            bail!("without {part}: expected NoPermission, got {e:?}");
        };
        ensure!(
            got_detail == detail && got_fix.ends_with(fix),
            "without {part}: {e}"
        );
        ensure!(e.is_config(), "{e:?}");
        let message = e.to_string();
        ensure!(
            message.contains("Redis permissions") && !message.contains("script:"),
            "{message}"
        );
    }

    // Not in the rule (database 0 needs no SELECT), but named when needed.
    let url = server.acl_user("app", &rule);
    let e = refusal(&server, &url, ConnectDb1).await?;
    ensure!(
        matches!(&e, Error::NoPermission { fix, .. } if fix == "+select"),
        "{e:?}"
    );
    Ok(())
}

/// A lease whose renewals are refused is lost at its deadline (nothing else
/// is true of it), and a warning says why, once.
#[test]
fn a_renewal_refused_for_a_missing_permission_is_a_warning_naming_it() -> Result<()> {
    let server = RedisServer::start();
    let url = server.acl_user("app", &rule_without("+pexpire"));
    let log = Captured::default();
    let subscriber = log.subscriber(tracing::Level::WARN, FmtSpan::NONE);
    let reason = tracing::subscriber::with_default(subscriber, || -> Result<_> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let client = LockClient::connect(&url).await?;
            let lease = client
                .try_acquire(
                    "job",
                    &LockOptions::default().ttl(Duration::from_millis(300)),
                )
                .await?;
            tokio::time::timeout(POLL_DEADLINE, lease.lost())
                .await
                .context("the lease was never lost")?;
            Ok(lease.loss_reason())
        })
    })?;
    ensure!(reason == Some(LossReason::DeadlinePassed), "{reason:?}");
    let text = log.text();
    ensure!(
        text.matches("renewal refused").count() == 1
            && text.contains("PEXPIRE")
            && text.contains("+pexpire"),
        "{text}"
    );
    Ok(())
}

/// A fair waiter's queue member (client `someone`, waiter 1, ttl 10 s,
/// hand-over lease 100 ms, its token last), put in a queue by hand.
const FAIR_WAITER: &str = "someone:1:fair:10000:100:0b5e7a9c-0000-4000-8000-000000000001";

/// Queues [`FAIR_WAITER`] on lock `keys`, its waiter lease far ahead.
fn queue_fair_waiter(server: &RedisServer, keys: &fencelock::LockKeys) {
    server.cmd(&["ZADD", &keys.queue(), "1", FAIR_WAITER]);
    server.cmd(&["ZADD", &keys.waiters(), "99999999999999", FAIR_WAITER]);
}

/// The README's rule with the keys of lock `name` only, its fence key
/// read-only: such a user may set the lock key but not store its fence.
pub(crate) fn rule_with_read_only_fence(keys: &fencelock::LockKeys) -> Vec<String> {
    let mut rule = rule_without("~lock:*");
    rule.extend([
        format!("~{}", keys.lock()),
        format!("~{}", keys.queue()),
        format!("~{}", keys.waiters()),
        format!("%R~{}", keys.fence()),
    ]);
    rule
}

/// A grant whose fence cannot be stored (a user whose rule lets it write
/// the lock key but not the fence key) fails naming the missing permission
/// and leaves no lock behind: a lock without its fence stored would let the
/// next holder get the same fence (counter fences) or a retry read back an
/// older one (the guide layout). For every grant path: the common case
/// (clock fences), counter fences, fair waiting, both layouts. Without the
/// undo in the scripts the lock key is left set (the check fails).
#[tokio::test]
async fn a_grant_whose_fence_cannot_be_stored_leaves_no_lock_behind() -> Result<()> {
    let server = RedisServer::start();
    for layout in [KeyLayout::HashTagged, KeyLayout::Guide] {
        let keys = fencelock::LockKeys::new("lock:", layout, "job")?;
        let url = server.acl_user("app", &rule_with_read_only_fence(&keys));
        let client = LockClient::connect(&url).await?;
        server.cmd(&["SET", &keys.fence(), "5"]);
        let opts = client.options().layout(layout);
        for (what, opts) in [
            ("clock", opts.clone()),
            ("counter", opts.clone().fence_mode(FenceMode::Counter)),
            ("fair", opts.clone().wait_mode(WaitMode::Fair)),
        ] {
            let e = match client.try_acquire("job", &opts).await {
                Ok(lease) => bail!("{layout:?} {what}: granted fence {}", lease.fence()),
                Err(e) => e,
            };
            let named = format!("access the key {:?}", keys.fence());
            ensure!(
                matches!(&e, Error::NoPermission { detail, .. } if *detail == named),
                "{layout:?} {what}: expected NoPermission naming the fence key, got {e:?}"
            );
            let lock: Option<String> = server.query(&["GET", keys.lock()]);
            let fence: Option<String> = server.query(&["GET", &keys.fence()]);
            ensure!(
                lock.is_none() && fence.as_deref() == Some("5"),
                "{layout:?} {what}: after the refusal the lock key holds {lock:?}, the fence key {fence:?}"
            );
        }
    }
    Ok(())
}

/// A release that would hand the lock to a fair waiter but may not store
/// the hand-over's fence (the user's rule was narrowed to a read-only fence
/// key while it held the lock) still releases: the lock key is gone, the
/// waiter stays queued and is woken to try for itself (its own grant names
/// what is missing). Before, the release failed with `NoPermission` after
/// it had deleted the lock: an error saying less than what had happened.
#[tokio::test]
async fn a_release_that_may_not_store_the_hand_over_fence_releases_and_wakes() -> Result<()> {
    let server = RedisServer::start();
    let keys = fencelock::LockKeys::new("lock:", KeyLayout::HashTagged, "job")?;
    let url = server.acl_user("app", &readme_acl_rule());
    let client = LockClient::connect(&url).await?;
    let lease = client.try_acquire("job", &client.options()).await?;
    queue_fair_waiter(&server, &keys);
    server.acl_user("app", &rule_with_read_only_fence(&keys));
    let fence_before: Option<String> = server.query(&["GET", &keys.fence()]);
    let outcome = lease.release().await?;
    ensure!(outcome.is_released(), "{outcome:?}");
    let lock: Option<String> = server.query(&["GET", keys.lock()]);
    let queued: Vec<String> = server.query(&["ZRANGE", &keys.queue(), "0", "-1"]);
    let fence: Option<String> = server.query(&["GET", &keys.fence()]);
    ensure!(
        lock.is_none() && queued == [FAIR_WAITER] && fence == fence_before,
        "lock {lock:?}, queue {queued:?}, fence {fence:?} (was {fence_before:?})"
    );
    Ok(())
}

/// `+zcard` is in the rule for `fencelock top`, and releases batched
/// together ask `ZCARD` whether anyone waits: a user without it still
/// releases (a refused `ZCARD` sends the release down the full path), with
/// and without a queue to pass the lock on to.
#[tokio::test]
async fn a_user_without_zcard_still_releases() -> Result<()> {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.acl_user("app", &rule_without("+zcard"))).await?;
    let keys = fencelock::LockKeys::new("lock:", KeyLayout::HashTagged, "job")?;
    let alone = client.try_acquire("job", &client.options()).await?;
    ensure!(alone.release().await?.is_released(), "released alone");
    ensure!(
        server.query::<i64>(&["EXISTS", keys.lock()]) == 0,
        "lock left"
    );
    let lease = client.try_acquire("job", &client.options()).await?;
    queue_fair_waiter(&server, &keys);
    ensure!(lease.release().await?.is_released(), "released to a waiter");
    let held: Option<String> = server.query(&["GET", keys.lock()]);
    ensure!(
        held.as_deref()
            .is_some_and(|v| v.starts_with("0b5e7a9c-0000-4000-8000-000000000001:")),
        "handed over: the lock holds {held:?}"
    );
    Ok(())
}
