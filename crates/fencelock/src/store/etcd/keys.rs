//! Lock names as etcd keys, and back.
//!
//! The keys of lock `NAME` are `NAMESPACE PREFIX ENCODED-NAME / LEASE`: one
//! per holder or waiter, `LEASE` being its lease id in lowercase hex, as
//! etcd's own lock recipe names them. With an empty namespace and prefix,
//! a name without `/` and `%` therefore has the keys `etcdctl lock NAME`
//! uses, and the two exclude each other (fencelock's fences are create
//! revisions, not `etcdctl`'s `ETCD_LOCK_REV`).
//!
//! `ENCODED-NAME` is the name with `%` written `%25` and `/` written `%2F`,
//! so the prefix of one name is never a prefix of another name's keys (the
//! keys of `a` start with `a/`, those of `a/b` with `a%2Fb/`): two names
//! never share a key or a queue.
//!
//! A **semaphore** ([`crate::LockOptions::permits`]) keeps its keys in the
//! same range, under `sem/N/`, `N` its permit count in decimal:
//!
//! - `NAMESPACE PREFIX ENCODED-NAME/sem/N/slot/S`: the holder of slot `S`
//!   (decimal, `0..N`), on the holder's session; its value is the holder
//!   id, its create revision the permit's fence;
//! - `NAMESPACE PREFIX ENCODED-NAME/sem/N/wait/LEASE/ACQ`: a waiter, named
//!   as a mutex's key is (one per acquisition).
//!
//! A mutex's keys start with a lowercase hex digit (`LEASE/ACQ`, or
//! `LEASE` from older clients and `etcdctl lock`), so they never begin
//! with `sem/`: the two kinds never share a key. Both stay in the name's
//! range on purpose: a client that knows no semaphores takes a semaphore's
//! keys for holders and waits behind them, rather than sharing the name.
//! The permit count is part of every semaphore key, so "held with another
//! count" is "a key under `sem/` outside `sem/N/`", which one range compare
//! tells, and nothing has to be cleaned up when the last holder goes.
//!
//! A **read-write lock** ([`crate::LockClient::rwlock`]) keeps its keys
//! under `rw/`, one per acquisition, named as a mutex's key is:
//!
//! - `NAMESPACE PREFIX ENCODED-NAME/rw/r/LEASE/ACQ`: a reader;
//! - `NAMESPACE PREFIX ENCODED-NAME/rw/w/LEASE/ACQ`: a writer.
//!
//! Holders and waiters of both sides share the range `rw/`, ordered by
//! create revision; the side is in the key, so "is a writer ahead of me"
//! is one range read of `rw/w/`. `r` and `w` are not hex digits and `rw/`
//! is not `sem/`, so the three kinds never share a key, and "another kind
//! holds the name" is "a key outside `rw/`" (two range compares).

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::keys::check_name;
use crate::options::{Access, Primitive};

/// `name` with `%` and `/` escaped.
pub(crate) fn encode_name(name: &str) -> Cow<'_, str> {
    if !name.contains(['%', '/']) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(name.replace('%', "%25").replace('/', "%2F"))
}

/// The name `encoded` stands for, if it is an encoding [`encode_name`]
/// makes.
pub(crate) fn decode_name(encoded: &str) -> Option<String> {
    if encoded.contains('/') {
        return None;
    }
    let mut out = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%2F" => '/',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The prefix of every key of lock `name`: `NAMESPACE PREFIX ENCODED/`.
pub(crate) fn lock_prefix(namespace: &str, prefix: &str, name: &str) -> String {
    format!("{namespace}{prefix}{}/", encode_name(name))
}

/// Checks that the URL's namespace (`?prefix=`) and the lock prefix join
/// without ambiguity. They are joined as they are, and fencelock never
/// moves existing keys, so a pair that gives the same keys as another pair
/// (`?prefix=t` with `1lock:` and `?prefix=t1` with `lock:`) is refused: a
/// namespace must be empty or end with `/`, and a lock prefix must not
/// contain `/`. Then the last `/` before a lock's name ends the namespace,
/// and every pair has keys of its own.
///
/// # Errors
/// [`Error::InvalidOption`] naming which of the two is refused and why
/// (the namespace's value, a URL parameter, is not repeated).
pub(crate) fn check_key_space(namespace: &str, prefix: &str) -> Result<()> {
    if !namespace.is_empty() && !namespace.ends_with('/') {
        return Err(Error::InvalidOption(
            "the etcd URL's namespace (?prefix=) must end with '/': it is joined to the lock prefix without a separator, so a namespace without one can give the same keys as another namespace and lock prefix (?prefix=t with --prefix 1lock: and ?prefix=t1 with --prefix lock:); fencelock does not move existing keys, so it refuses the ambiguous namespace instead (?prefix=NAME/ names other keys than ?prefix=NAME: move every client of these locks at once)".into(),
        ));
    }
    if prefix.contains('/') {
        let shown: String = prefix.chars().take(64).collect();
        return Err(Error::InvalidOption(format!(
            "lock prefix {shown:?} cannot be used on etcd: it contains '/', which ends the URL's namespace (?prefix=), so its keys could be another namespace's (a namespace a/ with prefix lock: and prefix a/lock: give the same keys); use a prefix without '/'"
        )));
    }
    Ok(())
}

/// Whether a fenced resource key `key` (after the namespace) lies where
/// the keys of locks under `prefix` live: it starts with the lock prefix
/// and has a `/` after it, so some lock's range (`PREFIX NAME/`) holds it
/// and etcd's lock recipe would take it for a holder or a waiter. A key
/// there written without a lease would hold that lock for ever.
pub(crate) fn in_lock_space(prefix: &str, key: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| rest.contains('/'))
}

/// The key of one acquisition (a holder or a waiter) under `lock_prefix`:
/// `LEASE/ACQ`, the lease id it was created on and a number that the
/// client gives each of its acquisitions, both in lowercase hex. Many
/// acquisitions share a lease (the client's session), so the number keeps
/// their keys apart: two tasks of one client on one name never share a
/// key. Keys of older clients (`LEASE` alone, one lease per acquisition)
/// live under the same prefix, so the two exclude each other.
pub(crate) fn holder_key(lock_prefix: &str, lease: i64, acquisition: u64) -> String {
    format!("{lock_prefix}{lease:x}/{acquisition:x}")
}

/// The lock name of `key`, a key under `names_prefix` (namespace and
/// prefix): a mutex's key (see [`parse_key`]), a semaphore's or a
/// read-write lock's; `None` for any other key.
pub(crate) fn name_of_key(names_prefix: &str, key: &str) -> Option<String> {
    if let Some((name, _)) = parse_key(names_prefix, key) {
        return Some(name);
    }
    let rest = key.strip_prefix(names_prefix)?;
    let (encoded, tail) = rest.split_once('/')?;
    match (
        tail.strip_prefix(SEMAPHORE_PART),
        tail.strip_prefix(RWLOCK_PART),
    ) {
        (Some(sem), _) => semaphore_key(sem)?,
        (None, Some(rw)) => rwlock_key(rw)?,
        (None, None) => return None,
    };
    let name = decode_name(encoded)?;
    check_name(&name).ok()?;
    Some(name)
}

/// The lock name and lease of `key`, a key under `names_prefix` (namespace
/// and prefix), in either shape (`NAME/LEASE/ACQ`, or `NAME/LEASE` as older
/// clients and `etcdctl lock` write them); `None` for any other key.
pub(crate) fn parse_key(names_prefix: &str, key: &str) -> Option<(String, i64)> {
    let rest = key.strip_prefix(names_prefix)?;
    // An encoded name has no `/`: the first one ends it.
    let (encoded, tail) = rest.split_once('/')?;
    let (lease, acquisition) = match tail.split_once('/') {
        Some((lease, acquisition)) => (lease, Some(acquisition)),
        None => (tail, None),
    };
    let hex = |part: &str| {
        !part.is_empty() && part.len() <= 16 && part.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if !hex(lease) || acquisition.is_some_and(|a| !hex(a)) {
        return None;
    }
    let lease = i64::from_str_radix(lease, 16).ok()?;
    let name = decode_name(encoded)?;
    check_name(&name).ok()?;
    Some((name, lease))
}

/// Where a semaphore's keys start under a lock's prefix.
pub(crate) const SEMAPHORE_PART: &str = "sem/";

/// Where a read-write lock's keys start under a lock's prefix.
pub(crate) const RWLOCK_PART: &str = "rw/";

/// The keys of a semaphore of `permits` permits under one lock's prefix
/// (see the module's docs for the layout).
#[derive(Debug, Clone)]
pub(crate) struct SemKeys {
    /// The lock's prefix, `NAMESPACE PREFIX ENCODED-NAME/`.
    lock: String,
    /// `lock` + `sem/N/`: every key of this semaphore starts with it.
    base: String,
    permits: u32,
}

impl SemKeys {
    /// The keys of a semaphore of `permits` under `lock_prefix`.
    pub(crate) fn new(lock_prefix: &str, permits: u32) -> Self {
        SemKeys {
            lock: lock_prefix.to_owned(),
            base: format!("{lock_prefix}{SEMAPHORE_PART}{permits}/"),
            permits,
        }
    }

    /// The lock's prefix: every key of the name, of either kind.
    pub(crate) fn lock(&self) -> &str {
        &self.lock
    }

    /// The prefix of this semaphore's keys (`… sem/N/`).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The permit count.
    pub(crate) fn permits(&self) -> u32 {
        self.permits
    }

    /// The key of slot `slot`'s holder.
    pub(crate) fn slot(&self, slot: u32) -> String {
        format!("{}slot/{slot}", self.base)
    }

    /// The key of one waiting acquisition: `wait/LEASE/ACQ`, as a mutex's
    /// key is named (see [`holder_key`]).
    pub(crate) fn waiter(&self, lease: i64, acquisition: u64) -> String {
        format!("{}wait/{lease:x}/{acquisition:x}", self.base)
    }
}

/// The keys of a read-write lock under one lock's prefix (see the
/// module's docs for the layout).
#[derive(Debug, Clone)]
pub(crate) struct RwKeys {
    /// The lock's prefix, `NAMESPACE PREFIX ENCODED-NAME/`.
    lock: String,
    /// `lock` + `rw/`: every key of the read-write lock starts with it.
    base: String,
    /// `base` + `w/`: every writer's key starts with it.
    writers: String,
}

impl RwKeys {
    /// The keys of a read-write lock under `lock_prefix`.
    pub(crate) fn new(lock_prefix: &str) -> Self {
        let base = format!("{lock_prefix}{RWLOCK_PART}");
        RwKeys {
            lock: lock_prefix.to_owned(),
            writers: format!("{base}w/"),
            base,
        }
    }

    /// The lock's prefix: every key of the name, of any kind.
    pub(crate) fn lock(&self) -> &str {
        &self.lock
    }

    /// The prefix of every reader's and writer's key (`… rw/`).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The prefix of every writer's key (`… rw/w/`).
    pub(crate) fn writers(&self) -> &str {
        &self.writers
    }

    /// The prefix of the keys an acquisition of `access` waits for: every
    /// key of the lock for a writer, the writers' for a reader.
    pub(crate) fn ahead_of(&self, access: Access) -> &str {
        match access {
            Access::Read => self.writers(),
            Access::Write => self.base(),
        }
    }

    /// The key of one acquisition of `access`: `rw/r/LEASE/ACQ` or
    /// `rw/w/LEASE/ACQ`, named as a mutex's key is (see [`holder_key`]).
    pub(crate) fn key(&self, access: Access, lease: i64, acquisition: u64) -> String {
        let side = match access {
            Access::Read => 'r',
            Access::Write => 'w',
        };
        format!("{}{side}/{lease:x}/{acquisition:x}", self.base)
    }
}

/// What a key under a lock's prefix is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// A mutex's holder or waiter (anything not under `sem/` or `rw/`).
    Mutex,
    /// The holder of `slot` of a semaphore of `permits`.
    Slot { permits: u32, slot: u32 },
    /// A waiter of a semaphore of `permits`.
    Waiter { permits: u32 },
    /// A read-write lock's reader, holding or waiting.
    Reader,
    /// A read-write lock's writer, holding or waiting.
    Writer,
    /// Under `rw/`, but not a key fencelock writes.
    RwMalformed,
    /// Under `sem/`, but not a key fencelock writes.
    Malformed,
}

impl KeyKind {
    /// The name of the kind of lock a key of this kind belongs to, as
    /// [`crate::Error::KindConflict`] names it (a malformed key counts as
    /// its range's kind).
    pub(crate) fn lock_kind(self) -> &'static str {
        match self {
            KeyKind::Mutex => Primitive::Mutex.kind(),
            KeyKind::Slot { .. } | KeyKind::Waiter { .. } | KeyKind::Malformed => {
                Primitive::Semaphore(1).kind()
            }
            KeyKind::Reader | KeyKind::Writer | KeyKind::RwMalformed => {
                Primitive::RwLock(Access::Write).kind()
            }
        }
    }

    /// Whether the key lies in a read-write lock's range `rw/`.
    pub(crate) fn is_rwlock(self) -> bool {
        matches!(
            self,
            KeyKind::Reader | KeyKind::Writer | KeyKind::RwMalformed
        )
    }
}

/// What `key` is, a key under `lock_prefix` (`None`: not under it).
pub(crate) fn key_kind(lock_prefix: &str, key: &[u8]) -> Option<KeyKind> {
    let rest = key.strip_prefix(lock_prefix.as_bytes())?;
    if let Some(rw) = rest.strip_prefix(RWLOCK_PART.as_bytes()) {
        let kind = std::str::from_utf8(rw).ok().and_then(rwlock_key);
        return Some(kind.unwrap_or(KeyKind::RwMalformed));
    }
    let Some(sem) = rest.strip_prefix(SEMAPHORE_PART.as_bytes()) else {
        return Some(KeyKind::Mutex);
    };
    let Ok(sem) = std::str::from_utf8(sem) else {
        return Some(KeyKind::Malformed);
    };
    Some(semaphore_key(sem).unwrap_or(KeyKind::Malformed))
}

/// The kind of a read-write lock's key after its `rw/`: `r/LEASE/ACQ` or
/// `w/LEASE/ACQ`, both in lowercase hex as fencelock writes them.
fn rwlock_key(rest: &str) -> Option<KeyKind> {
    let hex = |part: &str| {
        !part.is_empty()
            && part.len() <= 16
            && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let mut parts = rest.split('/');
    let kind = match parts.next()? {
        "r" => KeyKind::Reader,
        "w" => KeyKind::Writer,
        _ => return None,
    };
    let (lease, acquisition) = (parts.next()?, parts.next()?);
    (hex(lease) && hex(acquisition) && parts.next().is_none()).then_some(kind)
}

/// The kind of a semaphore key after its `sem/`: `N/slot/S` or
/// `N/wait/LEASE/ACQ`, numbers as fencelock writes them (no leading
/// zeros, the count in `1..=MAX_PERMITS`, the slot below it).
fn semaphore_key(rest: &str) -> Option<KeyKind> {
    let decimal = |part: &str| -> Option<u32> {
        let canonical = !part.is_empty()
            && part.len() <= 10
            && part.bytes().all(|b| b.is_ascii_digit())
            && (part == "0" || !part.starts_with('0'));
        canonical.then(|| part.parse().ok()).flatten()
    };
    let hex = |part: &str| {
        !part.is_empty() && part.len() <= 16 && part.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let mut parts = rest.split('/');
    let permits = decimal(parts.next()?)?;
    if permits == 0 || permits > crate::options::MAX_PERMITS {
        return None;
    }
    let kind = match (parts.next()?, parts.next()?, parts.next(), parts.next()) {
        ("slot", slot, None, None) => {
            let slot = decimal(slot)?;
            (slot < permits).then_some(KeyKind::Slot { permits, slot })?
        }
        ("wait", lease, Some(acquisition), None) if hex(lease) && hex(acquisition) => {
            KeyKind::Waiter { permits }
        }
        _ => return None,
    };
    Some(kind)
}

/// The end of the range of keys that start with `prefix` (etcd's
/// `GetPrefixRangeEnd`): `prefix` with its last byte below 0xff raised by
/// one, the rest after it dropped.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only 0xff bytes (never a lock prefix, which ends with `/`): every
    // key from `prefix` on.
    vec![0]
}

/// Whether `text` matches the glob `pattern` as Redis's `SCAN MATCH` reads
/// it: `*` any run, `?` any one character, `[abc]`, `[a-z]`, `[^a]`, and `\`
/// escaping the next character.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_at(&p, &t)
}

fn glob_at(p: &[char], t: &[char]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    // Where to resume after the last `*`: (pattern index after it, text index).
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi + 1, ti));
                pi += 1;
                continue;
            }
            Some('?') => Some(1),
            Some('[') => class(&p[pi..], t[ti]),
            Some('\\') if pi + 1 < p.len() => (p[pi + 1] == t[ti]).then_some(2),
            Some(&c) => (c == t[ti]).then_some(1),
            None => None,
        };
        match step {
            Some(width) => {
                pi += width;
                ti += 1;
            }
            None => match star {
                Some((after, at)) => {
                    pi = after;
                    ti = at + 1;
                    star = Some((after, at + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// If the class at the start of `p` (`[...]`) matches `c`, its width in
/// the pattern.
fn class(p: &[char], c: char) -> Option<usize> {
    let mut i = 1;
    let negate = p.get(1) == Some(&'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    while i < p.len() && p[i] != ']' {
        if p[i] == '\\' && i + 1 < p.len() {
            matched |= p[i + 1] == c;
            i += 2;
        } else if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            let (lo, hi) = if p[i] <= p[i + 2] {
                (p[i], p[i + 2])
            } else {
                (p[i + 2], p[i])
            };
            matched |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            matched |= p[i] == c;
            i += 1;
        }
    }
    if i >= p.len() {
        // No closing bracket: a literal `[`.
        return (c == '[').then_some(1);
    }
    (matched != negate).then_some(i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::MAX_NAME_LEN;

    #[test]
    fn names_with_slashes_never_share_a_prefix() {
        let a = lock_prefix("", "lock:", "a");
        let ab = lock_prefix("", "lock:", "a/b");
        assert_eq!(a, "lock:a/");
        assert_eq!(ab, "lock:a%2Fb/");
        assert!(!holder_key(&ab, 7, 1).starts_with(&a));
        assert_eq!(
            lock_prefix("/ns/", "", "50%/x"),
            "/ns/50%25%2Fx/".to_string()
        );
        for name in ["a", "a/b", "50%", "%2F", "x/%25/y", "{job}:fence"] {
            assert_eq!(decode_name(&encode_name(name)).as_deref(), Some(name));
        }
        assert_eq!(decode_name("a%2"), None);
        assert_eq!(decode_name("a%41"), None);
    }

    #[test]
    fn keys_parse_back_to_their_name_and_lease() {
        let key = holder_key(
            &lock_prefix("ns/", "lock:", "job/7"),
            0x694d_7a2c_1f3a_0b11,
            0x1f,
        );
        assert_eq!(key, "ns/lock:job%2F7/694d7a2c1f3a0b11/1f");
        assert_eq!(
            parse_key("ns/lock:", &key),
            Some(("job/7".to_string(), 0x694d_7a2c_1f3a_0b11))
        );
        // The shape of older clients and `etcdctl lock`.
        assert_eq!(
            parse_key("ns/lock:", "ns/lock:job%2F7/694d7a2c1f3a0b11"),
            Some(("job/7".to_string(), 0x694d_7a2c_1f3a_0b11))
        );
        for other in [
            "ns/lock:job/",
            "ns/lock:job/xyz",
            "ns/lock:job",
            "other:job/1",
            "ns/lock:a/b/",
            "ns/lock:a/b/xyz",
            "ns/lock:a/b/1/2",
            "ns/lock:a/1/00000000000000001",
        ] {
            assert_eq!(parse_key("ns/lock:", other), None, "{other}");
        }
    }

    #[test]
    fn semaphore_keys_never_meet_a_mutex_key_and_parse_back() {
        let lock = lock_prefix("ns/", "lock:", "jobs/a");
        let sem = SemKeys::new(&lock, 3);
        assert_eq!(sem.slot(2), "ns/lock:jobs%2Fa/sem/3/slot/2");
        assert_eq!(sem.waiter(0x1f, 2), "ns/lock:jobs%2Fa/sem/3/wait/1f/2");
        assert!(sem.slot(2).starts_with(sem.base()));
        let kind = |key: &str| key_kind(&lock, key.as_bytes());
        assert_eq!(
            kind(&sem.slot(2)),
            Some(KeyKind::Slot {
                permits: 3,
                slot: 2
            })
        );
        assert_eq!(
            kind(&sem.waiter(7, 1)),
            Some(KeyKind::Waiter { permits: 3 })
        );
        assert_eq!(kind(&holder_key(&lock, 7, 1)), Some(KeyKind::Mutex));
        assert_eq!(kind("ns/lock:other/sem/3/slot/0"), None);
        for bad in [
            "sem/3/slot/3",
            "sem/0/slot/0",
            "sem/03/slot/0",
            "sem/3/slot/01",
            "sem/3/slot/",
            "sem/3/slot/1/x",
            "sem/3/wait/xyz/1",
            "sem/3/wait/1",
            "sem/1025/slot/0",
            "sem/3/permits",
            "sem/",
        ] {
            assert_eq!(
                kind(&format!("{lock}{bad}")),
                Some(KeyKind::Malformed),
                "{bad}"
            );
        }
        // A mutex key starts with a hex digit, never with `sem/`.
        assert!(!holder_key(&lock, i64::MAX, u64::MAX).starts_with(&format!("{lock}sem/")));
        assert_eq!(
            name_of_key("ns/lock:", &sem.slot(0)).as_deref(),
            Some("jobs/a")
        );
        assert_eq!(
            name_of_key("ns/lock:", &sem.waiter(1, 1)).as_deref(),
            Some("jobs/a")
        );
        assert_eq!(
            name_of_key("ns/lock:", &holder_key(&lock, 1, 1)).as_deref(),
            Some("jobs/a")
        );
        assert_eq!(name_of_key("ns/lock:", "ns/lock:jobs/sem/3/junk"), None);
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        assert_eq!(prefix_end("a\u{ff}"), vec![b'a', 0xc3, 0xc0]);
    }

    #[test]
    fn rwlock_keys_never_meet_the_other_kinds_and_parse_back() {
        let lock = lock_prefix("ns/", "lock:", "docs/a");
        let rw = RwKeys::new(&lock);
        let reader = rw.key(Access::Read, 0x1f, 2);
        let writer = rw.key(Access::Write, 0x1f, 3);
        assert_eq!(reader, "ns/lock:docs%2Fa/rw/r/1f/2");
        assert_eq!(writer, "ns/lock:docs%2Fa/rw/w/1f/3");
        assert!(writer.starts_with(rw.writers()) && !reader.starts_with(rw.writers()));
        assert!(reader.starts_with(rw.base()) && writer.starts_with(rw.base()));
        let kind = |key: &str| key_kind(&lock, key.as_bytes());
        assert_eq!(kind(&reader), Some(KeyKind::Reader));
        assert_eq!(kind(&writer), Some(KeyKind::Writer));
        assert_eq!(kind(&holder_key(&lock, 7, 1)), Some(KeyKind::Mutex));
        assert_eq!(
            kind(&SemKeys::new(&lock, 2).slot(0)),
            Some(KeyKind::Slot {
                permits: 2,
                slot: 0
            })
        );
        for bad in [
            "rw/",
            "rw/r",
            "rw/r/1",
            "rw/x/1/1",
            "rw/r/1/1/1",
            "rw/w/XY/1",
            "rw/w//1",
        ] {
            assert_eq!(
                kind(&format!("{lock}{bad}")),
                Some(KeyKind::RwMalformed),
                "{bad}"
            );
        }
        for k in [KeyKind::Reader, KeyKind::Writer, KeyKind::RwMalformed] {
            assert!(k.is_rwlock());
            assert_eq!(k.lock_kind(), "read-write lock");
        }
        assert!(!KeyKind::Mutex.is_rwlock() && !KeyKind::Malformed.is_rwlock());
        assert_eq!(KeyKind::Mutex.lock_kind(), "mutex");
        assert_eq!(KeyKind::Waiter { permits: 2 }.lock_kind(), "semaphore");
        // A mutex key starts with a hex digit, never with `rw/`.
        assert!(!holder_key(&lock, i64::MAX, u64::MAX).starts_with(rw.base()));
        for key in [&reader, &writer] {
            assert_eq!(name_of_key("ns/lock:", key).as_deref(), Some("docs/a"));
            assert_eq!(parse_key("ns/lock:", key), None);
        }
        assert_eq!(name_of_key("ns/lock:", "ns/lock:docs/rw/x/1/1"), None);
    }

    #[test]
    fn globs_match_like_scan() {
        for (pattern, text, want) in [
            ("*", "anything", true),
            ("invoice:*", "invoice:42", true),
            ("invoice:*", "order:1", false),
            ("job?", "job1", true),
            ("job?", "job12", false),
            ("[ab]x", "bx", true),
            ("[^ab]x", "bx", false),
            ("[a-c]*", "cat", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("*:*:end", "a:b:c:end", true),
            ("", "", true),
            ("[", "[", true),
        ] {
            assert_eq!(glob_match(pattern, text), want, "{pattern} ~ {text}");
        }
    }

    /// Every accepted pair of namespace and lock prefix has keys of its
    /// own: two accepted pairs with the same joined prefix are the same
    /// pair.
    #[test]
    fn namespaces_and_prefixes_that_can_collide_are_refused() {
        // The pair of the report, and its twin.
        assert!(check_key_space("t", "1lock:").is_err());
        assert!(check_key_space("t1", "lock:").is_err());
        assert!(check_key_space("", "a/lock:").is_err());
        let e = check_key_space("secret-ns", "lock:")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("must end with '/'") && !e.contains("secret-ns"),
            "{e}"
        );
        let accepted = [
            ("", "lock:"),
            ("", ""),
            ("", "tlock:"),
            ("t/", "lock:"),
            ("t/", "1lock:"),
            ("t/1/", "lock:"),
            ("/app/", ""),
        ];
        for (ns, prefix) in accepted {
            assert!(check_key_space(ns, prefix).is_ok(), "{ns:?} {prefix:?}");
        }
        for (i, a) in accepted.iter().enumerate() {
            for b in &accepted[i + 1..] {
                assert_ne!(format!("{}{}", a.0, a.1), format!("{}{}", b.0, b.1));
            }
        }
    }

    #[test]
    fn resource_keys_in_the_locks_key_space_are_recognised() {
        assert!(in_lock_space("lock:", "lock:victim/1"));
        assert!(in_lock_space("lock:", "lock:victim/"));
        assert!(in_lock_space("lock:", "lock:a/b"));
        assert!(in_lock_space("", "invoices/42"));
        assert!(!in_lock_space("lock:", "invoices/42"));
        assert!(!in_lock_space("lock:", "lock:victim"));
        assert!(!in_lock_space("lock:", "lock/x"));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("a{b}/c:fence").is_ok());
        for bad in ["", "a\nb", "a\u{202E}b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
