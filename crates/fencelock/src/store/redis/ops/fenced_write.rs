//! Fenced write: a write or a fence registration on a Redis hash resource,
//! accepted by the fence rule in `fenced_write.lua`, on the hash's own
//! (fence, holder) pair or on the pair of one slot ([`SlotWrite`]).

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

impl<'a> FencedWrite<'a> {
    /// This write on the (fence, holder) pair of `slot` (fields
    /// `fence:SLOT`, `holder:SLOT`, `value:SLOT`), or, with `None`, on the
    /// hash's own fields, sending exactly the arguments of the plain write.
    pub(crate) fn in_slot(self, slot: Option<u32>) -> SlotWrite<'a> {
        SlotWrite { write: self, slot }
    }
}

/// A [`FencedWrite`] on one slot's pair of the hash (a semaphore's
/// permits each fence their own slot), or on the hash's own pair.
#[derive(Debug)]
pub(crate) struct SlotWrite<'a> {
    write: FencedWrite<'a>,
    slot: Option<u32>,
}

impl ToRedisArgs for SlotWrite<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.write.write_redis_args(out);
        // ARGV[5] only for a slot: a plain write sends the four arguments
        // it always sent, so the mutex's hot path carries nothing extra.
        if let Some(slot) = self.slot {
            out.write_arg_fmt(slot);
        }
    }
}

impl ScriptCall for SlotWrite<'_> {
    type Reply = FencedWriteReply;

    fn script(&self) -> &'static Lua {
        self.write.script()
    }

    fn keys(&self) -> Keys<'_> {
        self.write.keys()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(call: &impl ToRedisArgs) -> Vec<Vec<u8>> {
        call.to_redis_args()
    }

    fn write() -> FencedWrite<'static> {
        FencedWrite {
            key: "doc",
            fence: Fence::new(150),
            holder: "tok",
            change: Change::Write("v"),
        }
    }

    #[test]
    fn a_plain_write_sends_the_same_arguments_with_or_without_the_slot_wrapper() {
        assert_eq!(args(&write().in_slot(None)), args(&write()));
        assert_eq!(args(&write()).len(), 4);
    }

    #[test]
    fn a_slot_write_adds_the_slot_in_canonical_decimal() {
        let sent = args(&write().in_slot(Some(u32::MAX)));
        assert_eq!(sent.len(), 5);
        assert_eq!(sent[..4], args(&write())[..]);
        assert_eq!(sent[4], b"4294967295".to_vec());
        assert_eq!(args(&write().in_slot(Some(0)))[4], b"0".to_vec());
    }
}
