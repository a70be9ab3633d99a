//! Each row from what a server reports, without a server.

use super::*;
use crate::audit::Status;
use crate::keys::glob_escape;

fn info(lines: &[&str]) -> String {
    let mut text = String::from("# Server\r\n");
    for line in lines {
        text.push_str(line);
        text.push_str("\r\n");
    }
    text
}

#[test]
fn versions_before_7_fail() {
    let v = |s: &str| version(&info(&[&format!("redis_version:{s}")])).status();
    assert_eq!(v("7.0.15"), Status::Ok);
    assert_eq!(v("7.2.4"), Status::Ok);
    assert_eq!(v("8.0.0"), Status::Ok);
    assert_eq!(v("6.2.14"), Status::Fail);
    assert_eq!(v("5.0.7"), Status::Fail);
    assert_eq!(v("garbage"), Status::Warn);
    assert_eq!(version("").status(), Status::Warn);
}

#[test]
fn sentinels_behind_a_plain_url_fail_and_topologies_are_named() {
    let t = |mode: &str, topology_: Topology| {
        topology(&info(&[&format!("redis_mode:{mode}")]), topology_, 3)
    };
    assert_eq!(t("standalone", Topology::Standalone).status(), Status::Ok);
    assert_eq!(t("sentinel", Topology::Standalone).status(), Status::Fail);
    // A Cluster node given by a plain URL is connected to as a Cluster.
    let cluster = t("cluster", Topology::Cluster);
    assert_eq!(cluster.status(), Status::Ok);
    assert!(cluster.found().contains("3 masters"), "{cluster:?}");
    assert_eq!(t("standalone", Topology::Sentinel).status(), Status::Ok);
}

#[test]
fn replicas_fail_and_name_their_master() {
    let check = role(&info(&[
        "role:slave",
        "master_host:10.0.0.5",
        "master_port:6379",
    ]));
    assert_eq!(check.status(), Status::Fail);
    assert!(check.found().contains("10.0.0.5:6379"), "{check:?}");
    assert!(replication(&info(&["role:slave"])).is_none());
}

#[test]
fn min_replicas_to_write() {
    let r = |lines: &[&str]| {
        let mut all = vec!["role:master"];
        all.extend_from_slice(lines);
        replication(&info(&all)).map(|c| c.status())
    };
    assert_eq!(r(&["connected_slaves:0"]), Some(Status::Ok));
    assert_eq!(r(&["connected_slaves:2"]), Some(Status::Warn));
    assert_eq!(
        r(&["connected_slaves:2", "min_slaves_good_slaves:2"]),
        Some(Status::Ok)
    );
    assert_eq!(
        r(&["connected_slaves:0", "min_slaves_good_slaves:0"]),
        Some(Status::Fail)
    );
}

#[test]
fn persistence_depends_on_the_fence_mode() {
    let off = info(&["aof_enabled:0", "aof_last_write_status:ok"]);
    let on = info(&["aof_enabled:1", "aof_last_write_status:ok"]);
    let fsync = |p: &str| Reading::Got(vec!["appendfsync".to_owned(), p.to_owned()]);
    let denied = Reading::Refused(Error::NoPermission {
        detail: "run the command CONFIG|GET".to_owned(),
        fix: "+config|get".to_owned(),
    });
    assert_eq!(
        persistence(&off, FenceMode::Clock, None).status(),
        Status::Ok
    );
    assert_eq!(
        persistence(&off, FenceMode::Counter, None).status(),
        Status::Fail
    );
    assert_eq!(
        persistence(&on, FenceMode::Counter, Some(&fsync("always"))).status(),
        Status::Ok
    );
    assert_eq!(
        persistence(&on, FenceMode::Counter, Some(&fsync("everysec"))).status(),
        Status::Warn
    );
    let unknown = persistence(&on, FenceMode::Counter, Some(&denied));
    assert_eq!(unknown.status(), Status::Warn);
    assert!(unknown.found().contains("unknown"), "{unknown:?}");
    let broken = info(&["aof_enabled:1", "aof_last_write_status:err"]);
    assert_eq!(
        persistence(&broken, FenceMode::Clock, None).status(),
        Status::Fail
    );
}

#[test]
fn clocks_apart_by_more_than_a_second_warn() {
    let at = |server_offset_ms: i64, rtt_us: u64| {
        let local = 1_800_000_000_000_000_u64;
        let server = local.saturating_add_signed(server_offset_ms * 1000);
        clock(
            &ClockReading {
                server_us: server,
                local_before_us: local - rtt_us / 2,
                local_after_us: local + rtt_us / 2,
            },
            Duration::from_secs(9),
        )
    };
    assert_eq!(at(3, 200).status(), Status::Ok);
    assert_eq!(at(-900, 200).status(), Status::Ok);
    assert_eq!(at(1500, 200).status(), Status::Warn);
    assert_eq!(at(-1500, 200).status(), Status::Warn);
    assert!(at(-1500, 200).found().contains("behind"));
    assert!(at(3, 200).found().contains("jump forward under 6.0 s"));
    // Within the uncertainty of a slow round trip: not a skew.
    assert_eq!(at(1500, 2_000_000).status(), Status::Ok);
}

#[test]
fn a_clock_fence_ahead_of_the_server_clock_fails() {
    let mut scan = FenceScan::default();
    scan.add("lock:{a}:fence", Some("7"));
    scan.add("lock:{b}:fence", Some("1800000000000000"));
    scan.add("lock:{c}:fence", Some("1800000005000000"));
    scan.add("lock:{d}:fence", Some("not a number"));
    assert_eq!(scan.keys, 4);
    assert_eq!(scan.clock_fences, 2);
    let behind = fences(&scan, 1_800_000_004_000_000, "lock:");
    assert_eq!(behind.status(), Status::Fail);
    assert!(behind.found().contains("lock:{c}:fence"), "{behind:?}");
    assert_eq!(
        fences(&scan, 1_800_000_006_000_000, "lock:").status(),
        Status::Ok
    );
    assert_eq!(
        fences(&FenceScan::default(), 0, "lock:").status(),
        Status::Ok
    );
}

#[test]
fn round_trips_are_judged_against_the_ttl() {
    let ms = Duration::from_millis;
    let samples = [ms(1), ms(1), ms(2), ms(3), ms(90)];
    assert_eq!(rtt(&samples, ms(10_000)).status(), Status::Ok);
    assert_eq!(rtt(&samples, ms(30)).status(), Status::Warn);
    assert!(rtt(&samples, ms(10_000)).found().contains("max 90.0 ms"));
}

#[test]
fn durations_read_well() {
    assert_eq!(show(Duration::from_micros(120)), "0.12 ms");
    assert_eq!(show(Duration::from_micros(12_340)), "12.3 ms");
    assert_eq!(show(Duration::from_millis(4200)), "4.2 s");
    assert_eq!(show(Duration::from_secs(150)), "2.5 min");
    assert_eq!(show(Duration::from_secs(3 * 3600)), "3.0 h");
    assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
}
