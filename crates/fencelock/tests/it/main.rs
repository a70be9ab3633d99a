//! The library's integration tests, one binary (linking each area as a
//! binary of its own took most of the test build). Every test starts its own
//! servers through `fencelock_testkit`; `support` holds what they share.
//!
//! Tests whose assertions are timing windows, or that take more than a few
//! seconds, carry `heavy_` in their name, so nextest runs them one at a time
//! (see `.config/nextest.toml`). Functions ending in `_entry` are process
//! entry points that tests start by re-running this binary; they are not
//! tests of their own and are filtered out.

// The ACL test's one async block nests every operation's future; computing
// its layout from a clean build passes rustc's default query depth of 128.
#![recursion_limit = "256"]

mod acl;
mod audit;
mod bad_input;
mod coalesce;
#[cfg(feature = "etcd")]
mod consensus;
mod credentials;
#[cfg(feature = "postgres")]
mod examples;
mod exclusion;
mod fence_rule;
mod fences;
mod guide_scenario;
mod hostile;
mod keeper;
mod lease;
mod metrics;
mod owned;
#[cfg(feature = "postgres")]
mod postgres;
mod resource;
mod resource_slots;
mod revoke;
mod rwlock;
#[cfg(feature = "etcd")]
mod rwlock_etcd;
mod semaphore;
mod support;
mod topologies;
mod two_command_race;
mod validated_read;
mod wait_modes;
