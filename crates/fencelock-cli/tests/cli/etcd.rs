//! The command line on etcd: `run`, `status`, `top`, fenced writes,
//! `doctor` and `bench` against real etcd members. Every test name contains
//! `etcd` (nextest runs them one at a time).

use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock_testkit::{EtcdCluster, GuardedChild, spawn_guarded};
use serde_json::Value;

use crate::support::{fencelock, output, poll};

/// `fencelock --url URL ARGS`.
fn at(cluster: &EtcdCluster, args: &[&str]) -> Command {
    let mut cmd = fencelock(&["--url", &cluster.url()]);
    cmd.args(args);
    cmd
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

fn spawn(mut cmd: Command) -> GuardedChild {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    spawn_guarded(cmd)
}

/// `run` on etcd gives the command the lock's environment (the etcd key,
/// the fence, the URL under both names); inside it, `status` shows the
/// holder id (never the token), the fence, the ttl left, and `write` and
/// `read` use a fenced etcd key. While a holder runs, `run --no-wait` exits
/// 75, and `status` and `top` count the waiter a further `run` queues as.
#[test]
fn etcd_run_status_top_and_fenced_writes() {
    let cluster = EtcdCluster::single();
    let script = r#"
        set -e
        echo "key=$FENCELOCK_KEY fence=$FENCELOCK_FENCE url=$FENCELOCK_URL old=$FENCELOCK_REDIS_URL token=$FENCELOCK_TOKEN"
        "$FENCELOCK_BIN" status job --json
        "$FENCELOCK_BIN" write doc closed
        "$FENCELOCK_BIN" read doc --json
    "#;
    let (code, out, err) = output(&mut at(&cluster, &["run", "job", "-c", script]));
    assert_eq!(code, Some(0), "{out}{err}");
    let mut lines = out.lines();
    let env = lines.next().unwrap_or_default();
    let field = |name: &str| {
        env.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(field("key").starts_with("lock:job/"), "{env}");
    assert_eq!(field("url"), cluster.url());
    assert_eq!(field("old"), cluster.url());
    let fence: u64 = field("fence").parse().expect("a fence");
    assert!(fence > fencelock::FENCE_EPOCH_SIZE, "epoch 1: {fence}");
    let token = field("token");

    let status = json(lines.next().unwrap_or_default());
    assert_eq!(status["held"], true);
    assert_eq!(status["backend"], "etcd");
    assert_eq!(status["fence"], fence);
    assert_eq!(status["holder"], fencelock::holder_id(&token));
    assert_ne!(status["holder"], token.as_str());
    assert!(
        status["ttl_ms"].as_u64().is_some_and(|t| t <= 10_000),
        "{status}"
    );
    assert_eq!(status["waiters"], 0);
    assert!(
        lines.next().unwrap_or_default().contains("accepted"),
        "{out}"
    );
    let read = json(lines.next().unwrap_or_default());
    assert_eq!(read["value"], "closed");
    assert_eq!(read["fence"], fence);

    // A holder, a refused --no-wait, a queued waiter.
    let mut holder = spawn(at(&cluster, &["run", "job", "--", "sleep", "30"]));
    poll("the lock to be held", Duration::from_secs(10), || {
        let (_, out, _) = output(&mut at(&cluster, &["status", "job", "--json"]));
        (json(&out)["held"] == true).then_some(())
    });
    let (code, _, err) = output(&mut at(
        &cluster,
        &["run", "--no-wait", "job", "--", "true"],
    ));
    assert_eq!(code, Some(75), "{err}");
    let mut waiter = spawn(at(&cluster, &["run", "job", "--", "true"]));
    let status = poll("the waiter to queue", Duration::from_secs(10), || {
        let (_, out, _) = output(&mut at(&cluster, &["status", "job", "--json"]));
        let v = json(&out);
        (v["waiters"] == 1).then_some(v)
    });
    assert_eq!(status["held"], true);
    let (code, out, _) = output(&mut at(&cluster, &["top", "--once", "--json"]));
    assert_eq!(code, Some(0));
    let rows = json(&out);
    assert_eq!(rows[0]["name"], "job");
    assert_eq!(rows[0]["waiters"], 1);
    let (_, text, _) = output(&mut at(&cluster, &["status", "job"]));
    assert!(
        text.contains("held by") && text.contains("1 waiter"),
        "{text}"
    );
    holder.kill();
    waiter.kill();
}

/// `--redis` is an alias of `--url`, FENCELOCK_URL sets it, and the old
/// FENCELOCK_REDIS_URL is read when FENCELOCK_URL is unset.
#[test]
fn etcd_url_options_and_their_environment() {
    let cluster = EtcdCluster::single();
    let url = cluster.url();
    let status = |cmd: &mut Command| {
        let (code, out, err) = output(cmd);
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("job: free"), "{out}");
    };
    status(&mut fencelock(&["--redis", &url, "status", "job"]));
    status(fencelock(&["status", "job"]).env("FENCELOCK_URL", &url));
    status(fencelock(&["status", "job"]).env("FENCELOCK_REDIS_URL", &url));
    // --fence-epoch 0: the bare create revision.
    let (code, out, err) = output(&mut fencelock(&[
        "--url",
        &url,
        "--fence-epoch",
        "0",
        "run",
        "job",
        "-c",
        "echo $FENCELOCK_FENCE",
    ]));
    assert_eq!(code, Some(0), "{err}");
    let fence: u64 = out.trim().parse().expect("a fence");
    assert!(fence < fencelock::FENCE_EPOCH_SIZE, "{fence}");
    // FENCELOCK_URL wins over the old name.
    status(
        fencelock(&["status", "job"])
            .env("FENCELOCK_URL", &url)
            .env("FENCELOCK_REDIS_URL", "redis://127.0.0.1:1/"),
    );
}

/// `doctor` on three members: every row passes; with a member killed,
/// health warns (exit 1) and names it.
#[test]
fn etcd_doctor_checks_members_health_leader_version_and_size() {
    let mut cluster = EtcdCluster::start();
    let (code, out, err) = output(&mut at(&cluster, &["doctor", "--json"]));
    assert_eq!(code, Some(0), "{out}{err}");
    let report = json(&out);
    assert_eq!(report["backend"], "etcd");
    assert_eq!(report["fence_mode"], "revision");
    let names: Vec<&str> = report["checks"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        [
            "members", "health", "leader", "version", "db size", "lease", "rtt"
        ]
    );
    let found = |name: &str| {
        report["checks"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == name))
            .map(|c| c["found"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    assert!(found("members").starts_with("3 member(s)"), "{out}");
    assert!(found("version").contains("3.4"), "{out}");
    assert!(found("leader").contains("leads"), "{out}");

    // The leader dies: the audit waits out the election and warns about
    // the lost minority (it used to fail with "leader changed").
    let leader = cluster.leader();
    cluster.kill(leader);
    let (code, out, err) = output(&mut at(&cluster, &["doctor"]));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("WARN  health") && out.contains(&format!("m{leader}")),
        "{out}"
    );
}

/// `bench` on etcd measures every scenario, next to etcd's own rates, with
/// no overlap.
#[test]
fn etcd_bench_measures_every_scenario() {
    let cluster = EtcdCluster::single();
    let (code, out, err) = output(&mut at(
        &cluster,
        &[
            "bench",
            "--duration",
            "1s",
            "--workers",
            "3",
            "--tasks",
            "4",
            "--json",
        ],
    ));
    assert_eq!(code, Some(0), "{out}{err}");
    let lines: Vec<Value> = out.lines().map(json).collect();
    let scenarios: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["scenario"].as_str())
        .collect();
    assert_eq!(scenarios, ["uncontended", "contended", "many"]);
    for line in &lines {
        assert_eq!(line["backend"], "etcd");
        assert!(
            line["cycles_per_s"]
                .as_f64()
                .or(line["completions_per_s"].as_f64())
                > Some(0.0),
            "{line}"
        );
    }
    assert_eq!(lines[1]["overlaps"], 0);
    assert!(lines[0]["etcd_floor_cycles_per_s"].as_f64() > Some(0.0));
    assert!(lines[0]["etcd_lease_per_acquisition_cycles_per_s"].as_f64() > Some(0.0));
    let (code, _, err) = output(&mut at(&cluster, &["bench", "--plot", "x.svg"]));
    assert_eq!(code, Some(64), "{err}");
}

/// `bench` on an etcd that requires credentials measures with the URL's
/// (the library's client and the reference client alike), and shows no
/// password.
#[test]
fn etcd_bench_with_credentials_measures_and_hides_the_password() {
    let cluster = EtcdCluster::single();
    for args in [&["user", "add", "root:s3cret-pw"][..], &["auth", "enable"]] {
        cluster.etcdctl(args).expect("etcd auth set up");
    }
    let url = cluster
        .url()
        .replacen("etcd://", "etcd://root:s3cret-pw@", 1);
    let (code, out, err) = output(&mut fencelock(&[
        "--url",
        &url,
        "bench",
        "--scenario",
        "uncontended",
        "--duration",
        "1s",
        "--json",
    ]));
    assert_eq!(code, Some(0), "{out}{err}");
    let line = json(&out);
    assert!(
        line["etcd_floor_cycles_per_s"].as_f64() > Some(0.0),
        "{line}"
    );
    assert!(!format!("{out}{err}").contains("s3cret-pw"), "{out}{err}");
}
