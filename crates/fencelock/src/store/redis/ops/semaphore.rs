//! The calls on permits: a fenced semaphore's slots and a fenced
//! read-write lock's reader and writer, both fields of one hash per name.
//! A grant (`sem_grant.lua`, `rw_grant.lua`: [`PermitGrant`]), a release
//! or a waiter leaving (`sem_release.lua`), renewals of one or many
//! permits (`sem_extend.lua`), and a snapshot (`sem_inspect.lua`).
//! The semaphore key is a hash (`permits` and one field per held slot,
//! `TOKEN:FENCE:DEADLINE`); see `sem_grant.lua`.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Keys, Mint, NotExtended, PassOn, ScriptCall, write_millis};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::options::{Access, WaitMode};
use crate::store::redis::scripts::{self, Lua};
use crate::store::redis::wire::QueueMember;

/// The hash field a permit holds: a semaphore's slot (`"0"` to
/// `"N-1"`), or a read-write lock's writer (`"w"`) or reader (`"rN"`,
/// see `rw_grant.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitField {
    /// A semaphore's slot.
    Slot(u32),
    /// A read-write lock's writer.
    Writer,
    /// A read-write lock's reader, by its number among the readers.
    Reader(u32),
}

impl PermitField {
    /// Writes the field as one argument.
    pub(crate) fn write<W: ?Sized + RedisWrite>(self, out: &mut W) {
        let mut n = itoa::Buffer::new();
        match self {
            PermitField::Slot(slot) => out.write_arg(n.format(slot).as_bytes()),
            PermitField::Writer => out.write_arg(b"w"),
            PermitField::Reader(r) => {
                let mut arg = [0u8; 11];
                let digits = n.format(r).as_bytes();
                arg[0] = b'r';
                arg[1..=digits.len()].copy_from_slice(digits);
                out.write_arg(&arg[..=digits.len()]);
            }
        }
    }

    /// Reads a field name; `None` for a field that holds no permit
    /// (`permits`, `rw`, or data fencelock did not write).
    pub(crate) fn parse(field: &str) -> Option<Self> {
        match field.as_bytes().first()? {
            b'w' if field.len() == 1 => Some(PermitField::Writer),
            b'r' => field[1..].parse().ok().map(PermitField::Reader),
            _ => field.parse().ok().map(PermitField::Slot),
        }
    }
}

/// What a permit grant asks for: a slot of a semaphore of `N` permits
/// (`sem_grant.lua`), or a side of a read-write lock (`rw_grant.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitKind {
    /// One of this many slots.
    Slots(u32),
    /// A reader or the writer.
    Side(Access),
}

/// One grant attempt of a permit: a semaphore's slot or a read-write
/// lock's side (the two scripts share their arguments but the fifth, and
/// their replies).
#[derive(Debug)]
pub(crate) struct PermitGrant<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) mint: Mint,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) wait_mode: WaitMode,
    pub(crate) kind: PermitKind,
    /// The caller's place in the wait queue, if it waits there.
    pub(crate) member: Option<&'a QueueMember>,
    pub(crate) waiter_lease: Duration,
    /// An earlier attempt of this acquisition may have queued the caller.
    pub(crate) queued: bool,
}

impl ToRedisArgs for PermitGrant<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.mint.write(out);
        out.write_arg(self.token.as_bytes());
        write_millis(out, self.ttl);
        out.write_arg(self.wait_mode.as_arg().as_bytes());
        match self.kind {
            PermitKind::Slots(permits) => {
                out.write_arg(itoa::Buffer::new().format(permits).as_bytes());
            }
            PermitKind::Side(Access::Read) => out.write_arg(b"r"),
            PermitKind::Side(Access::Write) => out.write_arg(b"w"),
        }
        if let Some(member) = self.member {
            out.write_arg_fmt(member);
            write_millis(out, self.waiter_lease);
            out.write_arg(if self.queued { b"1" } else { b"0" });
        }
    }
}

impl ScriptCall for PermitGrant<'_> {
    type Reply = PermitGrantReply;

    fn script(&self) -> &'static Lua {
        match self.kind {
            PermitKind::Slots(_) => &scripts::SEM_GRANT,
            PermitKind::Side(_) => &scripts::RW_GRANT,
        }
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.keys.lock()])
    }
}

/// What a permit grant attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitGrantReply {
    /// Granted `field` with `fence` (a retry with the same token gets the
    /// same field and fence back). A reader's fence is its write epoch.
    Granted {
        /// The fence, before the fence epoch.
        fence: Fence,
        /// The slot, or the writer's or a reader's field.
        field: PermitField,
    },
    /// Every slot held, or a holder the caller cannot share with; the
    /// soonest such lapses in `remaining`.
    Held {
        /// The soonest time a holder in the way lapses, if any.
        remaining: Option<Duration>,
        /// The fence stored at the refusal.
        seen: Option<u64>,
    },
    /// Free, but reserved for (or in the way of) waiters ahead in the fair
    /// queue.
    Reserved {
        /// The fence stored at the refusal.
        seen: Option<u64>,
    },
    /// The name is held as a mutex.
    HeldAsMutex,
    /// The name has holders as a semaphore of this many permits (for a
    /// semaphore's grant: another count than asked).
    HeldAsSemaphore(u32),
    /// The name has holders as a read-write lock.
    HeldAsRwLock,
}

impl FromRedisValue for PermitGrantReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut fields: Vec<Value> = FromRedisValue::from_redis_value(v)?;
        if !(2..=3).contains(&fields.len()) {
            return Err(format!(
                "a permit grant returned {} fields, not 2 or 3",
                fields.len()
            )
            .into());
        }
        let third = (fields.len() == 3).then(|| fields.pop()).flatten();
        let (code, n): (i64, i64) = FromRedisValue::from_redis_value(Value::Array(fields))?;
        let seen = || -> Result<Option<u64>, ParsingError> {
            match third.clone() {
                None | Some(Value::Nil) => Ok(None),
                Some(v) => Ok(Some(u64::from_redis_value(v)?)),
            }
        };
        let positive = |what: &str, n: i64| {
            u64::try_from(n).map_err(|_| -> ParsingError {
                format!("a permit grant returned the negative {what} {n}").into()
            })
        };
        Ok(match code {
            1 => {
                // A semaphore's slot comes as a number, a read-write lock's
                // field as text ("w", "rN").
                let field = match third.clone() {
                    Some(Value::Int(slot)) => u32::try_from(slot).ok().map(PermitField::Slot),
                    Some(v) => PermitField::parse(&String::from_redis_value(v)?),
                    None => return Err("a permit grant returned no field".into()),
                };
                PermitGrantReply::Granted {
                    fence: Fence::new(positive("fence", n)?),
                    field: field.ok_or("a permit grant returned a field that holds no permit")?,
                }
            }
            0 => PermitGrantReply::Held {
                remaining: u64::try_from(n).ok().map(Duration::from_millis),
                seen: seen()?,
            },
            2 => PermitGrantReply::Reserved { seen: seen()? },
            3 => PermitGrantReply::HeldAsMutex,
            4 => PermitGrantReply::HeldAsSemaphore(
                u32::try_from(positive("permit count", n)?).map_err(|_| -> ParsingError {
                    format!("a semaphore holds {n} permits").into()
                })?,
            ),
            5 => PermitGrantReply::HeldAsRwLock,
            other => {
                return Err(format!("a permit grant returned the unknown code {other}").into());
            }
        })
    }
}

/// A permit's release (compare-and-delete of its slot), or a waiter leaving
/// the queue; either wakes the first waiters, one per free slot
/// (`sem_release.lua`).
#[derive(Debug)]
pub(crate) struct SemRelease<'a> {
    pub(crate) lock: &'a str,
    pub(crate) mint: Mint,
    pub(crate) pass_on: PassOn,
    /// What goes.
    pub(crate) what: SemLeaving<'a>,
}

/// What a [`SemRelease`] gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SemLeaving<'a> {
    /// A held permit: its field and `TOKEN:FENCE`.
    Permit { field: PermitField, ident: &'a str },
    /// A waiter's place in the queue: its member.
    Waiter(&'a QueueMember),
}

impl ToRedisArgs for SemRelease<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.pass_on.write_with(&self.mint, out);
        match self.what {
            SemLeaving::Permit { field, ident } => {
                field.write(out);
                out.write_arg(ident.as_bytes());
            }
            SemLeaving::Waiter(member) => {
                out.write_arg(b"");
                out.write_arg_fmt(member);
            }
        }
    }
}

impl ScriptCall for SemRelease<'_> {
    /// 1, 0 or -1 as `release.lua` for a permit; 1 or 0 (was queued or
    /// not) for a waiter.
    type Reply = i64;

    fn script(&self) -> &'static Lua {
        &scripts::SEM_RELEASE
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.lock])
    }
}

/// One permit to renew: its key, field and `TOKEN:FENCE`.
pub(crate) type PermitRef<'a> = (&'a str, PermitField, &'a str);

/// Renewal of one or many permits of one ttl (`sem_extend.lua`). On a
/// Cluster all keys must share a slot.
#[derive(Debug)]
pub(crate) struct SemExtend<'a> {
    pub(crate) permits: &'a [PermitRef<'a>],
    pub(crate) ttl: Duration,
}

impl ToRedisArgs for SemExtend<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        write_millis(out, self.ttl);
        for (_, field, ident) in self.permits {
            field.write(out);
            out.write_arg(ident.as_bytes());
        }
    }

    fn num_of_args(&self) -> usize {
        1 + 2 * self.permits.len()
    }
}

impl ScriptCall for SemExtend<'_> {
    type Reply = NotExtended;

    fn script(&self) -> &'static Lua {
        &scripts::SEM_EXTEND
    }

    fn keys(&self) -> Keys<'_> {
        Keys::Many(self.permits.iter().map(|(key, _, _)| *key).collect())
    }
}

/// An atomic snapshot of a semaphore (`sem_inspect.lua`).
#[derive(Debug)]
pub(crate) struct SemInspect<'a> {
    lock: &'a str,
    fence: String,
}

impl<'a> SemInspect<'a> {
    /// The snapshot of semaphore `keys`.
    pub(crate) fn of(keys: &'a LockKeys) -> Self {
        SemInspect {
            lock: keys.lock(),
            fence: keys.fence(),
        }
    }
}

impl ToRedisArgs for SemInspect<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, _out: &mut W) {}

    fn num_of_args(&self) -> usize {
        0
    }
}

impl ScriptCall for SemInspect<'_> {
    type Reply = SemSnapshot;

    fn script(&self) -> &'static Lua {
        &scripts::SEM_INSPECT
    }

    fn keys(&self) -> Keys<'_> {
        Keys::Two([self.lock, &self.fence])
    }
}

/// One live permit in a [`SemSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotEntry {
    pub(crate) field: PermitField,
    pub(crate) token: String,
    /// The fence (a reader's epoch), before the fence epoch.
    pub(crate) fence: Option<Fence>,
    pub(crate) remaining: Duration,
}

/// A semaphore's or a read-write lock's state: what marks it, and its live
/// permits by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SemSnapshot {
    /// Whether the key is a semaphore's hash (it has a permit count) or a
    /// read-write lock's (it has the `rw` mark): a hash with neither is
    /// data fencelock did not write.
    pub(crate) is_semaphore: bool,
    pub(crate) is_rwlock: bool,
    /// The semaphore's permit count (`None` when nobody holds it).
    pub(crate) permits: Option<u32>,
    /// The live permits: slots in order, or the writer and then the
    /// readers in order.
    pub(crate) slots: Vec<SlotEntry>,
    pub(crate) last_fence: Option<String>,
}

impl FromRedisValue for SemSnapshot {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (now_ms, fields, last_fence): (u64, Vec<String>, Option<String>) =
            FromRedisValue::from_redis_value(v)?;
        let mut permits = None;
        let (mut is_semaphore, mut is_rwlock) = (false, false);
        let mut slots = Vec::new();
        for pair in fields.chunks_exact(2) {
            let (field, value) = (&pair[0], &pair[1]);
            match field.as_str() {
                "permits" => {
                    is_semaphore = true;
                    permits = value.parse().ok();
                    continue;
                }
                "rw" => {
                    is_rwlock = true;
                    continue;
                }
                _ => {}
            }
            let (Some(field), Some(permit)) = (PermitField::parse(field), parse_permit(value))
            else {
                continue;
            };
            if permit.deadline_ms > now_ms {
                slots.push(SlotEntry {
                    field,
                    token: permit.token.to_owned(),
                    fence: permit.fence,
                    remaining: Duration::from_millis(permit.deadline_ms - now_ms),
                });
            }
        }
        slots.sort_by_key(|s| match s.field {
            PermitField::Writer => (0, 0),
            PermitField::Slot(n) => (1, n),
            PermitField::Reader(n) => (2, n),
        });
        Ok(SemSnapshot {
            is_semaphore,
            is_rwlock,
            permits: if slots.is_empty() { None } else { permits },
            slots,
            last_fence,
        })
    }
}

/// A permit as stored in its slot field.
struct StoredPermit<'a> {
    token: &'a str,
    fence: Option<Fence>,
    deadline_ms: u64,
}

/// Reads `TOKEN:FENCE:DEADLINE`.
fn parse_permit(value: &str) -> Option<StoredPermit<'_>> {
    let (rest, deadline) = value.rsplit_once(':')?;
    let (token, fence) = rest.rsplit_once(':')?;
    Some(StoredPermit {
        token,
        fence: fence.parse().ok().map(Fence::new),
        deadline_ms: deadline.parse().ok()?,
    })
}
