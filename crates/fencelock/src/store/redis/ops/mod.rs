//! The lock operations as typed calls and replies: the one place where the
//! arguments of a script are encoded and its reply decoded, one file per
//! operation with its call, its reply and its batch item (the script is the
//! `.lua` file of the same name under `scripts/`).
//!
//! Each call is a struct that writes its ARGV in the order its `.lua` file
//! unpacks them ([`ToRedisArgs`]) and names its KEYS and its script
//! ([`ScriptCall`]); each reply is a type that decodes what the script
//! returns ([`FromRedisValue`]). Nothing outside this module builds a
//! script's arguments or reads its raw reply.
//!
//! | file | operation | script |
//! |---|---|---|
//! | `grant.rs` | [`Grant`], its reply, and the batch of many ([`GrantMany`]) | `grant_free.lua` + `grant_fast.lua` + `grant.lua`; `grant_many.lua` |
//! | `release.rs` | [`Release`] and [`ReleaseMany`] | `release_free.lua` + `release_fast.lua` + `release.lua`; `release_many.lua` |
//! | `extend.rs` | [`Extend`] and [`ExtendMany`] (the keeper's batch) | `extend.lua`; `extend_many.lua` |
//! | `leave.rs` | [`Leave`]: a waiter gives up its place | `leave.lua` |
//! | `revoke.rs` | [`Revoke`]: depose the holder, mint the revocation fence | `revoke.lua` |
//! | `inspect.rs` | [`Inspect`]: a snapshot of a lock | `inspect.lua` |
//! | `semaphore.rs` | permits: a fenced semaphore's slots and a read-write lock's reader and writer: [`PermitGrant`], [`SemRelease`] (also a waiter leaving), [`SemExtend`] (one or many permits), [`SemInspect`] | `sem_grant.lua` and `rw_grant.lua`, `sem_release.lua`, `sem_extend.lua`, `sem_inspect.lua` |
//! | `fenced_write.rs` | [`FencedWrite`]: a fenced write to a Redis hash | `fenced_write.lua` |
//!
//! This file holds what several of them share: the [`ScriptCall`] trait,
//! how fences are minted ([`Mint`]), how a free lock is passed on
//! ([`PassOn`]), and what a batch did with one item ([`Batched`]).

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::scripts::Lua;
use crate::error::LossReason;
use crate::keys::KeyLayout;
use crate::options::{FENCE_RETENTION, FenceMode, LockOptions, STARVATION_THRESHOLD};
use crate::store::Checked;

mod extend;
mod fenced_write;
mod grant;
mod inspect;
mod leave;
mod release;
mod revoke;
mod semaphore;

pub(crate) use extend::{Extend, ExtendMany, NotExtended};
pub(crate) use fenced_write::{Change, FencedWrite};
pub(crate) use grant::{Grant, GrantItem, GrantMany, GrantReply};
pub(crate) use inspect::Inspect;
pub(crate) use leave::Leave;
pub(crate) use release::{Release, ReleaseItem, ReleaseMany};
pub(crate) use revoke::Revoke;
pub(crate) use semaphore::{
    PermitField, PermitGrant, PermitGrantReply, PermitKind, PermitRef, SemExtend, SemInspect,
    SemLeaving, SemRelease, SlotEntry,
};

/// A script call: its script, its KEYS, and (through [`ToRedisArgs`]) its
/// ARGV.
pub(crate) trait ScriptCall: ToRedisArgs {
    /// What the script returns.
    type Reply: FromRedisValue;

    /// The script this call runs.
    fn script(&self) -> &'static Lua;

    /// The keys it touches, in the script's KEYS order (the first one picks
    /// the Cluster slot; the others share it).
    fn keys(&self) -> Keys<'_>;

    /// Whether the call is sent behind a `PING`, in the same write, so that
    /// a waiter it wakes is answered before the caller (see
    /// [`Release::wake_first`]).
    fn wake_first(&self) -> bool {
        false
    }
}

/// The KEYS of a call: one or two without an allocation (every call on one
/// lock), or many (a batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Keys<'a> {
    One([&'a str; 1]),
    Two([&'a str; 2]),
    Many(Vec<&'a str>),
}

impl<'a> std::ops::Deref for Keys<'a> {
    type Target = [&'a str];

    fn deref(&self) -> &[&'a str] {
        match self {
            Keys::One(keys) => keys,
            Keys::Two(keys) => keys,
            Keys::Many(keys) => keys,
        }
    }
}

/// How fences are minted for a name: ARGV[1] of every call that may grant
/// (a release or a leave can hand the lock over to the next waiter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mint {
    pub(super) mode: FenceMode,
    layout: KeyLayout,
    /// How long the fence key is kept after a grant (zero: forever).
    retention: Duration,
}

impl Mint {
    /// The key layout whose lock value format it writes.
    pub(crate) fn layout(&self) -> KeyLayout {
        self.layout
    }

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

    /// The longest argument [`Mint::write_into`] makes.
    const MAX_LEN: usize = 2 + 20;

    /// One argument (each costs Redis time): mode, format, retention, as
    /// `prelude.lua` reads them (`ct86400000`).
    pub(super) fn write<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = [0u8; Mint::MAX_LEN];
        let len = self.write_into(&mut arg);
        out.write_arg(&arg[..len]);
    }

    /// Writes the argument to the start of `arg` (at least
    /// [`Mint::MAX_LEN`] long); returns its length.
    fn write_into(&self, arg: &mut [u8]) -> usize {
        arg[0] = match self.mode {
            FenceMode::Clock => b'c',
            _ => b'n',
        };
        arg[1] = match self.layout {
            KeyLayout::HashTagged => b't',
            _ => b'b',
        };
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(millis(self.retention)).as_bytes();
        arg[2..2 + digits.len()].copy_from_slice(digits);
        2 + digits.len()
    }
}

/// The command that publishes wake-ups: `PUBLISH`, or `SPUBLISH` (sharded
/// pub/sub) on Redis Cluster, where the wake channel shares the lock's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    Publish,
    SPublish,
}

/// What a release, a leave or a revoke needs to pass a free lock on to the
/// head waiter: the publish command and the starvation threshold in µs (the
/// wake channels are the lock key's `:wake:` channels, derived in the
/// script). Written into the mint's argument ([`PassOn::write_with`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassOn {
    pub(crate) publish: Publish,
}

impl PassOn {
    /// ARGV[1] of the scripts that pass a lock on: `mint`, a space, the
    /// publish command, a space and the starvation threshold in µs
    /// (`ct86400000 PUBLISH 10000`). One argument, not two: each argument
    /// costs Redis some 1,000 to 1,700 instructions (measured on Redis 7.0),
    /// about as much as a call to Redis from the script, and a release, the
    /// most common of these calls, needs the pass-on only when someone
    /// waits.
    pub(super) fn write_with<W: ?Sized + RedisWrite>(&self, mint: &Mint, out: &mut W) {
        let publish = match self.publish {
            Publish::Publish => "PUBLISH",
            Publish::SPublish => "SPUBLISH",
        };
        let mut arg = [0u8; Mint::MAX_LEN + 1 + 8 + 1 + 20];
        let mut len = mint.write_into(&mut arg);
        for part in [
            b" ".as_slice(),
            publish.as_bytes(),
            b" ",
            itoa::Buffer::new()
                .format(u64::try_from(STARVATION_THRESHOLD.as_micros()).unwrap_or(u64::MAX))
                .as_bytes(),
        ] {
            arg[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        out.write_arg(&arg[..len]);
    }
}

/// `d` in whole milliseconds, as the scripts read durations.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Writes `d` as one argument in whole milliseconds. Integers are written
/// through `itoa` (as redis-rs writes its own), not the formatting
/// machinery, which costs several times more on every call.
pub(super) fn write_millis<W: ?Sized + RedisWrite>(out: &mut W, d: Duration) {
    out.write_arg(itoa::Buffer::new().format(millis(d)).as_bytes());
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

#[cfg(test)]
mod tests;
