//! Fenced read-modify-write from a shell, with the built binary and real
//! redis-server processes: `fencelock update` and `fencelock read
//! --register` lose no update to a stale holder, where `read` followed by
//! `write` does (the negative control).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_testkit::{GuardedChild, RedisServer, spawn_guarded};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::support::{BIN, exists, on, wait_for};

fn fencelock(server: &RedisServer, args: &[&str]) -> Command {
    let mut cmd = on(server, args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

fn value(server: &RedisServer, resource: &str) -> Option<String> {
    server.query(&["HGET", resource, "value"])
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The exit code a script wrote to `path` (`echo $? > path`), once written.
fn code_in(path: &Path) -> i32 {
    let mut code = None;
    wait_for(
        &format!("an exit code in {}", path.display()),
        Duration::from_secs(20),
        || {
            code = read(path)
                .strip_suffix('\n')
                .and_then(|c| c.trim().parse().ok());
            code.is_some()
        },
    );
    code.unwrap_or_default()
}

/// Inside `run`: the current value arrives on stdin (with a newline) and in
/// FENCELOCK_VALUE, CMD's output less one trailing newline is written, a
/// failing CMD writes nothing and passes its code on, a stale fence is 3.
#[test]
fn update_pipes_the_value_through_the_command() {
    let server = RedisServer::start();
    let run_update = |cmd: &str| {
        let out = fencelock(
            &server,
            &[
                "run", "job", "--", BIN, "update", "r", "--", "sh", "-c", cmd,
            ],
        )
        .stderr(Stdio::piped())
        .output()
        .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // No value yet: empty stdin, no FENCELOCK_VALUE.
    let (code, err) = run_update(
        "test -z \"${FENCELOCK_VALUE+set}\" && test \"$(wc -c)\" -eq 0 && printf 'a\\n'",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        value(&server, "r").as_deref(),
        Some("a"),
        "one newline stripped"
    );
    // `cat` is the identity, also for a value ending in a newline.
    let (code, err) = run_update("printf 'b\\n\\n'");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(value(&server, "r").as_deref(), Some("b\n"));
    let (code, err) = run_update("test \"$FENCELOCK_VALUE\" = \"b\n\" && cat");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(value(&server, "r").as_deref(), Some("b\n"));
    // A failing CMD: its code, nothing written.
    let (code, err) = run_update("echo partial; exit 5");
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(value(&server, "r").as_deref(), Some("b\n"));
    // Output that is not text: 65, nothing written.
    let (code, err) = run_update("printf '\\377'");
    assert_eq!(code, Some(65), "{err}");
    assert_eq!(value(&server, "r").as_deref(), Some("b\n"));
    // A stale fence (the resource holds a newer one): 3, CMD never runs.
    let out = fencelock(
        &server,
        &[
            "update",
            "r",
            "--fence",
            "1",
            "--holder",
            "old",
            "--",
            "sh",
            "-c",
            "echo ran >&2; echo z",
        ],
    )
    .stderr(Stdio::piped())
    .output()
    .expect("update");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("REJECTED") && !err.contains("ran"), "{err}");
    assert_eq!(value(&server, "r").as_deref(), Some("b\n"));
    // Outside `run` without a fence: a usage error naming it.
    let out = fencelock(&server, &["update", "r", "--", "cat"])
        .stderr(Stdio::piped())
        .output()
        .expect("update");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fence <N>"));
}

/// How the two workers of [`interleave`] read and write the counter.
#[derive(Debug, Clone, Copy)]
enum Style {
    /// `fencelock read --json`, then `fencelock write`: the unsafe pattern.
    ReadThenWrite,
    /// `fencelock read --register --json`, then `fencelock write`.
    RegisterThenWrite,
    /// `fencelock update`.
    Update,
}

/// The script of one worker: read the counter, say so (`touch READ`), wait
/// for `GO`, write the counter plus one, record the exit code of the write
/// in `RC`.
fn worker_script(style: Style, dir: &Path, who: &str) -> (String, [PathBuf; 3]) {
    let files = ["read", "go", "rc"].map(|f| dir.join(format!("{who}.{f}")));
    let [read, go, rc] = files.each_ref().map(|p| p.display().to_string());
    let wait = format!("touch {read}; while [ ! -f {go} ]; do sleep 0.01; done");
    let script = match style {
        Style::Update => format!(
            "\"$FENCELOCK_BIN\" update counter -- sh -c 'read v; {wait}; echo $(( ${{v:-0}} + 1 ))'; echo $? > {rc}"
        ),
        Style::ReadThenWrite | Style::RegisterThenWrite => {
            let register = if matches!(style, Style::RegisterThenWrite) {
                "--register"
            } else {
                ""
            };
            format!(
                "out=$(\"$FENCELOCK_BIN\" read {register} counter --json) || {{ echo $? > {rc}; exit; }}; \
                 v=$(printf '%s' \"$out\" | sed -n 's/.*\"value\":\"\\([0-9]*\\)\".*/\\1/p'); {wait}; \
                 \"$FENCELOCK_BIN\" write counter $(( ${{v:-0}} + 1 )); echo $? > {rc}"
            )
        }
    };
    (script, files)
}

/// Two workers, interleaved explicitly as in the guide: A reads the counter
/// under the lock and stalls (its `run` frozen) past its lease; B takes the
/// lock and reads; A wakes and writes; then B writes. Returns the exit codes
/// of A's and B's writes and the final counter.
fn interleave(style: Style) -> (i32, i32, Option<String>) {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (script_a, [a_read, a_go, a_rc]) = worker_script(style, dir.path(), "a");
    let (script_b, [b_read, b_go, b_rc]) = worker_script(style, dir.path(), "b");

    let mut a = spawn_guarded({
        let mut c = fencelock(&server, &["run", "--ttl", "300ms", "ctr", "-c", &script_a]);
        // `run` and its watchdog in a group of their own, to freeze them
        // while A's command (in its own group) goes on.
        c.process_group(0);
        c
    });
    wait_for("A to read", Duration::from_secs(10), || a_read.exists());
    let a_group = Pid::from_raw(a.pid() as i32);
    killpg(a_group, Signal::SIGSTOP).expect("freeze A's run");
    wait_for("A's lease to run out", Duration::from_secs(5), || {
        !exists(&server, "lock:{ctr}")
    });
    let mut b = spawn_guarded(fencelock(&server, &["run", "ctr", "-c", &script_b]));
    wait_for("B to read", Duration::from_secs(10), || b_read.exists());
    std::fs::write(&a_go, "").expect("touch");
    let a_code = code_in(&a_rc);
    std::fs::write(&b_go, "").expect("touch");
    let b_code = code_in(&b_rc);
    assert!(b.wait_timeout(Duration::from_secs(10)).is_some());
    killpg(a_group, Signal::SIGCONT).expect("thaw A's run");
    let a_run = a
        .wait_timeout(Duration::from_secs(10))
        .and_then(|s| s.code());
    assert_eq!(a_run, Some(76), "A's run lost its lock");
    (a_code, b_code, value(&server, "counter"))
}

/// The negative control: with `read` then `write`, both writes are
/// acknowledged but the counter went up once. A lost update.
#[test]
fn read_then_write_loses_an_update() {
    let (a, b, counter) = interleave(Style::ReadThenWrite);
    assert_eq!((a, b), (0, 0), "both writes acknowledged");
    assert_eq!(counter.as_deref(), Some("1"), "but one increment was lost");
}

/// `read --register` then `write`: B's registration refuses A's stale write.
#[test]
fn read_register_then_write_loses_nothing() {
    let (a, b, counter) = interleave(Style::RegisterThenWrite);
    assert_eq!((a, b), (3, 0), "A's stale write rejected");
    assert_eq!(counter.as_deref(), Some("1"));
}

/// `update`: the same interleaving, A's update rejected (3).
#[test]
fn update_interleaved_with_a_newer_holder_loses_nothing() {
    let (a, b, counter) = interleave(Style::Update);
    assert_eq!((a, b), (3, 0), "A's stale update rejected");
    assert_eq!(counter.as_deref(), Some("1"));
}

/// The concurrent counter: 20 workers, each `fencelock run --ttl 500ms ctr --
/// fencelock update counter -- …`, racing for the lock. Four of them, chosen
/// at random, are frozen (run and command) in the middle of their update,
/// after reading the counter, for longer than their lease, and wake up once
/// the next holder has read the counter in turn, before it writes; they
/// ignore the SIGTERM of their lost lock: the guide's stale writer, landing
/// between the new holder's read and write. Every acknowledged update
/// (exit 0) is in the final value, and nothing else is: acknowledged =
/// final. (The same with `read` then `write`, or with an `update` that does
/// not register first, acknowledges a stale write and loses an update.)
#[test]
fn concurrent_counter_loses_no_update() {
    const WORKERS: usize = 20;
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |i: usize, ext: &str| dir.path().join(format!("{i}.{ext}"));
    let mut to_freeze: Vec<usize> = (0..WORKERS).collect();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as usize)
        .unwrap_or(7);
    to_freeze.rotate_left(seed % WORKERS);
    to_freeze.truncate(4);

    let mut runs: Vec<_> = (0..WORKERS)
        .map(|i| {
            // Each update reads, says so (`mid`) and waits for `go` before
            // writing. SIGTERM is ignored, so the update of a lost lock runs
            // to its end (as a command that does not check would), until
            // SIGKILL after the grace.
            let script = format!(
                "trap '' TERM; echo $$ > {pid}; \"$FENCELOCK_BIN\" update counter -- sh -c \
                 'read v; touch {mid}; while [ ! -f {go} ]; do sleep 0.01; done; echo $(( ${{v:-0}} + 1 ))'; \
                 echo $? > {rc}",
                pid = file(i, "pid").display(),
                mid = file(i, "mid").display(),
                go = file(i, "go").display(),
                rc = file(i, "rc").display()
            );
            let mut cmd = Command::new(BIN);
            cmd.args(["--redis", &server.url()])
                .args(["run", "--ttl", "500ms", "--wait", "60s", "ctr", "-c", &script])
                .env("FENCELOCK_BIN", BIN)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(file(i, "stderr")).expect("stderr file"))
                .process_group(0);
            spawn_guarded(cmd)
        })
        .collect();

    // Let every holder write at once, except the chosen ones: frozen, and
    // released between the next holder's read and write.
    let mut handled = [false; WORKERS];
    let mut frozen = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(60);
    let holder =
        |handled: &[bool; WORKERS]| (0..WORKERS).find(|&i| !handled[i] && file(i, "mid").exists());
    while handled.iter().any(|h| !h) {
        assert!(Instant::now() < give_up, "the workers did not finish");
        let waiting = |handled: &[bool; WORKERS], runs: &mut [GuardedChild]| {
            (0..WORKERS)
                .filter(|&i| !handled[i] && runs[i].is_running())
                .count()
        };
        for i in 0..WORKERS {
            if !handled[i] && !runs[i].is_running() && !file(i, "mid").exists() {
                // Ended without reading (lost its lock on a starved machine).
                handled[i] = true;
            }
        }
        let Some(i) = holder(&handled) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        handled[i] = true;
        if !to_freeze.contains(&i) || waiting(&handled, &mut runs) == 0 {
            std::fs::write(file(i, "go"), "").expect("touch");
            continue;
        }
        let command: i32 = read(&file(i, "pid")).trim().parse().expect("pid");
        let groups = [Pid::from_raw(command), Pid::from_raw(runs[i].pid() as i32)];
        for group in groups {
            let _ = killpg(group, Signal::SIGSTOP);
        }
        wait_for("the next holder to read", Duration::from_secs(30), || {
            holder(&handled).is_some()
        });
        std::fs::write(file(i, "go"), "").expect("touch");
        for group in groups {
            let _ = killpg(group, Signal::SIGCONT);
        }
        code_in(&file(i, "rc"));
        frozen.push(i);
        // The next holder writes on the next turn of the loop.
    }
    let codes: Vec<i32> = (0..WORKERS)
        .map(|i| {
            assert!(
                runs[i].wait_timeout(Duration::from_secs(30)).is_some(),
                "worker {i} ends"
            );
            read(&file(i, "rc"))
                .strip_suffix('\n')
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(-1)
        })
        .collect();

    let acknowledged = codes.iter().filter(|&&c| c == 0).count();
    // Killed before it could tell (-1): only on a starved machine, a worker
    // that lost its lease and then its SIGKILL grace; its write may or may
    // not have landed.
    let unknown = codes.iter().filter(|&&c| c == -1).count();
    let failures: String = (0..WORKERS)
        .filter(|&i| codes[i] != 0)
        .map(|i| format!("\nworker {i} ({}): {}", codes[i], read(&file(i, "stderr"))))
        .collect();
    let counter: usize = value(&server, "counter")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let context = format!("frozen {frozen:?}, codes {codes:?}{failures}");
    assert!(
        acknowledged <= counter,
        "a lost update: {acknowledged} acknowledged, counter {counter}; {context}"
    );
    assert!(
        counter <= acknowledged + unknown,
        "an update landed without being acknowledged: counter {counter}; {context}"
    );
    assert!(!frozen.is_empty(), "{context}");
    for &i in &frozen {
        assert_eq!(codes[i], 3, "a stale update is rejected; {context}");
    }
    assert!(
        acknowledged >= WORKERS / 2,
        "most workers succeed: {context}"
    );
}
