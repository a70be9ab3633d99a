//! `fencelock read`: a fenced resource's value, fence and holder; with
//! `--register`, the caller's fence recorded at the resource first; with
//! `--validate`, the read checked against a reader's write epoch.

use clap::Args;
use fencelock::WriteOutcome;
use serde_json::json;

use crate::fenced_resource::{
    FENCE_ENV, Held, REJECTED, ReplicaWait, Resource, SlotArg, TORN, not_replicated,
    refuse_reader_epoch, stale,
};
use crate::global_options::GlobalOptions;
use crate::{connect, exit};

/// Read a fenced Redis hash resource: value, fence, holder. With
/// --register, first record the caller's fence at the resource (safe
/// read-modify-write); with --validate, check the read against a reader's
/// write epoch.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct ReadArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// Record the caller's fence at the resource before reading (exit 3 if a
    /// newer fence is there).
    #[arg(long)]
    pub(crate) register: bool,
    /// Check the read against a reader's write epoch (--fence; inside
    /// `fencelock run --read`, FENCELOCK_FENCE): exit 75 if the read is
    /// torn, that is if a writer granted after the epoch had written the
    /// value. Not with --register.
    #[arg(long, conflicts_with = "register")]
    pub(crate) validate: bool,
    /// With --register: the caller's fence; with --validate: the reader's
    /// write epoch (inside `fencelock run`: FENCELOCK_FENCE).
    #[arg(
        long,
        env = FENCE_ENV,
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

With --validate, the read is checked against a reader's write epoch
(inside `fencelock run --read`, FENCELOCK_FENCE; or --fence N): it is clean
if the resource stores no fence or one no greater than the epoch, and torn
if it stores a greater one: a writer granted after the reader had written
the value (the reader paused past its lease, or its lock was revoked). The
value is printed either way, as without --validate; a torn read also says
so on stderr and exits 75: do not act on it, read again under a new
`fencelock run --read`. --json adds `clean` (true or false) and `epoch`;
`fence` is the stored fence, when torn the later writer's.
  fencelock run --read config -- fencelock read --validate config:data
  fencelock read --validate config:data --fence 1796030814974827 --json

Inside `fencelock run --read` (FENCELOCK_ACCESS=read), --register is
refused with 64: registering is a write, and a reader's write epoch is not
a write fence; nothing is changed.

Exit codes: 0 read (with --validate: clean); 3 --register rejected (a
newer fence took over); 4 --register applied but acknowledged by fewer
than --replicas replicas; 75 --validate: torn (a writer came in after the
epoch: read again); 64 --validate without an epoch, or --register with a
reader's epoch.";

/// `fencelock read`: exit 0, or [`REJECTED`] if `--register` found a newer
/// fence.
pub(crate) async fn exec(global: &GlobalOptions, args: &ReadArgs) -> anyhow::Result<u8> {
    // Usage first, before any connection.
    let epoch = match (args.validate, args.fence) {
        (true, None) => {
            return Err(exit::fail(
                exit::USAGE,
                "read --validate needs the reader's write epoch: --fence N (inside `fencelock run --read`, FENCELOCK_FENCE is set)",
            ));
        }
        (true, Some(epoch)) => Some(epoch),
        (false, _) => None,
    };
    if args.register
        && let Some(fence) = args.fence
    {
        refuse_reader_epoch("read --register", fence)?;
    }
    fencelock::check_resource_key(&args.resource)?;
    let client = connect::client(global).await?;
    let hash = Resource::of(&client, &args.resource)?
        .in_slot(&args.slot)
        .replicated(&args.replicas);
    let label = args.slot.label(&args.resource);
    if let Some(epoch) = epoch {
        return validate(args, &hash, &label, epoch).await;
    }
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
    let mut object = state_json(args, &state);
    if args.register {
        object["registered"] = true.into();
    }
    print(args, &label, &state, &object);
    Ok(exit::OK)
}

/// `read --validate`: the read checked against the reader's write epoch;
/// exit 0 if clean, [`TORN`] if a later writer had written the value.
async fn validate(
    args: &ReadArgs,
    resource: &Resource,
    label: &str,
    epoch: fencelock::Fence,
) -> anyhow::Result<u8> {
    let (state, clean) = resource.read_validated(epoch).await?;
    let mut object = state_json(args, &state);
    object["clean"] = clean.into();
    object["epoch"] = epoch.get().into();
    print(args, label, &state, &object);
    if clean {
        return Ok(exit::OK);
    }
    eprintln!(
        "fencelock: {label}: TORN read: it stores fence {}, greater than the reader's write epoch {epoch}: a writer granted after the reader wrote it (the read lock lapsed or was revoked); do not act on it, read again under a new `fencelock run --read`",
        state.fence.map_or("?".into(), |f| f.to_string())
    );
    Ok(TORN)
}

/// The JSON object of a read: `resource`, `exists`, `value`, `fence`,
/// `holder` (and `slot` for a slot's pair).
fn state_json(args: &ReadArgs, state: &Held) -> serde_json::Value {
    let exists = state.value.is_some() || state.fence.is_some();
    let mut object = json!({
        "resource": args.resource, "exists": exists, "value": state.value,
        "fence": state.fence.map(|f| f.get()), "holder": state.holder,
    });
    args.slot.annotate(&mut object);
    object
}

/// Prints a read: `object` with --json, else one line.
fn print(args: &ReadArgs, label: &str, state: &Held, object: &serde_json::Value) {
    if args.json {
        println!("{object}");
    } else if state.value.is_some() || state.fence.is_some() {
        println!(
            "{label}: {:?} (fence {}, holder {})",
            state.value.as_deref().unwrap_or(""),
            state.fence.map_or("none".into(), |f| f.to_string()),
            state.holder.as_deref().unwrap_or("unknown")
        );
    } else {
        println!("{label}: absent");
    }
}
