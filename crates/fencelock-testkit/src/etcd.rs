//! Real `etcd` processes for tests: [`EtcdCluster`], configured by
//! [`EtcdConfig`].
//!
//! A cluster is one member ([`EtcdCluster::single`]) or three
//! ([`EtcdCluster::start`]) on `127.0.0.1`, each with a free client port and
//! a free peer port, its data directory and its log in the cluster's
//! temporary directory. Every member is killed when the cluster is dropped or
//! the test process dies (see [`crate::process`]). Faults: pause a member
//! (SIGSTOP, [`EtcdCluster::pause`]), kill it ([`EtcdCluster::kill`]),
//! restart it on the same ports and data ([`EtcdCluster::restart`]), and
//! move the leadership ([`EtcdCluster::move_leader`]).
//!
//! Members elect quickly (`--heartbeat-interval 50 --election-timeout 500`,
//! ten times etcd's defaults), so a killed leader is replaced in about a
//! second; etcd's shortest lease is then 1 s (it is 2 s with the defaults).
//!
//! Admin calls go through `etcdctl` ([`EtcdCluster::etcdctl`]), like the
//! Redis topologies use `redis-cli`.
//!
//! ```no_run
//! use fencelock_testkit::EtcdCluster;
//!
//! let mut cluster = EtcdCluster::start();
//! let leader = cluster.leader();
//! cluster.kill(leader);
//! let new_leader = cluster.wait_new_leader(leader);
//! cluster.restart(leader);
//! cluster.move_leader(leader);
//! # let _ = (new_leader, cluster.url());
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::free_port;
use crate::process::GuardedChild;
use crate::server_process::{
    LaunchError, append_file, find_on_path, is_executable, log_tail, poll_until, run_with_timeout,
};
use crate::tls::{TlsConfig, TlsFiles};

/// Environment variable that overrides the `etcd` binary (a path, or a name
/// looked up on `PATH`).
pub const ETCD_BIN_ENV: &str = "FENCELOCK_ETCD_BIN";

/// Environment variable that overrides the `etcdctl` binary.
pub const ETCDCTL_BIN_ENV: &str = "FENCELOCK_ETCDCTL_BIN";

const NOT_FOUND_MESSAGE: &str = "etcd not found on PATH: install it with `apt-get install -y etcd-server etcd-client` (or set FENCELOCK_ETCD_BIN)";

/// How long a freshly started cluster has to become healthy.
const READY_DEADLINE: Duration = Duration::from_secs(20);
/// How many times [`EtcdCluster::start_with`] tries fresh ports.
const START_ATTEMPTS: u32 = 4;
/// How many times [`EtcdCluster::restart`] retries the same ports.
const RESTART_ATTEMPTS: u32 = 10;
/// Timeout of one `etcdctl` call.
const CTL_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start an [`EtcdCluster`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Members: 1 or 3 (an odd number of at least 1).
    pub members: usize,
    /// If set, clients must use TLS (`https` client URLs, `etcds://` in
    /// [`EtcdCluster::url`]); peers still talk plain HTTP on loopback.
    pub tls: Option<TlsConfig>,
    /// Raft heartbeat interval in ms (etcd's default is 100).
    pub heartbeat_ms: u64,
    /// Raft election timeout in ms (etcd's default is 1000). etcd's shortest
    /// lease is 1.5 × this, rounded up to whole seconds.
    pub election_ms: u64,
}

impl Default for EtcdConfig {
    /// Three plaintext members electing within about half a second.
    fn default() -> Self {
        EtcdConfig {
            members: 3,
            tls: None,
            heartbeat_ms: 50,
            election_ms: 500,
        }
    }
}

impl EtcdConfig {
    /// Sets [`EtcdConfig::members`].
    pub fn with_members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Sets [`EtcdConfig::tls`].
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// One member: its ports, its directory and its process.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Its Raft member id, read once the cluster is healthy.
    id: u64,
    /// `None` once killed.
    child: Option<GuardedChild>,
}

/// An etcd cluster of real `etcd` processes on loopback. Dropping it kills
/// every member and removes its directory.
#[derive(Debug)]
pub struct EtcdCluster {
    /// Dropped before `dir`.
    members: Vec<Member>,
    config: EtcdConfig,
    /// Distinguishes this cluster's members from any other's.
    token: String,
    tls_files: Option<TlsFiles>,
    bin: PathBuf,
    ctl: PathBuf,
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster is healthy.
    ///
    /// # Panics
    ///
    /// See [`EtcdCluster::start_with`].
    pub fn start() -> EtcdCluster {
        EtcdCluster::start_with(EtcdConfig::default())
    }

    /// Starts one member and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// See [`EtcdCluster::start_with`].
    pub fn single() -> EtcdCluster {
        EtcdCluster::start_with(EtcdConfig::default().with_members(1))
    }

    /// Starts the members of `config` on free ports and waits (up to 20 s)
    /// until every member reports healthy. If a member exits early (a port
    /// was taken meanwhile), the whole cluster is started again on new
    /// ports, up to 4 times.
    ///
    /// # Panics
    ///
    /// Panics if `etcd` or `etcdctl` cannot be found (see [`ETCD_BIN_ENV`]),
    /// `members` is even or zero, or the cluster does not become healthy;
    /// the message includes the members' logs.
    pub fn start_with(config: EtcdConfig) -> EtcdCluster {
        assert!(
            config.members % 2 == 1,
            "an etcd cluster needs an odd number of members, not {}",
            config.members
        );
        let bin = find_bin(ETCD_BIN_ENV, "etcd");
        let ctl = find_bin(ETCDCTL_BIN_ENV, "etcdctl");
        let mut dir = tempfile::Builder::new()
            .prefix("fencelock-etcd-")
            .tempdir()
            .expect("failed to create a temporary directory for etcd");
        let tls_files = config
            .tls
            .as_ref()
            .map(|tls| TlsFiles::write(&dir.path().join("tls"), tls));
        let mut failures = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let token = format!("fencelock-{}-{attempt}", std::process::id());
            let mut cluster = EtcdCluster {
                members: (0..config.members)
                    .map(|i| Member {
                        name: format!("m{i}"),
                        client_port: free_port(),
                        peer_port: free_port(),
                        id: 0,
                        child: None,
                    })
                    .collect(),
                config: config.clone(),
                token,
                tls_files: tls_files.clone(),
                bin: bin.clone(),
                ctl: ctl.clone(),
                dir,
            };
            for i in 0..cluster.members.len() {
                // A fresh cluster: no data from an earlier attempt.
                let _ = std::fs::remove_dir_all(cluster.data_dir(i));
                match cluster.spawn(i) {
                    Ok(child) => cluster.members[i].child = Some(child),
                    Err(e) => panic!("{}", cluster.report(&describe(&e, &cluster.bin))),
                }
            }
            match cluster.wait_ready(READY_DEADLINE) {
                Ok(()) => {
                    cluster.read_member_ids();
                    return cluster;
                }
                Err(e) => {
                    if cluster.exited_early() && attempt < START_ATTEMPTS {
                        failures.push_str(&format!("attempt {attempt}: {e}\n"));
                        for member in &mut cluster.members {
                            if let Some(mut child) = member.child.take() {
                                let _ = child.kill();
                            }
                        }
                        dir = cluster.into_dir();
                        continue;
                    }
                    panic!(
                        "{}",
                        cluster.report(&format!("etcd did not become healthy: {e}\n{failures}"))
                    )
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The `etcd://` URL (`etcds://` with TLS) of every member, for
    /// `LockClient::connect`.
    pub fn url(&self) -> String {
        let scheme = if self.tls_files.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        let hosts: Vec<String> = (0..self.members.len()).map(|i| self.addr(i)).collect();
        format!("{scheme}://{}", hosts.join(","))
    }

    /// The `etcd://` URL of member `index` alone.
    pub fn member_url(&self, index: usize) -> String {
        let scheme = if self.tls_files.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        format!("{scheme}://{}", self.addr(index))
    }

    /// `127.0.0.1:PORT`, the client address of member `index`.
    pub fn addr(&self, index: usize) -> String {
        format!("127.0.0.1:{}", self.members[index].client_port)
    }

    /// The client endpoints (`http://127.0.0.1:PORT`, `https` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    fn endpoint(&self, index: usize) -> String {
        let scheme = if self.tls_files.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr(index))
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The PEM files of a TLS cluster.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls_files.as_ref()
    }

    /// The process id of member `index` (`None` once killed).
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.members[index].child.as_ref().map(GuardedChild::pid)
    }

    /// The cluster's directory (members' data and logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log of member `index`.
    pub fn log(&self, index: usize) -> String {
        crate::server_process::read_lossy(&self.log_path(index))
    }

    /// Freezes member `index` (SIGSTOP): it keeps its ports and
    /// connections but answers nothing until [`EtcdCluster::resume`].
    pub fn pause(&self, index: usize) {
        if let Some(child) = &self.members[index].child {
            child.stop();
        }
    }

    /// Resumes a member frozen by [`EtcdCluster::pause`].
    pub fn resume(&self, index: usize) {
        if let Some(child) = &self.members[index].child {
            child.cont();
        }
    }

    /// Pauses member `index` until the guard is dropped.
    pub fn pause_guard(&self, index: usize) -> MemberPausedGuard<'_> {
        self.pause(index);
        MemberPausedGuard {
            cluster: self,
            index,
        }
    }

    /// Kills member `index` with SIGKILL and reaps it. Idempotent.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
        }
    }

    /// Kills member `index` if it runs, then starts it again on the same
    /// ports with the same data, and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// Panics if it cannot be started again or does not become healthy.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        let mut failures = String::new();
        for attempt in 1..=RESTART_ATTEMPTS {
            match self.spawn(index) {
                Ok(child) => {
                    self.members[index].child = Some(child);
                    match poll_until(READY_DEADLINE, || self.member_health(index)) {
                        Ok(()) => return,
                        Err(e) if self.exited_early() => {
                            failures.push_str(&format!("attempt {attempt}: {e}\n"));
                            self.kill(index);
                            std::thread::sleep(Duration::from_millis(50) * attempt);
                        }
                        Err(e) => panic!(
                            "{}",
                            self.report(&format!("member m{index} did not become healthy: {e}"))
                        ),
                    }
                }
                Err(e) => panic!("{}", self.report(&describe(&e, &self.bin))),
            }
        }
        panic!(
            "{}",
            self.report(&format!(
                "member m{index} could not be restarted after {RESTART_ATTEMPTS} attempts:\n{failures}"
            ))
        )
    }

    /// The index of the current leader, as the first member that answers
    /// reports it.
    ///
    /// # Panics
    ///
    /// Panics if no member answers, or the leader is not a member.
    pub fn leader(&self) -> usize {
        self.try_leader()
            .unwrap_or_else(|e| panic!("{}", self.report(&format!("no leader: {e}"))))
    }

    fn try_leader(&self) -> Result<usize, String> {
        let mut last = String::from("no member is running");
        for i in self.running() {
            match self.status(i) {
                Ok(status) => {
                    let leader = status.leader;
                    if leader == 0 {
                        last = format!("m{i} knows no leader");
                        continue;
                    }
                    return self
                        .index_of_id(leader)
                        .ok_or_else(|| format!("leader {leader:x} is not a member"));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Waits (up to 20 s) until a member other than `old` leads, as every
    /// running member sees it; returns its index.
    ///
    /// # Panics
    ///
    /// Panics if none does in time.
    pub fn wait_new_leader(&self, old: usize) -> usize {
        poll_until(READY_DEADLINE, || {
            let mut seen = None;
            for i in self.running() {
                let status = self.status(i)?;
                let leader = self
                    .index_of_id(status.leader)
                    .ok_or_else(|| format!("m{i} sees no leader"))?;
                if leader == old {
                    return Err(format!("m{i} still sees m{old} as leader"));
                }
                if seen.is_some_and(|s| s != leader) {
                    return Err("members disagree on the leader".to_owned());
                }
                seen = Some(leader);
            }
            seen.ok_or_else(|| "no member is running".to_owned())
        })
        .unwrap_or_else(|e| panic!("{}", self.report(&format!("no new leader: {e}"))))
    }

    /// Makes member `to` the leader (`etcdctl move-leader`, sent to the
    /// current leader) and waits until every running member sees it.
    ///
    /// # Panics
    ///
    /// Panics if the transfer fails or does not complete in 20 s.
    pub fn move_leader(&self, to: usize) {
        let leader = self.leader();
        if leader == to {
            return;
        }
        let id = format!("{:x}", self.member_id(to));
        self.etcdctl_on(leader, &["move-leader", &id])
            .unwrap_or_else(|e| panic!("{}", self.report(&format!("move-leader failed: {e}"))));
        poll_until(READY_DEADLINE, || {
            for i in self.running() {
                let leader = self.status(i)?.leader;
                if self.index_of_id(leader) != Some(to) {
                    return Err(format!("m{i} sees {leader:x} as leader"));
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{}", self.report(&format!("leadership did not move: {e}"))))
    }

    /// The Raft member id of member `index`.
    pub fn member_id(&self, index: usize) -> u64 {
        self.members[index].id
    }

    /// Reads every member's id (`etcdctl member list`).
    fn read_member_ids(&mut self) {
        let out = self
            .etcdctl(&["-w", "fields", "member", "list"])
            .unwrap_or_else(|e| panic!("{}", self.report(&format!("member list failed: {e}"))));
        // Blocks of `"ID" : N` followed by `"Name" : "mI"`.
        let mut id = None;
        for line in out.lines() {
            if let Some(n) = field(line, "ID") {
                id = n.parse::<u64>().ok();
            }
            if let (Some(name), Some(id)) = (field(line, "Name"), id) {
                let name = name.trim_matches('"');
                if let Some(member) = self.members.iter_mut().find(|m| m.name == name) {
                    member.id = id;
                }
            }
        }
        if let Some(m) = self.members.iter().find(|m| m.id == 0) {
            panic!("member {} not found in:\n{out}", m.name)
        }
    }

    fn index_of_id(&self, id: u64) -> Option<usize> {
        (id != 0)
            .then(|| self.members.iter().position(|m| m.id == id))
            .flatten()
    }

    /// Runs `etcdctl ARGS` against every running member (5 s timeout) and
    /// returns its stdout.
    ///
    /// # Errors
    ///
    /// Its exit status and output when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let endpoints: Vec<String> = self.running().map(|i| self.endpoint(i)).collect();
        self.ctl_command(&endpoints.join(","), args)
    }

    /// Runs `etcdctl ARGS` against member `index` only.
    ///
    /// # Errors
    ///
    /// Its exit status and output when it fails.
    pub fn etcdctl_on(&self, index: usize, args: &[&str]) -> Result<String, String> {
        self.ctl_command(&self.endpoint(index), args)
    }

    fn ctl_command(&self, endpoints: &str, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new(&self.ctl);
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["--dial-timeout=1s", "--command-timeout=3s"]);
        if let Some(files) = &self.tls_files {
            command
                .arg(format!("--cacert={}", files.ca_cert.display()))
                .arg(format!("--cert={}", files.client_cert.display()))
                .arg(format!("--key={}", files.client_key.display()));
        }
        command.args(args);
        run_with_timeout(command, CTL_TIMEOUT)
    }

    /// What member `index` reports about itself.
    fn status(&self, index: usize) -> Result<Status, String> {
        let out = self.etcdctl_on(index, &["-w", "fields", "endpoint", "status"])?;
        let number = |name| {
            out.lines()
                .find_map(|l| field(l, name))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("no {name} in {out:?}"))
        };
        Ok(Status {
            leader: number("Leader")?,
        })
    }

    /// Waits until every running member is healthy (a quorum commits).
    ///
    /// # Panics
    ///
    /// Panics if they are not within 20 s.
    pub fn wait_healthy(&self) {
        if let Err(e) = self.wait_ready(READY_DEADLINE) {
            panic!("{}", self.report(&format!("etcd is not healthy: {e}")))
        }
    }

    fn wait_ready(&self, deadline: Duration) -> Result<(), String> {
        let started = Instant::now();
        poll_until(deadline, || {
            if self.exited_early() {
                return Err("a member exited".to_owned());
            }
            for i in self.running() {
                self.member_health(i)?;
            }
            Ok(())
        })
        .map_err(|e| format!("{e} (after {:?})", started.elapsed()))
    }

    fn member_health(&self, index: usize) -> Result<(), String> {
        self.etcdctl_on(index, &["endpoint", "health"]).map(drop)
    }

    /// Whether a member that should run has exited.
    fn exited_early(&self) -> bool {
        self.members.iter().any(|m| {
            m.child.as_ref().is_some_and(|c| {
                matches!(
                    crate::process::process_state(c.pid()),
                    None | Some('Z' | 'X')
                )
            })
        })
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(|&i| self.members[i].child.is_some())
    }

    fn data_dir(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.data", self.members[index].name))
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[index].name))
    }

    /// The `--initial-cluster` value.
    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&self, index: usize) -> Result<GuardedChild, LaunchError> {
        let m = &self.members[index];
        let client = self.endpoint(index);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = append_file(&self.log_path(index));
        let mut command = Command::new(&self.bin);
        command
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", self.data_dir(index).display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster()))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--heartbeat-interval={}", self.config.heartbeat_ms))
            .arg(format!("--election-timeout={}", self.config.election_ms))
            .args(["--logger=zap", "--log-outputs=stderr", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(LaunchError::Spawn)?)
            .stderr(log);
        if let Some(files) = &self.tls_files {
            command
                .arg(format!("--cert-file={}", files.server_cert.display()))
                .arg(format!("--key-file={}", files.server_key.display()))
                .arg(format!("--trusted-ca-file={}", files.ca_cert.display()));
            if self
                .config
                .tls
                .as_ref()
                .is_some_and(|t| t.client_auth == crate::tls::ClientAuth::Required)
            {
                command.arg("--client-cert-auth=true");
            }
        }
        crate::process::try_spawn_guarded(command).map_err(LaunchError::Spawn)
    }

    fn into_dir(self) -> TempDir {
        let EtcdCluster { members, dir, .. } = self;
        drop(members);
        dir
    }

    /// `headline` followed by the tail of every member's log.
    fn report(&self, headline: &str) -> String {
        let mut text = headline.trim_end().to_owned();
        for i in 0..self.members.len() {
            let tail = log_tail(&self.log_path(i));
            if !tail.trim().is_empty() {
                text.push_str(&format!("\n--- m{i}.log ---\n{tail}"));
            }
        }
        text
    }
}

/// Keeps a member of an [`EtcdCluster`] paused (SIGSTOP) until dropped,
/// then resumes it: [`EtcdCluster::pause_guard`].
#[derive(Debug)]
#[must_use = "the member is resumed as soon as the guard is dropped"]
pub struct MemberPausedGuard<'a> {
    cluster: &'a EtcdCluster,
    index: usize,
}

impl Drop for MemberPausedGuard<'_> {
    fn drop(&mut self) {
        self.cluster.resume(self.index);
    }
}

/// What `etcdctl endpoint status` reported.
struct Status {
    leader: u64,
}

/// The value of `"NAME" : VALUE` in a line of `etcdctl -w fields` output.
fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let rest = line.trim().strip_prefix('"')?.strip_prefix(name)?;
    rest.strip_prefix('"')?
        .trim_start()
        .strip_prefix(':')
        .map(str::trim)
}

fn find_bin(env: &str, name: &str) -> PathBuf {
    let configured = std::env::var_os(env);
    let wanted = configured.clone().unwrap_or_else(|| name.into());
    let path = Path::new(&wanted);
    if path.components().count() > 1 && is_executable(path) {
        return path.to_path_buf();
    }
    find_on_path(path, std::env::var_os("PATH").as_deref()).unwrap_or_else(|| {
        if configured.is_some() {
            panic!("{env}={} is not an executable", path.display())
        }
        panic!("{NOT_FOUND_MESSAGE}")
    })
}

fn describe(error: &LaunchError, bin: &Path) -> String {
    match error {
        LaunchError::Spawn(e) => format!("cannot start {}: {e}", bin.display()),
        LaunchError::Exited(status) => format!("{} exited early ({status})", bin.display()),
        LaunchError::NotReady(e) => format!("{} did not become ready: {e}", bin.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn fields_of_etcdctl_output() {
        assert_eq!(field("\"Leader\" : 42", "Leader"), Some("42"));
        assert_eq!(field("  \"Name\" : \"m1\"", "Name"), Some("\"m1\""));
        assert_eq!(field("\"LeaderX\" : 1", "Leader"), None);
        assert_eq!(field("\"ID\" : 7", "ID"), Some("7"));
    }
}
