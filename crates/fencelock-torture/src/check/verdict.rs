//! A checker's verdict: [`CheckResult`], its first [`Violation`], and the
//! [`SLACK`] C5 allows.
//!
//! Below `check` and its checkers (`lock`, `resource`) alike, as `index`
//! is: the checkers write verdicts, `check` collects them, and neither
//! imports the other for it.

use super::index::Index;

/// How much later than one renewal interval a loss signal may come (C5):
/// scheduling on a loaded machine, and reconnecting after a restart.
pub const SLACK: std::time::Duration = std::time::Duration::from_millis(150);

/// One checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// `C1` … `C7`.
    pub id: &'static str,
    /// The rule, in words.
    pub rule: &'static str,
    /// How many items (writes, leases, grants …) it checked.
    pub checked: u64,
    /// How many broke the rule.
    pub violations: u64,
    /// How many broke it where the design promises nothing (see the module
    /// docs), not counted as violations.
    pub excused: u64,
    /// Why what was excused is not promised, one sentence per reason.
    pub notes: Vec<String>,
    /// The first violation, if any.
    pub first: Option<Violation>,
}

/// A violation with its surrounding history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// When it happened (µs since the start of the run).
    pub at: i64,
    /// What is wrong.
    pub message: String,
    /// The events around it (JSON lines).
    pub context: Vec<String>,
}

impl CheckResult {
    pub(super) fn new(id: &'static str, rule: &'static str) -> Self {
        CheckResult {
            id,
            rule,
            checked: 0,
            violations: 0,
            excused: 0,
            notes: Vec::new(),
            first: None,
        }
    }

    /// Records an excused breach and why it is not promised.
    pub(super) fn excuse(&mut self, why: &str) {
        self.excused += 1;
        if !self.notes.iter().any(|n| n == why) {
            self.notes.push(why.to_string());
        }
    }

    /// Records a violation; keeps the earliest.
    pub(super) fn violation(
        &mut self,
        index: &Index<'_>,
        at: i64,
        message: String,
        ops: &[&str],
        name: &str,
    ) {
        self.violations += 1;
        if self.first.as_ref().is_none_or(|f| at < f.at) {
            self.first = Some(Violation {
                at,
                message,
                context: index.context(ops, name, at),
            });
        }
    }

    /// Whether the rule held.
    pub fn passed(&self) -> bool {
        self.violations == 0
    }
}
