//! Tests of the testkit against real `redis-server` processes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::GONE_TIMEOUT;
use fencelock_testkit::process::wait_process_gone;
use fencelock_testkit::{
    Persistence, PgServer, RedisConfig, RedisServer, free_port, process_alive, spawn_guarded,
};
use redis::Value;

fn ping_with_timeout(url: &str, timeout: Duration) -> redis::RedisResult<String> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    redis::cmd("PING").query(&mut con)
}

#[test]
fn start_and_ping() {
    let server = RedisServer::start();
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
    assert_eq!(server.addr(), format!("127.0.0.1:{}", server.port()));
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert!(process_alive(server.pid()));
    assert!(server.dir().is_dir());
    // --enable-debug-command yes
    assert_eq!(server.cmd(&["DEBUG", "SLEEP", "0"]), Value::Okay);
    assert!(
        server.log().contains("Ready to accept connections"),
        "log: {}",
        server.log()
    );
    assert_eq!(
        ping_with_timeout(&server.url(), Duration::from_secs(2)).expect("ping"),
        "PONG"
    );
}

#[test]
fn cmd_set_get_and_error_replies() {
    let server = RedisServer::start();
    assert_eq!(server.cmd(&["SET", "k", "v"]), Value::Okay);
    assert_eq!(
        server.query::<Option<String>>(&["GET", "k"]),
        Some("v".to_owned())
    );
    assert_eq!(server.query::<Option<String>>(&["GET", "missing"]), None);
    server.cmd(&["LPUSH", "list", "x"]);
    let error = server
        .try_cmd(&["GET", "list"])
        .expect_err("WRONGTYPE expected");
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
}

#[test]
fn two_servers_get_distinct_ports() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    for server in [&a, &b] {
        assert_ne!(server.port(), 6379);
        assert!(server.port() < 55535);
        assert_eq!(server.query::<String>(&["PING"]), "PONG");
    }
    a.cmd(&["SET", "only-in-a", "1"]);
    assert_eq!(b.query::<Option<String>>(&["GET", "only-in-a"]), None);
}

#[test]
fn free_port_avoids_reserved_ports() {
    for _ in 0..200 {
        let port = free_port();
        assert_ne!(port, 6379);
        assert!(port < 55535, "{port}");
    }
}

#[test]
fn pause_blocks_replies_and_resume_restores_them() {
    let server = RedisServer::start();
    server.pause();

    let started = Instant::now();
    let result = ping_with_timeout(&server.url(), Duration::from_millis(300));
    assert!(
        result.is_err(),
        "PING answered by a paused server: {result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "timeout not honoured"
    );
    assert!(
        server
            .try_cmd_timeout(&["PING"], Duration::from_millis(300))
            .is_err()
    );

    server.resume();
    assert_eq!(server.query::<String>(&["PING"]), "PONG");

    {
        let _paused = server.pause_guard();
        assert!(ping_with_timeout(&server.url(), Duration::from_millis(300)).is_err());
    }
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
}

#[test]
fn restart_without_persistence_loses_data() {
    let mut server = RedisServer::start();
    let (port, old_pid) = (server.port(), server.pid());
    server.cmd(&["SET", "k", "v"]);

    server.restart();

    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(wait_process_gone(old_pid, GONE_TIMEOUT));
    assert_eq!(server.query::<Option<String>>(&["GET", "k"]), None);
}

#[test]
fn restart_with_aof_always_keeps_data() {
    let mut server =
        RedisServer::start_with(RedisConfig::default().with_persistence(Persistence::AofAlways));
    let port = server.port();
    for i in 0..50 {
        server.cmd(&["SET", &format!("k{i}"), &format!("v{i}")]);
    }
    server.cmd(&["INCR", "counter"]);

    server.restart();

    assert_eq!(server.port(), port);
    assert_eq!(
        server.query::<Option<String>>(&["GET", "k49"]),
        Some("v49".to_owned())
    );
    assert_eq!(server.query::<i64>(&["GET", "counter"]), 1);
    assert_eq!(server.query::<i64>(&["DBSIZE"]), 51);
}

#[test]
fn restart_while_paused_and_after_kill() {
    let mut server = RedisServer::start();
    server.pause();
    server.restart();
    assert_eq!(server.query::<String>(&["PING"]), "PONG");

    let pid = server.pid();
    server.kill();
    assert!(!server.is_running());
    assert!(!process_alive(pid));
    assert!(
        server
            .try_cmd_timeout(&["PING"], Duration::from_millis(300))
            .is_err()
    );

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
}

#[test]
fn drop_kills_the_process_and_removes_the_directory() {
    let server = RedisServer::start();
    let pid = server.pid();
    let dir = server.dir().to_owned();
    server.pause(); // Drop must also work on a paused server.
    drop(server);
    assert!(
        wait_process_gone(pid, GONE_TIMEOUT),
        "redis-server {pid} survived Drop"
    );
    assert!(!dir.exists());
}

#[test]
fn password_is_required_and_accepted() {
    let server = RedisServer::start_with(RedisConfig::default().with_password("s3cret/p@ss"));
    assert_eq!(
        server.url(),
        format!("redis://:s3cret%2Fp%40ss@127.0.0.1:{}/", server.port())
    );

    let no_auth = format!("redis://127.0.0.1:{}/", server.port());
    let error = ping_with_timeout(&no_auth, Duration::from_secs(2)).expect_err("NOAUTH expected");
    assert!(
        error.to_string().to_uppercase().contains("AUTH"),
        "unexpected error: {error}"
    );

    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    assert!(ping_with_timeout(&wrong, Duration::from_secs(2)).is_err());

    assert_eq!(
        ping_with_timeout(&server.url(), Duration::from_secs(2)).expect("ping"),
        "PONG"
    );
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
}

#[test]
fn extra_args_are_passed_through() {
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_arg("--maxmemory")
            .with_arg("12345678"),
    );
    let config: Vec<String> = server.query(&["CONFIG", "GET", "maxmemory"]);
    assert_eq!(config, ["maxmemory", "12345678"]);
    let save: Vec<String> = server.query(&["CONFIG", "GET", "save"]);
    assert_eq!(save, ["save", ""]);
    let appendonly: Vec<String> = server.query(&["CONFIG", "GET", "appendonly"]);
    assert_eq!(appendonly, ["appendonly", "no"]);
}

#[test]
fn unreachable_url_refuses_connections() {
    let url = RedisServer::client_url_unreachable();
    assert!(url.starts_with("redis://127.0.0.1:"));
    let started = Instant::now();
    assert!(ping_with_timeout(&url, Duration::from_secs(2)).is_err());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "should be refused at once"
    );
}

#[test]
fn guarded_child_is_driven_line_by_line() {
    let mut command = Command::new("sh");
    command
        .args(["-c", r#"while read -r line; do echo "got $line"; done"#])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = spawn_guarded(command);
    let mut stdin = child.take_stdin().expect("stdin");
    let mut stdout = BufReader::new(child.take_stdout().expect("stdout"));
    assert!(child.take_stdin().is_none());

    for word in ["one", "two"] {
        writeln!(stdin, "{word}").expect("write");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read");
        assert_eq!(line, format!("got {word}\n"));
    }

    drop(stdin); // EOF: the loop ends and the shell exits 0.
    let status = child.wait_timeout(Duration::from_secs(5)).expect("exit");
    assert!(status.success());
    assert!(!child.is_running());
    // kill() after exit is a no-op that reports the status.
    assert_eq!(child.kill(), Some(status));
}

#[test]
fn guarded_child_stop_cont_kill_and_wait_timeout() {
    let mut command = Command::new("sleep");
    command
        .arg("30")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = spawn_guarded(command);
    let pid = child.pid();

    child.stop();
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    assert!(state.contains(") T"), "not stopped: {state}");
    assert!(child.is_running());
    child.cont();
    assert_eq!(child.wait_timeout(Duration::from_millis(100)), None);

    let status = child.kill().expect("status");
    assert!(!status.success());
    assert!(!process_alive(pid));

    let mut exits = Command::new("sh");
    exits.args(["-c", "exit 3"]).stdin(Stdio::null());
    let mut child = spawn_guarded(exits);
    let status = child.wait_timeout(Duration::from_secs(5)).expect("exit");
    assert_eq!(status.code(), Some(3));
}

#[test]
fn guarded_child_dies_on_drop() {
    let mut command = Command::new("sleep");
    command
        .arg("30")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = spawn_guarded(command);
    let pid = child.pid();
    drop(child);
    assert!(wait_process_gone(pid, GONE_TIMEOUT));
}

#[test]
fn spawning_from_short_lived_threads_keeps_children_alive() {
    // PDEATHSIG is per forking thread: children requested from a thread that
    // then exits must survive, because the spawner thread forks them.
    let server = std::thread::spawn(RedisServer::start)
        .join()
        .expect("thread");
    std::thread::sleep(Duration::from_millis(200));
    assert!(process_alive(server.pid()));
    assert_eq!(server.query::<String>(&["PING"]), "PONG");
}

#[test]
fn children_die_when_the_test_process_is_killed() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_testkit-orphan-probe"));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut probe = spawn_guarded(command);
    let mut stdout = BufReader::new(probe.take_stdout().expect("stdout"));

    let mut read_pid = |key: &str| -> u32 {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read probe stdout");
        line.trim()
            .strip_prefix(key)
            .and_then(|pid| pid.strip_prefix('='))
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("expected `{key}=PID` from the probe, got {line:?}"))
    };
    let redis_pid = read_pid("redis_pid");
    let guarded_pid = read_pid("guarded_pid");
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read probe stdout");
    let redis_dir = line
        .trim()
        .strip_prefix("redis_dir=")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("expected `redis_dir=PATH` from the probe, got {line:?}"));
    assert!(process_alive(redis_pid));
    assert!(process_alive(guarded_pid));

    // SIGKILL: no destructor runs in the probe.
    probe.kill();

    assert!(
        wait_process_gone(redis_pid, GONE_TIMEOUT),
        "redis-server {redis_pid} outlived its SIGKILLed parent"
    );
    assert!(
        wait_process_gone(guarded_pid, GONE_TIMEOUT),
        "guarded child {guarded_pid} outlived its SIGKILLed parent"
    );
    // No destructor removed the server's directory: the test does.
    assert!(redis_dir.is_dir(), "{}", redis_dir.display());
    std::fs::remove_dir_all(&redis_dir).expect("remove the probe's server directory");
}

#[test]
fn pg_server_answers_and_its_pause_guard_resumes_it() {
    let pg = PgServer::start();
    assert_eq!(pg.psql("postgres", "SELECT 1 + 1"), "2");
    {
        let _paused = pg.pause_guard();
        let state = std::fs::read_to_string(format!("/proc/{}/stat", pg.pid())).expect("stat");
        assert!(state.contains(") T"), "not stopped: {state}");
    }
    assert_eq!(pg.psql("postgres", "SELECT 2"), "2");
    let (pid, dir) = (pg.pid(), pg.dir().to_owned());
    drop(pg);
    assert!(wait_process_gone(pid, GONE_TIMEOUT));
    assert!(!dir.exists());
}
