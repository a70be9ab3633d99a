//! Helper for the testkit's orphan-safety test.
//!
//! Starts a [`RedisServer`] and a guarded `sleep` from a short-lived thread
//! (which then exits, like a tokio worker thread might), checks the server
//! still answers, prints `redis_pid=N`, `guarded_pid=N` and `redis_dir=PATH`
//! on stdout, then sleeps until it is killed (at most 60 s). The test
//! SIGKILLs this process, expects both children to die with it, and removes
//! the server's directory (no destructor ran to do it).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock_testkit::{RedisServer, spawn_guarded};

fn main() {
    let (server, sleeper) = std::thread::spawn(|| {
        let server = RedisServer::start();
        let mut sleep = Command::new("sleep");
        sleep
            .arg("60")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        (server, spawn_guarded(sleep))
    })
    .join()
    .expect("the thread starting the children panicked");

    // The requesting thread is gone; the children must not have died with it.
    std::thread::sleep(Duration::from_millis(200));
    server.cmd(&["PING"]);

    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "redis_pid={}", server.pid()).expect("write to stdout");
    writeln!(stdout, "guarded_pid={}", sleeper.pid()).expect("write to stdout");
    writeln!(stdout, "redis_dir={}", server.dir().display()).expect("write to stdout");
    stdout.flush().expect("flush stdout");
    drop(stdout);

    std::thread::sleep(Duration::from_secs(60));
}
