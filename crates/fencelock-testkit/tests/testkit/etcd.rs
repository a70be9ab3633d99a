//! `EtcdCluster`: real etcd members with fault controls. Each test name
//! contains `etcd`, so nextest runs them one at a time.

use std::time::Instant;

use crate::GONE_TIMEOUT;
use fencelock_testkit::EtcdCluster;
use fencelock_testkit::process::{process_alive, wait_process_gone};

#[test]
fn etcd_cluster_of_three_elects_moves_and_survives_a_killed_leader() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::start();
    eprintln!("3 etcd members healthy in {:?}", started.elapsed());
    assert_eq!(cluster.len(), 3);
    let url = cluster.url();
    assert!(url.starts_with("etcd://127.0.0.1:"), "{url}");
    assert_eq!(url.matches(',').count(), 2, "{url}");
    let ids: Vec<u64> = (0..3).map(|i| cluster.member_id(i)).collect();
    assert!(ids.iter().all(|id| *id != 0) && ids[0] != ids[1] && ids[1] != ids[2]);

    let leader = cluster.leader();
    let target = (leader + 1) % 3;
    cluster.move_leader(target);
    assert_eq!(cluster.leader(), target);

    let pid = cluster.pid(target).expect("running");
    cluster.kill(target);
    assert!(wait_process_gone(pid, GONE_TIMEOUT));
    assert_eq!(cluster.pid(target), None);
    let elected = cluster.wait_new_leader(target);
    assert_ne!(elected, target);
    cluster
        .etcdctl(&["put", "k", "v"])
        .expect("a quorum of two commits");

    cluster.restart(target);
    assert!(cluster.pid(target).is_some());
    let read = cluster
        .etcdctl_on(target, &["get", "k", "--print-value-only"])
        .expect("the restarted member answers");
    assert_eq!(read.trim(), "v", "it kept its data");
}

#[test]
fn etcd_single_member_pauses_and_dies_with_its_cluster() {
    let cluster = EtcdCluster::single();
    assert_eq!(cluster.len(), 1);
    assert_eq!(cluster.leader(), 0);
    let pid = cluster.pid(0).expect("running");
    {
        let _paused = cluster.pause_guard(0);
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(state.contains(") T "), "{state}");
        assert!(
            cluster.etcdctl(&["get", "k"]).is_err(),
            "a paused member answers nothing"
        );
    }
    cluster.etcdctl(&["put", "k", "v"]).expect("resumed");
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    assert!(wait_process_gone(pid, GONE_TIMEOUT));
    assert!(!process_alive(pid));
    assert!(!dir.exists(), "its directory is removed");
}
