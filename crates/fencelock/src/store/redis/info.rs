//! What a Redis deployment must provide for locks to stay safe, checked
//! against what the server reports about itself (`INFO`, which needs no
//! `CONFIG` permission).
//!
//! A client checks the memory policy once at connect: a policy that evicts
//! keys can delete a held lock (a lock key has a ttl, so even the
//! `volatile-*` policies pick it), and another worker then takes it while
//! the first still works. The deployment audit (`crate::audit`) reads the
//! same fields.

/// One `field:value` line of an `INFO` reply.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The memory settings of a server, from an `INFO memory` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoryPolicy<'a> {
    /// `maxmemory-policy`.
    pub(crate) policy: &'a str,
    /// `maxmemory` in bytes (0: no limit).
    pub(crate) limit: u64,
}

impl MemoryPolicy<'_> {
    /// Whether Redis may evict keys: a memory limit with any policy but
    /// `noeviction`.
    pub(crate) fn evicts(&self) -> bool {
        self.policy != "noeviction" && self.limit != 0
    }
}

/// The memory policy an `INFO memory` reply shows, if it shows one.
pub(crate) fn memory_policy(info: &str) -> Option<MemoryPolicy<'_>> {
    Some(MemoryPolicy {
        policy: info_field(info, "maxmemory_policy")?,
        limit: info_field(info, "maxmemory").and_then(|m| m.parse().ok())?,
    })
}

/// The warning for an evicting memory policy, from an `INFO memory` reply,
/// if the server can evict keys.
pub(crate) fn eviction_warning(info: &str) -> Option<String> {
    let memory = memory_policy(info)?;
    memory.evicts().then(|| {
        format!(
            "maxmemory-policy is {} with a memory limit: Redis may evict a held lock and let a second holder in; set maxmemory-policy noeviction",
            memory.policy
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
