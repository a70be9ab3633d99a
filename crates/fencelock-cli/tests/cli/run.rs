//! `fencelock run` end to end: the built binary, real redis-server processes,
//! real signals.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_testkit::{GuardedChild, RedisServer, spawn_guarded};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::support::{BIN, exists, on, wait_for};

fn spawn(mut cmd: Command) -> GuardedChild {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    spawn_guarded(cmd)
}

fn read_file(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn stderr_of(child: &mut GuardedChild) -> String {
    use std::io::Read;
    let mut text = String::new();
    if let Some(mut err) = child.take_stderr() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

/// Two `run`s on one name: the second waits (showing a progress line naming
/// the holder) and runs only after the first command finished.
#[test]
fn a_second_run_waits_for_the_first() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let first_script = format!(
        "echo start1 >> {0}; sleep 1.5; echo end1 >> {0}",
        log.display()
    );
    let mut first = spawn({
        let mut c = on(&server, &["run", "job", "-c", &first_script]);
        c.stderr(Stdio::null());
        c
    });
    wait_for(
        "the first command to start",
        Duration::from_secs(10),
        || read_file(&log).contains("start1"),
    );
    let second = on(
        &server,
        &[
            "run",
            "--wait",
            "20s",
            "job",
            "-c",
            &format!("echo start2 >> {}", log.display()),
        ],
    )
    .output()
    .expect("run the second fencelock run");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(0), "{stderr}");
    assert_eq!(read_file(&log), "start1\nend1\nstart2\n");
    assert!(
        stderr.contains("waiting for job, held by "),
        "progress line missing: {stderr}"
    );
    assert_eq!(
        first
            .wait_timeout(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
    assert!(
        !exists(&server, "lock:{job}"),
        "both runs released the lock"
    );
}

/// `--no-wait` on a held lock exits 75 (or --conflict-exit-code) without
/// running the command; `--quiet` keeps stderr empty.
#[test]
fn no_wait_on_a_held_lock_exits_75_without_running() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut holder = spawn(on(&server, &["run", "job", "--", "sleep", "5"]));
    wait_for("the lock to be held", Duration::from_secs(10), || {
        exists(&server, "lock:{job}")
    });
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = on(&server, &["run", "--no-wait", "job", "-c", &touch])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&out.stderr).contains("held by another holder"));
    let out = on(
        &server,
        &[
            "run",
            "--no-wait",
            "--conflict-exit-code",
            "9",
            "--quiet",
            "job",
            "-c",
            &touch,
        ],
    )
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(9));
    assert!(
        out.stderr.is_empty(),
        "--quiet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !marker.exists(),
        "the command must not run without the lock"
    );
    holder.kill();
}

/// The guide's scenario from a shell: the first `run`'s whole process group is
/// frozen past its ttl; a second `run` takes the lock and its command writes;
/// on SIGCONT the first command's write (with its FENCELOCK_FENCE) exits 3,
/// the first `run` exits 76 and the resource keeps the second value.
#[test]
fn a_frozen_run_is_fenced_out_and_exits_76() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (go, started, a_rc) = (
        dir.path().join("go"),
        dir.path().join("started"),
        dir.path().join("a_rc"),
    );
    // The first command ignores SIGTERM so that its stale write happens after
    // the lock is lost, as a command that never checked would do.
    let script_a = format!(
        "trap '' TERM; echo $$ > {started}; while [ ! -f {go} ]; do sleep 0.02; done; \
         \"$FENCELOCK_BIN\" write invoice:42 A; echo $? > {a_rc}",
        started = started.display(),
        go = go.display(),
        a_rc = a_rc.display()
    );
    let mut first = {
        let mut c = on(
            &server,
            &[
                "run",
                "--ttl",
                "500ms",
                "--kill-grace",
                "10s",
                "invoice-42",
                "-c",
                &script_a,
            ],
        );
        c.process_group(0);
        spawn(c)
    };
    wait_for(
        "the first command to start",
        Duration::from_secs(10),
        || read_file(&started).ends_with('\n'),
    );
    // Freeze the whole job: `fencelock run`'s group and the command's own
    // group (without a terminal, the command gets a group of its own so a
    // lost lock can stop all of it).
    let command_pid: i32 = read_file(&started)
        .trim()
        .parse()
        .expect("the command's pid");
    let groups = [
        Pid::from_raw(first.pid() as i32),
        Pid::from_raw(command_pid),
    ];
    for group in groups {
        killpg(group, Signal::SIGSTOP).expect("SIGSTOP a group of the first run");
    }
    wait_for(
        "the frozen holder's lease to expire",
        Duration::from_secs(5),
        || !exists(&server, "lock:{invoice-42}"),
    );

    let second = on(
        &server,
        &[
            "run",
            "invoice-42",
            "-c",
            "\"$FENCELOCK_BIN\" write invoice:42 B && echo \"$FENCELOCK_FENCE\"",
        ],
    )
    .output()
    .expect("second run");
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let b_fence = String::from_utf8_lossy(&second.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();

    std::fs::write(&go, "").expect("touch go");
    for group in groups {
        killpg(group, Signal::SIGCONT).expect("SIGCONT");
    }
    let status = first
        .wait_timeout(Duration::from_secs(15))
        .expect("the first run ends");
    let stderr = stderr_of(&mut first);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(
        stderr.contains("was lost") || stderr.contains("no longer ours"),
        "{stderr}"
    );
    assert_eq!(
        read_file(&a_rc).trim(),
        "3",
        "the stale write must be rejected"
    );
    let stored: Vec<String> = server.query(&["HMGET", "invoice:42", "value", "fence"]);
    assert_eq!(stored, vec!["B".to_string(), b_fence]);
}

/// The command's exit code passes through; death by signal N gives 128+N;
/// not found 127; not executable 126.
#[test]
fn exit_codes_follow_the_command() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let not_exec = dir.path().join("script.sh");
    std::fs::write(&not_exec, "#!/bin/sh\nexit 0\n").expect("write script");
    let cases: [(&[&str], i32); 5] = [
        (&["run", "j", "--", "sh", "-c", "exit 7"], 7),
        (&["run", "j", "-c", "exit 0"], 0),
        (&["run", "j", "--", "sh", "-c", "kill -9 $$"], 137),
        (&["run", "j", "--", "/nonexistent/command"], 127),
        (
            &["run", "j", "--", not_exec.to_str().expect("utf-8 path")],
            126,
        ),
    ];
    for (args, code) in cases {
        let out = on(&server, args).output().expect("run");
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !exists(&server, "lock:{j}"),
            "{args:?} left the lock behind"
        );
    }
}

/// SIGTERM to `fencelock run` reaches the command; `run` exits with the
/// command's code and releases the lock.
#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ready, got) = (dir.path().join("ready"), dir.path().join("got"));
    let script = format!(
        "trap 'echo term > {got}; exit 143' TERM; touch {ready}; while true; do sleep 0.02; done",
        got = got.display(),
        ready = ready.display()
    );
    let mut run = spawn(on(&server, &["run", "job", "-c", &script]));
    wait_for("the command to start", Duration::from_secs(10), || {
        ready.exists()
    });
    run.signal(Signal::SIGTERM);
    let status = run.wait_timeout(Duration::from_secs(10)).expect("run ends");
    assert_eq!(status.code(), Some(143));
    assert_eq!(read_file(&got).trim(), "term");
    assert!(!exists(&server, "lock:{job}"));
}

/// A lock deleted behind the holder's back: the command gets SIGTERM, then
/// SIGKILL after the grace when it ignores SIGTERM (its whole process group:
/// the shell's `sleep` too), and `run` exits 76.
#[test]
fn a_lost_lock_stops_the_command_and_exits_76() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let ready = dir.path().join("ready");
    let script = format!("trap '' TERM; touch {}; sleep 30", ready.display());
    let mut run = spawn(on(
        &server,
        &[
            "run",
            "--ttl",
            "300ms",
            "--kill-grace",
            "200ms",
            "job",
            "-c",
            &script,
        ],
    ));
    wait_for("the command to start", Duration::from_secs(10), || {
        ready.exists()
    });
    let started = Instant::now();
    server.cmd(&["DEL", "lock:{job}"]);
    let status = run.wait_timeout(Duration::from_secs(10)).expect("run ends");
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("was lost"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "SIGKILL after the grace, not after the command's 30 s"
    );
}

/// Renewal keeps the lock for a command running ten times the ttl.
#[test]
fn renewal_keeps_a_long_command_locked() {
    let server = RedisServer::start();
    let out = on(
        &server,
        &["run", "--ttl", "500ms", "job", "--", "sleep", "5"],
    )
    .output()
    .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Inside `run`, `fencelock write` takes the lock's fence and token from the
/// environment; the child sees every documented variable.
#[test]
fn the_command_gets_the_lock_environment() {
    let server = RedisServer::start();
    let out = on(
        &server,
        &[
            "run",
            "--ttl",
            "5s",
            "invoice-7",
            "-c",
            "env | grep ^FENCELOCK_ | sort; \"$FENCELOCK_BIN\" write inv:7 done --json",
        ],
    )
    .output()
    .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let var = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} missing in {stdout}"))
            .to_string()
    };
    assert_eq!(var("FENCELOCK_NAME"), "invoice-7");
    assert_eq!(var("FENCELOCK_KEY"), "lock:{invoice-7}");
    assert_eq!(var("FENCELOCK_TTL_MS"), "5000");
    assert_eq!(var("FENCELOCK_REDIS_URL"), server.url());
    let (token, fence) = (var("FENCELOCK_TOKEN"), var("FENCELOCK_FENCE"));
    let written: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("json");
    assert_eq!(written["accepted"], true);
    assert_eq!(written["fence"].to_string(), fence);
    let stored: Vec<String> = server.query(&["HMGET", "inv:7", "value", "fence", "holder"]);
    assert_eq!(
        stored,
        vec!["done".to_string(), fence, fencelock::holder_id(&token)]
    );
}

/// Redis unreachable: 69 and one line naming the URL. Bad durations: 64.
#[test]
fn unreachable_redis_and_bad_durations() {
    let url = RedisServer::client_url_unreachable();
    let out = Command::new(BIN)
        .args(["--redis", &url, "run", "job", "--", "true"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains(url.trim_end_matches('/')), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for bad in [
        &["run", "--ttl", "soon", "job", "--", "true"][..],
        &["run", "--wait", "-1s", "job", "--", "true"][..],
        &["run", "job"][..],
    ] {
        let out = Command::new(BIN)
            .args(["--redis", &url])
            .args(bad)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

/// `--wait-mode` (and `FENCELOCK_WAIT_MODE`) reach the library: a `poll`
/// waiter retries without ever joining the wait queue; a `notify` waiter
/// queues; a `fair` `--no-wait` is refused while a live waiter is queued,
/// even on a free lock, where `notify` takes it; a bad mode is a usage error.
#[test]
fn wait_mode_is_applied() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    let hold = format!("while [ ! -f {} ]; do sleep 0.02; done", go.display());
    let mut holder = spawn(on(&server, &["run", "job", "-c", &hold]));
    wait_for("the lock to be held", Duration::from_secs(10), || {
        exists(&server, "lock:{job}")
    });
    let queue = "lock:{job}:queue";

    let before = server.script_calls();
    let mut poller = spawn({
        let mut c = on(&server, &["run", "--wait", "20s", "job", "--", "true"]);
        c.env("FENCELOCK_WAIT_MODE", "poll");
        c
    });
    wait_for("the poll waiter to retry", Duration::from_secs(10), || {
        server.script_calls() >= before + 5
    });
    assert!(!exists(&server, queue), "a poll waiter never queues");
    poller.kill();

    let mut waiter = spawn(on(
        &server,
        &[
            "run",
            "--wait-mode",
            "notify",
            "--wait",
            "20s",
            "job",
            "--",
            "true",
        ],
    ));
    wait_for(
        "the notify waiter to queue",
        Duration::from_secs(10),
        || server.query::<i64>(&["ZCARD", queue]) == 1,
    );
    // Freeze the queued waiter (its place lasts its 1 s waiter lease) and
    // free the lock without a release, so nothing is handed over.
    waiter.stop();
    holder.kill();
    server.cmd(&["DEL", "lock:{job}"]);
    let fair = {
        let mut c = on(&server, &["run", "--no-wait", "job", "--", "true"]);
        c.env("FENCELOCK_WAIT_MODE", "fair");
        c.output().expect("run")
    };
    assert_eq!(
        fair.status.code(),
        Some(75),
        "fair: the free lock is the queued waiter's: {}",
        String::from_utf8_lossy(&fair.stderr)
    );
    let notify = on(
        &server,
        &[
            "run",
            "--no-wait",
            "--wait-mode",
            "notify",
            "job",
            "--",
            "true",
        ],
    )
    .output()
    .expect("run");
    assert_eq!(
        notify.status.code(),
        Some(0),
        "notify may take a free lock: {}",
        String::from_utf8_lossy(&notify.stderr)
    );
    waiter.cont();
    waiter.kill();

    let out = on(
        &server,
        &["run", "--wait-mode", "fast", "job", "--", "true"],
    )
    .output()
    .expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--wait-mode"));
}

/// A command that cannot start is told apart as a shell does: 127 only when
/// no such file exists; 126 for a script whose `#!` interpreter is missing
/// (the message names it) and for a file that is not executable.
#[test]
fn exec_errors_name_what_is_missing() {
    use std::os::unix::fs::PermissionsExt;
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let bad_interpreter = dir.path().join("bad-interpreter.sh");
    std::fs::write(&bad_interpreter, "#!/nonexistent/interpreter -e\nexit 0\n").expect("write");
    std::fs::set_permissions(&bad_interpreter, std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let not_executable = dir.path().join("not-executable.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").expect("write");
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let cases = [
        (
            path(&bad_interpreter),
            126,
            "bad interpreter: \"/nonexistent/interpreter\" not found",
        ),
        (path(&not_executable), 126, "permission denied"),
        (
            "/nonexistent/command".to_string(),
            127,
            "/nonexistent/command: command not found",
        ),
        (
            "no-such-command-on-path".to_string(),
            127,
            "command not found",
        ),
    ];
    for (program, code, message) in cases {
        let out = on(&server, &["run", "j", "--", &program])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{program}: {stderr}");
        assert!(stderr.contains(message), "{program}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            !exists(&server, "lock:{j}"),
            "{program} left the lock behind"
        );
    }
}
