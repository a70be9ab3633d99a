//! `fencelock doctor` on real servers: a clean server passes (exit 0, and
//! `--json` parses); each WARN and FAIL is provoked and seen in the output:
//! an evicting memory policy, counter fences without the append-only file
//! or without `appendfsync always` (or a user who may not read it), a
//! replica URL, a master with a replica and no `min-replicas-to-write`, a
//! clock fence ahead of the server's clock, a user missing a permission.

use std::time::Duration;

use fencelock_testkit::acl::{ACL_PASSWORD, readme_acl_rule};
use fencelock_testkit::{Persistence, RedisConfig, RedisServer};

use crate::support::{at, on, output, wait_for};

/// The line of check `name` in doctor's text output.
fn line<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in:\n{stdout}"))
}

/// Asserts that check `name` has `status` and mentions every needle.
fn assert_check(stdout: &str, name: &str, status: &str, needles: &[&str]) {
    let line = line(stdout, name);
    assert!(line.starts_with(&format!("{status} ")), "{line}");
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} missing: {line}");
    }
}

/// The server's `TIME` in µs.
fn server_time_us(server: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = server.query(&["TIME"]);
    secs * 1_000_000 + micros
}

#[test]
fn a_clean_server_passes_every_check() {
    let server = RedisServer::start();
    let (code, stdout, stderr) = output(&mut on(&server, &["doctor"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let checks: Vec<&str> = stdout.lines().skip(1).take(10).collect();
    assert_eq!(checks.len(), 10, "{stdout}");
    assert!(checks.iter().all(|l| l.starts_with("OK ")), "{stdout}");
    assert!(stdout.starts_with(&format!("fencelock doctor: {}", server.url())));
    assert!(stdout.ends_with("all checks passed\n"), "{stdout}");

    let (code, stdout, stderr) = output(&mut on(&server, &["doctor", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "one object: {stdout}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("doctor --json");
    assert_eq!(json["status"], "OK", "{json}");
    assert_eq!(json["prefix"], "lock:");
    assert_eq!(json["fence_mode"], "clock");
    let checks = json["checks"].as_array().expect("checks");
    let names: Vec<&str> = checks.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "topology",
            "version",
            "role",
            "replication",
            "eviction",
            "persistence",
            "clock",
            "fences",
            "permissions",
            "rtt"
        ]
    );
    for check in checks {
        assert_eq!(check["status"], "OK", "{check}");
        assert!(check["found"].as_str().is_some_and(|f| !f.is_empty()));
        assert!(check["fix"].is_null(), "{check}");
    }
    assert_eq!(server.query::<i64>(&["DBSIZE"]), 0, "probe keys left");

    let (code, _, stderr) = output(&mut crate::support::fencelock(&[
        "--redis",
        &RedisServer::client_url_unreachable(),
        "doctor",
    ]));
    assert_eq!(code, Some(69), "{stderr}");
}

#[test]
fn an_evicting_memory_policy_warns() {
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_arg("--maxmemory")
            .with_arg("64mb")
            .with_arg("--maxmemory-policy")
            .with_arg("allkeys-lru"),
    );
    let (code, stdout, stderr) = output(&mut on(&server, &["doctor"]));
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_check(&stdout, "eviction", "WARN", &["allkeys-lru", "noeviction"]);
    assert!(stdout.ends_with("0 failures, 1 warning\n"), "{stdout}");
}

#[test]
fn counter_fences_need_the_append_only_file_fsynced_always() {
    let counter = ["--fence-mode", "counter", "doctor"];
    let none = RedisServer::start();
    let (code, stdout, _) = output(&mut on(&none, &counter));
    assert_eq!(code, Some(2), "{stdout}");
    assert_check(&stdout, "persistence", "FAIL", &["appendonly yes"]);
    // Clock fences do not need it.
    let (code, stdout, _) = output(&mut on(&none, &["doctor"]));
    assert_eq!(code, Some(0), "{stdout}");

    let everysec =
        RedisServer::start_with(RedisConfig::default().with_persistence(Persistence::AofEverySec));
    let (code, stdout, _) = output(&mut on(&everysec, &counter));
    assert_eq!(code, Some(1), "{stdout}");
    assert_check(&stdout, "persistence", "WARN", &["everysec", "always"]);

    let always =
        RedisServer::start_with(RedisConfig::default().with_persistence(Persistence::AofAlways));
    let (code, stdout, _) = output(&mut on(&always, &counter));
    assert_eq!(code, Some(0), "{stdout}");
    // The README's rule cannot read appendfsync (CONFIG GET can read
    // passwords): unknown is a warning, not a failure.
    let url = always.acl_user("fencelock", &readme_acl_rule());
    let (code, stdout, _) = output(&mut at(&url, &counter));
    assert_eq!(code, Some(1), "{stdout}");
    assert_check(&stdout, "persistence", "WARN", &["unknown", "CONFIG GET"]);
}

#[test]
fn a_replica_url_fails_and_a_master_without_min_replicas_warns() {
    let master = RedisServer::start_with(
        RedisConfig::default()
            .with_arg("--repl-diskless-sync-delay")
            .with_arg("0"),
    );
    let replica = RedisServer::start_with(
        RedisConfig::default().with_conf_line(format!("replicaof 127.0.0.1 {}", master.port())),
    );
    let replicas = |server: &RedisServer, field: &str| -> Option<String> {
        let info: String = server.query(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    wait_for("the replica to link", Duration::from_secs(10), || {
        replicas(&master, "connected_slaves").as_deref() == Some("1")
    });

    let (code, stdout, _) = output(&mut on(&replica, &["doctor"]));
    assert_eq!(code, Some(2), "{stdout}");
    assert_check(&stdout, "role", "FAIL", &["replica", &master.addr()]);
    assert_check(&stdout, "permissions", "WARN", &["not probed"]);

    let (code, stdout, _) = output(&mut on(&master, &["doctor"]));
    assert_eq!(code, Some(1), "{stdout}");
    assert_check(
        &stdout,
        "replication",
        "WARN",
        &["1 replica", "min-replicas-to-write 1"],
    );

    master.cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    wait_for(
        "the replica to count as good",
        Duration::from_secs(10),
        || replicas(&master, "min_slaves_good_slaves").as_deref() == Some("1"),
    );
    let (code, stdout, _) = output(&mut on(&master, &["doctor"]));
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn a_clock_fence_ahead_of_the_server_clock_fails() {
    let server = RedisServer::start();
    let future = server_time_us(&server) + 2 * 3_600_000_000;
    server.cmd(&["SET", "jobs:{nightly}:fence", &future.to_string()]);
    let (code, stdout, _) = output(&mut on(&server, &["--prefix", "jobs:", "doctor"]));
    assert_eq!(code, Some(2), "{stdout}");
    assert_check(
        &stdout,
        "fences",
        "FAIL",
        &["2.0 h behind", "jobs:{nightly}:fence", "goes backwards"],
    );
    // Only fences under the prefix are compared.
    let (code, stdout, _) = output(&mut on(&server, &["doctor"]));
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn a_user_missing_a_permission_is_told_which() {
    let server = RedisServer::start();
    let without = |part: &str| -> Vec<String> {
        readme_acl_rule()
            .into_iter()
            .filter(|p| p != part)
            .collect()
    };
    for (part, code, status) in [("+zadd", 2, "FAIL"), ("&lock:*", 1, "WARN")] {
        let url = server.acl_user("app", &without(part));
        let (got, stdout, stderr) = output(&mut at(&url, &["doctor"]));
        assert_eq!(got, Some(code), "without {part}: {stdout}{stderr}");
        assert_check(&stdout, "permissions", status, &[part, "Redis permissions"]);
        assert!(
            !stdout.contains(ACL_PASSWORD) && !stderr.contains(ACL_PASSWORD),
            "{stdout}{stderr}"
        );
        let (_, json, _) = output(&mut at(&url, &["doctor", "--json"]));
        let json: serde_json::Value = serde_json::from_str(&json).expect("doctor --json");
        assert_eq!(json["status"], status, "{json}");
        assert!(
            json["url"].as_str().is_some_and(|u| u.contains("app:***@")),
            "{json}"
        );
    }
    assert_eq!(server.query::<i64>(&["DBSIZE"]), 0, "probe keys left");
}

/// A user who may not `GET` (which the scripts and the audit's fence scan
/// need) is told so in the permissions row, and every other row is
/// printed.
#[test]
fn a_user_who_may_not_get_is_told_in_the_permissions_row() {
    let server = RedisServer::start();
    let fence = server_time_us(&server).to_string();
    for i in 0..50 {
        server.cmd(&["SET", &format!("lock:job{i}:fence"), &fence]);
    }
    let rule: Vec<String> = readme_acl_rule()
        .into_iter()
        .filter(|p| p != "+get")
        .collect();
    let url = server.acl_user("app", &rule);
    let (code, stdout, stderr) = output(&mut at(&url, &["doctor"]));
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert_check(&stdout, "permissions", "FAIL", &["+get"]);
    assert_check(&stdout, "fences", "WARN", &["+get"]);
    for row in ["version", "eviction", "clock", "rtt"] {
        assert_check(&stdout, row, "OK", &[]);
    }
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.lines().all(|l| l.len() < 2000), "{stdout}");
}
