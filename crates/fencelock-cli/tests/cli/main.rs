//! Tests of the `fencelock` binary, one test binary (each area used to link
//! one of its own). Every test starts its own redis-server through
//! `fencelock_testkit`; `support` holds what they share.
//!
//! Tests whose assertions are timing windows, or that take more than a few
//! seconds, carry `heavy_` in their name, so nextest runs them one at a time
//! (see `.config/nextest.toml`).

mod bench;
mod config;
mod demo;
mod diagnostics;
mod run;
mod secrets;
mod support;
mod torture;
mod tree;
mod update;
mod usage;
