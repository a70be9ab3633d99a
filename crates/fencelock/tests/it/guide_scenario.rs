//! The guide's scenario (docs/design.md §7) with a real holder *process* frozen by
//! SIGSTOP past its 300 ms lease, and compatibility with workers written from
//! the guide (raw Redis commands, the guide's key layout and scripts).

use std::time::Duration;

use anyhow::{Context, bail};
use fencelock::{Fence, FenceMode, KeyLayout, LockClient, ReleaseOutcome, Renewal, WriteOutcome};
use fencelock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::support::TestRedis;
use crate::support::{GUIDE_FENCED_WRITE, Keys, connect, wait_key_gone};

/// How long A stays frozen at least: past its 300 ms lease, as in the guide.
const PAUSE: Duration = Duration::from_millis(400);
/// The guide's compare-and-delete release script, verbatim.
const GUIDE_RELEASE: &str = "
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
else
  return 0
end
";

/// Parses the worker's `acquired FENCE TOKEN` reply.
fn parse_acquired(reply: &str) -> anyhow::Result<(Fence, String)> {
    match reply.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["acquired", fence, token] => Ok((fence.parse()?, (*token).to_string())),
        _ => bail!("expected `acquired FENCE TOKEN`, got {reply:?}"),
    }
}

fn mode_arg(mode: FenceMode) -> &'static str {
    match mode {
        FenceMode::Counter => "counter",
        _ => "clock",
    }
}

/// The guide's scenario, step by step, on a fresh server.
async fn run_guide_scenario(mode: FenceMode) -> anyhow::Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let _con = connect(&server).await?;
    let lock_key = client
        .keys("invoice:42", KeyLayout::HashTagged)?
        .lock()
        .to_owned();
    let resource = "invoice:42:data";

    // A: a separate process, renewal on, 300 ms lease.
    let mut a = crate::support::worker::start(&server.url(), &["default", mode_arg(mode)]);
    let (a_fence, a_token) = parse_acquired(&a.send("acquire invoice:42 300 0 renew"))?;

    // Freeze A (its renewal task too) past its lease.
    a.stop();
    let stopped = Instant::now();
    wait_key_gone(&server, &lock_key).await?;
    if let Some(rest) = PAUSE.checked_sub(stopped.elapsed()) {
        tokio::time::sleep(rest).await;
    }

    // B takes over and writes with its fence.
    let opts = client
        .options()
        .ttl(Duration::from_secs(10))
        .renewal(Renewal::Auto)
        .fence_mode(mode);
    let b = client.try_acquire("invoice:42", &opts).await?;
    let hash = client.fenced_hash(resource)?;
    assert_eq!(
        hash.write(b.fence(), b.token(), "written-by-B").await?,
        WriteOutcome::Accepted
    );

    // A wakes up: the loss signal fires, its write is refused, its release
    // leaves B's lock alone.
    a.cont();
    let lost = a.send_timeout("wait-lost 5000", Duration::from_secs(15));
    assert!(
        lost.starts_with("lost Some("),
        "A's loss signal must fire on waking past its deadline, got {lost:?}"
    );
    assert_eq!(
        a.send(&format!("write {resource} written-by-A")),
        format!("rejected {}", b.fence())
    );
    assert_eq!(a.send("release"), "not-ours TakenOver");

    let stored = server.hgetall(resource);
    assert_eq!(
        stored.get("fence").map(String::as_str),
        Some(b.fence().to_string().as_str())
    );
    assert_eq!(stored.get("holder"), Some(&b.holder_id()));
    assert_eq!(
        stored.get("value").map(String::as_str),
        Some("written-by-B")
    );
    assert_eq!(
        server.get(&lock_key),
        Some(format!("{}:{}", b.token(), b.fence())),
        "B's lock must be intact after A's release"
    );
    assert_ne!(a_token, b.token());

    match mode {
        FenceMode::Counter => {
            assert_eq!(a_fence, Fence::new(1), "counter mode: A gets fence 1");
            assert_eq!(b.fence(), Fence::new(2), "counter mode: B gets fence 2");
        }
        _ => {
            assert!(
                b.fence() > a_fence,
                "fences must increase: {a_fence} then {}",
                b.fence()
            );
            // Clock fences are µs since the epoch, far from the counter's 1, 2.
            assert!(
                a_fence.get() >= 1_000_000_000_000_000,
                "clock-mode fence {a_fence} does not look clock-floored"
            );
        }
    }
    assert_eq!(b.release().await?, ReleaseOutcome::Released);
    Ok(())
}

/// Counter mode: a frozen holder's write and release are refused; fences are exactly 1 and 2.
#[tokio::test(flavor = "multi_thread")]
async fn paused_worker_process_is_fenced_out_counter_mode() -> anyhow::Result<()> {
    run_guide_scenario(FenceMode::Counter).await
}

/// Clock mode (the default): the same scenario with clock-floored, increasing fences.
#[tokio::test(flavor = "multi_thread")]
async fn paused_worker_process_is_fenced_out_clock_mode() -> anyhow::Result<()> {
    run_guide_scenario(FenceMode::Clock).await
}

/// A worker written from the guide: raw commands and the guide's scripts.
struct GuideWorker {
    con: MultiplexedConnection,
    key: String,
    token: String,
    fence: Option<i64>,
}

impl GuideWorker {
    fn new(con: MultiplexedConnection, name: &str) -> Self {
        GuideWorker {
            con,
            key: format!("lock:{name}"),
            token: uuid::Uuid::new_v4().to_string(),
            fence: None,
        }
    }

    /// `SET lock:NAME token NX PX ttl`, then `INCR lock:NAME:fence`.
    async fn acquire(&mut self, ttl_ms: u64) -> anyhow::Result<bool> {
        self.token = uuid::Uuid::new_v4().to_string();
        let set: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.con)
            .await?;
        if set.is_none() {
            return Ok(false);
        }
        let fence: i64 = redis::cmd("INCR")
            .arg(format!("{}:fence", self.key))
            .query_async(&mut self.con)
            .await?;
        self.fence = Some(fence);
        Ok(true)
    }

    async fn release(&mut self) -> anyhow::Result<bool> {
        let r: i64 = redis::cmd("EVAL")
            .arg(GUIDE_RELEASE)
            .arg(1)
            .arg(&self.key)
            .arg(&self.token)
            .query_async(&mut self.con)
            .await?;
        Ok(r == 1)
    }

    async fn fenced_write(&mut self, resource: &str, value: &str) -> anyhow::Result<bool> {
        let fence = self.fence.context("the guide worker holds no fence")?;
        let r: i64 = redis::cmd("EVAL")
            .arg(GUIDE_FENCED_WRITE)
            .arg(1)
            .arg(resource)
            .arg(fence)
            .arg(value)
            .query_async(&mut self.con)
            .await?;
        Ok(r == 1)
    }
}

/// Guide workers and fencelock (guide layout, counter mode) exclude each other, share one fence counter, and fencelock refuses an equal fence on a holder-less guide hash.
#[tokio::test(flavor = "multi_thread")]
async fn guide_layout_interoperates_with_guide_workers() -> anyhow::Result<()> {
    let server = RedisServer::start();
    let _con = connect(&server).await?;
    let mut guide = GuideWorker::new(connect(&server).await?, "invoice:7");
    let client = LockClient::connect(&server.url()).await?;
    let opts = client
        .options()
        .layout(KeyLayout::Guide)
        .fence_mode(FenceMode::Counter)
        .ttl(Duration::from_secs(10))
        .wait(Duration::ZERO);
    let keys = client.keys("invoice:7", KeyLayout::Guide)?;
    assert_eq!(keys.lock(), "lock:invoice:7");
    assert_eq!(keys.fence(), "lock:invoice:7:fence");

    // The guide worker holds: fencelock is contended.
    assert!(guide.acquire(10_000).await?);
    assert_eq!(guide.fence, Some(1));
    let contended = client.try_acquire("invoice:7", &opts).await;
    assert!(
        matches!(&contended, Err(e) if e.is_contended()),
        "fencelock must not take a lock a guide worker holds: {contended:?}"
    );
    assert!(guide.release().await?);

    // fencelock holds: the guide's SET NX fails, and the counter continues.
    let lease = client.try_acquire("invoice:7", &opts).await?;
    assert_eq!(lease.fence(), Fence::new(2));
    assert_eq!(
        server.get(keys.lock()).as_deref(),
        Some(lease.token()),
        "guide layout stores the bare token"
    );
    assert!(
        !guide.acquire(10_000).await?,
        "a guide worker must not take a lock fencelock holds"
    );
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);

    // The guide worker again: fence 3, and it writes the guide's hash.
    assert!(guide.acquire(10_000).await?);
    assert_eq!(guide.fence, Some(3));
    assert!(guide.fenced_write("invoice:7:data", "by-guide").await?);
    let stored = server.hgetall("invoice:7:data");
    assert_eq!(stored.get("fence").map(String::as_str), Some("3"));
    assert!(
        !stored.contains_key("holder"),
        "the guide's hash has no holder"
    );
    assert!(guide.release().await?);

    // fencelock on the guide's hash: an equal fence cannot prove it is the
    // same holder (holder unknown) and is refused; a higher fence wins.
    let lease = client.try_acquire("invoice:7", &opts).await?;
    assert_eq!(lease.fence(), Fence::new(4));
    let hash = client.fenced_hash("invoice:7:data")?;
    assert_eq!(
        hash.write(Fence::new(3), lease.token(), "equal-fence")
            .await?,
        WriteOutcome::Rejected {
            current_fence: Some(Fence::new(3)),
            current_holder: None,
        }
    );
    assert_eq!(
        server.hgetall("invoice:7:data"),
        stored,
        "a rejected write changes nothing"
    );
    assert_eq!(
        hash.write(lease.fence(), lease.token(), "by-fencelock")
            .await?,
        WriteOutcome::Accepted
    );
    let after = hash.read().await?;
    assert_eq!(after.value.as_deref(), Some("by-fencelock"));
    assert_eq!(after.fence, Some(Fence::new(4)));
    assert_eq!(after.holder, Some(lease.holder_id()));
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    Ok(())
}
