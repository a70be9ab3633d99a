//! Starts and stops the servers fencelock runs against: `redis-server`
//! (plain or TLS, data node or sentinel), Redis Sentinel set-ups, Redis
//! Clusters and etcd clusters, each on free loopback ports in a temporary
//! directory of its own, killed when dropped **and when this process dies**.
//! Both the `fencelock` command line tool (its private servers) and the
//! test kit start their servers here.
//!
//! Nothing here panics: every fallible step returns an [`Error`] that names
//! the one thing that failed — a missing binary and the Debian package that
//! provides it, a port, a server and the last line of its log.
//!
//! # Module map
//!
//! - [`error`]: [`Error`] and [`Result`].
//! - [`port`]: [`free_port`] and [`free_cluster_port`] (never a standard
//!   port, always room for a cluster bus).
//! - [`binary`]: finding a server's binary ([`Binary`], [`REDIS_SERVER`],
//!   [`ETCD`], …), overridable by an environment variable.
//! - [`child`]: [`GuardedChild`], an orphan-safe child process, and what
//!   `/proc` says of a process ([`process_alive`], [`children_of`], …).
//! - `spawner` (private): the one long-lived thread every child is forked
//!   from, with `PR_SET_PDEATHSIG = SIGKILL`.
//! - [`files`]: a server's temporary directory, config files and logs.
//! - [`wait`]: bounded polling, and launching a server until its probe
//!   answers, on fresh ports while it exits early.
//! - [`run`]: running a command line tool to completion, bounded.
//! - [`tls`]: [`ServerTls`], the PEMs a TLS server presents and trusts
//!   ([`ClientAuth`]).
//! - [`probe`]: [`Probe`], a caller's readiness check ([`RedisTarget`],
//!   [`EtcdTarget`]) for servers the crate's own checks cannot reach (TLS).
//! - [`redis_config`]: [`RedisConfig`] ([`Persistence`], [`RedisRole`],
//!   [`DebugCommand`]).
//! - [`redis_admin`]: URLs, bounded commands, the readiness probe and
//!   `INFO` fields of a running redis-server.
//! - [`redis_server`]: [`RedisServer`], one redis-server process: start,
//!   pause, kill, wipe, start again on the same port.
//! - [`sentinel`]: [`SentinelSetup`], a primary, replicas and sentinels,
//!   ready once the sentinels have quorum.
//! - [`cluster`]: [`ClusterSetup`], a Redis Cluster made with `CLUSTER`
//!   commands, ready once every node reports `cluster_state:ok`.
//! - [`etcd`]: [`EtcdCluster`] of [`EtcdMember`]s, ready once every member
//!   is healthy.
//!
//! # Orphan safety
//!
//! Every child process is forked from one dedicated, long-lived spawner
//! thread with `PR_SET_PDEATHSIG = SIGKILL`. The kernel kills such a child
//! when the thread that forked it dies; since that thread lives until the
//! process exits, children die with the process even if it is killed with
//! SIGKILL and no `Drop` runs. On the normal path, `Drop` kills and reaps
//! them. Servers run in a process group of their own (a terminal's Ctrl-C
//! is the caller's to handle) with stdout and stderr in files of their
//! directory. Linux only.
//!
//! ```no_run
//! use fencelock_servers::{RedisConfig, RedisServer};
//!
//! let server = RedisServer::start(RedisConfig::default())?;
//! println!("{}", server.url()); // redis://127.0.0.1:PORT/
//! # Ok::<(), fencelock_servers::Error>(())
//! ```

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::print_stdout,
        clippy::print_stderr
    )
)]

pub mod binary;
pub mod child;
pub mod cluster;
pub mod error;
pub mod etcd;
pub mod files;
pub mod port;
pub mod probe;
pub mod redis_admin;
pub mod redis_config;
pub mod redis_server;
pub mod run;
pub mod sentinel;
mod spawner;
pub mod tls;
pub mod wait;

pub use binary::{Binary, ETCD, ETCDCTL, REDIS_CLI, REDIS_SERVER};
pub use child::{GuardedChild, children_of, process_alive, process_state, wait_process_gone};
pub use cluster::{ClusterConfig, ClusterParts, ClusterSetup};
pub use error::{Error, Result};
pub use etcd::{EtcdCluster, EtcdConfig, EtcdMember};
pub use port::{free_cluster_port, free_port};
pub use probe::{EtcdTarget, Probe, RedisTarget};
pub use redis_config::{DebugCommand, Persistence, RedisConfig, RedisRole};
pub use redis_server::RedisServer;
pub use sentinel::{SentinelConfig, SentinelParts, SentinelSetup};
pub use tls::{ClientAuth, ServerTls, TlsPaths};
