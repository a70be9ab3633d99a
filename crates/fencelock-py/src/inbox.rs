//! What the runtime hands to an event loop, handed over without the GIL.
//!
//! Each event loop that awaits a call of the extension gets one inbox: a
//! queue and a socket pair whose reading end the loop watches
//! (`loop.add_reader`). A thread of the runtime that has something for the
//! loop (a call's result, a lease's loss) pushes it onto the queue, still
//! a Rust value, and writes one byte when the queue was empty; the loop's
//! reader callback ([`Reader`]) takes the whole queue and settles each
//! item on the loop's own thread, where results become Python objects.
//!
//! Why not `loop.call_soon_threadsafe`: it can only be called attached to
//! Python. Each result then made a runtime thread take the GIL, and the
//! loop's thread, woken by that very call, wait for the GIL until the
//! runtime thread let go: two wake-ups per result where this makes one.
//! And a runtime thread that never attaches to Python cannot be caught by
//! the interpreter's finalization (which forces such a thread out with
//! `pthread_exit` when it takes the GIL again, and that aborts the
//! process).
//!
//! An inbox lives as long as its loop watches it: when the loop is closed
//! (or freed), it lets go of its reader callback, and the reader's drop
//! closes the inbox: what is still queued is dropped (a lease so dropped
//! is released in the background), and so is whatever arrives later.
//! Nothing else holds the reader (the registry keeps a weak reference),
//! so this also holds while a pending future, held by its call's task,
//! keeps the closed loop itself alive.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyNotImplementedError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::errors::Failure;

/// The inboxes by event loop: a `weakref.WeakKeyDictionary` from loop to
/// a weak reference to its [`Reader`], so neither the loop nor the reader
/// is kept alive by it.
static INBOXES: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `asyncio.get_running_loop`, looked up once.
static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `weakref.ref`, looked up once.
static WEAK_REF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A result turned into its Python value (or the exception to raise), on
/// the loop's thread.
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// One thing for an event loop.
pub(crate) enum Delivery {
    /// Completes an asyncio future with a call's outcome, unless the future
    /// is done by then (cancelled after the call ended).
    Settle {
        /// The asyncio future.
        future: Py<PyAny>,
        /// Its result, or its exception.
        outcome: Outcome,
    },
    /// Calls a Python callable with no arguments.
    Call(Py<PyAny>),
}

impl Delivery {
    /// Settles `future` with `result`: the value converted to Python, or the
    /// failure raised as its `fencelock._errors` class.
    pub(crate) fn settle<T>(future: Py<PyAny>, result: Result<T, Failure>) -> Self
    where
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        let outcome: Outcome = Box::new(move |py| match result {
            Ok(value) => value.into_py_any(py),
            Err(failure) => Err(failure.into_pyerr(py)),
        });
        Delivery::Settle { future, outcome }
    }

    /// Runs on the loop's thread.
    fn run(self, py: Python<'_>) -> PyResult<()> {
        match self {
            Delivery::Settle { future, outcome } => {
                let future = future.bind(py);
                if future.call_method0(intern!(py, "done"))?.is_truthy()? {
                    return Ok(());
                }
                match outcome(py) {
                    Ok(value) => future.call_method1(intern!(py, "set_result"), (value,))?,
                    Err(err) => {
                        future.call_method1(intern!(py, "set_exception"), (err.into_value(py),))?
                    }
                };
                Ok(())
            }
            Delivery::Call(callback) => callback.bind(py).call0().map(drop),
        }
    }
}

/// One event loop's queue, and the socket pair that wakes the loop.
#[derive(Debug)]
pub(crate) struct Inbox {
    /// Written by whoever queues onto an empty queue.
    wake: UnixStream,
    /// Watched by the loop.
    watched: UnixStream,
    queue: Mutex<Queue>,
    /// The process that made it: a forked child makes its own.
    pid: u32,
}

#[derive(Default)]
struct Queue {
    items: Vec<Delivery>,
    /// Set once the loop is gone: nothing is queued any more.
    closed: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("items", &self.items.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl Inbox {
    /// The running event loop and its inbox (made and registered with the
    /// loop on first use).
    ///
    /// # Errors
    /// `RuntimeError` without a running event loop; `NotImplementedError`
    /// naming what is needed when the loop cannot watch a file descriptor;
    /// `OSError` when no socket pair can be made.
    pub(crate) fn of_running_loop(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Arc<Inbox>)> {
        let event_loop = GET_RUNNING_LOOP
            .get_or_try_init(py, || {
                Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
            })?
            .bind(py)
            .call0()?;
        let inboxes = INBOXES
            .get_or_try_init(py, || {
                Ok::<_, PyErr>(
                    py.import("weakref")?
                        .getattr("WeakKeyDictionary")?
                        .call0()?
                        .unbind(),
                )
            })?
            .bind(py);
        let known = inboxes.call_method1(intern!(py, "get"), (&event_loop,))?;
        let known = if known.is_none() {
            known
        } else {
            known.call0()?
        };
        if let Ok(reader) = known.cast::<Reader>()
            && reader.get().inbox.pid == std::process::id()
        {
            let inbox = reader.get().inbox.clone();
            return Ok((event_loop, inbox));
        }
        let inbox = Arc::new(Inbox::new()?);
        let reader = Bound::new(
            py,
            Reader {
                inbox: inbox.clone(),
            },
        )?;
        match event_loop.call_method1(
            intern!(py, "add_reader"),
            (inbox.watched.as_raw_fd(), &reader),
        ) {
            Err(e) if e.is_instance_of::<PyNotImplementedError>(py) => {
                return Err(PyNotImplementedError::new_err(
                    "fencelock's asyncio calls need an event loop that can watch a file descriptor \
                     (loop.add_reader): asyncio's default loop on Unix, or uvloop",
                ));
            }
            other => other?,
        };
        let weak = WEAK_REF
            .get_or_try_init(py, || {
                Ok::<_, PyErr>(py.import("weakref")?.getattr("ref")?.unbind())
            })?
            .bind(py)
            .call1((&reader,))?;
        inboxes.set_item(&event_loop, weak)?;
        Ok((event_loop, inbox))
    }

    fn new() -> PyResult<Self> {
        let (wake, watched) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        watched.set_nonblocking(true)?;
        Ok(Inbox {
            wake,
            watched,
            queue: Mutex::new(Queue::default()),
            pid: std::process::id(),
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // A panic elsewhere cannot leave the queue half-written.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `delivery` for the loop, from any thread, attached to Python
    /// or not; dropped when the loop is gone.
    pub(crate) fn deliver(&self, delivery: Delivery) {
        let mut queue = self.queue();
        if queue.closed {
            drop(queue);
            drop(delivery);
            return;
        }
        let wake = queue.items.is_empty();
        queue.items.push(delivery);
        drop(queue);
        if wake {
            // Full (a byte is there already) or the reader gone: either
            // way there is nobody more to wake.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// The loop's reader callback for one inbox; held by the loop alone, so
/// its drop tells that the loop no longer watches the inbox.
#[pyclass(frozen, weakref)]
struct Reader {
    inbox: Arc<Inbox>,
}

#[pymethods]
impl Reader {
    /// Settles everything queued. Each item runs even when one before it
    /// raised; the first error is raised at the end (to the loop's
    /// exception handler).
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        // The wake-up bytes first, the queue after: an item queued in
        // between is taken now, and its byte (if any) makes one empty
        // call more, never a lost one.
        let mut bytes = [0u8; 64];
        loop {
            match (&self.inbox.watched).read(&mut bytes) {
                Ok(n) if n == bytes.len() => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                _ => break,
            }
        }
        let items = std::mem::take(&mut self.inbox.queue().items);
        let mut first_error = None;
        for item in items {
            if let Err(e) = item.run(py) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Reader {
    /// The loop is closed or gone: drops what is queued, and everything
    /// after.
    fn drop(&mut self) {
        let items = {
            let mut queue = self.inbox.queue();
            queue.closed = true;
            std::mem::take(&mut queue.items)
        };
        drop(items);
    }
}
