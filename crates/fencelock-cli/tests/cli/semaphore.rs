//! `fencelock run --permits N` end to end: permits of a fenced semaphore
//! held at once, each in its own slot (FENCELOCK_SLOT), a permit refused
//! or waited for, a lock (no --permits) as the negative control, kind and
//! permit-count conflicts, `status` and `top` per slot, bad --permits
//! values, and the examples of `fencelock run --help`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock_testkit::{GuardedChild, RedisServer, spawn_guarded};

use crate::support::{BIN, exists, fencelock, on, output, wait_for};

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

/// What a held command wrote when it started: `SLOT FENCE TOKEN` (SLOT
/// `unset` when FENCELOCK_SLOT is not set).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Started {
    slot: String,
    fence: u64,
    token: String,
}

/// A command for `run -c` that records its environment in `started`, then
/// holds until `go` exists.
fn hold_until(started: &Path, go: &Path) -> String {
    format!(
        "echo \"${{FENCELOCK_SLOT-unset}} $FENCELOCK_FENCE $FENCELOCK_TOKEN\" > {started}.tmp && mv {started}.tmp {started}; \
         while [ ! -f {go} ]; do sleep 0.02; done",
        started = started.display(),
        go = go.display()
    )
}

/// The record of a command started by [`hold_until`], once written.
fn started(path: &Path) -> Option<Started> {
    let text = read_file(path);
    let mut parts = text.split_whitespace();
    Some(Started {
        slot: parts.next()?.to_string(),
        fence: parts.next()?.parse().ok()?,
        token: parts.next()?.to_string(),
    })
}

fn wait_started(what: &str, path: &Path) -> Started {
    crate::support::poll(what, Duration::from_secs(10), || started(path))
}

/// A `run --permits 2 pool` holder: its record file and its go file.
struct Holder {
    child: GuardedChild,
    started: PathBuf,
    go: PathBuf,
}

fn permit_holder(server: &RedisServer, dir: &Path, id: &str) -> Holder {
    permit_holder_after(server, dir, id, "")
}

/// A `run --permits 2 pool` holder that runs `before` (shell) first.
fn permit_holder_after(server: &RedisServer, dir: &Path, id: &str, before: &str) -> Holder {
    let started = dir.join(format!("started-{id}"));
    let go = dir.join(format!("go-{id}"));
    let script = format!("{before}{}", hold_until(&started, &go));
    let child = spawn(on(
        server,
        &["run", "--permits", "2", "pool", "-c", &script],
    ));
    Holder { child, started, go }
}

fn finish(holder: &mut Holder) {
    std::fs::write(&holder.go, "").expect("touch go");
    let status = holder
        .child
        .wait_timeout(Duration::from_secs(10))
        .expect("the holder ends");
    let stderr = stderr_of(&mut holder.child);
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// Two `run --permits 2` hold at once, in slots 0 and 1 with their own
/// fences, FENCELOCK_SLOT exported; a third with `--wait 0` (or
/// `--no-wait`) is refused with 75 without running; `status` and `top`
/// show both slots, as text and as JSON; a waiting fourth gets in, in the
/// slot that frees, once one of the two is done.
#[test]
fn two_permits_hold_at_once_a_third_waits_or_is_refused() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = permit_holder(&server, dir.path(), "a");
    let first = wait_started("the first permit", &a.started);
    let mut b = permit_holder(&server, dir.path(), "b");
    let second = wait_started("the second permit", &b.started);
    // Both hold now: neither go file exists yet.
    assert!(started(&a.started).is_some(), "the first still holds");
    assert_eq!((first.slot.as_str(), second.slot.as_str()), ("0", "1"));
    assert!(second.fence > first.fence, "{first:?} {second:?}");
    assert_ne!(first.token, second.token);

    // A third: refused at once with --wait 0 and --no-wait (75, or
    // --conflict-exit-code), its command never run.
    let marker = dir.path().join("third-ran");
    let touch = format!("touch {}", marker.display());
    for refused in [
        &["run", "--permits", "2", "--wait", "0", "pool", "-c", &touch][..],
        &["run", "--permits", "2", "--no-wait", "pool", "-c", &touch][..],
    ] {
        let (code, _, stderr) = output(&mut on(&server, refused));
        assert_eq!(code, Some(75), "{refused:?}: {stderr}");
        assert!(stderr.contains("pool"), "{stderr}");
    }
    let (code, _, stderr) = output(&mut on(
        &server,
        &[
            "run",
            "--permits",
            "2",
            "--no-wait",
            "--conflict-exit-code",
            "9",
            "-q",
            "pool",
            "-c",
            &touch,
        ],
    ));
    assert_eq!(code, Some(9), "{stderr}");
    assert!(!marker.exists(), "no command runs without a permit");

    // status: the permit count and one line per slot.
    let ids = [&first, &second].map(|s| fencelock::holder_id(&s.token));
    let (code, text, stderr) = output(&mut on(&server, &["status", "pool"]));
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("pool: semaphore, 2 of 2 permits held, last fence "),
        "{text}"
    );
    for (slot, (line, (id, s))) in lines[1..]
        .iter()
        .zip(ids.iter().zip([&first, &second]))
        .enumerate()
    {
        assert!(
            line.starts_with(&format!("  slot {slot}: held by {id}, fence {}, ", s.fence)),
            "{text}"
        );
        assert!(line.ends_with(" ms left"), "{text}");
    }
    let (code, json, stderr) = output(&mut on(&server, &["status", "pool", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let object: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    assert_eq!(object["name"], "pool");
    assert_eq!(object["key"], "lock:{pool}");
    assert_eq!(object["held"], true);
    assert_eq!(object["permits"], 2);
    assert_eq!(object["holder"], serde_json::Value::Null);
    assert_eq!(object["waiters"], 0);
    assert_eq!(object["last_fence"], second.fence);
    let holders = object["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 2, "{object}");
    for (slot, (h, (id, s))) in holders
        .iter()
        .zip(ids.iter().zip([&first, &second]))
        .enumerate()
    {
        assert_eq!(h["slot"], slot, "{object}");
        assert_eq!(h["holder"], id.as_str(), "{object}");
        assert_eq!(h["fence"], s.fence, "{object}");
        let ttl = h["ttl_ms"].as_u64().expect("ttl_ms");
        assert!(ttl > 0 && ttl <= 10_000, "{object}");
    }

    // top: a row per slot, SLOT as slot/permits; one JSON object for the
    // name, with its holders.
    let (code, text, stderr) = output(&mut on(&server, &["top", "--once"]));
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("1 lock matching *"), "{text}");
    assert!(lines[1].starts_with("NAME  SLOT"), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    for (slot, (line, (id, s))) in lines[2..]
        .iter()
        .zip(ids.iter().zip([&first, &second]))
        .enumerate()
    {
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            columns[..4],
            ["pool", &format!("{slot}/2"), id, &s.fence.to_string()],
            "{text}"
        );
        assert!(line.contains(" s "), "ttl left shown: {text}");
    }
    let (code, json, stderr) = output(&mut on(&server, &["top", "--once", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(&json).expect("top --json");
    let rows = rows.as_array().expect("array");
    assert_eq!(rows.len(), 1, "{json}");
    assert_eq!(rows[0]["name"], "pool");
    assert_eq!(rows[0]["permits"], 2);
    assert_eq!(rows[0]["fence"], serde_json::Value::Null);
    assert_eq!(rows[0]["holders"][1]["slot"], 1);
    assert_eq!(rows[0]["holders"][1]["holder"], ids[1].as_str());
    assert_eq!(rows[0]["holders"][1]["fence"], second.fence);

    // A fourth waits; it gets the slot the first frees, after the first's
    // command is done.
    let fourth_started = dir.path().join("started-d");
    let fourth_go = dir.path().join("go-d");
    let mut fourth = spawn(on(
        &server,
        &[
            "run",
            "--permits",
            "2",
            "--wait",
            "20s",
            "pool",
            "-c",
            &hold_until(&fourth_started, &fourth_go),
        ],
    ));
    wait_for("the fourth to queue", Duration::from_secs(10), || {
        server.query::<i64>(&["ZCARD", "lock:{pool}:queue"]) == 1
    });
    let (_, json, _) = output(&mut on(&server, &["status", "pool", "--json"]));
    let object: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    assert_eq!(object["waiters"], 1, "{object}");
    assert!(
        started(&fourth_started).is_none(),
        "no third permit at once"
    );
    finish(&mut a);
    let fourth_record = wait_started("the fourth permit", &fourth_started);
    assert_eq!(fourth_record.slot, "0", "the slot the first freed");
    assert!(fourth_record.fence > second.fence);
    std::fs::write(&fourth_go, "").expect("touch go");
    assert_eq!(
        fourth
            .wait_timeout(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
    finish(&mut b);
    assert!(!exists(&server, "lock:{pool}"), "every permit released");
    let (_, text, _) = output(&mut on(&server, &["status", "pool"]));
    assert!(text.starts_with("pool: free"), "{text}");
}

/// The negative control: two `run`s of a lock (no --permits) never hold at
/// once, whatever the harness that saw two permits at once does: the second
/// queues and starts only after the first is done, without FENCELOCK_SLOT
/// (even one inherited from an outer `run --permits`); the lock's `status
/// --json` keeps its fields, with no `permits` nor `holders`.
#[test]
fn two_runs_of_a_lock_never_hold_at_once() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |id: &str| {
        let started = dir.path().join(format!("started-{id}"));
        let go = dir.path().join(format!("go-{id}"));
        let mut cmd = on(
            &server,
            &[
                "run",
                "--wait",
                "20s",
                "job",
                "-c",
                &hold_until(&started, &go),
            ],
        );
        cmd.env("FENCELOCK_SLOT", "1");
        (spawn(cmd), started, go)
    };
    let (mut a, a_started, a_go) = run("a");
    let first = wait_started("the first holder", &a_started);
    assert_eq!(first.slot, "unset", "a lock has no slot");
    let (mut b, b_started, b_go) = run("b");
    wait_for("the second to queue", Duration::from_secs(10), || {
        server.query::<i64>(&["ZCARD", "lock:{job}:queue"]) == 1
    });
    let (_, json, _) = output(&mut on(&server, &["status", "job", "--json"]));
    let object: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    let mut fields: Vec<&str> = object
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "backend", "fence", "held", "holder", "key", "name", "ttl_ms", "waiters"
        ],
        "{object}"
    );
    assert_eq!(object["fence"], first.fence);
    assert!(
        started(&b_started).is_none(),
        "the second must not hold while the first does"
    );
    std::fs::write(&a_go, "").expect("touch go");
    assert_eq!(
        a.wait_timeout(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
    let second = wait_started("the second holder", &b_started);
    assert_eq!(second.slot, "unset");
    assert!(second.fence > first.fence);
    std::fs::write(&b_go, "").expect("touch go");
    let status = b.wait_timeout(Duration::from_secs(10)).expect("b ends");
    assert_eq!(status.code(), Some(0), "{}", stderr_of(&mut b));
}

/// A name is one kind while it has holders: `run --permits` on a held
/// lock, `run` on a held semaphore and another permit count each exit 78
/// at once with the library's message, their command never run; the
/// holders keep what they hold.
#[test]
fn kind_and_permit_conflicts_exit_78() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let lock_started = dir.path().join("lock-started");
    let lock_go = dir.path().join("lock-go");
    let mut lock = spawn(on(
        &server,
        &["run", "job", "-c", &hold_until(&lock_started, &lock_go)],
    ));
    wait_started("the lock's holder", &lock_started);
    let mut permit = permit_holder(&server, dir.path(), "a");
    wait_started("the permit's holder", &permit.started);

    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let cases: [(&[&str], &str); 3] = [
        (
            &["run", "--permits", "2", "job", "-c", &touch],
            "lock \"job\" is held as a mutex, but was asked for as a semaphore",
        ),
        (
            &["run", "pool", "-c", &touch],
            "lock \"pool\" is held as a semaphore, but was asked for as a mutex",
        ),
        (
            &["run", "--permits", "3", "pool", "-c", &touch],
            "semaphore \"pool\" has 2 permits while it has holders, but was asked for with 3",
        ),
    ];
    for (args, message) in cases {
        let started = std::time::Instant::now();
        let (code, _, stderr) = output(&mut on(&server, args));
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(stderr.starts_with("fencelock: "), "{stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "refused at once, not after --wait"
        );
    }
    assert!(!marker.exists(), "no conflicting command ran");
    let (_, text, _) = output(&mut on(&server, &["status", "job"]));
    assert!(text.starts_with("job: held by "), "{text}");
    let (_, text, _) = output(&mut on(&server, &["status", "pool"]));
    assert!(
        text.starts_with("pool: semaphore, 1 of 2 permits held"),
        "{text}"
    );
    std::fs::write(&lock_go, "").expect("touch go");
    assert_eq!(
        lock.wait_timeout(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
    finish(&mut permit);
}

/// A permit lost while its command runs (the semaphore's key deleted)
/// stops the command and exits 76, as a lost lock does, naming its slot.
#[test]
fn a_lost_permit_stops_the_command_and_exits_76() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let ready = dir.path().join("ready");
    let script = format!("trap '' TERM; touch {}; sleep 30", ready.display());
    let mut run = spawn(on(
        &server,
        &[
            "run",
            "--permits",
            "3",
            "--ttl",
            "300ms",
            "--kill-grace",
            "200ms",
            "pool",
            "-c",
            &script,
        ],
    ));
    wait_for("the command to start", Duration::from_secs(10), || {
        ready.exists()
    });
    server.cmd(&["DEL", "lock:{pool}"]);
    let status = run.wait_timeout(Duration::from_secs(10)).expect("run ends");
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("was lost"), "{stderr}");
    assert!(stderr.contains(", slot 0)"), "{stderr}");
}

/// Bad --permits values are usage errors (64, one line naming --permits
/// and the range), before any connection; so is --permits with the guide
/// layout. The bounds, 1 and 1024, are taken.
#[test]
fn bad_permits_are_usage_errors() {
    let unreachable = RedisServer::client_url_unreachable();
    let cases: [(&str, &str); 5] = [
        ("0", "at least 1 permit"),
        (
            "1025",
            "1025 permits is more than the most a semaphore may have, 1024",
        ),
        (
            "99999999999",
            "more than the most a semaphore may have, 1024",
        ),
        (
            "two",
            "not a number of permits (use a number from 1 to 1024)",
        ),
        ("-1", "--permits"),
    ];
    for (value, message) in cases {
        let (code, _, stderr) = output(&mut fencelock(&[
            "--redis",
            &unreachable,
            "run",
            &format!("--permits={value}"),
            "pool",
            "--",
            "true",
        ]));
        assert_eq!(code, Some(64), "{value}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("--permits"), "{value}: {stderr}");
        assert!(stderr.contains(message), "{value}: {stderr}");
        assert!(stderr.contains("(see fencelock run --help)"), "{stderr}");
    }
    let (code, _, stderr) = output(&mut fencelock(&[
        "--redis",
        &unreachable,
        "--layout",
        "guide",
        "run",
        "--permits",
        "2",
        "pool",
        "--",
        "true",
    ]));
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--permits cannot be used with --layout guide"),
        "{stderr}"
    );

    let server = RedisServer::start();
    for permits in ["1", "1024"] {
        let (code, stdout, stderr) = output(&mut on(
            &server,
            &[
                "run",
                "--permits",
                permits,
                "edge",
                "-c",
                "echo \"$FENCELOCK_SLOT\"",
            ],
        ));
        assert_eq!(code, Some(0), "{permits}: {stderr}");
        assert_eq!(stdout, "0\n", "{permits}");
    }
}

/// A bad `--slot` (or FENCELOCK_SLOT) of `write`, `read` and `update` is a
/// usage error (64, one line); an empty FENCELOCK_SLOT says how to use the
/// resource's own pair instead.
#[test]
fn bad_slots_are_usage_errors() {
    let unreachable = RedisServer::client_url_unreachable();
    let commands: [&[&str]; 3] = [
        &["write", "partitions", "v", "--fence", "1", "--holder", "t"],
        &["read", "partitions"],
        &[
            "update",
            "partitions",
            "--fence",
            "1",
            "--holder",
            "t",
            "--",
            "cat",
        ],
    ];
    for command in commands {
        let mut args = vec!["--redis", &unreachable, command[0], "--slot", "x"];
        args.extend_from_slice(&command[1..]);
        let (code, _, stderr) = output(&mut fencelock(&args));
        assert_eq!(code, Some(64), "{command:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("invalid value 'x' for '--slot <SLOT>': not a slot"),
            "{stderr}"
        );
        let mut args = vec!["--redis", &unreachable];
        args.extend_from_slice(command);
        let (code, _, stderr) = output(fencelock(&args).env("FENCELOCK_SLOT", ""));
        assert_eq!(code, Some(64), "{command:?}: {stderr}");
        assert!(stderr.contains("env -u FENCELOCK_SLOT"), "{stderr}");
    }
}

/// Every example that `--help` pages show for semaphores (a line that
/// starts with `fencelock` and names `--permits` or `--slot`) runs as
/// written (the `fencelock` under test first on `PATH`, `FENCELOCK_URL`
/// naming a private redis-server) and does what the help says.
#[test]
fn the_semaphore_examples_of_the_help_pages_run_as_written() {
    let mut examples: Vec<String> = Vec::new();
    for page in [
        &[][..],
        &["run"],
        &["write"],
        &["read"],
        &["update"],
        &["status"],
        &["top"],
    ] {
        let mut args = page.to_vec();
        args.push("--help");
        let (code, help, stderr) = output(&mut fencelock(&args));
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        for line in help.lines().map(str::trim) {
            if line.starts_with("fencelock ")
                && (line.contains("--permits") || line.contains("--slot"))
                && !examples.iter().any(|e| e == line)
            {
                examples.push(line.to_string());
            }
        }
    }
    assert!(examples.len() >= 2, "{examples:?}");
    let server = RedisServer::start();
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for example in &examples {
        let mut sh = Command::new("sh");
        sh.arg("-ec")
            .arg(example)
            .env("PATH", &path)
            .env("FENCELOCK_URL", server.url())
            .env_remove("FENCELOCK_REDIS_URL")
            .env_remove("FENCELOCK_SLOT")
            .env_remove("FENCELOCK_FENCE")
            .env_remove("FENCELOCK_TOKEN");
        let (code, stdout, stderr) = output(&mut sh);
        assert_eq!(code, Some(0), "{example}: {stdout}{stderr}");
        if example.contains(" encoders ") {
            let line = stdout.trim_end();
            let fence = line
                .strip_prefix("slot 0, fence ")
                .unwrap_or_else(|| panic!("{example}: {stdout}"));
            assert!(fence.parse::<u64>().is_ok(), "{example}: {stdout}");
        } else if example.contains(" flushers ") {
            assert_eq!(
                stdout.trim_end().split(" (").next(),
                Some("partitions slot 0: accepted"),
                "{example}"
            );
            let stored: Vec<Option<String>> =
                server.query(&["HMGET", "partitions", "value:0", "value"]);
            assert_eq!(stored, [Some("flushed".to_string()), None], "{example}");
        } else {
            panic!("an example this test does not check: {example}");
        }
    }
}

/// Inside `run --permits N`, `fencelock write`, `read` and `update` use the
/// permit's slot (FENCELOCK_SLOT): the fields value:SLOT, fence:SLOT and
/// holder:SLOT, with `"slot"` in their JSON. A stale holder of a slot is
/// refused once the slot's next holder wrote, while a live permit of
/// another slot, with an older fence, is still accepted in its own slot;
/// on the resource's own pair (no slot: the negative control) that older
/// fence is refused.
#[test]
fn nested_resource_commands_use_the_permits_slot() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |id: &str| {
        format!(
            "\"$FENCELOCK_BIN\" write partitions \"by-$FENCELOCK_SLOT\" > {}; ",
            dir.path().join(format!("wrote-{id}")).display()
        )
    };
    let mut a = permit_holder_after(&server, dir.path(), "a", &write("a"));
    let first = wait_started("the first permit", &a.started);
    let mut b = permit_holder_after(&server, dir.path(), "b", &write("b"));
    let second = wait_started("the second permit", &b.started);
    for (id, s) in [("a", &first), ("b", &second)] {
        assert_eq!(
            read_file(&dir.path().join(format!("wrote-{id}"))),
            format!("partitions slot {}: accepted (fence {})\n", s.slot, s.fence)
        );
    }
    let ids = [&first, &second].map(|s| fencelock::holder_id(&s.token));
    let stored: Vec<Option<String>> = server.query(&[
        "HMGET",
        "partitions",
        "value:0",
        "fence:0",
        "holder:0",
        "value:1",
        "fence:1",
        "holder:1",
        "value",
        "fence",
    ]);
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        stored,
        [
            some("by-0"),
            some(&first.fence.to_string()),
            some(&ids[0]),
            some("by-1"),
            some(&second.fence.to_string()),
            some(&ids[1]),
            None,
            None,
        ]
    );
    let (code, json, stderr) = output(&mut on(
        &server,
        &["read", "partitions", "--slot", "1", "--json"],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    let object: serde_json::Value = serde_json::from_str(&json).expect("read --json");
    assert_eq!(object["value"], "by-1");
    assert_eq!(object["slot"], 1);
    assert_eq!(object["fence"], second.fence);

    // Slot 0 changes hands: its next holder writes with a newer fence.
    finish(&mut a);
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &[
            "run",
            "--permits",
            "2",
            "pool",
            "-c",
            "\"$FENCELOCK_BIN\" write partitions newer --json",
        ],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    let third: serde_json::Value = serde_json::from_str(&stdout).expect("write --json");
    assert_eq!(third["slot"], 0, "{third}");
    assert_eq!(third["accepted"], true, "{third}");
    let third_fence = third["fence"].as_u64().expect("fence");
    assert!(third_fence > second.fence);

    let write_as = |s: &Started, slot: Option<&str>, value: &str| {
        let fence = s.fence.to_string();
        let mut args = vec![
            "write",
            "partitions",
            value,
            "--fence",
            &fence,
            "--holder",
            &s.token,
        ];
        if let Some(slot) = slot {
            args.extend(["--slot", slot]);
        }
        output(&mut on(&server, &args))
    };
    // The first permit, stale in slot 0: refused, nothing written.
    let (code, stdout, stderr) = write_as(&first, Some("0"), "stale");
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "partitions slot 0: REJECTED as stale: fence {} is older than the resource's {third_fence}",
            first.fence
        )),
        "{stdout}"
    );
    // The second permit, live in slot 1 with a fence older than slot 0's:
    // accepted in its own slot.
    let (code, stdout, stderr) = write_as(&second, Some("1"), "again");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let stored: Vec<Option<String>> = server.query(&["HMGET", "partitions", "value:0", "value:1"]);
    assert_eq!(stored, [some("newer"), some("again")]);
    // The negative control: on the resource's own pair, the same older
    // fence is refused once the newer one wrote.
    let newest = Started {
        slot: "0".into(),
        fence: third_fence,
        token: "another-holder".into(),
    };
    let (code, _, stderr) = write_as(&newest, None, "own");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, _) = write_as(&second, None, "own-stale");
    assert_eq!(code, Some(3), "{stdout}");
    assert!(
        stdout.starts_with("partitions: REJECTED as stale"),
        "{stdout}"
    );

    // update and read --register inside, in the free slot (0), while the
    // second permit holds slot 1.
    let increment = dir.path().join("increment.sh");
    std::fs::write(&increment, "read v; echo $(( ${v:-0} + 1 ))\n").expect("write script");
    let increment = increment.to_str().expect("utf-8 path");
    for expected in ["1", "2"] {
        let (code, stdout, stderr) = output(&mut on(
            &server,
            &[
                "run",
                "--permits",
                "2",
                "pool",
                "--",
                BIN,
                "update",
                "counters",
                "--json",
                "--",
                "sh",
                increment,
            ],
        ));
        assert_eq!(code, Some(0), "{stderr}");
        let object: serde_json::Value = serde_json::from_str(&stdout).expect("update --json");
        assert_eq!(object["slot"], 0, "{object}");
        assert_eq!(object["value"], expected, "{object}");
    }
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &[
            "run",
            "--permits",
            "2",
            "pool",
            "--",
            BIN,
            "read",
            "--register",
            "counters",
        ],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("counters slot 0: \"2\" (fence "),
        "{stdout}"
    );
    let stored: Vec<Option<String>> =
        server.query(&["HMGET", "counters", "value:0", "value:1", "value"]);
    assert_eq!(stored, [some("2"), None, None]);
    finish(&mut b);
}
