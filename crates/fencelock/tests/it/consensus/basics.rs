//! Grants, releases, waiting and fences on one etcd member.

use std::time::Duration;

use anyhow::Result;
use fencelock::{LockClient, LockState, ReleaseOutcome};
use fencelock_testkit::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() -> Result<()> {
    let etcd = EtcdCluster::single();
    let client = LockClient::connect(&etcd.url()).await?;
    let opts = client.options().ttl(Duration::from_secs(2));
    let a = client.acquire("job", &opts).await?;
    eprintln!("fence {} key {}", a.fence(), a.key());
    assert!(client.try_acquire("job", &opts).await.is_err());
    let state = client.inspect("job", Default::default()).await?;
    eprintln!("{state:?}");
    assert!(matches!(state, LockState::Held { .. }));
    let c2 = client.clone();
    let o2 = opts.clone();
    let waiter = tokio::spawn(async move { c2.acquire("job", &o2).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(client.waiters("job", Default::default()).await?, 1);
    let f1 = a.fence();
    assert_eq!(a.release().await?, ReleaseOutcome::Released);
    let b = waiter.await??;
    assert!(b.fence() > f1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.is_lost());
    assert_eq!(b.release().await?, ReleaseOutcome::Released);
    Ok(())
}
