//! TLS: the CA a client trusts and the certificate it presents (mutual TLS),
//! and what a failed handshake means, in words a person can act on.
//!
//! rustls runs with the ring provider only: fencelock installs it as the
//! process default when no provider is installed yet (an application that
//! installed its own keeps it).

use std::path::{Path, PathBuf};

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
    /// See [`TlsFiles::read`].
    pub(crate) fn certificates(&self, url: &str) -> Result<Option<TlsCertificates>> {
        if self.is_empty() {
            return Ok(None);
        }
        let pems = self.read(url)?;
        Ok(Some(TlsCertificates {
            client_tls: pems
                .client
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: pems.ca,
        }))
    }

    /// The files' PEM contents, checked: a CA file holds a certificate, a
    /// client certificate file a certificate, its key file a private key
    /// that belongs to that certificate. A file that fails these checks
    /// would otherwise fail later as a handshake error that blames the
    /// other side ("not signed by a CA this client trusts", a refused or
    /// dropped connection).
    ///
    /// # Errors
    /// [`Error::Tls`] (for `url`, shown without its password) naming the
    /// file that cannot be read or is wrong; [`Error::InvalidOption`] for a
    /// certificate given without its key (or the reverse).
    pub(crate) fn read(&self, url: &str) -> Result<Pems> {
        let bad = |detail: String| Error::Tls {
            url: url.to_owned(),
            detail,
        };
        let client = match (&self.cert, &self.key) {
            (Some(cert_path), Some(key_path)) => {
                let cert = read("client certificate", cert_path).map_err(bad)?;
                let key = read("client key", key_path).map_err(bad)?;
                check_client(&cert, cert_path, &key, key_path).map_err(bad)?;
                Some((cert, key))
            }
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
        let ca = match self.ca.as_deref() {
            Some(path) => {
                let ca = read("CA certificate", path).map_err(bad)?;
                certs_in(&ca, "CA certificate", path).map_err(bad)?;
                Some(ca)
            }
            None => None,
        };
        Ok(Pems { ca, client })
    }
}

/// The PEM contents of [`TlsFiles`], checked by [`TlsFiles::read`].
#[derive(Clone)]
pub(crate) struct Pems {
    /// The CA certificates to trust.
    pub(crate) ca: Option<Vec<u8>>,
    /// The client certificate and its key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

fn read(what: &str, path: &Path) -> std::result::Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} file {}: {e}", path.display()))
}

/// The certificates in the PEM `bytes` of the file `path`; an error naming
/// the file when it holds none.
fn certs_in(
    bytes: &[u8],
    what: &str,
    path: &Path,
) -> std::result::Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(bytes)
        .filter_map(std::result::Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(format!(
            "the {what} file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// Checks that the client certificate file holds a certificate, the key
/// file a private key, and that the key is the certificate's.
fn check_client(
    cert: &[u8],
    cert_path: &Path,
    key: &[u8],
    key_path: &Path,
) -> std::result::Result<(), String> {
    let chain = certs_in(cert, "client certificate", cert_path)?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
        format!(
            "the client key file {} holds no PEM private key (-----BEGIN PRIVATE KEY-----)",
            key_path.display()
        )
    })?;
    install_provider();
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()));
    match rustls::sign::CertifiedKey::from_der(chain, key, &provider) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => Err(format!(
            "the client key {} does not belong to the client certificate {} (give the key the certificate was made for)",
            key_path.display(),
            cert_path.display()
        )),
        Err(e) => Err(format!(
            "the client key {} cannot be used: {e}",
            key_path.display()
        )),
    }
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
    // Alerts the server sent: it refused the client's certificate. Checked
    // first, as they name things ("Expired") the client's own checks do.
    if let Some(alert) = [
        "UnknownCA",
        "BadCertificate",
        "CertificateUnknown",
        "AccessDenied",
    ]
    .into_iter()
    .find(|a| text.contains(&format!("alert: {a}")))
    {
        return Some(format!(
            "the server refused this client's certificate (alert {alert}): it is not signed by a CA the server trusts; give a certificate its CA signed (--tls-cert and --tls-key, or the builder's tls_client_cert)"
        ));
    }
    if text.contains("alert: CertificateExpired") {
        return Some(
            "the server refused this client's certificate: it has expired (--tls-cert)".to_owned(),
        );
    }
    if text.contains("alert: DecryptError") {
        return Some(
            "the server could not verify this client's certificate (alert DecryptError): --tls-key may not be the key of --tls-cert".to_owned(),
        );
    }
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
        let refused = problem("received fatal alert: UnknownCA").unwrap_or_default();
        assert!(
            refused.contains("refused this client's certificate"),
            "{refused}"
        );
        let expired = problem("received fatal alert: CertificateExpired").unwrap_or_default();
        assert!(expired.contains("this client's certificate"), "{expired}");
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let half = TlsFiles {
            cert: Some("c.pem".into()),
            ..TlsFiles::default()
        };
        assert!(matches!(
            half.certificates("rediss://h:1"),
            Err(Error::InvalidOption(_))
        ));
        let missing = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = missing
            .certificates("rediss://h:1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
