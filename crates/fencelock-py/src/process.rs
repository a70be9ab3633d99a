//! What belongs to the process it was made in.
//!
//! After `os.fork()` the child holds copies of the parent's clients,
//! leases and resources, but none of the threads that served them: the
//! parent's runtime, its connections' tasks, the keeper that renews its
//! leases. The child must neither use nor drop them (a drop would spawn
//! on a runtime that does not run, or wait for threads that do not exist).
//! So each object records its [`Origin`], keeps its Rust values in a
//! [`Local`] that lends them out in that process only and leaks them in
//! any other, and a client's state of use is an [`Owner`].

use std::sync::atomic::{AtomicBool, Ordering};

use crate::errors::Failure;
use crate::runtime;

/// The process an object was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pid: u32,
}

impl Origin {
    /// The calling process.
    pub(crate) fn here() -> Self {
        Origin {
            pid: std::process::id(),
        }
    }

    /// True in the process the object was made in.
    pub(crate) fn is_here(self) -> bool {
        self.pid == std::process::id()
    }

    /// The pid it was made in.
    pub(crate) fn pid(self) -> u32 {
        self.pid
    }

    /// The error of a client used in another process.
    pub(crate) fn forked(self) -> Failure {
        Failure::Closed(format!(
            "connected in process {} before a fork; connect again in this process",
            self.pid
        ))
    }
}

/// A value of the process it was made in: lent out there only
/// ([`Local::get`]), dropped there inside the runtime's context (the
/// library spawns a dropped lease's release), and leaked in any other.
#[derive(Debug)]
pub(crate) struct Local<T> {
    origin: Origin,
    /// `Some` until dropped.
    value: Option<T>,
}

impl<T> Local<T> {
    /// `value`, of the calling process.
    pub(crate) fn new(value: T) -> Self {
        Local {
            origin: Origin::here(),
            value: Some(value),
        }
    }

    /// The value, in the process it was made in; `None` in any other.
    pub(crate) fn get(&self) -> Option<&T> {
        if self.origin.is_here() {
            self.value.as_ref()
        } else {
            None
        }
    }

    /// The process it was made in.
    pub(crate) fn origin(&self) -> Origin {
        self.origin
    }
}

impl<T> Drop for Local<T> {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else {
            return;
        };
        if !self.origin.is_here() {
            // The parent's: its drop could wait for or spawn on threads
            // that do not run in this process.
            std::mem::forget(value);
            return;
        }
        match runtime::handle_anywhere() {
            Some(handle) => {
                let _context = handle.enter();
                drop(value);
            }
            // No runtime to send anything on (the interpreter is shutting
            // down): a lease dropped now expires by its ttl.
            None => drop(value),
        }
    }
}

/// A client's state of use, shared with the resources it made: the
/// process it was connected in, and whether it was closed.
#[derive(Debug)]
pub(crate) struct Owner {
    origin: Origin,
    closed: AtomicBool,
}

impl Owner {
    /// A client connected in the calling process.
    pub(crate) fn here() -> Self {
        Owner {
            origin: Origin::here(),
            closed: AtomicBool::new(false),
        }
    }

    /// The process the client was connected in.
    pub(crate) fn origin(&self) -> Origin {
        self.origin
    }

    /// Ok while the client may be used here.
    ///
    /// # Errors
    /// [`Failure::Closed`] when it was closed, or connected in another
    /// process.
    pub(crate) fn check(&self) -> Result<(), Failure> {
        if !self.origin.is_here() {
            return Err(self.origin.forked());
        }
        if self.is_closed() {
            return Err(Failure::Closed("the client was closed".into()));
        }
        Ok(())
    }

    /// True once closed (in any process).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the client closed.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}
