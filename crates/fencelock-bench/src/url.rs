//! The Redis URL under test, which shows itself only without its password.

use std::fmt;

/// A Redis URL: connections use the raw form, everything shown (`Display`,
/// `Debug`, reports, errors) uses the redacted one.
#[derive(Clone)]
pub(crate) struct RedisUrl {
    raw: String,
    shown: String,
}

impl RedisUrl {
    pub(crate) fn new(raw: impl Into<String>) -> Self {
        let raw = raw.into();
        let shown = fencelock::redact_url(&raw);
        RedisUrl { raw, shown }
    }

    /// The URL to connect with. Never shown.
    pub(crate) fn raw(&self) -> &str {
        &self.raw
    }

    /// The URL with its password replaced by `***`.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with the raw URL replaced by the redacted one and any other
    /// occurrence of the password (as written in the URL, or percent-decoded)
    /// replaced by `***`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        fencelock::redact_url_in(text, &self.raw)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_keeps_the_user_and_hides_the_password() {
        for (url, shown) in [
            ("redis://127.0.0.1:7000/", "redis://127.0.0.1:7000/"),
            ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
            ("redis://user:pw@h:1", "redis://user:***@h:1"),
            ("rediss://u:p@h:1", "rediss://u:***@h:1"),
            ("rediss://:pw@h:1/2", "rediss://:***@h:1/2"),
            // Raw '/', '#', '?' and '@' in a password: the last '@' ends it.
            ("redis://:a/b@h:1/0", "redis://:***@h:1/0"),
            ("redis://u:a#b?c@h:1", "redis://u:***@h:1"),
            ("redis://u:a@b@h:1", "redis://u:***@h:1"),
            // The library's rule: a userinfo without ':' may be a password
            // alone, so it is hidden whole.
            ("redis://u@h:1", "redis://***@h:1"),
            ("unix:///run/redis.sock", "unix:///run/redis.sock"),
            (
                "unix:///run/redis.sock?pass=pw",
                "unix:///run/redis.sock?pass=***",
            ),
            (
                "unix:///run/redis.sock?password=pw",
                "unix:///run/redis.sock?password=***",
            ),
            (
                "redis+unix:///s?db=2&user=u&pass=pw&protocol=resp3",
                "redis+unix:///s?db=2&user=u&pass=***&protocol=resp3",
            ),
            ("redis://h:1/0?password=pw", "redis://h:1/0?password=***"),
            // Text without a scheme may be anything: hidden whole.
            ("not a url", "***"),
        ] {
            assert_eq!(RedisUrl::new(url).to_string(), shown, "{url}");
            assert_eq!(format!("{:?}", RedisUrl::new(url)), format!("{shown:?}"));
        }
    }

    #[test]
    fn scrub_removes_the_url_and_the_password_in_every_form() {
        let url = RedisUrl::new("redis://u:p%40ss-word@h:1/");
        assert_eq!(url.raw(), "redis://u:p%40ss-word@h:1/");
        assert_eq!(
            url.scrub("cannot connect to redis://u:p%40ss-word@h:1/: auth p@ss-word refused"),
            "cannot connect to redis://u:***@h:1/: auth *** refused"
        );
        let unix = RedisUrl::new("unix:///s?pass=one1&password=two2");
        assert_eq!(
            unix.scrub("unix:///s?pass=one1&password=two2, then one1, two2"),
            "unix:///s?pass=***&password=***, then ***, ***"
        );
        let plain = RedisUrl::new("redis://127.0.0.1:7000/");
        assert_eq!(plain.scrub("refused"), "refused");
    }
}
