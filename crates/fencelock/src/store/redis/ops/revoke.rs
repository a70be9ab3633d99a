//! Revoke: depose whoever holds a lock, mint the revocation fence, and pass
//! the lock on (`revoke.lua`).

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Keys, Mint, PassOn, ScriptCall};
use crate::store::redis::scripts::{self, Lua};

/// A revoke of one lock (`revoke.lua`).
#[derive(Debug)]
pub(crate) struct Revoke<'a> {
    /// The lock key (the script derives the others from it).
    pub(crate) lock: &'a str,
    pub(crate) mint: Mint,
    pub(crate) pass_on: PassOn,
}

impl ToRedisArgs for Revoke<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.pass_on.write_with(&self.mint, out);
    }

    fn num_of_args(&self) -> usize {
        2
    }
}

impl ScriptCall for Revoke<'_> {
    type Reply = RevokeReply;

    fn script(&self) -> &'static Lua {
        &scripts::REVOKE
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.lock])
    }
}

/// What a revoke did: the revocation fence, and whom it deposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RevokeReply {
    /// The revocation fence, as stored (without the options' epoch).
    pub(crate) fence: u64,
    /// The deposed holder's public id; `None` when the lock was free.
    pub(crate) holder: Option<String>,
    /// The deposed holder's fence (without the epoch), when known.
    pub(crate) held_fence: Option<u64>,
}

impl FromRedisValue for RevokeReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (fence, holder, held_fence): (String, Option<String>, Option<String>) =
            FromRedisValue::from_redis_value(v)?;
        let number = |text: &str| {
            text.parse::<u64>()
                .map_err(|_| ParsingError::from(format!("revoke replied fence {text:?}")))
        };
        Ok(RevokeReply {
            fence: number(&fence)?,
            holder,
            held_fence: held_fence.as_deref().map(number).transpose()?,
        })
    }
}
