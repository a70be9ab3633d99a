//! The testkit's Postgres server (`fencelock_testkit::PgServer`), as the
//! Postgres tests rely on it: its own data directory and port, run as the
//! `postgres` user when the tests run as root, databases, pause/resume, and
//! no server left behind — on drop, and when the test process is killed
//! with SIGKILL (no destructor runs).
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::entry_command;
use crate::support::postgres::{pool, start_server};
use fencelock::sqlx;
use fencelock_testkit::process::wait_process_gone;
use fencelock_testkit::{PgServer, process_alive, remove_leftovers, spawn_guarded};

const GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// Set in a re-executed copy of this test binary: start a server, print its
/// pid, and sleep until killed.
const PROBE_ENV: &str = "FENCELOCK_PG_ORPHAN_PROBE";

fn owner_uid(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("metadata").uid()
}

#[tokio::test]
async fn starts_on_its_own_port_and_directory_with_databases() -> anyhow::Result<()> {
    let pg = start_server().await;
    assert!(process_alive(pg.pid()));
    assert!(pg.dir().join("data").join("PG_VERSION").is_file());
    if proc_uid(std::process::id()) == Some(0) {
        // Postgres refuses root: the testkit ran it as the postgres user,
        // which owns the data directory.
        let uid = proc_uid(pg.pid()).expect("postmaster uid");
        assert_ne!(uid, 0);
        assert_eq!(owner_uid(&pg.dir().join("data")), uid);
    }
    assert_eq!(pg.psql("postgres", "SELECT 1 + 1"), "2");
    assert_eq!(pg.psql("postgres", "SHOW port"), pg.port().to_string());
    let url = pg.create_database("fenced_test");
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{}/fenced_test", pg.port())
    );
    let pool = pool(&url, 1).await?;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await?;
    assert_eq!(db, "fenced_test");
    assert!(
        pg.try_psql("postgres", "SELECT * FROM no_such_table")
            .is_err()
    );
    Ok(())
}

/// While paused, a query on an open connection does not complete; after
/// resume it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_freezes_the_server_and_resume_continues() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 1).await?;
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
    assert_eq!(one, 1);
    pg.pause();
    let query = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>("SELECT 2")
                .fetch_one(&pool)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!query.is_finished(), "a paused server answered");
    pg.resume();
    let two = tokio::time::timeout(Duration::from_secs(10), query).await???;
    assert_eq!(two, 2);
    Ok(())
}

/// Dropping the server stops the postmaster and its backends and removes
/// the directory.
#[tokio::test]
async fn drop_stops_the_server_and_removes_its_directory() -> anyhow::Result<()> {
    let pg = start_server().await;
    let pool = pool(&pg.url(), 1).await?;
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await?;
    let (pid, dir) = (pg.pid(), pg.dir().to_owned());
    tokio::task::spawn_blocking(move || drop(pg)).await?;
    assert!(
        wait_process_gone(pid, GONE_TIMEOUT),
        "postmaster {pid} survived the drop"
    );
    assert!(
        wait_process_gone(u32::try_from(backend)?, GONE_TIMEOUT),
        "backend {backend} survived the drop"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
    Ok(())
}

/// Entry point of the orphan probe (does nothing as an ordinary test):
/// starts a server from a short-lived thread, prints `pg_pid=N`, sleeps.
#[test]
fn pg_orphan_probe_entry() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    let server = std::thread::spawn(PgServer::start)
        .join()
        .expect("starting the server panicked");
    // The starting thread is gone; the server must not have died with it.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.psql("postgres", "SELECT 1"), "1");
    eprintln!("pg_dir={}", server.dir().display());
    eprintln!("pg_pid={}", server.pid());
    std::thread::sleep(Duration::from_secs(60));
}

/// A test process killed with SIGKILL takes its Postgres server with it
/// (the kernel's parent-death signal reaches the real `postgres` process,
/// which runs as another user).
#[test]
fn server_dies_with_a_killed_test_process() {
    let mut command = entry_command(module_path!(), "pg_orphan_probe_entry", (PROBE_ENV, "1"));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut probe = spawn_guarded(command);
    let stderr = BufReader::new(probe.take_stderr().expect("piped stderr"));
    let started = Instant::now();
    let (mut pg_pid, mut pg_dir) = (None, None);
    for line in stderr.lines() {
        let line = line.expect("probe stderr");
        if let Some(dir) = line.strip_prefix("pg_dir=") {
            pg_dir = Some(std::path::PathBuf::from(dir.trim()));
        }
        if let Some(pid) = line.strip_prefix("pg_pid=") {
            pg_pid = Some(pid.trim().parse::<u32>().expect("pid"));
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the probe never started its server"
        );
    }
    let pg_pid = pg_pid.expect("the probe printed no pid");
    assert!(process_alive(pg_pid));
    probe.kill(); // SIGKILL: no destructor runs in the probe
    assert!(
        wait_process_gone(pg_pid, GONE_TIMEOUT),
        "postgres {pg_pid} outlived its killed test process"
    );
    // No destructor ran in the probe: clean up its directory and shared memory.
    let pg_dir = pg_dir.expect("the probe printed its directory");
    remove_leftovers(&pg_dir);
    assert!(!pg_dir.exists());
}

/// The effective uid of process `pid`, from `/proc/PID/status`.
fn proc_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}
