//! A worker process: `fencelock torture-worker`, started by the coordinator
//! (one per `--workers`), so that SIGSTOP freezes a whole holder — its
//! event loop, its renewal task and its writes.
//!
//! It reads its [`WorkerSpec`] as the first line of stdin (never on the
//! command line: the URLs may hold passwords), then runs lease cycles until
//! stdin says `stop` or closes, and writes every invocation and outcome to
//! stdout as history lines, each flushed at once:
//!
//! 1. acquire a random name (`acquire` → `granted` / `acquire_failed`): a
//!    mutex, or one permit of a semaphore (`--primitive semaphore`), whose
//!    slot the grant records and whose slot view of the resource (its own
//!    counter and (fence, holder) pair) the cycle then uses;
//! 2. register the fence at the resource (`register` → `registered`; not in
//!    the `write-only-check` control);
//! 3. read the counter (`read`), work for up to `hold`, write read + 1 with
//!    the fence (`write` → `written`);
//! 4. release (`release` → `release_done`).
//!
//! On a read-write lock (`--primitive rwlock`) each cycle takes a read
//! lease (with the spec's probability) or a write lease; a writer's cycle
//! is the one above, and a reader's is: acquire, work for up to `hold`,
//! one validated read of the counter against its write epoch
//! (`validated_read`: the value, the stored fence, clean or torn; in the
//! `unvalidated-read` control a plain read reported clean), release.
//!
//! A loss signal is recorded (`lost`) but deliberately not obeyed: the
//! worker goes on writing, as a worker paused right after checking its
//! lease would, so that every stale write reaches the resource and the
//! fence has to stop it.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{Access, Fence, FenceMode, LockClient, LockOptions, ReleaseOutcome, WaitMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use crate::clock::RunClock;
use crate::config::Variant;
use crate::conn::Tls;
use crate::controls::{self, ControlLease, ControlLock};
use crate::error::{Error, Result};
use crate::history::{Entry, Event, Outcome, Released};
use crate::resource::{Resource, ResourceSpec, Write};

/// What a worker is told to do (the first line of its stdin, JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub(crate) index: usize,
    pub(crate) origin: i64,
    pub(crate) lock_url: String,
    pub(crate) resource: ResourceSpec,
    pub(crate) prefix: String,
    pub(crate) names: Vec<String>,
    pub(crate) ttl_ms: u64,
    pub(crate) wait_ms: u64,
    pub(crate) hold_ms: u64,
    pub(crate) mode: String,
    pub(crate) fence_mode: String,
    pub(crate) variant: Option<String>,
    pub(crate) seed: u64,
    /// Replicas that must acknowledge each grant (0: no wait).
    #[serde(default)]
    pub(crate) replicas: u32,
    /// How long a grant waits for them, in ms.
    #[serde(default)]
    pub(crate) replica_timeout_ms: u64,
    /// The TLS files of every connection.
    #[serde(default)]
    pub(crate) tls: Tls,
    /// A semaphore's permit count (`None`: a mutex).
    #[serde(default)]
    pub(crate) permits: Option<u32>,
    /// A read-write lock's share of read leases in percent (`None`: not a
    /// read-write lock).
    #[serde(default)]
    pub(crate) rwlock_reads: Option<u32>,
    /// The resource's audited write script (`scripts/audited_write.lua`),
    /// sent so that a worker in another language (the Python package's
    /// `fencelock.torture_worker`) runs the very script the checkers
    /// assume rather than a copy; this binary's own worker has it built in.
    #[serde(default)]
    pub(crate) audited_write: String,
}

/// Writes history lines to stdout.
#[derive(Debug, Clone)]
struct Emitter {
    clock: RunClock,
    p: String,
    out: Arc<Mutex<std::io::Stdout>>,
}

impl Emitter {
    fn emit(&self, e: Entry) {
        let line = Event {
            t: self.clock.now(),
            p: self.p.clone(),
            e,
        }
        .to_line();
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = out.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// Until when `held` is valid, on the run's axis: read the clock
    /// first, then the time left, so a pause in between can only make the
    /// result earlier (a lower bound of the lease's deadline).
    fn valid_until(&self, held: &Held) -> i64 {
        let now = self.clock.now();
        now.saturating_add(i64::try_from(held.remaining().as_micros()).unwrap_or(i64::MAX))
    }
}

/// The lock a worker uses: fencelock, or a negative control's.
#[derive(Debug)]
enum Locker {
    Fencelock(LockClient, LockOptions),
    Control(Box<ControlLock>),
}

enum Held {
    Fencelock(fencelock::Lease),
    Control(Box<ControlLease>),
}

impl Held {
    fn fence(&self) -> Fence {
        match self {
            Held::Fencelock(l) => l.fence(),
            Held::Control(l) => l.fence(),
        }
    }

    fn token(&self) -> &str {
        match self {
            Held::Fencelock(l) => l.token(),
            Held::Control(l) => l.token(),
        }
    }

    fn holder(&self) -> String {
        match self {
            Held::Fencelock(l) => l.holder_id(),
            Held::Control(l) => l.holder_id(),
        }
    }

    fn remaining(&self) -> Duration {
        match self {
            Held::Fencelock(l) => l.remaining(),
            Held::Control(l) => l.remaining(),
        }
    }

    /// The semaphore slot held (`None`: a mutex).
    fn slot(&self) -> Option<u32> {
        match self {
            Held::Fencelock(l) => l.slot(),
            Held::Control(_) => None,
        }
    }

    /// Completes when the loss signal fires, with the reason.
    fn watch(&self) -> impl Future<Output = String> + 'static {
        enum W {
            F(fencelock::LeaseHandle),
            C(CancellationToken, Box<dyn Fn() -> String + Send>),
        }
        let w = match self {
            Held::Fencelock(l) => W::F(l.handle()),
            Held::Control(l) => {
                let token = l.loss_token();
                let reason = l.loss_reason_fn();
                W::C(token, reason)
            }
        };
        async move {
            match w {
                W::F(h) => {
                    h.lost().await;
                    h.loss_reason().map_or("lost".into(), |r| r.to_string())
                }
                W::C(token, reason) => {
                    token.cancelled().await;
                    reason()
                }
            }
        }
    }

    async fn release(self) -> Released {
        match self {
            Held::Fencelock(l) => match l.release().await {
                Ok(ReleaseOutcome::Released) => Released::Released,
                Ok(_) => Released::NotOurs,
                Err(_) => Released::Unknown,
            },
            Held::Control(l) => (*l).release().await,
        }
    }
}

impl Locker {
    /// Takes `name`: a mutex or a permit as the options say, or one side
    /// of a read-write lock (`access`).
    async fn acquire(
        &self,
        name: &str,
        access: Option<Access>,
    ) -> std::result::Result<Held, String> {
        match self {
            Locker::Fencelock(client, opts) => {
                let granted = match access {
                    Some(Access::Read) => match client.rwlock(name) {
                        Ok(lock) => lock.read(opts).await,
                        Err(e) => Err(e),
                    },
                    Some(_) => match client.rwlock(name) {
                        Ok(lock) => lock.write(opts).await,
                        Err(e) => Err(e),
                    },
                    None => client.acquire(name, opts).await,
                };
                granted.map(Held::Fencelock).map_err(|e| short(&e))
            }
            Locker::Control(lock) => lock.acquire(name).await.map(|l| Held::Control(Box::new(l))),
        }
    }
}

/// A library error in a few words.
fn short(e: &fencelock::Error) -> String {
    match e {
        fencelock::Error::Timeout { .. } => "timed out waiting".into(),
        fencelock::Error::GrantTooLate { .. } => "granted too late".into(),
        e if e.is_connection() => "unreachable".into(),
        e => e.to_string(),
    }
}

/// The worker's `main`: spec on stdin, history on stdout.
///
/// # Errors
/// When the spec cannot be read or the servers cannot be reached at start.
pub async fn main() -> Result<()> {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let first = stdin
        .next_line()
        .await?
        .ok_or_else(|| Error::usage("torture-worker is internal to `fencelock torture`"))?;
    let spec: WorkerSpec = serde_json::from_str(&first)
        .map_err(|e| Error::usage(format!("torture-worker: bad spec: {e}")))?;
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            // `stop`, or the end of stdin (the coordinator is gone).
            while let Ok(Some(line)) = stdin.next_line().await {
                if line.trim() == "stop" {
                    break;
                }
            }
            stop.cancel();
        });
    }
    run(spec, stop).await
}

async fn run(spec: WorkerSpec, stop: CancellationToken) -> Result<()> {
    let emitter = Emitter {
        clock: RunClock {
            origin: spec.origin,
        },
        p: format!("w{}", spec.index),
        out: Arc::new(Mutex::new(std::io::stdout())),
    };
    let variant = spec.variant.as_deref().and_then(Variant::parse);
    let ttl = Duration::from_millis(spec.ttl_ms);
    let wait = Duration::from_millis(spec.wait_ms);
    let fence_mode = FenceMode::parse(&spec.fence_mode).unwrap_or_default();
    let locker = match variant {
        Some(v) if v.breaks_the_lock() => Locker::Control(Box::new(
            ControlLock::connect(
                &spec.lock_url,
                v,
                &spec.prefix,
                ttl,
                wait,
                fence_mode,
                &spec.tls,
            )
            .await?,
        )),
        _ => {
            let client = spec
                .tls
                .builder(&spec.lock_url)
                .prefix(spec.prefix.clone())
                .response_timeout(Duration::from_secs(2))
                .connect()
                .await
                .map_err(|e| Error::connect(&e))?;
            let mut opts = client
                .options()
                .ttl(ttl)
                .wait(wait)
                .fence_mode(fence_mode)
                .wait_mode(WaitMode::parse(&spec.mode).unwrap_or_default());
            if let Some(permits) = spec.permits {
                opts = opts.permits(permits);
            }
            if spec.replicas > 0 {
                // A grant not yet on every replica can be lost by a
                // failover (asynchronous replication): wait for them.
                opts = opts.wait_for_replicas(
                    spec.replicas,
                    Duration::from_millis(spec.replica_timeout_ms.max(1)),
                );
            }
            Locker::Fencelock(client, opts)
        }
    };
    let resource = Resource::connect(&spec.resource).await?;
    let mut rng = StdRng::seed_from_u64(spec.seed ^ (spec.index as u64).wrapping_mul(0x9E37_79B9));
    let me = format!("w{}", spec.index);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        let op = format!("{me}.{n}");
        let name = spec.names[rng.random_range(0..spec.names.len())].clone();
        let hold = Duration::from_millis(rng.random_range(0..=spec.hold_ms));
        let access = spec.rwlock_reads.map(|reads| {
            if rng.random_range(0..100) < reads {
                Access::Read
            } else {
                Access::Write
            }
        });
        let cycle_of = Cycle {
            op: &op,
            name: &name,
            hold,
            access,
        };
        cycle(&emitter, &locker, &resource, variant, cycle_of).await;
        if n.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// What one lease cycle does: its operation id, the name, the work
/// between read and write, and the side of a read-write lock it takes.
#[derive(Debug, Clone, Copy)]
struct Cycle<'a> {
    op: &'a str,
    name: &'a str,
    hold: Duration,
    access: Option<Access>,
}

/// `read` or `write`.
fn access_name(access: Access) -> &'static str {
    match access {
        Access::Read => "read",
        _ => "write",
    }
}

/// One lease cycle: acquire, register, read, work, write, release (a
/// reader's: acquire, work, validated read, release).
async fn cycle(
    em: &Emitter,
    locker: &Locker,
    resource: &Resource,
    variant: Option<Variant>,
    c: Cycle<'_>,
) {
    let Cycle {
        op,
        name,
        hold,
        access,
    } = c;
    em.emit(Entry::Acquire {
        op: op.into(),
        name: name.into(),
    });
    let held = match locker.acquire(name, access).await {
        Ok(held) => held,
        Err(error) => {
            em.emit(Entry::AcquireFailed {
                op: op.into(),
                name: name.into(),
                error,
            });
            // Redis may be down: do not spin.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    let fence = held.fence();
    em.emit(Entry::Granted {
        op: op.into(),
        name: name.into(),
        fence: fence.get(),
        holder: held.holder(),
        valid_until: em.valid_until(&held),
        slot: held.slot(),
        access: access.map(|a| access_name(a).to_string()),
    });
    let watcher = {
        let (em, op, lost) = (em.clone(), op.to_string(), held.watch());
        tokio::spawn(async move {
            let reason = lost.await;
            em.emit(Entry::Lost { op, reason });
        })
    };
    if access == Some(Access::Read) {
        read_work(em, resource, variant, op, name, &held, hold).await;
    } else {
        work(em, resource, variant, op, name, &held, hold).await;
    }
    em.emit(Entry::Release {
        op: op.into(),
        valid_until: em.valid_until(&held),
    });
    let outcome = held.release().await;
    // A loss signal that fired before the release reply is recorded; none
    // can fire after a release.
    tokio::task::yield_now().await;
    watcher.abort();
    em.emit(Entry::ReleaseDone {
        op: op.into(),
        outcome,
    });
}

async fn work(
    em: &Emitter,
    resource: &Resource,
    variant: Option<Variant>,
    op: &str,
    name: &str,
    held: &Held,
    hold: Duration,
) {
    let (fence, token, slot) = (held.fence(), held.token(), held.slot());
    // The `one-fence` control fences every permit at one pair.
    let one_fence = slot.filter(|_| variant == Some(Variant::OneFence));
    if variant != Some(Variant::WriteOnlyCheck) {
        em.emit(Entry::Register {
            op: op.into(),
            fence: fence.get(),
            valid_until: em.valid_until(held),
        });
        let outcome = if variant == Some(Variant::GeCheck) {
            controls::ge_register(resource, name, fence, token).await
        } else if let Some(slot) = one_fence {
            controls::one_fence_register(resource, name, slot, fence, token).await
        } else {
            resource.register(name, slot, fence, token).await
        };
        em.emit(Entry::Registered {
            op: op.into(),
            outcome,
        });
        if outcome != Outcome::Accepted {
            return;
        }
    }
    let Ok(read) = resource.read(name, slot).await else {
        return;
    };
    em.emit(Entry::Read {
        op: op.into(),
        value: read,
        valid_until: em.valid_until(held),
    });
    tokio::time::sleep(hold).await;
    let w = Write {
        name,
        fence,
        token,
        op,
        worker: &em.p,
        read,
        value: read + 1,
        slot,
    };
    em.emit(Entry::Write {
        op: op.into(),
        fence: fence.get(),
        read,
        value: read + 1,
        valid_until: em.valid_until(held),
    });
    let outcome = if variant == Some(Variant::GeCheck) {
        controls::ge_write(resource, w).await
    } else if let Some(slot) = one_fence {
        controls::one_fence_write(resource, slot, w).await
    } else {
        resource.write(w).await
    };
    em.emit(Entry::Written {
        op: op.into(),
        outcome,
    });
}

/// A reader's work: up to `hold`, then one validated read of the counter
/// against its write epoch (the lease's fence). The `unvalidated-read`
/// control reads the counter alone and reports it clean.
async fn read_work(
    em: &Emitter,
    resource: &Resource,
    variant: Option<Variant>,
    op: &str,
    name: &str,
    held: &Held,
    hold: Duration,
) {
    tokio::time::sleep(hold).await;
    let epoch = held.fence();
    let valid_until = em.valid_until(held);
    let sent = em.clock.now();
    let read = if variant == Some(Variant::UnvalidatedRead) {
        resource
            .read(name, None)
            .await
            .map(|value| (value, None, true))
    } else {
        resource.read_validated(name, epoch).await
    };
    let Ok((value, fence, clean)) = read else {
        return;
    };
    em.emit(Entry::ValidatedRead {
        op: op.into(),
        epoch: epoch.get(),
        sent,
        value,
        fence,
        clean,
        valid_until,
    });
}
