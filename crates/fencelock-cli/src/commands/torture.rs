//! `fencelock torture`: the command line of the safety harness
//! (`fencelock-torture`). Flags become a [`Config`]; the topology is one
//! the tool starts itself (`--topology single|sentinel|cluster|etcd`, see
//! [`crate::torture_topology`]) or the deployment given with `--redis` (or
//! `--url etcd://…`, the resource then on a private redis-server);
//! workers are this binary again
//! (`torture-worker`), tied to this process by the parent-death signal;
//! the report goes to stdout (a progress line to stderr on a terminal);
//! violations exit 1.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use fencelock_torture::replay::{self, ModelCheck};
use fencelock_torture::{
    Config, ErrorKind, History, Launcher, NemesisKind, Progress, Remote, Report, ResourceKind,
    Shape, Status, Tls, Variant,
};
use tokio_util::sync::CancellationToken;

use crate::arg_values::{WaitModeArg, parse_duration};
use crate::exit;
use crate::global_options::GlobalOptions;
use crate::private_redis::PrivateRedis;
use crate::torture_topology::{Cluster, Etcd, Sentinel, Single};

/// The rest of `fencelock torture --help`, after the options.
const HELP: &str = "\
Workers are separate processes (this binary again), each running lease
cycles on the lock names: acquire, register the fence at the resource,
read the counter, work up to --hold, write counter + 1, release. The
resource records every accepted write in an audit log in the same script
(Redis) or transaction (Postgres). Nemeses are injected one at a time on a
schedule fixed by --seed. At the end the checkers read the whole history:

  C1 no write accepted with a fence lower than an accepted one (a seal
     included), nor one sent after a revoke at or below its fence
  C2 no two different holders accepted with the same fence
  C3 no acknowledged write lost (counter = acknowledged increments)
  C4 no two workers in their critical sections while both leases were valid
  C5 a lost lease is signalled within one renewal interval of being visible
  C6 fences strictly increase in grant order (clock mode: across restarts)
  C7 no lock key re-created after it ended (no zombie renewals)

Semaphore (--primitive semaphore --permits N): workers take one of N
permits of one fenced semaphore per name (LockOptions::permits) instead of
a mutex, and each does its read-modify-write on its slot's partition of
the resource, fenced by that slot's own (fence, holder) pair (the slot
view, FencedHash::slot). C1-C7 are then checked per slot (each slot a lock
and a resource of its own: C4 is one valid holder per slot), and across
the slots of a name:

  C8 never more valid holders than permits at once
  C9 no valid permit refused (no registration or write refused as stale
     while its permit was unexpired)

On every topology (single, sentinel, cluster, etcd, --redis/--url), with
the Redis resource, and without the revoke nemesis (a revoke deposes a mutex's
holder); every other nemesis runs. Its negative control is
--unsafe one-fence: every permit fenced by ONE (fence, holder) pair for all
slots, as a mutex's resource would be (caught by C9: a live permit with a
lower fence than another slot's is refused).

Read-write lock (--primitive rwlock, --reads P): each cycle takes a read
lease with probability P % (70), else a write lease, of one fenced
read-write lock per name (LockClient::rwlock); --mode defaults to fair
(in notify and poll a stream of readers can keep the writers out).
Writers do the mutex's audited read-modify-write; readers work up to
--hold, then make one validated read of the resource against their write
epoch (FencedHash::read_validated, FencedTable::read_validated) and record
the value, the stored fence and whether it was clean. C1-C3 judge the
writers' writes, C4 and C6 the writers alone, C5 and C7 every holder, and:

  C10 no writer in its critical section while a reader was in its own,
      both leases unexpired in the store
  C11 no torn read reported clean: a clean read saw a stored fence at most
      its epoch, and no write or seal with a greater fence had been
      applied (the audit's order) or acknowledged before it; a read made
      while its lease was unexpired is clean
  C12 a reader's epoch is at least every earlier writer's fence and below
      every later writer's

On every topology, with either resource and every nemesis (a revoke
deposes the writer or every reader). Its negative control is
--unsafe unvalidated-read: readers read the counter alone and report it
clean (caught by C11 once a reader paused past its lease reads a later
writer's write).

Topologies (--topology, started by the tool; not with --redis/--url):
  single    one redis-server for the locks (default)
  sentinel  a primary, 2 replicas and 3 sentinels (redis+sentinel:// URL)
  cluster   3 masters with a replica each (redis+cluster:// URL)
  etcd      3 etcd members (etcd:// URL; default --ttl 1s, etcd's shortest
            lease there)
The Redis resource lives on another private server no nemesis touches. On
sentinel and cluster every grant waits for every replica of its shard
(--replicas), so mutual exclusion (C4) is expected to hold across
failovers; renewals and releases are not waited for, and what a failover
rolls back of them is excused and counted (the report says so).

Nemeses (--nemesis, comma-separated; default: every one available):
  server side, on the private servers only, each on the current primary of
  a lock name's shard: pause-server (SIGSTOP past the ttl), kill-restart
  (kill -9, restart with its data), kill-wipe (kill -9, restart empty: no
  persistence; on sentinel and cluster a crash of the primary: a replica
  takes over, the old primary comes back empty as its replica),
  debug-sleep, client-pause, script-flush, failover (sentinel and cluster:
  SENTINEL FAILOVER, or CLUSTER FAILOVER on the master's replica)
  client side, also with --redis: pause-worker (SIGSTOP a holder past the
  ttl), client-kill (CLIENT KILL of workers' connections), revoke
  (fencelock's revoke of a holder's lock, sealing its resource at the
  revocation fence; the holder is paused across it and the others until
  it wrote, so only the seal refuses its late write), and through a
  fault proxy (single and --redis only: a Sentinel or a Cluster hands out
  node addresses that bypass it): proxy-delay, proxy-blackhole,
  proxy-swallow (reply dropped after the command ran), proxy-reset
  on etcd: pause-server and kill-restart act on one member, the leader
  and a follower in turn (restarted with its data directory); failover
  is a leader change (MoveLeader); pause-worker; revoke; the proxy
  stands in for the first member. Refused on etcd: debug-sleep, client-pause,
  script-flush, client-kill (Redis commands) and kill-wipe (a member
  cannot rejoin without its data). Nothing is excused on etcd: Raft
  commits every grant to a quorum; fences are create revisions (+ 2^53,
  fence epoch 1).

With --redis URL (or --url etcd://...) only client-side nemeses run, every
key is under a random prefix (below --prefix) and deleted at the end; on
etcd the Redis resource is a private redis-server the tool starts. Every
URL form the other commands take works, with the same --tls-ca,
--tls-cert and --tls-key (FENCELOCK_TLS_*). On a redis+sentinel:// or
redis+cluster:// URL only pause-worker and revoke run (client-kill and
the proxy need one plain redis:// server), and grants and the resource's writes
wait for every replica of their shard (--replicas N: for N), so that C3
judges the lock, not a write a failover lost; the resource's hash and
audit list share a hash tag. The resource's keys expire 60 s after the
run stops refreshing them (also when it is killed).

--check FILE checks a saved history again; with --model it also replays
every recorded operation through the protocol's model (the Redis store's
transitions, crates/fencelock-model), each taking effect at one instant
between its invocation and its completion, and names the first operation
no order explains, with why and the history around it. Expiry is allowed
only once the shortest key lifetime (the ttl or a hand-over lease, less
the drift allowance) has passed since the latest invocation before the
grant; operations without a reply may take effect or not; data loss and
failover windows let the keys reset or go stale; queues and renewals
(not recorded) are left out. The search is bounded: at most
--model-open K operations open at once and --model-states N states to
explain one operation, else its verdict is UNKNOWN (exit 2), never
unexplained. Histories on etcd are not replayed (unknown).

A run whose checkers saw too little is INCONCLUSIVE (exit 2), never
\"no violation\": every lock name needs at least 1 grant and 1
acknowledged write (a deployment that refuses every write, such as a
replica or a master short of the replicas min-replicas-to-write asks
for, acknowledges none).

Negative controls (--unsafe VARIANT[,VARIANT...] or all) run deliberately
BROKEN variants instead of fencelock, each with the nemeses that expose it
(unless --nemesis is given), and stop once the checkers catch it:
  two-command-acquire  SET NX then INCR (the guide's acquire)
  ge-check             resource accepts fence >= stored, ignoring the holder
  write-only-check     read-modify-write without registering the fence first
  unchecked-release    release by plain DEL
  recreating-renewal   renewal re-creates an expired key, even after release
  revoke-without-seal  revoke deposes the holder without sealing the resource
With --primitive semaphore: one-fence; with --primitive rwlock:
unvalidated-read (readers report every read clean without validating it).
On sentinel and cluster, `all` runs the controls that can be caught there
(two-command-acquire needs the proxy; ge-check needs a restart that loses
the counter, which a replica prevents). On etcd, `all` runs
write-only-check and revoke-without-seal: the broken locks are Redis
scripts, and etcd fences never repeat.

Mixed runs (--python-workers N): N of the workers are the Python
package's worker (PYTHON -m fencelock.torture_worker, PYTHON from --python
or FENCELOCK_PYTHON, default python3; the package must be installed for
it), the others this binary's; w1, w3, ... first, then w0, w2, ... Both
speak one protocol and do the same cycles on the same names, so the
checkers judge Rust and Python holders together. The Python worker runs
a mutex or a semaphore on Redis (any topology but etcd) with the Redis
resource; it refuses the rest (etcd, --resource postgres, --primitive
rwlock, --unsafe controls, waiting for replicas of the resource) and
exits, and a worker that exits before the end of a run voids it: the
run stops and fails (exit 70), naming the worker and quoting its stderr.
The report counts the operations per kind of worker (JSON: worker_kinds).

Examples:
  fencelock torture
  fencelock torture --duration 30m --seed 42 --history torture.jsonl
  fencelock torture --check torture.jsonl
  fencelock torture --check torture.jsonl --model --json
  fencelock torture --unsafe all
  fencelock torture --primitive semaphore --permits 3 --duration 60s
  fencelock torture --primitive semaphore --permits 3 --unsafe one-fence
  fencelock torture --workers 4 --python-workers 2 --python .venv/bin/python
  fencelock torture --primitive rwlock --duration 60s
  fencelock torture --primitive rwlock --topology etcd --unsafe unvalidated-read
  fencelock torture --topology sentinel --duration 5m
  fencelock torture --topology cluster --nemesis failover,kill-wipe,pause-worker
  fencelock torture --topology etcd --duration 2m
  fencelock --redis redis://10.0.0.5:6379 torture --nemesis pause-worker,proxy-delay
  fencelock --url etcd://10.0.0.5:2379 torture --nemesis pause-worker,proxy-reset

Exit codes: 0 no violation (with --model: and every operation explained),
1 a violation (also for a caught --unsafe control; with --model: or an
operation the model cannot explain), 2 inconclusive (no violation, but
fewer than 1 grant or 1 acknowledged write for a lock name; with --model:
or the model's verdict unknown), 64 usage, 65 a history that cannot be
read, 69 Redis or etcd unreachable, 70 a worker exited before the run
ended (or another internal failure), 78 bad configuration (refused
credentials or TLS).";

/// Safety harness on Redis or etcd: worker processes, faults (pauses,
/// kills, restarts, leader changes, a faulty network) and history
/// checkers C1-C7 (C8-C9 of a semaphore, C10-C12 of a read-write lock;
/// and, with --check FILE --model, a replay through the protocol's
/// model); exit 1 on a violation, 2 when too little was checked.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct TortureArgs {
    /// How long the workload and the nemeses run.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) duration: Duration,
    /// Worker processes.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub(crate) workers: usize,
    /// Lock names (each with its own resource).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) names: usize,
    /// How workers wait for a held lock [default: notify; fair with
    /// --primitive rwlock].
    #[arg(long, value_enum, value_name = "MODE")]
    pub(crate) mode: Option<WaitModeArg>,
    /// Lease ttl (renewed every third of it); pauses and delays scale with
    /// it [default: 300ms; 1s on etcd, whose shortest lease is 1 s].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ttl: Option<Duration>,
    /// Longest work between a worker's read and its write.
    #[arg(long, default_value = "50ms", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) hold: Duration,
    /// The protected resource.
    #[arg(long, value_enum, default_value_t = ResourceArg::Redis)]
    pub(crate) resource: ResourceArg,
    /// Postgres URL for --resource postgres (two tables are created and
    /// dropped at the end).
    #[arg(
        long,
        env = "FENCELOCK_PG_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) pg_url: Option<String>,
    /// Nemeses, comma-separated (`none` for none; default: every one
    /// available).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub(crate) nemesis: Option<Vec<String>>,
    /// Mean quiet time between two nemeses.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) nemesis_interval: Duration,
    /// Seed of the nemesis schedule and the workers' choices (default:
    /// random, shown in the report).
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,
    /// Run negative controls (BROKEN variants) instead of fencelock:
    /// comma-separated names, or `all`.
    #[arg(long = "unsafe", value_delimiter = ',', value_name = "VARIANT")]
    pub(crate) unsafe_variants: Option<Vec<String>>,
    /// The topology started for the run [default: single] (not with
    /// `--redis URL`, which uses that deployment instead).
    #[arg(long, value_enum, value_name = "TOPOLOGY")]
    pub(crate) topology: Option<TopologyArg>,
    /// How many replicas must acknowledge each grant (and, with `--redis`,
    /// each write of the resource) before a worker uses it [default: every
    /// replica of the shard on sentinel and cluster, and on a given
    /// redis+sentinel:// or redis+cluster:// deployment as many as it
    /// reports; 0 on other URLs].
    #[arg(long, value_name = "N")]
    pub(crate) replicas: Option<u32>,
    /// Write the history (JSON lines) to FILE as it is recorded.
    #[arg(long, value_name = "FILE")]
    pub(crate) history: Option<PathBuf>,
    /// Check a saved history instead of running.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["unsafe_variants", "history"])]
    pub(crate) check: Option<PathBuf>,
    /// With --check: also replay the history through the protocol's model
    /// (the store's transitions) and report the first operation no order
    /// explains (exit 1), or that the search's bounds stopped it (exit 2).
    #[arg(long, requires = "check")]
    pub(crate) model: bool,
    /// With --model: at most N states visited to explain one operation
    /// (every order of the operations open with it), else the verdict is
    /// unknown.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1_000_000,
        requires = "model"
    )]
    pub(crate) model_states: u64,
    /// With --model: at most K operations open at once per lock name (its
    /// keys, or its resource; at most 64), else the verdict is unknown.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 64,
        requires = "model",
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub(crate) model_open: u16,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// What the workers take: a mutex, one permit of a fenced semaphore
    /// (--permits), or one side of a fenced read-write lock (--reads).
    #[arg(long, value_enum, default_value_t = PrimitiveArg::Mutex, value_name = "PRIMITIVE")]
    pub(crate) primitive: PrimitiveArg,
    /// The semaphore's permits, with --primitive semaphore [default: 3].
    #[arg(long, value_name = "N")]
    pub(crate) permits: Option<u32>,
    /// The share of read leases in percent, with --primitive rwlock
    /// [default: 70].
    #[arg(long, value_name = "PERCENT")]
    pub(crate) reads: Option<u32>,
    /// Run N of the workers with the Python package's worker (`PYTHON -m
    /// fencelock.torture_worker`) instead of this binary's: odd-numbered
    /// workers first (w1, w3, ...), then even ones. A mutex or a semaphore
    /// on Redis with the Redis resource; see "Mixed runs" below.
    #[arg(long, default_value_t = 0, value_name = "N", conflicts_with = "check")]
    pub(crate) python_workers: usize,
    /// The Python interpreter of --python-workers, one in whose environment
    /// the `fencelock` package is installed.
    #[arg(
        long,
        env = "FENCELOCK_PYTHON",
        hide_env_values = true,
        default_value = "python3",
        value_name = "PATH"
    )]
    pub(crate) python: PathBuf,
}

/// What the workers take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PrimitiveArg {
    /// A mutex: one holder at a time.
    Mutex,
    /// One of --permits permits of a fenced semaphore.
    Semaphore,
    /// A read lease (--reads %) or the write lease of a fenced read-write
    /// lock.
    Rwlock,
}

/// Resources on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ResourceArg {
    /// A Redis hash and an audit list, written by one script.
    Redis,
    /// A Postgres row and an audit table, written in one transaction.
    Postgres,
}

/// Topologies on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TopologyArg {
    /// One private redis-server.
    Single,
    /// A private primary with 2 replicas and 3 sentinels.
    Sentinel,
    /// A private Cluster: 3 masters with a replica each.
    Cluster,
    /// A private etcd cluster of 3 members.
    Etcd,
}

impl TopologyArg {
    fn name(self) -> &'static str {
        match self {
            TopologyArg::Single => "single",
            TopologyArg::Sentinel => "sentinel",
            TopologyArg::Cluster => "cluster",
            TopologyArg::Etcd => "etcd",
        }
    }

    /// What the topology will be, before it starts: its store, replicas
    /// per shard, and whether the fault proxy can stand in front.
    fn shape(self) -> Shape<'static> {
        let (etcd, replicas, proxyable) = match self {
            TopologyArg::Single => (false, 0, true),
            TopologyArg::Sentinel => (false, 2, false),
            TopologyArg::Cluster => (false, 1, false),
            TopologyArg::Etcd => (true, 0, true),
        };
        Shape {
            name: self.name(),
            etcd,
            controls_server: true,
            replicas,
            proxyable,
        }
    }
}

/// The shape of a deployment given with `--url etcd://…`: client-side
/// nemeses only, the fault proxy in front of its first member.
const REMOTE_ETCD: Shape<'static> = Shape {
    name: "remote",
    etcd: true,
    controls_server: false,
    replicas: 0,
    proxyable: true,
};

/// `fencelock torture-worker`: a worker process.
pub(crate) async fn worker() -> anyhow::Result<u8> {
    fencelock_torture::worker::main().await.map_err(failure)?;
    Ok(exit::OK)
}

/// This binary again, as a worker that dies with this process; with
/// `--python-workers`, some workers are the Python package's instead.
struct SelfLauncher {
    /// The Python workers, if any.
    python: Option<PythonWorkers>,
}

/// Which workers run `PYTHON -m fencelock.torture_worker`.
struct PythonWorkers {
    /// The interpreter.
    interpreter: PathBuf,
    /// How many of the workers.
    count: usize,
    /// Of how many.
    workers: usize,
}

impl PythonWorkers {
    /// The Python workers are the odd-numbered ones first (w1, w3, ...),
    /// then the even ones (w0, w2, ...): with half of them Python, the
    /// two kinds alternate.
    fn runs(&self, index: usize) -> bool {
        let odd = self.workers / 2;
        let rank = if index % 2 == 1 {
            index / 2
        } else {
            odd + index / 2
        };
        rank < self.count
    }
}

impl SelfLauncher {
    /// The Python workers' settings, if worker `index` is one of them.
    fn python_at(&self, index: usize) -> Option<&PythonWorkers> {
        self.python.as_ref().filter(|p| p.runs(index))
    }
}

impl Launcher for SelfLauncher {
    fn worker(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.arg("torture-worker")
            // Not in the terminal's process group: Ctrl-C is ours to handle.
            .process_group(0)
            .env_remove("FENCELOCK_LOG");
        crate::child::die_with_parent(&mut cmd);
        cmd
    }

    fn worker_at(&self, index: usize) -> tokio::process::Command {
        let Some(python) = self.python_at(index) else {
            return self.worker();
        };
        let mut cmd = tokio::process::Command::new(&python.interpreter);
        cmd.args(["-m", "fencelock.torture_worker"])
            .process_group(0)
            .env_remove("FENCELOCK_LOG");
        crate::child::die_with_parent(&mut cmd);
        cmd
    }

    fn kind(&self, index: usize) -> &str {
        if self.python_at(index).is_some() {
            "python"
        } else {
            fencelock_torture::DEFAULT_WORKER_KIND
        }
    }
}

/// The progress line on stderr.
struct Line;

impl Progress for Line {
    fn tick(&mut self, s: &Status) {
        eprint!(
            "\r\x1b[2K  torture: {:.0}/{:.0} s, {} cycles, {} writes acknowledged, {} nemeses{}",
            s.elapsed.as_secs_f64(),
            s.duration.as_secs_f64(),
            s.ops,
            s.acknowledged,
            s.nemeses,
            s.last_nemesis
                .map(|k| format!(" (last: {k})"))
                .unwrap_or_default()
        );
    }
}

fn usage(message: impl Into<String>) -> anyhow::Error {
    exit::fail(exit::USAGE, message)
}

fn nemeses(list: &Option<Vec<String>>) -> anyhow::Result<Option<Vec<NemesisKind>>> {
    let Some(list) = list else { return Ok(None) };
    if list.iter().any(|n| n == "none") {
        return Ok(Some(Vec::new()));
    }
    if list.iter().any(|n| n == "all") {
        return Ok(None);
    }
    list.iter()
        .map(|n| {
            NemesisKind::parse(n.trim()).ok_or_else(|| {
                let known: Vec<&str> = NemesisKind::ALL.iter().map(|k| k.name()).collect();
                usage(format!(
                    "--nemesis {n}: no such nemesis (use {}, all or none)",
                    known.join(", ")
                ))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

fn variants(
    list: &Option<Vec<String>>,
    primitive: PrimitiveArg,
) -> anyhow::Result<Vec<Option<Variant>>> {
    let Some(list) = list else {
        return Ok(vec![None]);
    };
    if list.iter().any(|n| n == "all") {
        let all: &[Variant] = match primitive {
            PrimitiveArg::Mutex => &Variant::ALL,
            PrimitiveArg::Semaphore => &Variant::SEMAPHORE,
            PrimitiveArg::Rwlock => &Variant::RWLOCK,
        };
        return Ok(all.iter().copied().map(Some).collect());
    }
    list.iter()
        .map(|n| {
            Variant::parse(n.trim()).map(Some).ok_or_else(|| {
                let known: Vec<&str> = Variant::ALL
                    .iter()
                    .chain(&Variant::SEMAPHORE)
                    .chain(&Variant::RWLOCK)
                    .map(|v| v.name())
                    .collect();
                usage(format!(
                    "--unsafe {n}: no such negative control (use {} or all)",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

/// What the topology cannot do, refused before any server starts (the
/// engine checks the same on the running topology).
fn refuse_before_start(
    shape: &Shape<'_>,
    kinds: Option<&[NemesisKind]>,
    runs: &[Option<Variant>],
) -> anyhow::Result<()> {
    let name = shape.name;
    if let Some(kinds) = kinds {
        let refused: Vec<String> = kinds
            .iter()
            .filter_map(|k| fencelock_torture::refusal(*k, shape))
            .collect();
        if !refused.is_empty() {
            let possible: Vec<&str> = NemesisKind::ALL
                .into_iter()
                .filter(|k| fencelock_torture::refusal(*k, shape).is_none())
                .map(NemesisKind::name)
                .collect();
            return Err(usage(format!(
                "--nemesis {} (possible on the {name} topology: {})",
                refused.join("; "),
                possible.join(", ")
            )));
        }
    }
    // With --nemesis given, only what no nemesis can change is refused.
    let why = |v: Variant| match kinds {
        Some(_) => v.unsupported(shape),
        None => v.refusal(shape),
    };
    if let Some((v, why)) = runs
        .iter()
        .flatten()
        .find_map(|v| why(*v).map(|why| (v, why)))
    {
        return Err(usage(format!(
            "--unsafe {}: cannot be caught on the {name} topology: {why}",
            v.name()
        )));
    }
    Ok(())
}

fn failure(e: fencelock_torture::Error) -> anyhow::Error {
    let code = match e.kind() {
        ErrorKind::Usage => exit::USAGE,
        ErrorKind::Unreachable => exit::UNAVAILABLE,
        ErrorKind::Config => exit::CONFIG,
        ErrorKind::History => exit::DATA,
        _ => exit::SOFTWARE,
    };
    exit::fail(code, e.to_string())
}

/// `fencelock torture`: exit 1 on a violation (or a caught `--unsafe`
/// control).
pub(crate) async fn exec(global: &GlobalOptions, args: &TortureArgs) -> anyhow::Result<u8> {
    if let Some(path) = &args.check {
        let history = History::read(path).map_err(failure)?;
        let report = Report::from_history(&history);
        if args.model {
            let bounds = replay::Bounds {
                max_open: usize::from(args.model_open),
                max_states: args.model_states,
            };
            let model = replay::replay(&history, bounds);
            return Ok(show_with_model(&report, &model, args.json));
        }
        return Ok(show(&[report], &[], args.json));
    }
    if args.workers == 0 || args.names == 0 {
        return Err(usage("--workers and --names must be at least 1"));
    }
    if args.python_workers > args.workers {
        return Err(usage(format!(
            "--python-workers {}: more than the {} worker(s) of the run (--workers)",
            args.python_workers, args.workers
        )));
    }
    let launcher = SelfLauncher {
        python: (args.python_workers > 0).then(|| PythonWorkers {
            interpreter: args.python.clone(),
            count: args.python_workers,
            workers: args.workers,
        }),
    };
    let given = crate::connect::given_url(global);
    let remote_etcd = given.is_some() && crate::connect::is_etcd(global);
    if let (Some(t), Some(_)) = (args.topology, &given) {
        return Err(usage(format!(
            "--topology {} conflicts with --redis/--url: --topology starts private servers for the run, --url URL runs against the deployment given (client-side nemeses only); choose one",
            t.name()
        )));
    }
    let topology = args.topology.unwrap_or(TopologyArg::Single);
    // What decides the refusals before anything starts (a Redis given with
    // --redis is only known once reached: the engine decides there).
    let shape = match (&given, remote_etcd) {
        (None, _) => Some(topology.shape()),
        (Some(_), true) => Some(REMOTE_ETCD),
        (Some(_), false) => None,
    };
    let on_etcd = shape.is_some_and(|s| s.etcd);
    let ttl = args.ttl.unwrap_or(if on_etcd {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(300)
    });
    let kinds = nemeses(&args.nemesis)?;
    let permits = match (args.primitive, args.permits) {
        (PrimitiveArg::Mutex, Some(_)) => {
            return Err(usage(
                "--permits is for --primitive semaphore (a mutex has one holder)",
            ));
        }
        (PrimitiveArg::Rwlock, Some(_)) => {
            return Err(usage(
                "--permits is for --primitive semaphore: a lock is a semaphore or a read-write lock, not both",
            ));
        }
        (PrimitiveArg::Mutex | PrimitiveArg::Rwlock, None) => None,
        (PrimitiveArg::Semaphore, n) => Some(n.unwrap_or(3)),
    };
    let rwlock_reads = match (args.primitive, args.reads) {
        (PrimitiveArg::Rwlock, n) => Some(n.unwrap_or(70)),
        (_, Some(_)) => {
            return Err(usage(
                "--reads is for --primitive rwlock (the share of read leases)",
            ));
        }
        (_, None) => None,
    };
    let mode = args.mode.map_or(
        if rwlock_reads.is_some() {
            fencelock::WaitMode::Fair
        } else {
            fencelock::WaitMode::Notify
        },
        Into::into,
    );
    let mut runs = variants(&args.unsafe_variants, args.primitive)?;
    let mut skipped = Vec::new();
    let all = args
        .unsafe_variants
        .as_ref()
        .is_some_and(|l| l.iter().any(|n| n == "all"));
    if all && let Some(shape) = &shape {
        // With --nemesis given, only what no nemesis can change is left out.
        let why = |v: Variant| match kinds {
            Some(_) => v.unsupported(shape),
            None => v.refusal(shape),
        };
        runs.retain(|v| match v.and_then(|v| why(v).map(|w| (v, w))) {
            Some((v, why)) => {
                skipped.push((v.name(), why));
                false
            }
            None => true,
        });
        for (name, why) in &skipped {
            eprintln!(
                "fencelock torture: --unsafe all: {name} is left out on the {} topology: {why}",
                shape.name
            );
        }
    }
    if let Some(shape) = &shape {
        refuse_before_start(shape, kinds.as_deref(), &runs)?;
    }
    let resource = match (args.resource, &args.pg_url) {
        (ResourceArg::Redis, _) => ResourceKind::Redis,
        (ResourceArg::Postgres, Some(url)) => ResourceKind::Postgres { url: url.clone() },
        (ResourceArg::Postgres, None) => {
            return Err(usage(
                "--resource postgres needs --pg-url URL (or FENCELOCK_PG_URL): a database in which the run may create two tables, dropped at the end; fencelock torture does not start a Postgres server itself (initdb refuses to run as root, and a private one would not be the deployment you want to test)",
            ));
        }
    };
    if let Some(list) = &kinds
        && given.is_some()
        && let Some(k) = list.iter().find(|k| k.needs_server_control())
    {
        return Err(usage(format!(
            "--nemesis {}: needs control of the Redis server, which --redis never gives (client-side nemeses: pause-worker, client-kill, proxy-delay, proxy-blackhole, proxy-swallow, proxy-reset, revoke)",
            k.name()
        )));
    }
    // What the primitive cannot do, refused before any server starts.
    for variant in &runs {
        let mut probe = Config::new();
        probe.permits = permits;
        probe.rwlock_reads = rwlock_reads;
        probe.resource = resource.clone();
        probe.variant = *variant;
        if let Some(why) = probe.primitive_refusal(kinds.as_deref()) {
            return Err(usage(why));
        }
    }
    let tls = tls_files(global)?;
    let seed = args.seed.unwrap_or_else(|| {
        let b = uuid::Uuid::new_v4().into_bytes();
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) % 1_000_000
    });
    let interrupt = CancellationToken::new();
    {
        let interrupt = interrupt.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "\nfencelock torture: interrupted; stopping the workers and checking what ran"
                );
                interrupt.cancel();
            }
        });
    }
    let mut reports = Vec::new();
    for variant in &runs {
        if interrupt.is_cancelled() {
            break;
        }
        let mut config = Config::new();
        config.duration = args.duration;
        config.workers = args.workers;
        config.names = args.names;
        config.ttl = ttl;
        config.hold = args.hold;
        config.mode = mode;
        config.fence_mode = global
            .fence_mode
            .map_or(fencelock::FenceMode::Clock, Into::into);
        config.resource = resource.clone();
        config.nemeses = kinds.clone();
        config.nemesis_interval = args.nemesis_interval;
        config.seed = seed;
        config.variant = *variant;
        config.stop_on_violation = variant.is_some();
        config.prefix = format!("{}torture:", global.prefix);
        config.replicas = args.replicas;
        config.permits = permits;
        config.rwlock_reads = rwlock_reads;
        // The TLS options are for the deployment given; the private
        // servers the tool starts speak plain TCP.
        config.tls = if given.is_some() {
            tls.clone()
        } else {
            Tls::new()
        };
        config.history = args.history.as_ref().map(|p| match (variant, runs.len()) {
            (Some(v), n) if n > 1 => {
                let mut name = p.clone().into_os_string();
                name.push(format!(".{}", v.name()));
                PathBuf::from(name)
            }
            _ => p.clone(),
        });
        let mut progress: Box<dyn Progress> = if std::io::stderr().is_terminal() {
            Box::new(Line)
        } else {
            Box::new(())
        };
        let progress = progress.as_mut();
        let interrupt = interrupt.clone();
        let report = match (&given, topology) {
            (Some(url), _) if remote_etcd => {
                // etcd holds no Redis resource: the audited resource is a
                // private redis-server (or the Postgres given), as on every
                // topology the tool starts.
                let resource = match config.resource {
                    ResourceKind::Redis => Some(PrivateRedis::start().await?),
                    _ => None,
                };
                let mut remote = Remote::new(url.clone());
                if let Some(r) = &resource {
                    remote = remote.with_resource(r.url());
                }
                let report =
                    fencelock_torture::run(&config, &mut remote, &launcher, progress, interrupt)
                        .await;
                if let Some(r) = resource {
                    r.stop().await;
                }
                report
            }
            (Some(url), _) => {
                let remote = Remote::new(url.clone());
                // A Sentinel or Cluster URL: grants and the audited
                // resource's writes wait for the replicas each shard has
                // (unless --replicas says how many).
                let remote = match args.replicas {
                    Some(n) => Ok(remote.with_replicas(n)),
                    None => remote.with_replicas_found(&tls, &config.lock_names()).await,
                };
                match remote {
                    Ok(mut remote) => {
                        fencelock_torture::run(&config, &mut remote, &launcher, progress, interrupt)
                            .await
                    }
                    Err(e) => Err(e),
                }
            }
            (None, TopologyArg::Etcd) => {
                let mut etcd = Etcd::start().await?;
                let report =
                    fencelock_torture::run(&config, &mut etcd, &launcher, progress, interrupt)
                        .await;
                etcd.stop().await;
                report
            }
            (None, TopologyArg::Single) => {
                let mut single = Single::start().await?;
                let report =
                    fencelock_torture::run(&config, &mut single, &launcher, progress, interrupt)
                        .await;
                single.stop().await;
                report
            }
            (None, TopologyArg::Sentinel) => {
                let mut sentinel = Sentinel::start(config.ttl).await?;
                let report =
                    fencelock_torture::run(&config, &mut sentinel, &launcher, progress, interrupt)
                        .await;
                sentinel.stop().await;
                report
            }
            (None, TopologyArg::Cluster) => {
                let mut cluster = Cluster::start(config.ttl).await?;
                let report =
                    fencelock_torture::run(&config, &mut cluster, &launcher, progress, interrupt)
                        .await;
                cluster.stop().await;
                report
            }
        };
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K");
        }
        reports.push(report.map_err(failure)?);
    }
    Ok(show(&reports, &skipped, args.json))
}

/// The TLS files of the global options (`--tls-ca`, `--tls-cert`,
/// `--tls-key` and their `FENCELOCK_TLS_*` variables), for every
/// connection of the run, as every other command uses them.
fn tls_files(global: &GlobalOptions) -> anyhow::Result<Tls> {
    let mut tls = Tls::new();
    if let Some(ca) = &global.tls_ca {
        tls = tls.ca(ca);
    }
    if let Some((cert, key)) = crate::connect::client_cert(global)? {
        tls = tls.client_cert(cert, key);
    }
    Ok(tls)
}

/// Prints a checked history's report and the model's verdict after it (in
/// JSON: its `model` object); the exit code: 1 if a checker found a
/// violation or the model an operation it cannot explain, else 2 if the
/// checkers saw too little or the model's bounds stopped it (unknown), else
/// 0.
fn show_with_model(report: &Report, model: &ModelCheck, json: bool) -> u8 {
    if json {
        let mut value = report.to_json();
        if let Some(object) = value.as_object_mut() {
            object.insert("model".to_string(), model.to_json());
        }
        println!("{value}");
    } else {
        print!("{}", report.to_text());
        print!("{}", model.to_text());
    }
    if report.violations() > 0 || model.unexplained() {
        exit::FAILED
    } else if report.inconclusive().is_some() || !model.explained() {
        exit::INCONCLUSIVE
    } else {
        exit::OK
    }
}

/// Prints the reports (and the controls left out, with why); the exit code:
/// 1 if any found a violation, else 2 if any saw too little to judge
/// (inconclusive), else 0.
fn show(reports: &[Report], skipped: &[(&str, &str)], json: bool) -> u8 {
    let controls = reports.len() > 1 || !skipped.is_empty();
    if json {
        let value = if controls {
            serde_json::json!({
                "controls": reports.iter().map(Report::to_json).collect::<Vec<_>>(),
                "caught": reports.iter().filter(|r| r.violations() > 0).count(),
                "of": reports.len(),
                "left_out": skipped.iter().map(|(name, why)| serde_json::json!({"unsafe": name, "why": why})).collect::<Vec<_>>(),
            })
        } else {
            reports.first().map(Report::to_json).unwrap_or_default()
        };
        println!("{value}");
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                println!("{}", "-".repeat(72));
            }
            print!("{}", r.to_text());
        }
        if controls {
            println!("\nnegative controls:");
            for r in reports {
                let name = r
                    .header
                    .as_ref()
                    .and_then(|h| h.unsafe_variant.clone())
                    .unwrap_or_default();
                match r.first_violation_s() {
                    Some(s) => println!(
                        "  {name:<20} caught by {} after {s:.1} s",
                        r.caught_by().join(", ")
                    ),
                    None => println!("  {name:<20} NOT CAUGHT"),
                }
            }
            for (name, why) in skipped {
                println!("  {name:<20} left out: {why}");
            }
        }
    }
    if reports.iter().any(|r| r.violations() > 0) {
        exit::FAILED
    } else if reports.iter().any(|r| r.inconclusive().is_some()) {
        exit::INCONCLUSIVE
    } else {
        exit::OK
    }
}
