//! URLs as they may be shown: without credentials.

/// Removes the password from a URL so it can be shown in errors and logs.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // Everything before the last '@' is credentials, even when a raw
    // (not percent-encoded) password contains '/', '?' or '#': a URL that
    // fails to parse is shown in the error, so it must be redacted too.
    match rest.rsplit_once('@') {
        Some((userinfo, host_and_path)) => {
            let user = userinfo
                .split([':', '/', '?', '#'])
                .next()
                .unwrap_or_default();
            format!("{scheme}://{user}:***@{host_and_path}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:7000/"), "redis://127.0.0.1:7000/");
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("rediss://u:p@h:1"), "rediss://u:***@h:1");
        assert_eq!(redact("redis://:a/b@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://u:a#b?c@h:1"), "redis://u:***@h:1");
    }
}
