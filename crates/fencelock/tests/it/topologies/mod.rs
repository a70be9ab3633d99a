//! Deployments other than one plaintext server: TLS, Sentinel and Cluster,
//! each started by the testkit. Tests of Sentinel and Cluster carry those
//! words in their names, so nextest runs them one at a time.

mod cluster;
mod replication;
mod sentinel;
mod tls;
