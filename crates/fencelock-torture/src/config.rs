//! What a run does: [`Config`] and the negative controls ([`Variant`]);
//! the nemeses it injects are [`NemesisKind`]s.

use std::path::PathBuf;
use std::time::Duration;

use fencelock::{FenceMode, KeyLayout, WaitMode};

use crate::conn::Tls;
use crate::nemesis::NemesisKind;
use crate::topology::Shape;

/// A negative control: a deliberately broken lock or resource that the
/// checkers must catch. Never the default; reachable only through
/// `Config::variant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Variant {
    /// The guide's two-command acquire: `SET NX PX`, then `INCR` of the
    /// fence key (guide layout, no check of the validity left).
    TwoCommandAcquire,
    /// The guide's resource check `fence >= stored`, without the holder
    /// (run in counter mode, where a restart without persistence re-issues
    /// fences).
    GeCheck,
    /// Read-modify-write with the fence checked on the write only (no
    /// registration before the read).
    WriteOnlyCheck,
    /// Release with a plain `DEL`, without the owner check.
    UncheckedRelease,
    /// Renewal that re-creates an absent key (`SET PX` when the lock is
    /// gone, as redlock-rb #36), sent by a renewal task that the release
    /// does not stop first (Redisson #7272).
    RecreatingRenewal,
    /// The `revoke` nemesis deposes the holder without sealing the
    /// resource (`LockClient::revoke` with no resource): the deposed
    /// holder's write after the revoke is accepted while no later holder
    /// has registered a greater fence.
    RevokeWithoutSeal,
    /// A semaphore's workers register and write through ONE (fence,
    /// holder) pair for all permits (the unslotted hash fields, a mutex's
    /// resource) instead of their slot's pair; each slot's value stays its
    /// own. Live permits' fences interleave, so a live permit whose fence is
    /// below another slot's latest is refused (`--primitive semaphore`
    /// only).
    OneFence,
    /// A read-write lock's readers report every read clean without
    /// validating it: a plain read of the counter, no look at the stored
    /// fence, so a reader that outlived its lease (a writer came in and
    /// wrote) takes the later writer's value for the state as of its epoch
    /// (`--primitive rwlock` only).
    UnvalidatedRead,
}

impl Variant {
    /// Every control, in the order they are documented.
    pub const ALL: [Variant; 6] = [
        Variant::TwoCommandAcquire,
        Variant::GeCheck,
        Variant::WriteOnlyCheck,
        Variant::UncheckedRelease,
        Variant::RecreatingRenewal,
        Variant::RevokeWithoutSeal,
    ];

    /// Every control of a semaphore run (`--primitive semaphore`), in the
    /// order they are documented.
    pub const SEMAPHORE: [Variant; 1] = [Variant::OneFence];

    /// Every control of a read-write lock run (`--primitive rwlock`), in
    /// the order they are documented.
    pub const RWLOCK: [Variant; 1] = [Variant::UnvalidatedRead];

    /// The name on the command line and in the history.
    pub fn name(self) -> &'static str {
        match self {
            Variant::OneFence => "one-fence",
            Variant::UnvalidatedRead => "unvalidated-read",
            Variant::TwoCommandAcquire => "two-command-acquire",
            Variant::GeCheck => "ge-check",
            Variant::WriteOnlyCheck => "write-only-check",
            Variant::UncheckedRelease => "unchecked-release",
            Variant::RecreatingRenewal => "recreating-renewal",
            Variant::RevokeWithoutSeal => "revoke-without-seal",
        }
    }

    /// Parses a name of [`Variant::name`].
    pub fn parse(s: &str) -> Option<Self> {
        Variant::ALL
            .into_iter()
            .chain(Variant::SEMAPHORE)
            .chain(Variant::RWLOCK)
            .find(|v| v.name() == s)
    }

    /// Whether this is a control of a semaphore run ([`Variant::SEMAPHORE`])
    /// rather than of a mutex run ([`Variant::ALL`]).
    pub fn of_semaphore(self) -> bool {
        Variant::SEMAPHORE.contains(&self)
    }

    /// Whether this is a control of a read-write lock run
    /// ([`Variant::RWLOCK`]).
    pub fn of_rwlock(self) -> bool {
        Variant::RWLOCK.contains(&self)
    }

    /// The nemeses that expose this control, used when none are given: a
    /// default-length run then meets the conditions it breaks under often
    /// enough to be caught.
    pub fn nemeses(self) -> &'static [NemesisKind] {
        match self {
            // A holder whose SET reply is late mints its fence after the
            // next holder's.
            Variant::TwoCommandAcquire => &[NemesisKind::ProxyDelay],
            Variant::GeCheck => &[NemesisKind::KillWipe],
            Variant::WriteOnlyCheck | Variant::UncheckedRelease => &[NemesisKind::PauseWorker],
            Variant::RecreatingRenewal => &[NemesisKind::PauseWorker, NemesisKind::ProxyDelay],
            // The revoke nemesis pauses the holder across the revoke and the
            // other workers until the deposed holder has written (a
            // pause-worker timed to the revoke): its write then comes after
            // the revoke with no later holder's fence at the resource, so
            // every revoke of a holder between its read and its write
            // exposes the missing seal. A plain pause-worker in between
            // would only take turns away from it.
            Variant::RevokeWithoutSeal => &[NemesisKind::Revoke],
            // Live permits overlap all the time: no fault is needed; a
            // paused holder only adds stale writes to be refused.
            Variant::OneFence => &[NemesisKind::PauseWorker],
            // A reader paused before its read past its lease: a writer
            // comes in and writes, and the reader then reads that write.
            Variant::UnvalidatedRead => &[NemesisKind::PauseWorker],
        }
    }

    /// How many nemeses the control's own schedule injects (`None`: as many
    /// as fit). `ge-check` needs exactly one restart without persistence:
    /// after it the counter re-issues every fence already written, and
    /// another restart before it gets there would start it over.
    pub fn nemesis_limit(self) -> Option<usize> {
        match self {
            Variant::GeCheck => Some(1),
            _ => None,
        }
    }

    /// The least work between read and write the control runs with.
    /// `write-only-check` works up to two ttls (a slow read-modify-write),
    /// so that a holder paused past its lease resumes while the next holder
    /// is between its read and its write.
    pub fn min_hold(self, ttl: Duration) -> Duration {
        match self {
            Variant::WriteOnlyCheck => ttl * 2,
            _ => Duration::ZERO,
        }
    }

    /// The fence mode the control runs in (`None`: as configured).
    pub fn fence_mode(self) -> Option<FenceMode> {
        match self {
            // Equal fences from two holders only exist where fences repeat.
            Variant::GeCheck => Some(FenceMode::Counter),
            Variant::TwoCommandAcquire => Some(FenceMode::Counter),
            _ => None,
        }
    }

    /// The key layout the control's lock uses.
    pub fn layout(self) -> KeyLayout {
        match self {
            // The guide's keys: lock value = bare token, INCR fence key.
            Variant::TwoCommandAcquire => KeyLayout::Guide,
            _ => KeyLayout::HashTagged,
        }
    }

    /// Why this control cannot run at all on a topology of `shape`, whatever
    /// the nemeses: the broken locks are Redis scripts, and on etcd the lock
    /// is always fencelock's.
    pub fn unsupported(self, shape: &Shape<'_>) -> Option<&'static str> {
        if shape.etcd && self.breaks_the_lock() {
            return Some(match self {
                Variant::TwoCommandAcquire => {
                    "two-command-acquire is the guide's Redis acquire (SET NX, then INCR); on etcd the lock is fencelock's etcd lock, which has no such variant"
                }
                Variant::UncheckedRelease => {
                    "unchecked-release is a release by Redis DEL; on etcd the lock is fencelock's etcd lock, which has no such variant"
                }
                _ => {
                    "recreating-renewal is a Redis renewal script (SET PX of an absent key); on etcd the lock is fencelock's etcd lock, which has no such variant"
                }
            });
        }
        None
    }

    /// Why this control cannot be caught on a topology of `shape`; `None`
    /// if it can. Besides [`Variant::unsupported`], only decides when the
    /// control runs with its own nemeses ([`Variant::nemeses`]).
    pub fn refusal(self, shape: &Shape<'_>) -> Option<&'static str> {
        if let Some(why) = self.unsupported(shape) {
            return Some(why);
        }
        match self {
            Variant::TwoCommandAcquire if !shape.proxyable => Some(
                "two-command-acquire is exposed by proxy-delay (a holder's SET reply held back past its lease), and the fault proxy cannot stand between the workers and this topology",
            ),
            Variant::GeCheck if shape.etcd => Some(
                "ge-check is exposed by fences that repeat (counter fences after a restart that lost the counter); etcd fences are create revisions, which never repeat",
            ),
            Variant::GeCheck if shape.replicas > 0 => Some(
                "ge-check is exposed by a restart that loses the lock server's counter; on a replicated topology kill-wipe promotes a replica that holds every acknowledged grant, so fences never repeat",
            ),
            _ => None,
        }
    }

    /// Whether the revoke nemesis seals the resource (every run but the
    /// `revoke-without-seal` control).
    pub fn seals(variant: Option<Variant>) -> bool {
        variant != Some(Variant::RevokeWithoutSeal)
    }

    /// Whether the lock itself is broken (the worker uses the control's own
    /// lock instead of fencelock's).
    pub fn breaks_the_lock(self) -> bool {
        matches!(
            self,
            Variant::TwoCommandAcquire | Variant::UncheckedRelease | Variant::RecreatingRenewal
        )
    }
}

/// The protected resource the workers update.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResourceKind {
    /// A Redis hash per name (`fence`, `holder`, `value`) and an audit list,
    /// written by one script.
    Redis,
    /// A Postgres table (one row per name, fenced by fencelock's
    /// `FencedTable`) and an audit table, written in one transaction.
    Postgres {
        /// The database URL (password included; never shown).
        url: String,
    },
}

impl ResourceKind {
    /// `redis` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            ResourceKind::Redis => "redis",
            ResourceKind::Postgres { .. } => "postgres",
        }
    }
}

/// Everything a run needs besides its topology.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long the workload and the nemeses run.
    pub duration: Duration,
    /// Worker processes.
    pub workers: usize,
    /// Lock names (each with its own resource).
    pub names: usize,
    /// Lease ttl.
    pub ttl: Duration,
    /// How long a worker works between its read and its write, at most
    /// (uniform from zero).
    pub hold: Duration,
    /// Wait mode of the workers' acquisitions.
    pub mode: WaitMode,
    /// Fence mode.
    pub fence_mode: FenceMode,
    /// The resource.
    pub resource: ResourceKind,
    /// The nemeses to inject (`None`: every one the topology supports, or
    /// the control's own).
    pub nemeses: Option<Vec<NemesisKind>>,
    /// Mean time between two nemeses (each gap is uniform in ½–1½ of it).
    pub nemesis_interval: Duration,
    /// The seed of the nemesis schedule and the workers' choices.
    pub seed: u64,
    /// The negative control to run instead of fencelock, if any.
    pub variant: Option<Variant>,
    /// Stop as soon as the checkers find a violation (checked every 2 s).
    pub stop_on_violation: bool,
    /// The key prefix: every key the run writes starts with it.
    pub prefix: String,
    /// How many replicas must acknowledge each grant
    /// (`LockOptions::wait_for_replicas`; `None`: every replica of the
    /// shard, as the topology reports it; `Some(0)`: no wait). Fewer than
    /// all of them leaves mutual exclusion across a failover unpromised,
    /// and the report says so.
    pub replicas: Option<u32>,
    /// Where to write the history as it is recorded.
    pub history: Option<PathBuf>,
    /// The TLS files of every connection to the lock store and the Redis
    /// resource (workers, observer, resource, clean-up).
    pub tls: Tls,
    /// `None`: the workers take a mutex (`--primitive mutex`, the
    /// default). `Some(N)`: they take one of N permits of a fenced
    /// semaphore (`--primitive semaphore --permits N`,
    /// `LockOptions::permits`), each writing its slot's partition of the
    /// resource through the slot's own (fence, holder) pair
    /// (`FencedHash::slot`); the checkers then judge C1–C7 per slot, at
    /// most N valid holders per name (C8) and no valid permit refused (C9).
    pub permits: Option<u32>,
    /// `None`: not a read-write lock. `Some(P)`: the workers take one side
    /// of a fenced read-write lock per cycle (`--primitive rwlock`,
    /// `LockClient::rwlock`), a read lease with probability P % (`--reads
    /// P`), else a write lease. Writers do the mutex's audited
    /// read-modify-write; readers work up to `hold`, then make one
    /// validated read of the resource against their write epoch
    /// (`FencedHash::read_validated`). The checkers then judge C1–C3 on the
    /// writers' writes, C4 and C6 among the writers, C5 and C7 per holder,
    /// no writer with a valid reader (C10), validated reads (C11) and the
    /// readers' epochs (C12).
    pub rwlock_reads: Option<u32>,
}

impl Config {
    /// The defaults of `fencelock torture`: 30 s, 8 workers, one name, ttl
    /// 300 ms, hold up to 50 ms, notify, clock fences, the Redis resource,
    /// every nemesis, one every second, seed 1.
    pub fn new() -> Self {
        Config {
            duration: Duration::from_secs(30),
            workers: 8,
            names: 1,
            ttl: Duration::from_millis(300),
            hold: Duration::from_millis(50),
            mode: WaitMode::Notify,
            fence_mode: FenceMode::Clock,
            resource: ResourceKind::Redis,
            nemeses: None,
            nemesis_interval: Duration::from_secs(1),
            seed: 1,
            variant: None,
            stop_on_violation: false,
            prefix: "torture:".to_string(),
            replicas: None,
            history: None,
            tls: Tls::new(),
            permits: None,
            rwlock_reads: None,
        }
    }

    /// The longest work between read and write in effect (a control may
    /// need more).
    pub fn effective_hold(&self) -> Duration {
        self.variant
            .map_or(self.hold, |v| self.hold.max(v.min_hold(self.ttl)))
    }

    /// The renewal interval of the workers' leases (a third of the ttl).
    pub fn renewal(&self) -> Duration {
        self.ttl / 3
    }

    /// How long a grant waits for its replicas' acknowledgements (a quarter
    /// of the ttl: a failover that took a replica away fails the grant
    /// quickly, and it is retried).
    pub fn replica_timeout(&self) -> Duration {
        self.ttl / 4
    }

    /// The fence mode in effect (a control may impose its own).
    pub fn effective_fence_mode(&self) -> FenceMode {
        self.variant
            .and_then(Variant::fence_mode)
            .unwrap_or(self.fence_mode)
    }

    /// The key layout in effect.
    pub fn layout(&self) -> KeyLayout {
        self.variant.map_or(KeyLayout::HashTagged, Variant::layout)
    }

    /// `mutex`, `semaphore` with [`Config::permits`], or `rwlock` with
    /// [`Config::rwlock_reads`].
    pub fn primitive(&self) -> &'static str {
        if self.permits.is_some() {
            "semaphore"
        } else if self.rwlock_reads.is_some() {
            "rwlock"
        } else {
            "mutex"
        }
    }

    /// Why this configuration's primitive cannot run with `nemeses`
    /// (`None`: the default ones), or `None` if it can: a semaphore runs on
    /// every topology with the Redis resource (the slot view is a Redis
    /// hash's; with locks on etcd it lives on the tool's private
    /// redis-server), without the `revoke` nemesis (a revoke deposes a
    /// mutex's holder), with the semaphore's controls only; a mutex runs
    /// without them. The CLI asks before any server starts, [`crate::run`]
    /// again on the running topology.
    pub fn primitive_refusal(&self, nemeses: Option<&[NemesisKind]>) -> Option<String> {
        if let Some(reads) = self.rwlock_reads {
            return self.rwlock_refusal(reads);
        }
        let Some(permits) = self.permits else {
            return self.variant.and_then(|v| {
                if v.of_semaphore() {
                    Some(format!(
                        "--unsafe {}: a control of the semaphore (one fence pair for all its permits); run it with --primitive semaphore --permits N",
                        v.name()
                    ))
                } else if v.of_rwlock() {
                    Some(format!(
                        "--unsafe {}: a control of the read-write lock (readers that do not validate); run it with --primitive rwlock",
                        v.name()
                    ))
                } else {
                    None
                }
            });
        };
        if permits == 0 || permits > fencelock::MAX_PERMITS {
            return Some(format!(
                "--permits {permits}: a semaphore has between 1 and {}",
                fencelock::MAX_PERMITS
            ));
        }
        if self.resource != ResourceKind::Redis {
            return Some(format!(
                "--primitive semaphore with --resource {}: each permit writes its slot's partition through the slot view of a Redis hash (FencedHash::slot); use --resource redis",
                self.resource.name()
            ));
        }
        if nemeses.is_some_and(|k| k.contains(&NemesisKind::Revoke)) {
            return Some(
                "--primitive semaphore with --nemesis revoke: a revoke deposes a mutex's holder; a semaphore's permits are not revoked (choose other nemeses)"
                    .into(),
            );
        }
        if let Some(v) = self.variant.filter(|v| !v.of_semaphore()) {
            let semaphore: Vec<&str> = Variant::SEMAPHORE.iter().map(|v| v.name()).collect();
            if v.of_rwlock() {
                return Some(format!(
                    "--unsafe {} is a control of the read-write lock; with --primitive semaphore: {}",
                    v.name(),
                    semaphore.join(", ")
                ));
            }
            return Some(format!(
                "--unsafe {} is a control of the mutex; with --primitive semaphore: {}",
                v.name(),
                semaphore.join(", ")
            ));
        }
        None
    }

    /// Why a read-write lock run with `reads` % read leases cannot run:
    /// not with permits, more than 100 %, or a control of another
    /// primitive. Every topology, both resources and every nemesis run (a
    /// revoke deposes the writer or every reader).
    fn rwlock_refusal(&self, reads: u32) -> Option<String> {
        if self.permits.is_some() {
            return Some(
                "--permits is for --primitive semaphore: a lock is a semaphore or a read-write lock, not both"
                    .into(),
            );
        }
        if reads > 100 {
            return Some(format!(
                "--reads {reads}: the share of read leases is a percentage, 0 to 100"
            ));
        }
        if let Some(v) = self.variant.filter(|v| !v.of_rwlock()) {
            let rwlock: Vec<&str> = Variant::RWLOCK.iter().map(|v| v.name()).collect();
            return Some(format!(
                "--unsafe {} is a control of the {}; with --primitive rwlock: {}",
                v.name(),
                if v.of_semaphore() {
                    "semaphore"
                } else {
                    "mutex"
                },
                rwlock.join(", ")
            ));
        }
        None
    }

    /// The lock names: `t0`, `t1`, …
    pub fn lock_names(&self) -> Vec<String> {
        (0..self.names).map(|i| format!("t{i}")).collect()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

/// `poll`, `notify` or `fair`.
pub(crate) fn mode_name(mode: WaitMode) -> &'static str {
    match mode {
        WaitMode::Poll => "poll",
        WaitMode::Fair => "fair",
        _ => "notify",
    }
}

/// `clock` or `counter`.
pub(crate) fn fence_mode_name(mode: FenceMode) -> &'static str {
    match mode {
        FenceMode::Counter => "counter",
        _ => "clock",
    }
}

/// `default` or `guide`.
pub(crate) fn layout_name(layout: KeyLayout) -> &'static str {
    match layout {
        KeyLayout::Guide => "guide",
        _ => "default",
    }
}
