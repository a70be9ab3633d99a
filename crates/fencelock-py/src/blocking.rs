//! The `*_blocking` methods: a call run to its end on the runtime while
//! the calling thread waits without the GIL, and wakes every
//! [`SIGNAL_SLICE`] to let Python run its signal handlers, so Ctrl-C
//! raises `KeyboardInterrupt` at once instead of after the call.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Handle;

use crate::errors::Failure;
use crate::runtime;

/// How long the caller waits, detached from Python, between two looks at
/// its signals.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// How long an interrupted call gets to end once aborted (it ends at its
/// next poll; a worker busy elsewhere may take a moment).
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// Runs `future` as a task on this process's runtime and waits for it.
///
/// A signal handler that raises (Ctrl-C: `KeyboardInterrupt`) aborts the
/// task, which drops the future: an acquire in progress is cancelled as if
/// its asyncio future had been (no queue entry is left), and a result it
/// had just produced is dropped here (a lease so dropped is released in the
/// background). Then the handler's exception is raised.
///
/// # Errors
/// The call's own error; the signal handler's; `Error` when called on a
/// thread that runs a tokio runtime already (it could not wait there).
pub(crate) fn run<F, T>(py: Python<'_>, future: F) -> PyResult<T>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: Send + 'static,
{
    if Handle::try_current().is_ok() {
        // `block_on` would panic: a runtime cannot wait inside a runtime.
        return Err(Failure::Internal(
            "a blocking fencelock call was made on a thread that runs a tokio runtime: use the asyncio API there".into(),
        )
        .into_pyerr(py));
    }
    let handle = runtime::handle(py).map_err(|f| f.into_pyerr(py))?;
    let mut task = handle.spawn(future);
    loop {
        let slice = py.detach(|| {
            handle.block_on(async { tokio::time::timeout(SIGNAL_SLICE, &mut task).await })
        });
        match slice {
            Ok(joined) => return finished(py, joined),
            Err(_elapsed) => {
                if let Err(interrupted) = py.check_signals() {
                    task.abort();
                    // Wait for the abort, so the call's clean-up has begun
                    // before the exception reaches the caller.
                    let _ = py.detach(|| {
                        handle.block_on(async { tokio::time::timeout(ABORT_GRACE, task).await })
                    });
                    return Err(interrupted);
                }
            }
        }
    }
}

/// The result of a finished task, or `Error` for one that panicked.
fn finished<T>(
    py: Python<'_>,
    joined: Result<Result<T, Failure>, tokio::task::JoinError>,
) -> PyResult<T> {
    match joined {
        Ok(result) => result.map_err(|f| f.into_pyerr(py)),
        Err(e) => Err(Failure::Internal(format!("fencelock's call failed: {e}")).into_pyerr(py)),
    }
}
