//! Extend: compare-and-pexpire of one lease (`extend.lua`), and of many
//! leases of one ttl in one call (`extend_many.lua`, the keeper's batch).

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, RedisWrite, ToRedisArgs, Value};

use super::{Keys, ScriptCall, write_millis};
use crate::store::Checked;
use crate::store::redis::scripts::{self, Lua};

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
        write_millis(out, self.ttl);
    }
}

impl ScriptCall for Extend<'_> {
    type Reply = Checked;

    fn script(&self) -> &'static Lua {
        &scripts::EXTEND
    }

    fn keys(&self) -> Keys<'_> {
        Keys::One([self.key])
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
        write_millis(out, self.ttl);
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

    fn keys(&self) -> Keys<'_> {
        Keys::Many(self.leases.iter().map(|(key, _)| *key).collect())
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
