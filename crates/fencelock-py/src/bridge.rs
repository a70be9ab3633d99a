//! Rust futures as asyncio futures: [`future_into_py`] runs a call on
//! this process's runtime and completes a future of the caller's event
//! loop with its result, through `loop.call_soon_threadsafe`.
//!
//! Cancellation: the asyncio future's done-callback aborts the task when
//! the future was cancelled, which drops the Rust future at its next poll
//! (an acquire so dropped leaves no queue entry).
//!
//! Shutdown: a hand-over runs Python code (`call_soon_threadsafe`) on a
//! thread of the runtime. Once the interpreter finalizes, such a thread
//! that lets go of the GIL (as the eval loop does every few ms) is forced
//! out with `pthread_exit` when it takes it again, and the unwinding
//! aborts the process. So every hand-over is counted ([`HandOvers`]), and
//! an `atexit` hook ([`at_exit`], which runs before finalization begins)
//! stops new ones and waits for those under way: after it, no thread of
//! the runtime attaches to Python again.
//!
//! A result that has nowhere to go is dropped here, never parked in
//! Python: when the asyncio future was cancelled (or completed) in the
//! meantime, or its loop was closed (`asyncio.run` returned while the
//! call was still running). A lease dropped so is released in the
//! background. (`pyo3_async_runtimes::generic`, tried first, hands a
//! result for a closed loop to `call_soon_threadsafe` anyway, and prints
//! the error with `sys.last_traceback` set: its frame then keeps the lease
//! alive, and renewed, for as long as the process runs.)

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pyo3::IntoPyObjectExt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tokio::task::AbortHandle;

use crate::errors::Failure;
use crate::runtime;

/// `asyncio.get_running_loop`, looked up once.
static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// How long the `atexit` hook waits for the hand-overs under way (each
/// takes microseconds; this bounds a stuck one).
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The hand-overs of the process whose pid is stored with them. Taken
/// only attached to Python (as the runtime's store, see `runtime.rs`), so
/// a forked child finds the mutex free, and makes its own count: the
/// parent's threads that counted in the copy do not exist in the child.
static HAND_OVERS: Mutex<Option<(u32, Arc<HandOvers>)>> = Mutex::new(None);

/// The count of hand-overs under way in one process, and whether the
/// interpreter is shutting down (then none starts).
#[derive(Debug, Default)]
struct HandOvers {
    running: AtomicUsize,
    closed: AtomicBool,
}

impl HandOvers {
    /// This process's.
    fn here(_py: Python<'_>) -> Arc<HandOvers> {
        let pid = std::process::id();
        let mut slot = HAND_OVERS.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some((made_in, hand_overs)) if *made_in == pid => hand_overs.clone(),
            _ => {
                let hand_overs = Arc::new(HandOvers::default());
                *slot = Some((pid, hand_overs.clone()));
                hand_overs
            }
        }
    }

    /// Counts one hand-over in; false once shutting down. Sequentially
    /// consistent with [`HandOvers::close`]: either this sees the close,
    /// or the close sees this count.
    fn enter(&self) -> bool {
        self.running.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.leave();
            return false;
        }
        true
    }

    fn leave(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    /// Stops new hand-overs; true once none is under way.
    fn close(&self) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        self.running.load(Ordering::SeqCst) == 0
    }
}

/// The `atexit` hook (registered by the module): stops the hand-overs and
/// waits, without the GIL, for those under way to finish.
#[pyfunction]
pub(crate) fn at_exit(py: Python<'_>) {
    let hand_overs = HandOvers::here(py);
    let deadline = Instant::now() + EXIT_WAIT;
    py.detach(|| {
        while !hand_overs.close() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// A callback to run on the caller's event loop when something happens on
/// the runtime (a lease's loss): one `call_soon_threadsafe`, counted as a
/// hand-over, and nothing at all when it never happens.
pub(crate) struct LoopCall {
    hand_overs: Arc<HandOvers>,
    event_loop: Py<PyAny>,
    callback: Py<PyAny>,
}

impl LoopCall {
    /// `callback` on the running event loop.
    ///
    /// # Errors
    /// `RuntimeError` without a running event loop.
    pub(crate) fn on_running_loop(py: Python<'_>, callback: Py<PyAny>) -> PyResult<Self> {
        Ok(LoopCall {
            hand_overs: HandOvers::here(py),
            event_loop: running_loop(py)?.unbind(),
            callback,
        })
    }

    /// Schedules the callback (from a thread of the runtime); dropped when
    /// the interpreter is shutting down or the loop is closed.
    pub(crate) fn schedule(self) {
        if !self.hand_overs.enter() {
            return;
        }
        Python::try_attach(|py| {
            let _ = self
                .event_loop
                .bind(py)
                .call_method1(intern!(py, "call_soon_threadsafe"), (self.callback,));
        });
        self.hand_overs.leave();
    }
}

/// The running event loop.
fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    GET_RUNNING_LOOP
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
        })?
        .bind(py)
        .call0()
}

/// Bench-only, hidden (`fencelock._native._hop`): an awaitable that
/// completes with `None` through the same path as every asyncio call
/// (spawned on the runtime, handed back with `call_soon_threadsafe`) and
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
    let hand_overs = HandOvers::here(py);
    if hand_overs.closed.load(Ordering::SeqCst) {
        // Its result could never be handed over: an `atexit` hook that
        // runs after this module's must use the blocking methods.
        return Err(Failure::Internal(
            "the interpreter is shutting down: fencelock's asyncio calls no longer complete; use the blocking methods".into(),
        )
        .into_pyerr(py));
    }
    let runtime = runtime::handle(py)?;
    let event_loop = running_loop(py)?;
    let py_future = event_loop.call_method0(intern!(py, "create_future"))?;
    let target = Target {
        event_loop: event_loop.unbind(),
        future: py_future.clone().unbind(),
    };
    // One task runs the call and hands its result over: aborting it (the
    // asyncio future was cancelled) drops the call and sends nothing.
    let work = runtime.spawn(async move {
        let result = CatchPanic(Box::pin(future)).await;
        hand_over(hand_overs, target, result);
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

/// Set while a worker of the runtime hands a result over (or waits for the
/// GIL to): a second worker that finds it set hands its own over from the
/// blocking pool instead, so a GIL held long by some Python thread stalls
/// at most one worker and the other goes on renewing leases.
static WORKER_HANDING_OVER: AtomicBool = AtomicBool::new(false);

/// Hands `result` to its asyncio future: from this worker when no other
/// worker is doing so (no thread to wake), else from the blocking pool.
fn hand_over<T>(hand_overs: Arc<HandOvers>, target: Target, result: Result<T, Failure>)
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    if WORKER_HANDING_OVER
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
    {
        target.send(&hand_overs, result);
        WORKER_HANDING_OVER.store(false, Ordering::Release);
    } else {
        // Detached: nothing waits for the hand-over.
        drop(tokio::task::spawn_blocking(move || {
            target.send(&hand_overs, result);
        }));
    }
}

/// Where a call's result goes.
struct Target {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
}

impl Target {
    /// Attaches to Python and hands the result over, unless the
    /// interpreter is shutting down (then the result is dropped).
    fn send<T>(self, hand_overs: &HandOvers, result: Result<T, Failure>)
    where
        T: for<'a> IntoPyObject<'a>,
    {
        if !hand_overs.enter() {
            return;
        }
        Python::try_attach(|py| {
            // An error here is the loop's refusal (closed just now, or
            // before): dropped attached, so the result it holds goes at
            // once.
            let _ = self.complete(py, result);
        });
        hand_overs.leave();
    }

    /// Hands the result to the loop: `call_soon_threadsafe` raises when
    /// the loop is closed, and the result is dropped. Whether the future
    /// is still pending is checked on the loop ([`Settle`]).
    fn complete<T>(self, py: Python<'_>, result: Result<T, Failure>) -> PyResult<()>
    where
        T: for<'a> IntoPyObject<'a>,
    {
        let (value, failed) = match result.map_err(|failure| failure.into_pyerr(py)) {
            Ok(value) => match value.into_bound_py_any(py) {
                Ok(value) => (value, false),
                Err(err) => (err.into_value(py).into_any().into_bound(py), true),
            },
            Err(err) => (err.into_value(py).into_any().into_bound(py), true),
        };
        let settle = SETTLE.get_or_try_init(py, || Py::new(py, Settle).map(Py::into_any))?;
        self.event_loop.bind(py).call_method1(
            intern!(py, "call_soon_threadsafe"),
            (settle, self.future, value, failed),
        )?;
        Ok(())
    }
}

/// The one [`Settle`] instance.
static SETTLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Sets a future's result or exception on its loop, unless it is done by
/// then (cancelled after the result was sent).
#[pyclass(frozen)]
struct Settle;

#[pymethods]
impl Settle {
    fn __call__(
        &self,
        future: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        failed: bool,
    ) -> PyResult<()> {
        let py = future.py();
        if future.call_method0(intern!(py, "done"))?.is_truthy()? {
            return Ok(());
        }
        let method = if failed {
            intern!(py, "set_exception")
        } else {
            intern!(py, "set_result")
        };
        future.call_method1(method, (value,))?;
        Ok(())
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
