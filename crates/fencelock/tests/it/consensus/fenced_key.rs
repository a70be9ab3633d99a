//! `FencedKey`: a fenced key in etcd, its rule checked by etcd in one
//! transaction, and its held writes.

use std::time::Duration;

use anyhow::{Result, bail};
use fencelock::{Fence, WriteOutcome, holder_id};

use crate::support::etcd::TestEtcd;

/// The resource rule, in etcd: a newer fence wins, an older one is refused,
/// an equal one only from the same holder; any fence (of any backend) is
/// accepted by an empty key; `read` decodes value, fence and holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_keys_apply_the_resource_rule_in_etcd() -> Result<()> {
    let t = TestEtcd::single().await?;
    let key = t.client.fenced_key("doc")?;
    let (f9, f10) = (Fence::new(9), Fence::new(10));
    assert!(key.write(f9, "a", "nine").await?.is_accepted());
    assert!(key.write(f10, "b", "ten: with colons").await?.is_accepted());
    assert_eq!(
        key.write(f9, "a", "stale").await?,
        WriteOutcome::Rejected {
            current_fence: Some(f10),
            current_holder: Some(holder_id("b")),
        }
    );
    assert!(
        !key.write(f10, "c", "same fence, other holder")
            .await?
            .is_accepted()
    );
    assert!(key.write(f10, "b", "again").await?.is_accepted());
    let state = key.read().await?;
    assert_eq!(state.value.as_deref(), Some("again"));
    assert_eq!(state.fence, Some(f10));
    assert_eq!(state.holder, Some(holder_id("b")));
    // u64 fences compare numerically (zero-padded): 10 < 99 < u64::MAX.
    assert!(key.write(Fence::new(99), "d", "x").await?.is_accepted());
    assert!(
        key.write(Fence::new(u64::MAX), "e", "top")
            .await?
            .is_accepted()
    );
    assert!(
        !key.write(Fence::new(u64::MAX - 1), "f", "no")
            .await?
            .is_accepted()
    );
    // Registering records the fence and keeps the value.
    let other = t.client.fenced_key("other")?;
    other.write(f9, "a", "v").await?;
    assert!(other.register(f10, "b").await?.is_accepted());
    let state = other.read().await?;
    assert_eq!(
        (state.value.as_deref(), state.fence),
        (Some("v"), Some(f10))
    );
    assert!(!other.write(f9, "a", "late").await?.is_accepted());
    Ok(())
}

/// A held write is accepted only while the writer holds its lock: after a
/// release (or a lost lease) it is refused even though no newer fence
/// wrote; read-modify-writes under the lock lose no update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_writes_need_the_lock_and_updates_lose_nothing() -> Result<()> {
    let t = TestEtcd::single().await?;
    let opts = t.client.options().ttl(Duration::from_secs(5));
    let key = t.client.fenced_key("counter")?;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (client, opts, key) = (t.client.clone(), opts.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let lease = client.acquire("counter", &opts).await?;
                let outcome = key
                    .update_held(&lease, |v| {
                        let n: u64 = v.and_then(|v| v.parse().ok()).unwrap_or(0);
                        (n + 1).to_string()
                    })
                    .await?;
                if !outcome.is_accepted() {
                    bail!("an update under the lock was refused: {outcome:?}");
                }
                lease.release().await?;
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    assert_eq!(key.read().await?.value.as_deref(), Some("40"));

    let lease = t.client.acquire("counter", &opts).await?;
    let handle = lease.handle();
    assert!(key.write_held(&handle, "mine").await?.is_accepted());
    lease.release().await?;
    let after = key.write_held(&handle, "after release").await?;
    assert!(!after.is_accepted(), "{after:?}");
    assert_eq!(key.read().await?.value.as_deref(), Some("mine"));
    Ok(())
}
