//! TLS (`rediss://`) against TLS-only servers with certificates made in the
//! test: the right CA works end to end (grants, renewals, wake-ups over a
//! TLS pub/sub connection, fenced writes); a CA the client does not trust,
//! an expired leaf, a leaf for another name, a plaintext URL to a TLS port,
//! a TLS URL to a plaintext port and a missing client certificate are each
//! refused with an error that says which (a TLS URL to a plaintext port can
//! only time out: the server never answers the TLS hello).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{Error, LockClient, ReleaseOutcome, WaitMode};
use fencelock_testkit::{ClientAuth, RedisConfig, RedisServer, ServerCert, TlsConfig};

fn tls_server(tls: TlsConfig) -> RedisServer {
    RedisServer::start_with(RedisConfig::default().with_tls(tls))
}

/// A client of `server` trusting its test CA.
async fn trusting(server: &RedisServer) -> Result<LockClient> {
    let files = server.tls_files().context("a TLS server")?;
    Ok(LockClient::builder(server.url())
        .tls_ca(&files.ca_cert)
        .connect()
        .await?)
}

/// `connect` fails with `Error::Tls` whose detail contains `what`.
async fn refused(builder: fencelock::LockClientBuilder, what: &str) -> Result<()> {
    match builder.connect().await {
        Err(Error::Tls { url, detail }) => {
            ensure!(detail.contains(what), "{detail}");
            ensure!(
                url.starts_with("rediss://") || url.starts_with("redis://"),
                "{url}"
            );
            Ok(())
        }
        Err(other) => bail!("expected a TLS error saying {what:?}, got {other}"),
        Ok(_) => bail!("connected although it should fail: {what}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_right_ca_works_end_to_end() -> Result<()> {
    let server = tls_server(TlsConfig::default());
    ensure!(server.url().starts_with("rediss://"));
    let holder = trusting(&server).await?;
    let waiter = trusting(&server).await?;
    let opts = holder.options().ttl(Duration::from_millis(600));
    let lease = holder.try_acquire("tls-job", &opts).await?;
    // A notify waiter subscribes over its own TLS connection and is woken
    // by the release long before the holder's lease would run out.
    let wait = waiter
        .options()
        .wait(Duration::from_secs(10))
        .wait_mode(WaitMode::Notify);
    let waiting = tokio::spawn(async move { waiter.acquire("tls-job", &wait).await });
    tokio::time::sleep(Duration::from_millis(900)).await; // renewals happen
    ensure!(!lease.is_lost(), "renewal over TLS failed");
    let hash = holder.fenced_hash("tls-job:data")?;
    ensure!(
        hash.write(lease.fence(), lease.token(), "v")
            .await?
            .is_accepted()
    );
    let released_at = tokio::time::Instant::now();
    ensure!(lease.release().await? == ReleaseOutcome::Released);
    let next = waiting.await??;
    ensure!(
        released_at.elapsed() < Duration::from_millis(500),
        "the waiter was not woken over TLS pub/sub"
    );
    ensure!(next.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn tls_with_an_untrusted_ca_an_expired_or_misnamed_leaf_is_refused() -> Result<()> {
    let trusted_elsewhere = tls_server(TlsConfig::default());
    let files = trusted_elsewhere.tls_files().context("TLS files")?;
    // No CA given: the system's roots do not know the test CA.
    refused(
        LockClient::builder(trusted_elsewhere.url()),
        "not signed by a CA",
    )
    .await?;
    // The wrong CA.
    refused(
        LockClient::builder(trusted_elsewhere.url()).tls_ca(&files.other_ca_cert),
        "not signed by a CA",
    )
    .await?;
    for (leaf, what) in [
        (ServerCert::Expired, "expired"),
        (ServerCert::WrongName, "not valid for this host name"),
    ] {
        let server = tls_server(TlsConfig::default().with_server_cert(leaf));
        let ca = &server.tls_files().context("TLS files")?.ca_cert;
        refused(LockClient::builder(server.url()).tls_ca(ca), what).await?;
    }
    Ok(())
}

#[tokio::test]
async fn plaintext_and_tls_urls_to_the_wrong_port_are_refused() -> Result<()> {
    let tls = tls_server(TlsConfig::default());
    let plain_url = tls.url().replacen("rediss://", "redis://", 1);
    let e = LockClient::connect(&plain_url)
        .await
        .err()
        .context("a plaintext client reached a TLS port")?;
    ensure!(
        e.to_string()
            .contains(&plain_url.trim_end_matches('/').replace("redis://", "")),
        "the error names the address: {e}"
    );
    // A plaintext server never answers a TLS hello: the connect fails, and
    // the client's plaintext PING to the same address finds a server there,
    // so the error says the port does not speak TLS (a configuration error),
    // naming the rediss:// URL.
    let plain = RedisServer::start();
    let tls_url = plain.url().replacen("redis://", "rediss://", 1);
    match LockClient::connect(&tls_url).await {
        Err(e @ Error::Tls { .. }) => {
            ensure!(e.is_config(), "{e}");
            ensure!(e.to_string().contains(&tls_url), "{e}");
            ensure!(e.to_string().contains("does not speak TLS"), "{e}");
        }
        other => bail!(
            "expected a TLS error naming {tls_url}, got {:?}",
            other.err()
        ),
    }
    Ok(())
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() -> Result<()> {
    let server = tls_server(TlsConfig::default().with_client_auth(ClientAuth::Required));
    let files = server.tls_files().context("TLS files")?.clone();
    let without = LockClient::builder(server.url())
        .tls_ca(&files.ca_cert)
        .connect()
        .await;
    ensure!(without.is_err(), "connected without a client certificate");
    let client = LockClient::builder(server.url())
        .tls_ca(&files.ca_cert)
        .tls_client_cert(&files.client_cert, &files.client_key)
        .connect()
        .await?;
    let lease = client.try_acquire("mtls", &client.options()).await?;
    ensure!(lease.release().await?.is_released());
    // A certificate without its key is refused before anything is sent.
    let half = LockClient::builder(server.url())
        .tls_ca(&files.ca_cert)
        .tls_client_cert(&files.client_cert, "/nonexistent/client.key")
        .connect()
        .await;
    match half {
        Err(e @ Error::Tls { .. }) => {
            ensure!(e.to_string().contains("/nonexistent/client.key"), "{e}")
        }
        other => bail!(
            "expected a TLS error naming the key file, got {:?}",
            other.err()
        ),
    }
    Ok(())
}
