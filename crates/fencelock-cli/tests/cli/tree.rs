//! `fencelock run` and the command's whole process tree, with the built
//! binary and real redis-server processes: the tree dies with a killed
//! `run`, the lock is held until the tree has exited, and a lost lock stops
//! the processes the command left behind.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_testkit::{GuardedChild, RedisServer, process_alive, spawn_guarded};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{exists, on, wait_for};

fn fencelock(server: &RedisServer, args: &[&str]) -> Command {
    let mut cmd = on(server, args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Processes a test started through `run` that must not outlive it: killed
/// (by pid) when the test ends, whatever happened.
struct Pids(Vec<u32>);

impl Drop for Pids {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if process_alive(pid) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// Waits for the pid a script wrote to `path` (`echo $$ > path`).
fn pid_in(path: &Path, pids: &mut Pids) -> u32 {
    let mut pid = 0;
    wait_for(
        &format!("a pid in {}", path.display()),
        Duration::from_secs(10),
        || {
            pid = std::fs::read_to_string(path)
                .ok()
                .filter(|s| s.ends_with('\n'))
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            pid != 0
        },
    );
    pids.0.push(pid);
    pid
}

/// `run`'s stderr, read line by line on a thread (so the pipe stays open
/// until `run` exits: closing it early would fail its later messages).
struct StderrLines {
    lines: std::sync::mpsc::Receiver<String>,
    seen: String,
}

impl StderrLines {
    fn of(run: &mut GuardedChild) -> StderrLines {
        let reader = BufReader::new(run.take_stderr().expect("stderr piped"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        StderrLines {
            lines,
            seen: String::new(),
        }
    }

    /// Whether a line containing `needle` arrives before `run` exits (or 10 s
    /// pass); the lines read so far are in `seen`.
    fn until(&mut self, needle: &str) -> bool {
        let give_up = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .lines
            .recv_timeout(give_up.saturating_duration_since(Instant::now()))
        {
            self.seen.push_str(&line);
            self.seen.push('\n');
            if line.contains(needle) {
                return true;
            }
        }
        false
    }
}

/// A process that records its pid and then runs `exec`.
fn recorded(dir: &Path, file: &str, exec: &str) -> (PathBuf, String) {
    let path = dir.join(file);
    let script = format!("sh -c 'echo $$ > {}; exec {exec}'", path.display());
    (path, script)
}

/// `kill -9` of `run` takes the whole command tree with it before the lock
/// expires: both ends of a pipeline and a double-forked orphan (the
/// parent-death signal alone reached only the shell). A process that started
/// its own session (`setsid`) has detached: documented as not followed.
#[test]
fn a_killed_run_takes_the_whole_command_tree_with_it() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pids = Pids(Vec::new());
    let (p_left, left) = recorded(dir.path(), "left", "sleep 32");
    let (p_right, right) = recorded(dir.path(), "right", "cat");
    let (p_orphan, orphan) = recorded(dir.path(), "orphan", "sleep 31");
    let (p_daemon, daemon) = recorded(dir.path(), "daemon", "sleep 34");
    let script = format!("({orphan} &); setsid {daemon} & {left} | {right}");
    let mut run = spawn_guarded(fencelock(
        &server,
        &["run", "--ttl", "2s", "sk", "-c", &script],
    ));
    let tree = [
        pid_in(&p_left, &mut pids),
        pid_in(&p_right, &mut pids),
        pid_in(&p_orphan, &mut pids),
    ];
    let daemon = pid_in(&p_daemon, &mut pids);
    assert!(exists(&server, "lock:{sk}"));

    run.kill();
    wait_for(
        "the command tree to die with run",
        Duration::from_secs(5),
        || tree.iter().all(|&pid| !process_alive(pid)),
    );
    assert!(
        exists(&server, "lock:{sk}"),
        "the tree must be gone before the lock expires"
    );
    assert!(
        process_alive(daemon),
        "a setsid process has left the tree (documented)"
    );
}

/// By default `run` holds (and renews) the lock until every process the
/// command left running has exited, says so with `--verbose`, and the
/// leftover still sees the lock held with its fence; a `setsid` process is
/// not waited for.
#[test]
fn run_holds_the_lock_until_the_command_tree_has_exited() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pids = Pids(Vec::new());
    let (go, status) = (dir.path().join("go"), dir.path().join("status"));
    let leftover_pid = dir.path().join("leftover");
    let (p_daemon, daemon) = recorded(dir.path(), "daemon", "sleep 30");
    let script = format!(
        "setsid {daemon} & \
         sh -c 'echo $$ > {pid}; while [ ! -f {go} ]; do sleep 0.02; done; \
            \"$FENCELOCK_BIN\" status job --json > {status}' & echo x",
        pid = leftover_pid.display(),
        go = go.display(),
        status = status.display(),
    );
    let mut run = spawn_guarded(fencelock(
        &server,
        &["run", "--ttl", "300ms", "--verbose", "job", "-c", &script],
    ));
    pid_in(&p_daemon, &mut pids);
    let leftover = pid_in(&leftover_pid, &mut pids);
    let mut stderr = StderrLines::of(&mut run);
    assert!(
        stderr.until("holding lock"),
        "run must hold the lock for the leftover: {}",
        stderr.seen
    );
    assert!(
        stderr.seen.contains(&leftover.to_string()),
        "the leftover is named: {}",
        stderr.seen
    );
    assert!(
        stderr.seen.contains("--no-wait-children"),
        "{}",
        stderr.seen
    );
    // Three ttls: the lock is renewed, not just left to expire.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(900) {
        assert!(exists(&server, "lock:{job}"), "renewed while waiting");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(run.is_running());
    std::fs::write(&go, "").expect("touch go");
    let code = run
        .wait_timeout(Duration::from_secs(10))
        .and_then(|s| s.code());
    assert_eq!(code, Some(0));
    let seen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status).expect("status")).expect("json");
    assert_eq!(
        seen["held"], true,
        "the leftover ran under the lock: {seen}"
    );
    assert!(!exists(&server, "lock:{job}"), "released at the end");
}

/// `--no-wait-children` releases when the command itself exits; what it left
/// behind runs on without the lock.
#[test]
fn no_wait_children_releases_when_the_command_exits() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pids = Pids(Vec::new());
    let go = dir.path().join("go");
    let (p_leftover, leftover) = recorded(
        dir.path(),
        "leftover",
        &format!(
            "sh -c \"while [ ! -f {} ]; do sleep 0.02; done\"",
            go.display()
        ),
    );
    let script = format!("{leftover} & echo x");
    let mut run = spawn_guarded(fencelock(
        &server,
        &["run", "--no-wait-children", "job", "-c", &script],
    ));
    let leftover = pid_in(&p_leftover, &mut pids);
    let code = run
        .wait_timeout(Duration::from_secs(10))
        .and_then(|s| s.code());
    assert_eq!(code, Some(0));
    assert!(process_alive(leftover), "left running");
    assert!(!exists(&server, "lock:{job}"), "released at once");
    std::fs::write(&go, "").expect("touch go");
}

/// A lock lost while only processes the command left behind run: they get
/// SIGTERM, then SIGKILL after the grace (this one ignores SIGTERM), and
/// `run` exits 76.
#[test]
fn a_lost_lock_stops_the_processes_left_behind() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pids = Pids(Vec::new());
    let (p_leftover, leftover) = recorded(
        dir.path(),
        "leftover",
        "sh -c \"trap \\\"\\\" TERM; while true; do sleep 0.05; done\"",
    );
    let script = format!("{leftover} & echo x");
    let mut run = spawn_guarded(fencelock(
        &server,
        &[
            "run",
            "--ttl",
            "300ms",
            "--kill-grace",
            "300ms",
            "--verbose",
            "job",
            "-c",
            &script,
        ],
    ));
    let leftover = pid_in(&p_leftover, &mut pids);
    let mut stderr = StderrLines::of(&mut run);
    assert!(stderr.until("holding lock"), "{}", stderr.seen);
    server.cmd(&["DEL", "lock:{job}"]);
    let code = run
        .wait_timeout(Duration::from_secs(10))
        .and_then(|s| s.code());
    assert_eq!(code, Some(76));
    assert!(!process_alive(leftover), "stopped with the lost lock");
}
