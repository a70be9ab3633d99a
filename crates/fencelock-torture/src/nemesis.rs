//! The faults a run injects: [`NemesisKind`].
//!
//! A module of its own, below both `config` (a [`crate::Config`] names the
//! nemeses to inject) and `topology` (which says what a topology cannot
//! inject), so that neither of them imports the other for it.

/// A fault the run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum NemesisKind {
    /// SIGSTOP the lock server for 1.2–2.5 ttl, then SIGCONT (on etcd: one
    /// member, the leader or a follower in turn).
    PauseServer,
    /// kill -9 the lock server and restart it with its data (AOF,
    /// `appendfsync always`; on etcd: one member, restarted with its data
    /// directory).
    KillRestart,
    /// kill -9 the lock server and restart it empty: a Redis without
    /// persistence. Mutual exclusion is not promised across it (docs/design.md
    /// §9); fences stay monotonic in clock mode. On a replicated topology
    /// (Sentinel, Cluster) it is a crash of the primary instead: the
    /// primary stays down until a replica has taken over (a failover,
    /// which loses no grant waited for by every replica), then comes back
    /// empty as a replica of the new primary.
    KillWipe,
    /// `DEBUG SLEEP` for 0.5–2 ttl.
    DebugSleep,
    /// `CLIENT PAUSE` (WRITE or ALL) for 1–2 ttl.
    ClientPause,
    /// `SCRIPT FLUSH`.
    ScriptFlush,
    /// `CLIENT KILL` of one worker's (or every worker's) connections: their
    /// addresses at the proxy when it runs, else the worker processes' own
    /// sockets (from `/proc`) connected to the aimed node.
    ClientKill,
    /// SIGSTOP a worker for 1.2–3 ttl: preferably one between its read and
    /// its write, else one holding a lease.
    PauseWorker,
    /// The proxy delays one worker's replies by 1.2–2 ttl for 3–6 ttl.
    ProxyDelay,
    /// The proxy stalls one worker's traffic both ways for 1–3 ttl (bytes
    /// are kept, as TCP would retransmit them).
    ProxyBlackhole,
    /// The proxy drops the next reply to one worker (after Redis executed
    /// the command) and resets that connection.
    ProxySwallow,
    /// The proxy resets every connection of one worker.
    ProxyReset,
    /// Makes a replica the primary of the lock's shard: `SENTINEL FAILOVER`
    /// (Sentinel; the old primary is then turned into a replica of the new
    /// one at once, which Sentinel itself would do about 10 s later), or
    /// `CLUSTER FAILOVER` on a replica of the master of the lock key's slot
    /// (Cluster: coordinated, the old master becomes a replica). Done once
    /// the new primary takes writes and its replicas are linked. Only on a
    /// topology with replicas. On etcd: a leader change (`MoveLeader` to
    /// another member), done once the new leader leads.
    Failover,
    /// `LockClient::revoke` of a held name (else of any name), sealing the
    /// name's audited resource at the revocation fence before it returns.
    /// The holder is SIGSTOPped across the revoke and resumed right after
    /// it (its write then comes after the revoke), the other workers stay
    /// paused until it has written (or for its longest cycle), so that
    /// nothing but the seal stands between the deposed holder's late write
    /// and the resource.
    Revoke,
}

impl NemesisKind {
    /// Every nemesis, in the order they are documented.
    pub const ALL: [NemesisKind; 14] = [
        NemesisKind::PauseServer,
        NemesisKind::KillRestart,
        NemesisKind::KillWipe,
        NemesisKind::DebugSleep,
        NemesisKind::ClientPause,
        NemesisKind::ScriptFlush,
        NemesisKind::ClientKill,
        NemesisKind::PauseWorker,
        NemesisKind::ProxyDelay,
        NemesisKind::ProxyBlackhole,
        NemesisKind::ProxySwallow,
        NemesisKind::ProxyReset,
        NemesisKind::Failover,
        NemesisKind::Revoke,
    ];

    /// The name on the command line and in the history.
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::PauseServer => "pause-server",
            NemesisKind::KillRestart => "kill-restart",
            NemesisKind::KillWipe => "kill-wipe",
            NemesisKind::DebugSleep => "debug-sleep",
            NemesisKind::ClientPause => "client-pause",
            NemesisKind::ScriptFlush => "script-flush",
            NemesisKind::ClientKill => "client-kill",
            NemesisKind::PauseWorker => "pause-worker",
            NemesisKind::ProxyDelay => "proxy-delay",
            NemesisKind::ProxyBlackhole => "proxy-blackhole",
            NemesisKind::ProxySwallow => "proxy-swallow",
            NemesisKind::ProxyReset => "proxy-reset",
            NemesisKind::Failover => "failover",
            NemesisKind::Revoke => "revoke",
        }
    }

    /// Parses a name of [`NemesisKind::name`].
    pub fn parse(s: &str) -> Option<Self> {
        NemesisKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether it needs control of the server (its process or its
    /// administrative commands): refused against a deployment given with
    /// `--redis`.
    pub fn needs_server_control(self) -> bool {
        matches!(
            self,
            NemesisKind::PauseServer
                | NemesisKind::KillRestart
                | NemesisKind::KillWipe
                | NemesisKind::DebugSleep
                | NemesisKind::ClientPause
                | NemesisKind::ScriptFlush
                | NemesisKind::Failover
        )
    }

    /// Whether it needs the fault-injecting proxy between the workers and
    /// Redis.
    pub fn needs_proxy(self) -> bool {
        matches!(
            self,
            NemesisKind::ProxyDelay
                | NemesisKind::ProxyBlackhole
                | NemesisKind::ProxySwallow
                | NemesisKind::ProxyReset
        )
    }
}
