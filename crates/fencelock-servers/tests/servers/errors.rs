//! Failed starts name the one thing that failed.

use std::net::TcpListener;
use std::process::Command;

use fencelock_servers::{Error, EtcdCluster, EtcdConfig, RedisConfig, RedisServer};

/// Set for the child that runs [`missing_redis_server_entry`].
const ENTRY_ENV: &str = "FENCELOCK_SERVERS_TEST_ENTRY";

/// Runs `entry` of this test binary in a child process with `env` set and
/// returns what it wrote to stderr.
fn run_entry(entry: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = Command::new(exe);
    command
        .args(["--exact", entry, "--nocapture", "--test-threads", "1"])
        .env(ENTRY_ENV, "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().expect("run the entry");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Entry point of [`a_missing_binary_is_named_with_its_package`]: starts a
/// redis-server with the environment it was given and prints the error.
#[test]
fn missing_redis_server_entry() {
    if std::env::var_os(ENTRY_ENV).is_none() {
        return;
    }
    match RedisServer::start(RedisConfig::default()) {
        Ok(server) => eprintln!("started on port {}", server.port()),
        Err(error) => eprintln!(
            "error: {error} (missing binary: {})",
            error.is_missing_binary()
        ),
    }
}

#[test]
fn a_missing_binary_is_named_with_its_package() {
    let empty = tempfile::tempdir().expect("tempdir");
    let path = empty.path().to_str().expect("utf-8 path");
    let said = run_entry(
        "errors::missing_redis_server_entry",
        &[("PATH", path), ("FENCELOCK_REDIS_SERVER_BIN", "")],
    );
    assert!(
        said.contains(
            "error: redis-server not found on PATH: install it with `apt-get install -y redis-server` (or set FENCELOCK_REDIS_SERVER_BIN) (missing binary: true)"
        ),
        "{said}"
    );
    let said = run_entry(
        "errors::missing_redis_server_entry",
        &[("FENCELOCK_REDIS_SERVER_BIN", "/nonexistent/redis-server")],
    );
    assert!(
        said.contains(
            "error: FENCELOCK_REDIS_SERVER_BIN=/nonexistent/redis-server is not an executable file"
        ),
        "{said}"
    );
}

#[test]
fn a_port_in_use_is_named_with_the_servers_log_line() {
    let mut server = RedisServer::start(RedisConfig::default()).expect("starts");
    let port = server.port();
    server.kill();
    let _taken = TcpListener::bind(("127.0.0.1", port)).expect("the killed server's port");
    let error = server.start_again(&[]).expect_err("the port is taken");
    assert!(matches!(error, Error::Exited { .. }), "{error:?}");
    assert_eq!(error.port(), Some(port));
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "redis-server on port {port} exited during start-up"
        )),
        "{message}"
    );
    assert!(message.contains("Failed listening on port"), "{message}");
    assert!(
        error
            .log()
            .is_some_and(|log| log.contains("Address already in use")),
        "{error:?}"
    );
}

#[test]
fn a_server_that_dies_during_start_up_is_named_with_its_log_line() {
    let config = RedisConfig::default().with_args(["--no-such-directive", "x"]);
    let error = RedisServer::start(config).expect_err("a bad directive");
    assert!(matches!(error, Error::Exited { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("redis-server on port"), "{message}");
    assert!(
        message.ends_with("Bad directive or wrong number of arguments"),
        "{message}"
    );
    assert!(
        error
            .log()
            .is_some_and(|log| log.contains("no-such-directive")),
        "{error:?}"
    );
}

#[test]
fn an_etcd_member_that_dies_during_start_up_is_named_with_its_log_line() {
    // etcd refuses an election timeout shorter than 5 heartbeats.
    let config = EtcdConfig {
        members: 1,
        heartbeat_ms: 500,
        election_ms: 100,
        ..EtcdConfig::default()
    };
    let error = EtcdCluster::start(config).expect_err("bad timeouts");
    assert!(matches!(error, Error::Exited { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with("etcd member m0 (client port "),
        "{message}"
    );
    assert!(message.contains("election-timeout"), "{message}");
}

#[test]
fn an_etcd_port_in_use_is_named_on_restart() {
    let mut cluster = EtcdCluster::start(EtcdConfig {
        members: 1,
        ..EtcdConfig::default()
    })
    .expect("starts");
    let port = cluster.members()[0].client_port();
    cluster.kill(0);
    let _taken = TcpListener::bind(("127.0.0.1", port)).expect("the killed member's port");
    let error = cluster.restart(0).expect_err("the port is taken");
    assert_eq!(error.port(), Some(port), "{error:?}");
    assert!(
        error
            .log()
            .is_some_and(|log| log.contains("address already in use")),
        "{error:?}"
    );
}

#[test]
fn bad_setups_are_refused_before_anything_starts() {
    let even = EtcdCluster::start(EtcdConfig {
        members: 2,
        ..EtcdConfig::default()
    })
    .expect_err("two members");
    assert!(matches!(even, Error::Config(_)), "{even:?}");
    let few = fencelock_servers::ClusterSetup::start(fencelock_servers::ClusterConfig {
        masters: 2,
        ..Default::default()
    })
    .expect_err("two masters");
    assert_eq!(
        few.to_string(),
        "invalid set-up: a Redis Cluster needs at least 3 masters, not 2"
    );
}
