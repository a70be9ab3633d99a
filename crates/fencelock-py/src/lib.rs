//! `fencelock._native`: the Rust extension module behind the `fencelock`
//! Python package (`pip install ./crates/fencelock-py`, built by maturin).
//!
//! Users import `fencelock`, whose Python layer wraps these classes; the
//! API they implement is `python/fencelock/_native.pyi`, and the
//! exceptions they raise are `python/fencelock/_errors.py`'s.
//!
//! Three rules run through every file:
//!
//! - **No Python object in a call's future.** A call checks its
//!   arguments attached to Python, then runs as a `Send + 'static` future
//!   on this process's runtime; its result and its error
//!   (`errors::Failure`) become Python objects only when handed back, on
//!   the thread that receives them (`inbox`, `blocking`): no thread of the
//!   runtime attaches to Python.
//! - **One runtime per process.** After `os.fork()` the child never uses
//!   nor drops what the parent made: it gets a runtime of its own, and
//!   sees the parent's clients as closed and its leases as lost
//!   (`"forked"`).
//! - **Cancelling a wait cancels the call; nothing cancels a release.**
//!   A cancelled `acquire` (asyncio cancellation, or Ctrl-C in a blocking
//!   call) drops the library's future, which leaves no queue entry; a
//!   release runs as a task of its own to its end.
//!
//! ## Module map
//!
//! | module | concern |
//! |---|---|
//! | `client` | `Client`, `connect` / `connect_blocking`: acquisitions, resources, revokes, `close()` |
//! | `revoke` | the revoke call, `Revoked` and `Sealed` |
//! | `resource` | `FencedHash` and `FencedKey` over one trait, `HashState`, `ValidatedRead`; what a revoke seals |
//! | `lease` | `Lease` (identity, loss, `extend`, shielded `release`), the client's registry of live leases, `holder_id` |
//! | `options` | options dicts to `LockOptions` and the client builder, every refusal naming its key |
//! | `args` | `str` and integer arguments, refused as `InvalidInput` rather than `TypeError` |
//! | `blocking` | the `*_blocking` methods' wait: without the GIL, signals checked every 50 ms |
//! | `bridge` | Rust futures as asyncio futures: cancellation aborts the task, the result goes through the loop's inbox |
//! | `inbox` | what the runtime hands to an event loop (results, loss callbacks): queued without the GIL, settled by the loop's reader callback |
//! | `process` | what belongs to the process it was made in: `Origin`, `Local<T>` (lent there, leaked elsewhere), a client's `Owner` |
//! | `runtime` | the per-process tokio runtime |
//! | `errors` | `Failure` and its mapping onto `fencelock._errors` |
//!
//! Dependencies point down the table (`client` uses all below it,
//! `errors` none), with no import circle between files.

// The library's futures nest deeply (an extend goes through the engine,
// the store's pipelined call and a Sentinel failover's follow-up): their
// layout needs more than the default query depth, as in the library.
#![recursion_limit = "256"]

use pyo3::prelude::*;

mod args;
mod blocking;
mod bridge;
mod client;
mod errors;
mod inbox;
mod lease;
mod options;
mod process;
mod resource;
mod revoke;
mod runtime;

/// The module `fencelock._native`.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(client::connect, module)?)?;
    module.add_function(wrap_pyfunction!(client::connect_blocking, module)?)?;
    module.add_function(wrap_pyfunction!(lease::holder_id, module)?)?;
    module.add_function(wrap_pyfunction!(bridge::hop, module)?)?;
    module.add_class::<client::Client>()?;
    module.add_class::<lease::Lease>()?;
    module.add_class::<resource::HashState>()?;
    module.add_class::<resource::ValidatedRead>()?;
    module.add_class::<resource::FencedHash>()?;
    module.add_class::<resource::FencedKey>()?;
    module.add_class::<revoke::Sealed>()?;
    module.add_class::<revoke::Revoked>()?;
    Ok(())
}
