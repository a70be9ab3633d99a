//! Credentials, URLs and TLS files, against real servers:
//!
//! - a secret anywhere in a URL, well-formed or not (userinfo with or
//!   without a user, percent-encoded, non-ASCII, misspelt or unknown query
//!   parameters, a `db` that is no number, a bare word in the query), never
//!   reaches an error's `Display` or `Debug`, its sources, the builder's
//!   `Debug` or a log line, on every URL form;
//! - refused credentials are a configuration error ([`Error::is_config`],
//!   never retried) whatever the topology: one server, Sentinel (the data
//!   nodes' password and the sentinels' own), Cluster;
//! - TLS problems of the client's own files name the file (a CA file with
//!   no certificate, a key that is not the certificate's), and a handshake
//!   that fails names its cause (a client certificate of another CA, a TLS
//!   URL to a plaintext port).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{Error, LockClient, LockClientBuilder, Retry};
use fencelock_testkit::{
    ClientAuth, RedisCluster, RedisConfig, RedisSentinel, RedisSentinelConfig, RedisServer,
    TestCerts, TlsConfig, free_port,
};

/// The part every secret of the sweep shares: no output may contain it.
const STEM: &str = "Zq9Xw";

/// Log lines, collected for the sweep.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// An error, its `Debug` and every source, as one text.
fn everything_of(e: &Error) -> String {
    let mut text = format!("{e}\n{e:?}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!("\n{s}\n{s:?}"));
        source = s.source();
    }
    text
}

fn quick(url: &str) -> LockClientBuilder {
    LockClient::builder(url)
        .connect_timeout(Duration::from_millis(400))
        .response_timeout(Duration::from_millis(600))
}

/// URLs of every form with a secret (containing [`STEM`]) in every place
/// one can sit, well-formed or by mistake. `redis` is a server that
/// requires a password (so credentials are checked and refused), `closed`
/// a port where nothing listens.
pub(crate) fn secret_urls(redis: &str, closed: u16, sock: &str) -> Vec<String> {
    let s = format!("{STEM}-s3cret");
    let encoded = format!("{STEM}%2Ds3cr%C3%A9t");
    let unicode = format!("{STEM}-pässwört");
    let c = format!("127.0.0.1:{closed}");
    vec![
        format!("redis://:{s}@{redis}"),
        format!("redis://alice:{s}@{redis}"),
        format!("redis://{s}@{redis}"),
        format!("redis://:{encoded}@{redis}/0"),
        format!("redis://alice:{unicode}@{redis}"),
        format!("redis://{redis}/?pasword={s}"),
        format!("redis://{redis}/?password={s}"),
        format!("redis://{redis}/?{s}"),
        format!("redis://{redis}/{s}"),
        format!("redis://{redis}/0#{s}"),
        format!("redis://:a/b?{s}#x@{redis}"),
        format!("rediss://:{s}@{redis}"),
        format!("rediss://{s}@{c}"),
        format!("unix://{sock}?pass={s}"),
        format!("unix://{sock}?password={s}"),
        format!("redis+unix://{sock}?db={s}"),
        format!("redis+sentinel://:{s}@{c}/mymaster?sentinel_password={s}"),
        format!("redis+sentinel://{s}@{c}/mymaster"),
        format!("redis+sentinel://{c}/mymaster?sentinel_pasword={s}"),
        format!("redis+sentinel://{c}/mymaster?db={s}"),
        format!("redis+sentinel://{c}/mymaster?{s}"),
        format!("redis+sentinel://:{s}@{c}"),
        format!("rediss+sentinel://alice:{encoded}@{c}/m"),
        format!("redis+cluster://:{s}@{c}"),
        format!("redis+cluster://{s}@{c}"),
        format!("redis+cluster://{c}?pasword={s}"),
        format!("rediss+cluster://alice:{unicode}@{c}"),
        format!("etcd://root:{s}@{c}"),
        format!("etcd://{s}@{c}"),
        format!("etcd://{c}?auth={s}"),
        format!("etcd://{c}?token={s}"),
        format!("etcd://{c}?{s}"),
        format!("etcds://root:{encoded}@{c}"),
        format!("bogus://:{s}@{c}"),
        format!("{s}"),
    ]
}

/// Every URL of [`secret_urls`] fails without showing its secret: not in
/// the error (`Display`, `Debug`, sources), the builder's `Debug`, nor any
/// log line.
#[tokio::test]
async fn secrets_in_every_url_form_never_reach_errors_debug_or_logs() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_password("right-pw"));
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("nothing.sock");
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    for url in secret_urls(&server.addr(), free_port(), &sock.display().to_string()) {
        let builder = quick(&url).tls_ca(dir.path().join("none.pem"));
        let debug = format!("{builder:?}");
        ensure!(!debug.contains(STEM), "builder Debug of {url}: {debug}");
        let plain = quick(&url).connect().await;
        let e = plain.err().with_context(|| format!("{url} connected"))?;
        let text = everything_of(&e);
        ensure!(!text.contains(STEM), "{url}: {text}");
        let e = builder.connect().await.err().context("connected")?;
        let text = everything_of(&e);
        ensure!(!text.contains(STEM), "{url} with TLS files: {text}");
    }
    // A password-only userinfo is refused as credentials: a configuration
    // error, not an outage.
    let e = quick(&format!("redis://{STEM}@{}", server.addr()))
        .connect()
        .await
        .err()
        .context("connected without the password")?;
    ensure!(e.is_config() && e.retry() == Retry::Never, "{e:?}");
    let logged = String::from_utf8_lossy(&logs.0.lock().map_err(|_| anyhow::anyhow!("poisoned"))?)
        .into_owned();
    ensure!(!logged.contains(STEM), "a log line: {logged}");
    Ok(())
}

/// A misspelt or unknown parameter is named (never its value) and refused
/// before anything is sent: redis-rs would ignore it and connect without
/// the password.
#[tokio::test]
async fn unknown_url_parameters_are_named_without_their_value() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_password("right-pw"));
    for (url, name) in [
        (
            format!("redis://{}/?pasword=right-pw", server.addr()),
            "\"pasword\"",
        ),
        (
            format!("redis://{}/?password=right-pw", server.addr()),
            "\"password\"",
        ),
        (
            "redis+sentinel://127.0.0.1:1/m?sentinel_pasword=right-pw".to_owned(),
            "\"sentinel_pasword\"",
        ),
        (
            "redis+sentinel://127.0.0.1:1/m?db=right-pw".to_owned(),
            "db parameter",
        ),
        ("etcd://127.0.0.1:1?token=right-pw".to_owned(), "\"token\""),
        ("etcd://127.0.0.1:1?auth=right-pw".to_owned(), "\"auth\""),
    ] {
        let e = LockClient::connect(&url).await.err().context(url.clone())?;
        let text = e.to_string();
        ensure!(e.is_invalid_input(), "{url}: {e:?}");
        ensure!(
            text.contains(name) && !text.contains("right-pw"),
            "{url}: {text}"
        );
    }
    Ok(())
}

/// A wrong password for the data nodes and a wrong one for the sentinels
/// (an ACL user of theirs) are configuration errors, like on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_refused_passwords_are_configuration_errors() -> Result<()> {
    let setup = RedisSentinel::start_with(
        RedisSentinelConfig {
            replicas: 1,
            sentinels: 1,
            quorum: 1,
            ..RedisSentinelConfig::default()
        }
        .with_data(RedisConfig::default().with_password("data-pw")),
    );
    setup
        .sentinel(0)
        .cmd(&["ACL", "SETUSER", "watcher", "on", ">watch-pw", "+@all"]);
    let hosts = setup.sentinel_addrs().join(",");
    let master = setup.master_name();
    let good = format!("redis+sentinel://:data-pw@{hosts}/{master}");
    let client = LockClient::connect(&good).await?;
    let lease = client.try_acquire("x", &client.options()).await?;
    ensure!(lease.release().await?.is_released());
    for url in [
        format!("redis+sentinel://:wrong-pw@{hosts}/{master}"),
        format!("redis+sentinel://{hosts}/{master}"),
        format!(
            "redis+sentinel://:data-pw@{hosts}/{master}?sentinel_user=watcher&sentinel_password=wrong-pw"
        ),
    ] {
        let e = quick(&url).connect().await.err().context(url.clone())?;
        ensure!(
            e.is_config() && e.retry() == Retry::Never,
            "{url}: {e} ({e:?})"
        );
        ensure!(matches!(e, Error::Auth { .. }), "{url}: {e:?}");
        ensure!(!everything_of(&e).contains("wrong-pw"), "{e:?}");
    }
    Ok(())
}

/// A wrong password for a Cluster's ACL user is a configuration error,
/// through `redis+cluster://` and through a node's `redis://` URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refused_password_is_a_configuration_error() -> Result<()> {
    let cluster = RedisCluster::start();
    for node in cluster.nodes() {
        node.cmd(&[
            "ACL",
            "SETUSER",
            "alice",
            "on",
            ">alice-pw",
            "~*",
            "&*",
            "+@all",
        ]);
    }
    let seeds = cluster
        .nodes()
        .iter()
        .map(RedisServer::addr)
        .collect::<Vec<_>>()
        .join(",");
    let good = format!("redis+cluster://alice:alice-pw@{seeds}");
    let client = LockClient::connect(&good).await?;
    let lease = client.try_acquire("x", &client.options()).await?;
    ensure!(lease.release().await?.is_released());
    for url in [
        format!("redis+cluster://alice:wrong-pw@{seeds}"),
        format!("redis+cluster://nobody:wrong-pw@{seeds}"),
        format!("redis://alice:wrong-pw@{}", cluster.node(0).addr()),
    ] {
        let e = quick(&url).connect().await.err().context(url.clone())?;
        ensure!(
            e.is_config() && e.retry() == Retry::Never,
            "{url}: {e} ({e:?})"
        );
        ensure!(matches!(e, Error::Auth { .. }), "{url}: {e:?}");
        ensure!(!everything_of(&e).contains("wrong-pw"), "{e:?}");
    }
    Ok(())
}

/// The client's own TLS files are checked before any handshake, and a
/// handshake that fails names its cause; all are configuration errors.
#[tokio::test]
async fn tls_problems_name_their_cause() -> Result<()> {
    let certs = TestCerts::generate();
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_tls(TlsConfig::with_certs(certs.clone()).with_client_auth(ClientAuth::Required)),
    );
    let files = server.tls_files().context("TLS files")?.clone();
    let dir = tempfile::tempdir()?;
    let write = |name: &str, text: &str| -> Result<std::path::PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    };
    let no_cert = write("no-cert.pem", &certs.client.key_pem)?;
    let other_cert = write("other.crt", &certs.client_other_ca.cert_pem)?;
    let other_key = write("other.key", &certs.client_other_ca.key_pem)?;
    let url = server.url();
    let connect = |builder: LockClientBuilder| async move {
        builder
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .err()
    };
    let cases = [
        (
            "a CA file with no certificate",
            LockClient::builder(&url)
                .tls_ca(&no_cert)
                .tls_client_cert(&files.client_cert, &files.client_key),
            "holds no PEM certificate",
        ),
        (
            "a key that is not the certificate's",
            LockClient::builder(&url)
                .tls_ca(&files.ca_cert)
                .tls_client_cert(&files.client_cert, &other_key),
            "does not belong to the client certificate",
        ),
        (
            "a client certificate of another CA",
            LockClient::builder(&url)
                .tls_ca(&files.ca_cert)
                .tls_client_cert(&other_cert, &other_key),
            "the server refused this client's certificate",
        ),
    ];
    for (what, builder, says) in cases {
        let e = connect(builder).await.context(what)?;
        ensure!(e.is_config(), "{what}: {e} ({e:?})");
        ensure!(e.to_string().contains(says), "{what}: {e}");
    }
    // A TLS URL to a plaintext port: named as such.
    let plain = RedisServer::start();
    let e = connect(LockClient::builder(format!("rediss://{}", plain.addr())))
        .await
        .context("TLS to a plaintext port")?;
    ensure!(e.is_config(), "{e} ({e:?})");
    ensure!(e.to_string().contains("does not speak TLS"), "{e}");
    Ok(())
}
