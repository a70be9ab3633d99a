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

/// The Redis keys of one lock name: the lock key, and the keys derived from
/// it by a suffix (in both layouts), built only when asked for: an
/// acquisition and its release send the lock key alone, and the scripts
/// derive the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    lock: String,
}

impl LockKeys {
    /// Derives the keys of `name` under `prefix` in `layout`, after checking
    /// that the name is acceptable.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty, oversized or malformed name.
    pub fn new(prefix: &str, layout: KeyLayout, name: &str) -> Result<Self> {
        validate_name(name, layout)?;
        // Concatenated rather than formatted: every acquire builds this key,
        // and `format!` costs several times a copy.
        let lock = match layout {
            KeyLayout::HashTagged => [prefix, "{", name, "}"].concat(),
            KeyLayout::Guide => [prefix, name].concat(),
        };
        Ok(LockKeys { lock })
    }

    /// The key holding the lease (value `TOKEN:FENCE`, or the bare token in
    /// the guide layout, with a PX expiry).
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The key holding the last fence issued for the name.
    pub fn fence(&self) -> String {
        self.suffixed(":fence")
    }

    /// The wait queue of the notify and fair wait modes (a sorted set).
    pub fn queue(&self) -> String {
        self.suffixed(":queue")
    }

    /// The waiters' leases (a sorted set next to the queue).
    pub fn waiters(&self) -> String {
        self.suffixed(":waiters")
    }

    /// Prefix of the per-client wake-up channels: a release wakes the head
    /// waiter (queue member `CLIENT:WAITER:…`) by publishing `WAITER` on
    /// `wake_prefix() + CLIENT`.
    pub fn wake_prefix(&self) -> String {
        self.suffixed(":wake:")
    }

    /// The keys whose lock key is `lock` (etcd's: the prefix of its
    /// holders' keys; it has no other keys).
    #[cfg(feature = "etcd")]
    pub(crate) fn from_lock_key(lock: String) -> Self {
        LockKeys { lock }
    }

    fn suffixed(&self, suffix: &str) -> String {
        [&*self.lock, suffix].concat()
    }
}

/// The SCAN pattern of the lock keys of names matching `names` (a Redis
/// glob), the prefix matched literally.
pub(crate) fn lock_key_pattern(prefix: &str, layout: KeyLayout, names: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    match layout {
        KeyLayout::HashTagged => format!("{escaped}{{{names}}}"),
        KeyLayout::Guide => format!("{escaped}{names}"),
    }
}

/// The lock name whose lock key is `key`, or `None` for any other key (a
/// fence key, a wait queue, a key that only matches the pattern).
pub(crate) fn lock_name_of<'k>(prefix: &str, layout: KeyLayout, key: &'k str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?;
    let name = match layout {
        KeyLayout::HashTagged => rest.strip_prefix('{')?.strip_suffix('}')?,
        KeyLayout::Guide => rest,
    };
    validate_name(name, layout).is_ok().then_some(name)
}

/// Whether `key` is one of the keys a lock under `prefix` keeps in the
/// hash-tagged layout: `PREFIX{NAME}` (a mutex's lease, a semaphore's or
/// read-write lock's hash) or that with `:fence`, `:queue` or `:waiters`
/// after it. A resource written there would break that lock. In the guide
/// layout any key under the prefix is some name's lock key, so only these
/// are told apart from resources.
pub(crate) fn is_lock_key(prefix: &str, key: &str) -> bool {
    let Some((name, tail)) = key
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('{'))
        .and_then(|rest| rest.split_once('}'))
    else {
        return false;
    };
    (tail.is_empty() || LOCK_KEY_SUFFIXES.contains(&tail))
        && validate_name(name, KeyLayout::HashTagged).is_ok()
}

/// Characters that change how text is shown without being seen: zero-width
/// characters and the bidirectional controls (a name with U+202E prints
/// reversed). Names, resource keys and prefixes refuse them, so what a
/// terminal shows is what Redis stores.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}'
        | '\u{FFA0}' | '\u{FFF0}'..='\u{FFFB}' | '\u{E0000}'..='\u{E0FFF}')
}

/// What is wrong with `text` as part of a Redis key (shared by names,
/// resource keys and prefixes), if anything.
pub(crate) fn key_text_problem(text: &str, max_len: usize) -> Option<&'static str> {
    if text.len() > max_len {
        return Some("it is too long");
    }
    // ASCII text (the common case, checked on every acquire) has no
    // invisible characters, and its control characters are its control bytes.
    let ascii = text.is_ascii();
    let control = if ascii {
        text.bytes().any(|b| b.is_ascii_control())
    } else {
        text.chars().any(char::is_control)
    };
    if control {
        return Some("it contains control characters (a newline, a tab, …)");
    }
    if !ascii && text.chars().any(is_invisible) {
        return Some(
            "it contains an invisible or direction-changing character (zero-width, or a bidirectional control such as U+202E)",
        );
    }
    None
}

/// Suffixes of the auxiliary keys of a lock, after its lock key in both
/// layouts: its fence, its wait queue and its waiters' leases. In the
/// guide layout a name ending in one of them would be another lock's
/// auxiliary key.
const LOCK_KEY_SUFFIXES: [&str; 3] = [":fence", ":queue", ":waiters"];

/// Checks a lock name in `layout`.
pub(crate) fn validate_name(name: &str, layout: KeyLayout) -> Result<()> {
    // The common case, checked on every acquire in one pass: a printable
    // ASCII name without braces in the default layout. Anything else takes
    // the checks below, which name what is wrong.
    if layout == KeyLayout::HashTagged
        && !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'{' && b != b'}')
    {
        return Ok(());
    }
    check_name(name)?;
    let reject = |reason| Err(Error::invalid_name(name, reason));
    match layout {
        KeyLayout::HashTagged if name.bytes().any(|b| b == b'{' || b == b'}') => {
            // A brace inside the hash tag would move the two keys of one lock
            // to different Cluster slots.
            reject("braces are not allowed in names in the hash-tagged layout")
        }
        // The guide layout keeps the guide's keys (`lock:NAME`,
        // `lock:NAME:fence`) for interop, so `a:fence` would be the fence key
        // of `a`: such names are refused rather than silently shared.
        KeyLayout::Guide
            if LOCK_KEY_SUFFIXES.iter().any(|s| name.ends_with(s)) || name.contains(":wake:") =>
        {
            reject(
                "in the guide layout a name may not end in :fence, :queue or :waiters, nor contain :wake: (it would share a key with another lock)",
            )
        }
        _ => Ok(()),
    }
}

/// Checks what every store requires of a lock name, without connecting:
/// not empty, at most [`MAX_NAME_LEN`] bytes, no control characters and no
/// invisible or direction-changing ones. etcd requires no more; Redis also
/// refuses braces in the default layout, and in the guide layout names that
/// would share a key with another lock (see [`LockKeys::new`]). So a tool
/// can refuse a bad name before it reaches for the network.
///
/// ```
/// assert!(fencelock::check_name("invoice:42").is_ok());
/// assert!(fencelock::check_name("").is_err());
/// ```
///
/// # Errors
/// [`Error::InvalidName`] naming what is wrong.
pub fn check_name(name: &str) -> Result<()> {
    validate_text(
        name,
        "the name is empty",
        "the name is longer than 512 bytes",
    )
}

/// Checks the key of a fenced resource (a Redis hash or an etcd key, used
/// as given, without the lock prefix), without connecting: not empty, at
/// most [`MAX_NAME_LEN`] bytes, no control, invisible or
/// direction-changing characters. A client also refuses keys that are its
/// locks' own ([`LockClient::fenced_hash`](crate::LockClient::fenced_hash),
/// [`LockClient::fenced_key`](crate::LockClient::fenced_key)).
///
/// # Errors
/// [`Error::InvalidName`] naming what is wrong.
pub fn check_resource_key(key: &str) -> Result<()> {
    validate_text(
        key,
        "the resource key is empty",
        "the resource key is longer than 512 bytes",
    )
}

/// Checks a name or key used as given: not empty (else `empty`), at most
/// [`MAX_NAME_LEN`] bytes (else `too_long`), no control or invisible
/// characters.
pub(crate) fn validate_text(text: &str, empty: &'static str, too_long: &'static str) -> Result<()> {
    let reject = |reason| Err(Error::invalid_name(text, reason));
    if text.is_empty() {
        return reject(empty);
    }
    if text.len() > MAX_NAME_LEN {
        return reject(too_long);
    }
    match key_text_problem(text, MAX_NAME_LEN) {
        Some(problem) => reject(problem),
        None => Ok(()),
    }
}

/// Escapes glob metacharacters so `s` matches literally in `SCAN … MATCH`.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass check of the common case says yes only where the full
    /// checks do, and the names it leaves to them get their reasons.
    #[test]
    fn the_fast_check_agrees_with_the_full_checks() {
        let long = "n".repeat(MAX_NAME_LEN);
        let too_long = "n".repeat(MAX_NAME_LEN + 1);
        let names = [
            "invoice:42",
            "a b",
            "~",
            long.as_str(),
            too_long.as_str(),
            "",
            "tab\there",
            "del\u{7f}",
            "unit\u{1f}sep",
            "{tagged}",
            "half}",
            "café",
            "rtl\u{202e}",
            "zero\u{200b}width",
        ];
        for name in names {
            let full = key_text_problem(name, MAX_NAME_LEN).is_none()
                && !name.is_empty()
                && !name.contains(['{', '}']);
            assert_eq!(
                validate_name(name, KeyLayout::HashTagged).is_ok(),
                full,
                "{name:?}"
            );
        }
    }

    #[test]
    fn layouts_derive_the_documented_keys() -> Result<()> {
        let k = LockKeys::new("lock:", KeyLayout::HashTagged, "invoice:42")?;
        assert_eq!(k.lock, "lock:{invoice:42}");
        assert_eq!(k.fence(), "lock:{invoice:42}:fence");
        let g = LockKeys::new("lock:", KeyLayout::Guide, "invoice:42")?;
        assert_eq!(g.lock, "lock:invoice:42");
        assert_eq!(g.fence(), "lock:invoice:42:fence");
        Ok(())
    }

    #[test]
    fn names_that_would_share_a_key_are_refused_in_the_guide_layout() {
        for bad in ["a:fence", "a:queue", "a:waiters", "a:wake:b"] {
            assert!(
                LockKeys::new("lock:", KeyLayout::Guide, bad).is_err(),
                "{bad:?}"
            );
            // The hash-tagged layout keeps them apart: `lock:{a:fence}`.
            assert!(LockKeys::new("lock:", KeyLayout::HashTagged, bad).is_ok());
        }
        for good in ["a", "fence", "a:fenced", "a:fence:b", "queue:7"] {
            assert!(LockKeys::new("lock:", KeyLayout::Guide, good).is_ok());
        }
    }

    #[test]
    fn invisible_and_direction_changing_characters_are_refused() {
        for bad in ["a\u{202E}b", "a\u{200B}", "\u{FEFF}a", "a\u{2066}b"] {
            let e = LockKeys::new("lock:", KeyLayout::HashTagged, bad);
            assert!(
                matches!(&e, Err(Error::InvalidName { reason, .. }) if reason.contains("invisible")),
                "{e:?}"
            );
            // The message shows the name escaped, never the raw characters.
            let message = e.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!message.chars().any(is_invisible), "{message:?}");
        }
        assert!(LockKeys::new("lock:", KeyLayout::HashTagged, "rechnung:ä:日本").is_ok());
    }

    #[test]
    fn a_locks_own_keys_are_told_from_resource_keys() {
        for key in [
            "lock:{job}",
            "lock:{job}:fence",
            "lock:{job}:queue",
            "lock:{job}:waiters",
            "lock:{日本:1}",
        ] {
            assert!(is_lock_key("lock:", key), "{key}");
        }
        assert!(is_lock_key("", "{job}:fence"));
        for key in [
            "lock:{job}:data",
            "lock:{job",
            "lock:{}",
            "lock:{a{b}",
            "lock:job",
            "jobs:{job}",
            "{job}:balance",
        ] {
            assert!(!is_lock_key("lock:", key), "{key}");
        }
    }

    #[test]
    fn scan_patterns_and_names_of_keys() {
        assert_eq!(
            lock_key_pattern("lock:", KeyLayout::HashTagged, "invoice:*"),
            "lock:{invoice:*}"
        );
        assert_eq!(lock_key_pattern("a*", KeyLayout::Guide, "x"), "a\\*x");
        assert_eq!(
            lock_name_of("lock:", KeyLayout::HashTagged, "lock:{invoice:1}"),
            Some("invoice:1")
        );
        for other in ["lock:{invoice:1}:fence", "lock:{a}:queue", "jobs:{a}"] {
            assert_eq!(lock_name_of("lock:", KeyLayout::HashTagged, other), None);
        }
        assert_eq!(
            lock_name_of("lock:", KeyLayout::Guide, "lock:job:fence"),
            None
        );
        assert_eq!(
            lock_name_of("lock:", KeyLayout::Guide, "lock:job"),
            Some("job")
        );
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
