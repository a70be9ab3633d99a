//! A `run` that waits on etcd and gives up — its `--wait` runs out, it is
//! interrupted (SIGINT), or it dies (SIGKILL) — leaves no key behind that
//! would hold the lock after the holder releases. Every test name contains
//! `etcd` (nextest runs them one at a time).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_testkit::{EtcdCluster, GuardedChild, spawn_guarded};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{fencelock, output, poll};

/// The waiters' ttl: far longer than any bound below, so a key left on a
/// lease of this ttl fails the test.
const TTL: &str = "30s";

/// `fencelock --url URL ARGS`.
fn at(cluster: &EtcdCluster, args: &[&str]) -> Command {
    let mut cmd = fencelock(&["--url", &cluster.url()]);
    cmd.args(args);
    cmd
}

fn spawn(mut cmd: Command) -> GuardedChild {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    spawn_guarded(cmd)
}

/// `status NAME --json`.
fn status(cluster: &EtcdCluster, name: &str) -> Value {
    let (code, out, err) = output(&mut at(cluster, &["status", name, "--json"]));
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

/// A `run` holding `name` (its command sleeps), once its command runs
/// (so a SIGTERM reaches the command); the directory holds its marker.
fn holder(cluster: &EtcdCluster, name: &str) -> (GuardedChild, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ready = dir.path().join("ready");
    let script = format!("touch {}; exec sleep 60", ready.display());
    let child = spawn(at(cluster, &["run", "--ttl", TTL, name, "-c", &script]));
    poll("the holder's command", Duration::from_secs(10), || {
        ready.exists().then_some(())
    });
    (child, dir)
}

/// A `run` waiting for `name` with `--wait WAIT`, once `status` counts it.
fn waiter(cluster: &EtcdCluster, name: &str, wait: &str) -> GuardedChild {
    let child = spawn(at(
        cluster,
        &["run", "--ttl", TTL, "--wait", wait, name, "--", "true"],
    ));
    poll("the waiter to queue", Duration::from_secs(10), || {
        (status(cluster, name)["waiters"] == 1).then_some(())
    });
    child
}

/// Stops the holder's `run` (SIGTERM, forwarded to its command, which ends:
/// `run` releases) and checks the lock is free at once: `status` says so
/// and `run --no-wait` gets it.
fn release_and_take(
    cluster: &EtcdCluster,
    name: &str,
    (mut holder, _dir): (GuardedChild, tempfile::TempDir),
) {
    holder.signal(Signal::SIGTERM);
    assert!(
        holder.wait_timeout(Duration::from_secs(10)).is_some(),
        "the holder's run did not end"
    );
    let free = status(cluster, name);
    assert_eq!(free["held"], false, "{free}");
    let (code, _, err) = output(&mut at(cluster, &["run", "--no-wait", name, "--", "true"]));
    assert_eq!(code, Some(0), "the lock was not free: {err}");
}

/// `--wait` runs out: `run` exits 75, and by then its key is gone (the
/// revocation is awaited before the process ends); the holder's release
/// frees the lock for the next `run --no-wait`.
#[test]
fn etcd_a_run_whose_wait_ran_out_leaves_no_waiter_key() {
    let cluster = EtcdCluster::single();
    let held = holder(&cluster, "job");
    let (code, _, err) = output(&mut at(
        &cluster,
        &["run", "--ttl", TTL, "--wait", "1s", "job", "--", "true"],
    ));
    assert_eq!(code, Some(75), "{err}");
    let now = status(&cluster, "job");
    assert_eq!(
        now["waiters"], 0,
        "the timed-out waiter's key is left: {now}"
    );
    release_and_take(&cluster, "job", held);
}

/// SIGINT to a waiting `run` (Ctrl-C without a terminal): it exits 130,
/// and its key is gone by then.
#[test]
fn etcd_an_interrupted_waiting_run_leaves_no_waiter_key() {
    let cluster = EtcdCluster::single();
    let held = holder(&cluster, "job");
    let mut waiting = waiter(&cluster, "job", "60s");
    waiting.signal(Signal::SIGINT);
    let exit = waiting
        .wait_timeout(Duration::from_secs(10))
        .expect("the interrupted run ends");
    assert_eq!(exit.code(), Some(130), "{exit:?}");
    let now = status(&cluster, "job");
    assert_eq!(
        now["waiters"], 0,
        "the interrupted waiter's key is left: {now}"
    );
    release_and_take(&cluster, "job", held);
}

/// SIGKILL to a waiting `run`: nothing of it runs any more, so its key
/// stays until its lease expires — the short waiter lease (2 s), not the
/// 30 s ttl. Within 5 s of the kill the queue is empty and the holder's
/// release frees the lock.
#[test]
fn etcd_a_killed_waiting_run_leaves_its_key_for_the_waiter_lease_only() {
    let cluster = EtcdCluster::single();
    let held = holder(&cluster, "job");
    let mut waiting = waiter(&cluster, "job", "60s");
    let killed = Instant::now();
    waiting.kill();
    poll(
        "the killed waiter's key to expire",
        Duration::from_secs(5),
        || (status(&cluster, "job")["waiters"] == 0).then_some(()),
    );
    let gone_after = killed.elapsed();
    assert!(gone_after < Duration::from_secs(5), "{gone_after:?}");
    release_and_take(&cluster, "job", held);
}
