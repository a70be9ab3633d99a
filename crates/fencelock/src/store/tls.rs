//! TLS: the CA a client trusts and the certificate it presents (mutual TLS),
//! and what a failed handshake means, in words a person can act on.
//!
//! rustls runs with the ring provider only: fencelock installs it as the
//! process default when no provider is installed yet (an application that
//! installed its own keeps it).

use std::path::{Path, PathBuf};

use redis::{ClientTlsConfig, TlsCertificates};

use crate::error::{Error, Result};

/// TLS files given to a client: a CA to trust instead of the system's roots,
/// and a client certificate and key for servers that require one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether no file was given (the system's roots, no client certificate).
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The certificates read from the files, or `None` when none was given.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the file that cannot be read, or a
    /// certificate given without its key (or the reverse).
    pub(crate) fn certificates(&self) -> Result<Option<TlsCertificates>> {
        if self.is_empty() {
            return Ok(None);
        }
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read("client certificate", cert)?,
                client_key: read("client key", key)?,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(Error::InvalidOption(
                    "a TLS client certificate needs its key too (tls key / --tls-key)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(Error::InvalidOption(
                    "a TLS client key needs its certificate too (tls cert / --tls-cert)".into(),
                ));
            }
        };
        let root_cert = self
            .ca
            .as_deref()
            .map(|ca| read("CA certificate", ca))
            .transpose()?;
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::InvalidOption(format!(
            "cannot read the TLS {what} file {}: {e}",
            path.display()
        ))
    })
}

/// Installs rustls's ring provider as the process default, unless a provider
/// is installed already.
pub(crate) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have won the race: either way one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// What a TLS failure described by `text` (a client library's error) means
/// and what to do, if it is one.
pub(crate) fn problem(text: &str) -> Option<String> {
    let cause = text
        .split_once("invalid peer certificate: ")
        .map_or(text, |(_, cause)| cause);
    if text.contains("UnknownIssuer") {
        return Some(
            "the server's certificate is not signed by a CA this client trusts: give its CA (--tls-ca, or the builder's tls_ca)"
                .to_owned(),
        );
    }
    if text.contains("certificate not valid for name") || text.contains("NotValidForName") {
        return Some(format!(
            "the server's certificate is not valid for this host name ({})",
            first_clause(cause)
        ));
    }
    if text.contains("certificate expired") || text.contains("Expired") {
        return Some(format!(
            "the server's certificate has expired ({})",
            first_clause(cause)
        ));
    }
    if text.contains("certificate not valid yet") || text.contains("NotValidYet") {
        return Some("the server's certificate is not valid yet (check the clocks)".to_owned());
    }
    if text.contains("CertificateRequired") || text.contains("HandshakeFailure") {
        return Some(
            "the server refused the handshake: it may require a client certificate (--tls-cert and --tls-key)"
                .to_owned(),
        );
    }
    if text.contains("InvalidContentType") || text.contains("corrupt message") {
        return Some(
            "the server does not speak TLS on this port: use redis:// instead of rediss://"
                .to_owned(),
        );
    }
    None
}

fn first_clause(text: &str) -> &str {
    text.split([';', '\n']).next().unwrap_or(text).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_failures_say_what_to_do() {
        let unknown = problem("invalid peer certificate: UnknownIssuer").unwrap_or_default();
        assert!(unknown.contains("--tls-ca"), "{unknown}");
        let name = problem(
            "invalid peer certificate: certificate not valid for name \"db.example\"; certificate is only valid for localhost",
        )
        .unwrap_or_default();
        assert!(
            name.contains("db.example") && name.contains("host name"),
            "{name}"
        );
        let expired = problem("invalid peer certificate: certificate expired: verification time 5 (UNIX), but certificate is not valid after 4 (1 seconds ago)").unwrap_or_default();
        assert!(expired.contains("expired"), "{expired}");
        assert!(problem("Connection refused (os error 111)").is_none());
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let half = TlsFiles {
            cert: Some("c.pem".into()),
            ..TlsFiles::default()
        };
        assert!(matches!(half.certificates(), Err(Error::InvalidOption(_))));
        let missing = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = missing
            .certificates()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
