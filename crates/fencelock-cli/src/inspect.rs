//! `status`, `read`, `write` and `update`: look at locks and use fenced
//! resources from a shell.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use fencelock::{Fence, LockClient, LockState, WriteOutcome};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cli::{Global, ReadArgs, StatusArgs, UpdateArgs, WriteArgs};
use crate::{child, connect, exit};

/// Exit code of a write rejected as stale.
pub(crate) const REJECTED: u8 = 3;

/// The fenced resource a shell command names: a Redis hash, or on etcd a
/// fenced etcd key (`FencedKey`), with the same operations and rule. One
/// per command: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Resource {
    Hash(fencelock::FencedHash),
    Key(fencelock::FencedKey),
}

/// What a resource holds.
struct Held {
    value: Option<String>,
    fence: Option<Fence>,
    holder: Option<String>,
}

impl Resource {
    fn of(client: &LockClient, name: &str) -> anyhow::Result<Self> {
        Ok(if client.backend_kind() == "etcd" {
            Resource::Key(client.fenced_key(name)?)
        } else {
            Resource::Hash(client.fenced_hash(name)?)
        })
    }

    async fn write(
        &self,
        fence: Fence,
        holder: &str,
        value: &str,
    ) -> fencelock::Result<WriteOutcome> {
        match self {
            Resource::Hash(h) => h.write(fence, holder, value).await,
            Resource::Key(k) => k.write(fence, holder, value).await,
        }
    }

    async fn register(&self, fence: Fence, holder: &str) -> fencelock::Result<WriteOutcome> {
        match self {
            Resource::Hash(h) => h.register(fence, holder).await,
            Resource::Key(k) => k.register(fence, holder).await,
        }
    }

    async fn read(&self) -> fencelock::Result<Held> {
        Ok(match self {
            Resource::Hash(h) => {
                let s = h.read().await?;
                Held {
                    value: s.value,
                    fence: s.fence,
                    holder: s.holder,
                }
            }
            Resource::Key(k) => {
                let s = k.read().await?;
                Held {
                    value: s.value,
                    fence: s.fence,
                    holder: s.holder,
                }
            }
        })
    }
}

pub(crate) async fn status(global: &Global, args: &StatusArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let layout = global.layout.into();
    let key = client.keys(&args.name, layout)?.lock;
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
            other => println!("{}: {other:?}", args.name),
        }
    }
    Ok(exit::OK)
}

pub(crate) async fn read(global: &Global, args: &ReadArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let hash = Resource::of(&client, &args.resource)?;
    if args.register {
        let fence = args.fence.ok_or_else(|| {
            exit::fail(
                exit::USAGE,
                "read --register needs the caller's fence: --fence N (inside `fencelock run`, FENCELOCK_FENCE is set)",
            )
        })?;
        let holder = args.holder.as_deref().ok_or_else(|| {
            exit::fail(
                exit::USAGE,
                "read --register needs the caller's holder token: --holder TOKEN (inside `fencelock run`, FENCELOCK_TOKEN is set)",
            )
        })?;
        if let WriteOutcome::Rejected { current_fence, .. } = hash.register(fence, holder).await? {
            if args.json {
                println!(
                    "{}",
                    json!({
                        "resource": args.resource, "registered": false, "fence": fence.get(),
                        "current_fence": current_fence.map(|f| f.get()),
                    })
                );
            }
            eprintln!(
                "fencelock: {}",
                stale(&args.resource, "register", fence, current_fence)
            );
            return Ok(REJECTED);
        }
    }
    let state = hash.read().await?;
    let exists = state.value.is_some() || state.fence.is_some();
    if args.json {
        let mut object = json!({
            "resource": args.resource, "exists": exists, "value": state.value,
            "fence": state.fence.map(|f| f.get()), "holder": state.holder,
        });
        if args.register {
            object["registered"] = true.into();
        }
        println!("{object}");
    } else if exists {
        println!(
            "{}: {:?} (fence {}, holder {})",
            args.resource,
            state.value.as_deref().unwrap_or(""),
            state.fence.map_or("none".into(), |f| f.to_string()),
            state.holder.as_deref().unwrap_or("unknown")
        );
    } else {
        println!("{}: absent", args.resource);
    }
    Ok(exit::OK)
}

/// The line for a fenced call refused as stale.
fn stale(resource: &str, what: &str, fence: Fence, current: Option<Fence>) -> String {
    format!(
        "{resource}: {what} REJECTED as stale: fence {fence} is older than the resource's {} (a newer holder took over; nothing was written)",
        current.map_or("?".into(), |f| f.to_string())
    )
}

/// The largest value also passed in `FENCELOCK_VALUE` (Linux refuses a
/// single environment string over 128 KiB; stdin has no limit).
const VALUE_ENV_MAX: usize = 64 * 1024;

pub(crate) async fn update(global: &Global, args: &UpdateArgs) -> anyhow::Result<u8> {
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(exit::fail(
            exit::USAGE,
            "no command given: use `fencelock update RESOURCE -- CMD ARGS…`",
        ));
    };
    let client = connect::client(global).await?;
    let hash = Resource::of(&client, &args.resource)?;
    // Register first: from here on, no stale holder's write can land between
    // our read and our write.
    if let WriteOutcome::Rejected { current_fence, .. } = hash
        .register(args.writer.fence, &args.writer.holder)
        .await?
    {
        return Ok(rejected(args, "register", current_fence));
    }
    let current = hash.read().await?.value;
    let new = match compute(program, program_args, current.as_deref()).await? {
        Ok(new) => new,
        Err(code) => return Ok(code),
    };
    match hash
        .write(args.writer.fence, &args.writer.holder, &new)
        .await?
    {
        WriteOutcome::Accepted => {
            if args.json {
                println!(
                    "{}",
                    json!({
                        "resource": args.resource, "accepted": true, "fence": args.writer.fence.get(),
                        "value": new,
                    })
                );
            } else {
                println!("{}: updated (fence {})", args.resource, args.writer.fence);
            }
            Ok(exit::OK)
        }
        WriteOutcome::Rejected { current_fence, .. } => Ok(rejected(args, "update", current_fence)),
        other => anyhow::bail!("unexpected write outcome {other:?}"),
    }
}

/// Reports an update refused as stale; its exit code.
fn rejected(args: &UpdateArgs, what: &str, current_fence: Option<Fence>) -> u8 {
    if args.json {
        println!(
            "{}",
            json!({
                "resource": args.resource, "accepted": false, "fence": args.writer.fence.get(),
                "current_fence": current_fence.map(|f| f.get()),
            })
        );
    }
    eprintln!(
        "fencelock: {}",
        stale(&args.resource, what, args.writer.fence, current_fence)
    );
    REJECTED
}

/// Runs CMD with `current` on stdin (plus a newline) and in
/// `FENCELOCK_VALUE`: its stdout less one trailing newline, or the exit code
/// to return when it failed (nothing is written then).
async fn compute(
    program: &str,
    program_args: &[String],
    current: Option<&str>,
) -> anyhow::Result<Result<String, u8>> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(program_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env_remove("FENCELOCK_VALUE");
    if let Some(value) = current.filter(|v| v.len() <= VALUE_ENV_MAX && !v.contains('\0')) {
        cmd.env("FENCELOCK_VALUE", value);
    }
    child::die_with_parent(&mut cmd);
    let mut process = match cmd.spawn() {
        Ok(process) => process,
        Err(e) => {
            let (code, message) = child::exec_failure(program.as_ref(), &e);
            eprintln!("fencelock: {message}");
            return Ok(Err(code));
        }
    };
    let input = current.map(|v| format!("{v}\n")).unwrap_or_default();
    let mut stdin = process.stdin.take();
    let mut stdout = process.stdout.take();
    let feed = async {
        if let Some(stdin) = stdin.as_mut() {
            match stdin.write_all(input.as_bytes()).await {
                // CMD need not read its input.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                other => other?,
            }
        }
        // Closed: CMD sees the end of its input.
        drop(stdin);
        Ok::<(), std::io::Error>(())
    };
    let collect = async {
        let mut out = Vec::new();
        if let Some(stdout) = stdout.as_mut() {
            stdout.read_to_end(&mut out).await?;
        }
        Ok::<Vec<u8>, std::io::Error>(out)
    };
    let (fed, out) = tokio::join!(feed, collect);
    fed?;
    let out = out?;
    let status = process.wait().await?;
    if !status.success() {
        let code = match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
            (None, None) => exit::SOFTWARE,
        };
        eprintln!("fencelock: {program} failed ({status}); nothing was written");
        return Ok(Err(code));
    }
    let Ok(mut new) = String::from_utf8(out) else {
        eprintln!("fencelock: {program}'s output is not UTF-8 text; nothing was written");
        return Ok(Err(exit::DATA));
    };
    if new.ends_with('\n') {
        new.pop();
    }
    Ok(Ok(new))
}

pub(crate) async fn write(global: &Global, args: &WriteArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let outcome = Resource::of(&client, &args.resource)?
        .write(args.writer.fence, &args.writer.holder, &args.value)
        .await?;
    let (accepted, current_fence, current_holder) = match &outcome {
        WriteOutcome::Accepted => (
            true,
            Some(args.writer.fence),
            Some(fencelock::holder_id(&args.writer.holder)),
        ),
        WriteOutcome::Rejected {
            current_fence,
            current_holder,
        } => (false, *current_fence, current_holder.clone()),
        other => anyhow::bail!("unexpected write outcome {other:?}"),
    };
    if args.json {
        println!(
            "{}",
            json!({
                "resource": args.resource, "accepted": accepted, "fence": args.writer.fence.get(),
                "current_fence": current_fence.map(|f| f.get()), "current_holder": current_holder,
            })
        );
    } else if accepted {
        println!("{}: accepted (fence {})", args.resource, args.writer.fence);
    } else {
        println!(
            "{}: REJECTED as stale: fence {} is older than the resource's {} (a newer holder wrote)",
            args.resource,
            args.writer.fence,
            current_fence.map_or("?".into(), |f| f.to_string())
        );
    }
    Ok(if accepted { exit::OK } else { REJECTED })
}
