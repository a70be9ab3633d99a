//! URLs as they may be shown: without credentials.
//!
//! A password can sit in the userinfo (`redis://user:PASSWORD@host`) or in
//! the query (`unix:///run/redis.sock?pass=PASSWORD`, `?password=`,
//! `?sentinel_password=`); all are replaced by `***`. Everything before the
//! last `@` of the part after the scheme is taken as userinfo, even when a
//! raw (not percent-encoded) password contains `/`, `?` or `#`: a URL that
//! fails to parse is shown in the error, so it must be redacted too.

/// Whether a query parameter carries a password: `pass`, `password` and any
/// name ending in one of them (`sentinel_password`, `sentinel_pass`), in any
/// case. A suffix rule rather than a list, so that a parameter a future URL
/// form adds is hidden too.
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "password", "passwd"]
        .iter()
        .any(|suffix| name.ends_with(suffix))
}

/// `url` with every password replaced by `***` (the user name is kept), so it
/// can be shown in errors, logs and output: the rule every fencelock error
/// follows.
///
/// ```
/// assert_eq!(fencelock::redact_url("redis://app:s3cret@db:6379/0"), "redis://app:***@db:6379/0");
/// assert_eq!(
///     fencelock::redact_url("unix:///run/redis.sock?pass=s3cret"),
///     "unix:///run/redis.sock?pass=***"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_query(url);
    };
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, host_and_path)) => {
            let user = userinfo
                .split([':', '/', '?', '#'])
                .next()
                .unwrap_or_default();
            format!("{user}:***@{host_and_path}")
        }
        None => rest.to_owned(),
    };
    format!("{scheme}://{}", redact_query(&rest))
}

/// `text` with the query values of password parameters replaced by `***`.
fn redact_query(text: &str) -> String {
    let Some((head, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if is_secret_param(name) => {
                format!("{name}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    let mut out = format!("{head}?{}", params.join("&"));
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// Passwords shorter than this are hidden only as part of the URL: replacing
/// every `ab` in a message would garble it.
const MIN_SCRUBBED: usize = 4;

/// The passwords `url` carries (userinfo and query), as written and
/// percent-decoded, longest first (so a password containing another is
/// replaced whole).
fn secrets(url: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    if let Some((userinfo, _)) = rest.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
    {
        found.push(password.to_owned());
    }
    let location = rest.rsplit_once('@').map_or(rest, |(_, l)| l);
    if let Some((_, query)) = location.split_once('?') {
        for param in query.split(['&', '#']) {
            if let Some((name, value)) = param.split_once('=')
                && is_secret_param(name)
            {
                found.push(value.to_owned());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| percent_decoded(s)).collect();
    found.extend(decoded);
    found.retain(|s| !s.is_empty());
    found.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    found.dedup();
    found
}

pub(crate) fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if let (b'%', Some(h), Some(l)) = (
            bytes[i],
            bytes.get(i + 1).and_then(|b| hex(*b)),
            bytes.get(i + 2).and_then(|b| hex(*b)),
        ) {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` (for example a client library's error message about `url`) with
/// `url` shown redacted and every password it carries (as written, or
/// percent-decoded, if at least 4 bytes long) replaced by `***`.
///
/// ```
/// let url = "redis://app:s3cr%40t@db:6379/";
/// assert_eq!(
///     fencelock::redact_url_in("auth s3cr@t refused by redis://app:s3cr%40t@db:6379/", url),
///     "auth *** refused by redis://app:***@db:6379/"
/// );
/// ```
pub fn redact_url_in(text: &str, url: &str) -> String {
    let shown = redact(url);
    let mut out = if url.is_empty() || shown == url {
        text.to_owned()
    } else {
        text.replace(url, &shown)
    };
    for secret in secrets(url).iter().filter(|s| s.len() >= MIN_SCRUBBED) {
        out = out.replace(secret.as_str(), "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:7000/"), "redis://127.0.0.1:7000/");
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("rediss://u:p@h:1"), "rediss://u:***@h:1");
        assert_eq!(redact("redis://:a/b@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://u:a#b?c@h:1"), "redis://u:***@h:1");
        assert_eq!(
            redact("unix:///run/r.sock?db=2&pass=SECRET"),
            "unix:///run/r.sock?db=2&pass=***"
        );
        assert_eq!(
            redact("redis+unix:///s?user=u&Password=SECRET#x"),
            "redis+unix:///s?user=u&Password=***#x"
        );
        assert_eq!(redact("no scheme?pass=x"), "no scheme?pass=***");
        assert_eq!(
            redact("redis+sentinel://:pw@a:1,b:2/m?sentinel_password=S&db=1"),
            "redis+sentinel://:***@a:1,b:2/m?sentinel_password=***&db=1"
        );
        assert_eq!(
            redact("redis+sentinel://a:1/m?SENTINEL_PASS=S"),
            "redis+sentinel://a:1/m?SENTINEL_PASS=***"
        );
    }

    #[test]
    fn redact_url_in_removes_the_url_and_its_passwords() {
        let url = "unix:///run/r.sock?pass=S3CRET";
        assert_eq!(
            redact_url_in("cannot open unix:///run/r.sock?pass=S3CRET (S3CRET)", url),
            "cannot open unix:///run/r.sock?pass=*** (***)"
        );
        assert_eq!(
            redact_url_in("wrong pw77 here", "redis://u:pw77@h"),
            "wrong *** here"
        );
        let encoded = "redis://u:p%40ss-word@h:1/";
        assert_eq!(
            redact_url_in(
                "at redis://u:p%40ss-word@h:1/: auth p@ss-word refused",
                encoded
            ),
            "at redis://u:***@h:1/: auth *** refused"
        );
        assert_eq!(
            redact_url_in(
                "unix:///s?pass=one1&password=two2, one1, two2",
                "unix:///s?pass=one1&password=two2"
            ),
            "unix:///s?pass=***&password=***, ***, ***"
        );
        assert_eq!(
            redact_url_in(
                "sentinel auth s3ntinel refused",
                "redis+sentinel://a:1/m?sentinel_password=s3ntinel"
            ),
            "sentinel auth *** refused"
        );
        assert_eq!(
            redact_url_in("refused", "redis://127.0.0.1:7000/"),
            "refused"
        );
    }
}
