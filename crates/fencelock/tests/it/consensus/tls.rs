//! `etcds://`: TLS to etcd with the same CA and client certificate
//! settings as `rediss://`.

use anyhow::{Context, Result};
use fencelock::LockClient;
use fencelock_testkit::{ClientAuth, EtcdCluster, EtcdConfig, TlsConfig};

/// With the CA and a client certificate (mutual TLS), locks work over
/// `etcds://`; without the CA, or without the client certificate, connect
/// fails with a configuration error that says what to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_urls_use_the_tls_settings() -> Result<()> {
    let cluster = EtcdCluster::start_with(
        EtcdConfig::default()
            .with_members(1)
            .with_tls(TlsConfig::default().with_client_auth(ClientAuth::Required)),
    );
    let url = cluster.url();
    assert!(url.starts_with("etcds://"), "{url}");
    let files = cluster.tls_files().context("TLS files")?;
    let client = LockClient::builder(&url)
        .tls_ca(&files.ca_cert)
        .tls_client_cert(&files.client_cert, &files.client_key)
        .connect()
        .await?;
    let lease = client.acquire("secure", &client.options()).await?;
    assert!(lease.release().await?.is_released());

    let untrusted = LockClient::builder(&url)
        .tls_client_cert(&files.client_cert, &files.client_key)
        .connect()
        .await
        .err()
        .context("the server's CA is not trusted")?;
    // The handshake fails on the client (UnknownIssuer) or the server
    // answers with an alert or closes first: a TLS error, or a connection
    // error that names the TLS settings.
    assert!(
        untrusted.is_config() || untrusted.is_connection(),
        "{untrusted}"
    );
    assert!(untrusted.to_string().contains("--tls-ca"), "{untrusted}");

    let anonymous = LockClient::builder(&url)
        .tls_ca(&files.ca_cert)
        .connect()
        .await
        .err()
        .context("the server requires a client certificate")?;
    assert!(
        anonymous.is_config() || anonymous.is_connection(),
        "{anonymous}"
    );
    assert!(anonymous.to_string().contains("--tls-cert"), "{anonymous}");
    Ok(())
}
