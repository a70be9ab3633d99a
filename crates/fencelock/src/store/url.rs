//! URLs as they may be shown: without credentials.
//!
//! A password can sit in the userinfo (`redis://user:PASSWORD@host`, or a
//! userinfo without `:` that may be a password alone,
//! `redis://PASSWORD@host`) or in the query (`?pass=`, `?password=`,
//! `?sentinel_password=`, or a misspelt `?pasword=`). So what is shown keeps
//! only what is known to hold no secret: the user name before a `:`, the
//! hosts, the path, and the values of the few query parameters that name no
//! secret (a `db` number, a `protocol`, a user name, a `prefix`). Every other
//! value is replaced by `***`. Everything before the last `@` of the part
//! after the scheme is taken as userinfo, even when a raw (not
//! percent-encoded) password contains `/`, `?` or `#`: a URL that fails to
//! parse is shown in the error, so it must be redacted too.

/// Query parameters whose value is shown: it names no secret. A value of
/// one of these that is not the word or number it should be is hidden too
/// (`?db=PASSWORD` is a mistake that must not print the password).
fn shown_value(name: &str, value: &str) -> bool {
    let word = |v: &str| {
        !v.is_empty() && v.len() <= 16 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
    };
    match name.to_ascii_lowercase().as_str() {
        "db" => !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        "protocol" | "timeout" => word(value),
        // A user name or a namespace is no secret.
        "user" | "username" | "sentinel_user" | "sentinel_username" | "prefix" => true,
        _ => false,
    }
}

/// Whether a query parameter carries a password: `pass`, `password`,
/// `passwd` and any name ending in one of them (`sentinel_password`), in any
/// case. Such a value is hidden even when its name is also one whose value
/// is shown.
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "password", "passwd"]
        .iter()
        .any(|suffix| name.ends_with(suffix))
}

/// Schemes whose path is a database number (anything else there is shown
/// as `***`: it is a mistake that may hold anything).
fn path_is_db(scheme: &str) -> bool {
    matches!(
        scheme.to_ascii_lowercase().as_str(),
        "redis" | "rediss" | "valkey" | "valkeys"
    )
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
/// // A userinfo without ':' may be a password alone; an unknown parameter's
/// // value may be a misspelt password parameter's.
/// assert_eq!(fencelock::redact_url("redis://s3cret@db:6379"), "redis://***@db:6379");
/// assert_eq!(fencelock::redact_url("redis://db:6379?pasword=s3cret"), "redis://db:6379?pasword=***");
/// ```
pub fn redact(url: &str) -> String {
    split(url).0
}

/// `url` as shown, and the values it hides (as written).
fn split(url: &str) -> (String, Vec<String>) {
    let mut hidden = Vec::new();
    let Some((scheme, rest)) = url.split_once("://") else {
        // Text without a scheme is no URL: it may be anything, a password
        // pasted in the wrong place included.
        if url.is_empty() {
            return (String::new(), hidden);
        }
        hidden.push(url.to_owned());
        return ("***".to_owned(), hidden);
    };
    let mut shown = format!("{scheme}://");
    let location = match rest.rsplit_once('@') {
        Some((userinfo, location)) => {
            match userinfo.split_once(':') {
                Some((user, password)) if !user.contains(['/', '?', '#']) => {
                    shown.push_str(user);
                    shown.push_str(":***@");
                    hidden.push(password.to_owned());
                }
                // No ':' (or one only after a '/', '?' or '#' that no user
                // name has): the whole userinfo may be a password.
                _ => {
                    shown.push_str("***@");
                    hidden.push(userinfo.to_owned());
                }
            }
            location
        }
        None => rest,
    };
    shown.push_str(&redact_location(location, path_is_db(scheme), &mut hidden));
    (shown, hidden)
}

/// `HOSTS[/PATH][?QUERY][#FRAGMENT]` with the values that may be secret
/// replaced by `***` (and pushed to `hidden`); with `db_path`, a path that
/// is not a database number is hidden too.
fn redact_location(location: &str, db_path: bool, hidden: &mut Vec<String>) -> String {
    let (location, fragment) = match location.split_once('#') {
        Some((l, f)) => (l, Some(f)),
        None => (location, None),
    };
    let (head, query) = match location.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (location, None),
    };
    let mut out = match head.split_once('/') {
        Some((hosts, path))
            if db_path && !path.is_empty() && !path.bytes().all(|b| b.is_ascii_digit()) =>
        {
            hidden.push(path.to_owned());
            format!("{hosts}/***")
        }
        _ => head.to_owned(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, value))
                    if value.is_empty() || (shown_value(name, value) && !is_secret_param(name)) =>
                {
                    param.to_owned()
                }
                Some((name, value)) => {
                    hidden.push(value.to_owned());
                    format!("{name}=***")
                }
                None if param.is_empty() => String::new(),
                // A bare word may be a password pasted in the wrong place.
                None => {
                    hidden.push(param.to_owned());
                    "***".to_owned()
                }
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        if fragment.is_empty() || fragment == "insecure" {
            out.push_str(fragment);
        } else {
            hidden.push(fragment.to_owned());
            out.push_str("***");
        }
    }
    out
}

/// Hidden values shorter than this are hidden only as part of the URL:
/// replacing every `ab` in a message would garble it.
const MIN_SCRUBBED: usize = 4;

/// The values `url` hides (passwords in the userinfo and the query, and
/// whatever else [`redact`] does not show), as written and
/// percent-decoded, longest first (so a secret containing another is
/// replaced whole).
fn secrets(url: &str) -> Vec<String> {
    let mut found = split(url).1;
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
            "redis+unix:///s?user=u&Password=***#***"
        );
        assert_eq!(redact("no scheme?pass=x"), "***");
        assert_eq!(
            redact("redis+sentinel://:pw@a:1,b:2/m?sentinel_password=S&db=1"),
            "redis+sentinel://:***@a:1,b:2/m?sentinel_password=***&db=1"
        );
        assert_eq!(
            redact("redis+sentinel://a:1/m?SENTINEL_PASS=S"),
            "redis+sentinel://a:1/m?SENTINEL_PASS=***"
        );
    }

    /// Whatever may be a password by mistake is hidden too: a userinfo
    /// without ':', a misspelt password parameter, an unknown parameter, a
    /// `db` that is no number, a path that is no database, a bare word in
    /// the query, a fragment other than `insecure`; percent-encoded and
    /// non-ASCII passwords alike.
    #[test]
    fn redact_hides_what_may_be_a_password_by_mistake() {
        for (url, shown) in [
            ("redis://SECRET@h:1", "redis://***@h:1"),
            ("rediss://S%C3%A9CRET@h:1/0", "rediss://***@h:1/0"),
            ("redis://u:pässwört@h:1", "redis://u:***@h:1"),
            ("redis://h:1/?pasword=SECRET", "redis://h:1/?pasword=***"),
            (
                "redis+sentinel://a:1/m?sentinel_pasword=SECRET&db=2",
                "redis+sentinel://a:1/m?sentinel_pasword=***&db=2",
            ),
            (
                "etcd://h:1?auth=SECRET&prefix=app",
                "etcd://h:1?auth=***&prefix=app",
            ),
            ("etcd://h:1?token=SECRET", "etcd://h:1?token=***"),
            (
                "redis+sentinel://a:1/m?db=SECRET",
                "redis+sentinel://a:1/m?db=***",
            ),
            ("redis://h:1/SECRET", "redis://h:1/***"),
            ("redis://h:1/?SECRET", "redis://h:1/?***"),
            ("redis://h:1/0#SECRET", "redis://h:1/0#***"),
            ("rediss://h:1/0#insecure", "rediss://h:1/0#insecure"),
            (
                "redis://h:1?protocol=resp3&timeout=5",
                "redis://h:1?protocol=resp3&timeout=5",
            ),
            ("unix:///s?user=alice&db=1", "unix:///s?user=alice&db=1"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
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
            redact_url_in("user SECRET1 unknown", "redis://SECRET1@h:1"),
            "user *** unknown"
        );
        assert_eq!(
            redact_url_in("unknown pasword=SECRET1", "redis://h:1/?pasword=SECRET1"),
            "unknown pasword=***"
        );
        assert_eq!(
            redact_url_in("refused", "redis://127.0.0.1:7000/"),
            "refused"
        );
    }
}
