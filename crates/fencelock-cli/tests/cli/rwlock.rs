//! `fencelock run --read` and `--write` end to end: readers of a fenced
//! read-write lock held at once, a writer alone and in fair order with
//! readers, FENCELOCK_ACCESS and FENCELOCK_FENCE (the writer's fence, a
//! reader's write epoch) exported, `read --validate` clean and torn (a plain
//! `read` as the negative control), writes refused with a reader's epoch,
//! `status` and `top` of a read-write lock, kind conflicts, bad flag
//! combinations, and the examples of the help pages; on a Redis server, and
//! on etcd in the tests with `etcd` in their names.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock_testkit::{EtcdCluster, GuardedChild, RedisServer, spawn_guarded};
use serde_json::Value;

use crate::support::{BIN, exists, fencelock, on, output, poll, wait_for};

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

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// What a held command wrote when it started: FENCELOCK_ACCESS (`unset`
/// when not set), FENCELOCK_SLOT (likewise), FENCELOCK_FENCE and
/// FENCELOCK_TOKEN.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Started {
    access: String,
    slot: String,
    fence: u64,
    token: String,
}

/// A command for `run -c` that runs `before` (shell), records its
/// environment in `started`, then holds until `go` exists.
fn hold_until(before: &str, started: &Path, go: &Path) -> String {
    format!(
        "{before}echo \"${{FENCELOCK_ACCESS-unset}} ${{FENCELOCK_SLOT-unset}} $FENCELOCK_FENCE $FENCELOCK_TOKEN\" > {started}.tmp && mv {started}.tmp {started}; \
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
        access: parts.next()?.to_string(),
        slot: parts.next()?.to_string(),
        fence: parts.next()?.parse().ok()?,
        token: parts.next()?.to_string(),
    })
}

fn wait_started(what: &str, path: &Path) -> Started {
    poll(what, Duration::from_secs(10), || started(path))
}

/// A `run` holding `cfg` (its flags `flags`): its record file and its go
/// file.
struct Holder {
    child: GuardedChild,
    started: PathBuf,
    go: PathBuf,
}

fn holder(server: &RedisServer, dir: &Path, id: &str, flags: &[&str], before: &str) -> Holder {
    let started = dir.join(format!("started-{id}"));
    let go = dir.join(format!("go-{id}"));
    let script = hold_until(before, &started, &go);
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    args.extend(["cfg", "-c", &script]);
    let child = spawn(on(server, &args));
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

/// `run --write cfg -- fencelock write config VALUE --json`: the fence it
/// wrote with.
fn write_config(server: &RedisServer, value: &str) -> u64 {
    let (code, stdout, stderr) = output(&mut on(
        server,
        &[
            "run", "--write", "cfg", "--", BIN, "write", "config", value, "--json",
        ],
    ));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let object = json(&stdout);
    assert_eq!(object["accepted"], true, "{object}");
    object["fence"].as_u64().expect("fence")
}

/// The sorted field names of a JSON object.
fn fields(object: &Value) -> Vec<String> {
    let mut fields: Vec<String> = object
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect();
    fields.sort_unstable();
    fields
}

/// Two `run --read` hold at once, each with FENCELOCK_ACCESS=read and
/// FENCELOCK_FENCE the write epoch (the last writer's fence), no
/// FENCELOCK_SLOT, and each validates its read of the last writer's value
/// as clean. A writer with `--no-wait` is refused (75) while they hold.
/// `status` and `top` show both readers, as text and as JSON.
#[test]
fn rwlock_two_readers_hold_at_once_with_the_write_epoch() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let last_writer = write_config(&server, "v1");
    let validate = |id: &str| {
        format!(
            "\"$FENCELOCK_BIN\" read --validate config --json > {}; ",
            dir.path().join(format!("validated-{id}")).display()
        )
    };
    let mut a = holder(&server, dir.path(), "a", &["--read"], &validate("a"));
    let first = wait_started("the first reader", &a.started);
    let mut b = holder(&server, dir.path(), "b", &["--read"], &validate("b"));
    let second = wait_started("the second reader", &b.started);
    // Both hold now: neither go file exists yet.
    for s in [&first, &second] {
        assert_eq!((s.access.as_str(), s.slot.as_str()), ("read", "unset"));
        assert_eq!(s.fence, last_writer, "the epoch is the last fence issued");
    }
    assert_ne!(first.token, second.token);
    for id in ["a", "b"] {
        let object = json(&read_file(&dir.path().join(format!("validated-{id}"))));
        assert_eq!(object["clean"], true, "{object}");
        assert_eq!(object["epoch"], last_writer, "{object}");
        assert_eq!(object["value"], "v1", "{object}");
        assert_eq!(object["fence"], last_writer, "{object}");
    }

    // A writer is refused while readers hold; its command never runs.
    let marker = dir.path().join("writer-ran");
    let touch = format!("touch {}", marker.display());
    let (code, _, stderr) = output(&mut on(
        &server,
        &["run", "--write", "--no-wait", "cfg", "-c", &touch],
    ));
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("cfg"), "{stderr}");
    assert!(!marker.exists(), "no writer runs while readers hold");

    // status: the readers, each with its write epoch.
    let ids = [&first, &second].map(|s| fencelock::holder_id(&s.token));
    let (code, text, stderr) = output(&mut on(&server, &["status", "cfg"]));
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("cfg: read-write lock, held by 2 readers, last fence {last_writer}"),
        "{text}"
    );
    let mut shown: Vec<&str> = lines[1..].to_vec();
    shown.sort_unstable();
    let mut expected: Vec<String> = ids
        .iter()
        .map(|id| format!("  reader: held by {id}, write epoch {last_writer}, "))
        .collect();
    expected.sort_unstable();
    assert_eq!(shown.len(), 2, "{text}");
    for (line, prefix) in shown.iter().zip(&expected) {
        assert!(line.starts_with(prefix.as_str()), "{text}");
        assert!(line.ends_with(" ms left"), "{text}");
    }
    let (code, stdout, stderr) = output(&mut on(&server, &["status", "cfg", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let object = json(&stdout);
    assert_eq!(
        fields(&object),
        [
            "backend",
            "fence",
            "held",
            "holder",
            "key",
            "kind",
            "last_fence",
            "name",
            "readers",
            "ttl_ms",
            "waiters",
            "writer"
        ],
        "{object}"
    );
    assert_eq!(object["kind"], "rwlock");
    assert_eq!(object["key"], "lock:{cfg}");
    assert_eq!(object["held"], true);
    assert_eq!(object["holder"], Value::Null);
    assert_eq!(object["writer"], Value::Null);
    assert_eq!(object["last_fence"], last_writer);
    assert_eq!(object["waiters"], 0);
    let readers = object["readers"].as_array().expect("readers");
    let mut holders: Vec<&str> = readers
        .iter()
        .map(|r| r["holder"].as_str().expect("holder"))
        .collect();
    holders.sort_unstable();
    let mut want = ids.iter().map(String::as_str).collect::<Vec<_>>();
    want.sort_unstable();
    assert_eq!(holders, want, "{object}");
    for r in readers {
        assert_eq!(fields(r), ["fence", "holder", "ttl_ms"], "{object}");
        assert_eq!(r["fence"], last_writer, "{object}");
        let ttl = r["ttl_ms"].as_u64().expect("ttl_ms");
        assert!(ttl > 0 && ttl <= 10_000, "{object}");
    }

    // top: one row per reader, SLOT `read`; one JSON object for the name.
    let (code, text, stderr) = output(&mut on(&server, &["top", "--once"]));
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("1 lock matching *"), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    for line in &lines[2..] {
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(columns[..2], ["cfg", "read"], "{text}");
        assert!(ids.iter().any(|id| id == columns[2]), "{text}");
        assert_eq!(columns[3], last_writer.to_string(), "{text}");
    }
    let (code, stdout, stderr) = output(&mut on(&server, &["top", "--once", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let rows = json(&stdout);
    let rows = rows.as_array().expect("array");
    assert_eq!(rows.len(), 1, "{stdout}");
    assert_eq!(rows[0]["kind"], "rwlock");
    assert_eq!(rows[0]["name"], "cfg");
    assert_eq!(rows[0]["fence"], Value::Null);
    assert_eq!(rows[0]["writer"], Value::Null);
    assert_eq!(rows[0]["readers"].as_array().map(Vec::len), Some(2));

    finish(&mut a);
    finish(&mut b);
    assert!(!exists(&server, "lock:{cfg}"), "both readers released");
}

/// Fair order, observed through the wait queue, with no sleep: while a
/// reader holds, a writer queues; a reader that comes after the writer
/// queues behind it (it is not let in beside the first reader). When the
/// first reader is done the writer holds alone, with FENCELOCK_ACCESS=write
/// and a fence above the reader's epoch, shown by `status` as the writer; a
/// reader with `--no-wait` is refused while it holds. The queued reader gets
/// in only after the writer is done, with the writer's fence as its epoch,
/// and validates the writer's value as clean.
#[test]
fn rwlock_writer_holds_alone_in_fair_order() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let fair = ["--wait-mode", "fair", "--wait", "20s"];
    let mut reader = holder(
        &server,
        dir.path(),
        "r1",
        &[&["--read"], &fair[..]].concat(),
        "",
    );
    let first = wait_started("the first reader", &reader.started);

    let wrote = dir.path().join("wrote");
    let write = format!(
        "\"$FENCELOCK_BIN\" write config by-writer > {}; ",
        wrote.display()
    );
    let mut writer = holder(
        &server,
        dir.path(),
        "w",
        &[&["--write"], &fair[..]].concat(),
        &write,
    );
    wait_for("the writer to queue", Duration::from_secs(10), || {
        server.query::<i64>(&["ZCARD", "lock:{cfg}:queue"]) == 1
    });
    let validated = dir.path().join("validated");
    let validate = format!(
        "\"$FENCELOCK_BIN\" read --validate config > {}; ",
        validated.display()
    );
    let mut late = holder(
        &server,
        dir.path(),
        "r2",
        &[&["--read"], &fair[..]].concat(),
        &validate,
    );
    wait_for(
        "the later reader to queue behind the writer",
        Duration::from_secs(10),
        || server.query::<i64>(&["ZCARD", "lock:{cfg}:queue"]) == 2,
    );
    assert!(
        started(&writer.started).is_none(),
        "no writer beside a reader"
    );
    assert!(
        started(&late.started).is_none(),
        "a reader behind a queued writer waits (fair)"
    );
    let (_, stdout, _) = output(&mut on(&server, &["status", "cfg", "--json"]));
    let object = json(&stdout);
    assert_eq!(object["waiters"], 2, "{object}");
    assert_eq!(object["readers"].as_array().map(Vec::len), Some(1));

    finish(&mut reader);
    let written = wait_started("the writer", &writer.started);
    assert_eq!(written.access, "write");
    assert_eq!(written.slot, "unset");
    assert!(written.fence > first.fence, "{written:?} {first:?}");
    assert_eq!(
        read_file(&wrote),
        format!("config: accepted (fence {})\n", written.fence)
    );
    let (code, text, stderr) = output(&mut on(&server, &["status", "cfg"]));
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "cfg: read-write lock, held by the writer, last fence {}, 1 waiter",
            written.fence
        ),
        "{text}"
    );
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[1].starts_with(&format!(
            "  writer: held by {}, fence {}, ",
            fencelock::holder_id(&written.token),
            written.fence
        )),
        "{text}"
    );
    let (_, stdout, _) = output(&mut on(&server, &["status", "cfg", "--json"]));
    let object = json(&stdout);
    assert_eq!(object["kind"], "rwlock");
    assert_eq!(object["writer"]["fence"], written.fence, "{object}");
    assert_eq!(
        object["writer"]["holder"],
        fencelock::holder_id(&written.token),
        "{object}"
    );
    assert_eq!(object["readers"], serde_json::json!([]), "{object}");
    let (_, stdout, _) = output(&mut on(&server, &["top", "--once", "--json"]));
    assert_eq!(json(&stdout)[0]["writer"]["fence"], written.fence);
    let (_, text, _) = output(&mut on(&server, &["top", "--once"]));
    let row: Vec<&str> = text
        .lines()
        .nth(2)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..2], ["cfg", "write"], "{text}");

    let marker = dir.path().join("reader-ran");
    let (code, _, stderr) = output(&mut on(
        &server,
        &[
            "run",
            "--read",
            "--no-wait",
            "cfg",
            "-c",
            &format!("touch {}", marker.display()),
        ],
    ));
    assert_eq!(code, Some(75), "{stderr}");
    assert!(!marker.exists(), "no reader runs beside the writer");
    assert!(started(&late.started).is_none(), "the writer holds alone");

    finish(&mut writer);
    let after = wait_started("the later reader", &late.started);
    assert_eq!(after.access, "read");
    assert_eq!(
        after.fence, written.fence,
        "the epoch is the writer's fence"
    );
    assert!(
        read_file(&validated).starts_with("config: \"by-writer\" (fence "),
        "{}",
        read_file(&validated)
    );
    finish(&mut late);
}

/// `read --validate` with a reader's epoch: clean while no later writer
/// wrote, torn (75, one line on stderr, `clean` false and the later
/// writer's `fence` in --json) once one did. A plain `read` shows the same
/// value with no warning (the negative control), and the later writer's own
/// fence reads clean.
#[test]
fn read_validate_is_clean_then_torn_after_a_newer_writer_wrote() {
    let server = RedisServer::start();
    let first = write_config(&server, "v1");
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &[
            "run",
            "--read",
            "cfg",
            "-c",
            "echo \"$FENCELOCK_FENCE\"; \"$FENCELOCK_BIN\" read --validate config",
        ],
    ));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_eq!(stderr, "", "a clean read warns of nothing");
    let mut lines = stdout.lines();
    let epoch: u64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("the epoch");
    assert_eq!(epoch, first);
    let clean_line = lines.next().unwrap_or_default().to_owned();
    assert!(
        clean_line.starts_with(&format!("config: \"v1\" (fence {first}, holder ")),
        "{stdout}"
    );

    let second = write_config(&server, "v2");
    assert!(second > epoch);
    let epoch_arg = epoch.to_string();
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &["read", "--validate", "config", "--fence", &epoch_arg],
    ));
    assert_eq!(code, Some(75), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!("config: \"v2\" (fence {second}, holder ")),
        "{stdout}"
    );
    assert!(
        stderr.starts_with("fencelock: config: TORN read"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "stores fence {second}, greater than the reader's write epoch {epoch}"
        )),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    let torn_line = stdout.clone();

    let (code, stdout, stderr) = output(&mut on(
        &server,
        &[
            "read",
            "--validate",
            "config",
            "--fence",
            &epoch_arg,
            "--json",
        ],
    ));
    assert_eq!(code, Some(75), "{stderr}");
    let object = json(&stdout);
    assert_eq!(object["clean"], false, "{object}");
    assert_eq!(object["fence"], second, "the later writer's fence");
    assert_eq!(object["epoch"], epoch);
    assert_eq!(object["value"], "v2");

    // The negative control: a plain read shows the same, exits 0, warns of
    // nothing.
    let (code, stdout, stderr) = output(&mut on(&server, &["read", "config"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, torn_line);
    assert_eq!(stderr, "");
    let (code, stdout, _) = output(&mut on(&server, &["read", "config", "--json"]));
    assert_eq!(code, Some(0));
    let object = json(&stdout);
    assert_eq!(object.get("clean"), None, "{object}");
    // The later writer's own fence as the epoch: clean.
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &[
            "read",
            "--validate",
            "config",
            "--fence",
            &second.to_string(),
            "--json",
        ],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(json(&stdout)["clean"], true);
    // A resource never written: clean, absent.
    let (code, stdout, _) = output(&mut on(
        &server,
        &["read", "--validate", "nothing", "--fence", &epoch_arg],
    ));
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "nothing: absent\n");
}

/// A reader that lost its lease while its command ran (its field deleted:
/// a lapse) reads what a writer granted after it wrote: `read --validate`
/// inside its command exits 75, and `run` exits 76 (lost).
#[test]
fn rwlock_reader_that_lost_its_lease_reads_torn() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&server, "v1");
    let epoch_file = dir.path().join("epoch");
    let go = dir.path().join("go");
    let code_file = dir.path().join("code");
    let script = format!(
        "trap '' TERM; echo \"$FENCELOCK_FENCE\" > {epoch}.tmp && mv {epoch}.tmp {epoch}; \
         while [ ! -f {go} ]; do sleep 0.02; done; \
         \"$FENCELOCK_BIN\" read --validate config; echo $? > {code}",
        epoch = epoch_file.display(),
        go = go.display(),
        code = code_file.display(),
    );
    let mut reader = spawn(on(
        &server,
        &[
            "run",
            "--read",
            "--ttl",
            "1s",
            "--kill-grace",
            "30s",
            "cfg",
            "-c",
            &script,
        ],
    ));
    let epoch: u64 = poll("the reader's epoch", Duration::from_secs(10), || {
        read_file(&epoch_file).trim().parse().ok()
    });
    server.cmd(&["DEL", "lock:{cfg}"]);
    let later = write_config(&server, "v2");
    assert!(later > epoch);
    std::fs::write(&go, "").expect("touch go");
    let status = reader
        .wait_timeout(Duration::from_secs(20))
        .expect("the reader's run ends");
    let stderr = stderr_of(&mut reader);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert_eq!(read_file(&code_file).trim(), "75", "{stderr}");
    assert!(stderr.contains("TORN read"), "{stderr}");
    assert!(stderr.contains("(reader, write epoch "), "{stderr}");
}

/// Inside `run --read`, `write`, `update` and `read --register` refuse to
/// write with the reader's epoch (64, one line saying nothing was changed,
/// `update`'s command not run), also with the epoch given as --fence.
/// Another fence given explicitly is left to the resource (a stale one is
/// refused there: 3). Under `run --write` the same write is accepted, and a
/// lock's and a semaphore's commands never see an inherited
/// FENCELOCK_ACCESS, so their writes are accepted too.
#[test]
fn rwlock_writes_with_a_readers_epoch_are_refused() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("update-ran");
    let update = format!("touch {}; echo new", marker.display());
    let commands: [(&str, Vec<&str>); 4] = [
        ("write", vec![BIN, "write", "config", "x"]),
        (
            "update",
            vec![BIN, "update", "config", "--", "sh", "-c", &update],
        ),
        ("read --register", vec![BIN, "read", "--register", "config"]),
        (
            "write",
            vec![
                "sh",
                "-c",
                "\"$FENCELOCK_BIN\" write config x --fence \"$FENCELOCK_FENCE\"",
            ],
        ),
    ];
    for (what, command) in &commands {
        let mut args = vec!["run", "--read", "cfg", "--"];
        args.extend(command);
        let (code, stdout, stderr) = output(&mut on(&server, &args));
        assert_eq!(code, Some(64), "{command:?}: {stdout}{stderr}");
        assert!(
            stderr.starts_with(&format!("fencelock: {what} refused: fence ")),
            "{stderr}"
        );
        assert!(
            stderr.contains("is a reader's write epoch (FENCELOCK_ACCESS=read"),
            "{stderr}"
        );
        assert!(stderr.contains("not a write fence"), "{stderr}");
        assert!(stderr.contains("nothing was changed"), "{stderr}");
        assert!(stderr.contains("fencelock run --write"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
    assert!(!exists(&server, "config"), "nothing was written");
    assert!(!marker.exists(), "update's command never ran");

    // Another fence, given explicitly: the resource decides.
    let fence = write_config(&server, "v1");
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &[
            "run", "--read", "cfg", "--", BIN, "write", "config", "old", "--fence", "1",
        ],
    ));
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(stdout.contains("REJECTED as stale"), "{stdout}");

    // The negative control: the same writes under `run --write`.
    for (_, command) in &commands {
        let mut args = vec!["run", "--write", "cfg", "--"];
        args.extend(command);
        let (code, stdout, stderr) = output(&mut on(&server, &args));
        assert_eq!(code, Some(0), "{command:?}: {stdout}{stderr}");
    }
    assert!(marker.exists(), "update's command ran under a writer");
    let (_, stdout, _) = output(&mut on(&server, &["read", "config", "--json"]));
    assert!(json(&stdout)["fence"].as_u64() > Some(fence));

    // An inherited FENCELOCK_ACCESS=read never reaches a lock's or a
    // permit's command, whose writes are accepted.
    let script = "echo \"${FENCELOCK_ACCESS-unset}\"; \"$FENCELOCK_BIN\" write config y";
    for flags in [&["job"][..], &["--permits", "2", "pool"]] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend(["-c", script]);
        let mut cmd = on(&server, &args);
        cmd.env("FENCELOCK_ACCESS", "read");
        let (code, stdout, stderr) = output(&mut cmd);
        assert_eq!(code, Some(0), "{flags:?}: {stdout}{stderr}");
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some("unset"), "{flags:?}: {stdout}");
        assert!(
            lines
                .next()
                .unwrap_or_default()
                .contains(": accepted (fence "),
            "{stdout}"
        );
    }
}

/// A name is one kind while it has holders: `run --read` and `run --write`
/// on a held lock or semaphore, and `run` or `run --permits` on a held
/// read-write lock, each exit 78 at once with the library's message, their
/// command never run; the holders keep what they hold.
#[test]
fn rwlock_kind_conflicts_exit_78() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let hold = |id: &str, args: &[&str]| {
        let started = dir.path().join(format!("started-{id}"));
        let go = dir.path().join(format!("go-{id}"));
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let script = hold_until("", &started, &go);
        all.extend(["-c", &script]);
        let child = spawn(on(&server, &all));
        Holder { child, started, go }
    };
    let mut lock = hold("lock", &["job"]);
    let mut permit = hold("permit", &["--permits", "2", "pool"]);
    let mut reader = hold("reader", &["--read", "cfg"]);
    for h in [&lock, &permit, &reader] {
        wait_started("a holder", &h.started);
    }

    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let cases: [(&[&str], &str); 6] = [
        (
            &["run", "--read", "job"],
            "lock \"job\" is held as a mutex, but was asked for as a read-write lock",
        ),
        (
            &["run", "--write", "job"],
            "lock \"job\" is held as a mutex, but was asked for as a read-write lock",
        ),
        (
            &["run", "--read", "pool"],
            "lock \"pool\" is held as a semaphore, but was asked for as a read-write lock",
        ),
        (
            &["run", "--write", "pool"],
            "lock \"pool\" is held as a semaphore, but was asked for as a read-write lock",
        ),
        (
            &["run", "cfg"],
            "lock \"cfg\" is held as a read-write lock, but was asked for as a mutex",
        ),
        (
            &["run", "--permits", "2", "cfg"],
            "lock \"cfg\" is held as a read-write lock, but was asked for as a semaphore",
        ),
    ];
    for (args, message) in cases {
        let mut all = args.to_vec();
        all.extend(["-c", &touch]);
        let started = std::time::Instant::now();
        let (code, _, stderr) = output(&mut on(&server, &all));
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(stderr.starts_with("fencelock: "), "{stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(stderr.contains("nothing was changed"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "refused at once, not after --wait"
        );
    }
    assert!(!marker.exists(), "no conflicting command ran");
    let (_, text, _) = output(&mut on(&server, &["status", "cfg"]));
    assert!(
        text.starts_with("cfg: read-write lock, held by 1 reader"),
        "{text}"
    );
    let (_, text, _) = output(&mut on(&server, &["status", "job"]));
    assert!(text.starts_with("job: held by "), "{text}");
    for h in [&mut lock, &mut permit, &mut reader] {
        finish(h);
    }
}

/// Bad combinations are usage errors (64, one line naming the flags),
/// before any connection: `--read` with `--write` or `--permits`, `--write`
/// with `--permits`, either with the guide layout; `read --validate`
/// without an epoch (naming --fence and FENCELOCK_FENCE), with
/// `--register`, or with an epoch that is no number.
#[test]
fn rwlock_bad_flag_combinations_are_usage_errors() {
    let unreachable = RedisServer::client_url_unreachable();
    let cases: [(&[&str], &str, &str); 8] = [
        (
            &["run", "--read", "--write", "cfg", "--", "true"],
            "the argument '--read' cannot be used with '--write'",
            "fencelock run",
        ),
        (
            &["run", "--read", "--permits", "2", "cfg", "--", "true"],
            "the argument '--read' cannot be used with '--permits <N>'",
            "fencelock run",
        ),
        (
            &["run", "--write", "--permits", "2", "cfg", "--", "true"],
            "the argument '--write' cannot be used with '--permits <N>'",
            "fencelock run",
        ),
        (
            &["--layout", "guide", "run", "--read", "cfg", "--", "true"],
            "--read cannot be used with --layout guide",
            "",
        ),
        (
            &["--layout", "guide", "run", "--write", "cfg", "--", "true"],
            "--write cannot be used with --layout guide",
            "",
        ),
        (
            &["read", "--validate", "config"],
            "read --validate needs the reader's write epoch: --fence N (inside `fencelock run --read`, FENCELOCK_FENCE is set)",
            "",
        ),
        (
            &["read", "--validate", "--register", "config", "--fence", "1"],
            "the argument '--validate' cannot be used with '--register'",
            "fencelock read",
        ),
        (
            &["read", "--validate", "config", "--fence", "x"],
            "invalid value 'x' for '--fence <N>'",
            "fencelock read",
        ),
    ];
    for (args, message, help) in cases {
        let mut all = vec!["--redis", &unreachable];
        all.extend_from_slice(args);
        let (code, _, stderr) = output(&mut fencelock(&all));
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("fencelock: "), "{stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        if !help.is_empty() {
            assert!(stderr.contains(&format!("(see {help} --help)")), "{stderr}");
        }
    }
    // An empty FENCELOCK_FENCE is no epoch either.
    let (code, _, stderr) = output(
        fencelock(&["--redis", &unreachable, "read", "--validate", "config"])
            .env("FENCELOCK_FENCE", ""),
    );
    assert_eq!(code, Some(64), "{stderr}");
}

/// Every example that `--help` pages show for read-write locks (a line
/// that starts with `fencelock run` and names `--read` or `--write`) runs as
/// written (the `fencelock` under test first on `PATH`, `FENCELOCK_URL`
/// naming a private redis-server), writers first, and does what the help
/// says.
#[test]
fn rwlock_examples_of_the_help_pages_run_as_written() {
    let mut examples: Vec<String> = Vec::new();
    for page in [&[][..], &["run"], &["read"], &["write"], &["status"]] {
        let mut args = page.to_vec();
        args.push("--help");
        let (code, help, stderr) = output(&mut fencelock(&args));
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        for line in help.lines().map(str::trim) {
            if line.starts_with("fencelock run ")
                && (line.contains(" --read ") || line.contains(" --write "))
                && !examples.iter().any(|e| e == line)
            {
                examples.push(line.to_string());
            }
        }
    }
    examples.sort_by_key(|e| !e.contains(" --write "));
    assert!(examples.len() >= 2, "{examples:?}");
    let server = RedisServer::start();
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut written = None;
    for example in &examples {
        let mut sh = Command::new("sh");
        sh.arg("-ec")
            .arg(example)
            .env("PATH", &path)
            .env("FENCELOCK_URL", server.url());
        for var in [
            "FENCELOCK_REDIS_URL",
            "FENCELOCK_ACCESS",
            "FENCELOCK_SLOT",
            "FENCELOCK_FENCE",
            "FENCELOCK_TOKEN",
        ] {
            sh.env_remove(var);
        }
        let (code, stdout, stderr) = output(&mut sh);
        assert_eq!(code, Some(0), "{example}: {stdout}{stderr}");
        if example == "fencelock run --write config -- fencelock write config:data v2" {
            let fence = stdout
                .trim_end()
                .strip_prefix("config:data: accepted (fence ")
                .and_then(|rest| rest.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{example}: {stdout}"));
            written = Some(fence.to_string());
        } else if example == "fencelock run --read config -- fencelock read --validate config:data"
        {
            let fence = written.as_deref().expect("the writer's example ran first");
            assert!(
                stdout.starts_with(&format!("config:data: \"v2\" (fence {fence}, holder ")),
                "{example}: {stdout}"
            );
            assert_eq!(stderr, "", "{example}");
        } else {
            panic!("an example this test does not check: {example}");
        }
    }
}

/// On etcd, `read --validate` checks a fenced etcd key: clean with the
/// epoch of its writer, torn (75) once a later lock holder wrote; a plain
/// `read` shows the same value with no warning.
#[test]
fn etcd_read_validate_of_a_fenced_key() {
    let cluster = EtcdCluster::single();
    let at = |args: &[&str]| {
        let mut cmd = fencelock(&["--url", &cluster.url()]);
        cmd.args(args);
        cmd
    };
    let write = |value: &str| {
        let (code, stdout, stderr) = output(&mut at(&[
            "run", "job", "--", BIN, "write", "doc", value, "--json",
        ]));
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        json(&stdout)["fence"].as_u64().expect("fence")
    };
    let first = write("v1");
    let epoch = first.to_string();
    let (code, stdout, stderr) = output(&mut at(&[
        "read",
        "--validate",
        "doc",
        "--fence",
        &epoch,
        "--json",
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let object = json(&stdout);
    assert_eq!(object["clean"], true, "{object}");
    assert_eq!(object["value"], "v1");

    let second = write("v2");
    assert!(second > first);
    let (code, stdout, stderr) = output(&mut at(&[
        "read",
        "--validate",
        "doc",
        "--fence",
        &epoch,
        "--json",
    ]));
    assert_eq!(code, Some(75), "{stdout}{stderr}");
    let object = json(&stdout);
    assert_eq!(object["clean"], false, "{object}");
    assert_eq!(object["fence"], second, "{object}");
    assert_eq!(object["value"], "v2");
    assert!(stderr.contains("doc: TORN read"), "{stderr}");
    let (code, stdout, stderr) = output(&mut at(&["read", "doc", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stderr, "");
    assert_eq!(json(&stdout)["value"], "v2");
}

/// `run --read` and `--write` on etcd: two readers hold at once (each with
/// FENCELOCK_ACCESS=read and an epoch at least the last writer's fence,
/// its validated read clean, a write with its epoch refused), `status`
/// shows them as a read-write lock, a writer with `--no-wait` is refused
/// while they hold; once a later writer wrote, a read validated against a
/// reader's epoch is torn (75). A held lock refuses `run --read` (78).
#[test]
fn etcd_rwlock_readers_share_and_a_later_writer_tears_their_reads() {
    let cluster = EtcdCluster::single();
    let dir = tempfile::tempdir().expect("tempdir");
    let at = |args: &[&str]| {
        let mut cmd = fencelock(&["--url", &cluster.url()]);
        cmd.args(args);
        cmd
    };
    let write = |value: &str| {
        let (code, stdout, stderr) = output(&mut at(&[
            "run", "--write", "cfg", "--", BIN, "write", "doc", value, "--json",
        ]));
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        json(&stdout)["fence"].as_u64().expect("fence")
    };
    let first = write("v1");
    let reader = |id: &str| {
        let started = dir.path().join(format!("started-{id}"));
        let go = dir.path().join(format!("go-{id}"));
        let before = format!(
            "\"$FENCELOCK_BIN\" read --validate doc --json > {validated}; \
             \"$FENCELOCK_BIN\" write doc x 2> {refused}; echo $? >> {refused}; ",
            validated = dir.path().join(format!("validated-{id}")).display(),
            refused = dir.path().join(format!("refused-{id}")).display(),
        );
        let script = hold_until(&before, &started, &go);
        let child = spawn(at(&["run", "--read", "cfg", "-c", &script]));
        Holder { child, started, go }
    };
    let mut a = reader("a");
    let one = wait_started("the first reader", &a.started);
    let mut b = reader("b");
    let two = wait_started("the second reader", &b.started);
    for (id, s) in [("a", &one), ("b", &two)] {
        assert_eq!((s.access.as_str(), s.slot.as_str()), ("read", "unset"));
        assert!(s.fence >= first, "{s:?} {first}");
        let validated = json(&read_file(&dir.path().join(format!("validated-{id}"))));
        assert_eq!(validated["clean"], true, "{validated}");
        assert_eq!(validated["value"], "v1", "{validated}");
        let refused = read_file(&dir.path().join(format!("refused-{id}")));
        assert!(
            refused.contains("is a reader's write epoch") && refused.ends_with("\n64\n"),
            "{refused}"
        );
    }
    let (code, stdout, stderr) = output(&mut at(&["status", "cfg", "--json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let object = json(&stdout);
    assert_eq!(object["kind"], "rwlock", "{object}");
    assert_eq!(object["backend"], "etcd", "{object}");
    assert_eq!(object["writer"], Value::Null, "{object}");
    assert_eq!(
        object["readers"].as_array().map(Vec::len),
        Some(2),
        "{object}"
    );
    let (code, _, stderr) = output(&mut at(&[
        "run",
        "--write",
        "--no-wait",
        "cfg",
        "--",
        "true",
    ]));
    assert_eq!(code, Some(75), "{stderr}");
    let (code, _, stderr) = output(&mut at(&["run", "--no-wait", "cfg", "--", "true"]));
    assert_eq!(code, Some(78), "a lock on a read-write lock: {stderr}");
    finish(&mut a);
    finish(&mut b);

    let later = write("v2");
    assert!(later > one.fence && later > two.fence);
    let epoch = one.fence.to_string();
    let (code, stdout, stderr) = output(&mut at(&[
        "read",
        "--validate",
        "doc",
        "--fence",
        &epoch,
        "--json",
    ]));
    assert_eq!(code, Some(75), "{stdout}{stderr}");
    let object = json(&stdout);
    assert_eq!(object["clean"], false, "{object}");
    assert_eq!(object["fence"], later, "{object}");
    assert_eq!(object["value"], "v2", "{object}");
}
