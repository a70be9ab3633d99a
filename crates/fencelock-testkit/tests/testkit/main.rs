//! The testkit's own tests, one test binary: single servers (start, pause,
//! restart, kill, drop), TLS servers, Cluster, Sentinel and etcd topologies.
//!
//! Tests of topologies carry `cluster`, `sentinel` or `etcd` in their names,
//! so nextest runs them one at a time (see `.config/nextest.toml`).

mod cluster;
mod etcd;
mod sentinel;
mod servers;
mod tls;

use std::time::Duration;

/// How long a killed server process may take to disappear.
pub(crate) const GONE_TIMEOUT: Duration = Duration::from_secs(5);
