//! The `rwlock` scenario, run briefly on a private redis-server: its
//! record carries the read-write lock's and the mutex's completions per
//! second (reads and writes apart), their ratio, the readers' and writers'
//! waits, and the references (Redis's own round trip measured in the same
//! round and the round-trip bound it gives, the handoff floor), in the
//! text and the JSON line alike. Speed targets are for benchmarks, not
//! for timed tests: only the fields and what is correctness (no writer
//! with another holder) are checked.

use std::time::Duration;

use fencelock_bench::{Config, Format, Scenario};
use fencelock_testkit::RedisServer;
use serde_json::Value;

#[test]
fn the_rwlock_scenario_reports_rates_ratios_and_the_round_trip_bound() {
    let server = RedisServer::start();
    let mut config = Config::new(server.url());
    config.scenarios = vec![Scenario::RwLock];
    config.duration = Duration::from_millis(400);
    config.rounds = 2;
    config.rwlock_workers = 16;
    config.rwlock_reads = 90;
    config.hold = Duration::from_millis(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = rt
        .block_on(fencelock_bench::run(&config, &mut ()))
        .expect("the run");
    assert_eq!(report.overlaps(), 0);
    let records: Vec<_> = report.rwlocks().collect();
    assert_eq!(records.len(), 1);
    let r = records[0];
    assert_eq!(
        (r.reads_percent, r.rwlock.workers, r.mutex.workers),
        (90, 16, 16)
    );
    assert_eq!((r.rwlock.rounds, r.mutex.rounds), (2, 2));
    assert!(r.rwlock.completions_per_s > 0.0, "{r:?}");
    assert!(r.mutex.completions_per_s > 0.0, "{r:?}");
    assert!(r.reads_per_s > 0.0 && r.writes_per_s > 0.0, "{r:?}");
    assert!(
        (r.reads_per_s + r.writes_per_s - r.rwlock.completions_per_s).abs()
            <= 0.05 * r.rwlock.completions_per_s,
        "reads and writes make up the completions: {r:?}"
    );
    assert!(r.ratio_to_mutex.median > 0.0, "{r:?}");
    assert!(r.round_trip_ms > 0.0, "{r:?}");
    assert!(r.round_trip_bound_per_s > 0.0, "{r:?}");
    assert!(r.ratio_to_round_trip_bound.median > 0.0, "{r:?}");

    let json: Value =
        serde_json::from_str(report.render(Format::JsonLines).trim()).expect("one JSON line");
    assert_eq!(json["scenario"], "rwlock");
    assert_eq!(json["mode"], "fair");
    assert_eq!(json["reads_percent"], 90);
    assert_eq!(json["workers"], 16);
    assert_eq!(json["rounds"], 2);
    for field in [
        "completions_per_s",
        "reads_per_s",
        "writes_per_s",
        "mean_holders",
        "mutex_completions_per_s",
        "ratio_to_mutex",
        "ratio_to_mutex_min",
        "ratio_to_mutex_max",
        "redis_round_trip_ms",
        "round_trip_bound_per_s",
        "ratio_to_round_trip_bound",
        "ratio_to_round_trip_bound_min",
        "ratio_to_round_trip_bound_max",
        "mutex_ratio_to_round_trip_bound",
        "wait_p50_ms",
        "wait_p99_ms",
        "read_wait_p50_ms",
        "write_wait_p99_ms",
        "handoff_floor_ms",
        "mutex_utilization_bound",
        "mutex_utilization_to_bound",
    ] {
        assert!(
            json[field].as_f64().is_some_and(|v| v > 0.0),
            "{field} in {json}"
        );
    }
    assert_eq!(json["overlaps"], 0);
    assert_eq!(json["mutex_overlaps"], 0);

    let text = report.render(Format::Text);
    for words in [
        "rwlock: 16 workers",
        "90 % read leases",
        "rwlock / mutex completions per round",
        "Redis round trip (PING p50, one connection)",
        "round-trip bound",
        "handoff floor",
    ] {
        assert!(text.contains(words), "{words:?} in:\n{text}");
    }
}
