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
        let shown = redact(&raw);
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
        let mut text = text.replace(&self.raw, &self.shown);
        for secret in secrets(&self.raw) {
            text = text.replace(&secret, "***");
        }
        text
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

/// Replaces the password of a Redis URL with `***`, keeping the user:
/// `redis://user:pw@h:p` becomes `redis://user:***@h:p`, `rediss://:pw@h:p`
/// becomes `rediss://:***@h:p`, and the `pass=` / `password=` query forms
/// (`unix:///path?pass=pw`) become `pass=***`.
///
/// This must be the same rule as the lock library's redaction of URLs in its
/// errors (crates/fencelock/src/redis/mod.rs): everything between `://` and
/// the last `@` is credentials, even when a raw (not percent-encoded)
/// password contains `/`, `?` or `#`, and the user is what precedes the
/// first `:`, `/`, `?` or `#` in them. The query forms are redacted on top of
/// that. It is replaced by the library's function once that is public.
fn redact(url: &str) -> String {
    let url = match split_userinfo(url) {
        Some((scheme, userinfo, host_and_path)) => {
            let (user, _) = split_user(userinfo);
            format!("{scheme}://{user}:***@{host_and_path}")
        }
        None => url.to_string(),
    };
    match url.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if is_password_key(key) => format!("{key}=***"),
                    _ => param.to_string(),
                })
                .collect();
            format!("{base}?{}", params.join("&"))
        }
        None => url,
    }
}

/// `(scheme, userinfo, host_and_path)` when the URL has credentials.
fn split_userinfo(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let (userinfo, host_and_path) = rest.rsplit_once('@')?;
    Some((scheme, userinfo, host_and_path))
}

/// `(user, password)` of the credentials of a URL.
fn split_user(userinfo: &str) -> (&str, &str) {
    let end = userinfo
        .find([':', '/', '?', '#'])
        .unwrap_or(userinfo.len());
    let (user, rest) = userinfo.split_at(end);
    (user, rest.strip_prefix(':').unwrap_or(rest))
}

fn is_password_key(key: &str) -> bool {
    key.eq_ignore_ascii_case("pass") || key.eq_ignore_ascii_case("password")
}

/// Every password in `url`, as written and percent-decoded.
fn secrets(url: &str) -> Vec<String> {
    let mut found: Vec<&str> = Vec::new();
    if let Some((_, userinfo, _)) = split_userinfo(url) {
        found.push(split_user(userinfo).1);
    }
    if let Some((_, query)) = url.split_once('?') {
        found.extend(query.split('&').filter_map(|param| {
            param
                .split_once('=')
                .filter(|(key, _)| is_password_key(key))
                .map(|(_, value)| value)
        }));
    }
    let mut secrets: Vec<String> = Vec::new();
    for secret in found.into_iter().filter(|s| !s.is_empty()) {
        for form in [secret.to_string(), percent_decoded(secret)] {
            if !secrets.contains(&form) {
                secrets.push(form);
            }
        }
    }
    // Longest first, so a password containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
            // The library's rule marks a user without a password too.
            ("redis://u@h:1", "redis://u:***@h:1"),
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
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
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
        let unix = RedisUrl::new("unix:///s?pass=one&password=two");
        assert_eq!(
            unix.scrub("unix:///s?pass=one&password=two, then one, two"),
            "unix:///s?pass=***&password=***, then ***, ***"
        );
        let plain = RedisUrl::new("redis://127.0.0.1:7000/");
        assert_eq!(plain.scrub("refused"), "refused");
    }
}
