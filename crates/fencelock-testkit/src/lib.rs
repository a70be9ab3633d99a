//! Test support for `fencelock`: real `redis-server` processes — single,
//! TLS, Cluster and Sentinel —, etcd clusters and PostgreSQL servers with
//! fault injection,
//! and child processes that cannot outlive the test.
//!
//! The servers are started and stopped by `fencelock-servers`; the testkit
//! wraps it with helpers that panic with the server's log (a test wants a
//! clear failure, not an error to handle), TLS test certificates, admin
//! commands and fault injection.
//!
//! # Module map
//!
//! - [`redis_server`]: [`RedisServer`] starts `redis-server` on a free
//!   loopback port in a temporary directory ([`RedisConfig`],
//!   [`Persistence`], password), waits until it answers `PING`, and offers
//!   fault injection: [`RedisServer::pause`] / [`RedisServer::resume`]
//!   (SIGSTOP/SIGCONT), [`RedisServer::kill`] (SIGKILL) and
//!   [`RedisServer::restart`] (same port, same directory). Admin commands go
//!   through [`RedisServer::cmd`].
//! - [`process`]: [`spawn_guarded`] runs any [`std::process::Command`] as a
//!   [`GuardedChild`] (signals, `wait_timeout`, piped stdin/stdout for driving
//!   a worker process line by line), plus [`process_alive`]; a wrapper of
//!   `fencelock_servers::GuardedChild`.
//! - [`worker`]: [`Worker`] drives a process line by line over
//!   stdin/stdout (the library's tests run a lease holder that way, so they
//!   can freeze a real holder with SIGSTOP).
//! - [`postgres`]: [`PgServer`] initialises and starts a PostgreSQL server
//!   on a free loopback port in its own temporary directory (as the
//!   `postgres` user when the tests run as root), with a trusted superuser
//!   URL, [`PgServer::create_database`], [`PgServer::psql`] and
//!   [`PgServer::pause`] / [`PgServer::resume`].
//! - [`tls`]: [`TestCerts`] (a CA, server and client leaves, and bad
//!   variants, made with `rcgen`/ring) and [`TlsConfig`]: with
//!   [`RedisConfig::with_tls`] a [`RedisServer`] listens only on TLS, its
//!   [`RedisServer::url`] is `rediss://`, [`RedisServer::tls_files`] names
//!   the CA and client PEM files, and [`RedisServer::client`] connects with
//!   them; [`ClientAuth::Required`] makes it mutual TLS.
//!
//!   ```no_run
//!   use fencelock_testkit::{ClientAuth, RedisConfig, RedisServer, TlsConfig};
//!
//!   let tls = TlsConfig::default().with_client_auth(ClientAuth::Required);
//!   let server = RedisServer::start_with(RedisConfig::default().with_tls(tls));
//!   let ca_file = &server.tls_files().expect("TLS").ca_cert;
//!   let mut con = server.client().get_connection().expect("mutual TLS");
//!   # let _ = (ca_file, &mut con);
//!   ```
//! - [`cluster`]: [`RedisCluster`] — 3 masters + 3 replicas made by
//!   `fencelock_servers::ClusterSetup`, ready when every node reports
//!   `cluster_state:ok` and every replica is linked; seed URLs, the owner of
//!   a slot or key, masters and replicas, pause/resume/kill/restart of any
//!   node, [`RedisCluster::failover`], and slot-migration helpers.
//!
//!   ```no_run
//!   use fencelock_testkit::RedisCluster;
//!
//!   let mut cluster = RedisCluster::start();
//!   let master = cluster.owner_of_key("lock:{job}");
//!   cluster.kill(master);
//!   let replacement = cluster.wait_replaced(master); // its replica, ~4 s
//!   # let _ = (replacement, cluster.cluster_url());
//!   ```
//! - [`sentinel`]: [`RedisSentinel`] — a primary, 2 replicas and 3
//!   sentinels (quorum 2, `down-after-milliseconds 1000`), ready when every
//!   sentinel reports quorum; the `redis+sentinel://` URL, the current
//!   primary, pause/resume/kill/restart of any process ([`SentinelNode`]),
//!   [`RedisSentinel::failover`], and extra data-node configuration
//!   ([`RedisSentinelConfig::data`]: `min-replicas-to-write`, a password,
//!   ACL users).
//!
//!   ```no_run
//!   use fencelock_testkit::{RedisSentinel, SentinelNode};
//!
//!   let sentinel = RedisSentinel::start();
//!   let old = sentinel.primary();
//!   let _frozen = sentinel.pause_guard(SentinelNode::Data(old));
//!   let new = sentinel.wait_new_primary(old); // ~3 s
//!   # let _ = (new, sentinel.url());
//!   ```
//! - [`etcd`]: [`EtcdCluster`] — one ([`EtcdCluster::single`]) or three
//!   ([`EtcdCluster::start`]) `etcd` members on free client and peer ports,
//!   ready when every member reports healthy; the `etcd://` URL, the
//!   leader, pause/resume/kill/restart of any member, and
//!   [`EtcdCluster::move_leader`]. [`EtcdConfig::with_tls`] makes clients
//!   use TLS (`etcds://`). Admin calls go through `etcdctl`.
//!
//!   ```no_run
//!   use fencelock_testkit::EtcdCluster;
//!
//!   let mut cluster = EtcdCluster::start();
//!   let leader = cluster.leader();
//!   cluster.kill(leader);
//!   let new_leader = cluster.wait_new_leader(leader); // about a second
//!   # let _ = (new_leader, cluster.url());
//!   ```
//! - [`acl`]: [`RedisServer::acl_user`] creates an ACL user with an exact
//!   rule; [`acl::readme_acl_rule`] is the rule the README recommends for a
//!   fencelock user, read from the README.
//! - [`server_process`]: what the server types share: [`PausedGuard`] and
//!   [`Pausable`] (`pause_guard` of every server).
//! - [`free_port`]: a free loopback port for servers, or for URLs where
//!   nothing listens ([`RedisServer::client_url_unreachable`]).
//!
//! # TLS crypto provider
//!
//! The testkit enables redis-rs' `tls-rustls`, `tls-rustls-insecure` and
//! `tokio-rustls-comp` features with rustls' `ring` provider only (no
//! aws-lc). redis-rs takes rustls' process-wide default provider, so the
//! testkit installs ring as that default ([`tls::install_crypto_provider`])
//! before its first TLS connection; it keeps a provider the test installed
//! first.
//!
//! # Orphan safety
//!
//! Every child process — redis servers included — is forked from
//! `fencelock-servers`' one dedicated, long-lived "spawner" thread with
//! `PR_SET_PDEATHSIG = SIGKILL`.
//! The kernel kills such a child when the thread that forked it dies; since
//! that thread lives until the test process exits, children die with the test
//! process even if it is killed with SIGKILL and no `Drop` runs (nextest does
//! this on timeouts). On the normal path, `Drop` kills and reaps them. Server
//! stdout/stderr go to files in the server's directory, never to inherited
//! pipes.
//!
//! `redis-server` is taken from `PATH`, or from the
//! [`FENCELOCK_REDIS_SERVER_BIN`](redis_server::REDIS_SERVER_BIN_ENV)
//! environment variable; `redis-cli` ([`RedisCluster::cli`]) from next to it,
//! `PATH`, or [`FENCELOCK_REDIS_CLI_BIN`](redis_server::REDIS_CLI_BIN_ENV). Sentinels
//! run as `redis-server sentinel.conf --sentinel`. `etcd` and `etcdctl` are
//! taken from `PATH`, or from [`FENCELOCK_ETCD_BIN`](etcd::ETCD_BIN_ENV) and
//! [`FENCELOCK_ETCDCTL_BIN`](etcd::ETCDCTL_BIN_ENV). Linux only.

pub mod acl;
pub mod cluster;
pub mod etcd;
pub mod postgres;
pub mod process;
pub mod redis_server;
pub mod sentinel;
pub mod server_process;
pub mod tls;
pub mod worker;

pub use cluster::{FailoverMode, RedisCluster, RedisClusterConfig};
pub use etcd::{EtcdCluster, EtcdConfig, MemberPausedGuard};
pub use postgres::{PgPausedGuard, PgServer, remove_leftovers};
pub use process::{GuardedChild, process_alive, spawn_guarded, try_spawn_guarded};
pub use redis_server::{Persistence, RedisConfig, RedisServer};
pub use sentinel::{RedisSentinel, RedisSentinelConfig, SentinelNode};
pub use server_process::{Pausable, PausedGuard};
pub use tls::{CertKey, ClientAuth, ServerCert, TestCerts, TlsConfig, TlsFiles};
pub use worker::Worker;

/// Returns a TCP port on `127.0.0.1` that was free a moment ago
/// ([`fencelock_servers::free_port`]): never a standard port (6379, 2379,
/// …) nor one above 55534 (Redis needs `port + 10000` for its cluster bus).
///
/// # Panics
///
/// Panics if no loopback port can be bound.
pub fn free_port() -> u16 {
    fencelock_servers::free_port().unwrap_or_else(|error| panic!("{error}"))
}
