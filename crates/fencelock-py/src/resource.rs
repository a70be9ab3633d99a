//! The fenced resources: `FencedHash` (Redis) and `FencedKey` (etcd), the
//! same methods over the library's two types ([`Store`]), and what their
//! reads return (`HashState`, `ValidatedRead`).
//!
//! A resource belongs to its client: once the client is closed, or in a
//! forked child, its methods raise `ClientClosed`. Writes are sent even
//! for a lease known to be lost: the resource decides by the fence.

use std::future::Future;
use std::sync::Arc;

use fencelock::{Fence, Sealable, WriteOutcome};
use pyo3::prelude::*;

use crate::args::{self, shown};
use crate::blocking;
use crate::bridge::future_into_py;
use crate::errors::Failure;
use crate::lease::Lease;
use crate::process::{Local, Owner};

/// What a fenced resource holds.
#[pyclass(frozen, module = "fencelock._native", name = "HashState")]
#[derive(Debug, Clone)]
pub(crate) struct HashState {
    /// The value of the last accepted write.
    #[pyo3(get)]
    value: Option<String>,
    /// The fence of the last accepted write (or seal).
    #[pyo3(get)]
    fence: Option<u64>,
    /// The public holder id of its writer.
    #[pyo3(get)]
    holder: Option<String>,
}

#[pymethods]
impl HashState {
    fn __repr__(&self) -> String {
        format!(
            "HashState(value={}, fence={}, holder={})",
            optional(self.value.as_deref().map(shown)),
            optional(self.fence),
            optional(self.holder.as_deref().map(shown)),
        )
    }
}

/// A read checked against a lease's fence (a reader's write epoch).
#[pyclass(frozen, module = "fencelock._native", name = "ValidatedRead")]
#[derive(Debug, Clone)]
pub(crate) struct ValidatedRead {
    /// True when no write with a later fence had been accepted.
    #[pyo3(get)]
    clean: bool,
    /// The value read (check `clean` before acting on it).
    #[pyo3(get)]
    value: Option<String>,
    /// The fence the resource stored.
    #[pyo3(get)]
    fence: Option<u64>,
}

#[pymethods]
impl ValidatedRead {
    fn __repr__(&self) -> String {
        format!(
            "ValidatedRead(clean={}, value={}, fence={})",
            if self.clean { "True" } else { "False" },
            optional(self.value.as_deref().map(shown)),
            optional(self.fence),
        )
    }
}

/// `value` as Python shows it, `None` for none.
fn optional(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "None".to_owned(), |v| v.to_string())
}

/// A read's three fields, from either resource's state.
fn state(value: Option<String>, fence: Option<Fence>, holder: Option<String>) -> HashState {
    HashState {
        value,
        fence: fence.map(Fence::get),
        holder,
    }
}

/// A validated read's fields.
fn validated(clean: bool, value: Option<String>, fence: Option<Fence>) -> ValidatedRead {
    ValidatedRead {
        clean,
        value,
        fence: fence.map(Fence::get),
    }
}

/// The library's fenced resources as the bindings use them: owned
/// futures (a call outlives the Python method that starts it).
trait Store: Clone + Send + Sync + 'static {
    fn key(&self) -> &str;
    fn slot_number(&self) -> Option<u32>;
    fn slot(&self, slot: u32) -> Self;
    fn write(
        self,
        fence: Fence,
        token: String,
        value: String,
    ) -> impl Future<Output = fencelock::Result<WriteOutcome>> + Send + 'static;
    fn register(
        self,
        fence: Fence,
        token: String,
    ) -> impl Future<Output = fencelock::Result<WriteOutcome>> + Send + 'static;
    fn read(self) -> impl Future<Output = fencelock::Result<HashState>> + Send + 'static;
    /// The read and whether it is clean against `epoch`.
    fn read_validated(
        self,
        epoch: Fence,
    ) -> impl Future<Output = fencelock::Result<ValidatedRead>> + Send + 'static;
}

/// `Store` for a library resource: `FencedHash` and `FencedKey` have the
/// same methods under the same names, but no trait in common.
macro_rules! store_for {
    ($resource:ty) => {
        impl Store for $resource {
            fn key(&self) -> &str {
                <$resource>::key(self)
            }

            fn slot_number(&self) -> Option<u32> {
                <$resource>::slot_number(self)
            }

            fn slot(&self, slot: u32) -> Self {
                <$resource>::slot(self, slot)
            }

            async fn write(
                self,
                fence: Fence,
                token: String,
                value: String,
            ) -> fencelock::Result<WriteOutcome> {
                <$resource>::write(&self, fence, &token, &value).await
            }

            async fn register(
                self,
                fence: Fence,
                token: String,
            ) -> fencelock::Result<WriteOutcome> {
                <$resource>::register(&self, fence, &token).await
            }

            async fn read(self) -> fencelock::Result<HashState> {
                let read = <$resource>::read(&self).await?;
                Ok(state(read.value, read.fence, read.holder))
            }

            async fn read_validated(self, epoch: Fence) -> fencelock::Result<ValidatedRead> {
                let read = <$resource>::read_validated(&self, epoch).await?;
                let clean = read.is_clean();
                let read = read.into_value();
                Ok(validated(clean, read.value, read.fence))
            }
        }
    };
}

store_for!(fencelock::FencedHash);
store_for!(fencelock::FencedKey);

/// One resource of a client: its key and slot (plain data, readable in
/// any process), the library's value (in its process only), and the
/// client's state of use.
#[derive(Debug)]
struct Resource<S> {
    key: String,
    slot: Option<u32>,
    owner: Arc<Owner>,
    store: Local<S>,
}

/// The futures below are `Send + 'static`: they own clones of the store
/// and the lease's fence and token.
impl<S: Store> Resource<S> {
    fn new(owner: Arc<Owner>, store: S) -> Self {
        Resource {
            key: store.key().to_owned(),
            slot: store.slot_number(),
            owner,
            store: Local::new(store),
        }
    }

    /// The store, while its client may be used here.
    fn live(&self) -> Result<S, Failure> {
        self.owner.check()?;
        self.store
            .get()
            .cloned()
            .ok_or_else(|| self.store.origin().forked())
    }

    fn slot(&self, slot: &Bound<'_, PyAny>) -> Result<Self, Failure> {
        let slot = args::integer::<u32>(slot, |problem| {
            Failure::Invalid(format!("invalid slot: {problem}"))
        })?;
        Ok(Resource::new(self.owner.clone(), self.live()?.slot(slot)))
    }

    fn write(
        &self,
        lease: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> Result<impl Future<Output = Result<bool, Failure>> + Send + 'static, Failure> {
        let store = self.live()?;
        let (fence, token) = credentials(lease)?;
        let value = args::text(value, "value")?;
        Ok(async move { Ok(store.write(fence, token, value).await?.is_accepted()) })
    }

    fn register(
        &self,
        lease: &Bound<'_, PyAny>,
    ) -> Result<impl Future<Output = Result<bool, Failure>> + Send + 'static, Failure> {
        let store = self.live()?;
        let (fence, token) = credentials(lease)?;
        Ok(async move { Ok(store.register(fence, token).await?.is_accepted()) })
    }

    fn read(
        &self,
    ) -> Result<impl Future<Output = Result<HashState, Failure>> + Send + 'static, Failure> {
        let store = self.live()?;
        Ok(async move { Ok(store.read().await?) })
    }

    /// The read, checked against the lease's fence (a reader's write
    /// epoch) by the library.
    fn read_validated(
        &self,
        lease: &Bound<'_, PyAny>,
    ) -> Result<impl Future<Output = Result<ValidatedRead, Failure>> + Send + 'static, Failure>
    {
        let store = self.live()?;
        let (epoch, _) = credentials(lease)?;
        Ok(async move { Ok(store.read_validated(epoch).await?) })
    }

    fn describe(&self, class: &str) -> String {
        let slot = self.slot.map(|s| format!(" slot={s}")).unwrap_or_default();
        format!("<fencelock.{class} key={}{slot}>", shown(&self.key))
    }
}

/// A lease's fence and token, for a write.
fn credentials(lease: &Bound<'_, PyAny>) -> Result<(Fence, String), Failure> {
    match lease.cast::<Lease>() {
        Ok(lease) => Ok(lease.get().credentials()),
        Err(_) => Err(Failure::Invalid(format!(
            "expected a Lease, got {}",
            args::type_name(lease)
        ))),
    }
}

/// A resource for a revoke to seal.
#[derive(Debug)]
pub(crate) enum SealTarget {
    /// A Redis hash (or a slot of it); boxed, it is three times an etcd
    /// key's size.
    Hash(Box<fencelock::FencedHash>),
    /// An etcd key (or a slot of it).
    Key(fencelock::FencedKey),
}

impl SealTarget {
    /// The resource, as the library's revoke takes it.
    pub(crate) fn as_sealable(&self) -> &dyn Sealable {
        match self {
            SealTarget::Hash(hash) => hash.as_ref(),
            SealTarget::Key(key) => key,
        }
    }

    /// The resource in `value`, a `FencedHash` or `FencedKey` whose client
    /// may be used here.
    ///
    /// # Errors
    /// [`Failure::Invalid`] for anything else; [`Failure::Closed`].
    pub(crate) fn of(value: &Bound<'_, PyAny>) -> Result<Self, Failure> {
        if let Ok(hash) = value.cast::<FencedHash>() {
            return Ok(SealTarget::Hash(Box::new(hash.get().0.live()?)));
        }
        if let Ok(key) = value.cast::<FencedKey>() {
            return Ok(SealTarget::Key(key.get().0.live()?));
        }
        Err(Failure::Invalid(format!(
            "a revoke seals FencedHash and FencedKey resources, not {}",
            args::type_name(value)
        )))
    }
}

/// A fenced Redis hash.
#[pyclass(frozen, module = "fencelock._native", name = "FencedHash")]
#[derive(Debug)]
pub(crate) struct FencedHash(Resource<fencelock::FencedHash>);

impl FencedHash {
    /// `hash`, of the client whose state of use is `owner`.
    pub(crate) fn new(owner: Arc<Owner>, hash: fencelock::FencedHash) -> Self {
        FencedHash(Resource::new(owner, hash))
    }
}

/// A fenced etcd key.
#[pyclass(frozen, module = "fencelock._native", name = "FencedKey")]
#[derive(Debug)]
pub(crate) struct FencedKey(Resource<fencelock::FencedKey>);

impl FencedKey {
    /// `key`, of the client whose state of use is `owner`.
    pub(crate) fn new(owner: Arc<Owner>, key: fencelock::FencedKey) -> Self {
        FencedKey(Resource::new(owner, key))
    }
}

/// The Python methods of both resources: the same list, over
/// [`Resource`]'s methods.
macro_rules! resource_methods {
    ($class:ident) => {
        #[pymethods]
        impl $class {
            /// The key, as given.
            #[getter]
            fn key(&self) -> &str {
                &self.0.key
            }

            /// The slot of a slot view; `None` for the resource itself.
            #[getter]
            fn slot_number(&self) -> Option<u32> {
                self.0.slot
            }

            /// The view of `slot` (nothing is sent).
            fn slot(&self, slot: &Bound<'_, PyAny>) -> PyResult<Self> {
                Ok($class(self.0.slot(slot)?))
            }

            /// True accepted, false refused as stale.
            fn write<'py>(
                &self,
                py: Python<'py>,
                lease: &Bound<'py, PyAny>,
                value: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                future_into_py(py, self.0.write(lease, value)?)
            }

            /// `write`, blocking.
            fn write_blocking(
                &self,
                py: Python<'_>,
                lease: &Bound<'_, PyAny>,
                value: &Bound<'_, PyAny>,
            ) -> PyResult<bool> {
                blocking::run(py, self.0.write(lease, value)?)
            }

            /// Records the lease's fence without changing the value.
            fn register<'py>(
                &self,
                py: Python<'py>,
                lease: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                future_into_py(py, self.0.register(lease)?)
            }

            /// `register`, blocking.
            fn register_blocking(
                &self,
                py: Python<'_>,
                lease: &Bound<'_, PyAny>,
            ) -> PyResult<bool> {
                blocking::run(py, self.0.register(lease)?)
            }

            /// Reads value, fence and holder.
            fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                future_into_py(py, self.0.read()?)
            }

            /// `read`, blocking.
            fn read_blocking(&self, py: Python<'_>) -> PyResult<HashState> {
                blocking::run(py, self.0.read()?)
            }

            /// Reads, and checks the read against the lease's fence.
            fn read_validated<'py>(
                &self,
                py: Python<'py>,
                lease: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                future_into_py(py, self.0.read_validated(lease)?)
            }

            /// `read_validated`, blocking.
            fn read_validated_blocking(
                &self,
                py: Python<'_>,
                lease: &Bound<'_, PyAny>,
            ) -> PyResult<ValidatedRead> {
                blocking::run(py, self.0.read_validated(lease)?)
            }

            fn __repr__(&self) -> String {
                self.0.describe(stringify!($class))
            }
        }
    };
}

resource_methods!(FencedHash);
resource_methods!(FencedKey);
