//! `RedisCluster`: a real 3 + 3 Redis Cluster with fault controls. Each test
//! name contains `cluster`, so nextest runs them one at a time (the `heavy`
//! group in `.config/nextest.toml`).

use std::time::Instant;

use crate::GONE_TIMEOUT;
use fencelock_testkit::process::wait_process_gone;
use fencelock_testkit::{FailoverMode, RedisCluster};

fn started() -> RedisCluster {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    eprintln!("cluster ready in {:?}", started.elapsed());
    cluster
}

#[test]
fn cluster_starts_ready_and_tagged_keys_share_a_node() {
    let cluster = started();
    assert_eq!(cluster.len(), 6);
    let masters = cluster.masters();
    let replicas = cluster.replicas();
    assert_eq!(masters.len(), 3, "{masters:?}");
    assert_eq!(replicas.len(), 3, "{replicas:?}");
    for &replica in &replicas {
        let master = cluster.master_of(replica).expect("a replica has a master");
        assert!(masters.contains(&master));
        let info: String = cluster.node(replica).query(&["INFO", "replication"]);
        assert!(info.contains("master_link_status:up"), "{info}");
    }
    for &master in &masters {
        assert_eq!(cluster.replicas_of(master).len(), 1);
        assert_eq!(cluster.master_of(master), None);
    }
    for node in cluster.nodes() {
        let info: String = node.query(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(node.port() < 55535);
    }

    let seeds = cluster.seed_urls();
    assert_eq!(seeds.len(), 6);
    assert_eq!(
        seeds[0],
        format!("redis://127.0.0.1:{}/", cluster.node(0).port())
    );
    let url = cluster.cluster_url();
    assert!(url.starts_with("redis+cluster://127.0.0.1:"), "{url}");
    assert_eq!(url.matches(',').count(), 5, "{url}");

    // Keys of one {tag} share a slot and a node; the slot matches Redis'.
    let (lock, fence) = ("lock:{job}", "lock:{job}:fence");
    let slot = RedisCluster::slot_of_key(lock);
    assert_eq!(slot, RedisCluster::slot_of_key(fence));
    let keyslot: u16 = cluster.node(0).query(&["CLUSTER", "KEYSLOT", lock]);
    assert_eq!(slot, keyslot);
    let owner = cluster.owner_of_key(lock);
    assert_eq!(owner, cluster.owner_of_key(fence));
    assert_eq!(owner, cluster.owner_of_slot(slot));
    cluster
        .node(owner)
        .cmd(&["MSET", lock, "holder", fence, "7"]);
    assert_eq!(cluster.node(owner).query::<i64>(&["INCR", fence]), 8);
    let other = masters
        .iter()
        .copied()
        .find(|&m| m != owner)
        .expect("3 masters");
    let moved = cluster
        .node(other)
        .try_cmd(&["GET", lock])
        .expect_err("MOVED");
    assert_eq!(
        moved.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
        "expected MOVED from a non-owner: {moved}"
    );

    // A redis-cli call goes through a timeout.
    let check = cluster.cli(0, &["--cluster", "check", &cluster.node(0).addr()]);
    assert!(
        check
            .as_deref()
            .is_ok_and(|out| out.contains("All 16384 slots covered")),
        "{check:?}"
    );

    let pids = cluster.pids();
    let dir = cluster.dir().to_owned();
    cluster.pause(replicas[0]); // Drop must also end a paused node.
    drop(cluster);
    for pid in pids {
        assert!(
            wait_process_gone(pid, GONE_TIMEOUT),
            "node {pid} survived drop"
        );
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn cluster_failover_swaps_roles() {
    let cluster = started();
    let master = cluster.owner_of_key("lock:{job}");
    let replica = cluster.replicas_of(master)[0];
    cluster.node(master).cmd(&["SET", "lock:{job}", "1"]);

    let started = Instant::now();
    cluster.failover(replica);
    eprintln!("CLUSTER FAILOVER done in {:?}", started.elapsed());

    assert!(cluster.masters().contains(&replica));
    assert_eq!(cluster.master_of(master), Some(replica));
    assert_eq!(cluster.replicas_of(replica), [master]);
    assert_eq!(cluster.owner_of_key("lock:{job}"), replica);
    let role: Vec<redis::Value> = cluster.node(replica).query(&["ROLE"]);
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    // Replication kept the key.
    assert_eq!(
        cluster
            .node(replica)
            .query::<Option<String>>(&["GET", "lock:{job}"]),
        Some("1".to_owned())
    );

    // And back, with TAKEOVER (no election).
    cluster.failover_with(master, FailoverMode::Takeover);
    assert_eq!(cluster.owner_of_key("lock:{job}"), master);
}

#[test]
fn cluster_killed_master_is_replaced_by_its_replica_and_rejoins_as_replica() {
    let mut cluster = started();
    let master = cluster.owner_of_key("{job}");
    let replica = cluster.replicas_of(master)[0];
    let (old_pid, port) = (cluster.node(master).pid(), cluster.node(master).port());

    let started = Instant::now();
    cluster.kill(master);
    assert!(wait_process_gone(old_pid, GONE_TIMEOUT));
    assert_eq!(cluster.wait_replaced(master), replica);
    eprintln!("killed master replaced in {:?}", started.elapsed());
    assert_eq!(cluster.owner_of_key("{job}"), replica);
    cluster.node(replica).cmd(&["SET", "{job}", "after"]);

    let started = Instant::now();
    cluster.restart(master);
    eprintln!("restarted node healthy in {:?}", started.elapsed());
    assert_eq!(cluster.node(master).port(), port);
    assert_ne!(cluster.node(master).pid(), old_pid);
    assert_eq!(cluster.master_of(master), Some(replica));
    assert_eq!(cluster.masters().len(), 3);
}

#[test]
fn cluster_paused_master_is_replaced_and_slots_migrate() {
    let cluster = started();
    let master = cluster.owner_of_key("{paused}");
    let replica = cluster.replicas_of(master)[0];
    {
        let _paused = cluster.pause_guard(master);
        let started = Instant::now();
        assert_eq!(cluster.wait_replaced(master), replica);
        eprintln!("paused master replaced in {:?}", started.elapsed());
    }
    // Resumed, the old master learns it lost its slots and follows.
    cluster.wait_healthy();
    assert_eq!(cluster.master_of(master), Some(replica));

    // Move the slot of {moving} by hand to another master.
    let key = "k:{moving}";
    let slot = RedisCluster::slot_of_key(key);
    let from = cluster.owner_of_slot(slot);
    cluster.node(from).cmd(&["SET", key, "v"]);
    let to = cluster
        .masters()
        .into_iter()
        .find(|&m| m != from)
        .expect("another master");
    cluster.migrate_slot(slot, to);
    assert_eq!(cluster.owner_of_slot(slot), to);
    assert_eq!(
        cluster.node(to).query::<Option<String>>(&["GET", key]),
        Some("v".to_owned())
    );
    assert!(cluster.keys_in_slot(from, slot, 10).is_empty());
}
