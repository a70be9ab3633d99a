//! Release: compare-and-delete, then pass the lock on (`release_free.lua`,
//! `release_fast.lua`, then `release.lua`), and many releases in one call (`release_many.lua`).

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Batched, Keys, Mint, PassOn, ScriptCall};
use crate::store::Checked;
use crate::store::redis::scripts::{self, Lua};

/// Compare-and-delete, then pass the lock on (`release.lua`).
#[derive(Debug)]
pub(crate) struct Release<'a> {
    /// The lock key (the script derives the others from it).
    pub(crate) lock: &'a str,
    pub(crate) mint: Mint,
    pub(crate) pass_on: PassOn,
    /// The exact lock value of the grant.
    pub(crate) value: &'a str,
    /// Whether the lock is contended (its lease was refused before it was
    /// granted). Then the release is sent behind a `PING`: Redis writes the
    /// replies of one event-loop turn newest client first, so the releaser,
    /// answered last by the script, would be written to before the waiter
    /// its `PUBLISH` woke. On a machine with few cores the releaser's thread
    /// (which usually queues up again at once) would then take the core that
    /// the next holder needs. With the `PING` answered first, the releaser
    /// is no longer the newest client, and the next holder is woken first.
    pub(crate) wake_first: bool,
}

impl ToRedisArgs for Release<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.pass_on.write_with(&self.mint, out);
        out.write_arg(self.value.as_bytes());
    }
}

impl ScriptCall for Release<'_> {
    type Reply = Checked;

    fn script(&self) -> &'static Lua {
        &scripts::RELEASE
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.lock])
    }

    fn wake_first(&self) -> bool {
        self.wake_first
    }
}

/// One release waiting in a batch (owned, see [`GrantItem`]).
#[derive(Debug, Clone)]
pub(crate) struct ReleaseItem {
    /// The lock key.
    pub(crate) lock: String,
    /// The exact lock value of the grant.
    value: String,
}

impl From<&Release<'_>> for ReleaseItem {
    fn from(release: &Release<'_>) -> Self {
        ReleaseItem {
            lock: release.lock.to_owned(),
            value: release.value.to_owned(),
        }
    }
}

/// Many releases in one call (`release_many.lua`). On a Cluster all lock
/// keys must share a slot.
#[derive(Debug)]
pub(crate) struct ReleaseMany<'a> {
    pub(crate) items: &'a [ReleaseItem],
}

impl ToRedisArgs for ReleaseMany<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        for item in self.items {
            out.write_arg(item.value.as_bytes());
        }
    }

    fn num_of_args(&self) -> usize {
        self.items.len()
    }
}

impl ScriptCall for ReleaseMany<'_> {
    type Reply = Vec<Batched<Checked>>;

    fn script(&self) -> &'static Lua {
        &scripts::RELEASE_MANY
    }

    fn keys(&self) -> Keys<'_> {
        Keys::Many(self.items.iter().map(|item| item.lock.as_str()).collect())
    }
}

impl FromRedisValue for Batched<Checked> {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match i64::from_redis_value(v)? {
            2 => Ok(Batched::Alone),
            code => Checked::from_redis_value(Value::Int(code)).map(Batched::Done),
        }
    }
}
