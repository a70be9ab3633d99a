//! Real `etcd` processes for tests: [`EtcdCluster`], configured by
//! [`EtcdConfig`].
//!
//! A cluster is one member ([`EtcdCluster::single`]) or three
//! ([`EtcdCluster::start`]) on `127.0.0.1`, each with a free client port and
//! a free peer port, its data directory and its log in the cluster's
//! temporary directory, started by `fencelock_servers::EtcdCluster`. Every
//! member is killed when the cluster is dropped or the test process dies
//! (see [`crate::process`]). Faults: pause a member
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
use std::process::Command;
use std::time::Duration;

use fencelock_servers::etcd::READY_DEADLINE;
use fencelock_servers::run::run_with_timeout;
use fencelock_servers::wait::poll_until;
use fencelock_servers::{ETCD, ETCDCTL, EtcdTarget, Probe};

use crate::server_process::panic_message;
use crate::tls::{TlsConfig, TlsFiles};

/// Environment variable that overrides the `etcd` binary (a path, or a name
/// looked up on `PATH`).
pub const ETCD_BIN_ENV: &str = ETCD.env;

/// Environment variable that overrides the `etcdctl` binary.
pub const ETCDCTL_BIN_ENV: &str = ETCDCTL.env;

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

/// An etcd cluster of real `etcd` processes on loopback: a
/// [`fencelock_servers::EtcdCluster`] with `etcdctl` for admin calls and
/// the test's TLS files. Dropping it kills every member and removes its
/// directory.
#[derive(Debug)]
pub struct EtcdCluster {
    inner: fencelock_servers::EtcdCluster,
    config: EtcdConfig,
    tls_files: Option<TlsFiles>,
    ctl: PathBuf,
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
    /// until every member reports healthy (`etcdctl endpoint health`). If a
    /// member exits early (a port was taken meanwhile), the whole cluster is
    /// started again on new ports, up to 4 times.
    ///
    /// # Panics
    ///
    /// Panics if `etcd` or `etcdctl` cannot be found (see [`ETCD_BIN_ENV`]),
    /// `members` is even or zero, or the cluster does not become healthy;
    /// the message includes the members' logs.
    pub fn start_with(config: EtcdConfig) -> EtcdCluster {
        let ctl = ETCDCTL.locate().unwrap_or_else(|error| panic!("{error}"));
        let tls = config.tls.is_some();
        let probe_ctl = ctl.clone();
        let probe = Probe::new(move |target: &EtcdTarget| {
            let files = tls.then(|| TlsFiles::in_dir(&target.dir));
            ctl_command(
                &probe_ctl,
                files.as_ref(),
                &target.endpoint,
                &["endpoint", "health"],
            )
            .map(drop)
        });
        let inner = fencelock_servers::EtcdCluster::start(fencelock_servers::EtcdConfig {
            members: config.members,
            heartbeat_ms: config.heartbeat_ms,
            election_ms: config.election_ms,
            tls: config.tls.as_ref().map(TlsConfig::server_tls),
            probe: Some(probe),
            ..fencelock_servers::EtcdConfig::default()
        })
        .unwrap_or_else(|error| panic!("etcd did not become healthy: {}", panic_message(&error)));
        let tls_files = tls.then(|| TlsFiles::in_dir(inner.dir()));
        let mut cluster = EtcdCluster {
            inner,
            config,
            tls_files,
            ctl,
        };
        cluster.read_member_ids();
        cluster
    }

    /// The `etcd://` URL (`etcds://` with TLS) of every member, for
    /// `LockClient::connect`.
    pub fn url(&self) -> String {
        self.inner.url()
    }

    /// The `etcd://` URL of member `index` alone.
    pub fn member_url(&self, index: usize) -> String {
        self.inner.member_url(index)
    }

    /// `127.0.0.1:PORT`, the client address of member `index`.
    pub fn addr(&self, index: usize) -> String {
        self.inner.addr(index)
    }

    /// The client endpoints (`http://127.0.0.1:PORT`, `https` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.inner.endpoint(i)).collect()
    }

    /// The value of the Prometheus counter or gauge `name` (without
    /// labels) that member `index` exports on `/metrics`, e.g.
    /// `etcd_server_proposals_committed_total`: the Raft entries it
    /// committed, one per write, lease grant and lease revoke.
    ///
    /// # Panics
    /// When the member does not answer over plain HTTP or lacks the metric.
    pub fn metric(&self, index: usize, name: &str) -> f64 {
        let endpoint = self.inner.endpoint(index);
        let body = fencelock_servers::etcd::http_get(&endpoint, "/metrics")
            .unwrap_or_else(|e| panic!("etcd metrics: {e}"));
        body.lines()
            .find_map(|line| {
                let (metric, value) = line.split_once(' ')?;
                (metric == name).then(|| value.trim().parse::<f64>().ok())?
            })
            .unwrap_or_else(|| panic!("etcd member {index} exports no {name}"))
    }

    /// The configuration the cluster was started with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The PEM files of a TLS cluster.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls_files.as_ref()
    }

    /// The process id of member `index` (`None` once killed).
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.inner.pid(index)
    }

    /// The cluster's directory (members' data and logs).
    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    /// The log of member `index`.
    pub fn log(&self, index: usize) -> String {
        self.inner.log(index)
    }

    /// Freezes member `index` (SIGSTOP): it keeps its ports and
    /// connections but answers nothing until [`EtcdCluster::resume`].
    ///
    /// # Panics
    ///
    /// Panics if it does not stop within 5 s.
    pub fn pause(&self, index: usize) {
        if let Err(error) = self.inner.pause(index) {
            panic!("{error}");
        }
    }

    /// Resumes a member frozen by [`EtcdCluster::pause`].
    pub fn resume(&self, index: usize) {
        self.inner.resume(index);
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
        self.inner.kill(index);
    }

    /// Kills member `index` if it runs, then starts it again on the same
    /// ports with the same data, and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// Panics if it cannot be started again or does not become healthy.
    pub fn restart(&mut self, index: usize) {
        if let Err(error) = self.inner.restart(index) {
            panic!(
                "{}",
                self.report(&format!(
                    "member m{index} could not be restarted: {}",
                    panic_message(&error)
                ))
            );
        }
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
        self.inner.member_id(index)
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
                if let Some(index) = self.inner.members().iter().position(|m| m.name() == name) {
                    self.inner.set_member_id(index, id);
                }
            }
        }
        if let Some(m) = self.inner.members().iter().find(|m| m.id() == 0) {
            panic!("member {} not found in:\n{out}", m.name())
        }
    }

    fn index_of_id(&self, id: u64) -> Option<usize> {
        self.inner.index_of_id(id)
    }

    /// Runs `etcdctl ARGS` against every running member (5 s timeout) and
    /// returns its stdout.
    ///
    /// # Errors
    ///
    /// Its exit status and output when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let endpoints: Vec<String> = self.running().map(|i| self.inner.endpoint(i)).collect();
        self.ctl_command(&endpoints.join(","), args)
    }

    /// Runs `etcdctl ARGS` against member `index` only.
    ///
    /// # Errors
    ///
    /// Its exit status and output when it fails.
    pub fn etcdctl_on(&self, index: usize, args: &[&str]) -> Result<String, String> {
        self.ctl_command(&self.inner.endpoint(index), args)
    }

    fn ctl_command(&self, endpoints: &str, args: &[&str]) -> Result<String, String> {
        ctl_command(&self.ctl, self.tls_files.as_ref(), endpoints, args)
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
        if let Err(e) = self.inner.wait_ready(READY_DEADLINE) {
            panic!(
                "{}",
                self.report(&format!("etcd is not healthy: {}", panic_message(&e)))
            )
        }
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        self.inner.running()
    }

    /// `headline` followed by the tail of every member's log.
    fn report(&self, headline: &str) -> String {
        let mut text = headline.trim_end().to_owned();
        for i in 0..self.len() {
            let tail = fencelock_servers::files::log_tail(&self.inner.log_path(i));
            if !tail.trim().is_empty() {
                text.push_str(&format!("\n--- m{i}.log ---\n{tail}"));
            }
        }
        text
    }
}

/// Runs `etcdctl ARGS` (the binary `ctl`) against `endpoints`, with the
/// client certificate of `tls`, bounded by 5 s.
fn ctl_command(
    ctl: &Path,
    tls: Option<&TlsFiles>,
    endpoints: &str,
    args: &[&str],
) -> Result<String, String> {
    let mut command = Command::new(ctl);
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(["--dial-timeout=1s", "--command-timeout=3s"]);
    if let Some(files) = tls {
        command
            .arg(format!("--cacert={}", files.ca_cert.display()))
            .arg(format!("--cert={}", files.client_cert.display()))
            .arg(format!("--key={}", files.client_key.display()));
    }
    command.args(args);
    run_with_timeout(command, CTL_TIMEOUT)
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
