//! The command line on every topology: TLS with `--tls-ca` (and
//! `FENCELOCK_TLS_CA`), `--tls-cert`/`--tls-key` for mutual TLS, `top`
//! across the shards of a Cluster, `run` and `status` behind Sentinel,
//! `run --replicas`, a waiting `run` behind a master that refuses writes
//! (`min-replicas-to-write`), and resource writes across a failover.

use std::process::{Output, Stdio};
use std::time::Duration;

use fencelock_testkit::{
    ClientAuth, RedisCluster, RedisConfig, RedisSentinel, RedisServer, SentinelNode, TlsConfig,
    spawn_guarded,
};

use crate::support::{exists, fencelock, wait_for};

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tls_options_reach_every_command() {
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_tls(TlsConfig::default().with_client_auth(ClientAuth::Required)),
    );
    let files = server.tls_files().expect("TLS files").clone();
    let ca = files.ca_cert.to_string_lossy().into_owned();
    let cert = files.client_cert.to_string_lossy().into_owned();
    let key = files.client_key.to_string_lossy().into_owned();
    let url = server.url();
    let out = fencelock(&[
        "--redis",
        &url,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "run",
        "t",
        "--",
        "true",
    ])
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // The same through the environment.
    let out = fencelock(&["--redis", &url, "status", "t", "--json"])
        .env("FENCELOCK_TLS_CA", &ca)
        .env("FENCELOCK_TLS_CERT", &cert)
        .env("FENCELOCK_TLS_KEY", &key)
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // Without the CA: a TLS error that says what to do, exit 78.
    let out = fencelock(&["--redis", &url, "status", "t"])
        .output()
        .expect("status");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("--tls-ca"), "{err}");
    // A certificate without its key: usage.
    let out = fencelock(&[
        "--redis",
        &url,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "status",
        "t",
    ])
    .output()
    .expect("status");
    assert_eq!(out.status.code(), Some(64), "{:?}", text(&out));
}

#[test]
fn run_replicas_waits_for_the_replicas_or_exits_75() {
    let primary = RedisServer::start();
    let _replica = primary.start_replica();
    let url = primary.url();
    let out = fencelock(&[
        "--redis",
        &url,
        "run",
        "--replicas",
        "1",
        "job",
        "--",
        "true",
    ])
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = fencelock(&[
        "--redis",
        &url,
        "run",
        "--no-wait",
        "--replicas",
        "2",
        "--replica-timeout",
        "50ms",
        "job",
        "--",
        "true",
    ])
    .output()
    .expect("run");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("only 1 of 2 replicas"), "{err}");
    assert!(
        !exists(&primary, "lock:{job}"),
        "the grant was not released"
    );
}

#[test]
fn cluster_top_shows_the_locks_of_every_shard() {
    let cluster = RedisCluster::start();
    let url = cluster.cluster_url();
    let mut holders = Vec::new();
    for i in 0..12 {
        let name = format!("shard:{i}");
        let mut run = fencelock(&[
            "--redis", &url, "run", "--ttl", "30s", &name, "--", "sleep", "30",
        ]);
        run.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        holders.push(spawn_guarded(run));
    }
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let out = fencelock(&["--redis", &url, "top", "shard:*", "--once", "--json"])
            .output()
            .expect("top");
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top prints JSON");
        let n = rows.as_array().map_or(0, Vec::len);
        if n == 12 {
            break rows;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "top saw {n} of 12 locks"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let keys: Vec<String> = rows
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["key"].as_str().unwrap_or_default().to_owned())
        .collect();
    let shards: std::collections::BTreeSet<usize> =
        keys.iter().map(|k| cluster.owner_of_key(k)).collect();
    assert_eq!(shards.len(), 3, "12 names on {shards:?}");
    drop(holders);
}

#[test]
fn sentinel_run_and_status_find_the_master() {
    let sentinel = RedisSentinel::start();
    let url = sentinel.url();
    let out = fencelock(&["--redis", &url, "run", "job", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = fencelock(&["--redis", &url, "status", "job", "--json"])
        .output()
        .expect("status");
    let (stdout, _) = text(&out);
    let status: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON");
    assert_eq!(status["held"], false);
    assert!(status["last_fence"].as_u64().is_some(), "{stdout}");
    // A bad sentinel URL is a usage error naming what is wrong.
    let out = fencelock(&["--redis", "redis+sentinel://127.0.0.1:1", "status", "job"])
        .output()
        .expect("status");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("names the master"), "{err}");
}

/// A master under `min-replicas-to-write 1` with its replica gone:
/// refuses every write with `NOREPLICAS`.
fn master_without_its_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let mut replica = primary.start_replica();
    primary.cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    replica.kill();
    wait_for(
        "the master to refuse writes",
        Duration::from_secs(10),
        || {
            primary
                .try_cmd(&["SET", "probe", "1"])
                .is_err_and(|e| e.code() == Some("NOREPLICAS"))
        },
    );
    (primary, replica)
}

/// `run --no-wait` refused by `NOREPLICAS` exits 75 naming it; a waiting
/// `run` keeps waiting through it, says why, and runs its command once the
/// replica is back.
#[test]
fn heavy_run_waits_through_noreplicas_and_no_wait_exits_75() {
    let (primary, mut replica) = master_without_its_replica();
    let url = primary.url();
    let out = fencelock(&["--redis", &url, "run", "--no-wait", "job", "--", "true"])
        .output()
        .expect("run");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("NOREPLICAS"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("stderr");
    let mut waiter = spawn_guarded({
        let mut c = fencelock(&["--redis", &url, "run", "--wait", "20s", "job", "--", "true"]);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"));
        c
    });
    let said = "waiting for job: the master refuses writes: NOREPLICAS";
    wait_for(
        "the waiter to say why it waits",
        Duration::from_secs(10),
        || std::fs::read_to_string(&log).is_ok_and(|s| s.contains(said)),
    );
    assert!(waiter.try_wait().is_none(), "the waiter gave up");
    replica.restart();
    let status = waiter.wait_timeout(Duration::from_secs(15));
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
    assert!(!err.contains("held by"), "{err}");
}

/// `run --replicas` that cannot be met: the waiting `run` says it waits for
/// replicas (never that its own grant is "held by" someone), exits 75
/// naming the reason, and leaves the lock free; behind a master that
/// refuses writes the reason is `NOREPLICAS`, not a raw pipeline error.
#[test]
fn heavy_run_replicas_unmet_says_why_and_leaves_the_lock_free() {
    let primary = RedisServer::start();
    let mut replica = primary.start_replica();
    replica.kill();
    let url = primary.url();
    let out = fencelock(&[
        "--redis",
        &url,
        "run",
        "--replicas",
        "1",
        "--wait",
        "1500ms",
        "job",
        "--",
        "true",
    ])
    .output()
    .expect("run");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("waiting for job: only 0 of 1 replicas acknowledged the grant"),
        "{err}"
    );
    assert!(!err.contains("held by"), "{err}");
    assert!(!exists(&primary, "lock:{job}"), "the lock was left held");

    primary.cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    let out = fencelock(&[
        "--redis",
        &url,
        "run",
        "--replicas",
        "1",
        "--no-wait",
        "job",
        "--",
        "true",
    ])
    .output()
    .expect("run");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("NOREPLICAS") && !err.contains("Pipeline"),
        "{err}"
    );
    assert!(!exists(&primary, "lock:{job}"), "the lock was left held");
}

/// Resource writes and a Sentinel failover: an update acknowledged by every
/// replica (`run --replicas 2` passes the wait to the nested `update`)
/// survives the master's death; one acknowledged without `--replicas`,
/// while the replicas were cut off, is lost with it; one with `--replicas`
/// then exits 4, saying it was applied.
#[test]
fn sentinel_failover_keeps_updates_acknowledged_by_replicas() {
    let mut sentinel = RedisSentinel::start();
    let url = sentinel.url();
    let bin = crate::support::BIN;
    let inc = format!("\"{bin}\" update counter -- sh -c 'read v; echo $(( ${{v:-0}} + 1 ))'");
    let run = |args: &[&str], script: &str| {
        let mut c = fencelock(&["--redis", &url, "run"]);
        c.args(args).args(["counter", "-c", script]);
        c.output().expect("run")
    };
    let out = run(&["--replicas", "2"], "test \"$FENCELOCK_REPLICAS\" = 2");
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = run(&["--replicas", "2"], &inc);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Cut the replicas off: each follows a master that is not there.
    let old = sentinel.primary();
    let nowhere = fencelock_testkit::free_port().to_string();
    for replica in sentinel.replicas() {
        sentinel
            .data_node(replica)
            .cmd(&["REPLICAOF", "127.0.0.1", &nowhere]);
    }
    let out = run(
        &[],
        &format!("\"{bin}\" update --replicas 2 counter -- sh -c 'read v; echo $(( v + 1 ))'"),
    );
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("WAS applied") && err.contains("only 0 of 2 replicas"),
        "{err}"
    );
    let out = run(&[], &inc);
    assert_eq!(out.status.code(), Some(0), "acknowledged: {:?}", text(&out));

    sentinel.kill(SentinelNode::Data(old));
    sentinel.wait_new_primary(old);
    let out = fencelock(&["--redis", &url, "read", "counter"])
        .output()
        .expect("read");
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        stdout.starts_with("counter: \"1\""),
        "the update acknowledged by both replicas survives, the later ones are lost: {stdout}"
    );
}

/// A `run` started while the master is dead and the sentinels still name
/// it waits for the new master (saying why) instead of exiting 69.
#[test]
fn sentinel_run_started_during_a_failover_waits_for_the_new_master() {
    let mut sentinel = RedisSentinel::start();
    let url = sentinel.url();
    let old = sentinel.primary();
    sentinel.kill(SentinelNode::Data(old));
    let out = fencelock(&["--redis", &url, "run", "--wait", "20s", "job", "--", "true"])
        .output()
        .expect("run");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("waiting for job: "), "{err}");
}
