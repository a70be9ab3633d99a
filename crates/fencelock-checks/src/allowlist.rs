//! Allowlists that may only shrink: what a check finds today, compared
//! with the list a test keeps of it.

use std::collections::BTreeSet;

/// How what a check found differs from its allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drift {
    /// Found, but not in the list: new findings, to fix.
    pub unexpected: Vec<String>,
    /// In the list, but no longer found: entries to delete.
    pub stale: Vec<String>,
}

impl Drift {
    /// Whether the findings are exactly the list.
    pub fn is_empty(&self) -> bool {
        self.unexpected.is_empty() && self.stale.is_empty()
    }
}

/// `found` compared with `known`, each sorted and without repeats.
pub fn drift<'a>(found: impl IntoIterator<Item = &'a str>, known: &[&str]) -> Drift {
    let found: BTreeSet<&str> = found.into_iter().collect();
    let known: BTreeSet<&str> = known.iter().copied().collect();
    Drift {
        unexpected: found.difference(&known).map(|s| s.to_string()).collect(),
        stale: known.difference(&found).map(|s| s.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_new_findings_and_stale_entries() {
        let d = drift(["a", "b", "b"], &["b", "c"]);
        assert_eq!(d.unexpected, vec!["a".to_string()]);
        assert_eq!(d.stale, vec!["c".to_string()]);
        assert!(!d.is_empty());
        assert!(drift(["x"], &["x"]).is_empty());
    }
}
