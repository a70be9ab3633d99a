//! Hot paths against a real `redis-server` (started through
//! `fencelock_testkit`), with a raw `PING` on a multiplexed connection as the
//! baseline from the same run, so a regression shows as a change of the
//! ratio to one round trip rather than of a machine-dependent absolute time:
//!
//! - `baseline/ping`: one round trip; `baseline/evalsha_noop`: one round
//!   trip carrying a script call that does nothing;
//! - `uncontended/{poll,notify,fair}`: `acquire` (with a wait, so notify and
//!   fair register a waiter) + `release` of a free lock: at least two round
//!   trips;
//! - `contended/try_acquire_held`: a refused `try_acquire` (one round trip);
//!   `contended/raw_grant_script_refused`: the same grant script called raw
//!   on a plain connection (its Redis-side cost, without the client);
//! - `resource/fenced_hash_write`: one fenced write under a held lease (one
//!   round trip);
//! - `renewal/batch_256`: one keeper tick renewing 256 held leases in one
//!   script call (`extend_many.lua`), next to `renewal/one_by_one_256`: the
//!   same 256 renewals as 256 compare-and-pexpire calls sent together on one
//!   connection (one task per lease, as before the keeper batched), and
//!   `renewal/batch_1`: a tick with one lease due.
//!
//! Run with `cargo bench -p fencelock` (about a minute); `-- --save-baseline
//! NAME` / `--baseline NAME` compare runs.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fencelock::{Error, LockClient, LockOptions, ReleaseOutcome, Renewal, WaitMode, WriteOutcome};
use fencelock_testkit::RedisServer;
use tokio::runtime::Runtime;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn lock_benches(c: &mut Criterion) {
    let server = RedisServer::start();
    let rt = runtime();
    let client = rt
        .block_on(LockClient::connect(&server.url()))
        .expect("connect a lock client");
    let other = rt
        .block_on(LockClient::connect(&server.url()))
        .expect("connect a second lock client");
    let ping_conn = rt
        .block_on(async {
            redis::Client::open(server.url())?
                .get_multiplexed_async_connection()
                .await
        })
        .expect("connect for PING");

    let mut baseline = c.benchmark_group("baseline");
    baseline.bench_function("ping", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = ping_conn.clone();
            async move {
                let pong: String = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .expect("PING");
                black_box(pong)
            }
        });
    });
    // The cost of any script call: EVALSHA of a script that does nothing.
    let noop = redis::Script::new("return 1");
    baseline.bench_function("evalsha_noop", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = ping_conn.clone();
            let noop = &noop;
            async move {
                let one: i64 = noop.invoke_async(&mut conn).await.expect("EVALSHA");
                black_box(one)
            }
        });
    });
    baseline.finish();

    let mut uncontended = c.benchmark_group("uncontended");
    for (label, mode) in [
        ("poll", WaitMode::Poll),
        ("notify", WaitMode::Notify),
        ("fair", WaitMode::Fair),
    ] {
        let opts = LockOptions::default()
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(1))
            .wait_mode(mode);
        let name = format!("bench:uncontended:{label}");
        uncontended.bench_function(label, |b| {
            b.to_async(&rt).iter(|| async {
                let lease = client.acquire(&name, &opts).await.expect("acquire");
                let outcome = lease.release().await.expect("release");
                assert_eq!(outcome, ReleaseOutcome::Released);
            });
        });
    }
    uncontended.finish();

    let mut contended = c.benchmark_group("contended");
    let held = rt
        .block_on(other.try_acquire(
            "bench:held",
            &LockOptions::default().ttl(Duration::from_secs(600)),
        ))
        .expect("hold the contended lock");
    let try_opts = LockOptions::default().ttl(Duration::from_secs(10));
    contended.bench_function("try_acquire_held", |b| {
        b.to_async(&rt).iter(|| async {
            match client.try_acquire("bench:held", &try_opts).await {
                Err(e @ Error::Contended { .. }) => black_box(e),
                other => panic!("a try_acquire of a held lock returned {other:?}"),
            }
        });
    });
    // The same refused grant as a raw script call on a plain connection:
    // the Redis side of `try_acquire_held`, without the client library.
    let keys = client
        .keys("bench:held", fencelock::KeyLayout::HashTagged)
        .expect("keys");
    let refused_grant = fencelock::testing::grant_invocation(&keys, "bench-token", &try_opts);
    contended.bench_function("raw_grant_script_refused", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = ping_conn.clone();
            let grant = &refused_grant;
            async move {
                let reply: redis::Value = grant
                    .invoke_async(&mut conn)
                    .await
                    .expect("the grant script");
                black_box(reply)
            }
        });
    });
    contended.finish();
    let released = rt.block_on(held.release()).expect("release the held lock");
    assert_eq!(released, ReleaseOutcome::Released);

    let mut resource = c.benchmark_group("resource");
    let lease = rt
        .block_on(
            client.try_acquire(
                "bench:writer",
                &LockOptions::default()
                    .ttl(Duration::from_secs(600))
                    .renewal(Renewal::Off),
            ),
        )
        .expect("hold the writer lock");
    let hash = client.fenced_hash("bench:resource").expect("a fenced hash");
    resource.bench_function("fenced_hash_write", |b| {
        b.to_async(&rt).iter(|| async {
            let outcome = hash
                .write(lease.fence(), lease.token(), "value")
                .await
                .expect("fenced write");
            assert_eq!(outcome, WriteOutcome::Accepted);
        });
    });
    resource.finish();
    let released = rt
        .block_on(lease.release())
        .expect("release the writer lock");
    assert_eq!(released, ReleaseOutcome::Released);
}

fn renewal_benches(c: &mut Criterion) {
    let server = RedisServer::start();
    let rt = runtime();
    let conn = rt
        .block_on(async {
            redis::Client::open(server.url())?
                .get_multiplexed_async_connection()
                .await
        })
        .expect("connect");
    let ttl = Duration::from_secs(10);
    let leases: Vec<(String, String)> = (0..256)
        .map(|i| {
            (
                format!("lock:{{held:{i}}}"),
                format!("token-{i}:1700000000000000"),
            )
        })
        .collect();
    for (key, value) in &leases {
        server.cmd(&["SET", key, value, "PX", "600000"]);
    }
    let refs: Vec<(&str, &str)> = leases
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut group = c.benchmark_group("renewal");
    for n in [1usize, 256] {
        let invocation = fencelock::testing::renewal_batch_invocation(&refs[..n], ttl);
        group.throughput(criterion::Throughput::Elements(n as u64));
        group.bench_function(format!("batch_{n}"), |b| {
            b.to_async(&rt).iter(|| {
                let mut conn = conn.clone();
                let invocation = &invocation;
                async move {
                    // The leases not renewed: none.
                    let missed: Vec<i64> = invocation.invoke_async(&mut conn).await.expect("renew");
                    assert!(missed.is_empty(), "leases not renewed: {missed:?}");
                    black_box(missed)
                }
            });
        });
    }
    let singles: Vec<_> = refs
        .iter()
        .map(|(k, v)| fencelock::testing::extend_invocation(k, v, ttl))
        .collect();
    group.throughput(criterion::Throughput::Elements(256));
    group.bench_function("one_by_one_256", |b| {
        b.to_async(&rt).iter(|| {
            let singles = &singles;
            let conn = conn.clone();
            async move {
                let calls = singles.iter().map(|inv| {
                    let mut conn = conn.clone();
                    async move { inv.invoke_async::<i64>(&mut conn).await.expect("extend") }
                });
                let codes = futures_util::future::join_all(calls).await;
                assert!(codes.iter().all(|&c| c == 1), "a lease was not renewed");
                black_box(codes)
            }
        });
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = lock_benches, renewal_benches
}
criterion_main!(benches);
