//! Tests of the `fencelock` binary, one test binary (each area used to link
//! one of its own). Every test starts its own redis-server (or etcd) through
//! `fencelock_testkit`; `support` holds what they share. Tests on etcd have
//! `etcd` in their names and run one at a time, like the `heavy_` ones.
//!
//! Tests whose assertions are timing windows, or that take more than a few
//! seconds, carry `heavy_` in their name, so nextest runs them one at a time
//! (see `.config/nextest.toml`).

mod acl;
mod bench;
mod config;
mod demo;
mod diagnostics;
mod doctor;
mod etcd;
mod etcd_key_space;
mod etcd_paused;
mod etcd_waiters;
mod readme;
mod resource_keys;
mod revoke;
mod run;
mod rwlock;
mod secrets;
mod semaphore;
mod support;
mod topologies;
mod torture;
mod tree;
mod update;
mod usage;
