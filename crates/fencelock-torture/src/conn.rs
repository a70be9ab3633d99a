//! Every connection of a run to Redis or etcd, opened through fencelock's
//! own client: the same URL forms (`redis://`, `rediss://`, `unix://`,
//! `redis+sentinel://`, `redis+cluster://`, `etcd://`, `etcds://`), the
//! same TLS files ([`Tls`]), Sentinel failovers and Cluster routing as
//! every other command. The run's own data (the audited resource, the
//! negative controls' scripts, the clean-up) goes through the client's
//! connection as a [`RawConnection`], whose calls are sent once: an
//! audited write is never repeated behind the run's back.

use std::path::PathBuf;
use std::time::Duration;

use fencelock::testing::RawConnection;
use fencelock::{LockClient, LockClientBuilder};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The TLS files every connection of a run uses (the CLI's `--tls-ca`,
/// `--tls-cert` and `--tls-key`); none: the system's roots, no client
/// certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Tls {
    /// CA certificate (PEM) to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate and its key (PEM), for servers that require one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl Tls {
    /// No TLS files.
    pub fn new() -> Self {
        Tls::default()
    }

    /// Trusts the CA in `path` (PEM).
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Presents the client certificate `cert` with its key `key` (PEM).
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// A client builder for `url` with these files.
    pub(crate) fn builder(&self, url: &str) -> LockClientBuilder {
        let mut builder = LockClient::builder(url);
        if let Some(ca) = &self.ca {
            builder = builder.tls_ca(ca);
        }
        if let Some((cert, key)) = &self.client_cert {
            builder = builder.tls_client_cert(cert, key);
        }
        builder
    }
}

/// A Redis client for `url` and its raw connection (calls time out after
/// two seconds: a write that does not answer is an unknown outcome, not a
/// stalled worker).
pub(crate) async fn raw(url: &str, tls: &Tls) -> Result<(LockClient, RawConnection)> {
    let client = tls
        .builder(url)
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| Error::connect(&e))?;
    let conn = RawConnection::of(&client).map_err(|e| Error::usage(e.to_string()))?;
    Ok((client, conn))
}
