//! `fencelock status`: whether a lock is held, by whom, its fence, the time
//! left and its waiters, as a line or one JSON object; for a semaphore, its
//! permit count and the holder of each held slot; for a read-write lock,
//! its writer or its readers.

use clap::Args;
use fencelock::LockState;
use serde_json::json;

use crate::global_options::GlobalOptions;
use crate::{connect, exit, rwlock_view, semaphore_view};

/// Show whether a lock is held, by whom, its fence and the time left.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct StatusArgs {
    /// Lock name.
    pub(crate) name: String,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The rest of `fencelock status --help`, after the options.
const HELP: &str = "\
Examples:
  fencelock status nightly-report
  fencelock status invoice:42 --json

A semaphore (`fencelock run --permits N`) is shown with its permit count
and one line per held slot: the slot, the holder id, its fence and the time
left. Its --json object has `held` (true while any permit is held),
`holder`, `fence` and `ttl_ms` null, `last_fence`, and `permits` and
`holders` (an array of {slot, holder, fence, ttl_ms} objects, by slot); a lock's object has neither `permits` nor `holders`.

A read-write lock (`fencelock run --read` or `--write`) is shown with one
line per holder: the writer with its fence, or each reader with its write
epoch, the holder id and the time left. Its --json object has `kind`
\"rwlock\", `held` (true while the writer or any reader holds it),
`holder`, `fence` and `ttl_ms` null, `last_fence`,
`writer` (a {holder, fence, ttl_ms} object, or null) and `readers` (an
array of such objects, `fence` each reader's write epoch); a lock's and a
semaphore's objects have no `kind`.

Exit code 0 whether held or free; read `held` in --json output.";

/// `fencelock status`: always exit 0, held or free.
pub(crate) async fn exec(global: &GlobalOptions, args: &StatusArgs) -> anyhow::Result<u8> {
    fencelock::check_name(&args.name)?;
    let client = connect::client(global).await?;
    let layout = global.layout.into();
    let key = client.keys(&args.name, layout)?.lock().to_owned();
    let state = client.inspect(&args.name, layout).await?;
    // Waiters: every etcd waiter; on Redis the notify and fair queue (left
    // out if the user may not read it).
    let waiters = client.waiters(&args.name, layout).await.ok();
    let backend = client.backend_kind();
    if args.json {
        let mut object = match &state {
            LockState::Held {
                holder,
                fence,
                remaining,
            } => json!({
                "name": args.name, "key": key, "held": true, "holder": holder,
                "fence": fence.map(|f| f.get()),
                "ttl_ms": remaining.map(|r| r.as_millis() as u64),
            }),
            LockState::Free { last_fence } => json!({
                "name": args.name, "key": key, "held": false, "holder": null,
                "fence": null, "last_fence": last_fence.map(|f| f.get()), "ttl_ms": null,
            }),
            LockState::Semaphore {
                permits,
                holders,
                last_fence,
            } => json!({
                "name": args.name, "key": key, "held": true, "holder": null,
                "fence": null, "last_fence": last_fence.map(|f| f.get()), "ttl_ms": null,
                "permits": permits, "holders": semaphore_view::holders_json(holders),
            }),
            LockState::RwLock {
                writer,
                readers,
                last_fence,
            } => {
                let mut object = json!({
                    "name": args.name, "key": key,
                    "held": writer.is_some() || !readers.is_empty(), "holder": null,
                    "fence": null, "last_fence": last_fence.map(|f| f.get()), "ttl_ms": null,
                });
                rwlock_view::add_json(&mut object, writer.as_ref(), readers);
                object
            }
            other => json!({ "name": args.name, "key": key, "state": format!("{other:?}") }),
        };
        object["backend"] = backend.into();
        if let Some(waiters) = waiters {
            object["waiters"] = waiters.into();
        }
        println!("{object}");
    } else {
        let queue = match waiters {
            Some(0) | None => String::new(),
            Some(1) => ", 1 waiter".to_owned(),
            Some(n) => format!(", {n} waiters"),
        };
        match &state {
            LockState::Held {
                holder,
                fence,
                remaining,
            } => println!(
                "{}: held by {}, fence {}, {} left{queue}",
                args.name,
                holder,
                fence.map_or("unknown".into(), |f| f.to_string()),
                remaining.map_or("no expiry".into(), |r| format!("{} ms", r.as_millis()))
            ),
            LockState::Free { last_fence } => println!(
                "{}: free{}",
                args.name,
                last_fence.map_or(String::new(), |f| format!(" (last fence {f})"))
            ),
            LockState::Semaphore {
                permits,
                holders,
                last_fence,
            } => {
                println!(
                    "{}: semaphore, {} of {permits} permit{} held{}{queue}",
                    args.name,
                    holders.len(),
                    if *permits == 1 { "" } else { "s" },
                    last_fence.map_or(String::new(), |f| format!(", last fence {f}"))
                );
                for h in holders {
                    println!(
                        "  slot {}: held by {}, fence {}, {} ms left",
                        h.slot,
                        h.holder,
                        h.fence.map_or("unknown".into(), |f| f.to_string()),
                        h.remaining.as_millis()
                    );
                }
            }
            LockState::RwLock {
                writer,
                readers,
                last_fence,
            } => {
                println!(
                    "{}: read-write lock, {}{}{queue}",
                    args.name,
                    rwlock_view::summary(writer.as_ref(), readers),
                    last_fence.map_or(String::new(), |f| format!(", last fence {f}"))
                );
                for line in rwlock_view::holder_lines(writer.as_ref(), readers) {
                    println!("{line}");
                }
            }
            other => println!("{}: {other:?}", args.name),
        }
    }
    Ok(exit::OK)
}
