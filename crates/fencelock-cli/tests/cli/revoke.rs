//! `fencelock revoke` end to end: a `run` whose command ignores SIGTERM is
//! revoked, and its write sent right after `revoke` returns is refused at
//! the sealed hash (negative control: without `--resource` the same write
//! is accepted); `run` exits 76. A free lock exits 75 and is sealed all
//! the same. The README's worker ACL rule cannot revoke (78, nothing
//! changed); with `+unlink` added it can. On etcd the same, with a fenced
//! etcd key.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock_testkit::acl::readme_acl_rule;
use fencelock_testkit::{EtcdCluster, GuardedChild, RedisServer, spawn_guarded};

use crate::support::{at, fencelock, on, output, wait_for};

/// A `run` of `invoice-42` (ttl 3 s: its loss is noticed at a renewal,
/// up to a second after the revoke) whose command ignores SIGTERM, says
/// when it started, waits for `go`, then writes `resource` with the
/// lock's fence and token and records the exit code of that write.
struct Holder {
    child: GuardedChild,
    started: PathBuf,
    go: PathBuf,
    rc: PathBuf,
    _dir: tempfile::TempDir,
}

impl Holder {
    fn start(mut run: Command, resource: &str) -> Holder {
        let dir = tempfile::tempdir().expect("tempdir");
        let (started, go, rc) = (
            dir.path().join("started"),
            dir.path().join("go"),
            dir.path().join("rc"),
        );
        let script = format!(
            "trap '' TERM; echo $$ > {started}; while [ ! -f {go} ]; do sleep 0.01; done; \
             \"$FENCELOCK_BIN\" write {resource} late; echo $? > {rc}",
            started = started.display(),
            go = go.display(),
            rc = rc.display(),
        );
        run.args([
            "run",
            "--ttl",
            "3s",
            "--kill-grace",
            "5s",
            "invoice-42",
            "-c",
            &script,
        ]);
        run.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let holder = Holder {
            child: spawn_guarded(run),
            started,
            go,
            rc,
            _dir: dir,
        };
        wait_for(
            "the holder's command to start",
            Duration::from_secs(10),
            || read(&holder.started).ends_with('\n'),
        );
        holder
    }

    /// Lets the command write; the write's exit code and `run`'s.
    fn write_now(mut self) -> (String, Option<i32>) {
        std::fs::write(&self.go, "").expect("touch go");
        wait_for("the late write", Duration::from_secs(10), || {
            read(&self.rc).ends_with('\n')
        });
        let status = self
            .child
            .wait_timeout(Duration::from_secs(20))
            .expect("run ends");
        (read(&self.rc).trim().to_owned(), status.code())
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim()).expect("one JSON object")
}

#[test]
fn a_revoked_holders_write_right_after_is_refused_and_run_exits_76() {
    let server = RedisServer::start();
    let holder = Holder::start(on(&server, &[]), "invoice:42");
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &["revoke", "invoice-42", "--resource", "invoice:42", "--json"],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    let report = json(&stdout);
    assert_eq!(report["revoked"], true, "{report}");
    assert!(report["deposed_holder"].is_string(), "{report}");
    let fence = report["fence"].as_u64().expect("fence");
    assert!(report["deposed_fence"].as_u64() < Some(fence), "{report}");
    assert_eq!(report["resources"][0]["sealed"], true, "{report}");
    // The deposed command writes at once: refused (3).
    let (write_rc, run_rc) = holder.write_now();
    assert_eq!(write_rc, "3", "the deposed holder's write must be refused");
    assert_eq!(run_rc, Some(76));
    let stored: Vec<Option<String>> =
        server.query(&["HMGET", "invoice:42", "value", "fence", "holder"]);
    assert_eq!(
        stored,
        vec![None, Some(fence.to_string()), Some("revoked".to_string())]
    );
}

/// Negative control: the same revoke without `--resource` lets the deposed
/// command's write through (the resource knows nothing of the revoke).
#[test]
fn without_a_resource_the_deposed_holders_write_is_accepted() {
    let server = RedisServer::start();
    let holder = Holder::start(on(&server, &[]), "invoice:42");
    let (code, stdout, stderr) = output(&mut on(&server, &["revoke", "invoice-42"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("no --resource given"), "{stdout}");
    let (write_rc, run_rc) = holder.write_now();
    assert_eq!(write_rc, "0", "unsealed, the late write lands");
    assert_eq!(run_rc, Some(76));
}

#[test]
fn revoking_a_free_lock_exits_75_and_seals_all_the_same() {
    let server = RedisServer::start();
    let (code, stdout, stderr) = output(&mut on(
        &server,
        &["revoke", "nightly", "--resource", "report:1"],
    ));
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stdout.contains("nothing to revoke"), "{stdout}");
    assert!(stdout.contains("report:1: sealed at fence"), "{stdout}");
    let holder: Option<String> = server.query(&["HGET", "report:1", "holder"]);
    assert_eq!(holder.as_deref(), Some("revoked"));
}

/// The README's worker rule cannot revoke (no `+unlink`): 78, naming the
/// permission, and the holder keeps its lock; the rule with `+unlink`
/// added (the documented admin rule) can.
#[test]
fn the_worker_acl_rule_cannot_revoke_and_the_admin_rule_can() {
    let server = RedisServer::start();
    let worker_rule = readme_acl_rule();
    assert!(
        !worker_rule.iter().any(|r| r == "+unlink"),
        "the worker rule must not allow UNLINK"
    );
    let rules: Vec<&str> = worker_rule.iter().map(String::as_str).collect();
    let worker = server.acl_user("worker", &rules);
    let mut admin_rules = rules.clone();
    admin_rules.push("+unlink");
    let admin = server.acl_user("admin", &admin_rules);

    let mut holder = {
        let mut cmd = at(&worker, &["run", "--ttl", "5s", "job", "--", "sleep", "30"]);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        spawn_guarded(cmd)
    };
    wait_for("the holder", Duration::from_secs(10), || {
        let held: Option<String> = server.query(&["GET", "lock:{job}"]);
        held.is_some()
    });
    let before: (Option<String>, Option<String>) = (
        server.query(&["GET", "lock:{job}"]),
        server.query(&["GET", "lock:{job}:fence"]),
    );
    let (code, _, stderr) = output(&mut at(&worker, &["revoke", "job"]));
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains("+unlink"), "{stderr}");
    let after: (Option<String>, Option<String>) = (
        server.query(&["GET", "lock:{job}"]),
        server.query(&["GET", "lock:{job}:fence"]),
    );
    assert_eq!(before, after, "a refused revoke changed the lock");

    let (code, stdout, stderr) = output(&mut at(&admin, &["revoke", "job"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("revoked from holder"), "{stdout}");
    let status = holder
        .wait_timeout(Duration::from_secs(20))
        .expect("the deposed run ends");
    assert_eq!(status.code(), Some(76));
}

#[test]
fn an_etcd_revoke_refuses_the_deposed_holders_write() {
    let cluster = EtcdCluster::single();
    let url = cluster.url();
    let holder = Holder::start(fencelock(&["--url", &url]), "invoices/42");
    let mut revoke = fencelock(&["--url", &url]);
    revoke.args([
        "revoke",
        "invoice-42",
        "--resource",
        "invoices/42",
        "--json",
    ]);
    let (code, stdout, stderr) = output(&mut revoke);
    assert_eq!(code, Some(0), "{stderr}");
    let report = json(&stdout);
    assert_eq!(report["backend"], "etcd", "{report}");
    assert_eq!(report["resources"][0]["sealed"], true, "{report}");
    assert!(
        report["deposed_fence"].as_u64() <= report["fence"].as_u64(),
        "{report}"
    );
    let (write_rc, run_rc) = holder.write_now();
    assert_eq!(write_rc, "3", "the deposed holder's write must be refused");
    assert_eq!(run_rc, Some(76));
    // Replicas are for Redis: refused on etcd as bad usage, nothing done.
    let mut replicas = fencelock(&["--url", &url]);
    replicas.args(["revoke", "other", "--replicas", "1"]);
    let (code, _, stderr) = output(&mut replicas);
    assert_eq!(code, Some(64), "{stderr}");
}
