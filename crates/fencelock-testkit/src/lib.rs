//! Test support for `fencelock`: real `redis-server` processes with fault
//! injection, and child processes that cannot outlive the test.
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
//!   a worker process line by line), plus [`process_alive`].
//! - [`worker`]: [`Worker`] drives a `fencelock-worker` process (a lease
//!   holder in its own process, line protocol on stdin/stdout) so tests can
//!   freeze a real holder with SIGSTOP.
//! - [`postgres`]: [`PgServer`] initialises and starts a PostgreSQL server
//!   on a free loopback port in its own temporary directory (as the
//!   `postgres` user when the tests run as root), with a trusted superuser
//!   URL, [`PgServer::create_database`], [`PgServer::psql`] and
//!   [`PgServer::pause`] / [`PgServer::resume`].
//! - [`free_port`]: a free loopback port for servers, or for URLs where
//!   nothing listens ([`RedisServer::client_url_unreachable`]).
//!
//! # Orphan safety
//!
//! Every child process — redis servers included — is forked from one
//! dedicated, long-lived "spawner" thread with `PR_SET_PDEATHSIG = SIGKILL`.
//! The kernel kills such a child when the thread that forked it dies; since
//! that thread lives until the test process exits, children die with the test
//! process even if it is killed with SIGKILL and no `Drop` runs (nextest does
//! this on timeouts). On the normal path, `Drop` kills and reaps them. Server
//! stdout/stderr go to files in the server's directory, never to inherited
//! pipes.
//!
//! `redis-server` is taken from `PATH`, or from the
//! [`FENCELOCK_REDIS_SERVER_BIN`](redis_server::REDIS_SERVER_BIN_ENV)
//! environment variable. Linux only.

pub mod postgres;
pub mod process;
pub mod redis_server;
pub mod server_process;
mod spawner;
pub mod tls;
pub mod worker;

use std::net::TcpListener;

pub use postgres::{PgPausedGuard, PgServer, remove_leftovers};
pub use process::{GuardedChild, process_alive, spawn_guarded, try_spawn_guarded};
pub use redis_server::{Persistence, RedisConfig, RedisServer};
pub use server_process::{Pausable, PausedGuard};
pub use tls::{CertKey, ClientAuth, ServerCert, TestCerts, TlsConfig, TlsFiles};
pub use worker::Worker;

/// Returns a TCP port on `127.0.0.1` that was free a moment ago: binds port
/// 0, reads the port the kernel chose, and closes the listener. Never returns
/// 6379 (a developer's own Redis) nor a port ≥ 55535 (Redis needs
/// `port + 10000` for its cluster bus).
///
/// # Panics
///
/// Panics if no loopback port can be bound.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).expect("failed to bind a port on 127.0.0.1");
        let port = listener
            .local_addr()
            .expect("failed to read the local address of a bound listener")
            .port();
        drop(listener);
        if port != 6379 && port < 55535 {
            return port;
        }
    }
    panic!("found no free loopback port below 55535 in 1000 attempts")
}

/// Like [`free_port`], for a Redis Cluster node: a loopback port that was
/// free a moment ago and whose cluster bus port (`port + 10000`) was free
/// too.
///
/// # Panics
///
/// Panics if no such port is found in 1000 attempts.
pub(crate) fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = free_port();
        if TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
    panic!("found no free loopback port whose cluster bus port (+10000) is free in 1000 attempts")
}
