//! ACL users for tests of Redis permissions: [`RedisServer::acl_user`]
//! creates one, and [`readme_acl_rule`] is the rule the README recommends
//! for a fencelock user, read from the README itself so that the tests check
//! exactly what users copy.
//!
//! ```no_run
//! use fencelock_testkit::{RedisServer, acl::readme_acl_rule};
//!
//! let server = RedisServer::start();
//! let rule = readme_acl_rule();
//! let without_zadd: Vec<&str> = rule.iter().map(String::as_str).filter(|p| *p != "+zadd").collect();
//! let url = server.acl_user("app", &without_zadd);
//! # let _ = url;
//! ```

use crate::redis_server::RedisServer;

/// The README of the workspace, where the recommended rule is documented.
const README: &str = include_str!("../../../README.md");

/// How the README's copy-paste line starts: everything after the password is
/// the rule.
const SETUSER_PREFIX: &str = "ACL SETUSER fencelock reset on >";

/// The password every [`RedisServer::acl_user`] gets.
pub const ACL_PASSWORD: &str = "acl-test-pw";

/// The rule of the README's `ACL SETUSER fencelock …` line: its key and
/// channel patterns and commands (`~lock:*`, `&lock:*`, `+evalsha`, …),
/// without the user name, `reset`, `on` and the password.
///
/// # Panics
///
/// Panics if the README has no such line.
pub fn readme_acl_rule() -> Vec<String> {
    let line = README
        .lines()
        .find_map(|line| line.trim().strip_prefix(SETUSER_PREFIX))
        .unwrap_or_else(|| panic!("README.md has no line starting with {SETUSER_PREFIX:?}"));
    // The first word is the password placeholder.
    line.split_whitespace().skip(1).map(str::to_owned).collect()
}

impl RedisServer {
    /// Creates (or redefines) the ACL user `name` with password
    /// [`ACL_PASSWORD`] and exactly `rules` (after `reset on`: nothing is
    /// inherited from an earlier definition), and returns its URL,
    /// `redis://NAME:PASSWORD@127.0.0.1:PORT/` (`rediss://` for a TLS
    /// server). `name` must be URL-safe.
    ///
    /// # Panics
    ///
    /// Panics if the server refuses the rule.
    pub fn acl_user<S: AsRef<str>>(&self, name: &str, rules: &[S]) -> String {
        let mut cmd = vec!["ACL", "SETUSER", name, "reset", "on"];
        let password = format!(">{ACL_PASSWORD}");
        cmd.push(&password);
        cmd.extend(rules.iter().map(AsRef::as_ref));
        self.cmd(&cmd);
        let url = self.url();
        let (scheme, rest) = url.split_once("://").unwrap_or(("redis", &url));
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{name}:{ACL_PASSWORD}@{host}")
    }
}
