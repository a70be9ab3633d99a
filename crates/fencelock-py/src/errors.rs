//! Errors on their way to Python: [`Failure`], what went wrong, made
//! anywhere (a tokio worker holds no GIL), and turned into an instance of
//! one of `fencelock._errors`' classes only once attached to Python
//! ([`Failure::into_pyerr`]).
//!
//! Every instance gets `retryable`, and `name`, `fence` and `reason` where
//! the error has them. Messages are the Rust errors' texts, which never
//! carry a password (the library redacts URLs) or a holder token.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Why a call failed, without Python objects (so it can be made on any
/// thread and sent across).
#[derive(Debug)]
pub(crate) enum Failure {
    /// An error of the library.
    Lock(fencelock::Error),
    /// An argument or option refused here, before the library saw it:
    /// `InvalidInput`.
    Invalid(String),
    /// A client closed, or connected in another process: `ClientClosed`.
    Closed(String),
    /// A lease known here to be gone (a forked child's, a released one):
    /// `LockLost`.
    Lost {
        /// The message.
        message: String,
        /// The lock's name.
        name: String,
        /// The lease's fence.
        fence: u64,
        /// `"forked"`, or `None` for a lease released before.
        reason: Option<&'static str>,
    },
    /// Anything else that went wrong here (a task that panicked, a runtime
    /// that could not start): the base class `Error`.
    Internal(String),
}

impl From<fencelock::Error> for Failure {
    fn from(error: fencelock::Error) -> Self {
        Failure::Lock(error)
    }
}

/// An option or argument refused: `invalid option KEY: PROBLEM`, the form
/// the Python layer uses too.
pub(crate) fn invalid_option(key: &str, problem: impl std::fmt::Display) -> Failure {
    Failure::Invalid(format!("invalid option {key}: {problem}"))
}

/// The classes of `fencelock._errors`, looked up once per interpreter.
struct Classes {
    error: Py<PyType>,
    invalid_input: Py<PyType>,
    lock_timeout: Py<PyType>,
    contended: Py<PyType>,
    lock_lost: Py<PyType>,
    grant_too_late: Py<PyType>,
    connection_failed: Py<PyType>,
    config_error: Py<PyType>,
    kind_conflict: Py<PyType>,
    wrong_type: Py<PyType>,
    not_replicated: Py<PyType>,
    revoke_incomplete: Py<PyType>,
    client_closed: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

impl Classes {
    fn get(py: Python<'_>) -> PyResult<&Classes> {
        CLASSES.get_or_try_init(py, || {
            let module = py.import("fencelock._errors")?;
            let class = |name: &str| -> PyResult<Py<PyType>> {
                Ok(module.getattr(name)?.cast_into::<PyType>()?.unbind())
            };
            Ok(Classes {
                error: class("Error")?,
                invalid_input: class("InvalidInput")?,
                lock_timeout: class("LockTimeout")?,
                contended: class("Contended")?,
                lock_lost: class("LockLost")?,
                grant_too_late: class("GrantTooLate")?,
                connection_failed: class("ConnectionFailed")?,
                config_error: class("ConfigError")?,
                kind_conflict: class("KindConflict")?,
                wrong_type: class("WrongType")?,
                not_replicated: class("NotReplicated")?,
                revoke_incomplete: class("RevokeIncomplete")?,
                client_closed: class("ClientClosed")?,
            })
        })
    }
}

/// What the Python exception carries besides its class.
struct Shown {
    message: String,
    retryable: bool,
    name: Option<String>,
    fence: Option<u64>,
    reason: Option<&'static str>,
}

impl Shown {
    fn plain(message: String, retryable: bool) -> Self {
        Shown {
            message,
            retryable,
            name: None,
            fence: None,
            reason: None,
        }
    }
}

/// The Python name of a loss reason, as `Lease.loss_reason()` gives it.
pub(crate) fn reason_name(reason: fencelock::LossReason) -> &'static str {
    match reason {
        fencelock::LossReason::Expired => "expired",
        fencelock::LossReason::TakenOver => "taken_over",
        fencelock::LossReason::DeadlinePassed => "deadline_passed",
        // The enum is non-exhaustive: a reason added later is still a loss.
        _ => "lost",
    }
}

impl Failure {
    /// The instance of the right `fencelock._errors` class, as a `PyErr`.
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let (class, shown) = match Classes::get(py) {
            Ok(classes) => self.classify(classes),
            // Only when the extension is imported without its package:
            // the message still reaches the caller.
            Err(_) => return PyRuntimeError::new_err(self.message()),
        };
        match instance(py, class, shown) {
            Ok(err) | Err(err) => err,
        }
    }

    /// The message alone, for the fallback above.
    fn message(&self) -> String {
        match self {
            Failure::Lock(e) => e.to_string(),
            Failure::Invalid(m) | Failure::Closed(m) | Failure::Internal(m) => m.clone(),
            Failure::Lost { message, .. } => message.clone(),
        }
    }

    fn classify(self, classes: &Classes) -> (&Py<PyType>, Shown) {
        match self {
            Failure::Lock(error) => lock_error(classes, &error),
            Failure::Invalid(m) => (&classes.invalid_input, Shown::plain(m, false)),
            Failure::Closed(m) => (&classes.client_closed, Shown::plain(m, false)),
            Failure::Internal(m) => (&classes.error, Shown::plain(m, false)),
            Failure::Lost {
                message,
                name,
                fence,
                reason,
            } => (
                &classes.lock_lost,
                Shown {
                    name: Some(name),
                    fence: Some(fence),
                    reason,
                    ..Shown::plain(message, false)
                },
            ),
        }
    }
}

/// The class and attributes of a library error (the mapping the package
/// documents in `_errors.py`).
fn lock_error<'c>(classes: &'c Classes, error: &fencelock::Error) -> (&'c Py<PyType>, Shown) {
    use fencelock::Error as E;
    let mut shown = Shown::plain(error.to_string(), error.is_retryable());
    let class = match error {
        E::InvalidName { name, .. } => {
            shown.name = Some(name.clone());
            &classes.invalid_input
        }
        E::InvalidOption(_) => &classes.invalid_input,
        E::Contended { name, .. } => {
            shown.name = Some(name.clone());
            &classes.contended
        }
        E::Timeout { name, .. } => {
            shown.name = Some(name.clone());
            &classes.lock_timeout
        }
        E::GrantTooLate { name, .. } => {
            shown.name = Some(name.clone());
            &classes.grant_too_late
        }
        E::NotReplicated { name, .. } | E::RenewalNotReplicated { name, .. } => {
            shown.name = Some(name.clone());
            &classes.not_replicated
        }
        E::WriteNotReplicated { .. } => &classes.not_replicated,
        E::RevokeNotReplicated { name, fence, .. } => {
            shown.name = Some(name.clone());
            shown.fence = Some(fence.get());
            &classes.not_replicated
        }
        E::RevokeIncomplete { name, fence, .. } => {
            shown.name = Some(name.clone());
            shown.fence = Some(fence.get());
            &classes.revoke_incomplete
        }
        E::LockLost {
            name,
            fence,
            reason,
        } => {
            shown.name = Some(name.clone());
            shown.fence = Some(fence.get());
            shown.reason = Some(reason_name(*reason));
            &classes.lock_lost
        }
        E::KindConflict { name, .. } | E::PermitsConflict { name, .. } => {
            shown.name = Some(name.clone());
            &classes.kind_conflict
        }
        E::WrongType { .. } => &classes.wrong_type,
        E::NoPermission { .. } | E::Tls { .. } | E::Config { .. } | E::Auth { .. } => {
            &classes.config_error
        }
        // Before the connection test: an etcd error that refused the
        // credentials or a role is a configuration error, as `Auth` is
        // for Redis (both count as connection errors too).
        other if other.is_config() => &classes.config_error,
        other if other.is_connection() => &classes.connection_failed,
        _ => &classes.error,
    };
    (class, shown)
}

/// `class(message)` with the attributes set.
fn instance(py: Python<'_>, class: &Py<PyType>, shown: Shown) -> PyResult<PyErr> {
    let value = class.bind(py).call1((shown.message,))?;
    value.setattr("retryable", shown.retryable)?;
    if let Some(name) = shown.name {
        value.setattr("name", name)?;
    }
    if let Some(fence) = shown.fence {
        value.setattr("fence", fence)?;
    }
    if let Some(reason) = shown.reason {
        value.setattr("reason", reason)?;
    }
    Ok(PyErr::from_value(value))
}

/// For `?` in methods that are attached to Python already (attaching
/// again is a counter increment).
impl From<Failure> for PyErr {
    fn from(failure: Failure) -> Self {
        Python::attach(|py| failure.into_pyerr(py))
    }
}
