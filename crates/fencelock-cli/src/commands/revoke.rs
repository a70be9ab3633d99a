//! `fencelock revoke`: take a lock away from whoever holds it, and seal
//! resources so that the deposed holder's writes to them are refused from
//! the moment it returns.

use std::time::Duration;

use clap::Args;
use fencelock::{Error, Revoked, Sealable, WriteOutcome};
use serde_json::json;

use crate::arg_values::parse_duration;
use crate::fenced_resource::{NOT_REPLICATED, Resource};
use crate::global_options::GlobalOptions;
use crate::{connect, exit};

/// Exit code of a revoke that found the lock free (its resources were
/// sealed all the same).
pub(crate) const NOTHING_TO_REVOKE: u8 = 75;

/// Take a lock away from its holder (no token needed) and seal resources so
/// that the deposed holder's writes to them are refused at once.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct RevokeArgs {
    /// Lock name.
    pub(crate) name: String,
    /// A resource to seal at the revocation fence (repeatable): a fenced
    /// Redis hash's key, or on etcd a fenced etcd key. Every fence up to
    /// the revocation fence is refused there from then on.
    #[arg(long = "resource", value_name = "KEY")]
    pub(crate) resources: Vec<String>,
    /// After the revoke, wait until N replicas acknowledged it (Redis
    /// WAIT); with fewer within --replica-timeout, exit 4 (the revoke WAS
    /// applied on the master and the resources sealed, but a failover now
    /// could give the deposed holder its lock back).
    #[arg(long, value_name = "N")]
    pub(crate) replicas: Option<u32>,
    /// How long to wait for --replicas.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION", requires = "replicas")]
    pub(crate) replica_timeout: Duration,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The rest of `fencelock revoke --help`, after the options.
const HELP: &str = "\
Examples:
  fencelock revoke invoice-42 --resource invoice:42
  fencelock revoke nightly-report --json

In one atomic step the holder is deposed (whoever holds the lock), a
revocation fence above its fence is minted, and the lock passes to the
first waiter, as at a release (waiters keep their places). Then each
--resource is sealed at the revocation fence: from the moment revoke
returns, the deposed holder's writes to it are refused, and every later
holder's accepted. Without --resource the deposed holder only learns at its
next renewal (within a third of its ttl: `fencelock run` then stops its
command and exits 76); until then a resource it writes accepts its writes
unless a later holder wrote there first.

A free lock is revoked all the same (exit 75): the resources are sealed,
against a holder whose lease ended but who may still write.

Who may revoke: on Redis a revoke needs the ACL permission +unlink, which
no other fencelock operation needs; leave it out of the workers' rule. On
etcd any user that may write the lock prefix may revoke.

Exit codes: 0 a holder was deposed, 75 the lock was free (resources sealed
all the same), 4 revoked and sealed, but acknowledged by fewer than
--replicas replicas; 64 usage, 69 unreachable, 78 bad configuration (a
missing +unlink permission: nothing was changed).";

/// `fencelock revoke`: exit 0 if a holder was deposed, 75 if the lock was
/// free.
pub(crate) async fn exec(global: &GlobalOptions, args: &RevokeArgs) -> anyhow::Result<u8> {
    // Bad input first, before any connection.
    fencelock::check_name(&args.name)?;
    for key in &args.resources {
        fencelock::check_resource_key(key)?;
    }
    let client = connect::client(global).await?;
    let opts = connect::options(global, &client);
    let opts = match args.replicas {
        Some(replicas) => opts.wait_for_replicas(replicas, args.replica_timeout),
        None => opts,
    };
    let resources = args
        .resources
        .iter()
        .map(|key| Resource::of(&client, key))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sealable: Vec<&dyn Sealable> = resources.iter().map(Resource::sealable).collect();
    let revoked = match client.revoke(&args.name, &opts, &sealable).await {
        Ok(revoked) => revoked,
        Err(Error::RevokeNotReplicated {
            name,
            fence,
            acked,
            wanted,
        }) => {
            eprintln!(
                "fencelock: {name}: the revoke WAS applied on the master (revocation fence {fence}) and every --resource sealed, but only {acked} of {wanted} replicas acknowledged it in time: a failover now could give the deposed holder its lock back (its writes stay refused at the sealed resources)"
            );
            return Ok(NOT_REPLICATED);
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", json_of(&revoked, client.backend_kind()));
    } else {
        print_text(&revoked);
    }
    Ok(if revoked.deposed.is_some() {
        exit::OK
    } else {
        NOTHING_TO_REVOKE
    })
}

fn json_of(revoked: &Revoked, backend: &str) -> serde_json::Value {
    let resources: Vec<_> = revoked
        .sealed
        .iter()
        .map(|s| match &s.outcome {
            WriteOutcome::Rejected { current_fence, .. } => json!({
                "resource": s.resource, "sealed": false,
                "current_fence": current_fence.map(|f| f.get()),
            }),
            _ => json!({
                "resource": s.resource, "sealed": true,
                "current_fence": revoked.fence.get(),
            }),
        })
        .collect();
    json!({
        "name": revoked.name,
        "revoked": revoked.deposed.is_some(),
        "fence": revoked.fence.get(),
        "deposed_holder": revoked.deposed.as_ref().map(|d| d.holder.clone()),
        "deposed_fence": revoked.deposed.as_ref().and_then(|d| d.fence).map(|f| f.get()),
        "resources": resources,
        "backend": backend,
    })
}

fn print_text(revoked: &Revoked) {
    match &revoked.deposed {
        Some(deposed) => println!(
            "{}: revoked from holder {}{}; revocation fence {}",
            revoked.name,
            deposed.holder,
            deposed
                .fence
                .map_or(String::new(), |f| format!(" (fence {f})")),
            revoked.fence
        ),
        None => println!(
            "{}: nothing to revoke (the lock was free); revocation fence {}",
            revoked.name, revoked.fence
        ),
    }
    for sealed in &revoked.sealed {
        match &sealed.outcome {
            WriteOutcome::Rejected { current_fence, .. } => println!(
                "{}: holds the later fence {} already, which refuses every fence up to the revocation fence too",
                sealed.resource,
                current_fence.map_or("?".into(), |f| f.to_string())
            ),
            _ => println!(
                "{}: sealed at fence {}: every fence up to it is refused",
                sealed.resource, revoked.fence
            ),
        }
    }
    if revoked.sealed.is_empty() && revoked.deposed.is_some() {
        println!(
            "no --resource given: the deposed holder learns at its next renewal (within a third of its ttl); until then a resource it writes accepts its writes unless a later holder wrote there first"
        );
    }
}
