//! TLS for a server's clients: [`ServerTls`] (the PEMs a server presents
//! and trusts, and whether it asks clients for a certificate:
//! [`ClientAuth`]), written into the server's directory as [`TlsPaths`].
//! Making certificates is the caller's business.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::files::write;

/// The subdirectory of a server's directory that holds its TLS files.
pub const TLS_DIR: &str = "tls";

/// Whether a TLS server asks clients for a certificate. The CA client
/// certificates must chain to is [`ServerTls::ca_pem`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// Plain server-authenticated TLS (`--tls-auth-clients no`).
    #[default]
    No,
    /// A certificate is checked if sent (`--tls-auth-clients optional`).
    Optional,
    /// Mutual TLS: clients without a valid certificate are refused
    /// (`--tls-auth-clients yes`, etcd's `--client-cert-auth`).
    Required,
}

impl ClientAuth {
    /// The value of redis-server's `--tls-auth-clients`.
    pub fn redis_arg(self) -> &'static str {
        match self {
            ClientAuth::No => "no",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "yes",
        }
    }
}

/// What a server listening on TLS presents and trusts, as PEM text.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct ServerTls {
    /// The CA to trust for client certificates (`ca.crt`).
    pub ca_pem: String,
    /// The certificate the server presents (`server.crt`).
    pub cert_pem: String,
    /// Its private key (`server.key`).
    pub key_pem: String,
    /// Whether clients must present a certificate.
    pub client_auth: ClientAuth,
    /// Further files for the TLS directory (name, contents): client
    /// certificates for the caller's own tools, say.
    pub extra_files: Vec<(String, String)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("client_auth", &self.client_auth)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Where a server's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// `tls/ca.crt`.
    pub ca: PathBuf,
    /// `tls/server.crt`.
    pub cert: PathBuf,
    /// `tls/server.key`.
    pub key: PathBuf,
}

impl TlsPaths {
    /// The paths in the server directory `dir`.
    pub fn in_dir(dir: &Path) -> TlsPaths {
        let tls = dir.join(TLS_DIR);
        TlsPaths {
            ca: tls.join("ca.crt"),
            cert: tls.join("server.crt"),
            key: tls.join("server.key"),
        }
    }
}

impl ServerTls {
    /// Writes every file into `dir/tls/`.
    ///
    /// # Errors
    ///
    /// [`crate::Error::File`] if a file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<TlsPaths> {
        let paths = TlsPaths::in_dir(dir);
        write(&paths.ca, self.ca_pem.as_bytes())?;
        write(&paths.cert, self.cert_pem.as_bytes())?;
        write(&paths.key, self.key_pem.as_bytes())?;
        for (name, contents) in &self.extra_files {
            write(&dir.join(TLS_DIR).join(name), contents.as_bytes())?;
        }
        Ok(paths)
    }
}
