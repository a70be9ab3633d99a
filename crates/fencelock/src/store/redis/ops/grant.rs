//! Grant: one attempt (`grant_free.lua`, `grant_fast.lua`, then `grant.lua`), and many
//! callers' common-case attempts in one call (`grant_many.lua`, the
//! coalescer's batches).

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Batched, Keys, Mint, ScriptCall, write_millis};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::options::{FenceMode, WaitMode};
use crate::store::redis::scripts::{self, Lua};
use crate::store::redis::wire::QueueMember;

/// One grant attempt (`grant.lua`).
#[derive(Debug)]
pub(crate) struct Grant<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) mint: Mint,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) wait_mode: WaitMode,
    /// The caller's place in the wait queue, if it waits there.
    pub(crate) member: Option<&'a QueueMember>,
    pub(crate) waiter_lease: Duration,
    /// An earlier attempt of this acquisition may have queued the caller.
    pub(crate) queued: bool,
}

impl ToRedisArgs for Grant<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.mint.write(out);
        out.write_arg(self.token.as_bytes());
        write_millis(out, self.ttl);
        out.write_arg(self.wait_mode.as_arg().as_bytes());
        // The queue arguments only for an attempt that may queue.
        if let Some(member) = self.member {
            out.write_arg_fmt(member);
            write_millis(out, self.waiter_lease);
            out.write_arg(if self.queued { b"1" } else { b"0" });
        }
    }
}

impl ScriptCall for Grant<'_> {
    type Reply = GrantReply;

    fn script(&self) -> &'static Lua {
        &scripts::GRANT
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.keys.lock()])
    }
}

/// What a grant attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantReply {
    /// Granted with this fence (a retry with the same token gets the same
    /// grant back).
    Granted(Fence),
    /// Held by another holder, whose lease ends in `remaining` (if known).
    Held {
        /// The holder's time left.
        remaining: Option<Duration>,
        /// The fence stored when the attempt was refused (`grant.lua`; a
        /// batch does not say). A hand-over to this waiter minted a higher
        /// fence only if it happened after this attempt (fences only
        /// grow), so a wake-up whose fence is higher is not a stale one
        /// from before it.
        seen: Option<u64>,
    },
    /// Free, but reserved for the head of a fair queue.
    ReservedForHead {
        /// As for [`GrantReply::Held`].
        seen: Option<u64>,
    },
}

impl FromRedisValue for GrantReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        // Granted: the fence alone (`grant.lua`).
        if let Value::Int(fence) = v {
            return GrantReply::from_code(1, fence, None);
        }
        let mut fields: Vec<Value> = FromRedisValue::from_redis_value(v)?;
        if !(2..=3).contains(&fields.len()) {
            return Err(format!("grant returned {} fields, not 2 or 3", fields.len()).into());
        }
        // The fence stored at a refusal (grant.lua; absent from a batch).
        let seen = match (fields.len() == 3).then(|| fields.pop()).flatten() {
            None | Some(Value::Nil) => None,
            Some(last) => Some(u64::from_redis_value(last)?),
        };
        let (code, n): (i64, i64) = FromRedisValue::from_redis_value(Value::Array(fields))?;
        GrantReply::from_code(code, n, seen)
    }
}

impl GrantReply {
    /// The reply a grant script gave as `code`, `n` (and the fence `seen`
    /// stored at a refusal).
    fn from_code(code: i64, n: i64, seen: Option<u64>) -> Result<Self, ParsingError> {
        match code {
            1 => u64::try_from(n)
                .map(|f| GrantReply::Granted(Fence::new(f)))
                .map_err(|_| format!("grant returned the negative fence {n}").into()),
            0 => Ok(GrantReply::Held {
                remaining: u64::try_from(n).ok().map(Duration::from_millis),
                seen,
            }),
            2 => Ok(GrantReply::ReservedForHead { seen }),
            other => Err(format!("grant returned the unknown code {other}").into()),
        }
    }
}

impl Grant<'_> {
    /// Whether `grant_many.lua` may settle this attempt in a batch: the
    /// common case `grant_free.lua` handles (clock fences, not fair), for a
    /// caller with no queue member, whose refusal writes nothing (a caller
    /// that queues when refused goes alone, through `grant.lua`).
    pub(crate) fn batchable(&self) -> bool {
        self.mint.mode == FenceMode::Clock
            && self.wait_mode != WaitMode::Fair
            && self.member.is_none()
    }
}

/// One grant waiting in a batch (owned: it outlives its caller's borrow
/// while it waits for the batch call): what `grant_many.lua` needs of it.
#[derive(Debug, Clone)]
pub(crate) struct GrantItem {
    /// The lock key.
    pub(crate) lock: String,
    pub(crate) mint: Mint,
    pub(crate) token: String,
    ttl: Duration,
}

impl From<&Grant<'_>> for GrantItem {
    fn from(grant: &Grant<'_>) -> Self {
        GrantItem {
            lock: grant.keys.lock().to_owned(),
            mint: grant.mint,
            token: grant.token.to_owned(),
            ttl: grant.ttl,
        }
    }
}

/// Many batchable grants ([`Grant::batchable`]) in one call
/// (`grant_many.lua`). On a Cluster all lock keys must share a slot.
#[derive(Debug)]
pub(crate) struct GrantMany<'a> {
    pub(crate) items: &'a [GrantItem],
    /// The script: `GRANT_MANY`, or a deliberately broken variant of it
    /// (feature `testing`: the negative controls of the batch tests).
    pub(crate) script: &'static Lua,
}

impl ToRedisArgs for GrantMany<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        for item in self.items {
            item.mint.write(out);
            out.write_arg(item.token.as_bytes());
            write_millis(out, item.ttl);
        }
    }

    fn num_of_args(&self) -> usize {
        3 * self.items.len()
    }
}

impl ScriptCall for GrantMany<'_> {
    type Reply = BatchedGrants;

    fn script(&self) -> &'static Lua {
        self.script
    }

    fn keys(&self) -> Keys<'_> {
        Keys::Many(self.items.iter().map(|item| item.lock.as_str()).collect())
    }
}

/// The replies of a batched grant, one per item, in order.
///
/// `grant_many.lua` answers each item with a `code, n` pair and returns
/// all the pairs in one flat array: a nested pair per item would cost Redis
/// a Lua table for each (measured: about 0.45 µs per item, a tenth of a
/// batch of 16).
#[derive(Debug)]
pub(crate) struct BatchedGrants(pub(crate) Vec<Batched<GrantReply>>);

impl FromRedisValue for BatchedGrants {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let flat: Vec<Value> = FromRedisValue::from_redis_value(v)?;
        if !flat.len().is_multiple_of(2) {
            return Err(format!(
                "a batched grant returned {} values, not code and value pairs",
                flat.len()
            )
            .into());
        }
        let mut replies = Vec::with_capacity(flat.len() / 2);
        let mut values = flat.into_iter();
        while let (Some(code), Some(n)) = (values.next(), values.next()) {
            replies.push(match i64::from_redis_value(code)? {
                code @ (0 | 1) => Batched::Done(GrantReply::from_code(
                    code,
                    i64::from_redis_value(n)?,
                    None,
                )?),
                3 => Batched::Alone,
                4 => Batched::Failed(String::from_redis_value(n)?),
                other => {
                    return Err(format!("a batched grant returned the unknown code {other}").into());
                }
            });
        }
        Ok(BatchedGrants(replies))
    }
}
