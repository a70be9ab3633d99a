//! Diagnostics of `run`: the Prometheus endpoint (`--metrics-addr`) and the
//! worst renewal lag at exit (`--verbose`).

use std::net::SocketAddr;
use std::time::Duration;

use fencelock::LockClient;
use fencelock::metrics::{
    ACQUIRE_ATTEMPTS, ACQUIRE_WAIT, FENCED_WRITES, HOLD, LEASES_LOST, RELEASES_NOT_OURS,
    RENEWAL_LAG, RENEWALS,
};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Histogram buckets of the `_seconds` metrics, 1 ms to 5 min.
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the Prometheus recorder as the global one and serves
/// `http://addr/metrics` from the current runtime until the process exits.
pub(crate) fn serve_metrics(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(BUCKETS)?
        .install()
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
    describe();
    Ok(())
}

/// The `# HELP` lines.
fn describe() {
    metrics::describe_counter!(ACQUIRE_ATTEMPTS, "Lock acquisition calls by final outcome");
    metrics::describe_histogram!(
        ACQUIRE_WAIT,
        metrics::Unit::Seconds,
        "Time to get a lock (successful acquisitions)"
    );
    metrics::describe_histogram!(
        HOLD,
        metrics::Unit::Seconds,
        "Time a lease was held (grant to release, drop or loss)"
    );
    metrics::describe_counter!(RENEWALS, "Lease renewals by outcome");
    metrics::describe_counter!(LEASES_LOST, "Leases declared lost, by reason");
    metrics::describe_counter!(
        RELEASES_NOT_OURS,
        "Releases that found the lock no longer ours"
    );
    metrics::describe_counter!(
        FENCED_WRITES,
        "Fenced writes by outcome; any rejected_stale means a holder outlived its lease"
    );
    metrics::describe_histogram!(
        RENEWAL_LAG,
        metrics::Unit::Seconds,
        "How late the renewal task woke against its schedule (process pauses)"
    );
}

/// Prints the worst renewal lag `client` saw on stderr, with the ttl advice.
pub(crate) fn report_lag(client: &LockClient, ttl: Duration) {
    match client.stats().worst_renewal_lag() {
        Some((family, lag)) => eprintln!(
            "fencelock: worst renewal lag {:.1} ms (lock family {family:?}, ttl {}); {}",
            lag.as_secs_f64() * 1000.0,
            humantime::format_duration(ttl),
            if lag > ttl / 3 {
                "more than a third of the ttl: raise --ttl to several times the worst lag"
            } else {
                "within a third of the ttl"
            }
        ),
        None => eprintln!("fencelock: worst renewal lag: none measured (no renewal was due)"),
    }
}
