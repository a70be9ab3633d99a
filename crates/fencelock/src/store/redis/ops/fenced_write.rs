//! Fenced write: a write or a fence registration on a Redis hash resource,
//! accepted by the fence rule in `fenced_write.lua`.

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Keys, ScriptCall};
use crate::fence::Fence;
use crate::store::redis::scripts::{self, Lua};

/// What a fenced write does to the resource when accepted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change<'a> {
    /// Set the value (and record the fence and holder).
    Write(&'a str),
    /// Record only the fence and holder.
    Register,
    /// Record the fence with the holder [`REVOKED_HOLDER`](crate::REVOKED_HOLDER),
    /// also over an equal fence (a revoke's seal).
    Seal,
}

impl Change<'_> {
    /// `write` or `register`, for logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Change::Write(_) => "write",
            Change::Register => "register",
            Change::Seal => "seal",
        }
    }
}

/// A fenced write or registration on a Redis hash (`fenced_write.lua`).
#[derive(Debug)]
pub(crate) struct FencedWrite<'a> {
    pub(crate) key: &'a str,
    pub(crate) fence: Fence,
    pub(crate) holder: &'a str,
    pub(crate) change: Change<'a>,
}

impl ToRedisArgs for FencedWrite<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self.fence);
        out.write_arg(self.holder.as_bytes());
        out.write_arg(self.change.name().as_bytes());
        out.write_arg(match self.change {
            Change::Write(value) => value.as_bytes(),
            Change::Register | Change::Seal => b"",
        });
    }
}

impl ScriptCall for FencedWrite<'_> {
    type Reply = FencedWriteReply;

    fn script(&self) -> &'static Lua {
        &scripts::FENCED_WRITE
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.key])
    }
}

/// What a fenced write found: accepted or not, and the fence and holder the
/// resource held before the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FencedWriteReply {
    pub(crate) accepted: bool,
    pub(crate) stored_fence: Option<String>,
    pub(crate) stored_holder: Option<String>,
}

impl FromRedisValue for FencedWriteReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (accepted, stored_fence, stored_holder): (i64, Option<String>, Option<String>) =
            FromRedisValue::from_redis_value(v)?;
        Ok(FencedWriteReply {
            accepted: accepted == 1,
            stored_fence,
            stored_holder,
        })
    }
}
