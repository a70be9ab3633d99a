//! Configuration problems exit 78 with one line that names the one thing to
//! fix: a missing ACL permission, a fence key beyond 2^53, a database the
//! server does not have; a key of the wrong type found at release is named
//! in a warning that is true (nothing was changed).

use fencelock_testkit::RedisServer;

use crate::support::{exists, on};

/// Runs `fencelock ARGS` on `server`: its exit code and its stderr.
fn run(server: &RedisServer, args: &[&str]) -> (Option<i32>, String) {
    let out = on(server, args).output().expect("run fencelock");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_config_error(code: Option<i32>, stderr: &str, needles: &[&str]) {
    assert_eq!(code, Some(78), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        !stderr.contains("script:") && !stderr.contains("@user_script"),
        "script internals: {stderr}"
    );
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} missing: {stderr}");
    }
}

#[test]
fn a_missing_acl_permission_is_named_with_the_rule_to_add() {
    let server = RedisServer::start();
    server.cmd(&[
        "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-time",
    ]);
    let url = format!("redis://app:pw@{}/", server.addr());
    let out = crate::support::fencelock(&["--redis", &url, "run", "job", "--", "true"])
        .output()
        .expect("run fencelock");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_config_error(out.status.code(), &stderr, &["TIME", "+time"]);
    assert!(!stderr.contains("pw@"), "{stderr}");
}

/// The command ran and succeeded; the release that follows is refused
/// before it changes anything, the message says so truthfully, and `run`
/// exits 74 (the lock stays held until its ttl).
#[test]
fn a_foreign_queue_key_fails_the_release_naming_it_and_keeps_the_lock() {
    let server = RedisServer::start();
    server.cmd(&["RPUSH", "lock:{q}:queue", "foreign"]);
    let (code, stderr) = run(&server, &["run", "--ttl", "30s", "q", "--", "true"]);
    assert_eq!(code, Some(74), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    for needle in ["could not release", "lock:{q}:queue", "nothing was changed"] {
        assert!(stderr.contains(needle), "{needle:?} missing: {stderr}");
    }
    assert!(
        !stderr.contains("lock:{q}:waiters"),
        "names one key: {stderr}"
    );
    // "nothing was changed" is true: the lock is still there.
    assert!(exists(&server, "lock:{q}"));
}

#[test]
fn a_fence_key_beyond_2_pow_53_exits_78() {
    let server = RedisServer::start();
    server.cmd(&["SET", "lock:{big}:fence", "9007199254740993"]);
    let (code, stderr) = run(&server, &["run", "big", "--", "true"]);
    assert_config_error(code, &stderr, &["lock:{big}:fence", "2^53"]);
}

#[test]
fn a_database_the_server_does_not_have_exits_78() {
    let server = RedisServer::start();
    let url = format!("redis://{}/99", server.addr());
    let out = crate::support::fencelock(&["--redis", &url, "status", "x"])
        .output()
        .expect("run fencelock");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_config_error(out.status.code(), &stderr, &["database 99"]);
}
