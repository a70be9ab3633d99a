//! The extension's tokio runtime, one per process, and the bridge that
//! turns a Rust future into an asyncio future ([`future_into_py`]).
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
//!
//! The bridge is `pyo3_async_runtimes::generic`, given this runtime
//! through [`ExtensionRuntime`]'s `Runtime` and `ContextExt` impls. When
//! the asyncio future is cancelled, its done-callback signals the bridge's
//! task, which drops the Rust future at once: the call it made is
//! cancelled (an acquire leaves no queue entry, for one).

use std::cell::{Cell, OnceCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use pyo3::prelude::*;
use pyo3_async_runtimes::TaskLocals;
use pyo3_async_runtimes::generic::{self, ContextExt, JoinError, Runtime};
use tokio::runtime::Handle;

use crate::errors::{Failure, Outcome};

/// Worker threads: locks wait on the network, two keep one slow reply
/// from holding up the rest.
const WORKERS: usize = 2;

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

/// Runs `future` on this process's runtime and returns an asyncio future
/// of the running loop that completes with its result (converted to
/// Python, or raised as a `fencelock._errors` class). Cancelling the
/// asyncio future drops `future`.
///
/// # Errors
/// `RuntimeError` without a running event loop; [`Failure::Internal`]
/// when the runtime cannot start.
pub(crate) fn future_into_py<'py, F, T>(py: Python<'py>, future: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    // Made (or found) here, attached to Python, so the bridge's own
    // spawns below always find it.
    handle(py)?;
    generic::future_into_py::<ExtensionRuntime, _, Outcome<T>>(py, async move {
        Ok(Outcome(future.await))
    })
}

/// This process's runtime, as `pyo3_async_runtimes::generic` sees it.
#[derive(Debug)]
pub(crate) struct ExtensionRuntime;

tokio::task_local! {
    /// The event loop and context of the asyncio call a task serves.
    static TASK_LOCALS: OnceCell<TaskLocals>;
}

/// A task that ended without finishing (cancelled, or panicked).
#[derive(Debug)]
pub(crate) enum TaskFailed {
    /// Tokio's report.
    Join(tokio::task::JoinError),
    /// No runtime to spawn on: cannot happen once [`future_into_py`] made
    /// it, but a spawn has no way to say so.
    NoRuntime,
}

impl JoinError for TaskFailed {
    fn is_panic(&self) -> bool {
        matches!(self, TaskFailed::Join(e) if e.is_panic())
    }

    fn into_panic(self) -> Box<dyn std::any::Any + Send + 'static> {
        match self {
            TaskFailed::Join(e) => match e.try_into_panic() {
                Ok(payload) => payload,
                Err(e) => Box::new(e.to_string()),
            },
            TaskFailed::NoRuntime => Box::new("no runtime"),
        }
    }
}

/// A spawned task's handle, as the bridge awaits it.
#[derive(Debug)]
pub(crate) enum Joined {
    /// The task.
    Task(tokio::task::JoinHandle<()>),
    /// Nothing was spawned ([`TaskFailed::NoRuntime`]).
    NoRuntime,
}

impl Future for Joined {
    type Output = Result<(), TaskFailed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Joined::Task(task) => Pin::new(task).poll(cx).map_err(TaskFailed::Join),
            Joined::NoRuntime => Poll::Ready(Err(TaskFailed::NoRuntime)),
        }
    }
}

impl Runtime for ExtensionRuntime {
    type JoinError = TaskFailed;
    type JoinHandle = Joined;

    fn spawn<F>(fut: F) -> Joined
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match handle_anywhere() {
            Some(handle) => Joined::Task(handle.spawn(fut)),
            None => Joined::NoRuntime,
        }
    }

    fn spawn_blocking<F>(f: F) -> Joined
    where
        F: FnOnce() + Send + 'static,
    {
        match handle_anywhere() {
            Some(handle) => Joined::Task(handle.spawn_blocking(f)),
            None => Joined::NoRuntime,
        }
    }
}

impl ContextExt for ExtensionRuntime {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceCell::new();
        // A fresh cell: setting it cannot fail.
        let _ = cell.set(locals);
        Box::pin(TASK_LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        TASK_LOCALS
            .try_with(|cell| cell.get().cloned())
            .unwrap_or_default()
    }
}
