//! Command-line syntax.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Distributed locks with fencing tokens on Redis or etcd.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    about = "Distributed locks with fencing tokens on Redis or etcd",
    after_help = "Examples:\n  fencelock run nightly-report -- ./report.sh --date today\n  fencelock run --no-wait migrate -- sqlx migrate run\n  fencelock status nightly-report\n  fencelock doctor              # is this Redis fit for locks?\n  fencelock --url etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379 run job -- ./job.sh\n  fencelock write invoice:42 closed --fence \"$FENCELOCK_FENCE\"\n  fencelock run counter -- fencelock update counter -- sh -c 'read v; echo $(( ${v:-0} + 1 ))'\n  fencelock demo                # the guide's scenario on a private redis-server\n\nExit codes:\n  run: the command's own code, 128+N if it died of signal N, 126 not executable\n       (or its #! interpreter is missing), 127 not found, 75 lock not acquired\n       (--conflict-exit-code), 76 lock lost while the command ran\n  write, update, read --register: 0 done, 3 rejected as stale (nothing written)\n  doctor: 0 every check passed, 1 warnings, 2 failures\n  update: the command's own code if it failed, 65 its output is not text\n  all: 64 usage, 69 Redis or etcd unreachable, 70 internal error, 78 bad configuration\n       (wrong password, a missing ACL permission, a key of the wrong type, a\n       database that does not exist, redis-server missing)"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// The store's URL. Redis: `redis://[user:password@]host:port[/db]` (a
    /// Cluster node given this way is detected), `rediss://` for TLS,
    /// `unix:///path/to/socket[?db=N&pass=PASSWORD]`,
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER[?db=N]`,
    /// `redis+cluster://[user:password@]host:port[,host:port…]`
    /// (`rediss+sentinel://`, `rediss+cluster://` for TLS). etcd:
    /// `etcd://[user:password@]host:port[,host:port…][?prefix=NAMESPACE]`,
    /// `etcds://` for TLS. Default: `redis://127.0.0.1:6379` (`demo` and
    /// `bench` start a private redis-server instead); also read from
    /// FENCELOCK_REDIS_URL when FENCELOCK_URL is unset. Passwords are never
    /// printed.
    #[arg(
        long = "url",
        visible_alias = "redis",
        global = true,
        env = "FENCELOCK_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) url: Option<String>,

    /// CA certificate (PEM) to trust for TLS URLs instead of the system's
    /// roots (sentinels and data nodes alike).
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_TLS_CA",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub(crate) tls_ca: Option<std::path::PathBuf>,

    /// Client certificate (PEM) for servers that require one (mutual TLS);
    /// needs --tls-key.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_TLS_CERT",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub(crate) tls_cert: Option<std::path::PathBuf>,

    /// The key (PEM) of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_TLS_KEY",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub(crate) tls_key: Option<std::path::PathBuf>,

    /// Key prefix of the locks.
    #[arg(long, global = true, default_value = fencelock::DEFAULT_PREFIX, value_name = "PREFIX")]
    pub(crate) prefix: String,

    /// Key layout: `default` (lock:{NAME}, Cluster-safe) or `guide` (lock:NAME,
    /// shared with workers written from the guide).
    #[arg(long, global = true, value_enum, default_value_t = Layout::Default)]
    pub(crate) layout: Layout,

    /// Fence mode: `clock` (never goes backwards, even if Redis loses data)
    /// or `counter` (1, 2, 3 … like the guide; needs a durable Redis).
    #[arg(long, global = true, value_enum)]
    pub(crate) fence_mode: Option<FenceModeArg>,

    /// Fence epoch (0 to 1023): every fence is EPOCH × 2^53 + the
    /// backend's fence. Default 0 on Redis, 1 on etcd; raise it by one each
    /// time a lock moves between Redis and etcd (README, "Moving a lock
    /// between Redis and etcd").
    #[arg(long, global = true, env = "FENCELOCK_FENCE_EPOCH", hide_env_values = true, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1023))]
    pub(crate) fence_epoch: Option<u16>,
}

/// Key layouts on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Layout {
    /// lock:{NAME} and lock:{NAME}:fence.
    Default,
    /// lock:NAME and lock:NAME:fence.
    Guide,
}

impl From<Layout> for fencelock::KeyLayout {
    fn from(l: Layout) -> Self {
        match l {
            Layout::Default => fencelock::KeyLayout::HashTagged,
            Layout::Guide => fencelock::KeyLayout::Guide,
        }
    }
}

/// Fence modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FenceModeArg {
    /// max(last + 1, Redis server time in µs).
    Clock,
    /// INCR: 1, 2, 3 …
    Counter,
}

impl From<FenceModeArg> for fencelock::FenceMode {
    fn from(m: FenceModeArg) -> Self {
        match m {
            FenceModeArg::Clock => fencelock::FenceMode::Clock,
            FenceModeArg::Counter => fencelock::FenceMode::Counter,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lock: acquire, run it (no shell unless
    /// -c), renew in the background, stop it if the lock is lost, release.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),

    /// Show whether a lock is held, by whom, its fence and the time left.
    #[command(
        after_help = "Examples:\n  fencelock status nightly-report\n  fencelock status invoice:42 --json\n\nExit code 0 whether held or free; read `held` in --json output."
    )]
    Status(StatusArgs),

    /// Read a fenced Redis hash resource: value, fence, holder. With
    /// --register, first record the caller's fence at the resource (safe
    /// read-modify-write).
    #[command(after_help = READ_HELP)]
    Read(ReadArgs),

    /// Write a fenced Redis hash resource: accepted only if the fence is newer
    /// than the stored one (or equal and from the same holder).
    #[command(
        after_help = "Examples:\n  fencelock write invoice:42 closed --fence 1796030814974827 --holder 3f2a…\n  # inside `fencelock run`, --fence and --holder default to the lock's own:\n  fencelock run invoice-42 -- sh -c 'fencelock write invoice:42 closed'\n\nExit codes: 0 accepted, 3 rejected as stale (a newer holder wrote)."
    )]
    Write(WriteArgs),

    /// Fenced read-modify-write of a Redis hash resource: register the fence,
    /// give the current value to CMD, write CMD's output as the new value.
    #[command(after_help = UPDATE_HELP)]
    Update(UpdateArgs),

    /// Show the locks under a pattern, live: name, holder, fence, ttl left and
    /// waiters (found with SCAN, never KEYS; on etcd, one range read).
    #[command(
        after_help = "Examples:\n  fencelock top                 # every lock, redrawn every second\n  fencelock top 'invoice:*' --interval 500ms\n  fencelock top 'invoice:*' --once --json\n\nPATTERN is a Redis glob on lock names (default *)."
    )]
    Top(TopArgs),

    /// Audit the deployment: on Redis version, role, replication, eviction,
    /// persistence, clocks, the user's permissions and the round trip; on
    /// etcd members, health, leader, version, database size, the shortest
    /// lease and the round trip. One line per check (OK, WARN or FAIL, what
    /// was found, what to change).
    #[command(after_help = DOCTOR_HELP)]
    Doctor(DoctorArgs),

    /// Measure speed and fairness against a real Redis (a private one unless
    /// --url is given), next to that Redis's own round-trip rate; or against
    /// etcd (--url etcd://…), next to etcd's read, write and bare-lock rates.
    #[command(
        after_help = "Examples:\n  fencelock bench\n  fencelock bench --scenario uncontended,many --duration 2s --repeat 5 --json\n  fencelock bench --scenario held --leases 1000,10000,100000\n  fencelock bench --url redis+cluster://127.0.0.1:7000 --scenario uncontended,many\n  fencelock bench --url rediss://127.0.0.1:6380 --tls-ca ca.pem --scenario uncontended,many\n  fencelock bench --scenario contended --mode notify,fair --workers 32 --json\n  fencelock bench --scenario contended --plot waits.svg\n  fencelock --url etcd://127.0.0.1:2379 bench --duration 5s\n\nOn etcd every wait mode waits in the same queue: contended is measured once\n(--mode and --plot are for Redis).\n\nExit code 1 if two holders ever overlapped or a held lease was lost."
    )]
    Bench(BenchArgs),

    /// Reproduce the guide's scenario on a real Redis and print the timeline:
    /// worker A stalls past its 300 ms lease, B takes over and writes, A's
    /// stale write is refused and its release leaves B's lock alone.
    #[command(
        after_help = "Examples:\n  fencelock demo\n  fencelock demo --fence-mode clock\n  fencelock --redis redis://127.0.0.1:7000 demo"
    )]
    Demo(DemoArgs),

    /// Safety harness on Redis or etcd: worker processes, faults (pauses,
    /// kills, restarts, leader changes, a faulty network) and history
    /// checkers C1-C7; exit 1 on a violation.
    #[command(after_help = crate::torture::HELP)]
    Torture(crate::torture::TortureArgs),

    /// A worker process of `fencelock torture` (internal).
    #[command(name = "torture-worker", hide = true)]
    TortureWorker,
}

const RUN_HELP: &str = "\
The command gets these environment variables:
  FENCELOCK_NAME, FENCELOCK_KEY, FENCELOCK_TOKEN, FENCELOCK_FENCE,
  FENCELOCK_TTL_MS, FENCELOCK_URL (and its old name FENCELOCK_REDIS_URL)
Pass FENCELOCK_FENCE with every write the lock protects (`fencelock write`
and `fencelock update` use it and FENCELOCK_TOKEN by default; on etcd they
write a fenced etcd key). FENCELOCK_TOKEN is the holder's secret (whoever
has it can write as the holder), and FENCELOCK_URL includes the password
if the URL has one: the command and every process it starts can read them
(so can anyone allowed to read its /proc/PID/environ). --no-url-env leaves
FENCELOCK_URL and FENCELOCK_REDIS_URL out. On etcd, FENCELOCK_KEY is the
holder's etcd key and FENCELOCK_FENCE its create revision in fence epoch 1
(2^53 + revision).

The lock is held (and renewed) until every process of the command's tree
has exited, not only the command: background jobs, pipelines, double forks.
--no-wait-children releases when the command itself exits. A process that
starts a session of its own (setsid, a daemon) has detached: it is neither
waited for nor stopped. Without a terminal on stdin the command runs in a
process group of its own.

SIGINT, SIGTERM and SIGHUP are forwarded to the command (its process group;
SIGINT only when stdin is not a terminal: a terminal's Ctrl-C already
reaches it). If the lock is lost, the whole tree gets SIGTERM, then SIGKILL
after --kill-grace. If fencelock itself dies, even of SIGKILL, a watchdog
process (fencelock-watch) kills the whole tree at once.

Exit codes: the command's own; 128+N if it died of signal N; 126 not
executable (no permission, or its #! interpreter is missing); 127 not found; 75 lock not acquired (--conflict-exit-code);
76 lock lost while the command ran; 69 Redis unreachable; 64 usage.

Examples:
  fencelock run nightly-report -- ./report.sh --date today
  fencelock run --no-wait --conflict-exit-code 0 cleanup -- ./cleanup.sh
  fencelock run --ttl 30s --wait 2m migrate -c 'make migrate && make seed'";

const DOCTOR_HELP: &str = "\
Checks (advisory ones only ever warn):
  topology     a standalone server (FAIL: a Cluster node or a Sentinel behind
               a plain redis:// URL)
  version      Redis 7.0 or newer (FAIL: older)
  role         a master (FAIL: a replica)
  replication  on a master with replicas, min-replicas-to-write set
               (advisory; FAIL: set, and no good replica, so writes stop)
  eviction     maxmemory-policy noeviction or no memory limit (advisory)
  persistence  counter fences need appendonly yes and appendfsync always
               (FAIL: no append-only file; WARN: another fsync policy, or
               one the user may not read with CONFIG GET)
  clock        the server clock within 1 s of this host's (advisory)
  fences       the server clock past every clock fence stored under the
               prefix (FAIL: behind one)
  permissions  fencelock's own operations on a probe lock under the prefix,
               deleted afterwards (FAIL: a lock operation refused; WARN: wake-
               ups, fenced hashes, top or INFO refused)
  rtt          median of 5 PINGs under 1/20 of --ttl (advisory)
--fence-mode, --prefix and --layout say what to check for.

On etcd (--url etcd://…) the checks are:
  members      an odd number, at least 3 (WARN: one member, or an even number)
  health       every member answers (WARN: a minority does not; FAIL: no quorum)
  leader       all members agree on one leader (FAIL: none, or disagreement)
  version      etcd 3.4 or newer on every member (WARN: older, or mixed)
  db size      under 80 % of the quota (WARN: above; FAIL: a NOSPACE or
               CORRUPT alarm)
  lease        etcd's shortest lease at most --ttl (WARN: a crashed holder's
               lock lasts that long, not the ttl)
  rtt          median of 5 linearizable reads under 1/20 of --ttl (advisory)

Exit codes: 0 every check passed, 1 warnings, 2 failures; 69 Redis
unreachable, 78 refused (credentials, or the user may not run PING).

Examples:
  fencelock doctor
  fencelock --redis redis://redis.internal:6379 --fence-mode counter doctor
  fencelock doctor --json | jq -r '.checks[] | select(.status != \"OK\") | .fix'";

const READ_HELP: &str = "\
With --register, the caller's fence (--fence, --holder: inside `fencelock
run`, the lock's own) is recorded at the resource before the value is read,
under the rule of a write. From then on a stale holder's write can no longer
land between this read and the caller's write (a lost update that a plain
read followed by a write allows). Exit 3 if the resource already holds a
newer fence: do not write then.

Examples:
  fencelock read invoice:42
  fencelock read invoice:42 --json
  # read-modify-write inside `fencelock run` (or use `fencelock update`):
  j=$(fencelock read --register counter --json) &&
    v=$(echo \"$j\" | jq -r '.value // 0') && fencelock write counter $((v + 1))

Exit codes: 0 read; 3 --register rejected (a newer fence took over).";

const UPDATE_HELP: &str = "\
CMD runs directly (no shell: use sh -c for a pipeline). It gets the current
value on stdin followed by one newline (nothing when there is no value), and
in FENCELOCK_VALUE (unset when there is no value, or when the value is over
64 KiB or holds a NUL byte). Its stdout, less one trailing newline, becomes
the new value: `cat` leaves it unchanged. CMD's stderr passes through.

The fence is registered at the resource before the value is read, so no
stale holder's write can land between this read and this write: concurrent
updates under `fencelock run` never lose one (a plain `fencelock read`
followed by `fencelock write` can).

Exit codes: 0 written; 3 rejected, nothing written: a newer fence took over
(at register or at write); CMD's own code (128+N if it died of signal N) if
it failed, nothing written; 126/127 CMD not executable / not found; 65 CMD's
output is not UTF-8 text, nothing written.

Examples:
  fencelock run counter -- fencelock update counter -- sh -c 'read v; echo $(( ${v:-0} + 1 ))'
  fencelock run invoice-42 -- fencelock update invoice:42 -- jq -c '.status = \"closed\"'";

/// Options of `run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Lock name, e.g. nightly-report or invoice:42.
    pub(crate) name: String,

    /// Lease ttl; renewed every third of it while the command runs.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ttl: Duration,

    /// How long to wait for the lock if it is held (beyond 100 years:
    /// forever).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION", conflicts_with = "no_wait")]
    pub(crate) wait: Duration,

    /// Try once; do not wait if the lock is held.
    #[arg(long)]
    pub(crate) no_wait: bool,

    /// How to wait for a held lock: `notify` (a release wakes the first
    /// waiter; a waiter that has waited 10 ms gets the lock handed over),
    /// `fair` (first come, first served; `--no-wait` is refused while anyone
    /// waits) or `poll` (retry with backoff; needs no pub/sub permission).
    /// Use one mode for all workers of a name.
    #[arg(long, value_enum, env = "FENCELOCK_WAIT_MODE", hide_env_values = true, default_value_t = WaitModeArg::Notify, value_name = "MODE")]
    pub(crate) wait_mode: WaitModeArg,

    /// After the grant, wait until N replicas acknowledged it (Redis WAIT);
    /// with fewer within --replica-timeout the lock is released again and
    /// `run` exits 75 like any lock not acquired, saying how many did.
    #[arg(long, value_name = "N")]
    pub(crate) replicas: Option<u32>,

    /// How long to wait for --replicas.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION", requires = "replicas")]
    pub(crate) replica_timeout: Duration,

    /// Exit code when the lock is not acquired.
    #[arg(long, default_value_t = 75, value_name = "N")]
    pub(crate) conflict_exit_code: u8,

    /// After a lost lock, time between SIGTERM and SIGKILL for the command.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) kill_grace: Duration,

    /// Do not pass FENCELOCK_URL (nor FENCELOCK_REDIS_URL) to the command:
    /// it holds the password if the URL has one. A `fencelock` inside then
    /// needs --url (or its own FENCELOCK_URL).
    #[arg(long)]
    pub(crate) no_url_env: bool,

    /// Release the lock when the command itself exits, even if processes it
    /// started (in the background, or a double fork) still run; they run on
    /// without the lock. By default `run` holds and renews the lock until
    /// every process of the command's tree has exited.
    #[arg(long)]
    pub(crate) no_wait_children: bool,

    /// Run STRING with `sh -c` instead of a command and arguments.
    #[arg(short = 'c', value_name = "STRING", conflicts_with = "command")]
    pub(crate) shell: Option<String>,

    /// No progress line while waiting.
    #[arg(short, long)]
    pub(crate) quiet: bool,

    /// At exit, report the worst renewal lag seen (how late the renewal task
    /// woke: this process's pauses) on stderr.
    #[arg(long)]
    pub(crate) verbose: bool,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics while the command
    /// runs. HOST is an address or a name (`localhost:9464`), resolved at
    /// start (its first IPv4 address if it has one).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_host_port)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,

    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// Options of `top`.
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    /// Lock names to show, a Redis glob (e.g. `invoice:*`).
    #[arg(default_value = "*", value_name = "PATTERN")]
    pub(crate) pattern: String,
    /// Print one snapshot and exit.
    #[arg(long)]
    pub(crate) once: bool,
    /// Time between refreshes.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) interval: Duration,
    /// Print JSON: one array per snapshot, on one line.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Lock name.
    pub(crate) name: String,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `read`.
#[derive(Debug, Args)]
pub(crate) struct ReadArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// Record the caller's fence at the resource before reading (exit 3 if a
    /// newer fence is there).
    #[arg(long)]
    pub(crate) register: bool,
    /// With --register: the caller's fence (inside `fencelock run`: the
    /// lock's own).
    #[arg(
        long,
        env = "FENCELOCK_FENCE",
        hide_env_values = true,
        value_name = "N"
    )]
    pub(crate) fence: Option<fencelock::Fence>,
    /// With --register: the caller's holder token (inside `fencelock run`:
    /// the lock's own).
    #[arg(
        long,
        env = "FENCELOCK_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) holder: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Who writes a fenced resource: inside `fencelock run`, the lock's own
/// fence and token by default.
#[derive(Debug, Args)]
pub(crate) struct Writer {
    /// The writer's fence (inside `fencelock run`: the lock's own).
    #[arg(
        long,
        env = "FENCELOCK_FENCE",
        hide_env_values = true,
        value_name = "N"
    )]
    pub(crate) fence: fencelock::Fence,
    /// The writer's holder token (inside `fencelock run`: the lock's own).
    #[arg(
        long,
        env = "FENCELOCK_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) holder: String,
}

/// Options of `update`.
#[derive(Debug, Args)]
pub(crate) struct UpdateArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// The writer's fence and holder token.
    #[command(flatten)]
    pub(crate) writer: Writer,
    /// Print one JSON object on stdout instead of a line of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// The command that computes the new value, and its arguments, after
    /// `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// Options of `write`.
#[derive(Debug, Args)]
pub(crate) struct WriteArgs {
    /// The resource's Redis key.
    pub(crate) resource: String,
    /// The value to store.
    pub(crate) value: String,
    /// The writer's fence and holder token.
    #[command(flatten)]
    pub(crate) writer: Writer,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The lease ttl the round trip is judged against.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ttl: Duration,
    /// Print one JSON object on stdout: url, prefix, fence_mode, ttl_ms,
    /// status (the worst) and checks, an array of {name, status, found,
    /// fix}.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Scenarios to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ScenarioArg::Uncontended, ScenarioArg::Contended, ScenarioArg::Many, ScenarioArg::Held])]
    pub(crate) scenario: Vec<ScenarioArg>,
    /// Measuring time of each contestant (fencelock and each reference) and
    /// of each wait mode, per round.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) duration: Duration,
    /// Rounds of each scenario: every figure is the median over the rounds,
    /// with the smallest and largest round beside it. Within a round
    /// fencelock and its references take turns in short slices.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub(crate) repeat: usize,
    /// Leases held by the held scenario, comma-separated (one record each).
    #[arg(long, value_delimiter = ',', default_values_t = [1000usize], value_name = "N")]
    pub(crate) leases: Vec<usize>,
    /// Workers of the contended scenario, each a thread with its own runtime
    /// and connections.
    #[arg(long, default_value_t = 8)]
    pub(crate) workers: usize,
    /// How long each contended worker holds the lock.
    #[arg(long, default_value = "1ms", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) hold: Duration,
    /// Wait modes of the contended scenario, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [WaitModeArg::Poll, WaitModeArg::Notify, WaitModeArg::Fair])]
    pub(crate) mode: Vec<WaitModeArg>,
    /// Tasks (and names) of the many scenario.
    #[arg(long, default_value_t = 64)]
    pub(crate) tasks: usize,
    /// One JSON object per line per scenario (and per wait mode) on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write an SVG of the acquire-wait and handoff distributions per mode.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<std::path::PathBuf>,
}

/// Benchmark scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ScenarioArg {
    /// One connection, acquire + release of one name.
    Uncontended,
    /// Workers contending for one name.
    Contended,
    /// Many tasks on many names sharing one client.
    Many,
    /// One client holding many auto-renewed leases.
    Held,
}

/// Wait modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WaitModeArg {
    /// Backoff with jitter.
    Poll,
    /// Pub/sub wake-up of the head waiter.
    Notify,
    /// First come, first served.
    Fair,
}

impl From<WaitModeArg> for fencelock::WaitMode {
    fn from(m: WaitModeArg) -> Self {
        match m {
            WaitModeArg::Poll => fencelock::WaitMode::Poll,
            WaitModeArg::Notify => fencelock::WaitMode::Notify,
            WaitModeArg::Fair => fencelock::WaitMode::Fair,
        }
    }
}

/// Options of `demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Lease ttl of both workers.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub(crate) ttl: Duration,

    /// How long worker A stalls (must exceed the ttl to show the takeover).
    #[arg(long, default_value = "400ms", value_parser = parse_duration)]
    pub(crate) pause: Duration,
}

/// Parses `300ms`, `10s`, `2m`, `1h30m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 300ms, 10s, 2m)"))
}

/// Parses `HOST:PORT`: an IP address (`127.0.0.1:9464`, `[::1]:9464`) or a
/// host name, resolved now; the first IPv4 address wins (`localhost` then
/// means 127.0.0.1, as most users expect), else the first address.
pub(crate) fn parse_host_port(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{SocketAddr, ToSocketAddrs};
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err("expected HOST:PORT, e.g. localhost:9464 or 127.0.0.1:9464".into());
    };
    if host.is_empty() {
        return Err("the host is empty (use e.g. localhost:9464 or 0.0.0.0:9464)".into());
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host {host:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("host {host:?} has no address"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap prints `[env: NAME=value]` in --help unless told not to: the
    /// Redis URL (password) and FENCELOCK_TOKEN (the holder's secret)
    /// would be shown.
    #[test]
    fn help_never_shows_environment_values() {
        fn check(command: &clap::Command, path: &str) {
            for arg in command.get_arguments() {
                if arg.get_env().is_some() {
                    assert!(
                        arg.is_hide_env_values_set(),
                        "{path} --{}: hide_env_values",
                        arg.get_id()
                    );
                }
            }
            for sub in command.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&super::Cli::command(), "fencelock");
    }
}
