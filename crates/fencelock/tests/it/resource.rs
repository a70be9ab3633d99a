//! The fenced Redis hash (docs/design.md §2.4): the acceptance rule, exact u64
//! comparison, compatibility with the guide's hash, and the lost update that
//! a write-only check allows between a new holder's read and write
//! (docs/design.md §2.4).

use std::collections::HashMap;

use fencelock::{Fence, FencedHash, HashState, WriteOutcome, holder_id};

use crate::support::TestRedis;
use crate::support::{Keys, connect};

fn rejected(fence: u64, holder: &str) -> WriteOutcome {
    WriteOutcome::Rejected {
        current_fence: Some(Fence::new(fence)),
        current_holder: Some(holder_id(holder)),
    }
}

/// Higher fences win, lower lose, equal wins only for the same holder; a rejection reports the stored fence and holder and changes nothing.
#[tokio::test]
async fn acceptance_rule_and_rejections_change_nothing() -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let _con = connect(&server).await?;
    let hash = client.fenced_hash("doc:1")?;

    assert_eq!(
        hash.write(Fence::new(10), "h1", "a").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        hash.write(Fence::new(11), "h2", "b").await?,
        WriteOutcome::Accepted
    );
    let snapshot = server.hgetall("doc:1");
    assert_eq!(
        snapshot,
        HashMap::from([
            ("fence".to_string(), "11".to_string()),
            ("holder".to_string(), holder_id("h2")),
            ("value".to_string(), "b".to_string()),
        ])
    );

    // Lower fence (also from the same holder as the stored one): refused.
    assert_eq!(
        hash.write(Fence::new(9), "h3", "c").await?,
        rejected(11, "h2")
    );
    assert_eq!(
        hash.write(Fence::new(10), "h2", "c").await?,
        rejected(11, "h2")
    );
    // Equal fence, different holder: refused.
    assert_eq!(
        hash.write(Fence::new(11), "h1", "c").await?,
        rejected(11, "h2")
    );
    // Registration follows the same rule.
    assert_eq!(
        hash.register(Fence::new(11), "h1").await?,
        rejected(11, "h2")
    );
    assert_eq!(
        hash.register(Fence::new(3), "h2").await?,
        rejected(11, "h2")
    );
    assert_eq!(
        server.hgetall("doc:1"),
        snapshot,
        "rejected writes must change nothing"
    );

    // Equal fence, same holder: accepted (a holder writes many times).
    assert_eq!(
        hash.write(Fence::new(11), "h2", "d").await?,
        WriteOutcome::Accepted
    );
    let state = hash.read().await?;
    assert_eq!(state.value.as_deref(), Some("d"));
    assert_eq!(state.fence, Some(Fence::new(11)));
    assert_eq!(state.holder, Some(holder_id("h2")));

    // A registration records fence and holder and keeps the value.
    assert_eq!(
        hash.register(Fence::new(12), "h4").await?,
        WriteOutcome::Accepted
    );
    let state = hash.read().await?;
    assert_eq!(state.value.as_deref(), Some("d"));
    assert_eq!(state.fence, Some(Fence::new(12)));
    assert_eq!(state.holder, Some(holder_id("h4")));
    assert_eq!(
        hash.write(Fence::new(11), "h2", "e").await?,
        rejected(12, "h4")
    );
    Ok(())
}

/// How the new holder B does its read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// Read, then fenced write (the guide's pattern): broken.
    WriteOnly,
    /// Register the fence, read, then fenced write.
    RegisterFirst,
    /// `FencedHash::update` (register + read + write).
    Update,
}

const RACES: u64 = 1000;

fn counter(value: Option<&str>) -> u64 {
    value.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Runs `RACES` orchestrated races of a stale holder A against the new holder
/// B on a counter, and returns the number of acknowledged increments lost.
///
/// Race `i`: A (fence 2i+1, the previous holder) has read the counter and is
/// paused; B is granted fence 2i+2 and increments the counter; A's stale
/// increment lands between B's read and B's write.
async fn lost_increments(hash: &FencedHash, variant: Variant) -> anyhow::Result<u64> {
    let mut acknowledged = 0;
    for i in 0..RACES {
        let (a_fence, b_fence) = (Fence::new(2 * i + 1), Fence::new(2 * i + 2));
        let (a_token, b_token) = (format!("A{i}"), format!("B{i}"));
        // A read the counter while it still held the lock.
        let a_read = counter(hash.read().await?.value.as_deref());
        let a_write = |value: u64| {
            let (hash, a_token) = (hash.clone(), a_token.clone());
            async move { hash.write(a_fence, &a_token, &value.to_string()).await }
        };

        let (a_outcome, b_outcome) = match variant {
            Variant::WriteOnly => {
                let b_read = counter(hash.read().await?.value.as_deref());
                let a_outcome = a_write(a_read + 1).await?;
                let b_outcome = hash
                    .write(b_fence, &b_token, &(b_read + 1).to_string())
                    .await?;
                (a_outcome, b_outcome)
            }
            Variant::RegisterFirst => {
                assert!(hash.register(b_fence, &b_token).await?.is_accepted());
                let b_read = counter(hash.read().await?.value.as_deref());
                let a_outcome = a_write(a_read + 1).await?;
                let b_outcome = hash
                    .write(b_fence, &b_token, &(b_read + 1).to_string())
                    .await?;
                (a_outcome, b_outcome)
            }
            Variant::Update => {
                // A's stale write runs inside B's update, after B's read and
                // before B's write.
                let mut a_outcome = None;
                let runtime = tokio::runtime::Handle::current();
                let b_outcome = hash
                    .update(b_fence, &b_token, |current| {
                        a_outcome = Some(tokio::task::block_in_place(|| {
                            runtime.block_on(a_write(a_read + 1))
                        }));
                        (counter(current) + 1).to_string()
                    })
                    .await?;
                let a_outcome = a_outcome
                    .ok_or_else(|| anyhow::anyhow!("update() did not call the closure"))??;
                (a_outcome, b_outcome)
            }
        };

        assert_eq!(
            b_outcome,
            WriteOutcome::Accepted,
            "B's write (race {i}, {variant:?})"
        );
        acknowledged += 1;
        if variant == Variant::WriteOnly {
            assert_eq!(
                a_outcome,
                WriteOutcome::Accepted,
                "write-only checking lets A's stale write land (race {i})"
            );
            acknowledged += 1;
        } else {
            assert_eq!(
                a_outcome,
                rejected(b_fence.get(), &b_token),
                "A's stale write must be refused once B registered (race {i}, {variant:?})"
            );
        }
    }
    let final_value = counter(hash.read().await?.value.as_deref());
    Ok(acknowledged - final_value)
}

/// Negative control: with write-only checking, a stale write between the new holder's read and write loses an acknowledged increment in every race.
#[tokio::test(flavor = "multi_thread")]
async fn write_only_checking_loses_updates() -> anyhow::Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let hash = client.fenced_hash("counter:write-only")?;
    assert_eq!(lost_increments(&hash, Variant::WriteOnly).await?, RACES);
    Ok(())
}

/// Registering the fence before reading loses no update over 1,000 orchestrated races.
#[tokio::test(flavor = "multi_thread")]
async fn register_before_read_loses_no_update() -> anyhow::Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let hash = client.fenced_hash("counter:register")?;
    assert_eq!(lost_increments(&hash, Variant::RegisterFirst).await?, 0);
    assert_eq!(counter(hash.read().await?.value.as_deref()), RACES);
    Ok(())
}

/// `FencedHash::update` (register + read + write) loses no update over 1,000 orchestrated races.
#[tokio::test(flavor = "multi_thread")]
async fn update_loses_no_update() -> anyhow::Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let hash = client.fenced_hash("counter:update")?;
    assert_eq!(lost_increments(&hash, Variant::Update).await?, 0);
    assert_eq!(counter(hash.read().await?.value.as_deref()), RACES);
    Ok(())
}

/// Fences above 2^53 (and up to u64::MAX) compare exactly, as decimal strings, not as Lua doubles.
#[tokio::test]
async fn fences_above_2_pow_53_compare_exactly() -> anyhow::Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let hash = client.fenced_hash("big")?;
    let two_53 = 9_007_199_254_740_992_u64;

    assert_eq!(
        hash.write(Fence::new(two_53), "X", "a").await?,
        WriteOutcome::Accepted
    );
    // 2^53 + 1 equals 2^53 as a double; exactly, it is greater.
    assert_eq!(
        hash.write(Fence::new(two_53 + 1), "Y", "b").await?,
        WriteOutcome::Accepted
    );
    // Same holder, one lower: a double comparison would see "equal, same
    // holder" and accept.
    assert_eq!(
        hash.write(Fence::new(two_53), "Y", "c").await?,
        rejected(two_53 + 1, "Y")
    );
    assert_eq!(
        hash.write(Fence::new(two_53 + 1), "Y", "d").await?,
        WriteOutcome::Accepted
    );
    let state = hash.read().await?;
    assert_eq!(state.fence, Some(Fence::new(two_53 + 1)));
    assert_eq!(state.value.as_deref(), Some("d"));

    assert_eq!(
        hash.write(Fence::new(u64::MAX), "M", "max").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        hash.write(Fence::new(u64::MAX - 1), "M", "below-max")
            .await?,
        rejected(u64::MAX, "M")
    );
    assert_eq!(hash.read().await?.fence, Some(Fence::new(u64::MAX)));

    // Different lengths compare by length first: 10 > 9 although "10" < "9".
    let small = client.fenced_hash("small")?;
    assert_eq!(
        small.write(Fence::new(9), "S", "nine").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        small.write(Fence::new(10), "T", "ten").await?,
        WriteOutcome::Accepted
    );
    assert_eq!(
        small.write(Fence::new(9), "S", "nine").await?,
        rejected(10, "T")
    );
    Ok(())
}

/// `read()` of a missing key is empty; a guide-written hash (fence and value, no holder) reads with holder None.
#[tokio::test]
async fn read_of_missing_and_guide_written_hashes() -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let mut con = connect(&server).await?;

    assert_eq!(
        client.fenced_hash("missing")?.read().await?,
        HashState::default()
    );

    let _: i64 = redis::cmd("HSET")
        .arg("guide:res")
        .arg("fence")
        .arg("5")
        .arg("value")
        .arg("from-python")
        .query_async(&mut con)
        .await?;
    let guide = client.fenced_hash("guide:res")?.read().await?;
    assert_eq!(guide.value.as_deref(), Some("from-python"));
    assert_eq!(guide.fence, Some(Fence::new(5)));
    assert_eq!(guide.holder, None);
    Ok(())
}
