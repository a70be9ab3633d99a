//! `Lease`: a held lock as Python sees it, and the registry of the live
//! leases of one client, which `Client.close()` releases.
//!
//! A lease's identity (name, fence, token, …) is copied at the grant, so
//! it reads the same in any process. Its guard (the library's `Lease`)
//! sits in a [`LeaseCell`] shared with the client's [`LeaseRegistry`]:
//! whoever takes it out first releases it (`release()` or the client's
//! `close()`), and a release runs as a task of its own on the runtime, so
//! cancelling the caller that awaits it never cuts it short.
//!
//! In a forked child a lease is lost (`"forked"`): the parent still holds
//! the lock and renews it. The child sends nothing for it and never
//! touches the parent's guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use fencelock::{Fence, LeaseHandle, ReleaseOutcome};
use pyo3::prelude::*;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::args::shown;
use crate::blocking;
use crate::bridge::{LoopCall, future_into_py};
use crate::errors::{Failure, reason_name};
use crate::process::{Local, Origin};
use crate::runtime;

/// A lease's identity, copied at the grant: plain data, readable in any
/// process.
#[derive(Debug, Clone)]
struct Identity {
    name: String,
    fence: Fence,
    holder_id: String,
    /// The secret holder token: never shown.
    token: String,
    slot: Option<u32>,
    access: Option<&'static str>,
    ttl: Duration,
}

impl Identity {
    fn of(lease: &LeaseHandle) -> Self {
        Identity {
            name: lease.name().to_owned(),
            fence: lease.fence(),
            holder_id: lease.holder_id(),
            token: lease.token().to_owned(),
            slot: lease.slot(),
            access: lease.access().map(fencelock::Access::as_str),
            ttl: lease.ttl(),
        }
    }
}

/// The guard of one lease, shared by its `Lease` object and its client's
/// registry until one of them takes it out to release it.
#[derive(Debug)]
pub(crate) struct LeaseCell {
    /// Set once the guard was taken out to be released.
    released: AtomicBool,
    guard: Local<Mutex<Option<fencelock::Lease>>>,
    /// Cancelled when the lease is released (or dropped): ends its loss
    /// watch ([`Lease::watch`]), which never fires after a release.
    unwatched: CancellationToken,
}

impl Drop for LeaseCell {
    fn drop(&mut self) {
        self.unwatched.cancel();
    }
}

impl LeaseCell {
    fn new(lease: fencelock::Lease) -> Self {
        LeaseCell {
            released: AtomicBool::new(false),
            guard: Local::new(Mutex::new(Some(lease))),
            unwatched: CancellationToken::new(),
        }
    }

    /// Spawns the release of the guard on `runtime`; `None` when it was
    /// released already, or belongs to another process. The task runs to
    /// its end whoever awaits it, or nobody.
    pub(crate) fn release(
        &self,
        runtime: &Handle,
    ) -> Option<JoinHandle<fencelock::Result<ReleaseOutcome>>> {
        let guard = self.guard.get()?;
        let lease = guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        self.released.store(true, Ordering::Release);
        let unwatched = self.unwatched.clone();
        Some(runtime.spawn(async move {
            // On the runtime: the watch's task wakes on this thread.
            unwatched.cancel();
            lease.release().await
        }))
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
}

/// The live leases of one client, held weakly: a lease dropped by Python
/// leaves it by itself (the library releases it in the background).
#[derive(Debug, Default)]
pub(crate) struct LeaseRegistry {
    state: Mutex<Registered>,
}

#[derive(Debug, Default)]
struct Registered {
    /// Once closed, no lease is adopted.
    closed: bool,
    cells: Vec<Weak<LeaseCell>>,
    /// The length at which dead entries are swept next: twice the live
    /// ones at the last sweep, so sweeping costs O(1) per lease.
    sweep_at: usize,
}

/// The fewest entries worth a sweep.
const MIN_SWEEP: usize = 64;

impl LeaseRegistry {
    /// Records `cell`; false once the registry is closed.
    fn adopt(&self, cell: &Arc<LeaseCell>) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return false;
        }
        if state.cells.len() >= state.sweep_at.max(MIN_SWEEP) {
            state.cells.retain(|cell| cell.strong_count() > 0);
            state.sweep_at = state.cells.len() * 2;
        }
        state.cells.push(Arc::downgrade(cell));
        true
    }

    /// Closes the registry and returns the leases still alive, to
    /// release.
    pub(crate) fn close(&self) -> Vec<Arc<LeaseCell>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        std::mem::take(&mut state.cells)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// What a finished release task says: true when the lock was deleted,
/// false when it was no longer ours.
pub(crate) fn released(
    joined: Result<fencelock::Result<ReleaseOutcome>, tokio::task::JoinError>,
) -> Result<bool, Failure> {
    match joined {
        Ok(Ok(outcome)) => Ok(outcome.is_released()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(Failure::Internal(format!("the release failed: {e}"))),
    }
}

/// A held lock.
#[pyclass(frozen, module = "fencelock._native", name = "Lease")]
#[derive(Debug)]
pub(crate) struct Lease {
    identity: Identity,
    origin: Origin,
    cell: Arc<LeaseCell>,
    handle: Local<LeaseHandle>,
}

impl Lease {
    /// The `Lease` of a grant, recorded in its client's `registry`.
    ///
    /// # Errors
    /// [`Failure::Closed`] when the client was closed while the grant was
    /// on its way: the lease is dropped here, which releases it in the
    /// background (this runs on the runtime).
    pub(crate) fn adopt(
        lease: fencelock::Lease,
        registry: &LeaseRegistry,
    ) -> Result<Self, Failure> {
        let handle = lease.handle();
        let cell = Arc::new(LeaseCell::new(lease));
        if !registry.adopt(&cell) {
            return Err(Failure::Closed(
                "the client was closed while the lock was being acquired; it was released again"
                    .into(),
            ));
        }
        Ok(Lease {
            identity: Identity::of(&handle),
            origin: Origin::here(),
            cell,
            handle: Local::new(handle),
        })
    }

    /// Runs `on_lost` on its event loop if the lease is lost before it is
    /// released (or dropped); nothing otherwise. Called on the runtime
    /// (by the acquisition that made the lease), where the watch's task
    /// starts without waking another thread.
    pub(crate) fn watch(&self, on_lost: LoopCall) {
        let Some(handle) = self.live() else {
            return;
        };
        let (lost, unwatched) = (handle.loss_token(), self.cell.unwatched.clone());
        drop(tokio::spawn(async move {
            tokio::select! {
                () = unwatched.cancelled() => {}
                () = lost.cancelled() => on_lost.schedule(),
            }
        }));
    }

    /// The fence and secret token that fenced writes carry.
    pub(crate) fn credentials(&self) -> (Fence, String) {
        (self.identity.fence, self.identity.token.clone())
    }

    /// The lease's handle, in the process that holds it.
    fn live(&self) -> Option<&LeaseHandle> {
        self.handle.get()
    }

    /// The error of a lease that cannot be extended: a forked child's,
    /// or a released one's.
    fn gone(&self) -> Failure {
        let Identity { name, fence, .. } = &self.identity;
        if self.cell.is_released() {
            Failure::Lost {
                message: format!(
                    "lock {} (fence {fence}) was released: a released lease cannot be extended",
                    shown(name)
                ),
                name: name.clone(),
                fence: fence.get(),
                reason: None,
            }
        } else {
            Failure::Lost {
                message: format!(
                    "lock {} (fence {fence}) is held by process {}, which forked this one: the lease is not this process's",
                    shown(name),
                    self.origin.pid()
                ),
                name: name.clone(),
                fence: fence.get(),
                reason: Some("forked"),
            }
        }
    }

    /// The handle `extend` renews; the error of [`Lease::gone`] once
    /// released, or in another process.
    fn extendable(&self) -> Result<LeaseHandle, Failure> {
        match self.live() {
            Some(handle) if !self.cell.is_released() => Ok(handle.clone()),
            _ => Err(self.gone()),
        }
    }
}

#[pymethods]
impl Lease {
    /// The lock's name.
    #[getter]
    fn name(&self) -> &str {
        &self.identity.name
    }

    /// The writer's fence (a reader's write epoch).
    #[getter]
    fn fence(&self) -> u64 {
        self.identity.fence.get()
    }

    /// The holder's public id.
    #[getter]
    fn holder_id(&self) -> &str {
        &self.identity.holder_id
    }

    /// The secret holder token; never in `repr`.
    #[getter]
    fn token(&self) -> &str {
        &self.identity.token
    }

    /// A semaphore permit's slot.
    #[getter]
    fn slot(&self) -> Option<u32> {
        self.identity.slot
    }

    /// A read-write lock's side: `"read"` or `"write"`.
    #[getter]
    fn access(&self) -> Option<&'static str> {
        self.identity.access
    }

    /// The lease's ttl in seconds.
    #[getter]
    fn ttl(&self) -> f64 {
        self.identity.ttl.as_secs_f64()
    }

    /// Seconds of validity left (0.0 once lost or released).
    fn remaining(&self) -> f64 {
        match self.live() {
            Some(handle) if !self.cell.is_released() => handle.remaining().as_secs_f64(),
            _ => 0.0,
        }
    }

    /// True once the lease is lost; in a child after `fork()`, true for
    /// every lease the parent had not released.
    fn is_lost(&self) -> bool {
        match self.live() {
            Some(handle) => handle.is_lost(),
            None => !self.cell.is_released(),
        }
    }

    /// Why the lease was lost, or `None`.
    fn loss_reason(&self) -> Option<&'static str> {
        match self.live() {
            Some(handle) => handle.loss_reason().map(reason_name),
            None if self.cell.is_released() => None,
            None => Some("forked"),
        }
    }

    /// True once `release()` (or the client's `close()`) took the lease.
    fn is_released(&self) -> bool {
        self.cell.is_released()
    }

    /// Completes when the lease is lost; never after a normal release.
    fn lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(handle) = self.live() else {
            // A forked child's copy: lost at once, unless released before.
            let released = self.cell.is_released();
            return future_into_py(py, async move {
                if released {
                    std::future::pending::<()>().await;
                }
                Ok(())
            });
        };
        // A child token: dropping it (a cancelled wait) leaves the
        // lease's own signal alone.
        let lost = handle.loss_token();
        future_into_py(py, async move {
            lost.cancelled().await;
            Ok(())
        })
    }

    /// Renews now.
    fn extend<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let renew = self.extendable()?.extend_owned();
        future_into_py(py, async move { Ok(renew.await?) })
    }

    /// Renews now, blocking.
    fn extend_blocking(&self, py: Python<'_>) -> PyResult<()> {
        let renew = self.extendable()?.extend_owned();
        blocking::run(py, async move { Ok(renew.await?) })
    }

    /// Releases: true when deleted, false when no longer ours, or
    /// released before.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let runtime = runtime::handle(py)?;
        let Some(task) = self.cell.release(&runtime) else {
            return future_into_py(py, async { Ok(false) });
        };
        future_into_py(py, async move { released(task.await) })
    }

    /// Releases, blocking. An interrupt stops the wait, not the release.
    fn release_blocking(&self, py: Python<'_>) -> PyResult<bool> {
        let runtime = runtime::handle(py)?;
        let Some(task) = self.cell.release(&runtime) else {
            return Ok(false);
        };
        blocking::run(py, async move { released(task.await) })
    }

    fn __repr__(&self) -> String {
        let Identity {
            name,
            fence,
            holder_id,
            slot,
            access,
            ..
        } = &self.identity;
        let mut shown_as = format!(
            "<fencelock.Lease name={} fence={fence} holder_id={holder_id}",
            shown(name)
        );
        if let Some(slot) = slot {
            shown_as.push_str(&format!(" slot={slot}"));
        }
        if let Some(access) = access {
            shown_as.push_str(&format!(" access={access}"));
        }
        shown_as.push_str(&format!(
            " lost={} released={}>",
            py_bool(self.is_lost()),
            py_bool(self.is_released())
        ));
        shown_as
    }
}

/// `True` or `False`, as Python writes them.
fn py_bool(flag: bool) -> &'static str {
    if flag { "True" } else { "False" }
}

/// The public id of the holder with `token` (what resources store).
#[pyfunction]
pub(crate) fn holder_id(token: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(fencelock::holder_id(&crate::args::text(token, "token")?))
}
