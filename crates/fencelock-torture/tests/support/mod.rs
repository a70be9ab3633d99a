//! What the torture crate's test binaries share: the worker entry point
//! (each binary runs itself as its workers), the launcher that starts
//! them, the CLI's `single` topology on private redis-servers, and a
//! private etcd cluster of three members for the locks ([`Etcd`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_servers::redis_config::DebugCommand;
use fencelock_servers::{EtcdCluster, EtcdConfig, Persistence, RedisConfig, RedisServer};
use fencelock_torture::{Error, ErrorKind, Launcher, Topology};

/// Set for the child that runs a test binary's `torture_worker_entry`.
pub(crate) const WORKER_ENV: &str = "FENCELOCK_TORTURE_TEST_WORKER";

/// The body of each test binary's `torture_worker_entry` (an ordinary
/// test that does nothing unless its environment says so).
pub(crate) fn worker_entry() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(fencelock_torture::worker::main()) {
        panic!("worker: {e}");
    }
}

/// This test binary again, as a worker that dies with the test.
pub(crate) struct SelfLauncher;

impl Launcher for SelfLauncher {
    fn worker(&self) -> tokio::process::Command {
        let exe = std::env::current_exe().expect("the test binary");
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["--exact", "torture_worker_entry", "--nocapture"])
            .env(WORKER_ENV, "1")
            .process_group(0);
        // SAFETY: the closure runs between fork and exec and only makes the
        // async-signal-safe prctl system call.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        cmd
    }
}

/// One private redis-server for the locks (append-only file, `DEBUG`), one
/// for the resource: the CLI's `single` topology.
pub(crate) struct Single {
    locks: Arc<Mutex<RedisServer>>,
    lock_url: String,
    _resource: RedisServer,
    resource_url: String,
}

pub(crate) fn failed(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Failed, e.to_string())
}

impl Single {
    pub(crate) fn start() -> Self {
        let config = RedisConfig::default()
            .with_dir_prefix("fencelock-replay")
            .with_persistence(Persistence::AofAlways)
            .with_args(["--save", ""])
            .with_debug(DebugCommand::Local);
        let locks = RedisServer::start(config).expect("lock server");
        let resource =
            RedisServer::start(RedisConfig::default().with_dir_prefix("fencelock-replay"))
                .expect("resource server");
        Single {
            lock_url: locks.url(),
            locks: Arc::new(Mutex::new(locks)),
            resource_url: resource.url(),
            _resource: resource,
        }
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, RedisServer> {
        self.locks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Topology for Single {
    fn name(&self) -> &str {
        "single"
    }

    fn lock_url(&self) -> &str {
        &self.lock_url
    }

    fn resource_url(&self) -> &str {
        &self.resource_url
    }

    fn controls_server(&self) -> bool {
        true
    }

    async fn pause(&mut self) -> fencelock_torture::Result<()> {
        self.locks().pause().map_err(failed)
    }

    async fn resume(&mut self) -> fencelock_torture::Result<()> {
        self.locks().resume();
        Ok(())
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> fencelock_torture::Result<()> {
        self.locks().kill();
        tokio::time::sleep(down).await;
        let locks = self.locks.clone();
        tokio::task::spawn_blocking(move || {
            let mut server = locks.lock().unwrap_or_else(|p| p.into_inner());
            if !keep_data {
                server.wipe_data()?;
            }
            server.start_again(&[])
        })
        .await
        .map_err(failed)?
        .map_err(failed)
    }
}

/// Three private etcd members for the locks and a private redis-server
/// for the resource (no nemesis touches it): the CLI's `etcd` topology,
/// its node-level nemeses aimed at each member in turn (a pause or a kill
/// of the leader forces an election).
#[allow(dead_code)]
pub(crate) struct Etcd {
    cluster: Arc<Mutex<EtcdCluster>>,
    lock_url: String,
    _resource: RedisServer,
    resource_url: String,
    aimed: usize,
    aims: usize,
    paused: Option<usize>,
}

#[allow(dead_code)]
impl Etcd {
    pub(crate) fn start() -> Self {
        let cluster = EtcdCluster::start(EtcdConfig {
            dir_prefix: "fencelock-torture-etcd-".to_owned(),
            ..EtcdConfig::default()
        })
        .expect("etcd cluster");
        let resource =
            RedisServer::start(RedisConfig::default().with_dir_prefix("fencelock-torture"))
                .expect("resource server");
        Etcd {
            lock_url: cluster.url(),
            cluster: Arc::new(Mutex::new(cluster)),
            resource_url: resource.url(),
            _resource: resource,
            aimed: 0,
            aims: 0,
            paused: None,
        }
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, EtcdCluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Topology for Etcd {
    fn name(&self) -> &str {
        "etcd"
    }

    fn lock_url(&self) -> &str {
        &self.lock_url
    }

    fn resource_url(&self) -> &str {
        &self.resource_url
    }

    fn controls_server(&self) -> bool {
        true
    }

    fn etcd(&self) -> bool {
        true
    }

    fn aimed(&self) -> String {
        format!("member {}", self.aimed)
    }

    async fn aim(&mut self, _key: &str) -> fencelock_torture::Result<()> {
        let n = self.cluster().len();
        self.aimed = self.aims % n;
        self.aims += 1;
        Ok(())
    }

    async fn pause(&mut self) -> fencelock_torture::Result<()> {
        self.cluster().pause(self.aimed).map_err(failed)?;
        self.paused = Some(self.aimed);
        Ok(())
    }

    async fn resume(&mut self) -> fencelock_torture::Result<()> {
        if let Some(i) = self.paused.take() {
            self.cluster().resume(i);
        }
        Ok(())
    }

    async fn restart(&mut self, keep_data: bool, down: Duration) -> fencelock_torture::Result<()> {
        if !keep_data {
            return Err(failed("etcd members restart with their data only"));
        }
        self.paused = None;
        let i = self.aimed;
        self.cluster().kill(i);
        tokio::time::sleep(down).await;
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster.lock().unwrap_or_else(|p| p.into_inner()).restart(i)
        })
        .await
        .map_err(failed)?
        .map_err(failed)
    }
}
