//! The lock on etcd (feature `etcd`), against real etcd processes.
//!
//! Tests that start a three-member cluster have `etcd` in their name, so
//! nextest runs them one at a time (`.config/nextest.toml`); the others use
//! one member each and run in parallel (the semaphore's tests, `semaphore.rs`,
//! have `etcd` in theirs too: they contend hard on one member).

mod abandoned;
pub(crate) mod basics;
mod cluster;
mod credentials;
mod fenced_key;
mod migration;
mod races;
mod safety;
mod semaphore;
mod sessions;
mod tls;
