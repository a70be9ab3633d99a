//! Free loopback ports: [`free_port`] for any server, [`free_cluster_port`]
//! for a Redis Cluster node (whose cluster bus is `port + 10000`).

use std::net::TcpListener;

use crate::error::{Error, Result};

/// The standard ports of the servers this crate starts (Redis, Sentinel,
/// Redis's cluster bus, etcd's client and peer ports, PostgreSQL): a
/// developer's own servers may listen there, so they are never handed out.
pub const STANDARD_PORTS: [u16; 6] = [2379, 2380, 5432, 6379, 16379, 26379];

/// The highest port handed out: a Cluster node needs `port + 10000` for its
/// bus, so ports above this are never handed out.
pub const HIGHEST_PORT: u16 = 55534;

/// How many ports the kernel is asked for before giving up.
const ATTEMPTS: u32 = 1000;

/// A TCP port on `127.0.0.1` that was free a moment ago: binds port 0,
/// reads the port the kernel chose and closes the listener. Never one of
/// [`STANDARD_PORTS`], never above [`HIGHEST_PORT`].
///
/// # Errors
///
/// [`Error::NoFreePort`] if no loopback port can be bound, or none fit in
/// 1000 attempts.
pub fn free_port() -> Result<u16> {
    for _ in 0..ATTEMPTS {
        let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| Error::NoFreePort {
            reason: format!("cannot bind a port on 127.0.0.1: {e}"),
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::NoFreePort {
                reason: format!("cannot read the address of a bound listener: {e}"),
            })?
            .port();
        drop(listener);
        if port <= HIGHEST_PORT && !STANDARD_PORTS.contains(&port) {
            return Ok(port);
        }
    }
    Err(Error::NoFreePort {
        reason: format!("none at or below {HIGHEST_PORT} in {ATTEMPTS} attempts"),
    })
}

/// Like [`free_port`], for a Redis Cluster node: a port whose cluster bus
/// port (`port + 10000`) was free too.
///
/// # Errors
///
/// [`Error::NoFreePort`] if no such port is found in 1000 attempts.
pub fn free_cluster_port() -> Result<u16> {
    for _ in 0..ATTEMPTS {
        let port = free_port()?;
        if TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::NoFreePort {
        reason: format!("none whose cluster bus port (+10000) is free in {ATTEMPTS} attempts"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_avoid_the_standard_ones_and_leave_room_for_a_bus() {
        for _ in 0..200 {
            let port = free_port().expect("a free port");
            assert!(!STANDARD_PORTS.contains(&port), "{port}");
            assert!(port <= HIGHEST_PORT, "{port}");
        }
        let port = free_cluster_port().expect("a free cluster port");
        assert!(TcpListener::bind(("127.0.0.1", port + 10000)).is_ok());
    }
}
