//! `fencelock update`: a fenced read-modify-write, the new value computed
//! by a command from the current one.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use clap::Args;
use fencelock::{Fence, WriteOutcome};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fenced_resource::{
    REJECTED, ReplicaWait, Resource, SlotArg, Writer, not_replicated, refuse_reader_epoch,
    replicas_help, stale,
};
use crate::global_options::GlobalOptions;
use crate::{child, connect, exit};

/// Fenced read-modify-write of a Redis hash resource: register the fence,
/// give the current value to CMD, write CMD's output as the new value.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct UpdateArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// The writer's fence and holder token.
    #[command(flatten)]
    pub(crate) writer: Writer,
    /// The slot whose pair to update, if any.
    #[command(flatten)]
    pub(crate) slot: SlotArg,
    /// How many replicas must acknowledge the new value.
    #[command(flatten)]
    pub(crate) replicas: ReplicaWait,
    /// Print one JSON object on stdout instead of a line of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// The command that computes the new value, and its arguments, after
    /// `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// The rest of `fencelock update --help`, after the options.
const HELP: &str = concat!(
    "\
CMD runs directly (no shell: use sh -c for a pipeline). It gets the current
value on stdin followed by one newline (nothing when there is no value), and
in FENCELOCK_VALUE (unset when there is no value, or when the value is over
64 KiB or holds a NUL byte). Its stdout, less one trailing newline, becomes
the new value: `cat` leaves it unchanged. CMD's stderr passes through.

The fence is registered at the resource before the value is read, so no
stale holder's write can land between this read and this write: concurrent
updates under `fencelock run` never overwrite one another (a plain
`fencelock read` followed by `fencelock write` can). An acknowledged update
survives a failover only with --replicas (below): the new value waits for
the replicas, the registration before it need not.

With --slot (FENCELOCK_SLOT, which `fencelock run --permits` sets), the
update registers, reads and writes that slot's pair: the fields value:SLOT,
fence:SLOT and holder:SLOT.

Inside `fencelock run --read` (FENCELOCK_ACCESS=read), FENCELOCK_FENCE is
a reader's write epoch, not a write fence: the update is refused with 64
before anything is sent or CMD runs; nothing is changed. Take the lock
with `fencelock run --write` to update.

",
    replicas_help!(),
    "

Exit codes: 0 written; 3 rejected, nothing written: a newer fence took over
(at register or at write); 4 written and applied on the master, but
acknowledged by fewer than --replicas replicas in time; CMD's own code
(128+N if it died of signal N) if it failed, nothing written; 126/127 CMD
not executable / not found; 65 CMD's output is not UTF-8 text, nothing
written; 64 a reader's write epoch as the fence, nothing sent.

Examples:
  fencelock run counter -- fencelock update counter -- sh -c 'read v; echo $(( ${v:-0} + 1 ))'
  fencelock run invoice-42 -- fencelock update invoice:42 -- jq -c '.status = \"closed\"'"
);

/// The largest value also passed in `FENCELOCK_VALUE` (Linux refuses a
/// single environment string over 128 KiB; stdin has no limit).
const VALUE_ENV_MAX: usize = 64 * 1024;

/// `fencelock update`: exit 0 if written, [`REJECTED`] if stale, or the
/// code of a CMD that failed (nothing written then).
pub(crate) async fn exec(global: &GlobalOptions, args: &UpdateArgs) -> anyhow::Result<u8> {
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(exit::fail(
            exit::USAGE,
            "no command given: use `fencelock update RESOURCE -- CMD ARGS…`",
        ));
    };
    refuse_reader_epoch("update", args.writer.fence)?;
    fencelock::check_resource_key(&args.resource)?;
    let client = connect::client(global).await?;
    let hash = Resource::of(&client, &args.resource)?.in_slot(&args.slot);
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
    // Only the new value waits for the replicas: a registration lost in a
    // failover loses no acknowledged value (the value carries the fence).
    let written = hash
        .replicated(&args.replicas)
        .write(args.writer.fence, &args.writer.holder, &new)
        .await;
    let written = match written {
        Ok(outcome) => outcome,
        Err(e) => return not_replicated(e, "update"),
    };
    match written {
        WriteOutcome::Accepted => {
            if args.json {
                let mut object = json!({
                    "resource": args.resource, "accepted": true, "fence": args.writer.fence.get(),
                    "value": new,
                });
                args.slot.annotate(&mut object);
                println!("{object}");
            } else {
                println!(
                    "{}: updated (fence {})",
                    args.slot.label(&args.resource),
                    args.writer.fence
                );
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
        let mut object = json!({
            "resource": args.resource, "accepted": false, "fence": args.writer.fence.get(),
            "current_fence": current_fence.map(|f| f.get()),
        });
        args.slot.annotate(&mut object);
        println!("{object}");
    }
    eprintln!(
        "fencelock: {}",
        stale(
            &args.slot.label(&args.resource),
            what,
            args.writer.fence,
            current_fence
        )
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
