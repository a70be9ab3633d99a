//! Moving a lock between Redis and etcd: fence epochs keep every resource
//! refusing the old backend's fences once it has seen the new one's.

use anyhow::Result;
use fencelock::{FENCE_EPOCH_SIZE, Fence, FenceMode, LockClient, WriteOutcome};
use fencelock_testkit::RedisServer;

use crate::support::etcd::TestEtcd;

/// A lock moved from Redis (epoch 0) to etcd by changing its URL: etcd
/// fences are in epoch 1 (2^53 + revision), above every fence Redis can
/// issue, clock or counter. Once an etcd holder has written, a Redis fence —
/// a stale holder's, or a straggler's fresh one — is refused by a Redis hash
/// and by an etcd key alike. Moving back to Redis in epoch 2 works the same
/// way: the old etcd fences are refused.
///
/// Negative control: etcd fences in epoch 0 (the bare revisions) next to
/// Redis counter fences. A straggler's Redis fence is then above the etcd
/// holder's, and its stale write is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_epochs_make_moving_a_lock_between_backends_safe() -> Result<()> {
    let redis_server = RedisServer::start();
    let redis = LockClient::connect(&redis_server.url()).await?;
    let t = TestEtcd::single().await?;
    let counter = redis.options().fence_mode(FenceMode::Counter);
    // Redis has issued fences up to 50 for this name.
    for _ in 0..49 {
        redis.acquire("job", &counter).await?.release().await?;
    }
    let stale_redis = redis.acquire("job", &counter).await?;
    let (stale_fence, stale_token) = (stale_redis.fence(), stale_redis.token().to_owned());
    assert_eq!(stale_fence, Fence::new(50));
    let hash = redis.fenced_hash("job:data")?;
    let key = t.client.fenced_key("job/data")?;
    assert!(
        hash.write(stale_fence, &stale_token, "redis")
            .await?
            .is_accepted()
    );
    assert!(
        key.write(stale_fence, &stale_token, "redis")
            .await?
            .is_accepted()
    );
    drop(stale_redis);

    // Moved to etcd: epoch 1 by default.
    let on_etcd = t.client.acquire("job", &t.client.options()).await?;
    assert!(on_etcd.fence().get() > FENCE_EPOCH_SIZE);
    assert!(
        hash.write(on_etcd.fence(), on_etcd.token(), "etcd")
            .await?
            .is_accepted()
    );
    assert!(key.write_held(&on_etcd, "etcd").await?.is_accepted());
    // The stale Redis holder, and a straggler still taking the lock on Redis.
    let straggler = redis.acquire("job", &counter).await?;
    for (fence, token) in [
        (stale_fence, stale_token.as_str()),
        (straggler.fence(), straggler.token()),
    ] {
        assert!(!hash.write(fence, token, "late").await?.is_accepted());
        assert!(!key.write(fence, token, "late").await?.is_accepted());
    }
    straggler.release().await?;
    let (etcd_fence, etcd_token) = (on_etcd.fence(), on_etcd.token().to_owned());
    on_etcd.release().await?;

    // Back to Redis, in epoch 2.
    let back = redis
        .acquire("job", &counter.clone().fence_epoch(2))
        .await?;
    assert!(back.fence().get() > 2 * FENCE_EPOCH_SIZE);
    assert!(
        hash.write(back.fence(), back.token(), "redis again")
            .await?
            .is_accepted()
    );
    assert!(
        key.write(back.fence(), back.token(), "redis again")
            .await?
            .is_accepted()
    );
    assert!(
        !hash
            .write(etcd_fence, &etcd_token, "late")
            .await?
            .is_accepted()
    );
    assert!(
        !key.write(etcd_fence, &etcd_token, "late")
            .await?
            .is_accepted()
    );
    back.release().await?;

    // The control: no epochs. The etcd holder's bare revision is below the
    // Redis counter, and a straggler's stale write lands over its write.
    let control = redis.fenced_hash("control")?;
    let bare = t
        .client
        .acquire("ctl", &t.client.options().fence_epoch(0))
        .await?;
    assert!(
        bare.fence().get() < 50,
        "a young etcd's revision: {}",
        bare.fence()
    );
    assert!(
        control
            .write(bare.fence(), bare.token(), "etcd")
            .await?
            .is_accepted()
    );
    let late = redis.acquire("job", &counter).await?;
    assert_eq!(
        control
            .write(late.fence(), late.token(), "straggler")
            .await?,
        WriteOutcome::Accepted,
        "without epochs the straggler's write is accepted"
    );
    Ok(())
}
