//! `status`, `read` and `write`: look at locks and use fenced resources from
//! a shell.

use fencelock::{LockState, WriteOutcome};
use serde_json::json;

use crate::cli::{Global, ReadArgs, StatusArgs, WriteArgs};
use crate::{connect, exit};

/// Exit code of a write rejected as stale.
pub(crate) const REJECTED: u8 = 3;

pub(crate) async fn status(global: &Global, args: &StatusArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let layout = global.layout.into();
    let key = client.keys(&args.name, layout)?.lock;
    let state = client.inspect(&args.name, layout).await?;
    if args.json {
        let object = match &state {
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
        println!("{object}");
    } else {
        match &state {
            LockState::Held {
                holder,
                fence,
                remaining,
            } => println!(
                "{}: held by {}, fence {}, {} left",
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
    let state = client.fenced_hash(&args.resource)?.read().await?;
    let exists = state.value.is_some() || state.fence.is_some();
    if args.json {
        println!(
            "{}",
            json!({
                "resource": args.resource, "exists": exists, "value": state.value,
                "fence": state.fence.map(|f| f.get()), "holder": state.holder,
            })
        );
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

pub(crate) async fn write(global: &Global, args: &WriteArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let outcome = client
        .fenced_hash(&args.resource)?
        .write(args.fence, &args.holder, &args.value)
        .await?;
    let (accepted, current_fence, current_holder) = match &outcome {
        WriteOutcome::Accepted => (
            true,
            Some(args.fence),
            Some(fencelock::holder_id(&args.holder)),
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
                "resource": args.resource, "accepted": accepted, "fence": args.fence.get(),
                "current_fence": current_fence.map(|f| f.get()), "current_holder": current_holder,
            })
        );
    } else if accepted {
        println!("{}: accepted (fence {})", args.resource, args.fence);
    } else {
        println!(
            "{}: REJECTED as stale: fence {} is older than the resource's {} (a newer holder wrote)",
            args.resource,
            args.fence,
            current_fence.map_or("?".into(), |f| f.to_string())
        );
    }
    Ok(if accepted { exit::OK } else { REJECTED })
}
