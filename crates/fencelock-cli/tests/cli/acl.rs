//! The README's ACL rule ("Redis permissions") with the CLI: a user with
//! exactly that rule runs `run` (also waiting behind another `run`),
//! `status`, `top`, `write`, `read` and `update`; a user missing one part
//! that a command needs gets exit 78 and one line naming the part to add.

use std::process::Stdio;
use std::time::Duration;

use fencelock_testkit::acl::{ACL_PASSWORD, readme_acl_rule};
use fencelock_testkit::{RedisServer, spawn_guarded};

use crate::support::{BIN, at, exists, output, wait_for};

#[test]
fn a_user_with_the_readme_rule_runs_every_command() {
    let server = RedisServer::start();
    let url = server.acl_user("fencelock", &readme_acl_rule());
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");

    // A holder, and a notify waiter queued behind it (queued means it
    // subscribed to its wake-up channel).
    let hold = format!("while [ ! -f {} ]; do sleep 0.02; done", go.display());
    let mut holder = spawn_guarded({
        let mut c = at(&url, &["run", "job", "-c", &hold]);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    });
    wait_for("the lock to be held", Duration::from_secs(10), || {
        exists(&server, "lock:{job}")
    });
    let mut waiter = spawn_guarded({
        let mut c = at(&url, &["run", "--wait", "20s", "-q", "job", "--", "true"]);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    });
    wait_for("the waiter to queue", Duration::from_secs(10), || {
        server.query::<i64>(&["ZCARD", "lock:{job}:queue"]) == 1
    });

    let (code, stdout, stderr) = output(&mut at(&url, &["status", "job"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("held by"), "{stdout}");
    let (code, stdout, stderr) = output(&mut at(&url, &["top", "--once"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("job"), "{stdout}");

    std::fs::write(&go, "").expect("go");
    for child in [&mut holder, &mut waiter] {
        let status = child.wait_timeout(Duration::from_secs(10));
        assert_eq!(status.and_then(|s| s.code()), Some(0));
    }
    assert!(!exists(&server, "lock:{job}"));

    let update = "\"$FENCELOCK_BIN\" update invoice:1 -- sh -c 'read v; echo $(( ${v:-0} + 1 ))' && \"$FENCELOCK_BIN\" write invoice:2 closed";
    let (code, _, stderr) =
        output(at(&url, &["run", "invoice-1", "-c", update]).env("FENCELOCK_BIN", BIN));
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = output(&mut at(&url, &["read", "invoice:1"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("invoice:1: \"1\""), "{stdout}");
}

#[test]
fn a_user_missing_a_part_exits_78_naming_it() {
    let server = RedisServer::start();
    // (part left out, command, what the line names)
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("+ping", &["status", "job"], &["PING", "+ping"]),
        ("~lock:*", &["status", "job"], &["lock:{job}", "~lock:*"]),
        ("+pttl", &["status", "job"], &["PTTL", "+pttl"]),
        (
            "+evalsha",
            &["run", "job", "--", "true"],
            &["EVALSHA", "+evalsha"],
        ),
        ("+time", &["run", "job", "--", "true"], &["TIME", "+time"]),
        (
            "+zadd",
            &["run", "--wait", "5s", "held", "--", "true"],
            &["ZADD", "+zadd"],
        ),
        (
            "+hset",
            &["write", "invoice:1", "v", "--fence", "1", "--holder", "t"],
            &["HSET", "+hset"],
        ),
        (
            "~invoice:*",
            &["write", "invoice:1", "v", "--fence", "1", "--holder", "t"],
            &["invoice:1", "~invoice:*"],
        ),
        ("+hmget", &["read", "invoice:1"], &["HMGET", "+hmget"]),
        ("+scan", &["top", "--once"], &["SCAN", "+scan"]),
        ("+zcard", &["top", "--once"], &["ZCARD", "+zcard"]),
    ];
    for &(part, args, needles) in cases {
        server.cmd(&["FLUSHALL"]);
        // A lock held by someone else, for `run --wait` and `top`.
        server.cmd(&["SET", "lock:{held}", "someone:1", "PX", "30000"]);
        let rule: Vec<String> = readme_acl_rule()
            .into_iter()
            .filter(|p| p != part)
            .collect();
        let url = server.acl_user("app", &rule);
        let (code, stdout, stderr) = output(&mut at(&url, args));
        assert_eq!(code, Some(78), "without {part}: {stdout}{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        for needle in needles.iter().chain(&["Redis permissions"]) {
            assert!(
                stderr.contains(needle),
                "without {part}: {needle:?} missing: {stderr}"
            );
        }
        assert!(!stderr.contains(ACL_PASSWORD), "{stderr}");
    }
}

/// A release that fails (here: a user without `+del`) leaves the lock held
/// until its ttl: `run` says so and exits 74 when the command succeeded;
/// a command's own non-zero code wins.
#[test]
fn run_whose_release_fails_exits_74() {
    let server = RedisServer::start();
    let rule: Vec<String> = readme_acl_rule()
        .into_iter()
        .filter(|p| p != "+del")
        .collect();
    let url = server.acl_user("app", &rule);
    let (code, _, stderr) = output(&mut at(&url, &["run", "--ttl", "2s", "job", "--", "true"]));
    assert_eq!(code, Some(74), "{stderr}");
    assert!(
        stderr.contains("could not release lock \"job\"") && stderr.contains("+del"),
        "{stderr}"
    );
    assert!(stderr.contains("stays held until its ttl"), "{stderr}");
    assert!(
        exists(&server, "lock:{job}"),
        "the lock is held until its ttl"
    );
    assert!(!stderr.contains(ACL_PASSWORD), "{stderr}");

    server.cmd(&["DEL", "lock:{job}"]);
    let (code, _, stderr) = output(&mut at(&url, &["run", "job", "-c", "exit 5"]));
    assert_eq!(code, Some(5), "the command's own code wins: {stderr}");
}
