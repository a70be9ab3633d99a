//! The lock operations as typed calls and replies: the one place where the
//! arguments of a script are encoded and its reply decoded.
//!
//! Each call is a struct that writes its ARGV in the order its `.lua` file
//! unpacks them ([`ToRedisArgs`]) and names its KEYS and its script
//! ([`ScriptCall`]); each reply is a type that decodes what the script
//! returns ([`FromRedisValue`]). Nothing outside this module builds a
//! script's arguments or reads its raw reply.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::scripts::{self, Lua};
use super::wire::QueueMember;
use crate::error::LossReason;
use crate::fence::Fence;
use crate::keys::{KeyLayout, LockKeys};
use crate::options::{FENCE_RETENTION, FenceMode, LockOptions, STARVATION_THRESHOLD, WaitMode};

/// A script call: its script, its KEYS, and (through [`ToRedisArgs`]) its
/// ARGV.
pub(crate) trait ScriptCall: ToRedisArgs {
    /// What the script returns.
    type Reply: FromRedisValue;

    /// The script this call runs.
    fn script(&self) -> &'static Lua;

    /// The keys it touches, in the script's KEYS order (the first one picks
    /// the Cluster slot; the others share it).
    fn keys(&self) -> Vec<&str>;

    /// Whether the call is sent behind a `PING`, in the same write, so that
    /// a waiter it wakes is answered before the caller (see
    /// [`Release::wake_first`]).
    fn wake_first(&self) -> bool {
        false
    }
}

/// How fences are minted for a name: ARGV 1-3 of every call that may grant
/// (a release or a leave can hand the lock over to the next waiter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mint {
    mode: FenceMode,
    layout: KeyLayout,
    /// How long the fence key is kept after a grant (zero: forever).
    retention: Duration,
}

impl Mint {
    pub(crate) fn new(opts: &LockOptions) -> Self {
        let retention = match (opts.fence_mode, opts.layout) {
            (FenceMode::Clock, KeyLayout::HashTagged) => {
                FENCE_RETENTION.max(opts.ttl.saturating_mul(2))
            }
            // The guide's Python workers INCR the fence key: it must never expire.
            _ => Duration::ZERO,
        };
        Mint {
            mode: opts.fence_mode,
            layout: opts.layout,
            retention,
        }
    }

    /// One argument (each costs Redis time): mode, format, retention, as
    /// `prelude.lua` reads them (`ct86400000`).
    fn write<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mode = match self.mode {
            FenceMode::Clock => 'c',
            _ => 'n',
        };
        let format = match self.layout {
            KeyLayout::HashTagged => 't',
            _ => 'b',
        };
        out.write_arg_fmt(format_args!("{mode}{format}{}", self.retention.as_millis()));
    }
}

/// The command that publishes wake-ups: `PUBLISH`, or `SPUBLISH` (sharded
/// pub/sub) on Redis Cluster, where the wake channel shares the lock's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    Publish,
    SPublish,
}

/// What a release or a leave needs to pass a free lock on to the head
/// waiter: ARGV[2] of those scripts, the publish command and the starvation
/// threshold in µs (the wake channels are the lock key's `:wake:`
/// channels, derived in the script).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassOn {
    pub(crate) publish: Publish,
}

impl PassOn {
    fn write<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let publish = match self.publish {
            Publish::Publish => "PUBLISH",
            Publish::SPublish => "SPUBLISH",
        };
        out.write_arg_fmt(format_args!(
            "{publish} {}",
            STARVATION_THRESHOLD.as_micros()
        ));
    }
}

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
        out.write_arg_fmt(self.ttl.as_millis());
        out.write_arg(self.wait_mode.as_arg().as_bytes());
        // The queue arguments only for an attempt that may queue.
        if let Some(member) = self.member {
            out.write_arg_fmt(member);
            out.write_arg_fmt(self.waiter_lease.as_millis());
            out.write_arg(if self.queued { b"1" } else { b"0" });
        }
    }
}

impl ScriptCall for Grant<'_> {
    type Reply = GrantReply;

    fn script(&self) -> &'static Lua {
        &scripts::GRANT
    }

    fn keys(&self) -> Vec<&str> {
        vec![&self.keys.lock]
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
    /// common case `grant_fast.lua` handles (clock fences, not fair), for a
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
    mint: Mint,
    token: String,
    ttl: Duration,
}

impl From<&Grant<'_>> for GrantItem {
    fn from(grant: &Grant<'_>) -> Self {
        GrantItem {
            lock: grant.keys.lock.clone(),
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
            out.write_arg_fmt(item.ttl.as_millis());
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

    fn keys(&self) -> Vec<&str> {
        self.items.iter().map(|item| item.lock.as_str()).collect()
    }
}

/// What a batch script did with one of its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Batched<R> {
    /// Settled: the reply the item's own script would have given.
    Done(R),
    /// Not settled, and nothing written for it: it goes alone, through its
    /// own script.
    Alone,
    /// Failed with this server error (`CODE detail`).
    Failed(String),
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

    fn keys(&self) -> Vec<&str> {
        self.items.iter().map(|item| item.lock.as_str()).collect()
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
        self.mint.write(out);
        self.pass_on.write(out);
        out.write_arg(self.value.as_bytes());
    }
}

impl ScriptCall for Release<'_> {
    type Reply = Checked;

    fn script(&self) -> &'static Lua {
        &scripts::RELEASE
    }

    fn keys(&self) -> Vec<&str> {
        vec![self.lock]
    }

    fn wake_first(&self) -> bool {
        self.wake_first
    }
}

/// Compare-and-pexpire (`extend.lua`).
#[derive(Debug)]
pub(crate) struct Extend<'a> {
    pub(crate) key: &'a str,
    /// The exact lock value of the grant.
    pub(crate) value: &'a str,
    pub(crate) ttl: Duration,
}

impl ToRedisArgs for Extend<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.value.as_bytes());
        out.write_arg_fmt(self.ttl.as_millis());
    }
}

impl ScriptCall for Extend<'_> {
    type Reply = Checked;

    fn script(&self) -> &'static Lua {
        &scripts::EXTEND
    }

    fn keys(&self) -> Vec<&str> {
        vec![self.key]
    }
}

/// Compare-and-pexpire of many leases of one ttl in one call
/// (`extend_many.lua`): the keeper's batched renewal. On a Cluster all keys
/// must share a slot.
#[derive(Debug)]
pub(crate) struct ExtendMany<'a> {
    /// `(lock key, exact lock value)` of each lease.
    pub(crate) leases: &'a [(&'a str, &'a str)],
    pub(crate) ttl: Duration,
}

impl ToRedisArgs for ExtendMany<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self.ttl.as_millis());
        for (_, value) in self.leases {
            out.write_arg(value.as_bytes());
        }
    }

    fn num_of_args(&self) -> usize {
        1 + self.leases.len()
    }
}

impl ScriptCall for ExtendMany<'_> {
    type Reply = NotExtended;

    fn script(&self) -> &'static Lua {
        &scripts::EXTEND_MANY
    }

    fn keys(&self) -> Vec<&str> {
        self.leases.iter().map(|(key, _)| *key).collect()
    }
}

/// The reply of [`ExtendMany`]: the leases it did not extend (1-based
/// index, why); every other lease was extended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotExtended(pub(crate) Vec<(usize, Checked)>);

impl NotExtended {
    /// One code per lease of a call that renewed `n` leases, in order.
    pub(crate) fn per_lease(self, n: usize) -> Result<Vec<Checked>, ParsingError> {
        let mut codes = vec![Checked::Done; n];
        for (i, code) in self.0 {
            let slot = i
                .checked_sub(1)
                .and_then(|i| codes.get_mut(i))
                .ok_or_else(|| format!("a batched renewal of {n} leases named lease {i}"))?;
            *slot = code;
        }
        Ok(codes)
    }
}

impl FromRedisValue for NotExtended {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let flat: Vec<i64> = FromRedisValue::from_redis_value(v)?;
        if !flat.len().is_multiple_of(2) {
            return Err("a batched renewal returned an odd number of fields".into());
        }
        flat.chunks_exact(2)
            .map(|pair| {
                let i = usize::try_from(pair[0])
                    .map_err(|_| format!("a batched renewal named lease {}", pair[0]))?;
                match Checked::from_redis_value(Value::Int(pair[1]))? {
                    // Listed means not extended.
                    Checked::Done => Err("a batched renewal listed a lease it extended".into()),
                    code => Ok((i, code)),
                }
            })
            .collect::<Result<_, ParsingError>>()
            .map(NotExtended)
    }
}

/// The reply of an ownership-checked call (release, extend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The lock was ours; the call did its work.
    Done,
    /// The lock was not ours; nothing was changed.
    NotOurs(LossReason),
}

impl FromRedisValue for Checked {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match i64::from_redis_value(v)? {
            1 => Ok(Checked::Done),
            0 => Ok(Checked::NotOurs(LossReason::Expired)),
            -1 => Ok(Checked::NotOurs(LossReason::TakenOver)),
            other => Err(format!("an ownership check returned the unknown code {other}").into()),
        }
    }
}

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
        self.mint.write(out);
        self.pass_on.write(out);
        out.write_arg_fmt(self.member);
        out.write_arg(self.member.token.as_bytes());
    }
}

impl ScriptCall for Leave<'_> {
    type Reply = LeaveReply;

    fn script(&self) -> &'static Lua {
        &scripts::LEAVE
    }

    fn keys(&self) -> Vec<&str> {
        vec![&self.keys.lock]
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

/// An atomic snapshot of a lock (`inspect.lua`).
#[derive(Debug)]
pub(crate) struct Inspect<'a> {
    pub(crate) keys: &'a LockKeys,
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

    fn keys(&self) -> Vec<&str> {
        vec![&self.keys.lock, &self.keys.fence]
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

/// What a fenced write does to the resource when accepted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change<'a> {
    /// Set the value (and record the fence and holder).
    Write(&'a str),
    /// Record only the fence and holder.
    Register,
}

impl Change<'_> {
    /// `write` or `register`, for logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Change::Write(_) => "write",
            Change::Register => "register",
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
            Change::Register => b"",
        });
    }
}

impl ScriptCall for FencedWrite<'_> {
    type Reply = FencedWriteReply;

    fn script(&self) -> &'static Lua {
        &scripts::FENCED_WRITE
    }

    fn keys(&self) -> Vec<&str> {
        vec![self.key]
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
mod tests;
