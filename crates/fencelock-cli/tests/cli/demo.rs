//! `fencelock demo` end to end: the built binary against real redis-server
//! processes.

use std::process::Output;

use fencelock_testkit::RedisServer;

use crate::support::fencelock;

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Without --redis, the demo starts a private redis-server, shows the guide's
/// timeline with counter fences 1 and 2, exits 0 and stops its server.
#[test]
fn demo_on_a_private_server_shows_the_stale_write_refused() {
    let out = fencelock(&["demo"]).output().expect("run fencelock demo");
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("A   acquired, fence 1"), "{stdout}");
    assert!(stdout.contains("B   acquired, fence 2"), "{stdout}");
    assert!(stdout.contains("with fence 2 -> accepted"), "{stdout}");
    assert!(stdout.contains("with fence 1 -> REJECTED"), "{stdout}");
    assert!(stdout.contains("release -> not ours"), "{stdout}");
    assert!(
        stdout.contains("value \"closed by B\", fence 2"),
        "{stdout}"
    );

    // The private server is gone: its port refuses connections.
    let port = stdout
        .split("redis://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("the demo names its server's URL");
    assert!(
        std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(),
        "the private redis-server on port {port} is still running"
    );
}

/// With --redis and clock fences, the scenario holds on a given server and
/// leaves no lock behind.
#[test]
fn demo_on_a_given_server_in_clock_mode() {
    let server = RedisServer::start();
    let url = server.url();
    let out = fencelock(&["--redis", &url, "demo", "--fence-mode", "clock"])
        .output()
        .expect("run fencelock demo");
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("REJECTED as stale"), "{stdout}");
    let locks: Vec<String> = server.query(&["KEYS", "lock:*"]);
    assert!(
        locks.iter().all(|k| k.ends_with(":fence")),
        "only fence keys may remain, found {locks:?}"
    );
}

/// A missing redis-server binary is a configuration error (78) that says how
/// to install it.
#[test]
fn demo_without_redis_server_says_how_to_install_it() {
    let out = fencelock(&["demo"])
        .env("FENCELOCK_REDIS_SERVER_BIN", "/nonexistent/redis-server")
        .output()
        .expect("run fencelock demo");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("apt-get install -y redis-server"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

/// An unreachable Redis exits 69 with one line naming the URL.
#[test]
fn demo_with_unreachable_redis_exits_69_naming_the_url() {
    let url = RedisServer::client_url_unreachable();
    let out = fencelock(&["--redis", &url, "demo"])
        .output()
        .expect("run fencelock demo");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    let shown = url.trim_end_matches('/');
    assert!(stderr.contains(shown), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

/// Bad durations and a pause shorter than the ttl are usage errors (64).
#[test]
fn demo_rejects_bad_durations_with_64() {
    for args in [
        &["demo", "--ttl", "abc"][..],
        &["demo", "--ttl", "300ms", "--pause", "100ms"][..],
        &["demo", "--no-such-flag"][..],
    ] {
        let out = fencelock(args).output().expect("run fencelock demo");
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
    }
}
