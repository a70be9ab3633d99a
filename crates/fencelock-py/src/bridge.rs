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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tokio::task::{AbortHandle, JoinError};

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
    let event_loop = GET_RUNNING_LOOP
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
        })?
        .bind(py)
        .call0()?;
    let py_future = event_loop.call_method0("create_future")?;
    let work = runtime.spawn(future);
    let on_done = AbortOnCancel {
        task: work.abort_handle(),
    };
    if let Err(e) = py_future.call_method1("add_done_callback", (on_done,)) {
        // Nobody could cancel the call, nor receive its result.
        work.abort();
        return Err(e);
    }
    let target = Target {
        event_loop: event_loop.unbind(),
        future: py_future.clone().unbind(),
    };
    runtime.spawn(async move {
        let joined = work.await;
        if matches!(&joined, Err(e) if e.is_cancelled()) {
            // Aborted: the asyncio future was cancelled.
            return;
        }
        // Waiting for the GIL on a blocking thread holds up no worker.
        // Detached: nothing waits for the hand-over.
        drop(tokio::task::spawn_blocking(move || {
            if !hand_overs.enter() {
                // The interpreter is shutting down: the result is dropped.
                return;
            }
            Python::try_attach(|py| {
                // An error here is the loop's refusal (closed just now):
                // dropped attached, so the result it holds goes at once.
                let _ = target.complete(py, joined);
            });
            hand_overs.leave();
        }));
    });
    Ok(py_future)
}

/// Where a call's result goes.
struct Target {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
}

impl Target {
    /// Hands the result to the loop, unless the future is done already
    /// (cancelled) or the loop closed: then it is dropped.
    fn complete<T>(
        self,
        py: Python<'_>,
        joined: Result<Result<T, Failure>, JoinError>,
    ) -> PyResult<()>
    where
        T: for<'a> IntoPyObject<'a>,
    {
        let event_loop = self.event_loop.bind(py);
        let future = self.future.bind(py);
        if future.call_method0("done")?.is_truthy()?
            || event_loop.call_method0("is_closed")?.is_truthy()?
        {
            return Ok(());
        }
        let result = match joined {
            Ok(Ok(value)) => value.into_bound_py_any(py),
            Ok(Err(failure)) => Err(failure.into_pyerr(py)),
            Err(e) => {
                Err(Failure::Internal(format!("fencelock's call failed: {e}")).into_pyerr(py))
            }
        };
        let (value, failed) = match result {
            Ok(value) => (value, false),
            Err(err) => (err.into_value(py).into_any().into_bound(py), true),
        };
        event_loop.call_method1("call_soon_threadsafe", (Settle, future, value, failed))?;
        Ok(())
    }
}

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
        if future.call_method0("done")?.is_truthy()? {
            return Ok(());
        }
        let method = if failed {
            "set_exception"
        } else {
            "set_result"
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
        if future.call_method0("cancelled")?.is_truthy()? {
            self.task.abort();
        }
        Ok(())
    }
}
