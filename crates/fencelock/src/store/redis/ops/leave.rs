//! Leave: a waiter gives up its place in the queue, passing on a lock
//! handed over to it meanwhile (`leave.lua`).

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Keys, Mint, PassOn, ScriptCall};
use crate::keys::LockKeys;
use crate::store::redis::scripts::{self, Lua};
use crate::store::redis::wire::QueueMember;

/// A waiter gives up its place (`leave.lua`).
#[derive(Debug)]
pub(crate) struct Leave<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) mint: Mint,
    pub(crate) pass_on: PassOn,
    pub(crate) member: &'a QueueMember,
}

impl ToRedisArgs for Leave<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.pass_on.write_with(&self.mint, out);
        out.write_arg_fmt(self.member);
        out.write_arg(self.member.token.as_bytes());
    }
}

impl ScriptCall for Leave<'_> {
    type Reply = LeaveReply;

    fn script(&self) -> &'static Lua {
        &scripts::LEAVE
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.keys.lock()])
    }
}

/// What a leave found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaveReply {
    /// The waiter was not queued (any more).
    NotQueued,
    /// It was queued and has left.
    Left,
    /// The lock had been handed over to it; it was released (and passed on).
    ReleasedHandOver,
}

impl FromRedisValue for LeaveReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match i64::from_redis_value(v)? {
            0 => Ok(LeaveReply::NotQueued),
            1 => Ok(LeaveReply::Left),
            2 => Ok(LeaveReply::ReleasedHandOver),
            other => Err(format!("leave returned the unknown code {other}").into()),
        }
    }
}
