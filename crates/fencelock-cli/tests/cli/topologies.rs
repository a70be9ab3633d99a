//! The command line on every topology: TLS with `--tls-ca` (and
//! `FENCELOCK_TLS_CA`), `--tls-cert`/`--tls-key` for mutual TLS, `top`
//! across the shards of a Cluster, `run` and `status` behind Sentinel,
//! `run --replicas`, a waiting `run` behind a master that refuses writes
//! (`min-replicas-to-write`), resource writes across a failover, and refused
//! credentials on every topology.

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

/// Refused credentials exit 78 (configuration) on every topology, never 69
/// or 70: a wrong password for a Cluster's ACL user; behind Sentinel, a
/// wrong password for the data nodes and for the sentinels' own user; on
/// etcd, credentials given to a cluster without authentication, none given
/// to one with it, and a wrong password. `torture` against such a
/// deployment says the same before any worker starts.
#[test]
fn heavy_refused_credentials_exit_78_on_cluster_sentinel_and_etcd() {
    let refused = |url: &str, says: &str| {
        for args in [
            &["status", "job"][..],
            &["run", "job", "--", "true"],
            &["torture", "--duration", "2s"],
        ] {
            let out = fencelock(&["--url", url])
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("fencelock");
            let (stdout, err) = text(&out);
            assert_eq!(out.status.code(), Some(78), "{url} {args:?}: {stdout}{err}");
            assert!(err.contains(says), "{url} {args:?}: {err}");
            assert!(!err.contains("wrong-pw"), "{err}");
        }
    };

    let cluster = RedisCluster::start();
    for node in cluster.nodes() {
        node.cmd(&[
            "ACL",
            "SETUSER",
            "alice",
            "on",
            ">alice-pw",
            "~*",
            "&*",
            "+@all",
        ]);
    }
    let seeds = cluster
        .nodes()
        .iter()
        .map(RedisServer::addr)
        .collect::<Vec<_>>()
        .join(",");
    refused(
        &format!("redis+cluster://alice:wrong-pw@{seeds}"),
        "refused authentication",
    );
    drop(cluster);

    let sentinel = RedisSentinel::start_with(
        fencelock_testkit::RedisSentinelConfig {
            replicas: 1,
            sentinels: 1,
            quorum: 1,
            ..Default::default()
        }
        .with_data(RedisConfig::default().with_password("data-pw")),
    );
    sentinel
        .sentinel(0)
        .cmd(&["ACL", "SETUSER", "watcher", "on", ">watch-pw", "+@all"]);
    let hosts = sentinel.sentinel_addrs().join(",");
    let master = sentinel.master_name().to_owned();
    refused(
        &format!("redis+sentinel://:wrong-pw@{hosts}/{master}"),
        "refused authentication",
    );
    refused(
        &format!(
            "redis+sentinel://:data-pw@{hosts}/{master}?sentinel_user=watcher&sentinel_password=wrong-pw"
        ),
        "refused authentication",
    );
    drop(sentinel);

    let etcd = fencelock_testkit::EtcdCluster::single();
    let addr = etcd.addr(0);
    refused(&format!("etcd://root:root-pw@{addr}"), "authentication off");
    etcd.etcdctl(&["user", "add", "root:root-pw"])
        .expect("user add");
    etcd.etcdctl(&["auth", "enable"]).expect("auth enable");
    refused(&format!("etcd://{addr}"), "requires authentication");
    refused(&format!("etcd://root:wrong-pw@{addr}"), "refused");
}

/// The client's own TLS files are checked before the handshake and a
/// failed handshake names its cause, each exit 78: a CA file with no
/// certificate, a key that is not the certificate's, a client certificate
/// of another CA, `rediss://` to a plaintext port.
#[test]
fn tls_problems_name_their_cause_and_exit_78() {
    let certs = fencelock_testkit::TestCerts::generate();
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_tls(TlsConfig::with_certs(certs.clone()).with_client_auth(ClientAuth::Required)),
    );
    let files = server.tls_files().expect("TLS files").clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_string_lossy().into_owned()
    };
    let no_cert = write("no-cert.pem", &certs.client.key_pem);
    let other_cert = write("other.crt", &certs.client_other_ca.cert_pem);
    let other_key = write("other.key", &certs.client_other_ca.key_pem);
    let ca = files.ca_cert.to_string_lossy().into_owned();
    let cert = files.client_cert.to_string_lossy().into_owned();
    let key = files.client_key.to_string_lossy().into_owned();
    let url = server.url();
    let plain = RedisServer::start();
    let plain_url = format!("rediss://{}", plain.addr());
    let cases: [(&str, [&str; 6], &str); 3] = [
        (
            &url,
            ["--tls-ca", &no_cert, "--tls-cert", &cert, "--tls-key", &key],
            "holds no PEM certificate",
        ),
        (
            &url,
            [
                "--tls-ca",
                &ca,
                "--tls-cert",
                &cert,
                "--tls-key",
                &other_key,
            ],
            "does not belong to the client certificate",
        ),
        (
            &url,
            [
                "--tls-ca",
                &ca,
                "--tls-cert",
                &other_cert,
                "--tls-key",
                &other_key,
            ],
            "refused this client's certificate",
        ),
    ];
    for (url, tls, says) in cases {
        let out = fencelock(&["--url", url])
            .args(tls)
            .args(["status", "t"])
            .output()
            .expect("status");
        let (_, err) = text(&out);
        assert_eq!(out.status.code(), Some(78), "{says}: {err}");
        assert!(err.contains(says), "{err}");
    }
    let out = fencelock(&["--url", &plain_url, "status", "t"])
        .output()
        .expect("status");
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("does not speak TLS"), "{err}");
}

/// `run --tls-ca/--tls-cert/--tls-key` passes the TLS files to its command
/// (`FENCELOCK_TLS_*`, absolute paths), so a nested `fencelock update`
/// reaches the same TLS store, also from another directory.
#[test]
fn run_passes_the_tls_files_to_its_command() {
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_tls(TlsConfig::default().with_client_auth(ClientAuth::Required)),
    );
    let files = server.tls_files().expect("TLS files").clone();
    let dir = files.ca_cert.parent().expect("the TLS directory");
    let name = |p: &std::path::Path| {
        p.file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned()
    };
    let (ca, cert, key) = (
        name(&files.ca_cert),
        name(&files.client_cert),
        name(&files.client_key),
    );
    let out = fencelock(&[
        "--url",
        &server.url(),
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "run",
        "job",
        "-c",
        "cd / && \"$FENCELOCK_BIN\" update doc -- sh -c 'echo nested' && env",
    ])
    .current_dir(dir)
    .stdin(Stdio::null())
    .output()
    .expect("run");
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{err}");
    assert!(
        stdout.contains(&format!("FENCELOCK_TLS_CA={}", files.ca_cert.display())),
        "{stdout}"
    );
    let out = fencelock(&["--url", &server.url(), "read", "doc"])
        .env("FENCELOCK_TLS_CA", &files.ca_cert)
        .env("FENCELOCK_TLS_CERT", &files.client_cert)
        .env("FENCELOCK_TLS_KEY", &files.client_key)
        .output()
        .expect("read");
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(stdout.contains("nested"), "{stdout}");
}
