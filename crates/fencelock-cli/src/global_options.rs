//! The options every subcommand takes: which store and how to reach it
//! (`--url`, the TLS files) and how its locks are named and fenced
//! (`--prefix`, `--layout`, `--fence-mode`, `--fence-epoch`). They are
//! clap's `global` options, so they may stand before or after the
//! subcommand's name; [`crate::connect`] turns them into a client and lock
//! options.

use clap::{Args, ValueEnum};

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct GlobalOptions {
    /// The store's URL. Redis: `redis://[user:password@]host:port[/db]` (a
    /// Cluster node given this way is detected), `rediss://` for TLS,
    /// `unix:///path/to/socket[?db=N&pass=PASSWORD]`,
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER[?db=N]`,
    /// `redis+cluster://[user:password@]host:port[,host:port…]`
    /// (`rediss+sentinel://`, `rediss+cluster://` for TLS). etcd:
    /// `etcd://[user:password@]host:port[,host:port…][?prefix=NAMESPACE/]`,
    /// `etcds://` for TLS (a NAMESPACE must end with `/`: it is joined to
    /// --prefix without a separator). Default: `redis://127.0.0.1:6379` (`demo` and
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

    /// Key prefix of the locks (on etcd without `/`: see --url).
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
