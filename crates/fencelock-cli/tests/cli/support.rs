//! What the CLI tests share: the binary with a clean environment, polling
//! with a deadline, and small reads.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use fencelock_testkit::RedisServer;

/// The `fencelock` binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// Environment variables that stand in for options: a test sets the ones it
/// means, none is inherited.
const OPTION_VARS: [&str; 10] = [
    "FENCELOCK_ACCESS",
    "FENCELOCK_REPLICAS",
    "FENCELOCK_REPLICA_TIMEOUT",
    "FENCELOCK_REDIS_URL",
    "FENCELOCK_URL",
    "FENCELOCK_FENCE",
    "FENCELOCK_TOKEN",
    "FENCELOCK_SLOT",
    "FENCELOCK_WAIT_MODE",
    "FENCELOCK_LOG",
];

/// `fencelock ARGS`, with `FENCELOCK_BIN` set (for commands that call the
/// binary back) and no inherited option variables.
pub(crate) fn fencelock(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("FENCELOCK_BIN", BIN);
    for var in OPTION_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// `fencelock --redis URL ARGS` against `server`.
pub(crate) fn on(server: &RedisServer, args: &[&str]) -> Command {
    let mut cmd = fencelock(&["--redis", &server.url()]);
    cmd.args(args);
    cmd
}

/// `fencelock --redis URL ARGS`, e.g. as an ACL user
/// ([`RedisServer::acl_user`]).
pub(crate) fn at(url: &str, args: &[&str]) -> Command {
    let mut cmd = fencelock(&["--redis", url]);
    cmd.args(args);
    cmd
}

/// Runs `cmd`: its exit code, stdout and stderr.
pub(crate) fn output(cmd: &mut Command) -> (Option<i32>, String, String) {
    let out = cmd.output().expect("run fencelock");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `check` every 10 ms until it returns something; panics after
/// `limit`.
pub(crate) fn poll<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let give_up = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < give_up,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `check` every 10 ms until it holds; panics after `limit`.
pub(crate) fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    poll(what, limit, || check().then_some(()));
}

/// `EXISTS key`.
pub(crate) fn exists(server: &RedisServer, key: &str) -> bool {
    server.query::<i64>(&["EXISTS", key]) == 1
}

/// One plain HTTP/1.0 GET; the body, or `None` while nothing listens.
pub(crate) fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}
