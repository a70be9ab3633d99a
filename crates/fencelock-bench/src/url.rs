//! The Redis URL under test.

use std::fmt;

/// A Redis URL: connections use the raw form, everything shown (`Display`,
/// `Debug`, reports, errors) uses [`RedisUrl::shown`].
#[derive(Clone)]
pub(crate) struct RedisUrl {
    raw: String,
    shown: String,
}

impl RedisUrl {
    pub(crate) fn new(raw: impl Into<String>) -> Self {
        let raw = raw.into();
        let shown = raw.clone();
        RedisUrl { raw, shown }
    }

    /// The URL to connect with. Never shown.
    pub(crate) fn raw(&self) -> &str {
        &self.raw
    }

    /// The URL as shown.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with the raw URL replaced by the shown one.
    pub(crate) fn scrub(&self, text: &str) -> String {
        text.replace(&self.raw, &self.shown)
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.shown, f)
    }
}
