//! A Redis Sentinel set-up: [`SentinelSetup`], a primary with replicas
//! watched by sentinels, each a [`RedisServer`] in its own directory under
//! the set-up's temporary directory, configured by [`SentinelConfig`].
//!
//! The data nodes keep their role (`replicaof`) in a writable `redis.conf`,
//! which Sentinel rewrites on a fail-over, so a restarted node comes back
//! in its current role; the sentinels monitor the primary from a writable
//! `sentinel.conf`. [`SentinelSetup::start`] returns once every sentinel
//! reports quorum (`SENTINEL CKQUORUM`), knows every replica and every
//! other sentinel, and the primary has every replica in sync (about 2–3 s:
//! sentinels find each other through hello messages sent every 2 s).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::files::temp_dir;
use crate::redis_admin::online_replicas;
use crate::redis_config::{RedisConfig, RedisRole};
use crate::redis_server::RedisServer;
use crate::wait::poll_until;

/// How long [`SentinelSetup::start`] waits for quorum and replicas.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one command sent while polling.
const POLL_CMD_TIMEOUT: Duration = Duration::from_secs(1);

/// How to start a [`SentinelSetup`]. The default: master name `fencelock`,
/// 2 replicas, 3 sentinels, quorum 2, `down-after-milliseconds 1000`,
/// `failover-timeout 3000`, `parallel-syncs` as many as the replicas.
///
/// `D` is how a data node is described: a [`RedisConfig`] here; a caller
/// with a configuration of its own (the test kit's) maps it with
/// [`SentinelConfig::map_data`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelConfig<D = RedisConfig> {
    /// The name the sentinels monitor the primary under.
    pub master_name: String,
    /// Number of replicas of the first primary.
    pub replicas: usize,
    /// Number of sentinels.
    pub sentinels: usize,
    /// How many sentinels must agree that the primary is down.
    pub quorum: usize,
    /// `sentinel down-after-milliseconds`: how long the primary may be
    /// unreachable before a sentinel considers it down.
    pub down_after: Duration,
    /// `sentinel failover-timeout`.
    pub failover_timeout: Duration,
    /// How every data node is started: extra arguments, config lines
    /// (`min-replicas-to-write 1`, `min-replicas-max-lag 1`, ACL `user …`
    /// lines), persistence, `DEBUG`, and a password (`requirepass`; then
    /// `masterauth` is added on the data nodes and `sentinel auth-pass` on
    /// the sentinels). TLS is refused.
    pub data: D,
    /// Extra lines for every sentinel's `sentinel.conf`, e.g.
    /// `sentinel auth-user fencelock alice` for an ACL user.
    pub sentinel_conf_lines: Vec<String>,
    /// Where the set-up's directory is made (else the system's temporary
    /// directory).
    pub dir_in: Option<PathBuf>,
}

impl<D: Default> Default for SentinelConfig<D> {
    fn default() -> Self {
        SentinelConfig {
            master_name: "fencelock".to_owned(),
            replicas: 2,
            sentinels: 3,
            quorum: 2,
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(3000),
            data: D::default(),
            sentinel_conf_lines: Vec::new(),
            dir_in: None,
        }
    }
}

impl<D> SentinelConfig<D> {
    /// Sets [`SentinelConfig::data`].
    pub fn with_data(mut self, data: D) -> Self {
        self.data = data;
        self
    }

    /// Appends a line to [`SentinelConfig::sentinel_conf_lines`].
    pub fn with_sentinel_conf_line(mut self, line: impl Into<String>) -> Self {
        self.sentinel_conf_lines.push(line.into());
        self
    }

    /// The same set-up with every data node described by `map(data)`.
    pub fn map_data<E>(self, map: impl FnOnce(D) -> E) -> SentinelConfig<E> {
        SentinelConfig {
            master_name: self.master_name,
            replicas: self.replicas,
            sentinels: self.sentinels,
            quorum: self.quorum,
            down_after: self.down_after,
            failover_timeout: self.failover_timeout,
            data: map(self.data),
            sentinel_conf_lines: self.sentinel_conf_lines,
            dir_in: self.dir_in,
        }
    }
}

/// A started set-up. Dropping it kills the sentinels first (so none reacts
/// to the data nodes going away), then the data nodes, and removes the
/// directory.
#[derive(Debug)]
pub struct SentinelSetup {
    sentinels: Vec<RedisServer>,
    data: Vec<RedisServer>,
    config: SentinelConfig,
    dir: TempDir,
}

/// The processes of a [`SentinelSetup`], for callers that keep them their
/// own way ([`SentinelSetup::into_parts`]). Drop `sentinels` first.
#[derive(Debug)]
pub struct SentinelParts {
    /// The sentinels, by index.
    pub sentinels: Vec<RedisServer>,
    /// The data nodes, by index (0 was the first primary).
    pub data: Vec<RedisServer>,
    /// The set-up's directory, which holds theirs: drop it last.
    pub dir: TempDir,
}

impl SentinelSetup {
    /// Starts the primary, its replicas and the sentinels, and waits (up to
    /// 20 s) until the set-up is ready (see the module docs).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for TLS, no replica or a quorum larger than the
    /// sentinels; the error of a process that fails to start;
    /// [`Error::Timeout`] if the set-up is not ready in time.
    pub fn start(config: SentinelConfig) -> Result<SentinelSetup> {
        if config.data.tls.is_some() {
            return Err(Error::Config("a Sentinel set-up over TLS".to_owned()));
        }
        if config.replicas == 0 {
            return Err(Error::Config(
                "a Sentinel set-up needs a replica".to_owned(),
            ));
        }
        if !(1..=config.sentinels).contains(&config.quorum) {
            return Err(Error::Config(format!(
                "quorum {} must be between 1 and the number of sentinels ({})",
                config.quorum, config.sentinels
            )));
        }
        let dir = temp_dir("fencelock-sentinel-", config.dir_in.as_deref())?;
        let primary = RedisServer::start(data_config(&config, dir.path(), 0, None))?;
        let primary_port = primary.port();
        let mut data = vec![primary];
        for index in 1..=config.replicas {
            data.push(RedisServer::start(data_config(
                &config,
                dir.path(),
                index,
                Some(primary_port),
            ))?);
        }
        let sentinels = (0..config.sentinels)
            .map(|index| {
                RedisServer::start(sentinel_config(&config, dir.path(), index, primary_port))
            })
            .collect::<Result<Vec<_>>>()?;
        let setup = SentinelSetup {
            sentinels,
            data,
            config,
            dir,
        };
        poll_until(READY_TIMEOUT, || setup.ready()).map_err(|last| Error::Timeout {
            what: "the sentinels to reach quorum and see every replica".to_owned(),
            waited: READY_TIMEOUT,
            last,
        })?;
        tracing::debug!(url = %setup.url(), "Sentinel set-up ready");
        Ok(setup)
    }

    /// The configuration the set-up was started with.
    pub fn config(&self) -> &SentinelConfig {
        &self.config
    }

    /// Every data node, by index.
    pub fn data_nodes(&self) -> &[RedisServer] {
        &self.data
    }

    /// Every sentinel, by index.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The set-up's directory (`data-N-…` and `sentinel-N-…` directories).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis+sentinel://127.0.0.1:S0,127.0.0.1:S1,…/MASTER`.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.sentinels.iter().map(RedisServer::addr).collect();
        format!(
            "redis+sentinel://{}/{}",
            addrs.join(","),
            self.config.master_name
        )
    }

    /// The processes and the directory, to keep apart.
    pub fn into_parts(self) -> SentinelParts {
        SentinelParts {
            sentinels: self.sentinels,
            data: self.data,
            dir: self.dir,
        }
    }

    /// `Ok` once every sentinel reports quorum, every replica and every
    /// other sentinel, and the first primary has every replica in sync.
    fn ready(&self) -> Result<(), String> {
        let name = self.config.master_name.as_str();
        let replicas = self.config.replicas.to_string();
        let others = (self.sentinels.len() - 1).to_string();
        for (index, sentinel) in self.sentinels.iter().enumerate() {
            let command = |args: &[&str]| {
                sentinel
                    .query::<redis::Value>(args, POLL_CMD_TIMEOUT)
                    .map_err(|e| format!("sentinel {index}: {e}"))
            };
            command(&["SENTINEL", "CKQUORUM", name])?;
            let fields: Vec<String> =
                redis::from_redis_value(command(&["SENTINEL", "MASTER", name])?)
                    .map_err(|e| format!("sentinel {index}: {e}"))?;
            let field = |key: &str| {
                fields
                    .chunks(2)
                    .find(|pair| pair[0] == key)
                    .and_then(|pair| pair.get(1))
                    .map(String::as_str)
            };
            if field("num-slaves") != Some(replicas.as_str())
                || field("num-other-sentinels") != Some(others.as_str())
            {
                return Err(format!(
                    "sentinel {index} ({}) knows {:?} replicas and {:?} other sentinels{}",
                    sentinel.addr(),
                    field("num-slaves"),
                    field("num-other-sentinels"),
                    log_line(sentinel)
                ));
            }
        }
        let primary = &self.data[0];
        let info: String = primary
            .query(&["INFO", "replication"], POLL_CMD_TIMEOUT)
            .map_err(|e| e.to_string())?;
        match online_replicas(&info) {
            n if n == self.config.replicas => Ok(()),
            n => Err(format!(
                "the primary ({}) has {n} replica(s) in sync{}",
                primary.addr(),
                log_line(primary)
            )),
        }
    }
}

/// `" (log: LINE)"`, the last line of `server`'s log.
fn log_line(server: &RedisServer) -> String {
    format!(" (log: {})", server.last_log_line())
}

/// Data node `index`'s configuration: the caller's, plus diskless
/// replication, `masterauth` for a password, and `replicaof` (in the config
/// file, which Sentinel rewrites) for a replica.
fn data_config(
    config: &SentinelConfig,
    dir: &Path,
    index: usize,
    replica_of: Option<u16>,
) -> RedisConfig {
    let mut node = config.data.clone();
    let mut args: Vec<String> = ["--repl-diskless-sync", "yes"]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
    args.append(&mut node.args);
    node.args = args;
    if let Some(password) = &config.data.password {
        node.conf_lines
            .push(format!("masterauth {}", conf_quote(password)));
    }
    if let Some(port) = replica_of {
        node.conf_lines.push(format!("replicaof 127.0.0.1 {port}"));
    }
    node.role = RedisRole::Data;
    node.dir_in = Some(dir.to_owned());
    node.dir_prefix = format!("data-{index}-");
    node
}

/// Sentinel `index`'s configuration.
fn sentinel_config(
    config: &SentinelConfig,
    dir: &Path,
    index: usize,
    primary_port: u16,
) -> RedisConfig {
    let name = &config.master_name;
    let mut lines = vec![
        format!(
            "sentinel monitor {name} 127.0.0.1 {primary_port} {}",
            config.quorum
        ),
        format!(
            "sentinel down-after-milliseconds {name} {}",
            config.down_after.as_millis()
        ),
        format!(
            "sentinel failover-timeout {name} {}",
            config.failover_timeout.as_millis()
        ),
        format!("sentinel parallel-syncs {name} {}", config.replicas),
    ];
    if let Some(password) = &config.data.password {
        lines.push(format!(
            "sentinel auth-pass {name} {}",
            conf_quote(password)
        ));
    }
    lines.extend(config.sentinel_conf_lines.iter().cloned());
    RedisConfig {
        role: RedisRole::Sentinel,
        conf_lines: lines,
        dir_in: Some(dir.to_owned()),
        dir_prefix: format!("sentinel-{index}-"),
        ..RedisConfig::default()
    }
}

/// `value` as one double-quoted config-file argument.
fn conf_quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_conf_names_the_primary_and_its_timeouts() {
        let config = SentinelConfig {
            data: RedisConfig::default().with_password("p \"w\""),
            ..SentinelConfig::default()
        };
        let dir = Path::new("/tmp");
        let lines = sentinel_config(&config, dir, 0, 7000).conf_lines;
        assert_eq!(lines[0], "sentinel monitor fencelock 127.0.0.1 7000 2");
        assert!(lines.contains(&"sentinel down-after-milliseconds fencelock 1000".to_owned()));
        assert!(lines.contains(&"sentinel failover-timeout fencelock 3000".to_owned()));
        assert!(lines.contains(&r#"sentinel auth-pass fencelock "p \"w\"""#.to_owned()));
        let data = data_config(&config, dir, 1, Some(7000));
        assert!(
            data.conf_lines
                .contains(&"replicaof 127.0.0.1 7000".to_owned())
        );
        assert!(
            data.conf_lines
                .contains(&r#"masterauth "p \"w\"""#.to_owned())
        );
        assert_eq!(data.dir_prefix, "data-1-");
    }
}
