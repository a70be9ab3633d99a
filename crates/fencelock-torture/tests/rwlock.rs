//! Short real torture runs of the fenced read-write lock
//! (`Config::rwlock_reads`, `--primitive rwlock`): on a private
//! redis-server under its nemeses, and on a private etcd cluster under
//! member faults, a clean run passes every checker (C1–C7, C10–C12) with
//! readers sharing the lock, validated reads made and writers' writes
//! acknowledged; the negative control `unvalidated-read` (readers report
//! every read clean without validating it) is caught by C11, on both (and
//! on the Postgres resource, whose readers validate with
//! `FencedTable::read_validated`); and
//! a read-write lock run refuses the other primitives' controls and a
//! share of reads above 100 % before it starts.
//!
//! Workers are this test binary again, run as [`torture_worker_entry`]
//! (an ordinary test that does nothing unless its environment says so).

use std::time::Duration;

use fencelock::WaitMode;
use fencelock_testkit::PgServer;
use fencelock_torture::history::Entry;
use fencelock_torture::{
    Config, ErrorKind, History, NemesisKind, Report, ResourceKind, Topology, Variant,
};
use tokio_util::sync::CancellationToken;

mod support;

use support::{Etcd, SelfLauncher, Single};

/// Entry point of a worker process (does nothing as an ordinary test).
#[test]
fn torture_worker_entry() {
    support::worker_entry();
}

/// A short run of `config` on `topology`, with its history.
fn run_on(config: &mut Config, topology: &mut impl Topology) -> (Report, History) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("history.jsonl");
    config.history = Some(path.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = rt
        .block_on(fencelock_torture::run(
            config,
            topology,
            &SelfLauncher,
            &mut (),
            CancellationToken::new(),
        ))
        .expect("the run");
    let history = History::read(&path).expect("the saved history");
    (report, history)
}

/// A read-write lock run of 70 % reads, fair mode (as the CLI's default
/// for it), short.
fn rwlock(duration: Duration) -> Config {
    let mut config = Config::new();
    config.rwlock_reads = Some(70);
    config.mode = WaitMode::Fair;
    config.duration = duration;
    config.workers = 6;
    config.hold = Duration::from_millis(20);
    config.nemesis_interval = Duration::from_millis(400);
    config
}

/// What every clean read-write lock run shows: no violation, enough seen,
/// the checkers of a read-write lock each with something checked, readers
/// sharing the name and both sides working.
fn assert_clean(report: &Report, history: &History) {
    let text = report.to_text();
    assert_eq!(report.violations(), 0, "{text}");
    assert_eq!(report.inconclusive(), None, "{text}");
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id).collect();
    assert_eq!(
        ids,
        [
            "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C10", "C11", "C12"
        ],
        "{text}"
    );
    for id in ["C1", "C3", "C4", "C6", "C7", "C10", "C11", "C12"] {
        let c = report.checks.iter().find(|c| c.id == id).expect(id);
        assert!(c.checked > 0, "{id} checked nothing:\n{text}");
    }
    assert_eq!(
        history.header().and_then(|h| h.rwlock_reads),
        Some(70),
        "{text}"
    );
    let f = &report.figures;
    assert!(f.ops_acknowledged > 5, "writers wrote too little:\n{text}");
    assert!(f.reads > 10, "readers read too little:\n{text}");
    assert!(f.readers_max >= 2, "readers never shared the lock:\n{text}");
    let readers = history
        .events
        .iter()
        .filter(|e| matches!(&e.e, Entry::Granted { access: Some(a), .. } if a == "read"))
        .count();
    assert!(readers > 10, "{readers} read leases:\n{text}");
}

#[test]
fn a_clean_rwlock_run_passes_every_checker() {
    let mut config = rwlock(Duration::from_secs(8));
    config.nemeses = Some(vec![
        NemesisKind::PauseWorker,
        NemesisKind::PauseServer,
        NemesisKind::KillRestart,
        NemesisKind::ClientPause,
        NemesisKind::ClientKill,
        NemesisKind::ScriptFlush,
        NemesisKind::ProxyDelay,
        NemesisKind::ProxySwallow,
        NemesisKind::ProxyReset,
        NemesisKind::Revoke,
    ]);
    let mut single = Single::start();
    let (report, history) = run_on(&mut config, &mut single);
    assert_clean(&report, &history);
}

#[test]
fn the_unvalidated_read_control_is_caught_by_c11() {
    // Stops as soon as it is caught (a few seconds); the duration is the
    // margin of a loaded machine.
    let mut config = rwlock(Duration::from_secs(40));
    config.variant = Some(Variant::UnvalidatedRead);
    config.stop_on_violation = true;
    let mut single = Single::start();
    let (report, _history) = run_on(&mut config, &mut single);
    let text = report.to_text();
    // Readers that do not look at the stored fence report a later writer's
    // write as clean; the lock itself and the writers are fencelock's.
    assert_eq!(report.caught_by(), vec!["C11"], "{text}");
    let c11 = report.checks.iter().find(|c| c.id == "C11").expect("C11");
    let first = c11.first.as_ref().expect("the first violation");
    assert!(first.message.contains("reported its read"), "{text}");
    assert!(first.message.contains("clean"), "{text}");
}

#[test]
fn heavy_rwlock_on_etcd_passes_every_checker() {
    let mut config = rwlock(Duration::from_secs(10));
    // etcd's shortest lease is 1 s.
    config.ttl = Duration::from_secs(1);
    config.nemesis_interval = Duration::from_millis(700);
    config.nemeses = Some(vec![
        NemesisKind::PauseWorker,
        NemesisKind::PauseServer,
        NemesisKind::KillRestart,
        NemesisKind::ProxyReset,
        NemesisKind::Revoke,
    ]);
    let mut etcd = Etcd::start();
    let (report, history) = run_on(&mut config, &mut etcd);
    assert_eq!(history.header().map(|h| h.topology.as_str()), Some("etcd"));
    assert_clean(&report, &history);
    // Raft commits every grant to a quorum: nothing is excused on etcd.
    let text = report.to_text();
    assert!(report.checks.iter().all(|c| c.excused == 0), "{text}");
}

#[test]
fn heavy_rwlock_unvalidated_read_is_caught_on_etcd() {
    // Stops as soon as it is caught (5 to 20 s here); the duration is the
    // margin of a loaded machine.
    let mut config = rwlock(Duration::from_secs(60));
    config.ttl = Duration::from_secs(1);
    config.variant = Some(Variant::UnvalidatedRead);
    config.stop_on_violation = true;
    let mut etcd = Etcd::start();
    let (report, _history) = run_on(&mut config, &mut etcd);
    let text = report.to_text();
    assert_eq!(report.caught_by(), vec!["C11"], "{text}");
}

/// The Postgres resource: readers read the row's value and validate it
/// with `FencedTable::read_validated` in the same transaction.
#[test]
fn heavy_rwlock_on_a_postgres_resource() {
    let pg = PgServer::start();
    let url = pg.create_database("torture_rwlock");
    let mut config = rwlock(Duration::from_secs(8));
    config.resource = ResourceKind::Postgres { url: url.clone() };
    config.nemeses = Some(vec![
        NemesisKind::PauseWorker,
        NemesisKind::PauseServer,
        NemesisKind::ProxyDelay,
        NemesisKind::Revoke,
    ]);
    let mut single = Single::start();
    let (report, history) = run_on(&mut config, &mut single);
    assert_eq!(
        history.header().map(|h| h.resource.as_str()),
        Some("postgres")
    );
    assert_clean(&report, &history);

    let mut config = rwlock(Duration::from_secs(40));
    config.resource = ResourceKind::Postgres { url };
    config.variant = Some(Variant::UnvalidatedRead);
    config.stop_on_violation = true;
    let mut single = Single::start();
    let (report, _history) = run_on(&mut config, &mut single);
    let text = report.to_text();
    assert_eq!(report.caught_by(), vec!["C11"], "{text}");
}

#[test]
fn an_rwlock_run_refuses_what_cannot_apply() {
    let refused = |config: &Config| -> String {
        let mut single = Single::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        match rt.block_on(fencelock_torture::run(
            config,
            &mut single,
            &SelfLauncher,
            &mut (),
            CancellationToken::new(),
        )) {
            Ok(report) => panic!("ran:\n{}", report.to_text()),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Usage, "{e}");
                e.to_string()
            }
        }
    };
    let mut config = rwlock(Duration::from_secs(1));
    config.variant = Some(Variant::WriteOnlyCheck);
    assert!(refused(&config).contains("control of the mutex"));
    let mut config = rwlock(Duration::from_secs(1));
    config.variant = Some(Variant::OneFence);
    assert!(refused(&config).contains("control of the semaphore"));
    let mut config = Config::new();
    config.variant = Some(Variant::UnvalidatedRead);
    assert!(refused(&config).contains("--primitive rwlock"));
    let mut config = rwlock(Duration::from_secs(1));
    config.permits = Some(2);
    assert!(refused(&config).contains("not both"));
    let mut config = rwlock(Duration::from_secs(1));
    config.rwlock_reads = Some(101);
    assert!(refused(&config).contains("--reads 101"));
}
