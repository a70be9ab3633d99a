//! The data fencelock keeps in Redis, encoded and decoded here and nowhere
//! else in Rust (the scripts read the same formats; each `.lua` file names
//! the ones it uses).
//!
//! - the **lock value**: `TOKEN:FENCE` in the hash-tagged layout, so the
//!   holder's fence can always be read back, or the bare `TOKEN` in the guide
//!   layout (what the guide's Python workers write);
//! - a **queue member** of the wait queue:
//!   `CLIENT:WAITER:MODE:TTL_MS:HANDOVER_MS:TOKEN`, everything a release needs
//!   to wake that waiter or hand it the lock;
//! - a **wake-up**: published on the channel `WAKE_PREFIX + CLIENT`, the
//!   payload `WAITER` (retry now) or `WAITER FENCE` (the lock was handed over
//!   to this waiter with that fence).
//!
//! Public as `fencelock::testing` with the `testing` feature, so tests and
//! benchmarks reuse these encoders instead of copying them.
#![cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::fence::Fence;
use crate::keys::{KeyLayout, LockKeys};
use crate::options::{Access, WaitMode};

/// The value stored in the lock key for a grant.
pub fn lock_value(token: &str, fence: Fence, layout: KeyLayout) -> String {
    match layout {
        KeyLayout::HashTagged => {
            // Built by hand: `format!` costs several times this on every grant.
            let mut digits = itoa::Buffer::new();
            let digits = digits.format(fence.get());
            let mut value = String::with_capacity(token.len() + 1 + digits.len());
            value.push_str(token);
            value.push(':');
            value.push_str(digits);
            value
        }
        KeyLayout::Guide => token.to_owned(),
    }
}

/// The holder token of a lock value, and the fence if the value carries it
/// (hash-tagged layout). A value that does not parse is returned whole as the
/// token, without a fence.
pub fn parse_lock_value(value: &str, layout: KeyLayout) -> (&str, Option<Fence>) {
    match (layout, value.rsplit_once(':')) {
        (KeyLayout::HashTagged, Some((token, fence))) => match fence.parse() {
            Ok(fence) => (token, Some(fence)),
            Err(_) => (value, None),
        },
        _ => (value, None),
    }
}

/// A waiter in a lock's wait queue (a member of the queue's sorted set,
/// scored by its arrival time in µs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMember {
    /// The waiting client's id (it subscribes to `WAKE_PREFIX + client`).
    pub client: String,
    /// The waiter's number within its client.
    pub waiter: u64,
    /// `Fair` waiters are always handed the lock; `Notify` waiters once they
    /// starve.
    pub mode: WaitMode,
    /// The lease ttl the waiter asked for.
    pub ttl: Duration,
    /// How long a lock handed over to it lasts until it renews it.
    pub handover: Duration,
    /// The holder token the waiter will hold the lock with.
    pub token: String,
    /// The side of a read-write lock it waits for (`None`: a mutex or a
    /// semaphore): written as `r` or `w` before the wait mode.
    pub access: Option<Access>,
}

impl QueueMember {
    /// The channel a release publishes on to wake this waiter.
    pub fn wake_channel(&self, keys: &LockKeys) -> String {
        wake_channel(keys, &self.client)
    }
}

impl fmt::Display for QueueMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}{}:{}:{}:{}",
            self.client,
            self.waiter,
            match self.access {
                None => "",
                Some(Access::Read) => "r",
                Some(Access::Write) => "w",
            },
            self.mode.as_arg(),
            self.ttl.as_millis(),
            self.handover.as_millis(),
            self.token
        )
    }
}

/// A string that is not a queue member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAQueueMember(pub String);

impl fmt::Display for NotAQueueMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a queue member", self.0)
    }
}

impl std::error::Error for NotAQueueMember {}

impl FromStr for QueueMember {
    type Err = NotAQueueMember;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || NotAQueueMember(s.to_owned());
        let mut parts = s.splitn(6, ':');
        let mut next = || parts.next().filter(|p| !p.is_empty()).ok_or_else(bad);
        let client = next()?.to_owned();
        let waiter = next()?.parse().map_err(|_| bad())?;
        let mode = next()?;
        let (access, mode) = match mode.as_bytes().first() {
            Some(b'r') => (Some(Access::Read), &mode[1..]),
            Some(b'w') => (Some(Access::Write), &mode[1..]),
            _ => (None, mode),
        };
        let mode = WaitMode::parse(mode).ok_or_else(bad)?;
        let ttl = Duration::from_millis(next()?.parse().map_err(|_| bad())?);
        let handover = Duration::from_millis(next()?.parse().map_err(|_| bad())?);
        let token = next()?.to_owned();
        Ok(QueueMember {
            client,
            waiter,
            mode,
            ttl,
            handover,
            token,
            access,
        })
    }
}

/// The wake-up channel of `client` for the lock with `keys`.
pub fn wake_channel(keys: &LockKeys, client: &str) -> String {
    format!("{}{client}", keys.wake_prefix())
}

/// A wake-up message, as published by a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The lock became free: retry now.
    Retry {
        /// The waiter's number within its client.
        waiter: u64,
    },
    /// The release handed the lock over to this waiter.
    HandedOver {
        /// The waiter's number within its client.
        waiter: u64,
        /// The fence minted for it.
        fence: Fence,
    },
}

impl Wake {
    /// Parses a payload; `None` for anything else (messages are best effort).
    pub fn parse(payload: &str) -> Option<Wake> {
        let mut words = payload.split(' ');
        let waiter = words.next()?.parse().ok()?;
        match words.next() {
            None => Some(Wake::Retry { waiter }),
            Some(fence) => Some(Wake::HandedOver {
                waiter,
                fence: fence.parse().ok()?,
            }),
        }
    }

    /// The waiter it is for.
    pub fn waiter(self) -> u64 {
        match self {
            Wake::Retry { waiter } | Wake::HandedOver { waiter, .. } => waiter,
        }
    }
}

impl fmt::Display for Wake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wake::Retry { waiter } => write!(f, "{waiter}"),
            Wake::HandedOver { waiter, fence } => write!(f, "{waiter} {fence}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_values_round_trip() {
        let fence = Fence::new(1_796_030_814_974_827);
        let tagged = lock_value("t-1", fence, KeyLayout::HashTagged);
        assert_eq!(tagged, "t-1:1796030814974827");
        assert_eq!(
            parse_lock_value(&tagged, KeyLayout::HashTagged),
            ("t-1", Some(fence))
        );
        assert_eq!(lock_value("t-1", fence, KeyLayout::Guide), "t-1");
        assert_eq!(parse_lock_value("t-1", KeyLayout::Guide), ("t-1", None));
        assert_eq!(
            parse_lock_value("foreign", KeyLayout::HashTagged),
            ("foreign", None)
        );
    }

    #[test]
    fn queue_members_round_trip() -> Result<(), NotAQueueMember> {
        let member = QueueMember {
            client: "c0ffee".into(),
            waiter: 7,
            mode: WaitMode::Fair,
            ttl: Duration::from_secs(10),
            handover: Duration::from_millis(100),
            token: "0b5e7a9c-0000-4000-8000-000000000001".into(),
            access: None,
        };
        let text = member.to_string();
        assert_eq!(
            text,
            "c0ffee:7:fair:10000:100:0b5e7a9c-0000-4000-8000-000000000001"
        );
        assert_eq!(text.parse::<QueueMember>()?, member);
        // A read-write lock's waiter: the access before the wait mode.
        for (access, text) in [
            (Access::Read, "c0ffee:7:rfair:10000:100:t"),
            (Access::Write, "c0ffee:7:wfair:10000:100:t"),
        ] {
            let rw = QueueMember {
                access: Some(access),
                token: "t".into(),
                ..member.clone()
            };
            assert_eq!(rw.to_string(), text);
            assert_eq!(text.parse::<QueueMember>()?, rw);
        }
        for bad in [
            "c:1:xfair:1:1:t",
            "c:1:rslow:1:1:t",
            "",
            "a:b",
            "c:x:fair:1:1:t",
            "c:1:slow:1:1:t",
            "c:1:fair:1:1:",
        ] {
            assert!(bad.parse::<QueueMember>().is_err(), "{bad:?}");
        }
        Ok(())
    }

    #[test]
    fn wake_payloads_round_trip() {
        for wake in [
            Wake::Retry { waiter: 3 },
            Wake::HandedOver {
                waiter: 3,
                fence: Fence::new(42),
            },
        ] {
            assert_eq!(Wake::parse(&wake.to_string()), Some(wake));
        }
        assert_eq!(Wake::parse("x"), None);
        assert_eq!(Wake::parse("3 x"), None);
    }
}
