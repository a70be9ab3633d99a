//! A private etcd cluster for `fencelock torture --topology etcd`: three
//! members on free loopback ports (a client and a peer port each), each
//! with its data directory and its log in the cluster's temporary
//! directory (on disk: each member preallocates a 64 MB write-ahead log).
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
//! Administrative calls (status, leader, move-leader) go through
//! etcd-client, to one member at a time, bounded.

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use etcd_client::{Client, ConnectOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::exit;

/// Members of the cluster.
const MEMBERS: usize = 3;
/// Raft heartbeat, in ms.
const HEARTBEAT_MS: u64 = 50;
/// Raft election timeout, in ms.
const ELECTION_MS: u64 = 500;
/// How long the cluster has to become ready (at start, after a restart).
const READY: Duration = Duration::from_secs(20);
/// One administrative call, at most (a paused member fails it).
const CALL: Duration = Duration::from_secs(1);

/// One member.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Raft member id, read once the cluster is up.
    id: u64,
    child: Option<Child>,
}

/// A running private etcd cluster.
#[derive(Debug)]
pub(crate) struct PrivateEtcd {
    members: Vec<Member>,
    bin: String,
    token: String,
    dir: tempfile::TempDir,
}

impl PrivateEtcd {
    /// Starts three members and returns once every member answers and
    /// they agree on a leader (fresh ports are tried again if a start
    /// fails, as a port picked free may be taken before etcd binds it).
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start().await {
                Ok(cluster) => return Ok(cluster),
                Err(e) if e.downcast_ref::<exit::Exit>().is_some() => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("cannot start etcd")))
    }

    async fn try_start() -> anyhow::Result<Self> {
        let bin = std::env::var("FENCELOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        // On disk, not in /dev/shm: each member preallocates a 64 MB
        // write-ahead log, which a SIGKILL of this process would leave in
        // memory.
        let dir = tempfile::Builder::new()
            .prefix("fencelock-etcd")
            .tempdir()
            .context("cannot create a temporary directory for etcd")?;
        let mut members = Vec::new();
        for i in 0..MEMBERS {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                id: 0,
                child: None,
            });
        }
        let token = format!(
            "fencelock-torture-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let mut cluster = PrivateEtcd {
            members,
            bin,
            token,
            dir,
        };
        for i in 0..MEMBERS {
            cluster.spawn(i)?;
        }
        cluster.ready().await?;
        for i in 0..MEMBERS {
            let (id, _) = cluster.status(i).await.map_err(anyhow::Error::msg)?;
            cluster.members[i].id = id;
        }
        Ok(cluster)
    }

    /// `etcd://` with every member's client address.
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = (0..self.members.len()).map(|i| self.addr(i)).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// `127.0.0.1:PORT` of member `i`'s client port.
    pub(crate) fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// How many members the cluster has.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s name (`m0`, `m1`, `m2`).
    pub(crate) fn name(&self, i: usize) -> &str {
        &self.members[i].name
    }

    fn pid(&self, i: usize) -> Option<Pid> {
        self.members[i]
            .child
            .as_ref()
            .and_then(Child::id)
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
    }

    /// SIGSTOP member `i`: it stops answering, voting and sending
    /// heartbeats until resumed.
    pub(crate) fn pause(&self, i: usize) -> anyhow::Result<()> {
        let pid = self.pid(i).context("the etcd member is not running")?;
        kill(pid, Signal::SIGSTOP).context("cannot stop the etcd member")?;
        Ok(())
    }

    /// SIGCONT member `i`.
    pub(crate) fn resume(&self, i: usize) -> anyhow::Result<()> {
        if let Some(pid) = self.pid(i) {
            kill(pid, Signal::SIGCONT).context("cannot continue the etcd member")?;
        }
        Ok(())
    }

    /// kill -9 member `i` and wait for it.
    pub(crate) async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts member `i` again on its ports with its data directory and
    /// returns once every member answers and agrees on a leader.
    pub(crate) async fn start_again(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i).await;
        self.spawn(i)?;
        self.ready().await
    }

    /// The index of the leader every answering member names, bounded.
    pub(crate) async fn leader(&self) -> Result<usize, String> {
        let mut named = None;
        for i in 0..self.members.len() {
            let Ok((_, leader)) = self.status(i).await else {
                continue;
            };
            if leader == 0 {
                return Err(format!("{} knows no leader", self.members[i].name));
            }
            match named {
                Some(l) if l != leader => {
                    return Err("the members name different leaders".to_string());
                }
                _ => named = Some(leader),
            }
        }
        let leader = named.ok_or("no member answers")?;
        self.members
            .iter()
            .position(|m| m.id == leader)
            .ok_or_else(|| format!("the leader {leader:x} is not a member"))
    }

    /// Asks the leader `from` to hand the leadership to member `to`.
    pub(crate) async fn move_leader(&self, from: usize, to: usize) -> Result<(), String> {
        let mut client = self.client(from).await?;
        let target = self.members[to].id;
        tokio::time::timeout(Duration::from_secs(5), client.move_leader(target))
            .await
            .map_err(|_| format!("move-leader on {}: no reply within 5 s", self.addr(from)))?
            .map(drop)
            .map_err(|e| format!("move-leader on {}: {e}", self.addr(from)))
    }

    /// Stops every member and waits for them.
    pub(crate) async fn stop(mut self) {
        for i in 0..self.members.len() {
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

    /// Polls until every running member answers and they name one leader.
    async fn ready(&mut self) -> anyhow::Result<()> {
        let give_up = tokio::time::Instant::now() + READY;
        loop {
            let check = self.check().await;
            match check {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= give_up => {
                    anyhow::bail!(
                        "etcd was not ready within {READY:?}: {e}{}",
                        self.last_log_lines()
                    );
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn check(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            if let Some(child) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("member {} exited ({status})", self.members[i].name));
            }
        }
        let mut leaders = Vec::new();
        for i in 0..self.members.len() {
            if self.members[i].child.is_some() {
                leaders.push(self.status(i).await?.1);
            }
        }
        match leaders.first() {
            Some(&l) if l != 0 && leaders.iter().all(|&x| x == l) => Ok(()),
            _ => Err(format!("the members name the leaders {leaders:x?}")),
        }
    }

    /// The end of every member's log (for error messages).
    fn last_log_lines(&self) -> String {
        let mut text = String::new();
        for m in &self.members {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", m.name)))
                .unwrap_or_default();
            if let Some(line) = log.lines().last() {
                text.push_str(&format!("\n  {}: {line}", m.name));
            }
        }
        text
    }

    /// Starts member `i`'s etcd; it dies with this process.
    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .context("cannot open an etcd member's log")?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg(format!("--name={}", m.name))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join(format!("{}.etcd", m.name)).display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            // Ignored by a member that restarts with its data directory.
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--heartbeat-interval={HEARTBEAT_MS}"))
            .arg(format!("--election-timeout={ELECTION_MS}"))
            .args(["--logger=zap", "--log-outputs=stderr", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Not in our process group: a terminal's Ctrl-C is ours to
            // handle, and the members are stopped in order.
            .process_group(0)
            .kill_on_drop(true);
        crate::child::die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                exit::fail(
                    exit::CONFIG,
                    format!(
                        "{} not found on PATH: install it with `apt-get install -y etcd-server`, or pass --url etcd://… to use a running etcd",
                        self.bin
                    ),
                )
            } else {
                anyhow::Error::new(e).context(format!("cannot start {}", self.bin))
            }
        })?;
        self.members[i].child = Some(child);
        Ok(())
    }
}

/// A free loopback port (never etcd's standard 2379 and 2380).
fn free_port() -> anyhow::Result<u16> {
    for _ in 0..1000 {
        let listener =
            TcpListener::bind("127.0.0.1:0").context("cannot find a free loopback port")?;
        let port = listener.local_addr()?.port();
        if port != 2379 && port != 2380 {
            return Ok(port);
        }
    }
    anyhow::bail!("cannot find a free loopback port")
}
