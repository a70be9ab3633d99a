//! The Lua scripts, one per operation. Each `.lua` file documents its KEYS,
//! ARGV and replies; the helpers are prepended at compile time.
//!
//! | script | runs | made of |
//! |---|---|---|
//! | [`GRANT`] | one grant attempt | `fence_clock.lua`, `grant_free.lua` (a free lock, first), `fast_helpers.lua`, `grant_fast.lua` (a refusal), then `common.lua`, `prelude.lua`, `grant.lua` |
//! | [`GRANT_MANY`] | many callers' common-case grants in one call (the coalescer's batches) | `fence_clock.lua`, `fast_helpers.lua`, `grant_many.lua` |
//! | [`RELEASE`] | compare-and-delete, hand-over or wake-up | `release_free.lua` (nobody waits, first), `fence_clock.lua`, `fast_helpers.lua`, `release_fast.lua` (a wake-up or hand-over), then `common.lua`, `prelude.lua`, `release.lua` |
//! | [`RELEASE_MANY`] | many releases in one call | `release_many.lua` |
//! | [`REVOKE`] | a revoke: depose the holder, mint and store the revocation fence, pass the lock on | `fence_clock.lua`, `fast_helpers.lua`, `common.lua`, `prelude.lua`, `revoke.lua` |
//! | [`LEAVE`] | a waiter gives up its place | `fence_clock.lua`, `fast_helpers.lua`, `common.lua`, `prelude.lua`, `leave.lua` |
//! | [`EXTEND`], [`EXTEND_MANY`] | compare-and-pexpire, of one lease or a batch | `common.lua`, `extend.lua` / `extend_many.lua` |
//! | [`FENCED_WRITE`] | a fenced write to a Redis hash | `common.lua`, `fenced_write.lua` |
//! | [`SEM_GRANT`], [`SEM_RELEASE`] | a semaphore's grant of one slot; its release, or a waiter leaving | `fence_clock.lua`, `fast_helpers.lua`, `common.lua`, `prelude.lua`, `sem_grant.lua` / `sem_release.lua` |
//! | [`RW_GRANT`] | a read-write lock's grant of a reader or a writer (released, renewed and inspected as a semaphore's permits) | `fence_clock.lua`, `fast_helpers.lua`, `common.lua`, `prelude.lua`, `rw_grant.lua` |
//! | [`SEM_EXTEND`], [`SEM_INSPECT`] | renewal of one or many permits; a snapshot of a semaphore | `common.lua`, `sem_extend.lua` / `sem_inspect.lua` |
//! | [`INSPECT`] | a snapshot of a lock | `common.lua`, `inspect.lua` |
//!
//! `common.lua` has the calls whose errors name the one command or key in
//! the way; `prelude.lua` fence minting and the wait queue, shared by the
//! three scripts that change who holds a lock. Each `local function` is a
//! closure made on every call, about as much Redis work as a call to Redis
//! itself, so the common cases run before those helpers exist and fall
//! through to the full script otherwise: a free lock (`grant_free.lua`)
//! and a release nobody waits for (`release_free.lua`) before any helper
//! but `clock_fence`; a refusal (`grant_fast.lua`), a wake-up or hand-over
//! (`release_fast.lua`) and each item of a batch (`grant_many.lua`) with
//! the three small helpers of `fast_helpers.lua` only. Every script that
//! may mint a fence has `fence_clock.lua`: `clock_fence`, the one place the
//! clock-floored fence `max(last + 1, now)` is written, and the names of
//! the mint argument's bytes. Arguments and Lua library calls cost Redis
//! about as much (see `fence_clock.lua`), so the common paths use few of
//! either: the scripts that pass a lock on read the pass-on from the
//! mint's argument (`ct86400000 PUBLISH 10000`), not one of its own.
//!
//! `redis::Script` computes the SHA once; calls use `EVALSHA` and fall back to
//! `SCRIPT LOAD` on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover),
//! so a flushed script cache is never mistaken for "not held".

use std::sync::LazyLock;

use redis::Script;

/// A script: its source (for `SCRIPT LOAD` when a pipelined `EVALSHA`
/// finds it missing) and the `redis::Script` that knows its SHA.
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) script: Script,
}

impl std::fmt::Debug for Lua {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lua")
            .field("sha", &self.script.get_hash())
            .finish()
    }
}

impl Lua {
    fn new(source: &'static str) -> Self {
        Lua {
            source,
            script: Script::new(source),
        }
    }
}

/// Grant: lock + fence in one atomic step.
pub(crate) static GRANT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/grant_free.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/grant_fast.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/grant.lua")
    ))
});

/// Release: compare-and-delete, then hand over to or wake the next waiter.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/release_free.lua"),
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/release_fast.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/release.lua")
    ))
});

/// Grants of many callers of one client in one call: the common case of
/// each (`grant_fast.lua`'s), the rest sent back to go alone (the
/// coalescer's batches, `super::coalesce`).
pub(crate) static GRANT_MANY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/grant_many.lua")
    ))
});

/// Releases of many leases of one client in one call: compare-and-delete
/// of each when nobody waits, the rest sent back to go alone.
pub(crate) static RELEASE_MANY: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/release_many.lua")));

/// Leave: a waiter gives up its place (and a lock handed to it).
pub(crate) static LEAVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/leave.lua")
    ))
});

/// Revoke: depose whoever holds the lock, mint the revocation fence, and
/// pass the lock on to the head waiter.
pub(crate) static REVOKE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/revoke.lua")
    ))
});

/// A semaphore's grant of one slot, with its fence.
pub(crate) static SEM_GRANT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/sem_grant.lua")
    ))
});

/// A read-write lock's grant of a reader (with its epoch) or a writer
/// (with its fence).
pub(crate) static RW_GRANT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/rw_grant.lua")
    ))
});

/// A permit's compare-and-delete, or a waiter leaving; wakes the first
/// waiters, one per free slot.
pub(crate) static SEM_RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/fence_clock.lua"),
        include_str!("scripts/fast_helpers.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/sem_release.lua")
    ))
});

/// Renewal of one or many permits (compare the slot, move its deadline).
pub(crate) static SEM_EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/common.lua"),
        include_str!("scripts/sem_extend.lua")
    ))
});

/// A snapshot of a semaphore.
pub(crate) static SEM_INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/common.lua"),
        include_str!("scripts/sem_inspect.lua")
    ))
});

/// Compare-and-pexpire.
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/common.lua"),
        include_str!("scripts/extend.lua")
    ))
});

/// Compare-and-pexpire of many leases at once (the keeper's batched tick).
pub(crate) static EXTEND_MANY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/common.lua"),
        include_str!("scripts/extend_many.lua")
    ))
});

/// Fenced write / fence registration on a Redis hash resource.
pub(crate) static FENCED_WRITE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/common.lua"),
        include_str!("scripts/fenced_write.lua")
    ))
});

/// Atomic snapshot of a lock for status.
pub(crate) static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/common.lua"),
        include_str!("scripts/inspect.lua")
    ))
});

/// A deliberately broken batch grant script, for negative controls
/// (feature `testing`): a test that passes must fail with it.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchFault {
    /// Mints each fence from the server's clock alone, ignoring the fence
    /// already stored (fences go backwards when the stored one is ahead).
    IgnoreStoredFence,
    /// Takes each lock with `redis.call`: one item's error (a key of
    /// another type) fails the whole batch.
    OneErrorFailsAll,
}

/// `grant_many.lua` with `fault` (feature `testing`: the negative controls
/// of the batch tests). Each variant is built once.
#[cfg(feature = "testing")]
pub(crate) fn broken(fault: BatchFault) -> &'static Lua {
    static IGNORE_STORED_FENCE: LazyLock<Lua> = LazyLock::new(|| {
        replaced(
            &GRANT_MANY,
            &[("local f = clock_fence(n, now)", "local f = now")],
        )
    });
    static ONE_ERROR_FAILS_ALL: LazyLock<Lua> = LazyLock::new(|| {
        replaced(
            &GRANT_MANY,
            &[("redis.pcall('SET', lock, v,", "redis.call('SET', lock, v,")],
        )
    });
    match fault {
        BatchFault::IgnoreStoredFence => &IGNORE_STORED_FENCE,
        BatchFault::OneErrorFailsAll => &ONE_ERROR_FAILS_ALL,
    }
}

/// `lua` with each `(from, to)` of `edits` replaced (a `from` that is gone
/// leaves the variant unbroken: [`ScriptMutation::apply`] and the batch
/// tests' negative controls say so).
#[cfg(feature = "testing")]
fn replaced(lua: &Lua, edits: &[(&str, &str)]) -> Lua {
    let mut source = lua.source.to_owned();
    for (from, to) in edits {
        source = source.replace(from, to);
    }
    Lua::new(Box::leak(source.into_boxed_str()))
}

/// One deliberately broken rule of the lock scripts (feature `testing`):
/// the mutations the protocol model's differential test must catch, each a
/// text replacement in the scripts it concerns.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScriptMutation {
    /// The fenced write's length comparison inverted: a fence with fewer
    /// digits than the stored one is accepted, a longer one refused.
    FenceLengthInverted,
    /// The mint forgets `+ 1`: `max(last, now)` in clock mode, the last
    /// counter fence again in counter mode.
    MintWithoutIncrement,
    /// The grant's `SET` without `NX`: a held lock is overwritten.
    GrantWithoutNx,
    /// Release (one and batched) deletes whatever lock is there, without
    /// comparing the value.
    ReleaseWithoutTokenCheck,
    /// Extend (one and batched) renews whatever lock is there, without
    /// comparing the value.
    ExtendWithoutTokenCheck,
    /// The semaphore grant takes a slot past the permit count when every
    /// slot is held.
    GrantPastPermits,
}

#[cfg(feature = "testing")]
impl ScriptMutation {
    /// Every mutation.
    pub const ALL: [ScriptMutation; 6] = [
        ScriptMutation::FenceLengthInverted,
        ScriptMutation::MintWithoutIncrement,
        ScriptMutation::GrantWithoutNx,
        ScriptMutation::ReleaseWithoutTokenCheck,
        ScriptMutation::ExtendWithoutTokenCheck,
        ScriptMutation::GrantPastPermits,
    ];

    /// Whether this mutation breaks a mutex's scripts.
    pub fn breaks_mutex(self) -> bool {
        self != ScriptMutation::GrantPastPermits
    }

    /// Whether this mutation breaks a semaphore's scripts.
    pub fn breaks_semaphore(self) -> bool {
        !matches!(
            self,
            ScriptMutation::FenceLengthInverted | ScriptMutation::GrantWithoutNx
        )
    }

    /// The scripts this mutation breaks, and its replacements.
    fn edits(self) -> (Vec<&'static Lua>, &'static [(&'static str, &'static str)]) {
        match self {
            ScriptMutation::FenceLengthInverted => (
                vec![&FENCED_WRITE],
                &[("ok = #fence > #s", "ok = #fence < #s")],
            ),
            ScriptMutation::MintWithoutIncrement => (
                vec![
                    &GRANT,
                    &GRANT_MANY,
                    &RELEASE,
                    &LEAVE,
                    &REVOKE,
                    &SEM_GRANT,
                    &RW_GRANT,
                ],
                &[
                    (
                        "if last + 1 > now then return last + 1 end",
                        "if last >= now then return last end",
                    ),
                    (
                        "return (tonumber(last) or 0) + 1",
                        "return (tonumber(last) or 0)",
                    ),
                ],
            ),
            ScriptMutation::GrantWithoutNx => (vec![&GRANT, &GRANT_MANY], &[("'NX', ", "")]),
            ScriptMutation::ReleaseWithoutTokenCheck => (
                vec![&RELEASE, &RELEASE_MANY, &SEM_RELEASE],
                &[
                    ("redis.pcall('GET', lock) == value and ", ""),
                    ("if held ~= value then", "if not held then"),
                    ("elseif held ~= ARGV[i] then", "elseif not held then"),
                    ("if not lapsed and who ~= ident then return -1 end", ""),
                ],
            ),
            ScriptMutation::ExtendWithoutTokenCheck => (
                vec![&EXTEND, &EXTEND_MANY, &SEM_EXTEND],
                &[
                    ("if held == value then", "if held then"),
                    ("if held == ARGV[i + 1] then", "if held then"),
                    ("elseif who ~= ident then", "elseif false then"),
                ],
            ),
            ScriptMutation::GrantPastPermits => (
                vec![&SEM_GRANT],
                &[("if free <= 0 then", "if free < 0 then")],
            ),
        }
    }

    /// `Err` names a replacement found in none of the scripts this
    /// mutation concerns (the variant would not be broken).
    pub(crate) fn check(self) -> std::result::Result<(), String> {
        let (targets, edits) = self.edits();
        for (from, _) in edits {
            if !targets.iter().any(|t| t.source.contains(from)) {
                return Err(format!("{self:?}: no script it concerns contains {from:?}"));
            }
        }
        Ok(())
    }

    /// The script to run in place of `lua` under this mutation: `lua`
    /// itself when the mutation does not concern it, else its broken
    /// variant (built once). `Err` names a replacement found in none of
    /// the scripts it concerns (the variant would not be broken).
    pub(crate) fn apply(self, lua: &'static Lua) -> std::result::Result<&'static Lua, String> {
        use std::sync::Mutex;
        // (mutation, original script's address, broken variant).
        type Built = Vec<(ScriptMutation, usize, &'static Lua)>;
        static BUILT: Mutex<Built> = Mutex::new(Vec::new());
        self.check()?;
        let (targets, edits) = self.edits();
        if !targets.iter().any(|t| std::ptr::eq(*t, lua)) {
            return Ok(lua);
        }
        let address = std::ptr::from_ref(lua) as usize;
        let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, variant)) = built.iter().find(|(m, a, _)| *m == self && *a == address) {
            return Ok(variant);
        }
        let variant: &'static Lua = Box::leak(Box::new(replaced(lua, edits)));
        built.push((self, address, variant));
        Ok(variant)
    }
}
