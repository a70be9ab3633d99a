//! The coordinator: starts the resource, the proxy, the observer and the
//! worker processes, injects the scheduled nemeses, collects the history,
//! then stops everything (bounded), reads the audit and checks.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::clock::RunClock;
use crate::config::{Config, ResourceKind, fence_mode_name, layout_name, mode_name};
use crate::error::{Error, Result};
use crate::history::{Entry, Event, Header, History, HistoryFile};
use crate::nemesis::NemesisKind;
use crate::observer::{Observer, Watched};
use crate::proxy::Proxy;
use crate::report::Report;
use crate::resource::{ResourceSpec, Store};
use crate::schedule::{self, Planned};
use crate::topology::Topology;
use crate::worker::WorkerSpec;

/// Starts worker processes: the `fencelock` binary with its hidden
/// `torture-worker` command, set up so that it dies with the coordinator.
///
/// A worker is any program that speaks the worker protocol
/// ([`crate::worker`]): its spec as the first line of stdin, history lines
/// on stdout, `stop` (or the end of stdin) to stop. A launcher may run
/// some workers with another implementation of it (the CLI's
/// `--python-workers`: the Python package's worker), which
/// [`Launcher::worker_at`] and [`Launcher::kind`] say per worker.
pub trait Launcher {
    /// A command that runs one worker (stdin, stdout and stderr are set by
    /// the engine).
    fn worker(&self) -> tokio::process::Command;

    /// The command that runs worker `index` (`w{index}`); by default
    /// [`Launcher::worker`] for every worker.
    fn worker_at(&self, index: usize) -> tokio::process::Command {
        let _ = index;
        self.worker()
    }

    /// What implements worker `index`, in a word ([`DEFAULT_WORKER_KIND`]
    /// by default: this crate's worker). A run whose workers are not all of
    /// the default kind records each worker's kind in the history's header,
    /// and its report counts the operations per kind.
    fn kind(&self, index: usize) -> &str {
        let _ = index;
        DEFAULT_WORKER_KIND
    }
}

/// The kind of this crate's own worker ([`crate::worker::main`]).
pub const DEFAULT_WORKER_KIND: &str = "rust";

/// Follows a run while it goes.
pub trait Progress {
    /// Called about once a second.
    fn tick(&mut self, status: &Status) {
        let _ = status;
    }
}

impl Progress for () {}

/// Where a run is.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Time since the start.
    pub elapsed: Duration,
    /// The planned duration.
    pub duration: Duration,
    /// Cycles started.
    pub ops: u64,
    /// Writes accepted.
    pub acknowledged: u64,
    /// Nemeses injected.
    pub nemeses: u64,
    /// The last nemesis.
    pub last_nemesis: Option<&'static str>,
}

/// What the coordinator tracks while events arrive.
struct Live {
    events: Vec<Event>,
    file: Option<HistoryFile>,
    /// Where each worker is in its cycle: 1 holding a lease, 2 between its
    /// read and its write, 0 otherwise.
    holding: HashMap<String, u8>,
    /// The name each worker was last granted.
    held_name: HashMap<String, String>,
    /// How many write outcomes each worker has reported.
    written: HashMap<String, u64>,
    status: Status,
}

impl Live {
    fn push(&mut self, ev: Event) {
        match &ev.e {
            Entry::Acquire { .. } => self.status.ops += 1,
            Entry::Granted { name, access, .. } => {
                // A reader works before its read: a pause or a revoke
                // there lets a writer in before the reader reads.
                let phase = if access.as_deref() == Some("read") {
                    2
                } else {
                    1
                };
                self.holding.insert(ev.p.clone(), phase);
                self.held_name.insert(ev.p.clone(), name.clone());
            }
            Entry::ValidatedRead { .. } => {
                self.holding.insert(ev.p.clone(), 1);
            }
            Entry::Write { .. } => {
                self.holding.insert(ev.p.clone(), 1);
            }
            Entry::Read { .. } => {
                self.holding.insert(ev.p.clone(), 2);
            }
            Entry::Release { .. } => {
                self.holding.insert(ev.p.clone(), 0);
            }
            Entry::Written { outcome, .. } => {
                *self.written.entry(ev.p.clone()).or_default() += 1;
                if *outcome == crate::history::Outcome::Accepted {
                    self.status.acknowledged += 1;
                }
            }
            Entry::NemesisStart { .. } => self.status.nemeses += 1,
            _ => {}
        }
        if let Some(f) = &mut self.file {
            f.write(&ev);
        }
        self.events.push(ev);
    }
}

/// A worker process.
struct WorkerProc {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: Pid,
    /// The end of what it wrote on stderr.
    stderr: StderrTail,
}

/// The last lines a worker wrote on stderr (at most [`StderrTail::MAX`]
/// bytes), for the error that names a worker that exited early.
#[derive(Debug, Clone, Default)]
struct StderrTail(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl StderrTail {
    /// The most kept, in bytes.
    const MAX: usize = 4096;

    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.push_back(line);
        while lines.len() > 1 && lines.iter().map(|l| l.len() + 1).sum::<usize>() > Self::MAX {
            lines.pop_front();
        }
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// The nemeses a run injects: as configured, else the control's own, else
/// every one the topology supports.
fn nemeses<T: Topology>(config: &Config, topology: &T) -> Result<Vec<NemesisKind>> {
    let shape = topology.shape();
    if let Some(why) = config.primitive_refusal(config.nemeses.as_deref()) {
        return Err(Error::usage(format!(
            "{why} (the {} topology)",
            topology.name()
        )));
    }
    if let Some(v) = config.variant
        && let Some(why) = v.unsupported(&shape).or_else(|| {
            config
                .nemeses
                .is_none()
                .then(|| v.refusal(&shape))
                .flatten()
        })
    {
        return Err(Error::usage(format!(
            "--unsafe {}: cannot be caught on the {} topology: {why}",
            v.name(),
            topology.name()
        )));
    }
    let kinds = match (&config.nemeses, config.variant) {
        (Some(list), _) => list.clone(),
        // The control's nemeses that this topology can run (its refusal
        // above says when none that exposes it can).
        (None, Some(v)) => v
            .nemeses()
            .iter()
            .copied()
            .filter(|k| topology.supports(*k))
            .collect(),
        (None, None) => NemesisKind::ALL
            .into_iter()
            .filter(|k| topology.supports(*k))
            // A semaphore's permits are not revoked.
            .filter(|k| config.permits.is_none() || *k != NemesisKind::Revoke)
            .collect(),
    };
    let refused: Vec<String> = kinds.iter().filter_map(|k| topology.refusal(*k)).collect();
    if !refused.is_empty() {
        let possible: Vec<&str> = NemesisKind::ALL
            .into_iter()
            .filter(|k| topology.supports(*k))
            .map(NemesisKind::name)
            .collect();
        return Err(Error::usage(format!(
            "--nemesis {} (possible on the {} topology: {})",
            refused.join("; "),
            topology.name(),
            possible.join(", ")
        )));
    }
    Ok(kinds)
}

/// How many replicas each grant waits for: as configured, else every
/// replica of the shard.
fn wait_replicas<T: Topology>(config: &Config, topology: &T) -> Result<u32> {
    let shard = topology.replicas();
    match config.replicas {
        None => Ok(shard),
        Some(n) if n <= shard => Ok(n),
        Some(n) => Err(Error::usage(format!(
            "--replicas {n}: the {} topology has {shard} replica(s) per shard",
            topology.name()
        ))),
    }
}

/// Builds a worker's URL that points at the proxy's port instead.
type Rewrite = Box<dyn Fn(u16) -> String>;

/// `redis://[auth@]host:port[/db]` or `etcd://[auth@]host:port[,host:port…][/][?query]`
/// → (the same URL with only 127.0.0.1:`port`, the (first) server's
/// address), or `None` for URLs the proxy cannot stand in for (TLS, Unix
/// sockets). gRPC is HTTP/2 over plain TCP, so the byte-level proxy stands
/// in for one etcd member; behind it a worker reaches only that member (a
/// member pause or kill of it is then felt by every worker behind the
/// proxy, which only makes the faults harsher).
fn proxied(url: &str) -> Option<(Rewrite, SocketAddr)> {
    let (scheme, default_port) = if url.starts_with("etcd://") {
        ("etcd", 2379)
    } else if url.starts_with("redis://") {
        ("redis", 6379)
    } else {
        return None;
    };
    let rest = &url[scheme.len() + 3..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), authority),
    };
    let first = hosts.split(',').next()?;
    let hostport = if first.contains(':') {
        first.to_string()
    } else {
        format!("{first}:{default_port}")
    };
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&hostport)
        .ok()?
        .next()?;
    let tail = tail.to_string();
    Some((
        Box::new(move |port| format!("{scheme}://{auth}127.0.0.1:{port}{tail}")),
        addr,
    ))
}

/// Runs the workload and the nemeses of `config` on `topology` and checks
/// the history. `interrupt` ends the run early (the history so far is
/// checked).
///
/// # Errors
/// [`crate::ErrorKind::Usage`] for a configuration the topology cannot run,
/// [`crate::ErrorKind::Unreachable`] when a server cannot be reached,
/// [`crate::ErrorKind::Failed`] when workers cannot be started.
pub async fn run<T: Topology>(
    config: &Config,
    topology: &mut T,
    launcher: &dyn Launcher,
    progress: &mut dyn Progress,
    interrupt: CancellationToken,
) -> Result<Report> {
    if config.workers == 0 || config.names == 0 {
        return Err(Error::usage("--workers and --names must be at least 1"));
    }
    if config.ttl < fencelock::MIN_TTL {
        return Err(Error::usage(format!(
            "--ttl must be at least {:?}",
            fencelock::MIN_TTL
        )));
    }
    check_durations(config)?;
    let kinds = nemeses(config, topology)?;
    let wait_replicas = wait_replicas(config, topology)?;
    let needs_proxy = kinds.iter().any(|k| k.needs_proxy());
    let proxy_url = if topology.proxyable() {
        proxied(topology.lock_url())
    } else {
        None
    };
    if needs_proxy && proxy_url.is_none() {
        return Err(Error::usage(
            "the proxy nemeses (proxy-*) need a redis:// or etcd:// URL (not TLS, not a Unix socket): choose others with --nemesis",
        ));
    }
    let clock = RunClock::start();
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let prefix = format!("{}{run_id}:", config.prefix);
    let names = config.lock_names();
    let fence_mode = config.effective_fence_mode();
    let layout = config.layout();
    let header = Header {
        version: env!("CARGO_PKG_VERSION").to_string(),
        seed: config.seed,
        topology: topology.name().to_string(),
        workers: config.workers,
        names: names.clone(),
        ttl_ms: config.ttl.as_millis() as u64,
        renewal_ms: config.renewal().as_millis() as u64,
        mode: mode_name(config.mode).into(),
        // On etcd fences are create revisions whatever the mode: they never
        // repeat, as clock fences do not.
        fence_mode: if topology.etcd() {
            "revision".into()
        } else {
            fence_mode_name(fence_mode).into()
        },
        layout: layout_name(layout).into(),
        resource: config.resource.name().into(),
        unsafe_variant: config.variant.map(|v| v.name().to_string()),
        nemeses: kinds.iter().map(|k| k.name().to_string()).collect(),
        duration_ms: config.duration.as_millis() as u64,
        replicas: topology.replicas(),
        wait_replicas,
        permits: config.permits,
        rwlock_reads: config.rwlock_reads,
        worker_kinds: worker_kinds(launcher, config.workers),
    };
    // A resource on the lock deployment itself (a given Redis) waits for
    // the replicas a grant waits for: C3 then judges the lock, not a write
    // a failover lost. A separate resource server has no replicas.
    let same_deployment = topology.resource_url() == topology.lock_url();
    let resource = match &config.resource {
        ResourceKind::Redis => ResourceSpec::Redis {
            url: topology.resource_url().to_string(),
            prefix: prefix.clone(),
            replicas: if same_deployment { wait_replicas } else { 0 },
            replica_timeout_ms: config.replica_timeout().as_millis() as u64,
            tls: if same_deployment {
                config.tls.clone()
            } else {
                crate::conn::Tls::new()
            },
        },
        ResourceKind::Postgres { url } => ResourceSpec::Postgres {
            url: url.clone(),
            table: format!("torture_{run_id}"),
        },
    };
    // The lock store must answer before a worker starts: workers that
    // cannot reach it run no operation, and a run without operations would
    // end "no violation" having proved nothing. One read of a lock also
    // finds what connecting alone does not (etcd checks credentials per
    // request), so refused credentials end the run here, naming why.
    let probe = config
        .tls
        .builder(topology.lock_url())
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| Error::connect(&e))?;
    if let Some(name) = names.first() {
        probe
            .inspect(name, config.layout())
            .await
            .map_err(|e| Error::connect(&e))?;
    }
    drop(probe);
    let store = Store::open(resource.clone(), names.clone())
        .await?
        .slotted(config.permits);
    let revoker = if kinds.contains(&NemesisKind::Revoke) {
        Some(Revoker::connect(config, topology.lock_url(), &prefix, wait_replicas).await?)
    } else {
        None
    };
    // The resource's keys live only as long as the run refreshes them.
    let ttl_keeper = store.ttl_keeper().map(tokio::spawn);
    let live = RefCell::new(Live {
        events: Vec::new(),
        file: config
            .history
            .as_deref()
            .map(HistoryFile::create)
            .transpose()?,
        holding: HashMap::new(),
        held_name: HashMap::new(),
        written: HashMap::new(),
        status: Status {
            duration: config.duration,
            ..Status::default()
        },
    });
    live.borrow_mut().push(Event {
        t: clock.now(),
        p: "run".into(),
        e: Entry::Header(header),
    });
    let (tx, mut rx) = unbounded_channel::<Event>();
    // The index of a worker whose stdout closed: it exited.
    let (exit_tx, mut exit_rx) = unbounded_channel::<usize>();
    let proxy = match (&proxy_url, needs_proxy) {
        (Some((_, upstream)), true) => Some(Proxy::start(*upstream, config.workers)?),
        _ => None,
    };
    let observer = Observer::start(
        topology.lock_url(),
        &config.tls,
        &prefix,
        layout,
        &names,
        match (config.permits, config.rwlock_reads) {
            (Some(p), _) => Watched::Semaphore(p),
            (None, Some(_)) => Watched::RwLock,
            (None, None) => Watched::Mutex,
        },
        clock,
        tx.clone(),
    )?;
    let lock_keys: Vec<String> = names
        .iter()
        .map(|n| fencelock::LockKeys::new(&prefix, layout, n).map(|k| k.lock().to_owned()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::usage(e.to_string()))?;
    let mut workers = Vec::new();
    for index in 0..config.workers {
        let lock_url = match (&proxy, &proxy_url) {
            (Some(p), Some((rewrite, _))) => rewrite(p.port(index)),
            _ => topology.lock_url().to_string(),
        };
        let spec = WorkerSpec {
            index,
            origin: clock.origin,
            lock_url,
            resource: resource.clone(),
            prefix: prefix.clone(),
            names: names.clone(),
            ttl_ms: config.ttl.as_millis() as u64,
            wait_ms: (config.ttl * 10).as_millis() as u64,
            hold_ms: config.effective_hold().as_millis() as u64,
            mode: mode_name(config.mode).into(),
            fence_mode: fence_mode_name(fence_mode).into(),
            variant: config.variant.map(|v| v.name().to_string()),
            seed: config.seed,
            replicas: wait_replicas,
            replica_timeout_ms: config.replica_timeout().as_millis() as u64,
            tls: config.tls.clone(),
            permits: config.permits,
            rwlock_reads: config.rwlock_reads,
            audited_write: crate::resource::AUDITED_WRITE_SOURCE.to_string(),
        };
        workers.push(spawn_worker(launcher, &spec, tx.clone(), exit_tx.clone()).await?);
    }
    let mut plan = schedule::plan(
        config.seed,
        &kinds,
        config.ttl,
        config.nemesis_interval,
        config.duration,
    );
    if config.nemeses.is_none()
        && let Some(limit) = config.variant.and_then(|v| v.nemesis_limit())
    {
        plan.truncate(limit);
    }
    let pids: Vec<Pid> = workers.iter().map(|w| w.pid).collect();
    let mut admin = Admin::new(topology.admin_url());
    drop(exit_tx);
    // A worker that exits before it is asked to stop could not start (a
    // server unreachable, a spec it cannot run) or crashed: the run ends
    // and fails, naming it, instead of going on with fewer workers.
    let mut exited_early = None;
    let ended = {
        let collect = async {
            while let Some(ev) = rx.recv().await {
                live.borrow_mut().push(ev);
            }
        };
        let exited = async {
            match exit_rx.recv().await {
                Some(index) => index,
                None => std::future::pending().await,
            }
        };
        let drive = drive(DriveCtx {
            config,
            plan: &plan,
            topology: &mut *topology,
            proxy: proxy.as_ref(),
            admin: &mut admin,
            pids: &pids,
            keys: &lock_keys,
            live: &live,
            clock,
            tx: tx.clone(),
            store: &store,
            revoker: revoker.as_ref(),
            progress,
            interrupt,
        });
        tokio::select! {
            reason = drive => reason,
            () = collect => "the event channel closed".to_string(),
            index = exited => {
                exited_early = Some(index);
                format!("worker w{index} exited")
            }
        }
    };
    // Heal every fault, then stop the workers (bounded), then the observer.
    heal(&mut *topology, proxy.as_ref(), &pids).await;
    let early = exited_early.and_then(|i| workers.get(i).map(|w| (i, w.stderr.clone())));
    let statuses = stop_workers(workers, config).await;
    observer.stop();
    drop(proxy);
    drop(tx);
    while let Some(ev) = rx.recv().await {
        live.borrow_mut().push(ev);
    }
    let t = clock.now();
    let snapshot = store.snapshot(t).await;
    let mut live = live.into_inner();
    for ev in snapshot? {
        live.push(ev);
    }
    live.push(Event {
        t,
        p: "run".into(),
        e: Entry::End { reason: ended },
    });
    if let Some(f) = &mut live.file {
        f.flush();
    }
    if let Some(keeper) = ttl_keeper {
        keeper.abort();
    }
    store.remove().await;
    remove_lock_keys(topology.lock_url(), &config.tls, &prefix).await;
    if let Some((index, stderr)) = early {
        let status = statuses.get(index).copied().flatten();
        return Err(exited_error(
            index,
            launcher.kind(index),
            status,
            &stderr.text(),
        ));
    }
    Ok(Report::from_history(&History::new(live.events)))
}

/// Every worker's kind ([`Launcher::kind`]), or `None` when all are the
/// default.
fn worker_kinds(launcher: &dyn Launcher, workers: usize) -> Option<Vec<String>> {
    let kinds: Vec<String> = (0..workers).map(|i| launcher.kind(i).to_string()).collect();
    kinds
        .iter()
        .any(|k| k != DEFAULT_WORKER_KIND)
        .then_some(kinds)
}

/// Why a run failed when worker `index` exited before the end: its exit
/// status and the end of what it wrote on stderr.
fn exited_error(
    index: usize,
    kind: &str,
    status: Option<std::process::ExitStatus>,
    stderr: &str,
) -> Error {
    let status = status.map_or("its exit status is unknown".to_string(), |s| s.to_string());
    let said = stderr.trim();
    let said = if said.is_empty() {
        "it wrote nothing on stderr".to_string()
    } else {
        format!("its stderr:\n{said}")
    };
    Error::failed(format!(
        "torture worker w{index} ({kind}) exited before the run ended ({status}); the run is void: {said}"
    ))
}

/// Starts worker `spec.index` and sends its spec; its history lines go to
/// `tx`, its index to `exited` when its stdout closes (it exited), and its
/// stderr lines to the log and to its [`StderrTail`].
async fn spawn_worker(
    launcher: &dyn Launcher,
    spec: &WorkerSpec,
    tx: UnboundedSender<Event>,
    exited: UnboundedSender<usize>,
) -> Result<WorkerProc> {
    let index = spec.index;
    let kind = launcher.kind(index).to_string();
    let mut cmd = launcher.worker_at(index);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        let program = cmd.as_std().get_program().to_string_lossy().into_owned();
        Error::failed(format!(
            "cannot start torture worker w{index} ({kind}, {program}): {e}"
        ))
    })?;
    let pid = Pid::from_raw(child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
    let mut stdin = child.stdin.take();
    if let Some(s) = &mut stdin {
        let line = serde_json::to_string(spec).map_err(|e| Error::failed(e.to_string()))?;
        s.write_all(format!("{line}\n").as_bytes()).await?;
        s.flush().await?;
    }
    let tail = StderrTail::default();
    if let Some(stderr) = child.stderr.take() {
        let tail = tail.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::warn!("torture worker w{index} ({kind}): {line}");
                tail.push(line);
            }
        });
    }
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(ev) = serde_json::from_str::<Event>(&line)
                    && tx.send(ev).is_err()
                {
                    return;
                }
            }
            let _ = exited.send(index);
        });
    }
    Ok(WorkerProc {
        child,
        stdin,
        pid,
        stderr: tail,
    })
}

/// Asks every worker to stop after its cycle; kills those that do not
/// within the longest cycle (its wait plus two seconds). Returns each
/// worker's exit status (`None`: killed, or not known).
async fn stop_workers(
    workers: Vec<WorkerProc>,
    config: &Config,
) -> Vec<Option<std::process::ExitStatus>> {
    let bound = config.ttl * 10 + config.effective_hold() + Duration::from_secs(2);
    let mut all = Vec::new();
    for mut w in workers {
        let _ = kill(w.pid, Signal::SIGCONT);
        if let Some(mut stdin) = w.stdin.take() {
            let _ = stdin.write_all(b"stop\n").await;
            drop(stdin);
        }
        all.push(w);
    }
    let give_up = tokio::time::Instant::now() + bound;
    let mut statuses = Vec::with_capacity(all.len());
    for w in &mut all {
        match tokio::time::timeout_at(give_up, w.child.wait()).await {
            Ok(status) => statuses.push(status.ok()),
            Err(_) => {
                let _ = w.child.kill().await;
                statuses.push(None);
            }
        }
    }
    statuses
}

/// Resumes the server and every worker, clears the proxy's faults.
async fn heal<T: Topology>(topology: &mut T, proxy: Option<&Proxy>, pids: &[Pid]) {
    if topology.controls_server() {
        let _ = topology.resume().await;
    }
    for pid in pids {
        let _ = kill(*pid, Signal::SIGCONT);
    }
    if let Some(p) = proxy {
        p.heal();
    }
}

/// Deletes every key under the run's prefix (SCAN on every master, never
/// KEYS; on etcd one range delete of the prefix), through fencelock's own
/// connection: every URL form and the run's TLS files.
async fn remove_lock_keys(url: &str, tls: &crate::conn::Tls, prefix: &str) {
    if crate::topology::is_etcd_url(url) {
        return remove_etcd_keys(url, tls, prefix).await;
    }
    let conn = match crate::conn::raw(url, tls).await {
        Ok((_client, conn)) => conn,
        Err(e) => {
            tracing::warn!("cannot reach Redis to delete the run's keys under {prefix}: {e}");
            return;
        }
    };
    if let Err(e) = conn.delete_prefix(prefix).await {
        tracing::warn!("cannot delete the run's keys under {prefix}: {e}");
    }
}

/// Deletes every etcd key under the run's prefix: holder and waiter keys of
/// workers that were killed at the end (their leases would expire, but not
/// before the run returns).
async fn remove_etcd_keys(url: &str, tls: &crate::conn::Tls, prefix: &str) {
    // Bounded: a cluster that lost its quorum must not hold the report up.
    let connect = tls
        .builder(url)
        .prefix(prefix)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5))
        .connect();
    let Ok(client) = connect.await else {
        tracing::warn!("cannot reach etcd to delete the run's keys under {prefix}");
        return;
    };
    if let Err(e) = fencelock::testing::etcd_delete_prefix(&client).await {
        tracing::warn!("cannot delete the run's keys under {prefix}: {e}");
    }
}

/// The administrative connection (`DEBUG SLEEP`, `CLIENT PAUSE`, …),
/// reopened after a restart.
struct Admin {
    url: String,
    conn: Option<redis::aio::MultiplexedConnection>,
}

impl Admin {
    fn new(url: &str) -> Self {
        Admin {
            url: url.to_string(),
            conn: None,
        }
    }

    /// Sends the next commands to `url` (the node a topology aimed at).
    fn point(&mut self, url: &str) {
        if self.url != url {
            self.url = url.to_string();
            self.conn = None;
        }
    }

    async fn cmd(&mut self, cmd: &redis::Cmd) -> std::result::Result<redis::Value, String> {
        if self.conn.is_none() {
            let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(15)));
            self.conn = Some(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err("no connection".into());
        };
        let reply = cmd.query_async(conn).await;
        if reply.is_err() {
            self.conn = None;
        }
        reply.map_err(|e| fencelock::redact_url_in(&e.to_string(), &self.url))
    }
}

struct DriveCtx<'a, T: Topology> {
    config: &'a Config,
    plan: &'a [Planned],
    topology: &'a mut T,
    proxy: Option<&'a Proxy>,
    admin: &'a mut Admin,
    pids: &'a [Pid],
    keys: &'a [String],
    live: &'a RefCell<Live>,
    clock: RunClock,
    tx: UnboundedSender<Event>,
    store: &'a Store,
    revoker: Option<&'a Revoker>,
    progress: &'a mut dyn Progress,
    interrupt: CancellationToken,
}

/// Injects the plan until the duration is over (or a violation is found
/// with `stop_on_violation`, or the run is interrupted); returns why it
/// ended. Progress and the early checks run between and during nemeses.
async fn drive<T: Topology>(c: DriveCtx<'_, T>) -> String {
    let DriveCtx {
        config,
        plan,
        topology,
        proxy,
        admin,
        pids,
        keys,
        live,
        clock,
        tx,
        store,
        revoker,
        progress,
        interrupt,
    } = c;
    let mut inj = Injector {
        topology,
        proxy,
        admin,
        pids,
        keys,
        live,
        clock,
        tx,
        store,
        revoker,
        revokes: 0,
    };
    let start = tokio::time::Instant::now();
    let end = start + config.duration;
    let nemeses = async {
        for p in plan {
            tokio::time::sleep(p.gap).await;
            if tokio::time::Instant::now() >= end {
                break;
            }
            inject(&mut inj, p).await;
        }
        // The plan covers the duration; wait for its end if it ran short.
        tokio::time::sleep_until(end).await;
    };
    let watch = async {
        let mut next_check = start + Duration::from_secs(2);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            {
                let mut live = live.borrow_mut();
                live.status.elapsed = start.elapsed();
                progress.tick(&live.status);
                if let Some(f) = &mut live.file {
                    f.flush();
                }
            }
            if config.stop_on_violation && tokio::time::Instant::now() >= next_check {
                next_check += Duration::from_secs(2);
                if violation_so_far(live, store, clock).await {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = nemeses => "duration reached".to_string(),
        () = watch => "violation found".to_string(),
        () = interrupt.cancelled() => "interrupted".to_string(),
    }
}

/// What injecting a nemesis needs.
struct Injector<'a, T: Topology> {
    topology: &'a mut T,
    proxy: Option<&'a Proxy>,
    admin: &'a mut Admin,
    pids: &'a [Pid],
    /// The lock keys of the names: a node-level nemesis acts on the primary
    /// of one of them (picked by the schedule).
    keys: &'a [String],
    live: &'a RefCell<Live>,
    clock: RunClock,
    tx: UnboundedSender<Event>,
    /// The resource, which the revoke nemesis seals.
    store: &'a Store,
    /// The revoke nemesis's client, when it runs.
    revoker: Option<&'a Revoker>,
    /// Revokes so far (each seal's audited operation is `revoke.N`).
    revokes: u64,
}

/// What the revoke nemesis revokes with: a client of the lock store, the
/// workers' options (so its revocation fence is minted as theirs are), and
/// what the run's workers do.
struct Revoker {
    client: fencelock::LockClient,
    opts: fencelock::LockOptions,
    names: Vec<String>,
    /// Whether the resource is sealed (not in `revoke-without-seal`).
    seal: bool,
    /// How long the deposed holder may take to write after the revoke: its
    /// longest work, a ttl for its requests, and a margin.
    write_bound: Duration,
}

impl Revoker {
    async fn connect(config: &Config, url: &str, prefix: &str, replicas: u32) -> Result<Self> {
        let client = config
            .tls
            .builder(url)
            .prefix(prefix.to_string())
            .connect_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| Error::connect(&e))?;
        let mut opts = client
            .options()
            .ttl(config.ttl)
            .fence_mode(config.effective_fence_mode())
            .layout(config.layout());
        if replicas > 0 {
            opts = opts.wait_for_replicas(replicas, config.replica_timeout());
        }
        Ok(Revoker {
            client,
            opts,
            names: config.lock_names(),
            seal: crate::config::Variant::seals(config.variant),
            write_bound: config.effective_hold() + config.ttl + Duration::from_millis(200),
        })
    }
}

/// Whether the history so far (with the resource's audit as it is now)
/// breaks a rule.
async fn violation_so_far(live: &RefCell<Live>, store: &Store, clock: RunClock) -> bool {
    let Ok(snapshot) = store.snapshot(clock.now()).await else {
        return false;
    };
    let mut events = live.borrow().events.clone();
    events.extend(snapshot);
    Report::from_history(&History::new(events)).violations() > 0
}

impl<T: Topology> Injector<'_, T> {
    fn emit(&self, e: Entry) {
        let _ = self.tx.send(Event {
            t: self.clock.now(),
            p: "nemesis".into(),
            e,
        });
    }

    fn start(&self, kind: NemesisKind, target: Option<String>, detail: String) {
        self.live.borrow_mut().status.last_nemesis = Some(kind.name());
        // On a replicated topology kill-wipe is a crash of the primary that
        // a replica replaces: a failover, not a loss of every grant.
        let replicated = self.topology.replicas() > 0;
        self.emit(Entry::NemesisStart {
            kind: kind.name().into(),
            target,
            detail,
            data_loss: kind == NemesisKind::KillWipe && !replicated,
            rollback: replicated && matches!(kind, NemesisKind::KillWipe | NemesisKind::Failover),
        });
    }

    fn end(&self, kind: NemesisKind, target: Option<String>) {
        self.end_with(kind, target, None, None);
    }

    /// The end of a nemesis, with what it did or why it failed.
    fn end_with(
        &self,
        kind: NemesisKind,
        target: Option<String>,
        outcome: Option<String>,
        error: Option<String>,
    ) {
        if let Some(e) = &error {
            tracing::warn!("{}: {e}", kind.name());
        }
        self.emit(Entry::NemesisEnd {
            kind: kind.name().into(),
            target,
            outcome,
            error,
        });
    }

    /// Points the topology and the administrative connection at the
    /// primary of the lock key `pick` selects; the node in words, or why
    /// it could not be found.
    async fn aim(&mut self, pick: u32) -> std::result::Result<(), String> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let key = &self.keys[pick as usize % self.keys.len()];
        let aimed = self.topology.aim(key).await.map_err(|e| e.to_string());
        self.admin.point(self.topology.admin_url());
        aimed
    }

    /// A worker for `pick`: among those between their read and their write
    /// now, else among those holding a lease, if any (`prefer_holders`).
    fn pick_worker(&self, pick: u32, prefer_holders: bool) -> usize {
        let n = self.pids.len();
        if prefer_holders {
            let live = self.live.borrow();
            for phase in [2, 1] {
                let found: Vec<usize> = (0..n)
                    .filter(|i| live.holding.get(&format!("w{i}")).copied().unwrap_or(0) >= phase)
                    .collect();
                if !found.is_empty() {
                    return found[pick as usize % found.len()];
                }
            }
        }
        pick as usize % n
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

async fn inject<T: Topology>(c: &mut Injector<'_, T>, p: &Planned) {
    let kind = p.kind;
    // Node-level nemeses act on the current primary of a lock key's shard.
    let aimed =
        if kind.needs_server_control() || (kind == NemesisKind::ClientKill && c.proxy.is_none()) {
            c.aim(p.pick).await
        } else {
            Ok(())
        };
    if let Err(e) = aimed {
        c.start(kind, None, "no primary found to act on".into());
        c.end_with(kind, None, None, Some(e));
        return;
    }
    match kind {
        NemesisKind::PauseServer => {
            c.start(
                kind,
                None,
                format!("SIGSTOP {} for {} ms", c.topology.aimed(), ms(p.length)),
            );
            let paused = c.topology.pause().await;
            tokio::time::sleep(p.length).await;
            let resumed = c.topology.resume().await;
            let error = paused.and(resumed).err().map(|e| e.to_string());
            c.end_with(kind, None, None, error);
        }
        NemesisKind::KillRestart | NemesisKind::KillWipe => {
            let keep = kind == NemesisKind::KillRestart;
            let detail = if c.topology.etcd() {
                format!(
                    "kill -9 {}, {} ms down, restart it with its data directory",
                    c.topology.aimed(),
                    ms(p.param)
                )
            } else if !keep && c.topology.replicas() > 0 {
                "kill -9 the primary, let a replica replace it, restart it empty as a replica"
                    .to_string()
            } else {
                format!(
                    "kill -9, {} ms down, restart {}",
                    ms(p.param),
                    if keep {
                        "with its data (AOF)"
                    } else {
                        "empty (no persistence)"
                    }
                )
            };
            c.start(kind, None, detail);
            let error = c.topology.restart(keep, p.param).await.err();
            c.admin.point(c.topology.admin_url());
            c.end_with(kind, None, None, error.map(|e| e.to_string()));
        }
        NemesisKind::DebugSleep => {
            let secs = p.length.as_secs_f64();
            c.start(kind, None, format!("DEBUG SLEEP {secs:.3}"));
            let error = c
                .admin
                .cmd(redis::cmd("DEBUG").arg("SLEEP").arg(format!("{secs:.3}")))
                .await
                .err();
            c.end_with(kind, None, None, error);
        }
        NemesisKind::ClientPause => {
            let mode = if p.param.is_zero() { "WRITE" } else { "ALL" };
            c.start(kind, None, format!("CLIENT PAUSE {} {mode}", ms(p.length)));
            let error = c
                .admin
                .cmd(
                    redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(ms(p.length) as u64)
                        .arg(mode),
                )
                .await
                .err();
            tokio::time::sleep(p.length).await;
            c.end_with(kind, None, None, error);
        }
        NemesisKind::ScriptFlush => {
            c.start(kind, None, "SCRIPT FLUSH".into());
            let error = c.admin.cmd(redis::cmd("SCRIPT").arg("FLUSH")).await.err();
            c.end_with(kind, None, None, error);
        }
        NemesisKind::ClientKill => {
            let n = c.pids.len();
            let all = p.pick as usize % (n + 1) == n;
            let targets: Vec<usize> = if all {
                (0..n).collect()
            } else {
                vec![p.pick as usize % n]
            };
            let target = (!all).then(|| format!("w{}", targets[0]));
            let addrs: Vec<SocketAddr> = match c.proxy {
                Some(proxy) => targets
                    .iter()
                    .flat_map(|w| proxy.upstream_addrs(*w))
                    .collect(),
                None => {
                    let node = crate::sockets::node_addr(c.topology.admin_url());
                    targets
                        .iter()
                        .flat_map(|w| crate::sockets::connections_to(c.pids[*w], node))
                        .collect()
                }
            };
            c.start(
                kind,
                target.clone(),
                format!("CLIENT KILL ADDR of {} connection(s)", addrs.len()),
            );
            for a in addrs {
                let _ = c
                    .admin
                    .cmd(
                        redis::cmd("CLIENT")
                            .arg("KILL")
                            .arg("ADDR")
                            .arg(a.to_string()),
                    )
                    .await;
            }
            c.end(kind, target);
        }
        NemesisKind::PauseWorker => {
            let w = c.pick_worker(p.pick, true);
            let target = Some(format!("w{w}"));
            c.start(
                kind,
                target.clone(),
                format!("SIGSTOP for {} ms", ms(p.length)),
            );
            let _ = kill(c.pids[w], Signal::SIGSTOP);
            tokio::time::sleep(p.length).await;
            let _ = kill(c.pids[w], Signal::SIGCONT);
            c.end(kind, target);
        }
        NemesisKind::ProxyDelay => {
            let Some(proxy) = c.proxy else { return };
            let w = c.pick_worker(p.pick, false);
            let target = Some(format!("w{w}"));
            c.start(
                kind,
                target.clone(),
                format!("replies {} ms late for {} ms", ms(p.param), ms(p.length)),
            );
            proxy.delay(w, p.param, p.length);
            tokio::time::sleep(p.length + p.param).await;
            c.end(kind, target);
        }
        NemesisKind::ProxyBlackhole => {
            let Some(proxy) = c.proxy else { return };
            let w = c.pick_worker(p.pick, false);
            let target = Some(format!("w{w}"));
            c.start(
                kind,
                target.clone(),
                format!("no traffic for {} ms", ms(p.length)),
            );
            proxy.stall(w, p.length);
            tokio::time::sleep(p.length).await;
            c.end(kind, target);
        }
        NemesisKind::ProxySwallow => {
            let Some(proxy) = c.proxy else { return };
            let w = c.pick_worker(p.pick, true);
            let target = Some(format!("w{w}"));
            c.start(
                kind,
                target.clone(),
                "drop the next reply, reset the connection".into(),
            );
            let _ = proxy.swallow(w, p.length).await;
            c.end(kind, target);
        }
        NemesisKind::ProxyReset => {
            let Some(proxy) = c.proxy else { return };
            let w = c.pick_worker(p.pick, true);
            let target = Some(format!("w{w}"));
            c.start(kind, target.clone(), "reset every connection".into());
            proxy.reset(w);
            c.end(kind, target);
        }
        NemesisKind::Revoke => revoke(c, p).await,
        NemesisKind::Failover => {
            let detail = if c.topology.etcd() {
                format!("move the Raft leadership away from {}", c.topology.aimed())
            } else {
                "make a replica the primary".into()
            };
            c.start(kind, None, detail);
            match c.topology.failover().await {
                Ok(outcome) => c.end_with(kind, None, Some(outcome), None),
                Err(e) => c.end_with(kind, None, None, Some(e.to_string())),
            }
            // Administrative commands follow the new primary.
            c.admin.point(c.topology.admin_url());
        }
    }
}

/// The `revoke` nemesis: revokes the name of a holder (preferably one
/// between its read and its write, waited for up to a ttl; else any name)
/// with the resource's seal (none in `revoke-without-seal`). The holder is
/// SIGSTOPped from before the revoke until it returned, so its write comes
/// after the revoke; the other workers stay stopped until it has written
/// (or for its longest cycle), so no later holder registers a greater
/// fence first: only the seal can refuse the deposed holder's write.
async fn revoke<T: Topology>(c: &mut Injector<'_, T>, p: &Planned) {
    let kind = NemesisKind::Revoke;
    let Some(r) = c.revoker else { return };
    let ttl = r.opts.ttl_value();
    let waited = tokio::time::Instant::now() + ttl;
    let holder = loop {
        let found = {
            let live = c.live.borrow();
            let n = c.pids.len();
            let at = |phase: u8| -> Vec<usize> {
                (0..n)
                    .filter(|i| live.holding.get(&format!("w{i}")).copied().unwrap_or(0) == phase)
                    .collect()
            };
            let reading = at(2);
            let holding = at(1);
            if !reading.is_empty() {
                Some(reading[p.pick as usize % reading.len()])
            } else if tokio::time::Instant::now() >= waited && !holding.is_empty() {
                Some(holding[p.pick as usize % holding.len()])
            } else {
                None
            }
        };
        if found.is_some() || tokio::time::Instant::now() >= waited {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let w_name = holder.and_then(|w| c.live.borrow().held_name.get(&format!("w{w}")).cloned());
    let (worker, name) = match (holder, w_name) {
        (Some(w), Some(name)) => (Some(w), name),
        _ => (
            None,
            r.names[p.pick as usize % r.names.len().max(1)].clone(),
        ),
    };
    let target = worker.map(|w| format!("w{w}"));
    c.revokes += 1;
    let op = format!("revoke.{}", c.revokes);
    let sealing = if r.seal { "sealing" } else { "WITHOUT sealing" };
    c.start(
        kind,
        target.clone(),
        format!("revoke {name}, {sealing} its resource"),
    );
    // Stop the workers first: the holder and the others.
    let others: Vec<usize> = match worker {
        Some(w) => (0..c.pids.len()).filter(|i| *i != w).collect(),
        None => Vec::new(),
    };
    if let Some(w) = worker {
        let _ = kill(c.pids[w], Signal::SIGSTOP);
    }
    for &i in &others {
        let _ = kill(c.pids[i], Signal::SIGSTOP);
    }
    let written_before = target
        .as_ref()
        .map_or(0, |t| c.live.borrow().written.get(t).copied().unwrap_or(0));
    let sent = c.clock.now();
    let sealable = c.store.sealable(&name, &op);
    let resources: Vec<&dyn fencelock::Sealable> =
        if r.seal { vec![&sealable] } else { Vec::new() };
    let revoked = r.client.revoke(&name, &r.opts, &resources).await;
    let outcome_of = |o: &fencelock::WriteOutcome| {
        if o.is_accepted() {
            crate::history::Outcome::Accepted
        } else {
            crate::history::Outcome::Stale
        }
    };
    let (entry, summary, error) = match &revoked {
        Ok(done) => {
            let sealed = done.sealed.first().map(|s| outcome_of(&s.outcome));
            let summary = format!(
                "revocation fence {}; {}; {}",
                done.fence,
                done.deposed
                    .as_ref()
                    .map_or("the lock was free".to_string(), |d| {
                        format!("deposed holder {}", d.holder)
                    }),
                match sealed {
                    Some(crate::history::Outcome::Accepted) => "resource sealed",
                    Some(_) => "resource held a later holder's greater fence already",
                    None => "resource NOT sealed",
                }
            );
            (
                Entry::Revoke {
                    name: name.clone(),
                    sent,
                    fence: Some(done.fence.get()),
                    deposed: done.deposed.as_ref().map(|d| d.holder.clone()),
                    deposed_fence: done
                        .deposed
                        .as_ref()
                        .and_then(|d| d.fence)
                        .map(fencelock::Fence::get),
                    worker: target.clone(),
                    paused: others.iter().map(|i| format!("w{i}")).collect(),
                    sealed,
                    error: None,
                },
                Some(summary),
                None,
            )
        }
        Err(e) => {
            let fence = match e {
                fencelock::Error::RevokeIncomplete { fence, .. }
                | fencelock::Error::RevokeNotReplicated { fence, .. } => Some(fence.get()),
                _ => None,
            };
            let sealed = matches!(e, fencelock::Error::RevokeIncomplete { .. })
                .then_some(crate::history::Outcome::Unknown);
            (
                Entry::Revoke {
                    name: name.clone(),
                    sent,
                    fence,
                    deposed: None,
                    deposed_fence: None,
                    worker: target.clone(),
                    paused: others.iter().map(|i| format!("w{i}")).collect(),
                    sealed,
                    error: Some(e.to_string()),
                },
                None,
                Some(e.to_string()),
            )
        }
    };
    // Recorded before the holder resumes: every event of its after the
    // revoke is stamped later.
    c.emit(entry);
    if let Some(w) = worker {
        let _ = kill(c.pids[w], Signal::SIGCONT);
        let until = tokio::time::Instant::now() + r.write_bound;
        let key = format!("w{w}");
        while tokio::time::Instant::now() < until {
            let done = {
                let live = c.live.borrow();
                live.written.get(&key).copied().unwrap_or(0) > written_before
                    || live.holding.get(&key).copied().unwrap_or(0) == 0
            };
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for &i in &others {
        let _ = kill(c.pids[i], Signal::SIGCONT);
    }
    c.end_with(kind, target, summary, error);
}

/// The longest run, ttl, hold and nemesis interval accepted: a nemesis
/// pauses for up to a few ttl and the schedule adds intervals to the run's
/// start, so each must stay far from where time arithmetic overflows; none
/// is a useful torture setting beyond these.
const MAX_RUN: Duration = Duration::from_secs(30 * 24 * 3600);
const MAX_TORTURE_TTL: Duration = Duration::from_secs(3600);

/// Refuses durations no run can use (instead of overflowing later).
fn check_durations(config: &Config) -> Result<()> {
    let too_long = |flag: &str, value: Duration, max: Duration| {
        (value > max).then(|| {
            Error::usage(format!(
                "{flag} {}: at most {} (a torture setting beyond that is never useful)",
                humantime::format_duration(value),
                humantime::format_duration(max)
            ))
        })
    };
    let checks = [
        too_long("--duration", config.duration, MAX_RUN),
        too_long("--ttl", config.ttl, MAX_TORTURE_TTL),
        too_long("--hold", config.hold, MAX_TORTURE_TTL),
        too_long(
            "--nemesis-interval",
            config.nemesis_interval,
            MAX_TORTURE_TTL,
        ),
    ];
    match checks.into_iter().flatten().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::proxied;

    #[test]
    fn the_proxy_stands_in_for_the_first_etcd_member() {
        let (rewrite, upstream) =
            proxied("etcd://u:p@127.0.0.1:2381,127.0.0.1:2383/?prefix=ns").expect("proxyable");
        assert_eq!(upstream.to_string(), "127.0.0.1:2381");
        assert_eq!(rewrite(9000), "etcd://u:p@127.0.0.1:9000/?prefix=ns");
        let (rewrite, upstream) = proxied("etcd://127.0.0.1").expect("proxyable");
        assert_eq!(upstream.to_string(), "127.0.0.1:2379");
        assert_eq!(rewrite(9000), "etcd://127.0.0.1:9000");
        // TLS is not proxied.
        assert!(proxied("etcds://127.0.0.1:2379").is_none());
    }
}
