//! `fencelock demo`: the guide's measured scenario on a real Redis.
//!
//! Worker A takes the lock, then its event loop stalls past the lease (a real
//! stall: A runs on its own single-threaded runtime and the thread sleeps, so
//! A's renewal cannot run either). Worker B takes over and writes with its
//! fence. A wakes up, learns the lease is gone, tries its stale write anyway
//! (as a worker that had not checked would) and is refused by the resource;
//! A's release finds the lock no longer its own and leaves B's lock intact.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fencelock::{FenceMode, LockClient, LockOptions, LockState, ReleaseOutcome, WriteOutcome};
use tokio::time::Instant;

use crate::arg_values::parse_duration;
use crate::exit;
use crate::global_options::GlobalOptions;
use crate::private_redis::PrivateRedis;

/// Reproduce the guide's scenario on a real Redis and print the timeline:
/// worker A stalls past its 300 ms lease, B takes over and writes, A's
/// stale write is refused and its release leaves B's lock alone.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct DemoArgs {
    /// Lease ttl of both workers.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// How long worker A stalls (must exceed the ttl to show the takeover).
    #[arg(long, default_value = "400ms", value_parser = parse_duration)]
    pub(crate) pause: Duration,
}

/// The rest of `fencelock demo --help`, after the options.
const HELP: &str = "\
Examples:
  fencelock demo
  fencelock demo --fence-mode clock
  fencelock --redis redis://127.0.0.1:7000 demo";

/// Prints timeline lines with milliseconds since the start.
#[derive(Debug)]
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        let ms = self.start.elapsed().as_secs_f64() * 1000.0;
        println!("{ms:>8.1}  {who:<3} {}", what.as_ref());
    }
}

/// What worker A saw, for the verdict.
#[derive(Debug)]
struct ASaw {
    fence: fencelock::Fence,
    write: WriteOutcome,
    release: ReleaseOutcome,
}

/// `fencelock demo`: exit 1 if the scenario did not go as the guide says.
pub(crate) async fn exec(global: &GlobalOptions, args: &DemoArgs) -> anyhow::Result<u8> {
    if crate::connect::is_etcd(global) {
        return Err(exit::fail(
            exit::USAGE,
            "demo reproduces the guide's scenario on Redis (a 300 ms lease; etcd's shortest is a second or more): leave out --url, or give a Redis URL",
        ));
    }
    if args.pause <= args.ttl {
        return Err(exit::fail(
            exit::USAGE,
            format!(
                "--pause ({:?}) must be longer than --ttl ({:?}) for the lease to run out",
                args.pause, args.ttl
            ),
        ));
    }
    let (url, private) =
        PrivateRedis::unless_given(crate::connect::given_url(global).as_deref()).await?;
    let outcome = scenario(global, args, &url, private.is_some()).await;
    if let Some(p) = private {
        p.stop().await;
    }
    outcome
}

async fn scenario(
    global: &GlobalOptions,
    args: &DemoArgs,
    url: &str,
    private: bool,
) -> anyhow::Result<u8> {
    let mode = global
        .fence_mode
        .map(Into::into)
        .unwrap_or(FenceMode::Counter);
    let client = LockClient::builder(url)
        .prefix(&global.prefix)
        .connect()
        .await?;
    // A fresh name per run, so counter-mode fences start at 1 as in the guide.
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let name = format!("demo:{run_id}:invoice-42");
    let resource_key = format!("demo:{run_id}:invoice-42:data");
    let opts = client
        .options()
        .ttl(args.ttl)
        .wait(Duration::from_secs(10))
        .layout(global.layout.into())
        .fence_mode(mode);

    println!(
        "fencelock demo: the guide's scenario on {}{}",
        client.url(),
        if private {
            " (a private redis-server, stopped afterwards)"
        } else {
            ""
        }
    );
    println!(
        "lock {name:?}, resource {resource_key:?}, ttl {:?}, A stalls {:?}, fence mode {}",
        args.ttl,
        args.pause,
        match mode {
            FenceMode::Counter => "counter",
            _ => "clock",
        }
    );
    println!();
    println!("    t(ms)  who event");

    let timeline = Arc::new(Timeline {
        start: Instant::now(),
    });
    let (a_holds_tx, a_holds_rx) = tokio::sync::oneshot::channel::<()>();
    let (b_wrote_tx, b_wrote_rx) = std::sync::mpsc::channel::<()>();

    let worker_a = {
        let (url, prefix, name, key, opts, tl, pause) = (
            url.to_string(),
            global.prefix.clone(),
            name.clone(),
            resource_key.clone(),
            opts.clone(),
            timeline.clone(),
            args.pause,
        );
        std::thread::spawn(move || -> anyhow::Result<ASaw> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(worker_a(
                url, prefix, name, key, opts, tl, pause, a_holds_tx, b_wrote_rx,
            ))
        })
    };

    a_holds_rx
        .await
        .context("worker A stopped before taking the lock")?;
    let waited_from = Instant::now();
    let lease_b = client.acquire(&name, &opts).await?;
    timeline.say(
        "B",
        format!(
            "acquired, fence {} (waited {} ms for A's lease to run out)",
            lease_b.fence(),
            waited_from.elapsed().as_millis()
        ),
    );
    let resource = client.fenced_hash(&resource_key)?;
    let b_write = resource
        .write(lease_b.fence(), lease_b.token(), "closed by B")
        .await?;
    timeline.say(
        "B",
        format!(
            "write \"closed by B\" with fence {} -> {}",
            lease_b.fence(),
            describe(&b_write)
        ),
    );
    let _ = b_wrote_tx.send(());

    let a = tokio::task::spawn_blocking(move || worker_a.join())
        .await?
        .map_err(|_| anyhow::anyhow!("worker A panicked"))??;

    let state = client.inspect(&name, global.layout.into()).await?;
    let b_still_holds =
        matches!(&state, LockState::Held { holder, .. } if *holder == lease_b.holder_id());
    timeline.say(
        "B",
        if b_still_holds {
            "still holds the lock after A's release".to_string()
        } else {
            format!("LOST the lock after A's release: {state:?}")
        },
    );
    let stored = resource.read().await?;
    let b_fence = lease_b.fence();
    let b_release = lease_b.release().await?;
    timeline.say("B", format!("release -> {}", describe_release(b_release)));

    println!();
    println!(
        "resource {resource_key:?}: value {:?}, fence {}",
        stored.value.as_deref().unwrap_or(""),
        stored
            .fence
            .map(|f| f.to_string())
            .unwrap_or_else(|| "none".into())
    );

    let mut failures = Vec::new();
    if !b_write.is_accepted() {
        failures.push("B's write was refused");
    }
    if a.write.is_accepted() {
        failures.push("A's stale write was accepted");
    }
    if a.release.is_released() {
        failures.push("A's release deleted a lock that was no longer A's");
    }
    if !b_still_holds {
        failures.push("B did not keep its lock");
    }
    if stored.value.as_deref() != Some("closed by B") || stored.fence != Some(b_fence) {
        failures.push("the resource does not hold B's value and fence");
    }
    if mode == FenceMode::Counter && (a.fence.get(), b_fence.get()) != (1, 2) {
        failures.push("counter-mode fences were not 1 and 2");
    }
    if failures.is_empty() {
        println!(
            "OK: A (fence {}) outlived its lease; its write was refused and its release left B's lock alone. B (fence {b_fence}) was never overwritten.",
            a.fence
        );
        Ok(exit::OK)
    } else {
        println!("SCENARIO FAILED: {}", failures.join("; "));
        Ok(exit::FAILED)
    }
}

#[allow(clippy::too_many_arguments)]
async fn worker_a(
    url: String,
    prefix: String,
    name: String,
    resource_key: String,
    opts: LockOptions,
    tl: Arc<Timeline>,
    pause: Duration,
    holds: tokio::sync::oneshot::Sender<()>,
    b_wrote: std::sync::mpsc::Receiver<()>,
) -> anyhow::Result<ASaw> {
    let client = LockClient::builder(url).prefix(prefix).connect().await?;
    let lease = client.acquire(&name, &opts).await?;
    tl.say(
        "A",
        format!(
            "acquired, fence {}, holder {}",
            lease.fence(),
            lease.holder_id()
        ),
    );
    let _ = holds.send(());
    tl.say(
        "A",
        format!(
            "stalls for {} ms: its event loop is blocked, so its renewal cannot run",
            pause.as_millis()
        ),
    );
    std::thread::sleep(pause);
    // Keep the guide's order (B writes before A wakes) even on a slow machine.
    let _ = b_wrote.recv_timeout(Duration::from_secs(10));
    let woke = Instant::now();
    tl.say("A", "wakes up and checks its lease");
    match tokio::time::timeout(opts.ttl_value(), lease.lost()).await {
        Ok(()) => tl.say(
            "A",
            format!(
                "loss signal fired {} ms after waking: {}",
                woke.elapsed().as_millis(),
                lease
                    .loss_reason()
                    .map(|r| r.to_string())
                    .unwrap_or_default()
            ),
        ),
        Err(_) => tl.say("A", "loss signal did NOT fire"),
    }
    tl.say("A", "writes anyway, as a worker that never checked would:");
    let resource = client.fenced_hash(&resource_key)?;
    let write = resource
        .write(lease.fence(), lease.token(), "closed by A")
        .await?;
    tl.say(
        "A",
        format!(
            "write \"closed by A\" with fence {} -> {}",
            lease.fence(),
            describe(&write)
        ),
    );
    let fence = lease.fence();
    let release = lease.release().await?;
    tl.say("A", format!("release -> {}", describe_release(release)));
    Ok(ASaw {
        fence,
        write,
        release,
    })
}

fn describe(outcome: &WriteOutcome) -> String {
    match outcome {
        WriteOutcome::Accepted => "accepted".into(),
        WriteOutcome::Rejected { current_fence, .. } => format!(
            "REJECTED as stale (the resource holds fence {})",
            current_fence
                .map(|f| f.to_string())
                .unwrap_or_else(|| "?".into())
        ),
        other => format!("{other:?}"),
    }
}

fn describe_release(outcome: ReleaseOutcome) -> String {
    match outcome {
        ReleaseOutcome::Released => "released".into(),
        ReleaseOutcome::NotOurs(reason) => format!("not ours ({reason}); nothing deleted"),
        other => format!("{other:?}"),
    }
}
