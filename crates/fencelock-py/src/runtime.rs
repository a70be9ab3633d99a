//! The extension's tokio runtime, one per process.
//!
//! Why not `pyo3_async_runtimes::tokio`: its runtime is one process-wide
//! cell. After `os.fork()` a child would inherit it with none of its
//! worker threads (fork copies only the forking thread), and every call
//! would hang. Here the runtime is stored with the pid that made it: a
//! process that finds another pid's runtime makes its own and leaks the
//! old one (dropping it would try to join threads that do not exist).
//!
//! Fork safety of the store itself: its mutex is taken only by a thread
//! attached to Python ([`handle`] takes a `Python` token), and threads of
//! the runtime find their runtime without it (a thread-local flag set as
//! each starts). `os.fork()` runs attached to Python, so no other thread
//! can hold the mutex at that moment, and the child finds it free.

use std::cell::Cell;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use tokio::runtime::Handle;

use crate::errors::Failure;

/// Worker threads. One: every call waits on the network, never on the
/// CPU nor on Python (no thread of the runtime attaches to Python, see
/// `inbox.rs`), so a second worker adds nothing but wake-ups of one thread
/// by the other, and a task moving between them: with two, an uncontended
/// asyncio cycle ran at 0.83 of the rate it reaches with one (unpinned, 5
/// interleaved rounds).
const WORKERS: usize = 1;

/// The runtime of the process whose pid is stored with it.
static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

thread_local! {
    /// True on the threads of this process's runtime (workers and the
    /// blocking pool), which find their runtime without [`RUNTIME`].
    static ON_RUNTIME_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// The handle of this process's runtime, made on first use in each
/// process.
///
/// # Errors
/// [`Failure::Internal`] when a new runtime cannot start (no threads left).
pub(crate) fn handle(_py: Python<'_>) -> Result<Handle, Failure> {
    if let Some(own) = own_thread_handle() {
        return Ok(own);
    }
    let pid = std::process::id();
    // A panic elsewhere cannot leave the slot half-written: take it as is.
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((made_in, runtime)) = slot.as_ref()
        && *made_in == pid
    {
        return Ok(runtime.handle().clone());
    }
    let runtime = Arc::new(build().map_err(|e| {
        Failure::Internal(format!(
            "fencelock could not start its tokio runtime in process {pid}: {e}"
        ))
    })?);
    let handle = runtime.handle().clone();
    if let Some(inherited) = slot.replace((pid, runtime)) {
        // The parent's runtime: its threads do not exist in this process,
        // so dropping it would wait for them forever. Leaked instead.
        std::mem::forget(inherited);
    }
    Ok(handle)
}

/// The runtime's handle when called on one of its own threads.
fn own_thread_handle() -> Option<Handle> {
    if ON_RUNTIME_THREAD.with(Cell::get) {
        Handle::try_current().ok()
    } else {
        None
    }
}

/// The handle of this process's runtime from any thread: on its own
/// threads directly, elsewhere attached to Python (a thread that is
/// attached already, as every caller but the runtime's threads is, only
/// counts up). `None` when Python cannot be attached to (during the
/// interpreter's shutdown) or the runtime cannot start.
pub(crate) fn handle_anywhere() -> Option<Handle> {
    own_thread_handle().or_else(|| Python::try_attach(|py| handle(py).ok()).flatten())
}

fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("fencelock")
        .on_thread_start(|| ON_RUNTIME_THREAD.with(|own| own.set(true)))
        .enable_all()
        .build()
}
