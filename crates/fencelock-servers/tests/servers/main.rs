//! The crate's own tests, one test binary, against real processes: what a
//! start reports when it fails (a missing binary, a port in use, a server
//! that dies during start-up), and the life of a redis-server and of an
//! etcd member.
//!
//! Tests that start etcd carry `etcd` in their names, so nextest runs them
//! one at a time (see `.config/nextest.toml`).

mod errors;
mod lifecycle;
