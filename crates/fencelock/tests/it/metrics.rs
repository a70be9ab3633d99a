//! Diagnostics against a real `redis-server`: the metrics of scripted
//! scenarios (acquire, contention, timeout, loss, stale rejection) read from
//! a `DebuggingRecorder`, the client's stats snapshot, bounded family
//! labels, and the renewal-lag measurement of a deliberately blocked runtime.
//!
//! Each test runs a current-thread runtime inside
//! `metrics::with_local_recorder`, so every task records into the test's own
//! recorder whatever the test harness.
//!
//! Tests whose assertions are timing windows carry `heavy_` in their name, so
//! nextest runs them one at a time (see `.config/nextest.toml`).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use anyhow::{Result, ensure};
use fencelock::metrics::{
    ACQUIRE_ATTEMPTS, ACQUIRE_WAIT, FENCED_WRITES, HOLD, LEASES_LOST, RELEASES_NOT_OURS,
    RENEWAL_LAG, RENEWALS,
};
use fencelock::{Fence, LockClient, LockOptions, ReleaseOutcome, Renewal};
use fencelock_testkit::RedisServer;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::support::Captured;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// What the recorder saw: counters and histogram samples by
/// `name{label=value,…}` (labels sorted).
#[derive(Debug, Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

impl Seen {
    fn counter(&self, key: &str) -> u64 {
        self.counters.get(key).copied().unwrap_or(0)
    }

    fn samples(&self, key: &str) -> &[f64] {
        self.histograms.get(key).map_or(&[], Vec::as_slice)
    }
}

/// Runs `test` on a current-thread runtime with a local debugging recorder
/// and returns its result and what was recorded.
fn recorded<T>(test: impl Future<Output = Result<T>>) -> Result<(T, Seen)> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = metrics::with_local_recorder(&recorder, || runtime.block_on(test))?;
    Ok((out, seen(&snapshotter)))
}

/// What a debugging recorder's `snapshotter` holds now.
fn seen(snapshotter: &metrics_util::debugging::Snapshotter) -> Seen {
    let mut seen = Seen::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        match value {
            DebugValue::Counter(n) => *seen.counters.entry(name).or_default() += n,
            DebugValue::Histogram(xs) => seen
                .histograms
                .entry(name)
                .or_default()
                .extend(xs.iter().map(|x| x.into_inner())),
            DebugValue::Gauge(_) => {}
        }
    }
    seen
}

/// A client caches its metric handles per family and recorder: events go
/// to whichever recorder is current when they happen, also when it changes
/// while the client lives (an exporter installed after connecting, tests
/// with recorders of their own), and back again. A cache that ignored
/// which recorder its handles came from would count the second recorder's
/// events in the first.
#[test]
fn a_client_records_into_whichever_recorder_is_current() -> Result<()> {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = runtime.block_on(LockClient::connect(&server.url()))?;
    let cycle = || {
        runtime.block_on(async {
            let lease = client.acquire("report:1", &opts(5000)).await?;
            ensure!(lease.release().await? == ReleaseOutcome::Released);
            Ok(())
        })
    };
    // First with no recorder at all (the facade's no-op one).
    cycle()?;
    let (a, b) = (DebuggingRecorder::new(), DebuggingRecorder::new());
    let (seen_a, seen_b) = (a.snapshotter(), b.snapshotter());
    metrics::with_local_recorder(&a, cycle)?;
    metrics::with_local_recorder(&b, cycle)?;
    metrics::with_local_recorder(&b, cycle)?;
    metrics::with_local_recorder(&a, cycle)?;
    let acquired = format!("{ACQUIRE_ATTEMPTS}{{lock=report,outcome=acquired}}");
    let hold = format!("{HOLD}{{lock=report}}");
    // A snapshot drains a debugging recorder's counters: read each once.
    let (seen_a, seen_b) = (seen(&seen_a), seen(&seen_b));
    for seen in [&seen_a, &seen_b] {
        assert_eq!(seen.counter(&acquired), 2, "{seen:?}");
        assert_eq!(seen.samples(&hold).len(), 2, "{seen:?}");
    }
    // The client's own stats count every cycle, whichever recorder.
    let stats = client.stats();
    assert_eq!(stats.lock("report").map(|s| s.acquired), Some(5));
    Ok(())
}

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::default().ttl(Duration::from_millis(ttl_ms))
}

/// Acquire, contention, timeout, loss (key deleted), a release that found the
/// lock no longer ours, accepted and stale fenced writes: each shows up in
/// the recorder under the family label and in the client's stats.
#[test]
fn scripted_scenarios_are_counted() -> Result<()> {
    let server = RedisServer::start();
    let url = server.url();
    let (client, seen) = recorded(async {
        let client = LockClient::connect(&url).await?;
        let other = LockClient::connect(&url).await?;

        // acquired, then contended (try once) and timed out (short wait).
        let held = client.acquire("invoice:1", &opts(5000)).await?;
        let contended = other.try_acquire("invoice:1", &opts(5000)).await;
        ensure!(contended.is_err(), "{contended:?}");
        let timed_out = other
            .acquire("invoice:1", &opts(5000).wait(Duration::from_millis(150)))
            .await;
        ensure!(
            matches!(timed_out, Err(fencelock::Error::Timeout { .. })),
            "{timed_out:?}"
        );

        // Fenced writes: the holder's accepted, an older fence refused.
        let data = client.fenced_hash("invoice:1:data")?;
        ensure!(
            data.write(held.fence(), held.token(), "paid")
                .await?
                .is_accepted()
        );
        let stale = Fence::new(held.fence().get() - 1);
        ensure!(!data.write(stale, "someone-else", "x").await?.is_accepted());
        ensure!(held.release().await? == ReleaseOutcome::Released);

        // Loss: the key is deleted under a renewing lease.
        let lease = client.acquire("job:nightly", &opts(300)).await?;
        let key = lease.key().to_string();
        let _: i64 = redis_del(&url, &key).await?;
        tokio::time::timeout(Duration::from_secs(2), lease.lost()).await?;
        ensure!(matches!(lease.release().await?, ReleaseOutcome::NotOurs(_)));
        Ok(client)
    })?;

    let c = |k: &str| seen.counter(k);
    assert_eq!(
        c(&format!(
            "{ACQUIRE_ATTEMPTS}{{lock=invoice,outcome=acquired}}"
        )),
        1
    );
    assert_eq!(
        c(&format!(
            "{ACQUIRE_ATTEMPTS}{{lock=invoice,outcome=contended}}"
        )),
        1
    );
    assert_eq!(
        c(&format!(
            "{ACQUIRE_ATTEMPTS}{{lock=invoice,outcome=timed_out}}"
        )),
        1
    );
    assert_eq!(
        c(&format!("{ACQUIRE_ATTEMPTS}{{lock=job,outcome=acquired}}")),
        1
    );
    assert_eq!(
        c(&format!("{LEASES_LOST}{{lock=job,reason=expired}}")),
        1,
        "{seen:#?}"
    );
    assert!(c(&format!("{RENEWALS}{{lock=job,outcome=failed}}")) >= 1);
    assert_eq!(c(&format!("{RELEASES_NOT_OURS}{{lock=job}}")), 1);
    assert_eq!(c(&format!("{RELEASES_NOT_OURS}{{lock=invoice}}")), 0);
    assert_eq!(
        c(&format!(
            "{FENCED_WRITES}{{outcome=accepted,resource=invoice:1}}"
        )),
        1
    );
    assert_eq!(
        c(&format!(
            "{FENCED_WRITES}{{outcome=rejected_stale,resource=invoice:1}}"
        )),
        1
    );
    // One wait sample per successful acquisition; one hold per lease.
    assert_eq!(
        seen.samples(&format!("{ACQUIRE_WAIT}{{lock=invoice}}"))
            .len(),
        1
    );
    assert_eq!(seen.samples(&format!("{HOLD}{{lock=invoice}}")).len(), 1);
    assert_eq!(seen.samples(&format!("{HOLD}{{lock=job}}")).len(), 1);

    // The client's stats (the other client's contention is its own).
    let stats = client.stats();
    let invoice = stats.lock("invoice").expect("invoice family");
    assert_eq!(invoice.acquired, 1);
    assert_eq!(invoice.contended + invoice.timed_out, 0);
    let job = stats.lock("job").expect("job family");
    assert_eq!((job.acquired, job.lost, job.releases_not_ours), (1, 1, 1));
    let data = stats.resource("invoice:1").expect("resource family");
    assert_eq!((data.accepted, data.rejected_stale), (1, 1));
    Ok(())
}

async fn redis_del(url: &str, key: &str) -> Result<i64> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    Ok(redis::cmd("DEL").arg(key).query_async(&mut conn).await?)
}

/// A per-lock `metrics_family` replaces the derived family.
#[test]
fn the_family_can_be_overridden() -> Result<()> {
    let server = RedisServer::start();
    let url = server.url();
    let (stats, seen) = recorded(async {
        let client = LockClient::connect(&url).await?;
        let o = opts(2000).metrics_family("billing");
        client.acquire("invoice:7", &o).await?.release().await?;
        Ok(client.stats())
    })?;
    assert_eq!(
        seen.counter(&format!(
            "{ACQUIRE_ATTEMPTS}{{lock=billing,outcome=acquired}}"
        )),
        1
    );
    assert!(stats.lock("billing").is_some() && stats.lock("invoice").is_none());
    Ok(())
}

/// A revoke is counted under its family with its outcome: `deposed` when
/// it took a holder's lock, `free` when there was none (recorder and
/// stats).
#[test]
fn revokes_are_counted_by_outcome() -> Result<()> {
    let server = RedisServer::start();
    let url = server.url();
    let (stats, seen) = recorded(async {
        let client = LockClient::connect(&url).await?;
        let lease = client.acquire("invoice:7", &opts(2000)).await?;
        client.revoke("invoice:7", &opts(2000), &[]).await?;
        client.revoke("invoice:8", &opts(2000), &[]).await?;
        drop(lease);
        Ok(client.stats())
    })?;
    for outcome in ["deposed", "free"] {
        assert_eq!(
            seen.counter(&format!(
                "{}{{lock=invoice,outcome={outcome}}}",
                fencelock::metrics::REVOKES
            )),
            1,
            "{outcome}: {seen:?}"
        );
    }
    assert_eq!(stats.lock("invoice").map(|s| s.revokes), Some(2));
    Ok(())
}

/// 10,000 distinct `invoice:N` names make one `lock` label, not 10,000.
#[test]
fn ten_thousand_names_make_one_family() -> Result<()> {
    let server = RedisServer::start();
    let url = server.url();
    let (stats, seen) = recorded(async {
        let client = LockClient::connect(&url).await?;
        let o = opts(5000).renewal(Renewal::Off);
        for n in 0..10_000 {
            let lease = client.try_acquire(&format!("invoice:{n}"), &o).await?;
            lease.release().await?;
        }
        Ok(client.stats())
    })?;
    let labels: BTreeSet<&String> = seen.counters.keys().chain(seen.histograms.keys()).collect();
    assert_eq!(
        labels.len(),
        3,
        "attempts, wait and hold, one series each: {labels:?}"
    );
    assert_eq!(
        seen.counter(&format!(
            "{ACQUIRE_ATTEMPTS}{{lock=invoice,outcome=acquired}}"
        )),
        10_000
    );
    assert_eq!(
        seen.samples(&format!("{HOLD}{{lock=invoice}}")).len(),
        10_000
    );
    assert_eq!(stats.locks.len(), 1);
    Ok(())
}

/// The runtime's only thread sleeps (blocking) past a third of the ttl: the
/// keeper wakes late, records the lag (histogram and worst lag in the stats)
/// and warns once, naming the lock and suggesting a ttl. The lease survives.
#[test]
fn heavy_a_blocked_runtime_is_measured_and_warned_once() -> Result<()> {
    let server = RedisServer::start();
    let url = server.url();
    let log = Captured::default();
    let subscriber = log.subscriber(tracing::Level::WARN, FmtSpan::NONE);
    let ttl = Duration::from_millis(900);
    let (stats, seen) = tracing::subscriber::with_default(subscriber, || {
        recorded(async {
            let client = LockClient::connect(&url).await?;
            let lease = client.acquire("report:daily", &opts(900)).await?;
            for i in 0..2 {
                // The keeper is due in ttl/3 = 300 ms; it wakes after ~650 ms.
                std::thread::sleep(Duration::from_millis(650));
                tokio::time::sleep(Duration::from_millis(50)).await;
                ensure!(
                    !lease.is_lost(),
                    "the lease did not survive stall {i}: {:?} {:?}",
                    lease.loss_reason(),
                    client.stats()
                );
            }
            ensure!(lease.release().await? == ReleaseOutcome::Released);
            Ok(client.stats())
        })
    })?;
    let worst = stats.lock("report").expect("family").worst_renewal_lag;
    assert!(worst > ttl / 3, "worst lag {worst:?}");
    assert_eq!(
        stats.worst_renewal_lag().map(|(f, _)| f),
        Some("report"),
        "{stats:?}"
    );
    let samples = seen.samples(&format!("{RENEWAL_LAG}{{lock=report}}"));
    assert!(
        samples.iter().any(|s| *s > ttl.as_secs_f64() / 3.0),
        "{samples:?}"
    );
    let text = log.text();
    assert_eq!(
        text.matches("stalled for more than a third").count(),
        1,
        "one warning per lease: {text}"
    );
    assert!(text.contains("report:daily"), "{text}");
    assert!(text.contains("suggested_ttl_ms="), "{text}");
    Ok(())
}

/// Each acquisition call's `acquire` span carries its outcome (and, when
/// granted, its fence), also for a refused attempt and a wait that timed
/// out: the span closes with them, as a log subscriber shows it.
#[test]
fn the_acquire_span_carries_the_outcome_and_the_fence() -> Result<()> {
    let server = RedisServer::start();
    let url = server.url();
    let log = Captured::default();
    let subscriber = log.subscriber(tracing::Level::DEBUG, FmtSpan::CLOSE);
    let (fence, _) = tracing::subscriber::with_default(subscriber, || {
        recorded(async {
            let client = LockClient::connect(&url).await?;
            let lease = client.acquire("span:job", &opts(10_000)).await?;
            let refused = client.try_acquire("span:job", &opts(10_000)).await;
            ensure!(refused.is_err(), "{refused:?}");
            let waited = client
                .acquire("span:job", &opts(10_000).wait(Duration::from_millis(50)))
                .await;
            ensure!(waited.is_err(), "{waited:?}");
            let fence = lease.fence();
            ensure!(lease.release().await? == ReleaseOutcome::Released);
            Ok(fence)
        })
    })?;
    let text = log.text();
    let spans: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("acquire{") && l.contains("close"))
        .collect();
    ensure!(spans.len() == 3, "three acquire spans closed: {text}");
    ensure!(
        spans[0].contains(&format!("fence={}", fence.get())) && spans[0].contains("acquired"),
        "{}",
        spans[0]
    );
    ensure!(spans[1].contains("outcome=\"contended\""), "{}", spans[1]);
    ensure!(spans[2].contains("outcome=\"timed_out\""), "{}", spans[2]);
    Ok(())
}
