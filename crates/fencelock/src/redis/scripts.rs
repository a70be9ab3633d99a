//! The Lua scripts. Each `.lua` file documents its KEYS, ARGV and replies.
//!
//! `redis::Script` computes the SHA once; calls use `EVALSHA` and fall back to
//! `SCRIPT LOAD` on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover),
//! so a flushed script cache is never mistaken for "not held".

use std::sync::LazyLock;

use redis::Script;

/// Grant (lock + fence in one atomic step), release (compare-and-delete, then
/// hand over or wake the next waiter) and leave (a waiter gives up).
pub(crate) static LOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/lock.lua")));

/// Compare-and-pexpire.
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/extend.lua")));

/// Fenced write / fence registration on a Redis hash resource.
pub(crate) static FENCED_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fenced_write.lua")));

/// Atomic snapshot of a lock for status.
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));
