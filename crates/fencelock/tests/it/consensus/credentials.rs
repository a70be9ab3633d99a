//! Credentials on etcd: refused, given to a cluster without authentication,
//! or missing on one with it, are configuration errors (never retried),
//! whose message says which.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use fencelock::{Error, LockClient, Retry};
use fencelock_testkit::EtcdCluster;

/// The error of connecting to `url` and taking a lock there.
async fn refusal(url: &str) -> Result<Error> {
    let client = LockClient::builder(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await;
    let client = match client {
        Ok(client) => client,
        Err(e) => return Ok(e),
    };
    client
        .try_acquire("x", &client.options())
        .await
        .err()
        .with_context(|| format!("{url}: granted"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refused_or_missing_credentials_are_configuration_errors() -> Result<()> {
    let etcd = EtcdCluster::single();
    let addr = etcd.addr(0);
    let e = refusal(&format!("etcd://root:root-pw@{addr}")).await?;
    ensure!(e.is_config() && e.retry() == Retry::Never, "{e} ({e:?})");
    ensure!(e.to_string().contains("authentication off"), "{e}");
    ensure!(!e.to_string().contains("root-pw"), "{e}");

    etcd.etcdctl(&["user", "add", "root:root-pw"])
        .map_err(anyhow::Error::msg)?;
    etcd.etcdctl(&["auth", "enable"])
        .map_err(anyhow::Error::msg)?;
    let client = LockClient::connect(&format!("etcd://root:root-pw@{addr}")).await?;
    let lease = client.try_acquire("x", &client.options()).await?;
    ensure!(lease.release().await?.is_released());

    let e = refusal(&format!("etcd://{addr}")).await?;
    ensure!(e.is_config() && e.retry() == Retry::Never, "{e} ({e:?})");
    ensure!(e.to_string().contains("requires authentication"), "{e}");
    let e = refusal(&format!("etcd://root:wrong-pw@{addr}")).await?;
    ensure!(e.is_config() && e.retry() == Retry::Never, "{e} ({e:?})");
    ensure!(!e.to_string().contains("wrong-pw"), "{e}");
    Ok(())
}
