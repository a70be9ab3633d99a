//! `fencelock write`: a fenced write of a resource, accepted only under the
//! fencing rule (a newer fence than the stored one, or the same fence from
//! the same holder).

use clap::Args;
use fencelock::WriteOutcome;
use serde_json::json;

use crate::fenced_resource::{
    REJECTED, ReplicaWait, Resource, SlotArg, Writer, not_replicated, refuse_reader_epoch,
    replicas_help,
};
use crate::global_options::GlobalOptions;
use crate::{connect, exit};

/// Write a fenced Redis hash resource: accepted only if the fence is newer
/// than the stored one (or equal and from the same holder).
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct WriteArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// The value to store.
    pub(crate) value: String,
    /// The writer's fence and holder token.
    #[command(flatten)]
    pub(crate) writer: Writer,
    /// The slot whose pair to write, if any.
    #[command(flatten)]
    pub(crate) slot: SlotArg,
    /// How many replicas must acknowledge the write.
    #[command(flatten)]
    pub(crate) replicas: ReplicaWait,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The rest of `fencelock write --help`, after the options.
const HELP: &str = concat!(
    replicas_help!(),
    "

Examples:
  fencelock write invoice:42 closed --fence 1796030814974827 --holder 3f2a…
  # inside `fencelock run`, --fence and --holder default to the lock's own:
  fencelock run invoice-42 -- sh -c 'fencelock write invoice:42 closed'
  # inside `fencelock run --permits N`, the permit's slot too (--slot):
  fencelock run --permits 2 flushers -- sh -c 'fencelock write partitions flushed'

With --slot (FENCELOCK_SLOT, which `fencelock run --permits` sets), the
write uses that slot's pair: the fields value:SLOT, fence:SLOT and
holder:SLOT, refused only by a newer fence of the same slot; the other
slots and the resource's own value, fence and holder are left alone.

On Redis one of a lock's own keys (lock:{job}, lock:{job}:fence,
:queue or :waiters, under --prefix) is refused (64): a hash there would
break that lock. On etcd the resource is a fenced etcd key next to the
locks: a key that starts with the lock prefix and has a '/' after it
(lock:job/1) lies in a lock's key range, where it would be taken for a
holder that never expires, and is refused (64).

Inside `fencelock run --read` (FENCELOCK_ACCESS=read), FENCELOCK_FENCE is
a reader's write epoch, not a write fence: a write with it (from
FENCELOCK_FENCE, or the same number given with --fence) is refused with 64
before anything is sent; nothing is changed. Take the lock with
`fencelock run --write` to write.

Exit codes: 0 accepted, 3 rejected as stale (a newer holder wrote), 4
accepted and applied on the master but acknowledged by fewer than
--replicas replicas in time; 64 a key that cannot be used, or a reader's
write epoch as the fence."
);

/// `fencelock write`: exit 0 if accepted, [`REJECTED`] if stale.
pub(crate) async fn exec(global: &GlobalOptions, args: &WriteArgs) -> anyhow::Result<u8> {
    refuse_reader_epoch("write", args.writer.fence)?;
    fencelock::check_resource_key(&args.resource)?;
    let client = connect::client(global).await?;
    let outcome = match Resource::of(&client, &args.resource)?
        .in_slot(&args.slot)
        .replicated(&args.replicas)
        .write(args.writer.fence, &args.writer.holder, &args.value)
        .await
    {
        Ok(outcome) => outcome,
        Err(e) => return not_replicated(e, "write"),
    };
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
    let label = args.slot.label(&args.resource);
    if args.json {
        let mut object = json!({
            "resource": args.resource, "accepted": accepted, "fence": args.writer.fence.get(),
            "current_fence": current_fence.map(|f| f.get()), "current_holder": current_holder,
        });
        args.slot.annotate(&mut object);
        println!("{object}");
    } else if accepted {
        println!("{label}: accepted (fence {})", args.writer.fence);
    } else {
        println!(
            "{label}: REJECTED as stale: fence {} is older than the resource's {} (a newer holder wrote)",
            args.writer.fence,
            current_fence.map_or("?".into(), |f| f.to_string())
        );
    }
    Ok(if accepted { exit::OK } else { REJECTED })
}
