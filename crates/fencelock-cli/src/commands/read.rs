//! `fencelock read`: a fenced resource's value, fence and holder; with
//! `--register`, the caller's fence recorded at the resource first.

use clap::Args;
use fencelock::WriteOutcome;
use serde_json::json;

use crate::fenced_resource::{REJECTED, ReplicaWait, Resource, SlotArg, not_replicated, stale};
use crate::global_options::GlobalOptions;
use crate::{connect, exit};

/// Read a fenced Redis hash resource: value, fence, holder. With
/// --register, first record the caller's fence at the resource (safe
/// read-modify-write).
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct ReadArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// Record the caller's fence at the resource before reading (exit 3 if a
    /// newer fence is there).
    #[arg(long)]
    pub(crate) register: bool,
    /// With --register: the caller's fence (inside `fencelock run`: the
    /// lock's own).
    #[arg(
        long,
        env = "FENCELOCK_FENCE",
        hide_env_values = true,
        value_name = "N"
    )]
    pub(crate) fence: Option<fencelock::Fence>,
    /// With --register: the caller's holder token (inside `fencelock run`:
    /// the lock's own).
    #[arg(
        long,
        env = "FENCELOCK_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) holder: Option<String>,
    /// The slot whose pair to read (and register), if any.
    #[command(flatten)]
    pub(crate) slot: SlotArg,
    /// With --register: how many replicas must acknowledge the
    /// registration.
    #[command(flatten)]
    pub(crate) replicas: ReplicaWait,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The rest of `fencelock read --help`, after the options.
const HELP: &str = "\
With --register, the caller's fence (--fence, --holder: inside `fencelock
run`, the lock's own) is recorded at the resource before the value is read,
under the rule of a write. From then on a stale holder's write can no longer
land between this read and the caller's write (a lost update that a plain
read followed by a write allows). Exit 3 if the resource already holds a
newer fence: do not write then.

Examples:
  fencelock read invoice:42
  fencelock read invoice:42 --json
  # read-modify-write inside `fencelock run` (or use `fencelock update`):
  j=$(fencelock read --register counter --json) &&
    v=$(echo \"$j\" | jq -r '.value // 0') && fencelock write counter $((v + 1))

With --slot (FENCELOCK_SLOT, which `fencelock run --permits` sets), the
read (and --register) uses that slot's pair: the fields value:SLOT,
fence:SLOT and holder:SLOT.

With --register --replicas N (inside `fencelock run --replicas N`: N), the
registration waits until N replicas acknowledged it, so a failover cannot
undo it; exit 4 if fewer did in time (it WAS applied on the master; the
value is not read then).

Exit codes: 0 read; 3 --register rejected (a newer fence took over); 4
--register applied but acknowledged by fewer than --replicas replicas.";

/// `fencelock read`: exit 0, or [`REJECTED`] if `--register` found a newer
/// fence.
pub(crate) async fn exec(global: &GlobalOptions, args: &ReadArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let hash = Resource::of(&client, &args.resource)?
        .in_slot(&args.slot)
        .replicated(&args.replicas);
    let label = args.slot.label(&args.resource);
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
        let registered = match hash.register(fence, holder).await {
            Ok(outcome) => outcome,
            Err(e) => return not_replicated(e, "registration"),
        };
        if let WriteOutcome::Rejected { current_fence, .. } = registered {
            if args.json {
                let mut object = json!({
                    "resource": args.resource, "registered": false, "fence": fence.get(),
                    "current_fence": current_fence.map(|f| f.get()),
                });
                args.slot.annotate(&mut object);
                println!("{object}");
            }
            eprintln!(
                "fencelock: {}",
                stale(&label, "register", fence, current_fence)
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
        args.slot.annotate(&mut object);
        println!("{object}");
    } else if exists {
        println!(
            "{label}: {:?} (fence {}, holder {})",
            state.value.as_deref().unwrap_or(""),
            state.fence.map_or("none".into(), |f| f.to_string()),
            state.holder.as_deref().unwrap_or("unknown")
        );
    } else {
        println!("{label}: absent");
    }
    Ok(exit::OK)
}
