//! Fenced Postgres rows (feature `postgres`) against real servers.

mod errors;
mod fencing;
mod metrics;
mod races;
mod revoke;
mod testkit;
mod workers;
