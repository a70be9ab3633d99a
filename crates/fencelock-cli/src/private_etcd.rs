//! A private etcd cluster for `fencelock torture --topology etcd`: three
//! members of a [`fencelock_servers::EtcdCluster`] on free loopback ports
//! (a client and a peer port each), each with its data directory and its
//! log in the cluster's temporary directory (on disk: each member
//! preallocates a 64 MB write-ahead log).
//!
//! Every member is tied to this process by the parent-death signal and
//! killed when dropped, like a [`crate::private_redis::PrivateRedis`]: no
//! member outlives `fencelock`, not even a SIGKILL of it. The nemeses pause
//! a member (SIGSTOP), kill it and start it again on the same ports with
//! its data directory (a member that lost its data could not rejoin as the
//! same member), and move the leadership (`MoveLeader`).
//!
//! Members elect quickly (`--heartbeat-interval 50 --election-timeout
//! 500`, a tenth of etcd's defaults), so a paused or killed leader is
//! replaced within about a second; etcd's shortest lease is then 1 s.
//! Members are ready once `GET /health` says so; administrative calls
//! (status, leader, move-leader) go through etcd-client, to one member at
//! a time, bounded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use etcd_client::{Client, ConnectOptions};
use fencelock_servers::{EtcdCluster, EtcdConfig};

use crate::private_redis::{locked, off_runtime, server_error, start_blocking};

/// Members of the cluster.
const MEMBERS: usize = 3;
/// One administrative call, at most (a paused member fails it).
const CALL: Duration = Duration::from_secs(1);

/// A running private etcd cluster.
#[derive(Debug)]
pub(crate) struct PrivateEtcd {
    cluster: Arc<Mutex<EtcdCluster>>,
    /// Client addresses, names and Raft ids of the members, by index.
    addrs: Vec<String>,
    names: Vec<String>,
    ids: Vec<u64>,
    url: String,
}

impl PrivateEtcd {
    /// Starts three members and returns once every member is healthy and
    /// has told its Raft id (fresh ports are tried again if a member exits
    /// at start, as a port picked free may be taken before etcd binds it).
    pub(crate) async fn start() -> anyhow::Result<Self> {
        // On disk, not in /dev/shm: each member preallocates a 64 MB
        // write-ahead log, which a SIGKILL of this process would leave in
        // memory.
        let config = EtcdConfig {
            members: MEMBERS,
            ..EtcdConfig::default()
        };
        let cluster = start_blocking(move || EtcdCluster::start(config))
            .await?
            .map_err(etcd_error)?;
        let addrs: Vec<String> = (0..cluster.len()).map(|i| cluster.addr(i)).collect();
        let names = cluster
            .members()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        let url = cluster.url();
        let mut etcd = PrivateEtcd {
            cluster: Arc::new(Mutex::new(cluster)),
            addrs,
            names,
            ids: Vec::new(),
            url,
        };
        for i in 0..MEMBERS {
            let (id, _) = etcd.status(i).await.map_err(anyhow::Error::msg)?;
            locked(&etcd.cluster)?.set_member_id(i, id);
            etcd.ids.push(id);
        }
        Ok(etcd)
    }

    /// `etcd://` with every member's client address.
    pub(crate) fn url(&self) -> String {
        self.url.clone()
    }

    /// `127.0.0.1:PORT` of member `i`'s client port.
    pub(crate) fn addr(&self, i: usize) -> String {
        self.addrs[i].clone()
    }

    /// How many members the cluster has.
    pub(crate) fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Member `i`'s name (`m0`, `m1`, `m2`).
    pub(crate) fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// SIGSTOP member `i`: it stops answering, voting and sending
    /// heartbeats until resumed.
    pub(crate) fn pause(&self, i: usize) -> anyhow::Result<()> {
        locked(&self.cluster)?
            .pause(i)
            .context("cannot stop the etcd member")
    }

    /// SIGCONT member `i`.
    pub(crate) fn resume(&self, i: usize) -> anyhow::Result<()> {
        locked(&self.cluster)?.resume(i);
        Ok(())
    }

    /// kill -9 member `i` and wait for it.
    pub(crate) async fn kill(&mut self, i: usize) {
        if let Ok(mut cluster) = locked(&self.cluster) {
            cluster.kill(i);
        }
    }

    /// Starts member `i` again on its ports with its data directory and
    /// returns once every running member is healthy.
    pub(crate) async fn start_again(&mut self, i: usize) -> anyhow::Result<()> {
        off_runtime(&self.cluster, move |cluster| {
            cluster.restart(i)?;
            cluster.wait_ready(fencelock_servers::etcd::READY_DEADLINE)
        })
        .await?
        .map_err(anyhow::Error::new)
    }

    /// The index of the leader every answering member names, bounded.
    pub(crate) async fn leader(&self) -> Result<usize, String> {
        let mut named = None;
        for i in 0..self.len() {
            let Ok((_, leader)) = self.status(i).await else {
                continue;
            };
            if leader == 0 {
                return Err(format!("{} knows no leader", self.names[i]));
            }
            match named {
                Some(l) if l != leader => {
                    return Err("the members name different leaders".to_string());
                }
                _ => named = Some(leader),
            }
        }
        let leader = named.ok_or("no member answers")?;
        self.ids
            .iter()
            .position(|&id| id == leader)
            .ok_or_else(|| format!("the leader {leader:x} is not a member"))
    }

    /// Asks the leader `from` to hand the leadership to member `to`.
    pub(crate) async fn move_leader(&self, from: usize, to: usize) -> Result<(), String> {
        let mut client = self.client(from).await?;
        let target = self.ids[to];
        tokio::time::timeout(Duration::from_secs(5), client.move_leader(target))
            .await
            .map_err(|_| format!("move-leader on {}: no reply within 5 s", self.addr(from)))?
            .map(drop)
            .map_err(|e| format!("move-leader on {}: {e}", self.addr(from)))
    }

    /// Stops every member and waits for them.
    pub(crate) async fn stop(mut self) {
        for i in 0..self.len() {
            let _ = self.resume(i);
            self.kill(i).await;
        }
    }

    /// Member `i`'s own id and the leader it names (0: none), bounded.
    async fn status(&self, i: usize) -> Result<(u64, u64), String> {
        let mut client = self.client(i).await?;
        let status = tokio::time::timeout(CALL, client.status())
            .await
            .map_err(|_| format!("{}: no status within {CALL:?}", self.addr(i)))?
            .map_err(|e| format!("{}: {e}", self.addr(i)))?;
        let id = status.header().map_or(0, |h| h.member_id());
        Ok((id, status.leader()))
    }

    async fn client(&self, i: usize) -> Result<Client, String> {
        let options = ConnectOptions::new()
            .with_connect_timeout(CALL)
            .with_timeout(CALL);
        tokio::time::timeout(
            CALL * 2,
            Client::connect([format!("http://{}", self.addr(i))], Some(options)),
        )
        .await
        .map_err(|_| format!("{}: no connection within {:?}", self.addr(i), CALL * 2))?
        .map_err(|e| format!("{}: {e}", self.addr(i)))
    }
}

/// A `fencelock-servers` error of the private etcd: a missing binary is a
/// configuration error (exit 78) that says how to install it.
fn etcd_error(e: fencelock_servers::Error) -> anyhow::Error {
    server_error(
        e,
        fencelock_servers::ETCD,
        "or pass --url etcd://… to use a running etcd",
    )
}
