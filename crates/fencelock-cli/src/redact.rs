//! Keeping Redis credentials out of everything the CLI prints.
//!
//! The CLI never prints the URL it was given: it prints [`url`], which hides
//! the password of the user info (`redis://user:***@host`) and the `pass` /
//! `password` query parameters (`unix:///run/redis.sock?pass=***`). As a
//! second line of defence, every error line, warning and log line goes
//! through [`scrub`], which replaces the URL in effect and its secrets
//! wherever a message (from the library, redis-rs or the system) repeats
//! them.

use std::io::Write;
use std::sync::OnceLock;

/// Query parameters that carry a password (redis-rs reads `pass`; `password`
/// is accepted by other clients and may be written by habit).
const SECRET_PARAMS: &[&str] = &["pass", "password"];

/// Secrets shorter than this are only hidden as part of the URL: replacing
/// every `ab` in a message would garble it, and such a password guards
/// nothing anyway.
const MIN_SCRUBBED: usize = 4;

/// `url` as it may be shown: passwords replaced by `***`.
pub(crate) fn url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // Everything before the last '@' is user info, even when a raw (not
    // percent-encoded) password holds '/', '?' or '#': a URL that fails to
    // parse is shown too, so it must be hidden the same way.
    let (userinfo, location) = match rest.rsplit_once('@') {
        Some((userinfo, location)) => {
            let user = userinfo
                .split([':', '/', '?', '#'])
                .next()
                .unwrap_or_default();
            (format!("{user}:***@"), location)
        }
        None => (String::new(), rest),
    };
    let location = match location.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if is_secret_param(key) => format!("{key}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => location.to_string(),
    };
    format!("{scheme}://{userinfo}{location}")
}

fn is_secret_param(key: &str) -> bool {
    SECRET_PARAMS.iter().any(|p| key.eq_ignore_ascii_case(p))
}

/// The passwords in `url`, as written and percent-decoded.
fn secrets(url: &str) -> Vec<String> {
    let Some((_, rest)) = url.split_once("://") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    if let Some((userinfo, _)) = rest.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
    {
        found.push(password.to_string());
    }
    let location = rest.rsplit_once('@').map_or(rest, |(_, l)| l);
    if let Some((_, query)) = location.split_once('?') {
        for pair in query.split(['&', '#']) {
            if let Some((key, value)) = pair.split_once('=')
                && is_secret_param(key)
            {
                found.push(value.to_string());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| percent_decode(s)).collect();
    found.extend(decoded);
    found.retain(|s| !s.is_empty());
    found.sort();
    found.dedup();
    // Longest first, so a secret containing another is replaced whole.
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
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

/// The URL in effect and what to hide of it.
#[derive(Debug)]
struct Known {
    raw: String,
    shown: String,
    secrets: Vec<String>,
}

static KNOWN: OnceLock<Known> = OnceLock::new();

/// Remembers the Redis URL in effect, so [`scrub`] can hide it anywhere.
pub(crate) fn remember(raw: &str) {
    let _ = KNOWN.set(Known {
        raw: raw.to_string(),
        shown: url(raw),
        secrets: secrets(raw),
    });
}

/// `text` with the remembered URL shown redacted, its passwords replaced by
/// `***`, and any other `scheme://…` word redacted as a URL.
pub(crate) fn scrub(text: &str) -> String {
    let mut out = text.to_string();
    if let Some(known) = KNOWN.get() {
        if known.raw != known.shown && !known.raw.is_empty() {
            out = out.replace(&known.raw, &known.shown);
        }
        for secret in known.secrets.iter().filter(|s| s.len() >= MIN_SCRUBBED) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    if out.contains("://") {
        out = out
            .split_inclusive(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`'))
            .map(|word| {
                let end = word
                    .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`'))
                    .unwrap_or(word.len());
                let (token, tail) = word.split_at(end);
                // Punctuation after a URL ("… at URL: reason") is not part
                // of it.
                let bare = token.trim_end_matches([':', ',', ';', '.', ')', ']']);
                let punctuation = &token[bare.len()..];
                if bare.contains("://") {
                    format!("{}{punctuation}{tail}", url(bare))
                } else {
                    word.to_string()
                }
            })
            .collect();
    }
    out
}

/// Log output (`FENCELOCK_LOG`) on stderr, scrubbed event by event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stderr;

/// One log event, written scrubbed to stderr when dropped.
#[derive(Debug)]
pub(crate) struct Event(Vec<u8>);

impl Write for Event {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let text = scrub(&String::from_utf8_lossy(&self.0));
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Event;

    fn make_writer(&'a self) -> Event {
        Event(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(url("redis://127.0.0.1:7000/"), "redis://127.0.0.1:7000/");
        assert_eq!(url("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(url("rediss://u:p@h:1"), "rediss://u:***@h:1");
        assert_eq!(url("redis://:a/b@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(
            url("unix:///run/r.sock?db=2&pass=pw"),
            "unix:///run/r.sock?db=2&pass=***"
        );
        assert_eq!(
            url("redis+unix:///s?PASSWORD=x&user=u"),
            "redis+unix:///s?PASSWORD=***&user=u"
        );
        assert_eq!(
            url("redis+sentinel://u:p@h1:1,h2:2/m?db=1"),
            "redis+sentinel://u:***@h1:1,h2:2/m?db=1"
        );
        assert_eq!(url("not a url"), "not a url");
    }

    #[test]
    fn secrets_are_found_encoded_and_decoded() {
        assert_eq!(secrets("redis://u:p%40ss@h"), ["p%40ss", "p@ss"]);
        assert_eq!(secrets("unix:///s?pass=abc&db=1"), ["abc"]);
        assert!(secrets("redis://h:1").is_empty());
    }

    #[test]
    fn scrub_hides_any_url_word() {
        assert_eq!(
            scrub("cannot reach 'redis://:hunter2@h:1': refused"),
            "cannot reach 'redis://:***@h:1': refused"
        );
        assert_eq!(
            scrub("cannot reach Redis at unix:///s?pass=hunter2: no such file"),
            "cannot reach Redis at unix:///s?pass=***: no such file"
        );
    }
}
