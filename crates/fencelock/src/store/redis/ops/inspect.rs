//! Inspect: an atomic snapshot of a lock, its lease time left and its last
//! fence (`inspect.lua`).

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Keys, ScriptCall};
use crate::keys::LockKeys;
use crate::store::redis::scripts::{self, Lua};

/// An atomic snapshot of a lock (`inspect.lua`).
#[derive(Debug)]
pub(crate) struct Inspect<'a> {
    lock: &'a str,
    fence: String,
}

impl<'a> Inspect<'a> {
    /// The snapshot of lock `keys`.
    pub(crate) fn of(keys: &'a LockKeys) -> Self {
        Inspect {
            lock: keys.lock(),
            fence: keys.fence(),
        }
    }
}

impl ToRedisArgs for Inspect<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, _out: &mut W) {}

    fn num_of_args(&self) -> usize {
        0
    }
}

impl ScriptCall for Inspect<'_> {
    type Reply = InspectReply;

    fn script(&self) -> &'static Lua {
        &scripts::INSPECT
    }

    fn keys(&self) -> Keys<'_> {
        Keys::Two([self.lock, &self.fence])
    }
}

/// The raw state of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InspectReply {
    /// The lock value, if held.
    pub(crate) value: Option<String>,
    /// Lease time left, if held with an expiry.
    pub(crate) remaining: Option<Duration>,
    /// The fence key's value, if it exists.
    pub(crate) last_fence: Option<String>,
}

impl FromRedisValue for InspectReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (value, pttl, last_fence): (Option<String>, i64, Option<String>) =
            FromRedisValue::from_redis_value(v)?;
        Ok(InspectReply {
            value,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            last_fence,
        })
    }
}
