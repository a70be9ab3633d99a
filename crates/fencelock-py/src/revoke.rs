//! `Client.revoke`: the library's revoke with the resources to seal, and
//! what it reports (`Revoked`, with a `Sealed` per resource).

use fencelock::{LockClient, LockOptions, Sealable, WriteOutcome};
use pyo3::prelude::*;

use crate::args::shown;
use crate::errors::Failure;
use crate::resource::SealTarget;

/// How one resource's seal came out.
#[pyclass(frozen, module = "fencelock._native", name = "Sealed")]
#[derive(Debug, Clone)]
pub(crate) struct Sealed {
    /// The resource (its key; `KEY slot N` for a slot view).
    #[pyo3(get)]
    resource: String,
    /// True: sealed at the revocation fence. False: a later holder had
    /// written with a greater fence already, which refuses the deposed
    /// holder as well.
    #[pyo3(get)]
    sealed: bool,
    /// The fence the resource records now.
    #[pyo3(get)]
    current_fence: Option<u64>,
}

#[pymethods]
impl Sealed {
    fn __repr__(&self) -> String {
        format!(
            "Sealed(resource={}, sealed={}, current_fence={})",
            shown(&self.resource),
            if self.sealed { "True" } else { "False" },
            self.current_fence
                .map_or_else(|| "None".to_owned(), |f| f.to_string())
        )
    }
}

/// What a revoke did.
#[pyclass(frozen, module = "fencelock._native", name = "Revoked")]
#[derive(Debug)]
pub(crate) struct Revoked {
    /// The lock's name.
    #[pyo3(get)]
    name: String,
    /// The revocation fence.
    #[pyo3(get)]
    fence: u64,
    /// The public holder id of the holder taken away (`None`: it was free).
    #[pyo3(get)]
    deposed_holder: Option<String>,
    /// Its fence, when the store tells.
    #[pyo3(get)]
    deposed_fence: Option<u64>,
    sealed: Vec<Sealed>,
}

#[pymethods]
impl Revoked {
    /// Each resource, in the order given.
    #[getter]
    fn sealed(&self) -> Vec<Sealed> {
        self.sealed.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Revoked(name={}, fence={}, deposed_holder={}, resources={})",
            shown(&self.name),
            self.fence,
            self.deposed_holder
                .as_deref()
                .map_or_else(|| "None".to_owned(), shown),
            self.sealed.len()
        )
    }
}

impl From<fencelock::Revoked> for Revoked {
    fn from(revoked: fencelock::Revoked) -> Self {
        let fence = revoked.fence;
        let sealed = revoked
            .sealed
            .into_iter()
            .map(|seal| {
                let (sealed, current_fence) = match seal.outcome {
                    WriteOutcome::Accepted => (true, Some(fence)),
                    WriteOutcome::Rejected { current_fence, .. } => (false, current_fence),
                    // Non-exhaustive: an outcome added later sealed
                    // nothing this code knows of.
                    _ => (false, None),
                };
                Sealed {
                    resource: seal.resource,
                    sealed,
                    current_fence: current_fence.map(fencelock::Fence::get),
                }
            })
            .collect();
        let (deposed_holder, deposed_fence) = match revoked.deposed {
            Some(deposed) => (
                Some(deposed.holder),
                deposed.fence.map(fencelock::Fence::get),
            ),
            None => (None, None),
        };
        Revoked {
            name: revoked.name,
            fence: fence.get(),
            deposed_holder,
            deposed_fence,
            sealed,
        }
    }
}

/// Revokes lock `name` and seals `targets` at the revocation fence.
pub(crate) async fn revoke(
    client: LockClient,
    name: String,
    opts: LockOptions,
    targets: Vec<SealTarget>,
) -> Result<Revoked, Failure> {
    let resources: Vec<&dyn Sealable> = targets.iter().map(SealTarget::as_sealable).collect();
    Ok(client.revoke(&name, &opts, &resources).await?.into())
}
