//! The fenced resource that `read`, `write` and `update` name (a Redis hash,
//! or on etcd a fenced etcd key), who writes it (`--fence`, `--holder`),
//! what the three say and return when a call is refused as stale, and the
//! refusal of a write with a reader's write epoch.

use std::time::Duration;

use clap::Args;
use fencelock::{Fence, LockClient, WriteOutcome};

use crate::arg_values::parse_duration;
use crate::exit;

/// Exit code of a write rejected as stale.
pub(crate) const REJECTED: u8 = 3;

/// Exit code of `read --validate` when the read is torn: a writer granted
/// after the reader's epoch had written the resource (EX_TEMPFAIL: read
/// again, under a new read lock).
pub(crate) const TORN: u8 = 75;

/// Exit code of a write (or registration) that was applied on the master
/// but acknowledged by fewer replicas than `--replicas` asked for, in time.
pub(crate) const NOT_REPLICATED: u8 = 4;

/// The environment variable through which `fencelock run --replicas N`
/// passes N to the resource writes of its command.
pub(crate) const REPLICAS_ENV: &str = "FENCELOCK_REPLICAS";
/// The environment variable through which `run` passes
/// `--replica-timeout`.
pub(crate) const REPLICA_TIMEOUT_ENV: &str = "FENCELOCK_REPLICA_TIMEOUT";

/// The environment variable through which `fencelock run --permits N`
/// passes the permit's slot (0 to N-1) to its command.
pub(crate) const SLOT_ENV: &str = "FENCELOCK_SLOT";

/// The environment variable through which `fencelock run --read` and
/// `--write` pass the side of the read-write lock (`read` or `write`).
pub(crate) const ACCESS_ENV: &str = "FENCELOCK_ACCESS";

/// The environment variable through which `fencelock run` passes the
/// lease's fence (a reader's: its write epoch).
pub(crate) const FENCE_ENV: &str = "FENCELOCK_FENCE";

/// Refuses a write (`write`, `update`, `read --register`: `what`) with a
/// reader's write epoch: inside `fencelock run --read` (FENCELOCK_ACCESS
/// `read`), FENCELOCK_FENCE is the epoch the reader saw, the fence of a
/// writer that may still be writing or long gone, and a write with it would
/// pass for that writer's. Refused whether the fence came from
/// FENCELOCK_FENCE or was given as the same number with `--fence`; another
/// `--fence` (a writer's, passed in) is the caller's to answer for. Called
/// before any connection: nothing is changed.
pub(crate) fn refuse_reader_epoch(what: &str, fence: Fence) -> anyhow::Result<()> {
    if std::env::var(ACCESS_ENV).as_deref() != Ok("read") {
        return Ok(());
    }
    let epoch = std::env::var(FENCE_ENV)
        .ok()
        .and_then(|f| f.parse::<Fence>().ok());
    if epoch != Some(fence) {
        return Ok(());
    }
    Err(exit::fail(
        exit::USAGE,
        format!(
            "{what} refused: fence {fence} is a reader's write epoch ({ACCESS_ENV}=read: this runs inside `fencelock run --read`), not a write fence, and a reader must not write; nothing was changed - take the lock with `fencelock run --write` to write, or use `fencelock read --validate` to read"
        ),
    ))
}

/// Which (fence, holder) pair of a resource a call uses: the resource's own,
/// or one semaphore slot's (inside `fencelock run --permits N`, the
/// permit's slot by default).
#[derive(Debug, Args)]
pub(crate) struct SlotArg {
    /// Use SLOT's pair of the resource: the fields value:SLOT, fence:SLOT
    /// and holder:SLOT of a Redis hash (on etcd a key of its own), fenced
    /// apart from the other slots and from the resource's own pair (inside
    /// `fencelock run --permits N`: the permit's slot, FENCELOCK_SLOT).
    #[arg(long, env = SLOT_ENV, hide_env_values = true, value_name = "SLOT", value_parser = parse_slot)]
    pub(crate) slot: Option<u32>,
}

/// Parses `--slot` (or FENCELOCK_SLOT): a number from 0 to 2^32-1.
fn parse_slot(s: &str) -> Result<u32, String> {
    if s.trim().is_empty() {
        return Err(format!(
            "empty: a slot is a number, e.g. 0 (to use the resource's own pair inside `fencelock run --permits`, unset {SLOT_ENV}: env -u {SLOT_ENV} …)"
        ));
    }
    s.trim()
        .parse()
        .map_err(|_| format!("not a slot: a slot is a number from 0 to {}", u32::MAX))
}

impl SlotArg {
    /// The resource as messages name it: `KEY`, or `KEY slot N`.
    pub(crate) fn label(&self, resource: &str) -> String {
        match self.slot {
            Some(slot) => format!("{resource} slot {slot}"),
            None => resource.to_owned(),
        }
    }

    /// Adds `"slot"` to a JSON object of a slot's call (a call on the
    /// resource's own pair keeps the fields it always had).
    pub(crate) fn annotate(&self, object: &mut serde_json::Value) {
        if let Some(slot) = self.slot {
            object["slot"] = slot.into();
        }
    }
}

/// How many replicas must acknowledge a resource write (Redis `WAIT`)
/// before it counts as done.
#[derive(Debug, Args)]
pub(crate) struct ReplicaWait {
    /// After the write is applied, wait until N replicas acknowledged it
    /// (Redis WAIT); with fewer within --replica-timeout, exit 4 (the write
    /// WAS applied on the master, but a failover now could lose it). Inside
    /// `fencelock run --replicas N`: N. On etcd every write is already on a
    /// quorum of members, and this is ignored.
    #[arg(long, env = REPLICAS_ENV, hide_env_values = true, value_name = "N")]
    pub(crate) replicas: Option<u32>,
    /// How long to wait for --replicas (inside `fencelock run`: its own
    /// --replica-timeout).
    #[arg(
        long,
        env = REPLICA_TIMEOUT_ENV,
        hide_env_values = true,
        default_value = "100ms",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub(crate) replica_timeout: Duration,
}

/// What `--replicas` means for a resource write, for `--help` (a macro,
/// so the commands' help texts can `concat!` it).
macro_rules! replicas_help {
    () => {
        "\
Failovers (Redis): a write is acknowledged when the master applied it.
Without --replicas, a failover right after (Sentinel promoting a replica
the write had not reached yet) loses it, acknowledged or not. With
--replicas N it is acknowledged only once N replicas have it, and survives a
failover that promotes one of them (Sentinel promotes the replica with the
most data unless replica-priority says otherwise). Redis 7.0 has no
WAITAOF: the replicas hold the write in memory, not on disk, so it is lost
if they restart as well before writing it out. Exit 4 (--replicas not met)
means the write WAS applied on the master; writing it again with the same
fence and holder is accepted."
    };
}
pub(crate) use replicas_help;

/// The fenced resource a shell command names: a Redis hash, or on etcd a
/// fenced etcd key (`FencedKey`), with the same operations and rule. One
/// per command: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Resource {
    Hash(fencelock::FencedHash),
    Key(fencelock::FencedKey),
}

/// What a resource holds.
pub(crate) struct Held {
    pub(crate) value: Option<String>,
    pub(crate) fence: Option<Fence>,
    pub(crate) holder: Option<String>,
}

impl Resource {
    pub(crate) fn of(client: &LockClient, name: &str) -> anyhow::Result<Self> {
        Ok(if client.backend_kind() == "etcd" {
            Resource::Key(client.fenced_key(name)?)
        } else {
            Resource::Hash(client.fenced_hash(name)?)
        })
    }

    /// The view of `slot`'s (fence, holder) pair of this resource
    /// (`FencedHash::slot`, `FencedKey::slot`), or the resource itself.
    pub(crate) fn in_slot(self, slot: &SlotArg) -> Self {
        match (self, slot.slot) {
            (Resource::Hash(h), Some(n)) => Resource::Hash(h.slot(n)),
            (Resource::Key(k), Some(n)) => Resource::Key(k.slot(n)),
            (resource, None) => resource,
        }
    }

    /// This resource, its writes and registrations waiting for `wait`'s
    /// replicas (a Redis hash; an etcd key's writes are on a quorum
    /// already).
    pub(crate) fn replicated(self, wait: &ReplicaWait) -> Self {
        match (self, wait.replicas) {
            (Resource::Hash(h), Some(n)) => {
                Resource::Hash(h.wait_for_replicas(n, wait.replica_timeout))
            }
            (resource, _) => resource,
        }
    }

    /// The resource, for a revoke to seal.
    pub(crate) fn sealable(&self) -> &dyn fencelock::Sealable {
        match self {
            Resource::Hash(h) => h,
            Resource::Key(k) => k,
        }
    }

    pub(crate) async fn write(
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

    pub(crate) async fn register(
        &self,
        fence: Fence,
        holder: &str,
    ) -> fencelock::Result<WriteOutcome> {
        match self {
            Resource::Hash(h) => h.register(fence, holder).await,
            Resource::Key(k) => k.register(fence, holder).await,
        }
    }

    /// Reads as [`Resource::read`] does and checks the read against a
    /// reader's write epoch (`read_validated`): what was read, and whether
    /// it is clean (else torn: the stored fence, `Held::fence`, is a later
    /// writer's).
    pub(crate) async fn read_validated(&self, epoch: Fence) -> fencelock::Result<(Held, bool)> {
        Ok(match self {
            Resource::Hash(h) => {
                let read = h.read_validated(epoch).await?;
                let clean = read.is_clean();
                let s = read.into_value();
                let held = Held {
                    value: s.value,
                    fence: s.fence,
                    holder: s.holder,
                };
                (held, clean)
            }
            Resource::Key(k) => {
                let read = k.read_validated(epoch).await?;
                let clean = read.is_clean();
                let s = read.into_value();
                let held = Held {
                    value: s.value,
                    fence: s.fence,
                    holder: s.holder,
                };
                (held, clean)
            }
        })
    }

    pub(crate) async fn read(&self) -> fencelock::Result<Held> {
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

/// Who writes a fenced resource: inside `fencelock run`, the lock's own
/// fence and token by default.
#[derive(Debug, Args)]
pub(crate) struct Writer {
    /// The writer's fence (inside `fencelock run`: the lock's own).
    #[arg(
        long,
        env = FENCE_ENV,
        hide_env_values = true,
        value_name = "N"
    )]
    pub(crate) fence: fencelock::Fence,
    /// The writer's holder token (inside `fencelock run`: the lock's own).
    #[arg(
        long,
        env = "FENCELOCK_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) holder: String,
}

/// The line for a fenced call refused as stale.
pub(crate) fn stale(resource: &str, what: &str, fence: Fence, current: Option<Fence>) -> String {
    format!(
        "{resource}: {what} REJECTED as stale: fence {fence} is older than the resource's {} (a newer holder took over; nothing was written)",
        current.map_or("?".into(), |f| f.to_string())
    )
}

/// The exit code and line for an error of a resource call: a write or
/// registration that too few replicas acknowledged ([`NOT_REPLICATED`],
/// saying it was applied), else the error itself.
pub(crate) fn not_replicated(e: fencelock::Error, what: &str) -> anyhow::Result<u8> {
    match e {
        fencelock::Error::WriteNotReplicated {
            resource,
            acked,
            wanted,
        } => {
            eprintln!(
                "fencelock: {resource}: the {what} WAS applied on the master, but only {acked} of {wanted} replicas acknowledged it in time: a failover now could lose it (writing it again with the same fence and holder is accepted)"
            );
            Ok(NOT_REPLICATED)
        }
        other => Err(other.into()),
    }
}
