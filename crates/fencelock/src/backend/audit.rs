//! What a Redis deployment must provide for locks to stay safe, checked
//! against what the server reports about itself (`INFO`, which needs no
//! `CONFIG` permission).
//!
//! A client checks the memory policy once at connect: a policy that evicts
//! keys can delete a held lock (a lock key has a ttl, so even the
//! `volatile-*` policies pick it), and another worker then takes it while
//! the first still works.

/// One `field:value` line of an `INFO` reply.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The warning for an evicting memory policy, from an `INFO memory` reply,
/// if the server can evict keys.
pub(crate) fn eviction_warning(info: &str) -> Option<String> {
    let policy = info_field(info, "maxmemory_policy")?;
    let limited = info_field(info, "maxmemory").is_some_and(|m| m != "0");
    (policy != "noeviction" && limited).then(|| {
        format!(
            "maxmemory-policy is {policy} with a memory limit: Redis may evict a held lock and let a second holder in; set maxmemory-policy noeviction"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicting_policies_with_a_limit_are_warned_about() {
        let info = |policy: &str, limit: &str| {
            format!(
                "# Memory\r\nused_memory:1\r\nmaxmemory:{limit}\r\nmaxmemory_policy:{policy}\r\n"
            )
        };
        assert!(eviction_warning(&info("allkeys-lru", "1048576")).is_some());
        assert!(eviction_warning(&info("volatile-ttl", "1048576")).is_some());
        assert!(eviction_warning(&info("noeviction", "1048576")).is_none());
        // No limit: nothing is ever evicted, whatever the policy.
        assert!(eviction_warning(&info("allkeys-lru", "0")).is_none());
        assert!(eviction_warning("garbage").is_none());
    }
}
