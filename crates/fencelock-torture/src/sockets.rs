//! A worker process's TCP connections to a Redis node, read from `/proc`
//! (Linux): the addresses `CLIENT KILL ADDR` names them by, when no proxy
//! stands between the workers and Redis (a Sentinel or a Cluster hands the
//! workers the nodes' own addresses).
//!
//! A socket of the process is a link `socket:[INODE]` in `/proc/PID/fd`;
//! `/proc/net/tcp` and `/proc/net/tcp6` give each established socket's
//! inode with its local and remote address. The local address is the one
//! Redis sees as the client's.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use nix::unistd::Pid;

/// The address of the node a `redis://host:port` URL names (`None` for
/// other URLs).
pub(crate) fn node_addr(url: &str) -> Option<SocketAddr> {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))?;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let hostport = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:6379")
    };
    hostport.to_socket_addrs().ok()?.next()
}

/// The local addresses of `pid`'s established TCP connections to `node`
/// (none if the process or `/proc` cannot be read).
pub(crate) fn connections_to(pid: Pid, node: Option<SocketAddr>) -> Vec<SocketAddr> {
    let Some(node) = node else {
        return Vec::new();
    };
    let inodes = socket_inodes(pid);
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            if let Some((local, remote, inode)) = parse_line(line)
                && inodes.contains(&inode)
                && same_endpoint(remote, node)
            {
                out.push(local);
            }
        }
    }
    out
}

/// The inodes of the sockets `pid` has open.
fn socket_inodes(pid: Pid) -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy();
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// `remote` is `node`, also when one is an IPv4-mapped IPv6 address.
fn same_endpoint(remote: SocketAddr, node: SocketAddr) -> bool {
    let plain = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        ip => ip,
    };
    remote.port() == node.port() && plain(remote) == plain(node)
}

/// (local, remote, inode) of an established socket's line in
/// `/proc/net/tcp[6]`.
fn parse_line(line: &str) -> Option<(SocketAddr, SocketAddr, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st queues tr retrnsmt uid timeout inode
    if fields.len() < 10 || fields[3] != "01" {
        return None;
    }
    let local = parse_addr(fields[1])?;
    let remote = parse_addr(fields[2])?;
    let inode = fields[9].parse().ok()?;
    Some((local, remote, inode))
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the address
/// as the kernel prints it, words in native byte order.
fn parse_addr(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(&ip[i * 8..i * 8 + 8])?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_its_own_connection_to_a_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let node = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(node).expect("connect");
        let _accepted = listener.accept().expect("accept");
        let found = connections_to(Pid::this(), Some(node));
        assert_eq!(found, vec![client.local_addr().expect("local")]);
        let url = format!("redis://user:pw@127.0.0.1:{}/0", node.port());
        assert_eq!(node_addr(&url), Some(node));
    }

    #[test]
    fn parses_the_kernel_format() {
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_addr("0100007F:1F90"),
                Some("127.0.0.1:8080".parse().expect("addr"))
            );
        }
    }
}
