//! The fence: a number that grows with every grant of a lock name.

use std::fmt;
use std::str::FromStr;

/// A fencing token. Every grant of a lock name gets a fence greater than every
/// fence issued before for that name (see the crate docs for the exact
/// guarantee of each [`FenceMode`](crate::FenceMode)). Hand it to every write
/// the lock protects; the resource refuses writes carrying an older fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// Wraps a raw fence value (for example one read back from a resource or
    /// passed on a command line).
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for Fence {
    fn from(value: u64) -> Self {
        Fence(value)
    }
}

impl From<Fence> for u64 {
    fn from(fence: Fence) -> Self {
        fence.0
    }
}

impl FromStr for Fence {
    type Err = std::num::ParseIntError;

    /// Parses a decimal fence; leading `+` or zeros are accepted and the
    /// value is canonicalised.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse::<u64>().map(Fence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_numerically_not_lexically() {
        assert!(Fence::new(9) < Fence::new(10));
        assert_eq!(
            "0010".parse::<Fence>().map(|f| f.to_string()),
            Ok("10".to_string())
        );
        assert!("-1".parse::<Fence>().is_err());
    }
}
