//! `RedisSentinel`: a real primary, 2 replicas and 3 sentinels with fault
//! controls. Each test name contains `sentinel`, so nextest runs them one at
//! a time (the `heavy` group in `.config/nextest.toml`).

use std::time::{Duration, Instant};

use crate::GONE_TIMEOUT;
use fencelock_testkit::process::wait_process_gone;
use fencelock_testkit::{RedisConfig, RedisSentinel, RedisSentinelConfig, SentinelNode};
use redis::Value;

fn timed_start(config: RedisSentinelConfig) -> RedisSentinel {
    let started = Instant::now();
    let sentinel = RedisSentinel::start_with(config);
    eprintln!("sentinel quorum in {:?}", started.elapsed());
    sentinel
}

fn role(sentinel: &RedisSentinel, index: usize) -> String {
    let role: Vec<Value> = sentinel.data_node(index).query(&["ROLE"]);
    redis::from_redis_value(role[0].clone()).expect("role name")
}

#[test]
fn sentinel_starts_with_quorum_and_linked_replicas() {
    let sentinel = timed_start(RedisSentinelConfig::default());
    assert_eq!(sentinel.master_name(), "fencelock");
    assert_eq!(sentinel.data_nodes().len(), 3);
    assert_eq!(sentinel.sentinels().len(), 3);
    assert_eq!(sentinel.primary(), 0);
    assert_eq!(sentinel.replicas(), [1, 2]);
    assert_eq!(role(&sentinel, 0), "master");
    for replica in [1, 2] {
        assert_eq!(role(&sentinel, replica), "slave");
        let info: String = sentinel.data_node(replica).query(&["INFO", "replication"]);
        assert!(info.contains("master_link_status:up"), "{info}");
    }
    for node in sentinel.sentinels() {
        let ok: String = node.query(&["SENTINEL", "CKQUORUM", "fencelock"]);
        assert!(ok.starts_with("OK 3 usable Sentinels"), "{ok}");
    }
    let addrs = sentinel.sentinel_addrs();
    assert_eq!(
        sentinel.url(),
        format!("redis+sentinel://{}/fencelock", addrs.join(","))
    );
    // Writes on the primary reach the replicas.
    sentinel.primary_node().cmd(&["SET", "k", "v"]);
    sentinel.primary_node().cmd(&["WAIT", "2", "2000"]);
    assert_eq!(
        sentinel.data_node(1).query::<Option<String>>(&["GET", "k"]),
        Some("v".to_owned())
    );

    let pids = sentinel.pids();
    let dir = sentinel.dir().to_owned();
    sentinel.pause(SentinelNode::Data(0)); // Drop must also end a paused node.
    drop(sentinel);
    for pid in pids {
        assert!(
            wait_process_gone(pid, GONE_TIMEOUT),
            "process {pid} survived drop"
        );
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn sentinel_failover_moves_the_primary() {
    let mut sentinel = timed_start(RedisSentinelConfig::default());
    let started = Instant::now();
    let new = sentinel.failover();
    eprintln!("SENTINEL FAILOVER done in {:?}", started.elapsed());
    assert_ne!(new, 0);
    assert_eq!(sentinel.primary(), new);
    assert_eq!(role(&sentinel, new), "master");
    let other = 3 - new; // the replica that was not promoted
    assert_eq!(role(&sentinel, other), "slave");
    let info: String = sentinel.data_node(other).query(&["INFO", "replication"]);
    let port = sentinel.data_node(new).port();
    assert!(info.contains(&format!("master_port:{port}")), "{info}");

    // Sentinel rewrote the replica's config file: a restart keeps its role.
    let conf = std::fs::read_to_string(sentinel.data_node(other).dir().join("redis.conf"))
        .expect("redis.conf");
    assert!(
        conf.contains(&format!("replicaof 127.0.0.1 {port}")),
        "{conf}"
    );
    let pid = sentinel.data_node(other).pid();
    sentinel.restart(SentinelNode::Data(other));
    assert!(wait_process_gone(pid, GONE_TIMEOUT));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = sentinel.data_node(other).query(&["INFO", "replication"]);
        if info.contains(&format!("master_port:{port}")) && info.contains("master_link_status:up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted replica did not follow the new primary: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // (The old primary stays a master until a sentinel converts it, about
    // 10 s later; `wait_healthy` waits for that.)
}

#[test]
fn sentinel_paused_primary_is_replaced() {
    let sentinel = timed_start(RedisSentinelConfig::default());
    let old = sentinel.primary();
    let started = Instant::now();
    let _paused = sentinel.pause_guard(SentinelNode::Data(old));
    let new = sentinel.wait_new_primary(old);
    eprintln!("paused primary replaced in {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(role(&sentinel, new), "master");
}

#[test]
fn sentinel_data_nodes_take_extra_config_and_a_password() {
    let data = RedisConfig::default()
        .with_password("s3cret")
        .with_conf_line("min-replicas-to-write 1")
        .with_conf_line("min-replicas-max-lag 1")
        .with_conf_line("user alice on >alicepw ~* &* +@all");
    let mut sentinel = timed_start(RedisSentinelConfig::default().with_data(data));
    let primary = sentinel.primary_node();
    assert!(primary.url().contains(":s3cret@"), "{}", primary.url());
    let min: Vec<String> = primary.query(&["CONFIG", "GET", "min-replicas-to-write"]);
    assert_eq!(min, ["min-replicas-to-write", "1"]);
    primary.cmd(&["SET", "k", "v"]);
    let anonymous =
        redis::Client::open(format!("redis://127.0.0.1:{}/", primary.port())).expect("client");
    let mut con = anonymous.get_connection().expect("connect");
    let refused = redis::cmd("GET").arg("k").query::<Option<String>>(&mut con);
    assert!(
        refused.is_err(),
        "unauthenticated GET answered: {refused:?}"
    );
    let alice = redis::Client::open(format!(
        "redis://alice:alicepw@127.0.0.1:{}/",
        primary.port()
    ))
    .expect("client");
    let mut con = alice.get_connection().expect("connect as alice");
    let value: Option<String> = redis::cmd("GET")
        .arg("k")
        .query(&mut con)
        .expect("GET as alice");
    assert_eq!(value.as_deref(), Some("v"));

    // With both replicas frozen, min-replicas-to-write refuses writes.
    let (r1, r2) = (sentinel.replicas()[0], sentinel.replicas()[1]);
    {
        let _a = sentinel.pause_guard(SentinelNode::Data(r1));
        let _b = sentinel.pause_guard(SentinelNode::Data(r2));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match sentinel.primary_node().try_cmd(&["SET", "k", "w"]) {
                Err(error) if error.to_string().contains("NOREPLICAS") => break,
                other => assert!(
                    Instant::now() < deadline,
                    "writes still accepted without replicas: {other:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // A restarted sentinel comes back from its rewritten config.
    sentinel.restart(SentinelNode::Sentinel(0));
    assert_eq!(sentinel.wait_healthy(), 0);
}
