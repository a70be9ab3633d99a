//! `fencelock run`: a command under a lock, supervised.
//!
//! Acquire (with a progress line while waiting), start the command directly
//! (no shell unless `-c`), renew in the background, forward signals, stop the
//! command if the lock is lost (SIGTERM, then SIGKILL after the grace), and
//! always release on the way out.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use clap::Args;
use fencelock::{Access, Lease, LockClient, LockState, ReleaseOutcome};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::arg_values::{WaitModeArg, parse_duration};
use crate::fenced_resource::{ACCESS_ENV, REPLICA_TIMEOUT_ENV, REPLICAS_ENV, SLOT_ENV};
use crate::global_options::{GlobalOptions, Layout};
use crate::{connect, exit, redact, watchdog};

/// Run a command while holding a lock: acquire, run it (no shell unless
/// -c), renew in the background, stop it if the lock is lost, release.
#[derive(Debug, Args)]
#[command(after_help = HELP)]
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
    /// with fewer within --replica-timeout the lock is given back and tried
    /// again until --wait has passed, then `run` exits 75 like any lock not
    /// acquired, saying how many did. The command's `fencelock write`,
    /// `update` and `read --register` wait for N replicas too (passed as
    /// FENCELOCK_REPLICAS and FENCELOCK_REPLICA_TIMEOUT).
    #[arg(long, value_name = "N")]
    pub(crate) replicas: Option<u32>,

    /// How long to wait for --replicas.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "DURATION", requires = "replicas")]
    pub(crate) replica_timeout: Duration,

    /// Take one of N permits of a fenced semaphore instead of the lock:
    /// up to N commands hold NAME at once, each in its own slot 0..N-1
    /// (passed as FENCELOCK_SLOT), each with its own fence. N is 1 to 1024;
    /// use one N for a name everywhere. Not with --layout guide.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    pub(crate) permits: Option<u32>,

    /// Take NAME as a reader of a fenced read-write lock instead of the
    /// lock: readers hold it together, never with a writer. FENCELOCK_FENCE
    /// is then the write epoch the reader saw, for `fencelock read
    /// --validate`; it is no write fence (`write` and `update` inside are
    /// refused). Not with --write, --permits or --layout guide.
    #[arg(long, conflicts_with_all = ["write", "permits"])]
    pub(crate) read: bool,

    /// Take NAME as the writer of a fenced read-write lock: alone, with no
    /// reader, and fenced like a lock (FENCELOCK_FENCE). Not with --read,
    /// --permits or --layout guide.
    #[arg(long, conflicts_with = "permits")]
    pub(crate) write: bool,

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

/// The rest of `fencelock run --help`, after the options.
const HELP: &str = "\
The command gets these environment variables:
  FENCELOCK_NAME, FENCELOCK_KEY, FENCELOCK_TOKEN, FENCELOCK_FENCE,
  FENCELOCK_TTL_MS, FENCELOCK_URL (and its old name FENCELOCK_REDIS_URL),
  with --permits also FENCELOCK_SLOT (the permit's slot, 0 to N-1; unset
  for a lock without --permits, also when inherited),
  with --read or --write also FENCELOCK_ACCESS (`read` or `write`; unset
  for a lock or a semaphore, also when inherited),
  with --replicas also FENCELOCK_REPLICAS and FENCELOCK_REPLICA_TIMEOUT,
  and FENCELOCK_TLS_CA, FENCELOCK_TLS_CERT, FENCELOCK_TLS_KEY (absolute
  paths) when --tls-ca, --tls-cert, --tls-key are given (also with
  --no-url-env), so a nested `fencelock` reaches a TLS store the same way.
Pass FENCELOCK_FENCE with every write the lock protects (`fencelock write`
and `fencelock update` use it and FENCELOCK_TOKEN by default; on etcd they
write a fenced etcd key). FENCELOCK_TOKEN is the holder's secret (whoever
has it can write as the holder), and FENCELOCK_URL includes the password
if the URL has one: the command and every process it starts can read them
(so can anyone allowed to read its /proc/PID/environ). --no-url-env leaves
FENCELOCK_URL and FENCELOCK_REDIS_URL out. On etcd, FENCELOCK_KEY is the
holder's etcd key and FENCELOCK_FENCE its create revision in fence epoch 1
(2^53 + revision).

With --permits N, NAME is a fenced semaphore: up to N commands hold it at
once, each in its own slot (the lowest free one), with a fence of its own;
the next waits as for a held lock (--wait, --no-wait, --wait-mode, exit
75). Everything else is the same: renewal, a lost permit (76), signals,
the release. `fencelock write`, `read` and `update` inside use the slot's
own pair of the resource (fields value:SLOT, fence:SLOT, holder:SLOT), so a
stale holder of the same slot is refused while the other slots' holders
write their own. A name is one kind while it has holders: `run --permits`
on a name held by a `run` without it (a mutex), `run` without it on a
semaphore, or another N than its holders use exits 78 at once with the
reason, nothing changed.

With --read or --write, NAME is a fenced read-write lock: readers hold it
together, a writer holds it alone (no reader, no other writer). A writer
is fenced as a lock is: FENCELOCK_FENCE is its fence, and `fencelock
write` and `update` inside use it. A reader's FENCELOCK_FENCE is the write
epoch it saw (the last fence issued for NAME): every writer granted after
it has a greater fence, so `fencelock read --validate RESOURCE` inside
exits 75 (torn) when such a writer had written RESOURCE, say because the
reader paused past its lease. A reader's epoch is no write fence:
`fencelock write`, `update` and `read --register` refuse to write with it
(64, nothing changed). With --wait-mode fair, readers and writers queue in
one order (readers at the head go in together); notify and poll promise no
order, and a steady stream of readers can keep a writer out. A name held
as a lock or a semaphore exits 78 with --read or --write, and the reverse.

The lock is held (and renewed) until every process of the command's tree
has exited, not only the command: background jobs, pipelines, double forks.
--no-wait-children releases when the command itself exits. A process that
starts a session of its own (setsid, a daemon) has detached: it is neither
waited for nor stopped. Without a terminal on stdin the command runs in a
process group of its own.

SIGINT, SIGTERM and SIGHUP are forwarded to the command (its process group;
SIGINT only when stdin is not a terminal: a terminal's Ctrl-C already
reaches it). One that arrives while `run` still waits for the lock ends it
with 128+N, after it has left the queue: on etcd its waiter's key is
removed before it exits (as when --wait runs out), and if it is killed
(SIGKILL) the key expires with its 2 s waiter lease, not the ttl. If the lock is lost, the whole tree gets SIGTERM, then SIGKILL
after --kill-grace. If fencelock itself dies, even of SIGKILL, a watchdog
process (fencelock-watch) kills the whole tree at once.

Exit codes: the command's own; 128+N if it died of signal N; 126 not
executable (no permission, or its #! interpreter is missing); 127 not found;
75 lock not acquired (--conflict-exit-code): held by another, too few
replicas acknowledged the grant (--replicas), or the master refused writes
(NOREPLICAS under min-replicas-to-write, READONLY, LOADING or MASTERDOWN
during a failover) until the wait ended, the reason on stderr; 76 lock lost
while the command ran; 74 the command exited 0 but its lock could not be
released (it stays held until its ttl runs out; a command's own non-zero
code wins); 69 Redis or etcd unreachable; 78 bad configuration (refused
credentials on any topology, a missing permission, a TLS file or handshake
refused, a name held as another kind of lock (a lock, a semaphore, a
read-write lock) or with another --permits, the reason on stderr);
64 usage (--permits not from 1 to 1024, or with --layout guide; --read,
--write and --permits together; --read or --write with --layout guide).

While it waits, `run` keeps trying through a held lock, a master that
refuses writes (NOREPLICAS, READONLY, LOADING, MASTERDOWN), an unreachable
Redis and a Sentinel failover, until --wait has passed; its progress line
says why it waits. Behind Sentinel or a Cluster it also keeps trying to
connect (the sentinels may still name a master that is gone); one server
that cannot be reached when `run` starts exits 69 at once.

Examples:
  fencelock run nightly-report -- ./report.sh --date today
  fencelock run --no-wait --conflict-exit-code 0 cleanup -- ./cleanup.sh
  fencelock run --ttl 30s --wait 2m migrate -c 'make migrate && make seed'
  fencelock run --permits 2 encoders -c 'echo \"slot $FENCELOCK_SLOT, fence $FENCELOCK_FENCE\"'
  fencelock run --permits 2 flushers -- sh -c 'fencelock write partitions flushed'
  fencelock run --write config -- fencelock write config:data v2
  fencelock run --read config -- fencelock read --validate config:data";

/// Parses `--permits N`: a number from 1 to [`fencelock::MAX_PERMITS`].
fn parse_permits(s: &str) -> Result<u32, String> {
    let max = fencelock::MAX_PERMITS;
    match s.trim().parse::<u64>() {
        Ok(n) if (1..=u64::from(max)).contains(&n) => Ok(n as u32),
        Ok(0) => Err(format!(
            "a semaphore needs at least 1 permit (use a number from 1 to {max})"
        )),
        Ok(n) => Err(format!(
            "{n} permits is more than the most a semaphore may have, {max}"
        )),
        Err(_) => Err(format!(
            "not a number of permits (use a number from 1 to {max})"
        )),
    }
}

/// Parses `HOST:PORT`: an IP address (`127.0.0.1:9464`, `[::1]:9464`) or a
/// host name, resolved now; the first IPv4 address wins (`localhost` then
/// means 127.0.0.1, as most users expect), else the first address.
fn parse_host_port(s: &str) -> Result<std::net::SocketAddr, String> {
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

/// Exit code when the lock was lost while the command ran.
pub(crate) const LOST: u8 = 76;

/// The longest wait passed to the library: a `--wait` beyond it (say
/// `500000000000y`) waits forever instead of overflowing a deadline.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `fencelock run`: the command's own exit code, or one of [`HELP`]'s.
pub(crate) async fn exec(global: &GlobalOptions, args: &RunArgs) -> anyhow::Result<u8> {
    let (program, program_args) = command_line(args)?;
    if args.permits.is_some() && global.layout == Layout::Guide {
        return Err(exit::fail(
            exit::USAGE,
            "--permits cannot be used with --layout guide: the guide's workers know only a lock (lock:NAME); use the default layout for a semaphore",
        ));
    }
    let access = access(args);
    if let Some(access) = access {
        let flag = access_flag(access);
        if global.layout == Layout::Guide {
            return Err(exit::fail(
                exit::USAGE,
                format!(
                    "{flag} cannot be used with --layout guide: the guide's workers know only a lock (lock:NAME); use the default layout for a read-write lock"
                ),
            ));
        }
    }
    // A bad name is the user's to fix whatever the store's state: said
    // before any connection is tried.
    fencelock::check_name(&args.name)?;
    let started = Instant::now();
    let wait = if args.no_wait {
        Duration::ZERO
    } else {
        args.wait.min(FOREVER)
    };
    let client = connect_waiting(global, &args.name, wait, args.quiet).await?;
    if let Some(addr) = args.metrics_addr {
        crate::diagnostics::serve_metrics(addr)?;
    }
    let opts = connect::options(global, &client)
        .ttl(args.ttl)
        .wait_mode(args.wait_mode.into())
        .wait(wait.saturating_sub(started.elapsed()));
    let opts = match args.replicas {
        Some(replicas) => opts.wait_for_replicas(replicas, args.replica_timeout),
        None => opts,
    };
    let opts = match args.permits {
        Some(permits) => opts.permits(permits),
        None => opts,
    };
    let opts = match access {
        Some(access) => opts.access(access),
        None => opts,
    };
    opts.validate()?;
    if args.kill_grace >= args.ttl.saturating_mul(10) {
        // Not an error: but a grace much longer than the lease lets a stale
        // command run on for long after another holder started.
        tracing::warn!("--kill-grace is more than 10x the ttl");
    }

    let mut signals = Signals::new()?;
    let lease = tokio::select! {
        lease = acquire_with_progress(&client, &args.name, &opts, args.quiet) => lease,
        sig = signals.next() => {
            // The dropped acquisition removes its place in the queue (on
            // etcd, its waiter's key) in the background: let it finish.
            flush(&client).await;
            return Ok(128 + sig as u8);
        }
    };
    let lease = match lease {
        Ok(lease) => lease,
        // Too few replicas acknowledged the grant (the grant was released
        // again), or the master took no writes (NOREPLICAS, READONLY, …)
        // until the wait ended: not acquired either; the message says why.
        Err(e)
            if e.is_contended()
                || matches!(e, fencelock::Error::NotReplicated { .. })
                || refused_for_now(&e).is_some() =>
        {
            flush(&client).await;
            if !args.quiet {
                eprintln!("fencelock: {}", redact::scrub(&e.to_string()));
            }
            return Ok(args.conflict_exit_code);
        }
        Err(e) => {
            flush(&client).await;
            return Err(e.into());
        }
    };
    if lease.access() != access {
        // A reader given a lock (or a writer given anything else) would
        // pass an epoch as a fence, or a fence as an epoch: give it back.
        let held = held_as(&lease);
        let _ = lease.release().await;
        return Err(exit::fail(
            exit::SOFTWARE,
            format!(
                "lock {:?} was granted as {held}, not as asked ({}): the store's engine does not take this kind of lock; given back, the command not run",
                args.name,
                access.map_or("a lock", access_flag)
            ),
        ));
    }

    // Without a terminal, the command gets a process group of its own, so a
    // lost lock stops the whole command tree (a shell's children included),
    // not just its first process. With a terminal it stays in our foreground
    // group so job control and terminal input keep working. Either way the
    // watchdog (see `watchdog`) sees every process of the tree, waits for
    // them and kills them all if this process dies.
    let mode = watchdog::Mode {
        own_group: !std::io::stdin().is_terminal(),
        wait_children: !args.no_wait_children,
        verbose: args.verbose,
    };
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("fencelock")
        .args(watchdog::args(mode, &args.name, &program, &program_args))
        .env("FENCELOCK_NAME", &args.name)
        .env("FENCELOCK_KEY", lease.key())
        .env("FENCELOCK_TOKEN", lease.token())
        .env("FENCELOCK_FENCE", lease.fence().to_string())
        .env("FENCELOCK_TTL_MS", lease.ttl().as_millis().to_string())
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    // A permit's slot; a lock has none, and a slot inherited from an outer
    // `run --permits` must not make the nested writes use that slot's pair.
    match lease.slot() {
        Some(slot) => cmd.env(SLOT_ENV, slot.to_string()),
        None => cmd.env_remove(SLOT_ENV),
    };
    // The side of a read-write lock; likewise, an access inherited from an
    // outer `run --read` must not make a lock's or a permit's fence look
    // like a reader's epoch (or the reverse).
    match lease.access() {
        Some(access) => cmd.env(ACCESS_ENV, access.as_str()),
        None => cmd.env_remove(ACCESS_ENV),
    };
    if args.no_url_env {
        // Also ones inherited from our own environment.
        cmd.env_remove("FENCELOCK_URL")
            .env_remove(connect::LEGACY_URL_ENV);
    } else {
        // With its password, if it has one: nested `fencelock write` and
        // `update` need it to reach the same store. Both names: the old one
        // for commands written against it.
        cmd.env("FENCELOCK_URL", connect::url(global))
            .env(connect::LEGACY_URL_ENV, connect::url(global));
    }
    // Resource writes inside (`fencelock write`, `update`, `read
    // --register`) wait for the same replicas as the grant did.
    if let Some(replicas) = args.replicas {
        cmd.env(REPLICAS_ENV, replicas.to_string()).env(
            REPLICA_TIMEOUT_ENV,
            format!("{}ms", args.replica_timeout.as_millis()),
        );
    }
    // The TLS files (paths, no secret) go with or without the URL: a nested
    // `fencelock` given its own --url still needs them.
    cmd.envs(connect::tls_env(global));
    // SAFETY: between fork and exec, one async-signal-safe sigprocmask call.
    unsafe {
        cmd.pre_exec(watchdog::block_signals);
    }
    let watchdog = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = lease.release().await;
            return Err(exit::fail(
                exit::SOFTWARE,
                format!(
                    "cannot start the command's watchdog process (this binary, from /proc/self/exe): {e}"
                ),
            ));
        }
    };
    let code = supervise(watchdog, lease, &mut signals, args.kill_grace).await;
    if args.verbose {
        crate::diagnostics::report_lag(&client, args.ttl);
    }
    code
}

/// How long `run` waits, before it exits without the lock, for the
/// clean-ups its dropped acquisition left running (see [`flush`]).
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Waits (at most [`FLUSH_WAIT`]) for the client's background clean-ups,
/// so a process that exits without the lock leaves no waiter's key behind.
async fn flush(client: &LockClient) {
    let _ = tokio::time::timeout(FLUSH_WAIT, client.flush()).await;
}

/// The program and its arguments, from `-c STRING` or `-- CMD ARGS…`.
fn command_line(args: &RunArgs) -> anyhow::Result<(String, Vec<String>)> {
    if let Some(script) = &args.shell {
        return Ok(("sh".into(), vec!["-c".into(), script.clone()]));
    }
    match args.command.split_first() {
        Some((program, rest)) => Ok((program.clone(), rest.to_vec())),
        None => Err(exit::fail(
            exit::USAGE,
            "no command given: use `fencelock run NAME -- CMD ARGS…` or `fencelock run NAME -c 'STRING'`",
        )),
    }
}

/// Waits for the watchdog (the command tree), the loss of the lock, or a
/// signal to forward. The watchdog's exit code is the command's (or
/// 128+N); on a lost lock the tree gets SIGTERM (SIGUSR1 to the watchdog),
/// then SIGKILL after the grace (SIGUSR2).
async fn supervise(
    mut watchdog: Child,
    lease: Lease,
    signals: &mut Signals,
    grace: Duration,
) -> anyhow::Result<u8> {
    let pid = watchdog
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let tell = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    let mut lost = false;
    // When to escalate to SIGKILL; `None` before the loss, and after the
    // escalation or for a grace beyond any deadline.
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = watchdog.wait() => break status?,
            () = lease.lost(), if !lost => {
                let reason = lease
                    .loss_reason()
                    .map(|r| redact::scrub(&r.to_string()))
                    .unwrap_or_default();
                eprintln!(
                    "fencelock: lock {:?} ({}) was lost while the command ran ({reason}); stopping it",
                    lease.name(),
                    held_as(&lease)
                );
                lost = true;
                tell(Signal::SIGUSR1);
                kill_at = Instant::now().checked_add(grace);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                tell(Signal::SIGUSR2);
                kill_at = None;
            }
            sig = signals.next() => {
                if signals.should_forward(sig) {
                    tell(sig);
                }
            }
        }
    };
    if lost {
        let _ = lease.release().await;
        return Ok(LOST);
    }
    if let Some(sig) = status.signal() {
        eprintln!(
            "fencelock: the command's watchdog process was killed by signal {sig}; the command was killed with it"
        );
    }
    let name = lease.name().to_string();
    let held = held_as(&lease);
    let ttl = lease.ttl();
    match lease.release().await {
        Ok(ReleaseOutcome::Released) => {}
        Ok(ReleaseOutcome::NotOurs(reason)) => {
            let reason = redact::scrub(&reason.to_string());
            eprintln!(
                "fencelock: lock {name:?} ({held}) was no longer ours when the command ended ({reason}): it may have overlapped with another holder"
            );
            return Ok(LOST);
        }
        Ok(other) => tracing::warn!(?other, "unexpected release outcome"),
        Err(e) => {
            // The lock expires by itself after its ttl; until then it keeps
            // every other worker out, which the exit code must not hide.
            eprintln!(
                "fencelock: could not release lock {name:?} ({held}): {}; it stays held until its ttl ({} ms) runs out",
                redact::scrub(&e.to_string()),
                ttl.as_millis()
            );
            return Ok(match exit_code(status) {
                0 => exit::RELEASE_FAILED,
                code => code,
            });
        }
    }
    Ok(exit_code(status))
}

/// The side of a read-write lock `run` asks for (`--read`, `--write`), if
/// any.
fn access(args: &RunArgs) -> Option<Access> {
    match (args.read, args.write) {
        (true, _) => Some(Access::Read),
        (_, true) => Some(Access::Write),
        _ => None,
    }
}

/// The flag that asks for `access`, for messages.
fn access_flag(access: Access) -> &'static str {
    match access {
        Access::Read => "--read",
        Access::Write => "--write",
    }
}

/// What a lease holds, for messages: `fence F`, `fence F, slot S` for a
/// permit of a semaphore, `writer, fence F` or `reader, write epoch E` for
/// a side of a read-write lock.
fn held_as(lease: &Lease) -> String {
    match (lease.slot(), lease.access()) {
        (Some(slot), _) => format!("fence {}, slot {slot}", lease.fence()),
        (None, Some(Access::Write)) => format!("writer, fence {}", lease.fence()),
        (None, Some(Access::Read)) => format!("reader, write epoch {}", lease.fence()),
        (None, None) => format!("fence {}", lease.fence()),
    }
}

/// The command's exit code, or 128+N if it died of signal N.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => exit::SOFTWARE,
    }
}

/// The code of a server that takes no writes for now (`NOREPLICAS` under
/// `min-replicas-to-write`, `READONLY`, `LOADING`, `MASTERDOWN`: during a
/// failover), if that is what `e` is.
fn refused_for_now(e: &fencelock::Error) -> Option<&str> {
    match e {
        fencelock::Error::Unreachable { source, .. } => source.code(),
        _ => None,
    }
}

/// Why a waiting `run` waits, when not for a holder: the master refuses
/// writes, Redis is unreachable, too few replicas acknowledged the grant.
fn wait_reason(e: &fencelock::Error) -> String {
    match (e, refused_for_now(e)) {
        (_, Some(code)) => format!("the master refuses writes: {code}"),
        (fencelock::Error::NotReplicated { acked, wanted, .. }, _) => format!(
            "only {acked} of {wanted} replicas acknowledged the grant in time (it was given back)"
        ),
        _ => redact::scrub(&e.to_string()),
    }
}

/// Connects; a waiting `run` (a non-zero `wait`) behind Sentinel or a
/// Cluster whose store cannot be reached for now (the sentinels naming a
/// master that is gone, a failover under way) tries again until `wait` has
/// passed, saying why it waits. One server that cannot be reached at all
/// is no failover to wait out: that (a wrong port, a server that is down)
/// exits 69 at once, as it always has.
async fn connect_waiting(
    global: &GlobalOptions,
    name: &str,
    wait: Duration,
    quiet: bool,
) -> anyhow::Result<LockClient> {
    let url = connect::url(global);
    let failover_possible = [
        "redis+sentinel://",
        "rediss+sentinel://",
        "redis+cluster://",
        "rediss+cluster://",
    ]
    .iter()
    .any(|scheme| url.starts_with(scheme));
    let give_up = Instant::now()
        .checked_add(wait)
        .filter(|_| failover_possible);
    let mut said = false;
    loop {
        let error = match connect::client(global).await {
            Ok(client) => return Ok(client),
            Err(e) => e,
        };
        let retryable = error
            .downcast_ref::<fencelock::Error>()
            .is_some_and(|e| e.is_retryable() && !e.is_config());
        if !retryable || give_up.is_none_or(|t| Instant::now() >= t) {
            return Err(error);
        }
        if !quiet && !said {
            let reason = error
                .downcast_ref::<fencelock::Error>()
                .map(wait_reason)
                .unwrap_or_default();
            eprintln!("fencelock: waiting for {name}: {reason}");
            said = true;
        }
        let pause = Duration::from_millis(200);
        match give_up {
            Some(t) => tokio::time::sleep_until(t.min(Instant::now() + pause)).await,
            None => tokio::time::sleep(pause).await,
        }
    }
}

/// Acquires, printing "waiting for NAME, held by TOKEN…, N s" on stderr
/// while the wait lasts longer than a second, or, while the attempts fail
/// for another reason than a holder, "waiting for NAME: REASON, N s" (the
/// master refuses writes: NOREPLICAS, say).
async fn acquire_with_progress(
    client: &LockClient,
    name: &str,
    opts: &fencelock::LockOptions,
    quiet: bool,
) -> fencelock::Result<Lease> {
    // Why the last attempt failed, unless a holder refused it.
    let why = std::sync::Mutex::new(None::<String>);
    let heard = |e: &fencelock::Error| {
        let reason = (!e.is_contended()).then(|| wait_reason(e));
        *why.lock().unwrap_or_else(|p| p.into_inner()) = reason;
    };
    let acquire = client.acquire_reporting(name, opts, &heard);
    tokio::pin!(acquire);
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut next_report = started + Duration::from_secs(1);
    let mut reported = false;
    let result = loop {
        tokio::select! {
            result = &mut acquire => break result,
            () = tokio::time::sleep_until(next_report), if !quiet => {
                let reason = why.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let waited = started.elapsed().as_secs();
                let line = match reason {
                    // Not a holder: the lock may even be this waiter's own
                    // grant, given back for too few replicas.
                    Some(reason) => format!("fencelock: waiting for {name}: {reason}, {waited} s"),
                    None => {
                        let holder = held_by(client.inspect(name, opts.layout_value()).await);
                        format!("fencelock: waiting for {name}, held by {holder}, {waited} s")
                    }
                };
                if tty {
                    eprint!("\r\x1b[2K{line}");
                } else {
                    eprintln!("{line}");
                }
                reported = true;
                // On a terminal the line is redrawn every second; in logs, every 10 s.
                next_report += Duration::from_secs(if tty { 1 } else { 10 });
            }
        }
    };
    if reported && tty {
        eprintln!();
    }
    result
}

/// Who holds a lock, for the progress line: a holder id, for a semaphore
/// `2 of 2 permits (ID, ID)`, for a read-write lock `the writer ID` or `2
/// readers (ID, ID)`.
fn held_by(state: fencelock::Result<LockState>) -> String {
    match state {
        Ok(LockState::Held { holder, .. }) => holder,
        Ok(LockState::Semaphore {
            permits, holders, ..
        }) => {
            let ids: Vec<&str> = holders.iter().map(|h| h.holder.as_str()).collect();
            format!(
                "{} of {permits} permits ({})",
                holders.len(),
                ids.join(", ")
            )
        }
        Ok(LockState::RwLock {
            writer: Some(writer),
            ..
        }) => format!("the writer {}", writer.holder),
        Ok(LockState::RwLock { readers, .. }) if !readers.is_empty() => {
            let ids: Vec<&str> = readers.iter().map(|h| h.holder.as_str()).collect();
            format!(
                "{} reader{} ({})",
                readers.len(),
                if readers.len() == 1 { "" } else { "s" },
                ids.join(", ")
            )
        }
        Ok(_) => "nobody (being taken)".to_string(),
        Err(_) => "unknown".to_string(),
    }
}

/// The signals `run` handles.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    /// stdin is a terminal: its Ctrl-C already reached the command.
    interactive: bool,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            interactive: std::io::stdin().is_terminal(),
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }

    fn should_forward(&self, sig: Signal) -> bool {
        !(sig == Signal::SIGINT && self.interactive)
    }
}
