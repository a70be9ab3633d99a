//! Command-line syntax.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Distributed locks with fencing tokens on Redis.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    about = "Distributed locks with fencing tokens on Redis",
    after_help = "Examples:\n  fencelock demo                       # the guide's scenario on a private redis-server\n  fencelock --redis redis://10.0.0.5:6379 demo --fence-mode clock\n\nExit codes: 0 ok, 1 check failed, 64 usage, 69 Redis unreachable, 70 internal error, 78 bad configuration."
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
    /// Redis URL (redis://[user:password@]host:port[/db], rediss:// for TLS).
    /// `demo` starts a private redis-server when this is not given.
    #[arg(long, global = true, env = "FENCELOCK_REDIS_URL")]
    pub(crate) redis: Option<String>,

    /// Key prefix of the locks.
    #[arg(long, global = true, default_value = fencelock::DEFAULT_PREFIX)]
    pub(crate) prefix: String,

    /// Key layout: `default` (lock:{NAME}, Cluster-safe) or `guide` (lock:NAME,
    /// shared with workers written from the guide).
    #[arg(long, global = true, value_enum, default_value_t = Layout::Default)]
    pub(crate) layout: Layout,

    /// Fence mode: `clock` (never goes backwards, even if Redis loses data)
    /// or `counter` (1, 2, 3 … like the guide; needs a durable Redis).
    #[arg(long, global = true, value_enum)]
    pub(crate) fence_mode: Option<FenceModeArg>,
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
    /// Reproduce the guide's scenario on a real Redis and print the timeline:
    /// worker A stalls past its 300 ms lease, B takes over and writes, A's
    /// stale write is refused and its release leaves B's lock alone.
    #[command(
        after_help = "Examples:\n  fencelock demo\n  fencelock demo --fence-mode clock\n  fencelock --redis redis://127.0.0.1:7000 demo"
    )]
    Demo(DemoArgs),
}

/// Options of `demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Lease ttl of both workers.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub(crate) ttl: std::time::Duration,

    /// How long worker A stalls (must exceed the ttl to show the takeover).
    #[arg(long, default_value = "400ms", value_parser = parse_duration)]
    pub(crate) pause: std::time::Duration,
}

/// Parses `300ms`, `10s`, `2m`, `1h30m`.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 300ms, 10s, 2m)"))
}
