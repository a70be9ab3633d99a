//! Short real torture runs of the fenced semaphore (`Config::permits`,
//! `--primitive semaphore`) on private redis-servers: a clean run under
//! the nemeses of a single server passes every checker (C1–C7 per slot,
//! C8, C9) with permits held at once in several slots; the negative
//! control `one-fence` (every permit fenced by one (fence, holder) pair)
//! is caught by C9, a live permit refused, and by nothing else; and a
//! semaphore run refuses the `revoke` nemesis and the mutex's controls
//! before it starts.
//!
//! Workers are this test binary again, run as [`torture_worker_entry`]
//! (an ordinary test that does nothing unless its environment says so).

use std::collections::BTreeSet;
use std::time::Duration;

use fencelock_torture::history::Entry;
use fencelock_torture::{Config, ErrorKind, History, NemesisKind, Report, Variant};
use tokio_util::sync::CancellationToken;

mod support;

use support::{SelfLauncher, Single};

/// Entry point of a worker process (does nothing as an ordinary test).
#[test]
fn torture_worker_entry() {
    support::worker_entry();
}

/// A short semaphore run of `permits` permits on a fresh [`Single`],
/// with its history.
fn run(config: &mut Config) -> (Report, History) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("history.jsonl");
    config.history = Some(path.clone());
    let mut single = Single::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = rt
        .block_on(fencelock_torture::run(
            config,
            &mut single,
            &SelfLauncher,
            &mut (),
            CancellationToken::new(),
        ))
        .expect("the run");
    let history = History::read(&path).expect("the saved history");
    (report, history)
}

fn semaphore(permits: u32) -> Config {
    let mut config = Config::new();
    config.permits = Some(permits);
    config.duration = Duration::from_secs(6);
    config.workers = 6;
    config.hold = Duration::from_millis(20);
    config.nemesis_interval = Duration::from_millis(400);
    config
}

/// The slots granted in `history`.
fn slots(history: &History) -> BTreeSet<u32> {
    history
        .events
        .iter()
        .filter_map(|e| match &e.e {
            Entry::Granted { slot, .. } => *slot,
            _ => None,
        })
        .collect()
}

#[test]
fn a_clean_semaphore_run_passes_every_checker() {
    let mut config = semaphore(3);
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
    ]);
    let (report, history) = run(&mut config);
    let text = report.to_text();
    assert_eq!(report.violations(), 0, "{text}");
    assert_eq!(report.inconclusive(), None, "{text}");
    assert!(report.figures.ops_acknowledged > 20, "{text}");
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id).collect();
    assert_eq!(
        ids,
        ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"],
        "{text}"
    );
    for id in ["C1", "C3", "C4", "C8", "C9"] {
        let c = report.checks.iter().find(|c| c.id == id).expect(id);
        assert!(c.checked > 0, "{id} checked nothing:\n{text}");
    }
    assert_eq!(history.header().and_then(|h| h.permits), Some(3), "{text}");
    // Permits were held in more than one slot, and never in a fourth.
    let granted = slots(&history);
    assert!(granted.len() >= 2, "slots granted: {granted:?}");
    assert!(granted.iter().all(|s| *s < 3), "slots granted: {granted:?}");
    // The resource was written per slot.
    assert!(
        history
            .events
            .iter()
            .any(|e| matches!(&e.e, Entry::Audit { slot: Some(s), .. } if *s > 0)),
        "{text}"
    );
}

#[test]
fn the_one_fence_control_is_caught_by_c9() {
    let mut config = semaphore(3);
    config.variant = Some(Variant::OneFence);
    config.stop_on_violation = true;
    config.nemeses = Some(Vec::new());
    let (report, _history) = run(&mut config);
    let text = report.to_text();
    // Live permits' fences interleave: the one pair refuses the permits
    // whose fence is below another slot's latest while they are valid. The
    // per-slot rules hold (the one pair refuses stale writes too), and so
    // does the lock.
    assert_eq!(report.caught_by(), vec!["C9"], "{text}");
    let c9 = report.checks.iter().find(|c| c.id == "C9").expect("C9");
    let first = c9.first.as_ref().expect("the first violation");
    assert!(first.message.contains("a live permit refused"), "{text}");
}

#[test]
fn a_semaphore_run_refuses_what_cannot_apply() {
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
    let mut config = semaphore(3);
    config.nemeses = Some(vec![NemesisKind::Revoke]);
    assert!(refused(&config).contains("revoke"));
    let mut config = semaphore(3);
    config.variant = Some(Variant::GeCheck);
    assert!(refused(&config).contains("control of the mutex"));
    let mut config = Config::new();
    config.variant = Some(Variant::OneFence);
    assert!(refused(&config).contains("--primitive semaphore"));
    let config = semaphore(0);
    assert!(refused(&config).contains("--permits 0"));
}
