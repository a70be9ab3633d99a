//! The `semaphore` scenario, run briefly on a private redis-server: its
//! record carries the semaphore's and the mutex's completions per second,
//! their ratio, Jain's fairness index across the workers, and the
//! references the other contended figures have (the handoff floor and the
//! utilization bound), in the text and the JSON line alike. Speed targets
//! are for benchmarks, not for timed tests: only the fields and what is
//! correctness (no more holders than permits) are checked.

use std::time::Duration;

use fencelock_bench::{Config, Format, Scenario};
use fencelock_testkit::RedisServer;
use serde_json::Value;

#[test]
fn the_semaphore_scenario_reports_rates_ratio_and_fairness() {
    let server = RedisServer::start();
    let mut config = Config::new(server.url());
    config.scenarios = vec![Scenario::Semaphore];
    config.duration = Duration::from_millis(400);
    config.rounds = 2;
    config.permits = 4;
    config.semaphore_workers = 16;
    config.hold = Duration::from_millis(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = rt
        .block_on(fencelock_bench::run(&config, &mut ()))
        .expect("the run");
    assert_eq!(report.overlaps(), 0);
    let records: Vec<_> = report.semaphores().collect();
    assert_eq!(records.len(), 1);
    let r = records[0];
    assert_eq!(
        (r.permits, r.semaphore.workers, r.mutex.workers),
        (4, 16, 16)
    );
    assert_eq!((r.semaphore.rounds, r.mutex.rounds), (2, 2));
    assert!(r.semaphore.completions_per_s > 0.0, "{r:?}");
    assert!(r.mutex.completions_per_s > 0.0, "{r:?}");
    assert!(r.ratio_to_mutex.median > 0.0, "{r:?}");
    assert!(
        r.jain_fairness.median > 0.0 && r.jain_fairness.max <= 1.0 + 1e-9,
        "{r:?}"
    );

    let json: Value =
        serde_json::from_str(report.render(Format::JsonLines).trim()).expect("one JSON line");
    assert_eq!(json["scenario"], "semaphore");
    assert_eq!(json["mode"], "fair");
    assert_eq!(json["permits"], 4);
    assert_eq!(json["workers"], 16);
    for field in [
        "completions_per_s",
        "mutex_completions_per_s",
        "ratio_to_mutex",
        "ratio_to_mutex_min",
        "ratio_to_mutex_max",
        "jain_fairness",
        "jain_fairness_min",
        "jain_fairness_max",
        "mutex_jain_fairness",
        "wait_p50_ms",
        "wait_p99_ms",
        "handoff_floor_ms",
        "utilization",
        "utilization_bound",
        "utilization_to_bound",
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
        "semaphore: 16 workers",
        "4 permits",
        "semaphore / mutex completions per round",
        "semaphore jain per round",
        "handoff floor",
    ] {
        assert!(text.contains(words), "{words:?} in:\n{text}");
    }
}
