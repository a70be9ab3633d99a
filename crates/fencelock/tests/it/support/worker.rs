//! A lock worker in its own process, driven line by line over stdin, so
//! tests can freeze a real holder with SIGSTOP (renewal task included): this
//! test binary re-run as the entry point [`worker_process_entry`], driven
//! through `fencelock_testkit::Worker`.
//!
//! Job (environment `FENCELOCK_TEST_WORKER`): `REDIS_URL [guide|default]
//! [clock|counter]`.
//!
//! Commands (one per line) and replies (one line each on stdout):
//! - `acquire NAME TTL_MS WAIT_MS renew|norenew [poll|notify|fair] [wlease=MS]`
//!   → `acquired FENCE TOKEN`, `contended` or `error MESSAGE`. The optional
//!   words set the wait mode and the waiter lease (in any order); without
//!   them the client's defaults apply.
//! - `write RESOURCE VALUE` (with the held fence and token) → `accepted` or
//!   `rejected CURRENT_FENCE`
//! - on etcd, `write-key RESOURCE VALUE` (a `FencedKey` written with the
//!   held fence and token) and `write-held RESOURCE VALUE` (the same, only
//!   while the lease holds its lock) → as `write`
//! - `lost` → `lost REASON` or `held REMAINING_MS`
//! - `wait-lost TIMEOUT_MS` → `lost REASON` or `held REMAINING_MS`
//! - `release` → `released` or `not-ours REASON`
//! - `quit`
//!
//! It prints `ready` once connected.

use std::io::{BufRead, Write};
use std::time::Duration;

use fencelock::{
    FenceMode, KeyLayout, Lease, LockClient, LockOptions, ReleaseOutcome, Renewal, WaitMode,
    WriteOutcome,
};
use fencelock_testkit::Worker;

/// The job of a worker process.
const WORKER_ENV: &str = "FENCELOCK_TEST_WORKER";

/// Starts a worker process on `url` with `args` (`[guide|default]
/// [clock|counter]`) and waits until it is connected.
pub(crate) fn start(url: &str, args: &[&str]) -> Worker {
    let mut job = vec![url];
    job.extend_from_slice(args);
    Worker::start(super::entry_command(
        module_path!(),
        "worker_process_entry",
        (WORKER_ENV, &job.join(" ")),
    ))
}

fn reply(line: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.as_ref());
    let _ = out.flush();
}

/// Entry point of a worker process (does nothing as an ordinary test).
#[test]
fn worker_process_entry() {
    let Ok(job) = std::env::var(WORKER_ENV) else {
        return;
    };
    let args: Vec<&str> = job.split(' ').collect();
    let url = args[0].to_owned();
    let layout = args
        .get(1)
        .and_then(|s| KeyLayout::parse(s))
        .unwrap_or_default();
    let mode = args
        .get(2)
        .and_then(|s| FenceMode::parse(s))
        .unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(serve(url, layout, mode));
}

async fn serve(url: String, layout: KeyLayout, mode: FenceMode) {
    let client = match LockClient::connect(&url).await {
        Ok(c) => c,
        Err(e) => {
            reply(format!("error {e}"));
            return;
        }
    };
    reply("ready");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lease: Option<Lease> = None;
    while let Some(line) = rx.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["acquire", name, ttl, wait, renew, extra @ ..] if extra.len() <= 2 => {
                let (Ok(ttl), Ok(wait)) = (ttl.parse::<u64>(), wait.parse::<u64>()) else {
                    reply("error bad numbers");
                    continue;
                };
                let mut opts = client
                    .options()
                    .ttl(Duration::from_millis(ttl))
                    .wait(Duration::from_millis(wait))
                    .layout(layout)
                    .fence_mode(mode)
                    .renewal(if *renew == "renew" {
                        Renewal::Auto
                    } else {
                        Renewal::Off
                    });
                match acquire_extras(opts, extra) {
                    Ok(o) => opts = o,
                    Err(message) => {
                        reply(format!("error {message}"));
                        continue;
                    }
                }
                match client.acquire(name, &opts).await {
                    Ok(l) => {
                        reply(format!("acquired {} {}", l.fence(), l.token()));
                        lease = Some(l);
                    }
                    Err(e) if e.is_contended() => reply("contended"),
                    Err(e) => reply(format!("error {e}")),
                }
            }
            ["write", resource, value] => {
                let Some(l) = &lease else {
                    reply("error no lease");
                    continue;
                };
                let outcome = match client.fenced_hash(resource) {
                    Ok(r) => r.write(l.fence(), l.token(), value).await,
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(WriteOutcome::Accepted) => reply("accepted"),
                    Ok(WriteOutcome::Rejected { current_fence, .. }) => reply(format!(
                        "rejected {}",
                        current_fence.map(|f| f.to_string()).unwrap_or_default()
                    )),
                    Ok(other) => reply(format!("error {other:?}")),
                    Err(e) => reply(format!("error {e}")),
                }
            }
            #[cfg(feature = "etcd")]
            [op @ ("write-key" | "write-held"), resource, value] => {
                let Some(l) = &lease else {
                    reply("error no lease");
                    continue;
                };
                let outcome = match client.fenced_key(resource) {
                    Ok(r) if *op == "write-held" => r.write_held(l, value).await,
                    Ok(r) => r.write(l.fence(), l.token(), value).await,
                    Err(e) => Err(e),
                };
                reply(outcome_line(outcome));
            }
            ["lost"] => reply(lost_line(lease.as_ref())),
            ["wait-lost", timeout] => {
                if let (Some(l), Ok(ms)) = (&lease, timeout.parse::<u64>()) {
                    let _ = tokio::time::timeout(Duration::from_millis(ms), l.lost()).await;
                }
                reply(lost_line(lease.as_ref()));
            }
            ["release"] => match lease.take() {
                Some(l) => match l.release().await {
                    Ok(ReleaseOutcome::Released) => reply("released"),
                    Ok(ReleaseOutcome::NotOurs(reason)) => reply(format!("not-ours {reason:?}")),
                    Ok(other) => reply(format!("error {other:?}")),
                    Err(e) => reply(format!("error {e}")),
                },
                None => reply("error no lease"),
            },
            ["quit"] => break,
            _ => reply(format!("error unknown command {line:?}")),
        }
    }
}

/// Applies the optional words of `acquire`: a wait mode and `wlease=MS`.
fn acquire_extras(mut opts: LockOptions, words: &[&str]) -> Result<LockOptions, String> {
    for word in words {
        if let Some(ms) = word.strip_prefix("wlease=") {
            let ms = ms
                .parse::<u64>()
                .map_err(|_| format!("bad waiter lease {word:?}"))?;
            opts = opts.waiter_lease(Duration::from_millis(ms));
        } else if let Some(wait_mode) = WaitMode::parse(word) {
            opts = opts.wait_mode(wait_mode);
        } else {
            return Err(format!("unknown acquire option {word:?}"));
        }
    }
    Ok(opts)
}

#[cfg(feature = "etcd")]
fn outcome_line(outcome: fencelock::Result<WriteOutcome>) -> String {
    match outcome {
        Ok(WriteOutcome::Accepted) => "accepted".into(),
        Ok(WriteOutcome::Rejected { current_fence, .. }) => format!(
            "rejected {}",
            current_fence.map(|f| f.to_string()).unwrap_or_default()
        ),
        Ok(other) => format!("error {other:?}"),
        Err(e) => format!("error {e}"),
    }
}

fn lost_line(lease: Option<&Lease>) -> String {
    match lease {
        Some(l) if l.is_lost() => format!("lost {:?}", l.loss_reason()),
        Some(l) => format!("held {}", l.remaining().as_millis()),
        None => "error no lease".into(),
    }
}
