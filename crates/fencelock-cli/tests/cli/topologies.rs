//! The command line on every topology: TLS with `--tls-ca` (and
//! `FENCELOCK_TLS_CA`), `--tls-cert`/`--tls-key` for mutual TLS, `top`
//! across the shards of a Cluster, `run` and `status` behind Sentinel, and
//! `run --replicas`.

use std::process::{Output, Stdio};
use std::time::Duration;

use fencelock_testkit::{
    ClientAuth, RedisCluster, RedisConfig, RedisSentinel, RedisServer, TlsConfig, spawn_guarded,
};

use crate::support::{exists, fencelock};

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
