//! Usage errors and hostile option values, with the built binary: one line
//! that names what is wrong, exit 64, never a panic.

use std::io::{BufRead, Read};
use std::process::{Output, Stdio};
use std::time::Duration;

use fencelock_testkit::{RedisServer, spawn_guarded};
use nix::sys::signal::Signal;

use crate::support::{self, on, wait_for};

/// Runs the binary without the environment variables that stand in for
/// options (so a missing option is really missing).
fn fencelock(args: &[&str]) -> Output {
    support::fencelock(args).output().expect("run fencelock")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A usage error is one line on stderr, exit 64, containing every `needle`.
fn assert_usage(args: &[&str], needles: &[&str]) {
    let out = fencelock(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line: {err}"
    );
    for needle in needles {
        assert!(
            err.contains(needle),
            "{args:?}: {needle:?} missing in {err}"
        );
    }
}

/// A missing required argument is named, with the help page of the
/// subcommand it belongs to.
#[test]
fn usage_errors_name_the_missing_argument() {
    assert_usage(
        &["run"],
        &[
            "missing required argument <NAME>",
            "(see fencelock run --help)",
        ],
    );
    assert_usage(
        &["read"],
        &[
            "missing required argument <RESOURCE>",
            "fencelock read --help",
        ],
    );
    assert_usage(
        &["write", "invoice:1"],
        &[
            "--fence <N>",
            "--holder <TOKEN>",
            "<VALUE>",
            "fencelock write --help",
        ],
    );
    assert_usage(
        &["--prefix", "run", "status"],
        &["<NAME>", "fencelock status --help"],
    );
    assert_usage(&["run", "job"], &["no command given"]);
    assert_usage(&[], &["no command given: use one of run, status"]);
    assert_usage(
        &["run", "--ttl", "soon", "job", "--", "true"],
        &["'soon'", "--ttl", "fencelock run --help"],
    );
}

/// A bad lock name or resource key is the user's to fix whatever the
/// store's state: refused (64) naming it before any connection is tried,
/// so the same answer comes with no store at the URL.
#[test]
fn bad_names_and_keys_are_refused_before_connecting() {
    let nowhere = "redis://127.0.0.1:1";
    let long = "n".repeat(600);
    for name in ["", "a\nb", long.as_str(), "pay\u{202E}lpt"] {
        for args in [
            vec!["run", name, "--", "true"],
            vec!["status", name],
            vec!["revoke", name],
        ] {
            let args = [&["--url", nowhere][..], &args[..]].concat();
            assert_usage(&args, &["invalid name"]);
        }
    }
    for (name, what) in [("", "is empty"), ("a\tb", "control characters")] {
        for args in [
            vec!["write", name, "v", "--fence", "1", "--holder", "t"],
            vec!["read", name],
            vec!["update", name, "--fence", "1", "--holder", "t", "--", "cat"],
            vec!["revoke", "job", "--resource", name],
        ] {
            let args = [&["--url", nowhere][..], &args[..]].concat();
            assert_usage(&args, &["invalid name", what]);
        }
    }
}

const HUGE: &str = "500000000000y";

fn assert_no_panic(what: &str, code: Option<i32>, stderr: &str) {
    assert_ne!(code, Some(101), "{what} panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
}

/// Durations far beyond any deadline (`--wait`, `--kill-grace`, `top
/// --interval`) are saturated, never a panic; a huge `--ttl` is refused in
/// one line (64).
#[test]
fn huge_durations_never_panic() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");

    // A free lock: acquired at once.
    let out = on(&server, &["run", "--wait", HUGE, "job", "--", "true"])
        .output()
        .expect("run");
    assert_no_panic("--wait on a free lock", out.status.code(), &stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // A held lock: waits (queued), then gets it when the holder is done.
    let go = dir.path().join("go");
    let hold = format!("while [ ! -f {} ]; do sleep 0.02; done", go.display());
    let mut holder = spawn_guarded({
        let mut c = on(&server, &["run", "job", "-c", &hold]);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        c
    });
    wait_for("the lock to be held", Duration::from_secs(10), || {
        server.query::<i64>(&["EXISTS", "lock:{job}"]) == 1
    });
    let mut waiter = spawn_guarded({
        let mut c = on(&server, &["run", "-q", "--wait", HUGE, "job", "--", "true"]);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        c
    });
    wait_for("the waiter to queue", Duration::from_secs(10), || {
        server.query::<i64>(&["ZCARD", "lock:{job}:queue"]) == 1
    });
    std::fs::write(&go, "").expect("touch go");
    let status = waiter
        .wait_timeout(Duration::from_secs(10))
        .expect("the waiter ends");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        holder
            .wait_timeout(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );

    // A lost lock with a huge grace: SIGTERM still stops the command.
    let ready = dir.path().join("ready");
    let mut run = spawn_guarded({
        let script = format!("touch {}; sleep 30", ready.display());
        let mut c = on(
            &server,
            &[
                "run",
                "--ttl",
                "300ms",
                "--kill-grace",
                HUGE,
                "lost",
                "-c",
                &script,
            ],
        );
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        c
    });
    wait_for("the command to start", Duration::from_secs(10), || {
        ready.exists()
    });
    server.cmd(&["DEL", "lock:{lost}"]);
    let status = run.wait_timeout(Duration::from_secs(10)).expect("run ends");
    assert_eq!(status.code(), Some(76));

    // top redraws every --interval: the first snapshot, then a long sleep
    // that Ctrl-C ends.
    let mut top = spawn_guarded({
        let mut c = on(&server, &["top", "--interval", HUGE]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    });
    // Kept open to the end: top's later lines must not hit a closed pipe.
    let mut stdout = std::io::BufReader::new(top.take_stdout().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("read");
    assert!(first.starts_with("fencelock top:"), "{first}");
    // Blocked in its sleep (past the deadline arithmetic, Ctrl-C handler
    // installed), or exited: then interrupt it.
    wait_for("top to sleep", Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{}/stat", top.pid()))
            .ok()
            .and_then(|s| Some(s[s.rfind(')')? + 2..].starts_with(['S', 'Z'])))
            .unwrap_or(true)
    });
    top.signal(Signal::SIGINT);
    let status = top.wait_timeout(Duration::from_secs(10)).expect("top ends");
    let mut err = String::new();
    top.take_stderr()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert_no_panic("top --interval", status.code(), &err);
    assert_eq!(status.code(), Some(0), "{err}");
    drop(stdout);

    // A huge ttl is refused, in one line.
    let out = on(&server, &["run", "--ttl", HUGE, "job", "--", "true"])
        .output()
        .expect("run");
    assert_no_panic("--ttl", out.status.code(), &stderr(&out));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim_end().lines().count(), 1);
}
