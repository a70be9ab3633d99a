//! Lock names, key layouts and the Redis keys derived from them.

use crate::error::{Error, Result};

/// Longest accepted lock name, in bytes. Keys are sent on every call and kept
/// in memory on the server; longer names are almost always a bug (a payload
/// used as a name).
pub const MAX_NAME_LEN: usize = 512;

/// How lock names map to Redis keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyLayout {
    /// `PREFIX{NAME}` and `PREFIX{NAME}:fence`; the braces are a hash tag, so
    /// both keys live in one Cluster slot. The lock value is `TOKEN:FENCE`, so
    /// the current holder's fence can always be read back.
    #[default]
    HashTagged,
    /// The guide's layout: `PREFIX NAME` and `PREFIX NAME:fence`, the lock value
    /// is the bare token and the fence key is a plain counter. Workers written
    /// from the guide (Python `redis.asyncio`) and fencelock workers exclude each
    /// other on the same names. Not usable on Redis Cluster (the two keys may
    /// land in different slots).
    Guide,
}

impl KeyLayout {
    /// Parses `default`/`hash-tagged` or `guide`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" | "hash-tagged" | "hashtagged" => Some(KeyLayout::HashTagged),
            "guide" => Some(KeyLayout::Guide),
            _ => None,
        }
    }
}

/// The Redis keys of one lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The key holding the lease (value = holder token, with a PX expiry).
    pub lock: String,
    /// The key holding the last fence issued for the name.
    pub fence: String,
    /// The wait queue of the notify and fair wait modes (a sorted set).
    pub queue: String,
    /// The waiters' leases (a sorted set next to the queue).
    pub waiters: String,
    /// Prefix of the per-client wake-up channels: a release wakes the head
    /// waiter (queue member `CLIENT:WAITER:…`) by publishing `WAITER` on
    /// `wake_prefix + CLIENT`.
    pub wake_prefix: String,
}

impl LockKeys {
    /// Derives the keys of `name` under `prefix` in `layout`, after checking
    /// that the name is acceptable.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed name.
    pub fn new(prefix: &str, layout: KeyLayout, name: &str) -> Result<Self> {
        validate_name(name, layout)?;
        let lock = match layout {
            KeyLayout::HashTagged => format!("{prefix}{{{name}}}"),
            KeyLayout::Guide => format!("{prefix}{name}"),
        };
        Ok(LockKeys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:queue"),
            waiters: format!("{lock}:waiters"),
            wake_prefix: format!("{lock}:wake:"),
            lock,
        })
    }

    /// The four keys of the lock script, in its KEYS order.
    pub(crate) fn all(&self) -> [&str; 4] {
        [&self.lock, &self.fence, &self.queue, &self.waiters]
    }
}

/// Checks a lock or resource name.
pub(crate) fn validate_name(name: &str, layout: KeyLayout) -> Result<()> {
    let reject = |reason| {
        Err(Error::InvalidName {
            name: name.chars().take(64).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return reject("the name is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return reject("the name is longer than 512 bytes");
    }
    if name.chars().any(char::is_control) {
        return reject("the name contains control characters");
    }
    if layout == KeyLayout::HashTagged && name.contains(['{', '}']) {
        // A brace inside the hash tag would move the two keys of one lock to
        // different Cluster slots.
        return reject("braces are not allowed in names in the hash-tagged layout");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_derive_the_documented_keys() -> Result<()> {
        let k = LockKeys::new("lock:", KeyLayout::HashTagged, "invoice:42")?;
        assert_eq!(k.lock, "lock:{invoice:42}");
        assert_eq!(k.fence, "lock:{invoice:42}:fence");
        let g = LockKeys::new("lock:", KeyLayout::Guide, "invoice:42")?;
        assert_eq!(g.lock, "lock:invoice:42");
        assert_eq!(g.fence, "lock:invoice:42:fence");
        Ok(())
    }

    #[test]
    fn bad_names_are_rejected() {
        for bad in ["", "a\nb", "a{b}", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(
                LockKeys::new("lock:", KeyLayout::HashTagged, bad).is_err(),
                "{bad:?}"
            );
        }
        assert!(LockKeys::new("lock:", KeyLayout::Guide, "a{b}").is_ok());
    }
}
