//! A redis-server and an etcd member through pause, kill, wipe and start
//! again.

use std::time::Duration;

use fencelock_servers::{
    EtcdCluster, EtcdConfig, Persistence, RedisConfig, RedisServer, process_alive,
    wait_process_gone,
};

const TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn a_redis_server_pauses_restarts_with_or_without_its_data_and_dies_when_dropped() {
    let mut server =
        RedisServer::start(RedisConfig::default().with_persistence(Persistence::AofAlways))
            .expect("starts");
    let port = server.port();
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    let _: () = server.query(&["SET", "k", "v"], TIMEOUT).expect("SET");

    server.pause().expect("pauses");
    assert!(server.is_paused());
    assert!(
        server
            .command(&["PING"], Duration::from_millis(300))
            .is_err()
    );
    server.resume();

    let old = server.pid();
    server.restart().expect("restarts");
    assert_ne!(server.pid(), old);
    assert_eq!(server.port(), port);
    let kept: Option<String> = server.query(&["GET", "k"], TIMEOUT).expect("GET");
    assert_eq!(kept.as_deref(), Some("v"), "the append-only file kept it");

    server.kill();
    server.wipe_data().expect("wipes");
    server.start_again(&[]).expect("starts again");
    let gone: Option<String> = server.query(&["GET", "k"], TIMEOUT).expect("GET");
    assert_eq!(gone, None);
    assert!(server.log().contains("Ready to accept connections"));

    let (pid, dir) = (server.pid(), server.dir().to_owned());
    drop(server);
    assert!(wait_process_gone(pid, Duration::from_secs(5)));
    assert!(!dir.exists());
}

#[test]
fn an_etcd_member_is_healthy_over_http_restarts_and_dies_with_its_cluster() {
    let mut cluster = EtcdCluster::start(EtcdConfig {
        members: 1,
        ..EtcdConfig::default()
    })
    .expect("starts");
    assert!(cluster.url().starts_with("etcd://127.0.0.1:"));
    let old = cluster.pid(0).expect("running");
    cluster.restart(0).expect("restarts");
    let pid = cluster.pid(0).expect("running again");
    assert_ne!(pid, old);
    assert!(!process_alive(old));
    let dir = cluster.dir().to_owned();
    drop(cluster);
    assert!(wait_process_gone(pid, Duration::from_secs(5)));
    assert!(!dir.exists());
}
