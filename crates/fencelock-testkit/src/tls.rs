//! Test certificates for TLS servers, generated in the test with `rcgen`:
//! [`TestCerts`], and how a [`crate::RedisServer`] uses them: [`TlsConfig`]
//! ([`ServerCert`], [`ClientAuth`]) and [`TlsFiles`].
//!
//! [`TestCerts::generate`] makes a CA, a server leaf for `127.0.0.1`, `::1`
//! and `localhost`, a client leaf for mutual TLS, and bad variants for
//! negative tests: a second, unrelated CA with a server and a client leaf
//! of its own, an expired server and client leaf, and a server leaf for the
//! wrong name. Keys are ECDSA P-256, all in PEM. Generating the whole set
//! takes a few milliseconds.
//!
//! ```no_run
//! use fencelock_testkit::{ClientAuth, RedisConfig, RedisServer, TlsConfig};
//!
//! let server = RedisServer::start_with(
//!     RedisConfig::default().with_tls(TlsConfig::default().with_client_auth(ClientAuth::Required)),
//! );
//! assert!(server.url().starts_with("rediss://127.0.0.1:"));
//! let files = server.tls_files().expect("a TLS server");
//! // A client that trusts the CA and presents the client certificate:
//! let mut con = server.client().get_connection().expect("TLS connection");
//! let _: () = redis::cmd("PING").query(&mut con).expect("PING");
//! # let _ = (&files.ca_cert, &files.client_cert, &files.client_key);
//! ```
//!
//! # Crypto provider
//!
//! The testkit uses rustls with the `ring` provider only (no aws-lc), for
//! its own admin connections and for [`crate::RedisServer::client`].
//! redis-rs builds its rustls configurations from the process-wide default
//! provider, so the testkit installs ring as that default
//! ([`install_crypto_provider`]) before it opens any TLS connection. A test
//! that builds its own rustls configuration before touching the testkit
//! should call [`install_crypto_provider`] first; if another provider is
//! already installed, the testkit keeps it.

use std::path::{Path, PathBuf};

use fencelock_servers::tls::{ServerTls, TLS_DIR, TlsPaths};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Installs rustls' `ring` crypto provider as the process-wide default, once.
/// Does nothing if a default provider is already installed (by this
/// function, or by the test with another provider).
pub fn install_crypto_provider() {
    // `Err` means a provider is already installed: keep it.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKey {
    /// The certificate (`-----BEGIN CERTIFICATE-----`).
    pub cert_pem: String,
    /// Its PKCS#8 private key (`-----BEGIN PRIVATE KEY-----`).
    pub key_pem: String,
}

impl std::fmt::Debug for CertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey")
            .field("cert_pem", &format_args!("<{} bytes>", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A freshly generated set of test certificates: a CA and leaves it signed,
/// plus bad variants. Made by [`TestCerts::generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestCerts {
    /// The CA that signs the good leaves.
    pub ca: CertKey,
    /// A second CA, unrelated to [`TestCerts::ca`]: trusting it instead
    /// must fail.
    pub other_ca: CertKey,
    /// A server leaf signed by [`TestCerts::ca`] for `127.0.0.1`, `::1` and
    /// `localhost` (extended key usage: server auth).
    pub server: CertKey,
    /// A client leaf signed by [`TestCerts::ca`] (extended key usage:
    /// client auth), for mutual TLS.
    pub client: CertKey,
    /// A server leaf for the right names, signed by [`TestCerts::other_ca`].
    pub server_other_ca: CertKey,
    /// A server leaf for the right names, signed by [`TestCerts::ca`], that
    /// expired in 2001.
    pub server_expired: CertKey,
    /// A server leaf signed by [`TestCerts::ca`] for `wrong-name.invalid`
    /// only.
    pub server_wrong_name: CertKey,
    /// A client leaf signed by [`TestCerts::other_ca`].
    pub client_other_ca: CertKey,
    /// A client leaf signed by [`TestCerts::ca`] that expired in 2001.
    pub client_expired: CertKey,
}

/// The names the good server leaves are valid for.
const SERVER_NAMES: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

impl TestCerts {
    /// Generates the CA, the second CA and every leaf (ECDSA P-256).
    ///
    /// # Panics
    ///
    /// Panics if `rcgen` fails to generate a key or sign a certificate.
    pub fn generate() -> TestCerts {
        let (ca, ca_issuer) = make_ca("fencelock-testkit CA");
        let (other_ca, other_issuer) = make_ca("fencelock-testkit other CA");
        let server_names: Vec<String> = SERVER_NAMES.iter().map(|n| (*n).to_owned()).collect();
        TestCerts {
            server: make_leaf(&ca_issuer, Leaf::server(server_names.clone())),
            client: make_leaf(&ca_issuer, Leaf::client()),
            server_other_ca: make_leaf(&other_issuer, Leaf::server(server_names.clone())),
            server_expired: make_leaf(&ca_issuer, Leaf::server(server_names).expired()),
            server_wrong_name: make_leaf(
                &ca_issuer,
                Leaf::server(vec!["wrong-name.invalid".to_owned()]),
            ),
            client_other_ca: make_leaf(&other_issuer, Leaf::client()),
            client_expired: make_leaf(&ca_issuer, Leaf::client().expired()),
            ca,
            other_ca,
        }
    }

    /// The server leaf a [`ServerCert`] choice stands for.
    pub fn server_leaf(&self, choice: ServerCert) -> &CertKey {
        match choice {
            ServerCert::Valid => &self.server,
            ServerCert::OtherCa => &self.server_other_ca,
            ServerCert::Expired => &self.server_expired,
            ServerCert::WrongName => &self.server_wrong_name,
        }
    }

    /// A redis-rs [`redis::TlsCertificates`] that trusts `ca` (a CA
    /// certificate PEM, e.g. `&certs.ca.cert_pem`) and, if `client` is set,
    /// presents that client certificate.
    pub fn redis_tls(ca: &str, client: Option<&CertKey>) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: client.map(|client| redis::ClientTlsConfig {
                client_cert: client.cert_pem.clone().into_bytes(),
                client_key: client.key_pem.clone().into_bytes(),
            }),
            root_cert: Some(ca.as_bytes().to_vec()),
        }
    }
}

/// Which leaf a TLS server presents; anything but [`ServerCert::Valid`] must
/// be refused by a client that trusts [`TestCerts::ca`] and checks the name
/// `127.0.0.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerCert {
    /// [`TestCerts::server`].
    #[default]
    Valid,
    /// [`TestCerts::server_other_ca`].
    OtherCa,
    /// [`TestCerts::server_expired`].
    Expired,
    /// [`TestCerts::server_wrong_name`].
    WrongName,
}

/// Whether a TLS server asks clients for a certificate
/// (`--tls-auth-clients`); the testkit's default is [`ClientAuth::No`]
/// (Redis' own default is `yes`). The CA that client certificates must
/// chain to is [`TestCerts::ca`].
pub use fencelock_servers::ClientAuth;

/// How a [`crate::RedisServer`] listens on TLS; set with
/// [`crate::RedisConfig::with_tls`]. The server then listens only on TLS
/// (`--port 0 --tls-port P`). `TlsConfig::default()` generates fresh
/// [`TestCerts`], presents the valid server leaf and does not ask for client
/// certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificates; the server's directory gets them as files
    /// ([`TlsFiles`]).
    pub certs: TestCerts,
    /// Which leaf the server presents.
    pub server_cert: ServerCert,
    /// Whether the server asks clients for a certificate.
    pub client_auth: ClientAuth,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            certs: TestCerts::generate(),
            server_cert: ServerCert::Valid,
            client_auth: ClientAuth::No,
        }
    }
}

impl TlsConfig {
    /// A configuration using `certs` (for several servers that share a CA).
    pub fn with_certs(certs: TestCerts) -> Self {
        TlsConfig {
            certs,
            server_cert: ServerCert::Valid,
            client_auth: ClientAuth::No,
        }
    }

    /// Sets [`TlsConfig::server_cert`].
    pub fn with_server_cert(mut self, server_cert: ServerCert) -> Self {
        self.server_cert = server_cert;
        self
    }

    /// Sets [`TlsConfig::client_auth`].
    pub fn with_client_auth(mut self, client_auth: ClientAuth) -> Self {
        self.client_auth = client_auth;
        self
    }
}

/// The PEM files of a TLS [`crate::RedisServer`], in the `tls/`
/// subdirectory of its directory ([`crate::RedisServer::tls_files`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `ca.crt`: [`TestCerts::ca`], the CA clients should trust (also the
    /// server's `--tls-ca-cert-file`).
    pub ca_cert: PathBuf,
    /// `client.crt`: [`TestCerts::client`].
    pub client_cert: PathBuf,
    /// `client.key`: the key of [`TestCerts::client`].
    pub client_key: PathBuf,
    /// `server.crt`: the leaf the server presents ([`TlsConfig::server_cert`]).
    pub server_cert: PathBuf,
    /// `server.key`: its key.
    pub server_key: PathBuf,
    /// `other-ca.crt`: [`TestCerts::other_ca`], a CA clients must not trust.
    pub other_ca_cert: PathBuf,
}

impl TlsConfig {
    /// What `fencelock-servers` writes into the server's `tls/` directory:
    /// the CA and the chosen server leaf, plus the client leaf and the
    /// other CA for the test's own clients ([`TlsFiles`]).
    pub(crate) fn server_tls(&self) -> ServerTls {
        let leaf = self.certs.server_leaf(self.server_cert);
        ServerTls {
            ca_pem: self.certs.ca.cert_pem.clone(),
            cert_pem: leaf.cert_pem.clone(),
            key_pem: leaf.key_pem.clone(),
            client_auth: self.client_auth,
            extra_files: vec![
                (CLIENT_CERT.to_owned(), self.certs.client.cert_pem.clone()),
                (CLIENT_KEY.to_owned(), self.certs.client.key_pem.clone()),
                (OTHER_CA.to_owned(), self.certs.other_ca.cert_pem.clone()),
            ],
        }
    }
}

/// The client leaf's file in the `tls/` directory.
const CLIENT_CERT: &str = "client.crt";
/// Its key's.
const CLIENT_KEY: &str = "client.key";
/// The other CA's.
const OTHER_CA: &str = "other-ca.crt";

impl TlsFiles {
    /// The files [`TlsConfig::server_tls`] has written into the server
    /// directory `dir`.
    pub(crate) fn in_dir(dir: &Path) -> TlsFiles {
        let server = TlsPaths::in_dir(dir);
        let tls = dir.join(TLS_DIR);
        TlsFiles {
            ca_cert: server.ca,
            client_cert: tls.join(CLIENT_CERT),
            client_key: tls.join(CLIENT_KEY),
            server_cert: server.cert,
            server_key: server.key,
            other_ca_cert: tls.join(OTHER_CA),
        }
    }
}

/// The parameters of one leaf certificate.
struct Leaf {
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
    common_name: &'static str,
    expired: bool,
}

impl Leaf {
    fn server(names: Vec<String>) -> Leaf {
        Leaf {
            names,
            usage: ExtendedKeyUsagePurpose::ServerAuth,
            common_name: "fencelock-testkit server",
            expired: false,
        }
    }

    fn client() -> Leaf {
        Leaf {
            names: vec!["fencelock-testkit-client".to_owned()],
            usage: ExtendedKeyUsagePurpose::ClientAuth,
            common_name: "fencelock-testkit client",
            expired: false,
        }
    }

    fn expired(mut self) -> Leaf {
        self.expired = true;
        self
    }
}

fn generate_key() -> KeyPair {
    KeyPair::generate().unwrap_or_else(|error| panic!("rcgen failed to generate a key: {error}"))
}

fn make_ca(common_name: &str) -> (CertKey, Issuer<'static, KeyPair>) {
    let key = generate_key();
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params
        .self_signed(&key)
        .unwrap_or_else(|error| panic!("rcgen failed to self-sign {common_name}: {error}"));
    let cert_key = CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    };
    (cert_key, Issuer::new(params, key))
}

fn make_leaf(issuer: &Issuer<'_, KeyPair>, leaf: Leaf) -> CertKey {
    let key = generate_key();
    let mut params = CertificateParams::new(leaf.names.clone()).unwrap_or_else(|error| {
        panic!(
            "rcgen refused the subject alternative names {:?}: {error}",
            leaf.names
        )
    });
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, leaf.common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![leaf.usage];
    params.use_authority_key_identifier_extension = true;
    if leaf.expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let cert = params
        .signed_by(&key, issuer)
        .unwrap_or_else(|error| panic!("rcgen failed to sign a leaf certificate: {error}"));
    CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_distinct_pems() {
        let certs = TestCerts::generate();
        let all = [
            &certs.ca,
            &certs.other_ca,
            &certs.server,
            &certs.client,
            &certs.server_other_ca,
            &certs.server_expired,
            &certs.server_wrong_name,
            &certs.client_other_ca,
            &certs.client_expired,
        ];
        for (i, a) in all.iter().enumerate() {
            assert!(a.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
            assert!(a.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
            for b in &all[i + 1..] {
                assert_ne!(a.cert_pem, b.cert_pem);
            }
        }
        assert!(!format!("{:?}", certs.ca).contains("PRIVATE KEY"));
    }
}
