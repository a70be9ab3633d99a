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

/// `url` as it may be shown: passwords replaced by `***` (the library's
/// rule, [`fencelock::redact_url`]).
pub(crate) fn url(url: &str) -> String {
    fencelock::redact_url(url)
}

/// The URL in effect, remembered so [`scrub`] can hide it anywhere.
static KNOWN: OnceLock<String> = OnceLock::new();

/// Remembers the Redis URL in effect, so [`scrub`] can hide it anywhere.
pub(crate) fn remember(raw: &str) {
    let _ = KNOWN.set(raw.to_string());
}

/// `text` with the remembered URL shown redacted, its passwords replaced by
/// `***`, and any other `scheme://…` word redacted as a URL.
pub(crate) fn scrub(text: &str) -> String {
    let mut out = match KNOWN.get() {
        Some(raw) => fencelock::redact_url_in(text, raw),
        None => text.to_string(),
    };
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
        assert_eq!(url("not a url"), "***");
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
