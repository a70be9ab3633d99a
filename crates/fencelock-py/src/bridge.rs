//! Rust futures as asyncio futures: [`future_into_py`] runs a call on
//! this process's runtime and completes a future of the caller's event
//! loop with its result, through the loop's inbox (`inbox.rs`: no thread
//! of the runtime ever attaches to Python to hand a result over).
//!
//! Cancellation: the asyncio future's done-callback aborts the task when
//! the future was cancelled, which drops the Rust future at its next poll
//! (an acquire so dropped leaves no queue entry).
//!
//! A result that has nowhere to go is dropped, never parked in Python:
//! when the asyncio future was cancelled (or completed) in the meantime,
//! or its loop is gone (`asyncio.run` returned while the call was still
//! running). A lease dropped so is released in the background.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pyo3::intern;
use pyo3::prelude::*;
use tokio::task::AbortHandle;

use crate::errors::Failure;
use crate::inbox::{Delivery, Inbox};
use crate::runtime;

/// A callback to run on the caller's event loop when something happens on
/// the runtime (a lease's loss), and nothing at all when it never happens.
pub(crate) struct LoopCall {
    inbox: Arc<Inbox>,
    callback: Py<PyAny>,
}

impl LoopCall {
    /// `callback` on the running event loop.
    ///
    /// # Errors
    /// As [`Inbox::of_running_loop`].
    pub(crate) fn on_running_loop(py: Python<'_>, callback: Py<PyAny>) -> PyResult<Self> {
        let (_, inbox) = Inbox::of_running_loop(py)?;
        Ok(LoopCall { inbox, callback })
    }

    /// Schedules the callback (from a thread of the runtime); dropped when
    /// the loop is gone.
    pub(crate) fn schedule(self) {
        self.inbox.deliver(Delivery::Call(self.callback));
    }
}

/// Bench-only, hidden (`fencelock._native._hop`): an awaitable that
/// completes with `None` through the same path as every asyncio call
/// (spawned on the runtime, handed back through the loop's inbox) and
/// does nothing else, so its rate is the bound that crossing from asyncio
/// to the runtime and back puts on any call. Used by `bench/bench.py`.
///
/// # Errors
/// As [`future_into_py`].
#[pyfunction(name = "_hop")]
pub(crate) fn hop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    future_into_py(py, async { Ok(()) })
}

/// Runs `future` on this process's runtime and returns a future of the
/// running event loop that completes with its result (converted to
/// Python, or raised as a `fencelock._errors` class). Cancelling the
/// returned future drops `future`.
///
/// # Errors
/// `RuntimeError` without a running event loop; `Error` when the
/// runtime cannot start.
pub(crate) fn future_into_py<'py, F, T>(py: Python<'py>, future: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let runtime = runtime::handle(py)?;
    let (event_loop, inbox) = Inbox::of_running_loop(py)?;
    let py_future = event_loop.call_method0(intern!(py, "create_future"))?;
    let target = py_future.clone().unbind();
    // One task runs the call and hands its result over: aborting it (the
    // asyncio future was cancelled) drops the call and sends nothing.
    let work = runtime.spawn(async move {
        let result = CatchPanic(Box::pin(future)).await;
        inbox.deliver(Delivery::settle(target, result));
    });
    let on_done = AbortOnCancel {
        task: work.abort_handle(),
    };
    if let Err(e) = py_future.call_method1(intern!(py, "add_done_callback"), (on_done,)) {
        // Nobody could cancel the call, nor receive its result.
        work.abort();
        return Err(e);
    }
    Ok(py_future)
}

/// A call's future whose panic becomes a [`Failure::Internal`], so its
/// asyncio future still completes (raising).
struct CatchPanic<F>(Pin<Box<F>>);

impl<F, T> Future for CatchPanic<F>
where
    F: Future<Output = Result<T, Failure>>,
{
    type Output = Result<T, Failure>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(polled) => polled,
            Err(_) => Poll::Ready(Err(Failure::Internal(
                "fencelock's call failed: it panicked".into(),
            ))),
        }
    }
}

/// The asyncio future's done-callback: aborts the task when the future
/// was cancelled.
#[pyclass(frozen)]
struct AbortOnCancel {
    task: AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future
            .call_method0(intern!(future.py(), "cancelled"))?
            .is_truthy()?
        {
            self.task.abort();
        }
        Ok(())
    }
}
