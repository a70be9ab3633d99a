//! The fenced read-write lock's grant (`rw_grant.lua`). Its holders are
//! permits of a hash (the writer's field `w`, each reader's `rN`), so a
//! release, renewal and snapshot are the semaphore's calls
//! (`semaphore.rs`).

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::semaphore::PermitField;
use super::{Keys, Mint, ScriptCall, write_millis};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::options::{Access, WaitMode};
use crate::store::redis::scripts::{self, Lua};
use crate::store::redis::wire::QueueMember;

/// One grant attempt of a reader or a writer (`rw_grant.lua`).
#[derive(Debug)]
pub(crate) struct RwGrant<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) mint: Mint,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) wait_mode: WaitMode,
    pub(crate) access: Access,
    /// The caller's place in the wait queue, if it waits there.
    pub(crate) member: Option<&'a QueueMember>,
    pub(crate) waiter_lease: Duration,
    /// An earlier attempt of this acquisition may have queued the caller.
    pub(crate) queued: bool,
}

impl ToRedisArgs for RwGrant<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.mint.write(out);
        out.write_arg(self.token.as_bytes());
        write_millis(out, self.ttl);
        out.write_arg(self.wait_mode.as_arg().as_bytes());
        out.write_arg(match self.access {
            Access::Read => b"r",
            Access::Write => b"w",
        });
        if let Some(member) = self.member {
            out.write_arg_fmt(member);
            write_millis(out, self.waiter_lease);
            out.write_arg(if self.queued { b"1" } else { b"0" });
        }
    }
}

impl ScriptCall for RwGrant<'_> {
    type Reply = RwGrantReply;

    fn script(&self) -> &'static Lua {
        &scripts::RW_GRANT
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.keys.lock()])
    }
}

/// What a read-write lock's grant attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwGrantReply {
    /// Granted `field` with `fence` (a writer's fence, a reader's epoch).
    Granted {
        /// The fence, before the fence epoch.
        fence: Fence,
        /// The writer's field or the reader's.
        field: PermitField,
    },
    /// A holder the caller cannot share with; the soonest such lapses in
    /// `remaining`.
    Held {
        /// The soonest time a conflicting holder lapses, if any.
        remaining: Option<Duration>,
        /// The fence stored at the refusal.
        seen: Option<u64>,
    },
    /// A waiter ahead in the fair queue conflicts with the caller.
    Reserved {
        /// The fence stored at the refusal.
        seen: Option<u64>,
    },
    /// The name is held as a mutex.
    HeldAsMutex,
    /// The name has holders as a semaphore of this many permits.
    HeldAsSemaphore(u32),
}

impl FromRedisValue for RwGrantReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut fields: Vec<Value> = FromRedisValue::from_redis_value(v)?;
        if !(2..=3).contains(&fields.len()) {
            return Err(format!(
                "a read-write lock's grant returned {} fields, not 2 or 3",
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
        Ok(match code {
            1 => {
                let field: String = match third.clone() {
                    Some(v) => String::from_redis_value(v)?,
                    None => return Err("a read-write lock's grant returned no field".into()),
                };
                let field = match PermitField::parse(&field) {
                    Some(f @ (PermitField::Writer | PermitField::Reader(_))) => f,
                    _ => {
                        return Err(format!(
                            "a read-write lock's grant returned the field {field:?}"
                        )
                        .into());
                    }
                };
                let fence = u64::try_from(n).map_err(|_| -> ParsingError {
                    format!("a read-write lock's grant returned the negative fence {n}").into()
                })?;
                RwGrantReply::Granted {
                    fence: Fence::new(fence),
                    field,
                }
            }
            0 => RwGrantReply::Held {
                remaining: u64::try_from(n).ok().map(Duration::from_millis),
                seen: seen()?,
            },
            2 => RwGrantReply::Reserved { seen: seen()? },
            3 => RwGrantReply::HeldAsMutex,
            4 => RwGrantReply::HeldAsSemaphore(u32::try_from(n).map_err(|_| -> ParsingError {
                format!("a semaphore holds {n} permits").into()
            })?),
            other => {
                return Err(
                    format!("a read-write lock's grant returned the unknown code {other}").into(),
                );
            }
        })
    }
}
