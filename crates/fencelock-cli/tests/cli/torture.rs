//! `fencelock torture`: the CI tier of the safety harness on a private
//! single redis-server (every server-side nemesis, no violation), every
//! negative control caught, saved histories re-checked, a given Redis left
//! clean, and no process left behind when the tool is killed; on a private
//! Sentinel and Cluster (failovers and every node-level nemesis, no
//! violation, a negative control caught on each); on a Postgres resource
//! (no violation, a negative control caught); on a private etcd cluster
//! (member pauses, kills and leader changes without a violation or an
//! excuse, a negative control caught, Redis-only nemeses refused, no
//! process left behind) and on a given etcd (no key left behind).

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_testkit::{
    ClientAuth, EtcdCluster, PgServer, RedisCluster, RedisConfig, RedisSentinel, RedisServer,
    TlsConfig,
};
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
        "revoke",
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
            "recreating-renewal",
            "revoke-without-seal"
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
    assert_eq!(report["caught"], 6);
}

/// The revoke nemesis on a private redis-server: each revoke deposes a
/// holder between its read and its write and seals the resource; the
/// deposed holder, resumed after the revoke, has its write refused; no
/// checker finds a violation, and nothing is excused.
#[test]
fn heavy_torture_revoke_nemesis_seals_and_finds_no_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history.jsonl");
    let out = fencelock(&[
        "torture",
        "--nemesis",
        "revoke",
        "--duration",
        "6s",
        "--seed",
        "5",
        "--json",
        "--history",
        history.to_str().expect("utf-8 path"),
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    assert!(
        report["revokes_deposing"].as_u64().unwrap_or(0) >= 1,
        "{report:#}"
    );
    assert!(
        report["revokes_sealed"].as_u64().unwrap_or(0) >= 1,
        "{report:#}"
    );
    for c in report["checkers"].as_array().expect("checkers") {
        assert_eq!(c["violations"], 0, "{c}");
        assert_eq!(c["excused"], 0, "{c}");
    }
    // A deposed holder wrote after its revoke and was refused.
    let events: Vec<Value> = std::fs::read_to_string(&history)
        .expect("history")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let refused_after = events
        .iter()
        .filter(|e| e["ev"] == "revoke" && e["sealed"] == "accepted")
        .any(|r| {
            let t = r["t"].as_i64().unwrap_or(i64::MAX);
            let ops: HashSet<&str> = events
                .iter()
                .filter(|e| e["p"] == r["worker"] && e["ev"] == "write")
                .filter(|e| e["t"].as_i64().unwrap_or(0) > t)
                .filter_map(|e| e["op"].as_str())
                .take(1)
                .collect();
            events.iter().any(|e| {
                e["ev"] == "written"
                    && e["outcome"] == "stale"
                    && e["op"].as_str().is_some_and(|op| ops.contains(op))
            })
        });
    assert!(
        refused_after,
        "no deposed write was refused after its revoke"
    );
}

/// The revoke-without-seal control: the deposed holder's write after the
/// revoke is accepted, and C1 catches it within a short run.
#[test]
fn heavy_torture_catches_revoke_without_seal() {
    let out = fencelock(&[
        "torture",
        "--unsafe",
        "revoke-without-seal",
        "--duration",
        "15s",
        "--seed",
        "3",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert_eq!(report["unsafe"], "revoke-without-seal", "{report:#}");
    let caught: Vec<&str> = report["caught_by"]
        .as_array()
        .expect("caught_by")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(caught.contains(&"C1"), "{report:#}");
    assert_eq!(report["revokes_sealed"], 0, "{report:#}");
    assert!(
        report["first_violation_s"].as_f64().unwrap_or(f64::MAX) < 15.0,
        "{report:#}"
    );
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
    // A topology is started by the tool; --redis is a deployment given.
    refused(
        &[
            "--redis",
            "redis://127.0.0.1:1",
            "torture",
            "--topology",
            "sentinel",
        ],
        "--topology sentinel conflicts with --redis",
    );
    // What a topology cannot do is refused before any server starts.
    refused(
        &["torture", "--nemesis", "failover"],
        "failover: needs replicas to promote",
    );
    refused(
        &[
            "torture",
            "--topology",
            "cluster",
            "--nemesis",
            "proxy-delay",
        ],
        "the fault proxy cannot stand between the workers and a cluster topology",
    );
    refused(
        &["torture", "--topology", "sentinel", "--unsafe", "ge-check"],
        "ge-check: cannot be caught on the sentinel topology",
    );
}

/// Every node-level nemesis the topology supports, failovers included.
const REPLICATED_NEMESES: [&str; 9] = [
    "pause-server",
    "kill-restart",
    "kill-wipe",
    "debug-sleep",
    "client-pause",
    "script-flush",
    "client-kill",
    "pause-worker",
    "failover",
];

/// A short run on a private replicated topology with every nemesis it
/// supports (one round of each: failovers, crashes of the primary, the
/// node-level faults, worker pauses): no violation, failovers carried
/// out, every grant waited for every replica.
fn replicated_run_finds_no_violation(topology: &str, replicas: u64) {
    let out = fencelock(&[
        "torture",
        "--topology",
        topology,
        "--duration",
        "20s",
        "--seed",
        "1",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["topology"], topology, "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    assert_eq!(report["replicas"], replicas, "{report:#}");
    assert_eq!(report["wait_replicas"], replicas, "{report:#}");
    let events = report["nemesis_events"]
        .as_object()
        .expect("nemesis events");
    for kind in REPLICATED_NEMESES {
        assert!(
            events.get(kind).and_then(Value::as_u64).unwrap_or(0) >= 1,
            "{kind} was never injected: {events:?}"
        );
    }
    // kill-wipe is a failover here too.
    assert!(report["failovers"].as_u64().unwrap_or(0) >= 2, "{report:#}");
    assert!(
        report["ops_acknowledged"].as_u64().unwrap_or(0) > 50,
        "{report:#}"
    );
    for (id, checked, violations) in checkers(&report) {
        assert_eq!(violations, 0, "{id}: {report:#}");
        if ["C1", "C2", "C3", "C4", "C6", "C7"].contains(&id.as_str()) {
            assert!(checked > 0, "{id} checked nothing: {report:#}");
        }
    }
    let expected = report["expectations"].to_string();
    assert!(
        expected.contains("C4 (mutual exclusion) is expected to hold across failovers"),
        "{report:#}"
    );
}

/// A negative control on a private replicated topology is caught: a
/// release without the owner check lets a third holder in beside a
/// valid one.
fn replicated_control_is_caught(topology: &str) {
    // `--unsafe all` runs every control the topology can expose (the
    // others are left out with a reason on stderr), each with those of its
    // nemeses the topology can run.
    let out = fencelock(&[
        "torture",
        "--topology",
        topology,
        "--unsafe",
        "all",
        "--seed",
        "3",
        "--json",
    ])
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
            "write-only-check",
            "unchecked-release",
            "recreating-renewal",
            "revoke-without-seal"
        ]),
        "{report:#}"
    );
    for c in controls {
        assert_eq!(c["topology"], topology, "{c:#}");
        let caught: Vec<&str> = c["caught_by"]
            .as_array()
            .expect("caught_by")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(!caught.is_empty(), "{c:#}");
        if c["unsafe"] == "unchecked-release" {
            assert!(caught.contains(&"C4"), "{c:#}");
        }
        assert!(
            c["first_violation_s"].as_f64().unwrap_or(f64::MAX) < 30.0,
            "{c:#}"
        );
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("two-command-acquire is left out")
            && stderr.contains("ge-check is left out"),
        "{stderr}"
    );
}

#[test]
fn torture_on_sentinel_with_failovers_finds_no_violation() {
    replicated_run_finds_no_violation("sentinel", 2);
}

#[test]
fn torture_on_cluster_with_failovers_finds_no_violation() {
    replicated_run_finds_no_violation("cluster", 1);
}

#[test]
fn torture_catches_a_negative_control_on_sentinel() {
    replicated_control_is_caught("sentinel");
}

#[test]
fn torture_catches_a_negative_control_on_cluster() {
    replicated_control_is_caught("cluster");
}

/// The Postgres resource (a fenced row and an audit table written in one
/// transaction): no violation with every nemesis, and a read-modify-write
/// that does not register its fence before reading is caught there.
#[test]
fn heavy_torture_on_a_postgres_resource() {
    let pg = PgServer::start();
    let url = pg.create_database("torture");
    let out = fencelock(&[
        "torture",
        "--resource",
        "postgres",
        "--pg-url",
        &url,
        "--duration",
        "10s",
        "--seed",
        "5",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["resource"], "postgres", "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    let found = checkers(&report);
    for (id, checked, _) in &found {
        if ["C1", "C2", "C3"].contains(&id.as_str()) {
            assert!(*checked > 20, "{id} checked too little: {report:#}");
        }
    }

    let out = fencelock(&[
        "torture",
        "--resource",
        "postgres",
        "--pg-url",
        &url,
        "--unsafe",
        "write-only-check",
        "--seed",
        "3",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let caught = report["caught_by"].to_string();
    assert!(caught.contains("C3"), "{report:#}");
    // Both runs dropped their tables.
    assert_eq!(
        pg.psql(
            "torture",
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ),
        "0"
    );
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
    // 4 workers, the lock's and the resource's servers.
    for signal in [libc_sigkill(), libc_sigint()] {
        killed_run_leaves_no_process("single", "pause-worker,pause-server", signal, 4 + 2);
    }
}

/// The same for the replicated topologies: every data node, sentinel and
/// worker dies with the tool.
#[test]
fn torture_on_sentinel_and_cluster_killed_or_interrupted_leaves_no_process_behind() {
    for (topology, signal, processes) in [
        ("sentinel", libc_sigkill(), 3 + 3 + 1 + 4),
        ("sentinel", libc_sigint(), 3 + 3 + 1 + 4),
        ("cluster", libc_sigkill(), 6 + 1 + 4),
    ] {
        killed_run_leaves_no_process(topology, "pause-worker,pause-server", signal, processes);
    }
}

/// Starts a 60 s run on `topology`, waits until its workers hold locks and
/// its nemeses began, checks that at least `processes` children run, sends
/// `signal` (KILL or INT) to the tool, and checks that every child is gone
/// soon after (an interrupted run still reports: exit 0 or 1).
fn killed_run_leaves_no_process(topology: &str, nemeses: &str, signal: &str, processes: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("h.jsonl");
    let mut tool = fencelock(&[
        "torture",
        "--topology",
        topology,
        "--duration",
        "60s",
        "--workers",
        "4",
        "--nemesis",
        nemeses,
        "--nemesis-interval",
        "200ms",
        "--history",
        history.to_str().expect("path"),
    ])
    // Data directories a SIGKILL leaves behind (an etcd member's is a
    // 64 MB write-ahead log) go to this test's own directory.
    .env("TMPDIR", dir.path())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("starts");
    let pid = tool.id();
    wait_for("workers and nemeses", Duration::from_secs(40), || {
        std::fs::read_to_string(&history)
            .is_ok_and(|h| h.contains("\"granted\"") && h.contains("nemesis_start"))
    });
    let started = children(pid);
    assert!(
        started.len() >= processes,
        "{topology}: {processes} processes expected: {started:?}"
    );
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
        // (2: interrupted before every name had an acknowledged write.)
        assert!(matches!(status.code(), Some(0..=2)), "{status:?}");
    }
    wait_for("every child to be gone", Duration::from_secs(10), || {
        started.iter().all(|p| !alive(*p))
    });
    assert!(waited.elapsed() < Duration::from_secs(30));
}

fn libc_sigkill() -> &'static str {
    "KILL"
}

fn libc_sigint() -> &'static str {
    "INT"
}

/// `--topology etcd` with every member fault (the leader or a follower
/// paused past the ttl, killed and restarted with its data, the leadership
/// moved) and paused workers: no violation and nothing excused — etcd
/// commits every grant to a quorum, so no fault may roll one back — and
/// every fault carried out without an error.
#[test]
fn torture_on_etcd_with_member_faults_finds_no_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history.jsonl");
    let out = fencelock(&[
        "torture",
        "--topology",
        "etcd",
        "--duration",
        "20s",
        "--nemesis",
        "pause-server,kill-restart,failover,pause-worker",
        "--nemesis-interval",
        "500ms",
        "--seed",
        "3",
        "--json",
        "--history",
        history.to_str().expect("utf-8 path"),
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["topology"], "etcd", "{report:#}");
    assert_eq!(report["fence_mode"], "revision", "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    assert!(report["grants"].as_u64().unwrap_or(0) > 0, "{report:#}");
    let events = report["nemesis_events"]
        .as_object()
        .expect("nemesis events");
    for kind in ["pause-server", "kill-restart", "failover", "pause-worker"] {
        assert!(
            events.get(kind).and_then(Value::as_u64).unwrap_or(0) >= 1,
            "{kind} was never injected: {events:?}"
        );
    }
    for c in report["checkers"].as_array().expect("checkers") {
        assert_eq!(c["violations"], 0, "{c}");
        assert_eq!(c["excused"], 0, "nothing is excused on etcd: {c}");
    }
    for (id, checked, _) in checkers(&report) {
        if ["C1", "C2", "C3", "C4", "C6", "C7"].contains(&id.as_str()) {
            assert!(checked > 0, "{id} checked nothing: {report:#}");
        }
    }
    // Every member fault and leader change was carried out.
    let text = std::fs::read_to_string(&history).expect("history");
    let ends: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["ev"] == "nemesis_end")
        .collect();
    assert!(!ends.is_empty());
    for e in &ends {
        assert!(e["error"].is_null(), "a nemesis failed: {e}");
    }
}

/// A negative control on etcd is caught: a read-modify-write that checks
/// the fence on the write only loses an increment when a paused holder's
/// etcd lease expires under it.
#[test]
fn torture_catches_a_negative_control_on_etcd() {
    let out = fencelock(&[
        "torture",
        "--topology",
        "etcd",
        "--unsafe",
        "write-only-check",
        "--seed",
        "5",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert_eq!(report["topology"], "etcd", "{report:#}");
    assert_eq!(report["unsafe"], "write-only-check", "{report:#}");
    let caught = report["caught_by"].as_array().expect("caught_by");
    assert!(!caught.is_empty(), "{report:#}");
}

/// What etcd cannot do is refused with a usage error naming it, before any
/// server starts (no etcd nor redis-server can be started here: a start
/// would fail with another code).
#[test]
fn torture_on_etcd_refuses_redis_only_nemeses_before_servers_start() {
    let refused = |args: &[&str], needles: &[&str]| {
        let out = fencelock(args)
            .env("FENCELOCK_ETCD_BIN", "/nonexistent/etcd")
            .env("FENCELOCK_REDIS_SERVER_BIN", "/nonexistent/redis-server")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {stderr}");
        }
    };
    for (nemesis, why) in [
        ("debug-sleep", "DEBUG SLEEP is a Redis command"),
        ("client-pause", "CLIENT PAUSE is a Redis command"),
        ("script-flush", "SCRIPT FLUSH drops Redis's script cache"),
        ("kill-wipe", "cannot rejoin its cluster"),
        ("client-kill", "CLIENT KILL is a Redis command"),
    ] {
        refused(
            &["torture", "--topology", "etcd", "--nemesis", nemesis],
            &[&format!("--nemesis {nemesis}:"), why],
        );
    }
    refused(
        &[
            "torture",
            "--topology",
            "etcd",
            "--unsafe",
            "unchecked-release",
        ],
        &["unchecked-release: cannot be caught on the etcd topology"],
    );
    refused(
        &["torture", "--topology", "etcd", "--unsafe", "ge-check"],
        &["etcd fences are create revisions, which never repeat"],
    );
    // A given etcd: client-side nemeses only.
    refused(
        &[
            "--url",
            "etcd://127.0.0.1:1",
            "torture",
            "--nemesis",
            "pause-server",
        ],
        &["--nemesis pause-server: needs control of the etcd members"],
    );
}

/// `--topology etcd` killed with SIGKILL leaves no etcd member, worker or
/// redis-server behind.
#[test]
fn torture_on_etcd_killed_leaves_no_process_behind() {
    // 3 members (one may be down for a restart), the resource's server,
    // 4 workers.
    killed_run_leaves_no_process(
        "etcd",
        "pause-worker,kill-restart",
        libc_sigkill(),
        2 + 1 + 4,
    );
}

/// Against a given etcd (`--url etcd://…`): client-side nemeses only (the
/// fault proxy in front of a member), the resource on a private
/// redis-server, and every key of the run gone afterwards.
#[test]
fn torture_on_a_given_etcd_leaves_no_key_behind() {
    let cluster = EtcdCluster::start();
    let out = fencelock(&[
        "--url",
        &cluster.url(),
        "torture",
        "--duration",
        "8s",
        "--workers",
        "4",
        "--nemesis",
        "pause-worker,proxy-delay,proxy-reset,proxy-blackhole",
        "--seed",
        "5",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["topology"], "remote", "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    assert!(report["grants"].as_u64().unwrap_or(0) > 0, "{report:#}");
    let keys = cluster
        .etcdctl(&["get", "", "--from-key", "--keys-only"])
        .expect("etcdctl get");
    assert_eq!(keys.trim(), "", "keys were left behind");
}

/// A lock store that does not answer fails the run before any worker starts
/// (exit 69, the URL redacted), on etcd as on Redis: a run whose workers
/// reach nothing would otherwise end "no violation" having proved nothing.
#[test]
fn torture_against_an_unreachable_lock_store_exits_69() {
    for url in [
        "etcd://u:SECRET@127.0.0.1:1",
        "redis://u:SECRET@127.0.0.1:1",
    ] {
        let out = fencelock(&["--url", url, "torture", "--duration", "2s"])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(69), "{url}: {stdout}{stderr}");
        assert!(!stdout.contains("no violation"), "{url}: {stdout}");
        assert!(
            !stderr.contains("SECRET") && stderr.contains("u:***@127.0.0.1:1"),
            "{url}: {stderr}"
        );
    }
}

/// The run's report of a given deployment: exit `code`, no violation, the
/// remote topology, grants and acknowledged writes on every name, and
/// client-side nemeses only.
fn assert_remote_run(out: &std::process::Output, code: i32) -> Value {
    let report = json_of(out);
    assert_eq!(out.status.code(), Some(code), "{report:#}");
    assert_eq!(report["topology"], "remote", "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    assert!(report["inconclusive"].is_null(), "{report:#}");
    assert!(report["grants"].as_u64().unwrap_or(0) > 0, "{report:#}");
    assert!(
        report["ops_acknowledged"].as_u64().unwrap_or(0) > 0,
        "{report:#}"
    );
    report
}

/// A given Sentinel deployment (`redis+sentinel://`): the run connects
/// through fencelock's own connection code (the resource and the clean-up
/// too), runs the client-side nemesis that applies, waits for both replicas
/// on every grant and resource write, and leaves no key behind.
#[test]
fn torture_on_a_given_sentinel_deployment_runs_and_leaves_no_key_behind() {
    let sentinel = RedisSentinel::start();
    let out = fencelock(&[
        "--url",
        &sentinel.url(),
        "torture",
        "--duration",
        "4s",
        "--workers",
        "3",
        "--seed",
        "5",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = assert_remote_run(&out, 0);
    assert_eq!(report["replicas"], 2, "{report:#}");
    assert_eq!(report["wait_replicas"], 2, "{report:#}");
    assert_eq!(
        report["nemeses"],
        serde_json::json!(["pause-worker", "revoke"]),
        "{report:#}"
    );
    let primary = sentinel.primary_node();
    assert_eq!(
        primary.query::<i64>(&["DBSIZE"]),
        0,
        "keys were left behind"
    );
}

/// A given Cluster (`redis+cluster://`): two names, each with its resource
/// hash and audit list in its own slot (one hash tag), every replica waited
/// for, and no key left on any master.
#[test]
fn torture_on_a_given_cluster_runs_and_leaves_no_key_behind() {
    let cluster = RedisCluster::start();
    let out = fencelock(&[
        "--url",
        &cluster.cluster_url(),
        "torture",
        "--duration",
        "4s",
        "--workers",
        "3",
        "--names",
        "2",
        "--seed",
        "5",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = assert_remote_run(&out, 0);
    assert_eq!(report["wait_replicas"], 1, "{report:#}");
    for master in cluster.masters() {
        assert_eq!(
            cluster.node(master).query::<i64>(&["DBSIZE"]),
            0,
            "keys were left behind on node {master}"
        );
    }
}

/// A TLS deployment that requires client certificates: `torture` takes
/// `--tls-ca`, `--tls-cert` and `--tls-key` (and `FENCELOCK_TLS_*`) for
/// every connection, like every other command.
#[test]
fn heavy_torture_on_a_given_tls_redis_honours_the_tls_options() {
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_tls(TlsConfig::default().with_client_auth(ClientAuth::Required)),
    );
    let files = server.tls_files().expect("TLS files").clone();
    let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_string();
    let args = [
        "torture",
        "--duration",
        "3s",
        "--workers",
        "3",
        "--seed",
        "5",
        "--json",
    ];
    let mut flags = vec![
        "--url".to_string(),
        server.url(),
        "--tls-ca".into(),
        path(&files.ca_cert),
        "--tls-cert".into(),
        path(&files.client_cert),
        "--tls-key".into(),
        path(&files.client_key),
    ];
    flags.extend(args.iter().map(|a| a.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = fencelock(&flags).output().expect("runs");
    let report = assert_remote_run(&out, 0);
    assert_eq!(
        report["nemeses"],
        serde_json::json!(["pause-worker", "revoke"]),
        "{report:#}"
    );
    // The same through the environment.
    let url = server.url();
    let mut env_args = vec!["--url", url.as_str()];
    env_args.extend(args);
    let out = fencelock(&env_args)
        .env("FENCELOCK_TLS_CA", &files.ca_cert)
        .env("FENCELOCK_TLS_CERT", &files.client_cert)
        .env("FENCELOCK_TLS_KEY", &files.client_key)
        .output()
        .expect("runs");
    assert_remote_run(&out, 0);
    assert_eq!(server.query::<i64>(&["DBSIZE"]), 0, "keys were left behind");
}

/// A deployment on which nothing works passes nothing: at a replica (every
/// write READONLY) and at a master with `min-replicas-to-write 1` and no
/// replica (every write NOREPLICAS), no operation is acknowledged, and the
/// run is inconclusive (exit 2), saying what it needed, not "no violation".
#[test]
fn heavy_torture_where_nothing_is_acknowledged_is_inconclusive() {
    let master = RedisServer::start();
    let replica = master.start_replica();
    let lonely = RedisServer::start_with(
        RedisConfig::default()
            .with_conf_line("min-replicas-to-write 1")
            .with_conf_line("min-replicas-max-lag 1"),
    );
    for (what, url) in [
        ("a replica", replica.url()),
        ("a lonely master", lonely.url()),
    ] {
        let run = |json: bool| {
            let mut args = vec![
                "--url",
                url.as_str(),
                "torture",
                "--duration",
                "2s",
                "--workers",
                "2",
                "--nemesis",
                "none",
            ];
            if json {
                args.push("--json");
            }
            fencelock(&args).output().expect("runs")
        };
        let out = run(true);
        let report = json_of(&out);
        assert_eq!(out.status.code(), Some(2), "{what}: {report:#}");
        assert_eq!(report["violations"], 0, "{what}: {report:#}");
        assert_eq!(report["ops_acknowledged"], 0, "{what}: {report:#}");
        let why = report["inconclusive"].as_str().unwrap_or_default();
        assert!(
            why.contains("at least 1 grant and 1 acknowledged write") && why.contains("t0: "),
            "{what}: {report:#}"
        );
        assert_eq!(
            report["minimum"],
            serde_json::json!({"grants_per_name": 1, "acknowledged_writes_per_name": 1}),
            "{what}"
        );
        let out = run(false);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{what}: {text}");
        assert!(
            text.contains("verdict: INCONCLUSIVE") && !text.contains("verdict: no violation"),
            "{what}: {text}"
        );
    }
}

/// A run against a given Redis that is killed with SIGKILL leaves its
/// resource hash and audit list with a TTL (refreshed while the run lives),
/// so nothing stays in the user's Redis for good.
#[test]
fn heavy_torture_killed_leaves_its_resource_keys_with_a_ttl() {
    let server = RedisServer::start();
    let mut tool = fencelock(&[
        "--url",
        &server.url(),
        "torture",
        "--duration",
        "60s",
        "--workers",
        "2",
        "--nemesis",
        "none",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("starts");
    let resource_keys = || {
        let mut keys = server.query::<Vec<String>>(&["KEYS", "*res:*"]);
        keys.sort();
        keys
    };
    // The hash exists from the start; the audit list once a write was
    // accepted.
    wait_for(
        "the resource hash and its audit list",
        Duration::from_secs(20),
        || resource_keys().len() == 2,
    );
    let _ = tool.kill();
    let _ = tool.wait();
    let keys = resource_keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        let ttl = server.query::<i64>(&["PTTL", key]);
        assert!(ttl > 0 && ttl <= 60_000, "{key} has PTTL {ttl}");
    }
}

/// A semaphore on etcd (`--primitive semaphore`), with member faults and
/// paused workers: C1–C9 find nothing, nothing is excused (etcd commits
/// every grant to a quorum), and C8 (never more valid holders than
/// permits) checked every grant.
#[test]
fn torture_semaphore_on_etcd_finds_no_violation() {
    let out = fencelock(&[
        "torture",
        "--topology",
        "etcd",
        "--primitive",
        "semaphore",
        "--permits",
        "2",
        "--duration",
        "10s",
        "--nemesis",
        "pause-server,kill-restart,failover,pause-worker",
        "--nemesis-interval",
        "500ms",
        "--seed",
        "4",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["topology"], "etcd", "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    for c in report["checkers"].as_array().expect("checkers") {
        assert_eq!(c["violations"], 0, "{c}");
        assert_eq!(c["excused"], 0, "nothing is excused on etcd: {c}");
    }
    let grants = report["grants"].as_u64().unwrap_or(0);
    assert!(grants > 0, "{report:#}");
    let c8 = checkers(&report)
        .into_iter()
        .find(|(id, _, _)| id == "C8")
        .expect("C8 ran");
    assert_eq!(c8.1, grants, "C8 checked every grant: {report:#}");
}

/// The semaphore's negative control on etcd: one fence pair for all
/// permits refuses live permits with lower fences, caught by C9.
#[test]
fn torture_semaphore_one_fence_control_is_caught_on_etcd() {
    let out = fencelock(&[
        "torture",
        "--topology",
        "etcd",
        "--primitive",
        "semaphore",
        "--permits",
        "3",
        "--unsafe",
        "one-fence",
        "--seed",
        "6",
        "--json",
    ])
    .output()
    .expect("runs");
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let caught: Vec<&str> = report["caught_by"]
        .as_array()
        .expect("caught_by")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(caught.contains(&"C9"), "{report:#}");
}

/// `--python-workers`: more Python workers than workers is refused; a
/// worker that exits before the end of the run (here an "interpreter" that
/// is a script failing at once, or none at all) voids the run at once: exit
/// 70, naming the worker and quoting its stderr. The Python worker itself
/// is run by the Python package's tests (test_torture_mixed.py).
#[test]
fn torture_python_workers_refused_or_voided_when_a_worker_exits() {
    let out = fencelock(&["torture", "--workers", "2", "--python-workers", "3"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--python-workers 3"), "{stderr}");

    let dir = tempfile::tempdir().expect("tempdir");
    let python = dir.path().join("python");
    std::fs::write(
        &python,
        "#!/bin/sh\nread spec\necho \"no fencelock here: $*\" >&2\nexit 3\n",
    )
    .expect("writes");
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let voided = |python: &str, needles: &[&str]| {
        let started = Instant::now();
        let out = fencelock(&[
            "torture",
            "--workers",
            "2",
            "--python-workers",
            "1",
            "--duration",
            "30s",
            "--python",
            python,
        ])
        .env_remove("FENCELOCK_PYTHON")
        .output()
        .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(70), "{stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{needle:?} in {stderr}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the run went on for {:?} with a worker gone",
            started.elapsed()
        );
    };
    voided(
        python.to_str().expect("utf-8 path"),
        &[
            "torture worker w1 (python) exited before the run ended (exit status: 3)",
            "no fencelock here: -m fencelock.torture_worker",
        ],
    );
    voided(
        "/nonexistent/python3",
        &["cannot start torture worker w1 (python, /nonexistent/python3)"],
    );
}
