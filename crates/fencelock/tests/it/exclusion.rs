//! Mutual exclusion against a real `redis-server`: one winner per contended
//! round, critical sections that never overlap, waiting and timing out, and
//! the Redis key layout contract (lock value and fence key) that workers
//! written from the guide rely on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::TestRedis;
use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, FENCE_RETENTION, Fence, FenceMode, KeyLayout, Lease, LockClient, LockOptions, LockState,
    ReleaseOutcome,
};
use fencelock_testkit::RedisServer;
use tokio::sync::Barrier;
use tokio::time::Instant;

/// `n` clients, each with its own connection, so contenders really race.
async fn clients(server: &RedisServer, n: usize) -> Result<Vec<LockClient>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(LockClient::connect(&server.url()).await?);
    }
    Ok(out)
}

/// Runs one round: `contenders` tasks start together (barrier) and each calls
/// `try_acquire` (or `acquire` with `opts`' wait when `waiting`). Winners keep
/// their lease until every contender has returned, so a late contender can
/// never win after an early release. Returns the winners and the losers'
/// errors.
async fn race_round(
    clients: &[LockClient],
    contenders: usize,
    name: &str,
    opts: &LockOptions,
    waiting: bool,
) -> Result<(Vec<Lease>, Vec<Error>)> {
    let barrier = Arc::new(Barrier::new(contenders));
    let mut tasks = Vec::with_capacity(contenders);
    for client in &clients[..contenders] {
        let client = client.clone();
        let barrier = barrier.clone();
        let name = name.to_string();
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            if waiting {
                client.acquire(&name, &opts).await
            } else {
                client.try_acquire(&name, &opts).await
            }
        }));
    }
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for task in tasks {
        match task.await.context("contender task panicked")? {
            Ok(lease) => winners.push(lease),
            Err(e) => losers.push(e),
        }
    }
    Ok((winners, losers))
}

/// Checks one round's outcome: exactly one winner, whose value is in the lock
/// key, and every loser refused as contended on that name.
fn check_round(
    server: &RedisServer,
    round: usize,
    name: &str,
    winners: &[Lease],
    losers: &[Error],
    contenders: usize,
) -> Result<()> {
    ensure!(
        winners.len() == 1,
        "round {round}: {} winners among {contenders} contenders (losers: {losers:?})",
        winners.len()
    );
    ensure!(
        losers.len() == contenders - 1,
        "round {round}: lost a contender"
    );
    for e in losers {
        ensure!(
            e.is_contended(),
            "round {round}: a loser got a non-contention error: {e}"
        );
        ensure!(
            e.to_string().contains(name),
            "round {round}: the error does not name the lock: {e}"
        );
    }
    let winner = &winners[0];
    let stored: Option<String> = server.query(&["GET", winner.key()]);
    ensure!(
        stored == Some(format!("{}:{}", winner.token(), winner.fence())),
        "round {round}: the lock key holds {stored:?}, not the winner's value"
    );
    Ok(())
}

/// 100 rounds of 2–8 simultaneous `try_acquire` calls on one name (a new name
/// per round): exactly one wins each round and every loser gets `Contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_try_acquire_has_exactly_one_winner_per_round() -> Result<()> {
    let server = RedisServer::start();
    let clients = clients(&server, 8).await?;
    let opts = LockOptions::default().ttl(Duration::from_secs(10));
    let mut total_losers = 0;
    for round in 0..100 {
        let contenders = 2 + round % 7;
        let name = format!("try-round-{round}");
        let (winners, losers) = race_round(&clients, contenders, &name, &opts, false).await?;
        check_round(&server, round, &name, &winners, &losers, contenders)?;
        for e in &losers {
            match e {
                Error::Contended { name: n, remaining } => {
                    ensure!(n == &name, "Contended names {n:?}, not {name:?}");
                    let remaining = remaining.context("Contended without the holder's ttl")?;
                    ensure!(
                        remaining > Duration::ZERO && remaining <= opts.ttl_value(),
                        "holder's remaining lease {remaining:?} is outside (0, ttl]"
                    );
                }
                other => bail!("round {round}: try_acquire loser got {other:?}"),
            }
        }
        total_losers += losers.len();
        for lease in winners {
            ensure!(lease.release().await? == ReleaseOutcome::Released);
        }
    }
    // 100 rounds of 2..=8 contenders: sum over rounds of (contenders - 1).
    let expected_losers: usize = (0..100).map(|r| 1 + r % 7).sum();
    ensure!(total_losers == expected_losers);
    ensure!(
        server.query::<i64>(&["DBSIZE"]) == 100,
        "only the 100 fence keys must remain after every winner released"
    );
    Ok(())
}

/// 100 rounds of 2–8 simultaneous `acquire` calls with a short wait (30 ms)
/// while the winner keeps holding: exactly one wins each round and every
/// loser times out with `Error::Timeout` naming the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acquire_with_short_wait_has_exactly_one_winner_per_round() -> Result<()> {
    let server = RedisServer::start();
    let clients = clients(&server, 8).await?;
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_millis(30));
    for round in 0..100 {
        let contenders = 2 + round % 7;
        let name = format!("wait-round-{round}");
        let (winners, losers) = race_round(&clients, contenders, &name, &opts, true).await?;
        check_round(&server, round, &name, &winners, &losers, contenders)?;
        for e in &losers {
            match e {
                Error::Timeout { name: n, waited } => {
                    ensure!(n == &name, "Timeout names {n:?}, not {name:?}");
                    ensure!(
                        *waited >= opts.wait_value(),
                        "gave up after {waited:?}, before the wait deadline"
                    );
                }
                other => bail!("round {round}: waiting loser got {other:?}, not Timeout"),
            }
        }
        for lease in winners {
            ensure!(lease.release().await? == ReleaseOutcome::Released);
        }
    }
    Ok(())
}

/// Records how many tasks are inside a critical section at once.
#[derive(Default)]
struct OverlapProbe {
    inside: AtomicUsize,
    max_inside: AtomicUsize,
}

impl OverlapProbe {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
    }

    fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn max(&self) -> usize {
        self.max_inside.load(Ordering::SeqCst)
    }
}

/// Two tasks (own connections) alternately run 100 critical sections each
/// under `with_lock` on one name: the shared "inside" counter never exceeds 1,
/// and the fences seen on entry strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_lock_critical_sections_never_overlap() -> Result<()> {
    const PER_TASK: usize = 100;
    let server = RedisServer::start();
    let clients = clients(&server, 2).await?;
    let probe = Arc::new(OverlapProbe::default());
    // (task, fence) on every entry, in entry order.
    let fences = Arc::new(Mutex::new(Vec::<(usize, Fence)>::new()));
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(30));
    let start = Arc::new(Barrier::new(2));
    let mut tasks = Vec::new();
    for (task_id, client) in clients.into_iter().enumerate() {
        let (probe, fences, opts, start) =
            (probe.clone(), fences.clone(), opts.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for _ in 0..PER_TASK {
                let (probe, fences) = (probe.clone(), fences.clone());
                client
                    .with_lock("shared", &opts, |lease| async move {
                        probe.enter();
                        fences
                            .lock()
                            .expect("fence log poisoned")
                            .push((task_id, lease.fence()));
                        // Stay inside across real suspension points so the
                        // other task gets every chance to break in.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        tokio::task::yield_now().await;
                        probe.exit();
                    })
                    .await?;
                // Stay out for a moment: a waiter polls with backoff (no
                // queue), so a task that re-acquired at once would starve
                // the other and the test would never see a handoff.
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await.context("with_lock task panicked")??;
    }
    ensure!(
        probe.max() == 1,
        "{} critical sections were inside at once",
        probe.max()
    );
    let log = fences.lock().expect("fence log poisoned").clone();
    ensure!(log.len() == 2 * PER_TASK);
    ensure!(
        log.windows(2).all(|w| w[0].1 < w[1].1),
        "fences did not strictly increase in entry order: {log:?}"
    );
    // The tasks really contended: the lock changed hands between them many
    // times rather than one task finishing before the other started.
    let handoffs = log.windows(2).filter(|w| w[0].0 != w[1].0).count();
    ensure!(
        handoffs >= 10,
        "only {handoffs} handoffs between the two tasks: {log:?}"
    );
    ensure!(server.query::<i64>(&["EXISTS", "lock:{shared}"]) == 0);
    Ok(())
}

/// Negative control for the overlap probe: the same critical sections run
/// without a lock are seen overlapping, so the probe can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlap_probe_detects_overlap_without_a_lock() -> Result<()> {
    let probe = Arc::new(OverlapProbe::default());
    let start = Arc::new(Barrier::new(2));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (probe, start) = (probe.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for _ in 0..20 {
                probe.enter();
                tokio::time::sleep(Duration::from_millis(5)).await;
                probe.exit();
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    ensure!(
        probe.max() == 2,
        "unlocked critical sections should overlap"
    );
    Ok(())
}

/// `acquire` waits while the lock is held and succeeds once the holder
/// releases, with a higher fence, and no earlier than the release.
#[tokio::test(flavor = "multi_thread")]
async fn acquire_waits_and_succeeds_after_the_holder_releases() -> Result<()> {
    let server = RedisServer::start();
    let [holder_client, waiter_client]: [LockClient; 2] = clients(&server, 2)
        .await?
        .try_into()
        .map_err(|_| anyhow::anyhow!("expected two clients"))?;
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10));
    let held = holder_client.try_acquire("handoff", &opts).await?;
    let held_fence = held.fence();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let release_started = Instant::now();
        let outcome = held.release().await;
        (release_started, outcome)
    });
    let started = Instant::now();
    let lease = waiter_client.acquire("handoff", &opts).await?;
    let acquired_at = Instant::now();
    let (release_started, outcome) = releaser.await?;
    ensure!(outcome? == ReleaseOutcome::Released);
    ensure!(
        acquired_at >= release_started,
        "the waiter got the lock before the holder released it"
    );
    ensure!(
        acquired_at - started < Duration::from_secs(3),
        "the waiter took {:?} to notice a release after ~200 ms",
        acquired_at - started
    );
    ensure!(
        lease.fence() > held_fence,
        "the new grant's fence must be higher"
    );
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    Ok(())
}

/// `acquire` of a lock whose holder crashed (a key with a PX expiry and no
/// renewal) wakes up at the holder's expiry instead of sleeping past it.
#[tokio::test(flavor = "multi_thread")]
async fn acquire_takes_over_promptly_when_a_crashed_holders_lease_expires() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&["SET", "lock:{crashed}", "dead-holder:1", "PX", "400"]);
    let opts = LockOptions::default().wait(Duration::from_secs(10));
    let started = Instant::now();
    let lease = client.acquire("crashed", &opts).await?;
    let waited = started.elapsed();
    ensure!(
        waited >= Duration::from_millis(300),
        "acquired after {waited:?}, while the crashed holder's key still had ~400 ms"
    );
    ensure!(
        waited < Duration::from_millis(400 + 1000),
        "acquire slept {waited:?}, far past the holder's 400 ms expiry"
    );
    ensure!(lease.release().await?.is_released());
    Ok(())
}

/// `acquire` gives up at its wait deadline with `Error::Timeout` whose message
/// names the lock; the holder is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn acquire_times_out_naming_the_lock_after_its_wait_deadline() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let holder = client
        .try_acquire("busy-lock", &LockOptions::default())
        .await?;
    let before: Option<String> = server.query(&["GET", holder.key()]);
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let err = client
        .acquire("busy-lock", &LockOptions::default().wait(wait))
        .await
        .expect_err("the lock is held: acquire must time out");
    let elapsed = started.elapsed();
    match &err {
        Error::Timeout { name, waited } => {
            ensure!(name == "busy-lock");
            ensure!(*waited >= wait, "reported waiting {waited:?} < {wait:?}");
        }
        other => bail!("expected Error::Timeout, got {other:?}"),
    }
    ensure!(err.is_contended() && err.is_retryable());
    ensure!(
        err.to_string().contains("busy-lock"),
        "message does not name the lock: {err}"
    );
    ensure!(elapsed >= wait, "gave up after {elapsed:?}");
    ensure!(
        elapsed < wait + Duration::from_secs(2),
        "gave up only after {elapsed:?}"
    );
    ensure!(server.query::<Option<String>>(&["GET", holder.key()]) == before);
    ensure!(!holder.is_lost());
    ensure!(holder.release().await?.is_released());
    Ok(())
}

/// A wait of zero means a single attempt: `acquire` on a held lock returns
/// `Error::Contended` (not `Timeout`) after exactly one grant script call.
#[tokio::test(flavor = "multi_thread")]
async fn acquire_with_zero_wait_makes_one_attempt_and_reports_contended() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let holder = client.try_acquire("once", &LockOptions::default()).await?;
    let calls_before = server.script_calls();
    let err = client
        .acquire("once", &LockOptions::default().wait(Duration::ZERO))
        .await
        .expect_err("held lock");
    let calls_after = server.script_calls();
    ensure!(
        matches!(err, Error::Contended { ref name, .. } if name == "once"),
        "expected Contended, got {err:?}"
    );
    ensure!(
        calls_after - calls_before == 1,
        "a zero wait made {} script calls",
        calls_after - calls_before
    );
    ensure!(holder.release().await?.is_released());
    Ok(())
}

/// Layout contract, default (hash-tagged) layout in counter mode: the lock key
/// `lock:{NAME}` holds `TOKEN:FENCE` with the ttl, the fence key
/// `lock:{NAME}:fence` holds the fence (1, then 2) and never expires.
#[tokio::test(flavor = "multi_thread")]
async fn default_layout_stores_token_colon_fence_and_a_counter_fence_key() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(10))
        .fence_mode(FenceMode::Counter);
    for expected_fence in 1..=2u64 {
        let lease = client.try_acquire("invoice:42", &opts).await?;
        ensure!(lease.key() == "lock:{invoice:42}");
        ensure!(lease.fence() == Fence::new(expected_fence));
        let value: Option<String> = server.query(&["GET", "lock:{invoice:42}"]);
        ensure!(
            value == Some(format!("{}:{expected_fence}", lease.token())),
            "lock value {value:?}"
        );
        let pttl: i64 = server.query(&["PTTL", "lock:{invoice:42}"]);
        ensure!(pttl > 0 && pttl <= 10_000, "lock PTTL {pttl}");
        let fence: Option<String> = server.query(&["GET", "lock:{invoice:42}:fence"]);
        ensure!(
            fence == Some(expected_fence.to_string()),
            "fence key {fence:?}"
        );
        ensure!(
            server.query::<i64>(&["PTTL", "lock:{invoice:42}:fence"]) == -1,
            "a counter fence key must not expire"
        );
        let state = client.inspect("invoice:42", KeyLayout::HashTagged).await?;
        match state {
            LockState::Held {
                holder,
                fence,
                remaining,
            } => {
                ensure!(holder == lease.holder_id());
                ensure!(holder != lease.token(), "the token is a secret");
                ensure!(fence == Some(lease.fence()));
                ensure!(remaining.is_some_and(|r| r <= Duration::from_secs(10)));
            }
            other => bail!("inspect says {other:?} while held"),
        }
        ensure!(lease.release().await?.is_released());
    }
    ensure!(
        server.query::<Vec<String>>(&["KEYS", "*"]) == vec!["lock:{invoice:42}:fence".to_string()]
    );
    Ok(())
}

/// Layout contract, default layout in clock mode: the lock value is
/// `TOKEN:FENCE`, the fence key holds the same fence as a plain integer and
/// carries the retention ttl (so no key is left behind per name forever).
#[tokio::test(flavor = "multi_thread")]
async fn default_layout_clock_mode_fence_key_holds_the_fence_with_a_retention_ttl() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let lease = client
        .try_acquire("report", &LockOptions::default())
        .await?;
    let value: Option<String> = server.query(&["GET", "lock:{report}"]);
    ensure!(value == Some(format!("{}:{}", lease.token(), lease.fence())));
    let fence: Option<String> = server.query(&["GET", "lock:{report}:fence"]);
    ensure!(fence == Some(lease.fence().to_string()));
    // A clock fence is the server time in µs (16 digits today), written
    // exactly: no `1.79e+15` rounding.
    let time: Vec<String> = server.query(&["TIME"]);
    let now_us: u64 = time[0].parse::<u64>()? * 1_000_000 + time[1].parse::<u64>()?;
    ensure!(
        lease.fence().get() <= now_us && now_us - lease.fence().get() < 60_000_000,
        "clock fence {} is not near the server time {now_us}",
        lease.fence()
    );
    let fence_pttl: i64 = server.query(&["PTTL", "lock:{report}:fence"]);
    let retention = i64::try_from(FENCE_RETENTION.as_millis())?;
    ensure!(
        fence_pttl > retention - 60_000 && fence_pttl <= retention,
        "fence key PTTL {fence_pttl}, expected about {retention}"
    );
    ensure!(lease.release().await?.is_released());
    Ok(())
}

/// Layout contract, guide layout: `lock:NAME` holds the bare token, and
/// `lock:NAME:fence` is an INCR-compatible counter without expiry; a worker
/// written from the guide (`SET lock:NAME token NX PX`) and fencelock exclude
/// each other.
#[tokio::test(flavor = "multi_thread")]
async fn guide_layout_stores_the_bare_token_and_excludes_guide_workers() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let opts = LockOptions::default()
        .layout(KeyLayout::Guide)
        .fence_mode(FenceMode::Counter);
    let lease = client.try_acquire("invoice:42", &opts).await?;
    ensure!(lease.key() == "lock:invoice:42");
    ensure!(lease.fence() == Fence::new(1));
    ensure!(
        server.query::<Option<String>>(&["GET", "lock:invoice:42"])
            == Some(lease.token().to_string())
    );
    ensure!(server.query::<Option<String>>(&["GET", "lock:invoice:42:fence"]) == Some("1".into()));
    ensure!(server.query::<i64>(&["PTTL", "lock:invoice:42:fence"]) == -1);
    // A guide worker's SET NX fails while fencelock holds the lock.
    let guide_set: Option<String> = server.query(&[
        "SET",
        "lock:invoice:42",
        "python-token",
        "NX",
        "PX",
        "10000",
    ]);
    ensure!(
        guide_set.is_none(),
        "a guide worker got the lock fencelock holds"
    );
    ensure!(lease.release().await?.is_released());

    // And fencelock is refused while a guide worker holds it.
    server.cmd(&[
        "SET",
        "lock:invoice:42",
        "python-token",
        "NX",
        "PX",
        "10000",
    ]);
    server.cmd(&["INCR", "lock:invoice:42:fence"]);
    let err = client
        .try_acquire("invoice:42", &opts)
        .await
        .expect_err("a guide worker holds the lock");
    ensure!(err.is_contended(), "{err:?}");
    server.cmd(&["DEL", "lock:invoice:42"]);
    // The counter continues after the guide worker's INCR.
    let lease = client.try_acquire("invoice:42", &opts).await?;
    ensure!(lease.fence() == Fence::new(3));
    ensure!(lease.release().await?.is_released());
    Ok(())
}
