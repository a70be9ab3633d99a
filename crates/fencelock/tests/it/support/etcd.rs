//! What the etcd tests share: an etcd cluster with a connected lock client,
//! and a plain etcd client for reading what fencelock left in etcd.

use anyhow::{Context, Result};
use etcd_client::{GetOptions, SortOrder, SortTarget};
use fencelock::LockClient;
use fencelock_testkit::EtcdCluster;

/// An etcd cluster of its own and a lock client connected to all members.
pub(crate) struct TestEtcd {
    pub(crate) cluster: EtcdCluster,
    pub(crate) client: LockClient,
}

impl TestEtcd {
    /// One member and a client.
    pub(crate) async fn single() -> Result<Self> {
        Self::on(EtcdCluster::single()).await
    }

    /// A client of `cluster`.
    pub(crate) async fn on(cluster: EtcdCluster) -> Result<Self> {
        let client = LockClient::connect(&cluster.url()).await?;
        Ok(TestEtcd { cluster, client })
    }

    /// A plain etcd client of every member.
    pub(crate) async fn admin(&self) -> Result<etcd_client::Client> {
        admin(&self.cluster).await
    }
}

/// A plain etcd client of every member of `cluster`.
pub(crate) async fn admin(cluster: &EtcdCluster) -> Result<etcd_client::Client> {
    etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .context("plain etcd client")
}

/// The keys under `prefix` with their create revisions and leases, oldest
/// first.
pub(crate) async fn keys_under(
    admin: &mut etcd_client::Client,
    prefix: &str,
) -> Result<Vec<(String, i64, i64)>> {
    let reply = admin
        .get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        )
        .await?;
    Ok(reply
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap_or_default().to_owned(),
                kv.create_revision(),
                kv.lease(),
            )
        })
        .collect())
}

/// The remaining (whole seconds, rounded down) and granted ttl of lease
/// `id` in seconds; `None` if it is gone.
pub(crate) async fn lease_ttl(
    admin: &mut etcd_client::Client,
    id: i64,
) -> Result<Option<(i64, i64)>> {
    let reply = admin.lease_time_to_live(id, None).await?;
    // -1 for a lease that is gone; 0 for one with less than a second left.
    Ok((reply.ttl() >= 0).then(|| (reply.ttl(), reply.granted_ttl())))
}
