//! Diagnostics end to end with the built binary and real redis-server
//! processes: the `/metrics` endpoint of `run --metrics-addr`, the worst lag
//! of `run --verbose`, and `top --once`.

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use fencelock_testkit::{RedisServer, free_port, spawn_guarded};

use crate::support::{http_get, on, poll};

/// The value of the sample line starting with `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// While `run --metrics-addr` holds `invoice:42` (ttl 300 ms, so renewals
/// happen), `/metrics` shows the acquisition under the family `invoice`, ok
/// renewals and renewal-lag samples; with `--verbose` the worst lag is
/// reported at exit.
#[test]
fn run_serves_metrics_and_reports_the_worst_lag() {
    let server = RedisServer::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = on(
        &server,
        &[
            "run",
            "--metrics-addr",
            &addr,
            "--verbose",
            "--ttl",
            "300ms",
            "invoice:42",
            "--",
            "sleep",
            "2",
        ],
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = spawn_guarded(cmd);
    let text = poll("renewals on /metrics", Duration::from_secs(10), || {
        let body = http_get(port, "/metrics")?;
        let ok = sample(
            &body,
            "fencelock_renewals_total{lock=\"invoice\",outcome=\"ok\"}",
        )?;
        (ok >= 2.0).then_some(body)
    });
    assert_eq!(
        sample(
            &text,
            "fencelock_acquire_attempts_total{lock=\"invoice\",outcome=\"acquired\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        text.contains("fencelock_renewal_lag_seconds_bucket{lock=\"invoice\""),
        "{text}"
    );
    assert!(
        text.contains("fencelock_acquire_wait_seconds_count{lock=\"invoice\"} 1"),
        "{text}"
    );
    assert!(!text.contains("invoice:42"), "labels are families: {text}");
    let status = child
        .wait_timeout(Duration::from_secs(10))
        .expect("run ends after its command");
    assert_eq!(status.code(), Some(0));
    let mut stderr = String::new();
    if let Some(mut err) = child.take_stderr() {
        let _ = err.read_to_string(&mut stderr);
    }
    assert!(
        stderr.contains("fencelock: worst renewal lag ") && stderr.contains("\"invoice\""),
        "{stderr}"
    );
}

/// `top --once` lists the held locks under a pattern with their fences and
/// holders, and leaves out other names and free locks; `--json` too.
#[test]
fn top_once_shows_the_held_locks() {
    let server = RedisServer::start();
    let mut holders = Vec::new();
    for name in ["invoice:1", "invoice:2", "report"] {
        let mut cmd = on(&server, &["run", name, "--", "sleep", "30"]);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        holders.push(spawn_guarded(cmd));
    }
    // A free lock with a fence key left behind: not shown.
    let out = on(&server, &["run", "invoice:3", "--", "true"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let fence_of = |name: &str| -> String {
        poll(name, Duration::from_secs(10), || {
            let v: Option<String> = server.query(&["GET", &format!("lock:{{{name}}}")]);
            Some(v?.rsplit_once(':')?.1.to_string())
        })
    };
    let fences: Vec<String> = ["invoice:1", "invoice:2"].map(fence_of).to_vec();
    fence_of("report");

    let out = on(&server, &["top", "invoice:*", "--once"])
        .output()
        .expect("top");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("2 locks matching invoice:*"), "{text}");
    assert!(lines[1].starts_with("NAME"), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    for (line, (name, fence)) in lines[2..]
        .iter()
        .zip(["invoice:1", "invoice:2"].iter().zip(&fences))
    {
        assert!(line.starts_with(name), "{text}");
        assert!(line.contains(fence.as_str()), "{text}");
        assert!(line.contains(" s "), "ttl left shown: {text}");
    }
    assert!(
        !text.contains("report") && !text.contains("invoice:3"),
        "{text}"
    );

    let out = on(&server, &["top", "--once", "--json"])
        .output()
        .expect("top --json");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = rows
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["invoice:1", "invoice:2", "report"]);
    assert_eq!(rows[0]["waiters"], 0);
    assert_eq!(rows[0]["fence"].to_string(), fences[0]);
    drop(holders);
}

/// `--metrics-addr` takes a host name (`localhost:PORT`, resolved at start);
/// a name that does not resolve, or no port, is a usage error (64).
#[test]
fn metrics_addr_accepts_a_host_name() {
    let server = RedisServer::start();
    let port = free_port();
    let addr = format!("localhost:{port}");
    let mut cmd = on(
        &server,
        &["run", "--metrics-addr", &addr, "job", "--", "sleep", "30"],
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = spawn_guarded(cmd);
    let body = poll("/metrics on localhost", Duration::from_secs(10), || {
        http_get(port, "/metrics").filter(|b| b.contains("fencelock_acquire_attempts_total"))
    });
    assert!(body.contains("lock=\"job\""), "{body}");
    child.kill();

    for bad in ["nosuch.invalid:9464", "localhost", "localhost:http"] {
        let out = on(
            &server,
            &["run", "--metrics-addr", bad, "job", "--", "true"],
        )
        .output()
        .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bad}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("--metrics-addr"), "{stderr}");
    }
    let out = on(
        &server,
        &[
            "run",
            "--metrics-addr",
            "nosuch.invalid:9464",
            "job",
            "--",
            "true",
        ],
    )
    .output()
    .expect("run");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot resolve host \"nosuch.invalid\""),
        "{out:?}"
    );
}
