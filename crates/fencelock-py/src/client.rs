//! `Client` and `connect`: the library's `LockClient` for Python, its
//! acquisitions, resources, revokes and `close()`.
//!
//! A client is usable in the process that connected it, until closed;
//! elsewhere (a forked child) and afterwards its methods raise
//! `ClientClosed`. It keeps a registry of the leases it granted, so
//! `close()` releases those still held before it lets go of the
//! connection.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock::LockClient;
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::args;
use crate::blocking;
use crate::bridge::{LoopCall, future_into_py};
use crate::errors::Failure;
use crate::lease::{Lease, LeaseRegistry, released};
use crate::options;
use crate::process::{Local, Owner};
use crate::resource::{FencedHash, FencedKey, SealTarget};
use crate::revoke::{self, Revoked};
use crate::runtime;

/// How long `close()` waits for the client's background clean-ups (the
/// releases of leases dropped without `release()`; on etcd, the removal
/// of abandoned waiters' keys). Each is bounded by the response timeout
/// already; this bounds them all.
const FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// Connects to `url` (an awaitable `Client`).
#[pyfunction]
pub(crate) fn connect<'py>(
    py: Python<'py>,
    url: &Bound<'py, PyAny>,
    options: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    future_into_py(py, connecting(url, options)?)
}

/// Connects to `url`, blocking.
#[pyfunction]
pub(crate) fn connect_blocking(
    py: Python<'_>,
    url: &Bound<'_, PyAny>,
    options: &Bound<'_, PyAny>,
) -> PyResult<Client> {
    blocking::run(py, connecting(url, options)?)
}

/// The connection, as a future (the URL is never quoted in an error of
/// this crate's: it may hold a password).
fn connecting(
    url: &Bound<'_, PyAny>,
    options: &Bound<'_, PyAny>,
) -> Result<impl Future<Output = Result<Client, Failure>> + Send + 'static, Failure> {
    let url = args::text(url, "URL")?;
    let builder = options::client_builder(&url, options)?;
    Ok(async move { Ok(Client::new(builder.connect().await?)) })
}

/// A connected client.
#[pyclass(frozen, module = "fencelock._native", name = "Client")]
#[derive(Debug)]
pub(crate) struct Client {
    /// The URL without its password.
    url: String,
    backend: &'static str,
    owner: Arc<Owner>,
    parts: Local<Parts>,
}

/// What a client uses in the process that connected it.
#[derive(Debug)]
struct Parts {
    /// `None` once closed.
    lock: Mutex<Option<LockClient>>,
    leases: Arc<LeaseRegistry>,
    /// Cancelled by `close()`: acquisitions still waiting end then.
    closing: CancellationToken,
}

impl Client {
    fn new(lock: LockClient) -> Self {
        Client {
            // Redacted by the library already; once more costs nothing
            // and keeps a password out of `repr` whatever changes there.
            url: fencelock::redact_url(lock.url()),
            backend: lock.backend_kind(),
            owner: Arc::new(Owner::here()),
            parts: Local::new(Parts {
                lock: Mutex::new(Some(lock)),
                leases: Arc::default(),
                closing: CancellationToken::new(),
            }),
        }
    }

    /// The client's parts and library client, while it may be used here.
    fn live(&self) -> Result<(&Parts, LockClient), Failure> {
        self.owner.check()?;
        let parts = self
            .parts
            .get()
            .ok_or_else(|| self.owner.origin().forked())?;
        let lock = parts
            .lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| Failure::Closed("the client was closed".into()))?;
        Ok((parts, lock))
    }

    /// An acquisition, waiting as the options say: forever for
    /// `wait=None`, one attempt for `wait=0`.
    fn acquiring(
        &self,
        name: &Bound<'_, PyAny>,
        options: &Bound<'_, PyAny>,
        on_lost: Option<LoopCall>,
    ) -> Result<impl Future<Output = Result<Lease, Failure>> + Send + 'static, Failure> {
        let (parts, client) = self.live()?;
        let name = args::text(name, "lock name")?;
        let opts = options::lock_options(client.options(), options)?;
        let (leases, closing) = (parts.leases.clone(), parts.closing.clone());
        Ok(async move {
            // Dropped with this future when the caller is cancelled, or
            // when the client is closed: the library then leaves no queue
            // entry behind.
            let acquire = async {
                if opts.wait_value().is_zero() {
                    client.try_acquire_owned(name, opts).await
                } else {
                    client.acquire_owned(name, opts).await
                }
            };
            let lease = tokio::select! {
                () = closing.cancelled() => {
                    return Err(Failure::Closed(
                        "the client was closed while the lock was being acquired".into(),
                    ));
                }
                lease = acquire => lease?,
            };
            let lease = Lease::adopt(lease, &leases)?;
            if let Some(on_lost) = on_lost {
                lease.watch(on_lost);
            }
            Ok(lease)
        })
    }

    fn revoking(
        &self,
        name: &Bound<'_, PyAny>,
        options: &Bound<'_, PyAny>,
        resources: &Bound<'_, PyAny>,
    ) -> Result<impl Future<Output = Result<Revoked, Failure>> + Send + 'static, Failure> {
        let (_, client) = self.live()?;
        let name = args::text(name, "lock name")?;
        let opts = options::lock_options(client.options(), options)?;
        let items = resources.try_iter().map_err(|_| {
            Failure::Invalid(format!(
                "resources must be a list of FencedHash or FencedKey, not {}",
                args::type_name(resources)
            ))
        })?;
        let targets = items
            .map(|item| {
                let item = item.map_err(|e| {
                    Failure::Invalid(format!("the resources could not be iterated: {e}"))
                })?;
                SealTarget::of(&item)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(revoke::revoke(client, name, opts, targets))
    }

    /// Closes: marks the client closed, ends the acquisitions still
    /// waiting, takes its library client and its live leases, and returns
    /// what is left to do: release those leases
    /// (each as a task of its own, so an interrupted close still releases
    /// them), wait for the background clean-ups, let go of the
    /// connection. In a forked child nothing is sent: the parent's
    /// connection and leases are the parent's.
    fn closing(
        &self,
        py: Python<'_>,
    ) -> Result<impl Future<Output = Result<(), Failure>> + Send + 'static, Failure> {
        self.owner.close();
        let runtime = runtime::handle(py)?;
        let (lock, releases) = match self.parts.get() {
            Some(parts) => {
                parts.closing.cancel();
                let lock = parts
                    .lock
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                let releases: Vec<_> = parts
                    .leases
                    .close()
                    .iter()
                    .filter_map(|cell| cell.release(&runtime))
                    .collect();
                (lock, releases)
            }
            None => (None, Vec::new()),
        };
        Ok(async move {
            for release in releases {
                // A release that fails leaves its lock to expire by its
                // ttl; closing goes on.
                let _ = released(release.await);
            }
            if let Some(lock) = lock {
                let _ = tokio::time::timeout(FLUSH_LIMIT, lock.flush()).await;
                // Dropped here, on the runtime, where its connections'
                // tasks live.
                drop(lock);
            }
            Ok(())
        })
    }
}

#[pymethods]
impl Client {
    /// The URL with any password replaced by `***`.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// `"redis"` or `"etcd"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// True once closed, or in a process other than the one that
    /// connected it.
    #[getter]
    fn closed(&self) -> bool {
        self.owner.is_closed() || !self.owner.origin().is_here()
    }

    /// Acquires `name` (an awaitable `Lease`). `on_lost`, a callable,
    /// is called with no arguments on the running event loop if the lease
    /// is lost before it is released (as `Lease.lost()` completes, without
    /// a future).
    #[pyo3(signature = (name, options, on_lost=None))]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        options: &Bound<'py, PyAny>,
        on_lost: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let on_lost = on_lost
            .map(|callback| LoopCall::on_running_loop(py, callback))
            .transpose()?;
        future_into_py(py, self.acquiring(name, options, on_lost)?)
    }

    /// Acquires `name`, blocking.
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        options: &Bound<'_, PyAny>,
    ) -> PyResult<Lease> {
        blocking::run(py, self.acquiring(name, options, None)?)
    }

    /// A fenced Redis hash at `key`.
    fn fenced_hash(&self, key: &Bound<'_, PyAny>) -> PyResult<FencedHash> {
        let (_, client) = self.live()?;
        let key = args::text(key, "resource key")?;
        if client.backend_kind() != "redis" {
            return Err(Failure::Invalid(format!(
                "fenced hashes live in Redis, but this client is connected to {}: use fenced_key for a fenced etcd key (or a Redis client for the hash)",
                client.backend_kind()
            ))
            .into());
        }
        let hash = client.fenced_hash(&key).map_err(Failure::from)?;
        Ok(FencedHash::new(self.owner.clone(), hash))
    }

    /// A fenced etcd key at `key`.
    fn fenced_key(&self, key: &Bound<'_, PyAny>) -> PyResult<FencedKey> {
        let (_, client) = self.live()?;
        let key = args::text(key, "resource key")?;
        if client.backend_kind() != "etcd" {
            return Err(Failure::Invalid(format!(
                "fenced keys live in etcd, but this client is connected to {}: use fenced_hash for a fenced Redis hash",
                client.backend_kind()
            ))
            .into());
        }
        let etcd_key = client.fenced_key(&key).map_err(Failure::from)?;
        Ok(FencedKey::new(self.owner.clone(), etcd_key))
    }

    /// Revokes `name` and seals `resources` (an awaitable `Revoked`).
    fn revoke<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        options: &Bound<'py, PyAny>,
        resources: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        future_into_py(py, self.revoking(name, options, resources)?)
    }

    /// Revokes `name` and seals `resources`, blocking.
    fn revoke_blocking(
        &self,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        options: &Bound<'_, PyAny>,
        resources: &Bound<'_, PyAny>,
    ) -> PyResult<Revoked> {
        blocking::run(py, self.revoking(name, options, resources)?)
    }

    /// Releases the leases still held through this client, then closes
    /// it. Idempotent.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        future_into_py(py, self.closing(py)?)
    }

    /// `close`, blocking.
    fn close_blocking(&self, py: Python<'_>) -> PyResult<()> {
        blocking::run(py, self.closing(py)?)
    }

    fn __repr__(&self) -> String {
        let closed = if self.closed() { " closed" } else { "" };
        format!(
            "<fencelock.Client backend={} url={}{closed}>",
            self.backend, self.url
        )
    }
}
