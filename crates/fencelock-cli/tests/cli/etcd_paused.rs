//! etcd with members paused (SIGSTOP: the ports stay open, nothing
//! answers): `run` and `status` do not wait on the paused member, and
//! `doctor` reports it as a row, within two probe timeouts. Every test name
//! contains `etcd` (nextest runs them one at a time).

use std::process::Command;
use std::time::{Duration, Instant};

use fencelock_testkit::EtcdCluster;

use crate::support::{fencelock, output};

/// `fencelock --url URL ARGS`.
fn at(cluster: &EtcdCluster, args: &[&str]) -> Command {
    let mut cmd = fencelock(&["--url", &cluster.url()]);
    cmd.args(args);
    cmd
}

/// Runs `cmd`: its exit code, stdout, stderr and how long it took.
fn timed(cmd: &mut Command) -> (Option<i32>, String, String, Duration) {
    let started = Instant::now();
    let (code, out, err) = output(cmd);
    (code, out, err, started.elapsed())
}

/// A member that is not the leader.
fn follower(cluster: &EtcdCluster) -> usize {
    let leader = cluster.leader();
    (0..cluster.len())
        .find(|&i| i != leader)
        .expect("three members")
}

/// With one member of three paused, every `status` and `run` takes well
/// under 3 s (8 s and 4 s measured when the client waited on the paused
/// member): each process starts at a random member, and six of each make
/// it all but certain that some start at the paused one.
#[test]
fn etcd_run_and_status_do_not_wait_on_a_paused_member() {
    let cluster = EtcdCluster::start();
    let paused = follower(&cluster);
    let _guard = cluster.pause_guard(paused);
    let mut slowest = Duration::ZERO;
    for i in 0..6 {
        let (code, out, err, took) = timed(&mut at(&cluster, &["status", "job"]));
        assert_eq!(code, Some(0), "status #{i}: {out}{err}");
        assert!(took < Duration::from_secs(3), "status #{i} took {took:?}");
        slowest = slowest.max(took);
        let (code, out, err, took) = timed(&mut at(&cluster, &["run", "job", "--", "true"]));
        assert_eq!(code, Some(0), "run #{i}: {out}{err}");
        assert!(took < Duration::from_secs(3), "run #{i} took {took:?}");
        slowest = slowest.max(took);
    }
    eprintln!("slowest call with m{paused} paused: {slowest:?}");
}

/// `doctor` with one member paused: a WARN health row naming it (exit 1),
/// within two probe timeouts (4 s). With two paused: FAIL rows (no
/// quorum, exit 2), every row printed, not a failed audit (69).
#[test]
fn etcd_doctor_reports_paused_members_as_rows_in_bounded_time() {
    let cluster = EtcdCluster::start();
    let paused = follower(&cluster);
    {
        let _guard = cluster.pause_guard(paused);
        for _ in 0..3 {
            let (code, out, err, took) = timed(&mut at(&cluster, &["doctor"]));
            assert_eq!(code, Some(1), "{out}{err}");
            assert!(
                out.contains("WARN  health") && out.contains(&format!("m{paused}")),
                "{out}"
            );
            assert!(out.contains("OK    rtt"), "{out}");
            assert!(
                took < Duration::from_secs(4),
                "doctor took {took:?}:\n{out}"
            );
        }
    }
    cluster.wait_healthy();
    let others: Vec<usize> = (0..cluster.len())
        .filter(|&i| i != follower(&cluster))
        .collect();
    let _a = cluster.pause_guard(others[0]);
    let _b = cluster.pause_guard(others[1]);
    let (code, out, err, took) = timed(&mut at(&cluster, &["doctor"]));
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        out.contains("FAIL  health") && out.contains("no quorum"),
        "{out}"
    );
    assert!(out.contains("FAIL  rtt"), "{out}");
    assert!(
        took < Duration::from_secs(10),
        "doctor took {took:?}:\n{out}"
    );
}
