//! `fencelock torture`: the CI tier of the safety harness on a private
//! single redis-server (every server-side nemesis, no violation), every
//! negative control caught, saved histories re-checked, a given Redis left
//! clean, and no process left behind when the tool is killed.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_testkit::RedisServer;
use serde_json::Value;

use crate::support::{fencelock, poll, wait_for};

fn json_of(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn checkers(report: &Value) -> Vec<(String, u64, u64)> {
    report["checkers"]
        .as_array()
        .expect("checkers")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap_or_default().to_string(),
                c["checked"].as_u64().unwrap_or_default(),
                c["violations"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

/// The CI tier for fencelock itself: every nemesis (all six server-side
/// ones included) against a private redis-server, no violation; the saved
/// history checks the same.
#[test]
fn heavy_torture_every_nemesis_on_a_single_server_finds_no_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history.jsonl");
    let out = fencelock(&[
        "torture",
        "--duration",
        "25s",
        "--seed",
        "7",
        "--json",
        "--history",
        history.to_str().expect("utf-8 path"),
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    let events = report["nemesis_events"]
        .as_object()
        .expect("nemesis events");
    for kind in [
        "pause-server",
        "kill-restart",
        "kill-wipe",
        "debug-sleep",
        "client-pause",
        "script-flush",
        "client-kill",
        "pause-worker",
        "proxy-delay",
        "proxy-blackhole",
        "proxy-swallow",
        "proxy-reset",
    ] {
        assert!(
            events.get(kind).and_then(Value::as_u64).unwrap_or(0) >= 1,
            "{kind} was never injected: {events:?}"
        );
    }
    assert!(
        report["ops_acknowledged"].as_u64().unwrap_or(0) > 100,
        "{report:#}"
    );
    let found = checkers(&report);
    assert_eq!(found.len(), 7);
    for (id, checked, violations) in &found {
        assert_eq!(*violations, 0, "{id}: {report:#}");
        if id != "C5" {
            assert!(*checked > 0, "{id} checked nothing: {report:#}");
        }
    }

    // The history is JSON lines, and checking it again gives the same.
    let text = std::fs::read_to_string(&history).expect("history written");
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
    let again = fencelock(&[
        "torture",
        "--check",
        history.to_str().expect("path"),
        "--json",
    ])
    .output()
    .expect("runs");
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(checkers(&json_of(&again)), found);
}

/// The CI tier for the checkers: every negative control is caught (exit
/// 1), each by at least one checker, each well within a default-length run.
#[test]
fn heavy_torture_catches_every_negative_control() {
    let out = fencelock(&["torture", "--unsafe", "all", "--seed", "3", "--json"])
        .output()
        .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let controls = report["controls"].as_array().expect("controls");
    let names: HashSet<&str> = controls
        .iter()
        .filter_map(|c| c["unsafe"].as_str())
        .collect();
    assert_eq!(
        names,
        HashSet::from([
            "two-command-acquire",
            "ge-check",
            "write-only-check",
            "unchecked-release",
            "recreating-renewal"
        ])
    );
    for c in controls {
        let caught = c["caught_by"].as_array().map_or(0, Vec::len);
        assert!(caught >= 1, "{} was not caught: {c:#}", c["unsafe"]);
        assert!(
            c["first_violation_s"].as_f64().unwrap_or(f64::MAX) < 30.0,
            "{c:#}"
        );
    }
    assert_eq!(report["caught"], 5);
}

/// Against a given Redis: client-side nemeses only, and every key of the
/// run is gone afterwards.
#[test]
fn heavy_torture_on_a_given_redis_leaves_no_key_behind() {
    let server = RedisServer::start();
    let out = fencelock(&[
        "--redis",
        &server.url(),
        "torture",
        "--duration",
        "6s",
        "--workers",
        "4",
        "--names",
        "2",
        "--nemesis",
        "pause-worker,proxy-delay,client-kill,proxy-reset",
        "--seed",
        "5",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["topology"], "remote");
    assert_eq!(server.query::<i64>(&["DBSIZE"]), 0, "keys were left behind");
}

#[test]
fn torture_refuses_what_it_cannot_do() {
    let refused = |args: &[&str], needle: &str| {
        let out = fencelock(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(
        &[
            "--redis",
            "redis://127.0.0.1:1",
            "torture",
            "--nemesis",
            "kill-wipe",
        ],
        "--redis",
    );
    refused(&["torture", "--nemesis", "bogus"], "no such nemesis");
    refused(
        &["torture", "--unsafe", "bogus"],
        "no such negative control",
    );
    refused(&["torture", "--resource", "postgres"], "--pg-url");
    refused(&["torture-worker"], "internal");
}

/// The processes a run started: its direct children (workers and
/// redis-servers).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// A torture run killed with SIGKILL (or interrupted with SIGINT) leaves
/// none of its workers or redis-servers behind: they die with it (the
/// proxy and the observer are threads of the tool itself).
#[test]
fn heavy_torture_killed_or_interrupted_leaves_no_process_behind() {
    for signal in [libc_sigkill(), libc_sigint()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = dir.path().join("h.jsonl");
        let mut tool = fencelock(&[
            "torture",
            "--duration",
            "60s",
            "--workers",
            "4",
            "--nemesis",
            "pause-worker,pause-server",
            "--nemesis-interval",
            "200ms",
            "--history",
            history.to_str().expect("path"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
        let pid = tool.id();
        // Workers are running (and nemeses have begun) once the history
        // shows both.
        wait_for("workers and nemeses", Duration::from_secs(30), || {
            std::fs::read_to_string(&history)
                .is_ok_and(|h| h.contains("\"granted\"") && h.contains("nemesis_start"))
        });
        let started = children(pid);
        assert!(started.len() >= 6, "4 workers and 2 servers: {started:?}");
        Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("kill");
        let waited = Instant::now();
        let status = poll("the tool to exit", Duration::from_secs(20), || {
            tool.try_wait().expect("wait")
        });
        if signal == libc_sigint() {
            // Interrupted: it stopped everything, checked what ran, reported.
            assert!(matches!(status.code(), Some(0 | 1)), "{status:?}");
        }
        wait_for("every child to be gone", Duration::from_secs(10), || {
            started.iter().all(|p| !alive(*p))
        });
        assert!(waited.elapsed() < Duration::from_secs(25));
    }
}

fn libc_sigkill() -> &'static str {
    "KILL"
}

fn libc_sigint() -> &'static str {
    "INT"
}
