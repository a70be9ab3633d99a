//! The negative controls: deliberately broken variants that the checkers
//! must catch (`--unsafe VARIANT`, [`crate::Variant`]). Nothing here is
//! reachable from the safe path: a worker builds a [`ControlLock`] or calls
//! [`ge_register`] / [`ge_write`] only when its spec names a variant.
//!
//! The controls' lock is a small guide-style lock with fencelock's grant
//! (through `fencelock::testing::grant_invocation`, poll mode), correct
//! compare-and-delete and compare-and-pexpire scripts, a renewal task every
//! third of the ttl and a local deadline from the send time — except for the
//! one part each lock-level variant breaks:
//!
//! | variant | broken part |
//! |---|---|
//! | `two-command-acquire` | `SET lock token NX PX ttl`, then `INCR` of the fence key (guide layout); one grant in four pauses between the two, past the ttl |
//! | `unchecked-release` | release is a plain `DEL` (`unchecked_release.lua`) |
//! | `recreating-renewal` | renewal re-creates an absent key (`recreating_extend.lua`), and the release does not stop the renewal task first |
//! | `ge-check` | the resource accepts `fence >= stored` without the holder (`ge_write.lua`, or the same in SQL) |
//! | `write-only-check` | no registration before the read (the worker skips it) |
//! | `revoke-without-seal` | the `revoke` nemesis revokes with no resource to seal (the coordinator, in `run`; nothing here) |
//! | `one-fence` | a semaphore's permits register and write under ONE (fence, holder) pair for all slots, each writing its own slot's value (`one_fence.lua`) |

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use fencelock::{Fence, FenceMode, LockKeys, LockOptions, WaitMode, holder_id};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Variant;
use crate::conn::Tls;
use crate::history::{Outcome, Released};
use crate::resource::{Resource, ResourceSpec, Write};
use fencelock::testing::RawConnection;

static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("release.lua")));
static UNCHECKED_RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("unchecked_release.lua")));
static EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("extend.lua")));
static RECREATING_EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("recreating_extend.lua")));
static GE_WRITE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("ge_write.lua")));
static ONE_FENCE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("one_fence.lua")));

/// The same drift margin as fencelock's: 1 % of the ttl plus 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A guide-style lock with one part broken.
#[derive(Debug)]
pub(crate) struct ControlLock {
    /// Keeps the client whose connection `conn` is.
    _client: fencelock::LockClient,
    conn: RawConnection,
    variant: Variant,
    prefix: String,
    opts: LockOptions,
}

/// A lease of the controls' lock.
#[derive(Debug)]
pub(crate) struct ControlLease {
    conn: RawConnection,
    variant: Variant,
    keys: LockKeys,
    value: String,
    token: String,
    fence: Fence,
    state: Arc<LeaseState>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct LeaseState {
    deadline: Mutex<Instant>,
    lost: CancellationToken,
    reason: Mutex<Option<&'static str>>,
    renewing: tokio::sync::Mutex<()>,
    ttl: Duration,
}

impl LeaseState {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, to: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        if to > *d {
            *d = to;
        }
    }

    fn lose(&self, reason: &'static str) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            *r = Some(reason);
            self.lost.cancel();
        }
    }
}

impl ControlLock {
    pub(crate) async fn connect(
        url: &str,
        variant: Variant,
        prefix: &str,
        ttl: Duration,
        wait: Duration,
        fence_mode: FenceMode,
        tls: &Tls,
    ) -> crate::Result<Self> {
        let (client, conn) = crate::conn::raw(url, tls).await?;
        Ok(ControlLock {
            _client: client,
            conn,
            variant,
            prefix: prefix.to_string(),
            opts: LockOptions::default()
                .ttl(ttl)
                .wait(wait)
                .layout(variant.layout())
                .fence_mode(fence_mode)
                .wait_mode(WaitMode::Poll),
        })
    }

    /// Polls for the lock until the wait deadline.
    pub(crate) async fn acquire(&self, name: &str) -> Result<ControlLease, String> {
        let keys = LockKeys::new(&self.prefix, self.opts.layout_value(), name)
            .map_err(|e| e.to_string())?;
        let give_up = Instant::now() + self.opts.wait_value();
        let mut backoff = Duration::from_millis(2);
        loop {
            let token = uuid::Uuid::new_v4().to_string();
            let sent = Instant::now();
            let granted = match self.variant {
                Variant::TwoCommandAcquire => self.two_commands(&keys, &token).await,
                _ => self.grant(&keys, &token).await,
            };
            match granted {
                Ok(Some((fence, value))) => {
                    let ttl = self.opts.ttl_value();
                    return Ok(self.start(keys, token, value, fence, sent + ttl - drift(ttl)));
                }
                Ok(None) => {}
                Err(e) if Instant::now() >= give_up => return Err(e),
                Err(_) => {}
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "timed out after {:?} waiting for lock {name:?}",
                    self.opts.wait_value()
                ));
            }
            let jitter = rand::rng().random_range(0..=backoff.as_micros() as u64);
            tokio::time::sleep(Duration::from_micros(jitter).max(Duration::from_millis(1))).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// fencelock's grant script (poll mode): the one atomic grant.
    async fn grant(&self, keys: &LockKeys, token: &str) -> Result<Option<(Fence, String)>, String> {
        let reply: redis::Value = fencelock::testing::grant_invocation(keys, token, &self.opts)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(fencelock::testing::granted_fence(reply)?.map(|fence| {
            (
                fence,
                fencelock::testing::lock_value(token, fence, self.opts.layout_value()),
            )
        }))
    }

    /// NEGATIVE CONTROL `two-command-acquire`: the guide's `SET NX PX`, then
    /// a separate `INCR`. A holder delayed between the two mints a fence
    /// higher than a later legitimate holder's; one grant in four is delayed
    /// there past the ttl.
    async fn two_commands(
        &self,
        keys: &LockKeys,
        token: &str,
    ) -> Result<Option<(Fence, String)>, String> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(keys.lock())
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(self.opts.ttl_value().as_millis() as u64)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if set.is_none() {
            return Ok(None);
        }
        // The flaw needs a pause between the two commands that outlasts the
        // lease (a GC pause, a descheduled thread); waiting for a nemesis to
        // land in that window of a few microseconds took minutes on a quiet
        // machine, so one grant in four pauses there itself, past the ttl.
        if rand::rng().random_ratio(1, 4) {
            tokio::time::sleep(self.opts.ttl_value().saturating_mul(3) / 2).await;
        }
        let fence: u64 = redis::cmd("INCR")
            .arg(keys.fence())
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Some((Fence::new(fence), token.to_string())))
    }

    fn start(
        &self,
        keys: LockKeys,
        token: String,
        value: String,
        fence: Fence,
        deadline: Instant,
    ) -> ControlLease {
        let ttl = self.opts.ttl_value();
        let state = Arc::new(LeaseState {
            deadline: Mutex::new(deadline),
            lost: CancellationToken::new(),
            reason: Mutex::new(None),
            renewing: tokio::sync::Mutex::new(()),
            ttl,
        });
        let stop = CancellationToken::new();
        tokio::spawn(renew(
            self.conn.clone(),
            self.variant,
            keys.lock().to_owned(),
            value.clone(),
            state.clone(),
            stop.clone(),
        ));
        ControlLease {
            conn: self.conn.clone(),
            variant: self.variant,
            keys,
            value,
            token,
            fence,
            state,
            stop,
        }
    }
}

/// The renewal task: every third of the ttl, and the deadline watchdog.
async fn renew(
    conn: RawConnection,
    variant: Variant,
    key: String,
    value: String,
    state: Arc<LeaseState>,
    stop: CancellationToken,
) {
    let interval = state.ttl / 3;
    let recreating = variant == Variant::RecreatingRenewal;
    let mut next = Instant::now() + interval;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let wake = next.min(state.deadline());
        if recreating {
            // NEGATIVE CONTROL `recreating-renewal`: the task sleeps without
            // watching for the release and renews once more after it.
            tokio::time::sleep_until(wake).await;
        } else {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        if Instant::now() >= state.deadline() {
            state.lose("the local deadline passed");
            return;
        }
        if Instant::now() < next {
            continue;
        }
        let _sending = if recreating {
            None
        } else {
            let guard = state.renewing.lock().await;
            if stop.is_cancelled() {
                return;
            }
            Some(guard)
        };
        let script = if recreating {
            &*RECREATING_EXTEND
        } else {
            &*EXTEND
        };
        let sent = Instant::now();
        let reply: redis::RedisResult<i64> = script
            .key(&key)
            .arg(&value)
            .arg(state.ttl.as_millis() as u64)
            .invoke_async(&mut conn.clone())
            .await;
        match reply {
            Ok(1) => {
                state.push(sent + state.ttl - drift(state.ttl));
                next = Instant::now() + interval;
            }
            Ok(0) => {
                state.lose("the lock expired in Redis");
                return;
            }
            Ok(_) => {
                state.lose("another holder took the lock");
                return;
            }
            Err(_) => next = Instant::now() + interval / 4,
        }
    }
}

impl ControlLease {
    pub(crate) fn fence(&self) -> Fence {
        self.fence
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    pub(crate) fn holder_id(&self) -> String {
        holder_id(&self.token)
    }

    pub(crate) fn remaining(&self) -> Duration {
        if self.state.lost.is_cancelled() {
            return Duration::ZERO;
        }
        self.state
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    pub(crate) fn loss_token(&self) -> CancellationToken {
        self.state.lost.clone()
    }

    /// Reads the loss reason once the loss signal fired.
    pub(crate) fn loss_reason_fn(&self) -> Box<dyn Fn() -> String + Send> {
        let state = self.state.clone();
        Box::new(move || {
            state
                .reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or("lost")
                .to_string()
        })
    }

    pub(crate) async fn release(self) -> Released {
        self.stop.cancel();
        if self.variant != Variant::RecreatingRenewal {
            // No renewal after the release: wait for one in flight.
            drop(self.state.renewing.lock().await);
        }
        let script = if self.variant == Variant::UncheckedRelease {
            &*UNCHECKED_RELEASE
        } else {
            &*RELEASE
        };
        let reply: redis::RedisResult<i64> = script
            .key(self.keys.lock())
            .arg(&self.value)
            .invoke_async(&mut self.conn.clone())
            .await;
        match reply {
            Ok(1) => Released::Released,
            Ok(_) => Released::NotOurs,
            Err(_) => Released::Unknown,
        }
    }
}

impl Drop for ControlLease {
    fn drop(&mut self) {
        if self.variant != Variant::RecreatingRenewal {
            self.stop.cancel();
        }
    }
}

/// NEGATIVE CONTROL `ge-check`: registration under `fence >= stored`.
pub(crate) async fn ge_register(res: &Resource, name: &str, fence: Fence, token: &str) -> Outcome {
    ge(res, name, fence, token, None).await
}

/// NEGATIVE CONTROL `ge-check`: the audited write under `fence >= stored`.
pub(crate) async fn ge_write(res: &Resource, w: Write<'_>) -> Outcome {
    ge(res, w.name, w.fence, w.token, Some(w)).await
}

async fn ge(
    res: &Resource,
    name: &str,
    fence: Fence,
    token: &str,
    write: Option<Write<'_>>,
) -> Outcome {
    if let Some((conn, prefix)) = res.redis() {
        let mut call = GE_WRITE.key(ResourceSpec::hash_key(prefix, name));
        call.key(ResourceSpec::audit_key(prefix, name))
            .arg(fence.get().to_string())
            .arg(token);
        match &write {
            Some(w) => call.arg(w.op).arg(w.worker).arg(w.read).arg(w.value),
            None => call.arg("").arg("").arg(0).arg(""),
        };
        let reply: redis::RedisResult<(i64, redis::Value)> =
            call.invoke_async(&mut conn.clone()).await;
        return match reply {
            Ok((1, _)) => Outcome::Accepted,
            Ok(_) => Outcome::Stale,
            Err(_) => Outcome::Unknown,
        };
    }
    if let Some((table, audit)) = res.postgres() {
        return pg_ge(table, audit, name, fence, token, write)
            .await
            .unwrap_or(Outcome::Unknown);
    }
    Outcome::Unknown
}

async fn pg_ge(
    table: &fencelock::FencedTable,
    audit: &str,
    name: &str,
    fence: Fence,
    token: &str,
    write: Option<Write<'_>>,
) -> crate::Result<Outcome> {
    use fencelock::sqlx::{AssertSqlSafe, query, query_scalar};
    let failed = |e: fencelock::sqlx::Error| crate::Error::failed(e.to_string());
    let t = table.table();
    let f = i64::try_from(fence.get()).unwrap_or(i64::MAX);
    let mut tx = table.pool().begin().await.map_err(failed)?;
    let before: i64 = query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM \"{t}\" WHERE name = $1 FOR UPDATE"
    )))
    .bind(name)
    .fetch_one(&mut *tx)
    .await
    .map_err(failed)?;
    let set_value = if write.is_some() { ", value = $4" } else { "" };
    let sql = format!(
        "UPDATE \"{t}\" SET lock_fence = $2, lock_holder = $3{set_value} WHERE name = $1 AND (lock_fence IS NULL OR lock_fence <= $2)"
    );
    let mut update = query(AssertSqlSafe(sql))
        .bind(name)
        .bind(f)
        .bind(holder_id(token));
    if let Some(w) = &write {
        update = update.bind(w.value);
    }
    let done = update.execute(&mut *tx).await.map_err(failed)?;
    let accepted = done.rows_affected() == 1;
    if accepted && let Some(w) = &write {
        crate::resource::insert_audit(&mut tx, audit, w, before).await?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(if accepted {
        Outcome::Accepted
    } else {
        Outcome::Stale
    })
}

/// NEGATIVE CONTROL `one-fence`: a permit's registration at the one
/// (fence, holder) pair of all slots.
pub(crate) async fn one_fence_register(
    res: &Resource,
    name: &str,
    slot: u32,
    fence: Fence,
    token: &str,
) -> Outcome {
    one_fence(res, name, slot, fence, token, None).await
}

/// NEGATIVE CONTROL `one-fence`: a permit's audited write of its slot's
/// value, fenced by the one (fence, holder) pair of all slots.
pub(crate) async fn one_fence_write(res: &Resource, slot: u32, w: Write<'_>) -> Outcome {
    one_fence(res, w.name, slot, w.fence, w.token, Some(w)).await
}

async fn one_fence(
    res: &Resource,
    name: &str,
    slot: u32,
    fence: Fence,
    token: &str,
    write: Option<Write<'_>>,
) -> Outcome {
    let Some((conn, prefix)) = res.redis() else {
        return Outcome::Unknown;
    };
    let mut call = ONE_FENCE.key(ResourceSpec::hash_key(prefix, name));
    call.key(ResourceSpec::audit_key(prefix, name))
        .arg(fence.get().to_string())
        .arg(token);
    match &write {
        Some(w) => call.arg(w.op).arg(w.worker).arg(w.read).arg(w.value),
        None => call.arg("").arg("").arg(0).arg(""),
    };
    call.arg(crate::resource::KEY_TTL.as_millis().to_string())
        .arg(slot);
    let reply: redis::RedisResult<(i64, redis::Value)> = call.invoke_async(&mut conn.clone()).await;
    match reply {
        Ok((1, _)) => Outcome::Accepted,
        Ok(_) => Outcome::Stale,
        Err(_) => Outcome::Unknown,
    }
}
