//! The lock protocol's scripts as raw calls, real or deliberately broken
//! ([`ScriptMutation`]), for the protocol model's differential tests (the
//! mutex's, the semaphore's and the read-write lock's): each call's
//! arguments are encoded by the library's own operation types, so what the
//! tests run is what the engine sends.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::options::{Access, LockOptions};
use crate::store::redis::ops::{
    Change, Extend, ExtendMany, FencedWrite, Grant, GrantItem, GrantMany, Leave, Mint, PassOn,
    PermitField, PermitGrant, PermitKind, PermitRef, Publish, Release, ReleaseItem, ReleaseMany,
    Revoke, ScriptCall, SemExtend, SemLeaving, SemRelease,
};
use crate::store::redis::scripts::GRANT_MANY;
use crate::store::redis::wire::QueueMember;
use crate::store::redis::{ScriptMutation, invocation_of};

/// What a raw fenced write asks of the resource ([`ProtocolScripts::fenced_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceChange<'a> {
    /// Set the value.
    Write(&'a str),
    /// Record the fence and holder only (before a read-modify-write).
    Register,
    /// A revoke's seal.
    Seal,
}

/// The scripts of one lock name with one set of options, as the engine
/// calls them, optionally with one [`ScriptMutation`]. Every method returns
/// the invocation (by SHA; `NOSCRIPT` loads it) to run on any connection;
/// the replies are the scripts' raw replies, as each `.lua` file documents.
#[derive(Debug, Clone)]
pub struct ProtocolScripts {
    keys: LockKeys,
    opts: LockOptions,
    mutation: Option<ScriptMutation>,
}

impl ProtocolScripts {
    /// The real scripts of the lock with `keys` and `opts`.
    pub fn new(keys: LockKeys, opts: LockOptions) -> Self {
        ProtocolScripts {
            keys,
            opts,
            mutation: None,
        }
    }

    /// The same scripts broken by `mutation`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when a replacement of `mutation` is found in
    /// none of the scripts it concerns (the variant would not be broken).
    pub fn mutated(self, mutation: ScriptMutation) -> Result<Self> {
        mutation.check().map_err(Error::InvalidOption)?;
        Ok(ProtocolScripts {
            mutation: Some(mutation),
            ..self
        })
    }

    /// The lock's keys.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn invoke<C: ScriptCall>(&self, call: &C) -> redis::ScriptInvocation<'static> {
        let lua = call.script();
        // `mutated` checked the mutation: it applies or leaves `lua` as is.
        let lua = match self.mutation {
            Some(m) => m.apply(lua).unwrap_or(lua),
            None => lua,
        };
        invocation_of(call, lua)
    }

    fn mint(&self) -> Mint {
        Mint::new(&self.opts)
    }

    fn pass_on(&self) -> PassOn {
        PassOn {
            publish: Publish::Publish,
        }
    }

    /// One grant attempt by `token`; `member`: its place in the wait queue
    /// (a caller that may queue), `queued`: an earlier attempt may have
    /// queued it.
    pub fn grant(
        &self,
        token: &str,
        member: Option<&QueueMember>,
        queued: bool,
    ) -> redis::ScriptInvocation<'static> {
        self.invoke(&Grant {
            keys: &self.keys,
            mint: self.mint(),
            token,
            ttl: self.opts.ttl,
            wait_mode: self.opts.wait_mode,
            member,
            waiter_lease: self.opts.waiter_lease,
            queued,
        })
    }

    /// The common-case grants of `tokens` on this lock in one batch
    /// (`grant_many.lua`), as the coalescer sends them.
    pub fn grant_many(&self, tokens: &[&str]) -> redis::ScriptInvocation<'static> {
        let items: Vec<GrantItem> = tokens
            .iter()
            .map(|token| {
                GrantItem::from(&Grant {
                    keys: &self.keys,
                    mint: self.mint(),
                    token,
                    ttl: self.opts.ttl,
                    wait_mode: self.opts.wait_mode,
                    member: None,
                    waiter_lease: self.opts.waiter_lease,
                    queued: false,
                })
            })
            .collect();
        self.invoke(&GrantMany {
            items: &items,
            script: &GRANT_MANY,
        })
    }

    fn release_call<'a>(&'a self, value: &'a str) -> Release<'a> {
        Release {
            lock: self.keys.lock(),
            mint: self.mint(),
            pass_on: self.pass_on(),
            value,
            wake_first: false,
        }
    }

    /// Compare-and-delete of the lock value `value`, then pass on.
    pub fn release(&self, value: &str) -> redis::ScriptInvocation<'static> {
        self.invoke(&self.release_call(value))
    }

    /// Releases of `values` (of this lock) in one batch (`release_many.lua`).
    pub fn release_many(&self, values: &[&str]) -> redis::ScriptInvocation<'static> {
        let items: Vec<ReleaseItem> = values
            .iter()
            .map(|value| ReleaseItem::from(&self.release_call(value)))
            .collect();
        self.invoke(&ReleaseMany { items: &items })
    }

    /// Compare-and-pexpire of the lock value `value` to the options' ttl.
    pub fn extend(&self, value: &str) -> redis::ScriptInvocation<'static> {
        self.invoke(&Extend {
            key: self.keys.lock(),
            value,
            ttl: self.opts.ttl,
        })
    }

    /// Compare-and-pexpire of `values` (of this lock) in one batch
    /// (`extend_many.lua`), as the keeper renews.
    pub fn extend_many(&self, values: &[&str]) -> redis::ScriptInvocation<'static> {
        let leases: Vec<(&str, &str)> = values.iter().map(|v| (self.keys.lock(), *v)).collect();
        self.invoke(&ExtendMany {
            leases: &leases,
            ttl: self.opts.ttl,
        })
    }

    /// The waiter `member` gives up its place.
    pub fn leave(&self, member: &QueueMember) -> redis::ScriptInvocation<'static> {
        self.invoke(&Leave {
            keys: &self.keys,
            mint: self.mint(),
            pass_on: self.pass_on(),
            member,
        })
    }

    /// A revoke of whoever holds the lock.
    pub fn revoke(&self) -> redis::ScriptInvocation<'static> {
        self.invoke(&Revoke {
            lock: self.keys.lock(),
            mint: self.mint(),
            pass_on: self.pass_on(),
        })
    }

    /// A fenced write, registration or seal of the Redis hash `resource`
    /// with `fence` by the holder of `token` (ignored by a seal).
    pub fn fenced_write(
        &self,
        resource: &str,
        fence: Fence,
        token: &str,
        change: ResourceChange<'_>,
    ) -> redis::ScriptInvocation<'static> {
        self.invoke(&FencedWrite {
            key: resource,
            fence,
            holder: token,
            change: match change {
                ResourceChange::Write(value) => Change::Write(value),
                ResourceChange::Register => Change::Register,
                ResourceChange::Seal => Change::Seal,
            },
        })
    }

    /// One semaphore grant attempt by `token` of one of `permits` slots,
    /// as a poller (`sem_grant.lua`).
    pub fn sem_grant(&self, token: &str, permits: u32) -> redis::ScriptInvocation<'static> {
        self.invoke(&PermitGrant {
            keys: &self.keys,
            mint: self.mint(),
            token,
            ttl: self.opts.ttl,
            wait_mode: self.opts.wait_mode,
            kind: PermitKind::Slots(permits),
            member: None,
            waiter_lease: self.opts.waiter_lease,
            queued: false,
        })
    }

    /// The release of the permit in `slot` granted to `token` with the
    /// store's `fence` (`sem_release.lua`).
    pub fn sem_release(
        &self,
        slot: u32,
        token: &str,
        fence: u64,
    ) -> redis::ScriptInvocation<'static> {
        self.permit_release(PermitField::Slot(slot), token, fence)
    }

    /// Renewals of the permits `(slot, token, store fence)` in one call, as
    /// the keeper sends them (`sem_extend.lua`).
    pub fn sem_extend(&self, permits: &[(u32, &str, u64)]) -> redis::ScriptInvocation<'static> {
        let permits: Vec<(PermitField, &str, u64)> = permits
            .iter()
            .map(|&(slot, token, fence)| (PermitField::Slot(slot), token, fence))
            .collect();
        self.permit_extend(&permits)
    }

    /// One read-write lock grant attempt by `token` for `access`, as a
    /// poller (`rw_grant.lua`; the options' wait mode, no queue place).
    pub fn rw_grant(&self, token: &str, access: Access) -> redis::ScriptInvocation<'static> {
        self.rw_grant_waiting(token, access, None, false)
    }

    /// One read-write lock grant attempt by `token` for `access` in the
    /// options' wait mode (`rw_grant.lua`); `member`: its place in the wait
    /// queue (a caller that may queue; its access should be `access`),
    /// `queued`: an earlier attempt may have queued it.
    pub fn rw_grant_waiting(
        &self,
        token: &str,
        access: Access,
        member: Option<&QueueMember>,
        queued: bool,
    ) -> redis::ScriptInvocation<'static> {
        self.invoke(&PermitGrant {
            keys: &self.keys,
            mint: self.mint(),
            token,
            ttl: self.opts.ttl,
            wait_mode: self.opts.wait_mode,
            kind: PermitKind::Side(access),
            member,
            waiter_lease: self.opts.waiter_lease,
            queued,
        })
    }

    /// The release of a read-write lock's holder in `field` (`"w"`, the
    /// writer, or `"rN"`, a reader) granted to `token` with the store's
    /// `fence` (a reader's epoch): `sem_release.lua`, as for a permit.
    ///
    /// # Panics
    /// When `field` names no writer or reader.
    pub fn rw_release(
        &self,
        field: &str,
        token: &str,
        fence: u64,
    ) -> redis::ScriptInvocation<'static> {
        self.permit_release(rw_field(field), token, fence)
    }

    /// Renewals of read-write lock holders `(field, token, store fence)` in
    /// one call, as the keeper sends them (`sem_extend.lua`).
    ///
    /// # Panics
    /// When a field names no writer or reader.
    pub fn rw_extend(&self, holders: &[(&str, &str, u64)]) -> redis::ScriptInvocation<'static> {
        let holders: Vec<(PermitField, &str, u64)> = holders
            .iter()
            .map(|&(field, token, fence)| (rw_field(field), token, fence))
            .collect();
        self.permit_extend(&holders)
    }

    /// A read-write lock's waiter `member` gives up its place
    /// (`sem_release.lua`, which then wakes the waiters a free lock lets
    /// in).
    pub fn rw_leave(&self, member: &QueueMember) -> redis::ScriptInvocation<'static> {
        self.invoke(&SemRelease {
            lock: self.keys.lock(),
            mint: self.mint(),
            pass_on: self.pass_on(),
            what: SemLeaving::Waiter(member),
        })
    }

    fn permit_release(
        &self,
        field: PermitField,
        token: &str,
        fence: u64,
    ) -> redis::ScriptInvocation<'static> {
        let ident = permit_ident(token, fence);
        self.invoke(&SemRelease {
            lock: self.keys.lock(),
            mint: self.mint(),
            pass_on: self.pass_on(),
            what: SemLeaving::Permit {
                field,
                ident: &ident,
            },
        })
    }

    fn permit_extend(
        &self,
        permits: &[(PermitField, &str, u64)],
    ) -> redis::ScriptInvocation<'static> {
        let idents: Vec<String> = permits
            .iter()
            .map(|(_, token, fence)| permit_ident(token, *fence))
            .collect();
        let refs: Vec<PermitRef<'_>> = permits
            .iter()
            .zip(&idents)
            .map(|((field, _, _), ident)| (self.keys.lock(), *field, ident.as_str()))
            .collect();
        self.invoke(&SemExtend {
            permits: &refs,
            ttl: self.opts.ttl,
        })
    }

    /// The options' ttl.
    pub fn ttl(&self) -> Duration {
        self.opts.ttl
    }
}

/// A permit's `TOKEN:FENCE`, as its grant stores it.
fn permit_ident(token: &str, fence: u64) -> String {
    crate::store::redis::wire::lock_value(
        token,
        Fence::new(fence),
        crate::keys::KeyLayout::HashTagged,
    )
}

/// A read-write lock's field: the writer's `"w"` or a reader's `"rN"`.
fn rw_field(field: &str) -> PermitField {
    match PermitField::parse(field) {
        Some(f @ (PermitField::Writer | PermitField::Reader(_))) => f,
        _ => panic!("{field:?} is not a read-write lock's field (\"w\" or \"rN\")"),
    }
}
