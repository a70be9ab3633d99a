//! The fenced resource that `read`, `write` and `update` name (a Redis hash,
//! or on etcd a fenced etcd key), who writes it (`--fence`, `--holder`),
//! and what the three say and return when a call is refused as stale.

use clap::Args;
use fencelock::{Fence, LockClient, WriteOutcome};

/// Exit code of a write rejected as stale.
pub(crate) const REJECTED: u8 = 3;

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
        env = "FENCELOCK_FENCE",
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
