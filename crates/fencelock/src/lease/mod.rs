//! The lease layer: what a holder has and keeps, the same for every store
//! and every primitive.
//!
//! The engine hands out grants; [`Leases`] turns each into a [`Lease`]
//! (recording the acquisition's span, metrics and stats) and gives it to
//! the client's keeper, which renews it through the engine and watches its
//! deadline.
//!
//! | file | concern |
//! |---|---|
//! | `guard.rs` | the [`Lease`] guard and its [`LeaseHandle`]: fence, token, `remaining`, `lost`, `extend`, `release`, drop |
//! | `state.rs` | what a lease shares with the keeper: the grant, the local deadline, the loss signal, one renew and one release call |
//! | `keeper.rs` | the client's keeper: one task renews all its leases, those due together in one call per batch, and watches every deadline |

mod guard;
mod keeper;
mod state;

use std::sync::Arc;

use tokio::time::Instant;

use crate::engine::{Acquired, Engine, Waiting};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::metrics::{LeaseMetrics, LockFamily, StatsHandle, in_span};
use crate::options::LockOptions;

pub use guard::{Lease, LeaseHandle, ReleaseOutcome};
use keeper::Keeper;
use state::LeaseState;

/// Takes leases for one client: its engine, its keeper, its stats.
#[derive(Debug)]
pub(crate) struct Leases {
    /// Shared by the client's leases (one copy, not one each).
    engine: Arc<Engine>,
    /// Renews every lease of the client (one task, batched renewals).
    keeper: Arc<Keeper>,
    /// Per-family counters since connect, shared with leases and resources.
    stats: StatsHandle,
}

/// The span of one acquisition call; its `fence` is recorded once granted.
fn acquire_span(name: &str) -> tracing::Span {
    tracing::debug_span!(
        "acquire",
        lock = %name,
        fence = tracing::field::Empty,
        outcome = tracing::field::Empty
    )
}

impl Leases {
    pub(crate) fn new(engine: Engine) -> Self {
        Leases {
            engine: Arc::new(engine),
            keeper: Keeper::new(),
            stats: StatsHandle::new(),
        }
    }

    /// The client's engine.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The client's stats.
    pub(crate) fn stats(&self) -> &StatsHandle {
        &self.stats
    }

    /// One attempt (`try_acquire`), recorded.
    pub(crate) async fn try_acquire(
        &self,
        name: &str,
        keys: LockKeys,
        opts: &LockOptions,
    ) -> Result<Lease> {
        let (span, started) = (acquire_span(name), Instant::now());
        let acquired = in_span!(span, self.engine.try_acquire(name, &keys, opts));
        self.recorded(&span, name, opts, acquired, started)
    }

    /// Attempts until the wait deadline (`acquire`), recorded.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        keys: LockKeys,
        opts: &LockOptions,
        waiting: Waiting<'_>,
    ) -> Result<Lease> {
        let (span, started) = (acquire_span(name), Instant::now());
        let acquired = in_span!(span, self.engine.acquire(name, &keys, opts, waiting));
        self.recorded(&span, name, opts, acquired, started)
    }

    /// Starts the lease of what was acquired, and records the outcome of
    /// the acquisition call (its `acquire` span, metrics and stats).
    ///
    /// The call's future is instrumented where it is awaited rather than
    /// passed in here: an `async fn` keeps its future argument and the
    /// moved copy it awaits side by side, and every acquisition future
    /// would carry that doubled size.
    fn recorded(
        &self,
        span: &tracing::Span,
        name: &str,
        opts: &LockOptions,
        acquired: Result<Acquired>,
        started: Instant,
    ) -> Result<Lease> {
        // One look-up of the family per call; its leases keep it. One clock
        // reading for the end of the wait and the start of the hold.
        let family = self.stats.lock_family(opts.family_of(name));
        let now = Instant::now();
        let result = acquired.map(|acquired| self.start(acquired, opts, family.clone(), now));
        if let Ok(lease) = &result {
            span.record("fence", lease.fence().get());
        }
        crate::metrics::acquire(&family, span, &result, now - started);
        result
    }

    /// Hands a grant to the keeper (renewal and deadline watchdog); `now`
    /// is when the hold starts.
    fn start(
        &self,
        acquired: Acquired,
        opts: &LockOptions,
        family: Arc<LockFamily>,
        now: Instant,
    ) -> Lease {
        let metrics = LeaseMetrics::new(family, now);
        let state = LeaseState::new(
            self.engine.clone(),
            acquired.granted,
            acquired.deadline,
            metrics,
        );
        Lease::start(
            state,
            &self.keeper,
            opts.renewal_interval(),
            acquired.renew_now,
            now,
        )
    }
}
