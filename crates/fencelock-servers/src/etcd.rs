//! etcd clusters: [`EtcdCluster`], one or more [`EtcdMember`]s on
//! `127.0.0.1`, each with a free client port and a free peer port, its data
//! directory and its log in the cluster's temporary directory, configured
//! by [`EtcdConfig`]. Members can be frozen ([`EtcdCluster::pause`]),
//! killed ([`EtcdCluster::kill`]) and started again on the same ports with
//! their data ([`EtcdCluster::restart`]).
//!
//! A member is ready when its probe answers ([`crate::probe::Probe`]; by default
//! `GET /health` on its plain client URL says `"health":"true"`: it has a
//! leader and a quorum read succeeds). Raft member ids are the caller's to
//! read, through whatever client it uses, and to record
//! ([`EtcdCluster::set_member_id`]).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::binary::ETCD;
use crate::child::{GuardedChild, process_state};
use crate::error::{Error, Result};
use crate::files::{append_file, log_tail, read_lossy, temp_dir};
use crate::port::free_port;
use crate::probe::{EtcdTarget, Probe};
use crate::tls::{ClientAuth, ServerTls, TlsPaths};
use crate::wait::{poll_until, retry_exited};

/// How long a started or restarted cluster has to become ready.
pub const READY_DEADLINE: Duration = Duration::from_secs(20);
/// How many times [`EtcdCluster::start`] tries fresh ports.
const START_ATTEMPTS: u32 = 4;
/// How many times [`EtcdCluster::restart`] tries the same ports.
const RESTART_ATTEMPTS: u32 = 10;
/// Timeout of one health request.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// How to start an [`EtcdCluster`]. The default: three plaintext members
/// electing within about half a second (`--heartbeat-interval 50
/// --election-timeout 500`, a tenth of etcd's defaults), in a directory
/// `fencelock-etcd-…` on disk (each member preallocates a 64 MB write-ahead
/// log).
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Members: an odd number of at least 1.
    pub members: usize,
    /// Raft heartbeat interval in ms.
    pub heartbeat_ms: u64,
    /// Raft election timeout in ms.
    pub election_ms: u64,
    /// If set, clients must use TLS (`https` client URLs); peers still talk
    /// plain HTTP on loopback.
    pub tls: Option<ServerTls>,
    /// Where the cluster's directory is made (else the system's temporary
    /// directory).
    pub dir_in: Option<PathBuf>,
    /// The prefix of the directory's name.
    pub dir_prefix: String,
    /// The readiness probe; `None`: [`http_health`] (plaintext only).
    pub probe: Option<Probe<EtcdTarget>>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            members: 3,
            heartbeat_ms: 50,
            election_ms: 500,
            tls: None,
            dir_in: None,
            dir_prefix: "fencelock-etcd-".to_owned(),
            probe: None,
        }
    }
}

/// One member: its name, ports, Raft id and process.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Its Raft member id, once recorded.
    id: u64,
    /// `None` once killed.
    child: Option<GuardedChild>,
}

impl EtcdMember {
    /// Its name (`m0`, `m1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// Its peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// Its Raft member id (0 until recorded).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(GuardedChild::pid)
    }

    /// Whether its process was started and has exited on its own.
    fn exited(&self) -> bool {
        self.child
            .as_ref()
            .is_some_and(|c| matches!(process_state(c.pid()), None | Some('Z' | 'X')))
    }
}

/// A cluster of etcd processes on loopback. Dropping it kills every member
/// and removes its directory. Methods that take a member's index panic if
/// it is out of range, as slice indexing does.
#[derive(Debug)]
pub struct EtcdCluster {
    /// Dropped before `dir`.
    members: Vec<EtcdMember>,
    config: EtcdConfig,
    /// Distinguishes this cluster's members from any other's.
    token: String,
    bin: PathBuf,
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts the members on free ports and waits (up to 20 s) until every
    /// member is ready. If a member exits early (a port was taken
    /// meanwhile), the whole cluster starts again on new ports, up to 4
    /// times.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an even or zero number of members;
    /// [`Error::MissingBinary`] if etcd cannot be found (see
    /// [`crate::binary::ETCD`]); [`Error::Exited`] naming the member that
    /// exited and its log; [`Error::Timeout`] if they are not ready in time.
    pub fn start(config: EtcdConfig) -> Result<EtcdCluster> {
        if config.members.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "an etcd cluster needs an odd number of members, not {}",
                config.members
            )));
        }
        let bin = ETCD.locate()?;
        let mut dir = temp_dir(&config.dir_prefix, config.dir_in.as_deref())?;
        if let Some(tls) = &config.tls {
            tls.write(dir.path())?;
        }
        let mut attempt = 1;
        loop {
            let mut members = Vec::with_capacity(config.members);
            for i in 0..config.members {
                members.push(EtcdMember {
                    name: format!("m{i}"),
                    client_port: free_port()?,
                    peer_port: free_port()?,
                    id: 0,
                    child: None,
                });
            }
            let mut cluster = EtcdCluster {
                members,
                config: config.clone(),
                token: format!("fencelock-{}-{attempt}", std::process::id()),
                bin: bin.clone(),
                dir,
            };
            match cluster
                .spawn_all()
                .and_then(|()| cluster.wait_ready(READY_DEADLINE))
            {
                Ok(()) => {
                    tracing::debug!(url = %cluster.url(), "etcd cluster ready");
                    return Ok(cluster);
                }
                Err(error @ Error::Exited { .. }) if attempt < START_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "an etcd member exited; new ports");
                    attempt += 1;
                    dir = cluster.into_dir();
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `etcd://` (`etcds://` with TLS) with every member's client address.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = (0..self.members.len()).map(|i| self.addr(i)).collect();
        format!("{}://{}", self.url_scheme(), hosts.join(","))
    }

    /// The `etcd://` URL of member `index` alone.
    pub fn member_url(&self, index: usize) -> String {
        format!("{}://{}", self.url_scheme(), self.addr(index))
    }

    fn url_scheme(&self) -> &'static str {
        if self.config.tls.is_some() {
            "etcds"
        } else {
            "etcd"
        }
    }

    /// `127.0.0.1:PORT`, the client address of member `index`.
    pub fn addr(&self, index: usize) -> String {
        format!("127.0.0.1:{}", self.members[index].client_port)
    }

    /// The client endpoint of member `index` (`http://127.0.0.1:PORT`,
    /// `https` with TLS).
    pub fn endpoint(&self, index: usize) -> String {
        let scheme = if self.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr(index))
    }

    /// Every member, by index.
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The configuration the cluster was started with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The cluster's TLS files, with TLS.
    pub fn tls_paths(&self) -> Option<TlsPaths> {
        self.config
            .tls
            .as_ref()
            .map(|_| TlsPaths::in_dir(self.dir.path()))
    }

    /// The process id of member `index` (`None` once killed).
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.members[index].pid()
    }

    /// The cluster's directory (members' data and logs, TLS files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Member `index`'s log file.
    pub fn log_path(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[index].name))
    }

    /// Member `index`'s log.
    pub fn log(&self, index: usize) -> String {
        read_lossy(&self.log_path(index))
    }

    /// The indexes of the members that were not killed.
    pub fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(|&i| self.members[i].child.is_some())
    }

    /// Whether a member that should run has exited.
    pub fn exited_early(&self) -> bool {
        self.members.iter().any(EtcdMember::exited)
    }

    /// Records member `index`'s Raft id.
    pub fn set_member_id(&mut self, index: usize, id: u64) {
        self.members[index].id = id;
    }

    /// Member `index`'s Raft id (0 until recorded).
    pub fn member_id(&self, index: usize) -> u64 {
        self.members[index].id
    }

    /// The index of the member with Raft id `id`.
    pub fn index_of_id(&self, id: u64) -> Option<usize> {
        (id != 0)
            .then(|| self.members.iter().position(|m| m.id == id))
            .flatten()
    }

    /// Freezes member `index` (SIGSTOP): it keeps its ports and
    /// connections but answers, votes and sends heartbeats no more until
    /// [`EtcdCluster::resume`].
    ///
    /// # Errors
    ///
    /// [`Error::NotStopped`] if it does not stop within 5 s.
    pub fn pause(&self, index: usize) -> Result<()> {
        match &self.members[index].child {
            Some(child) => child.stop(),
            None => Ok(()),
        }
    }

    /// Resumes a member frozen by [`EtcdCluster::pause`].
    pub fn resume(&self, index: usize) {
        if let Some(child) = &self.members[index].child {
            child.cont();
        }
    }

    /// Kills member `index` with SIGKILL and reaps it. Idempotent.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
        }
    }

    /// Kills member `index` if it runs, then starts it again on the same
    /// ports with its data directory, and waits (up to 20 s) until it is
    /// ready; tries again while it exits early, up to 10 times.
    ///
    /// # Errors
    ///
    /// [`Error::Exited`] or [`Error::NotReady`] with its log.
    pub fn restart(&mut self, index: usize) -> Result<()> {
        self.kill(index);
        retry_exited(RESTART_ATTEMPTS, || {
            self.spawn(index)?;
            // `Ok(false)`: it exited, which no more polling changes.
            let ready = poll_until(READY_DEADLINE, || {
                if self.members[index].exited() {
                    return Ok(false);
                }
                self.probe(index).map(|()| true)
            });
            match ready {
                Ok(true) => Ok(()),
                Ok(false) => {
                    let error = self.member_error(index, String::new());
                    self.kill(index);
                    Err(error)
                }
                Err(last) => {
                    let error = self.member_error(index, last);
                    self.kill(index);
                    Err(error)
                }
            }
        })
    }

    /// Waits up to `deadline` until every running member is ready.
    ///
    /// # Errors
    ///
    /// [`Error::Exited`] for a member that exited, [`Error::Timeout`] with
    /// the last probe error and every member's last log line.
    pub fn wait_ready(&self, deadline: Duration) -> Result<()> {
        // `Ok(Some(index))`: member `index` exited, which no more polling
        // changes.
        let result: Result<Option<usize>, String> = poll_until(deadline, || {
            if let Some(index) = self.members.iter().position(EtcdMember::exited) {
                return Ok(Some(index));
            }
            for index in self.running() {
                self.probe(index)?;
            }
            Ok(None)
        });
        match result {
            Ok(None) => Ok(()),
            Ok(Some(index)) => Err(self.member_error(index, String::new())),
            Err(last) => Err(Error::Timeout {
                what: "the etcd members to be ready".to_owned(),
                waited: deadline,
                last: format!("{last}{}", self.last_log_lines()),
            }),
        }
    }

    /// Runs the probe on member `index`.
    fn probe(&self, index: usize) -> Result<(), String> {
        let target = EtcdTarget {
            endpoint: self.endpoint(index),
            dir: self.dir.path().to_owned(),
        };
        match &self.config.probe {
            Some(probe) => probe.check(&target),
            None => http_health(&target),
        }
    }

    /// The error for member `index`: exited (with its status) or not ready.
    fn member_error(&self, index: usize, last: String) -> Error {
        let member = &self.members[index];
        let server = format!(
            "etcd member {} (client port {}, peer port {})",
            member.name, member.client_port, member.peer_port
        );
        let port = member.client_port;
        // A multi-threaded process (etcd is one) shows as a zombie while
        // its other threads still exit, and becomes waitable only after
        // them: give an exited member a moment to report its status.
        let waitable_by = std::time::Instant::now() + Duration::from_secs(2);
        let status = member.child.as_ref().and_then(|child| {
            loop {
                if let Some(status) = child.peek_status() {
                    break Some(status);
                }
                if !member.exited() || std::time::Instant::now() >= waitable_by {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let log = log_tail(&self.log_path(index));
        match status {
            Some(status) => Error::Exited {
                server,
                port,
                status,
                log,
            },
            None => Error::NotReady {
                server,
                port,
                waited: READY_DEADLINE,
                last,
                log,
            },
        }
    }

    /// The last line of every member's log.
    fn last_log_lines(&self) -> String {
        let mut text = String::new();
        for (index, member) in self.members.iter().enumerate() {
            if let Some(line) = read_lossy(&self.log_path(index)).lines().last() {
                text.push_str(&format!("\n  {}: {line}", member.name));
            }
        }
        text
    }

    fn spawn_all(&mut self) -> Result<()> {
        for index in 0..self.members.len() {
            // A fresh cluster: no data from an earlier attempt.
            let _ = std::fs::remove_dir_all(self.data_dir(index));
            self.spawn(index)?;
        }
        Ok(())
    }

    fn data_dir(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.data", self.members[index].name))
    }

    /// Starts member `index`'s etcd.
    fn spawn(&mut self, index: usize) -> Result<()> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[index];
        let client = self.endpoint(index);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let log = append_file(&self.log_path(index))?;
        let log_err = log.try_clone().map_err(|source| Error::File {
            path: self.log_path(index),
            source,
        })?;
        let mut command = Command::new(&self.bin);
        command
            .arg(format!("--name={}", member.name))
            .arg(format!("--data-dir={}", self.data_dir(index).display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            // Ignored by a member that restarts with its data directory.
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--heartbeat-interval={}", self.config.heartbeat_ms))
            .arg(format!("--election-timeout={}", self.config.election_ms))
            .args(["--logger=zap", "--log-outputs=stderr", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Not in the caller's process group: a terminal's Ctrl-C is
            // the caller's to handle, and members are stopped in order.
            .process_group(0);
        if let Some(tls) = &self.config.tls {
            let paths = TlsPaths::in_dir(self.dir.path());
            command
                .arg(format!("--cert-file={}", paths.cert.display()))
                .arg(format!("--key-file={}", paths.key.display()))
                .arg(format!("--trusted-ca-file={}", paths.ca.display()));
            if tls.client_auth == ClientAuth::Required {
                command.arg("--client-cert-auth=true");
            }
        }
        let child = GuardedChild::spawn(command).map_err(|source| Error::Spawn {
            binary: self.bin.clone(),
            source,
        })?;
        tracing::debug!(member = %self.members[index].name, pid = child.pid(), "etcd started");
        self.members[index].child = Some(child);
        Ok(())
    }

    fn into_dir(self) -> TempDir {
        let EtcdCluster { members, dir, .. } = self;
        drop(members);
        dir
    }
}

/// The default probe: `GET /health` on the member's plain client endpoint
/// answers `"health":"true"`.
///
/// # Errors
///
/// Why not (a TLS endpoint needs a probe of its own).
pub fn http_health(target: &EtcdTarget) -> Result<(), String> {
    let body = http_get(&target.endpoint, "/health")?;
    if body.replace(' ', "").contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(format!("{}: /health says {}", target.endpoint, body.trim()))
    }
}

/// The body of `GET path` on a member's plain client `endpoint`
/// (`http://HOST:PORT`): `/health`, `/metrics`, `/version`.
///
/// # Errors
///
/// Why not (a TLS endpoint is not spoken to).
pub fn http_get(endpoint: &str, path: &str) -> Result<String, String> {
    let address = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("{endpoint}: only plain HTTP is spoken here"))?;
    let socket: SocketAddr = address.parse().map_err(|e| format!("{address}: {e}"))?;
    let mut stream = TcpStream::connect_timeout(&socket, HEALTH_TIMEOUT)
        .map_err(|e| format!("{address}: {e}"))?;
    stream
        .set_read_timeout(Some(HEALTH_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HEALTH_TIMEOUT)))
        .map_err(|e| format!("{address}: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .map_err(|e| format!("{address}: {e}"))?;
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .map_err(|e| format!("{address}: {e}"))?;
    Ok(reply
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned())
}
