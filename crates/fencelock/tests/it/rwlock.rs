//! The fenced read-write lock on Redis (`LockClient::rwlock`): readers
//! share a name, a writer holds it alone with a minted fence, and a reader
//! carries the write epoch it saw.
//!
//! - sharing and exclusion: readers together, a writer alone, epochs and
//!   fences in grant order; under contention in every wait mode never a
//!   writer with anyone else, with a negative control (the same check on
//!   readers alone does see overlaps, so it is not vacuous);
//! - validated reads: torn once a writer granted after the reader wrote,
//!   where a plain read warns of nothing (the negative control); the epoch
//!   minted when the fence key is missing;
//! - fair order: a writer waits for the readers ahead of it, later readers
//!   wait for the writer; notify lets a reader pass a waiting writer;
//! - renewal, loss, revoke (every holder deposed), inspect, kinds and bad
//!   options refused before sending.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Access, Error, Fence, KeyLayout, LockClient, LockOptions, LockState, Renewal, ValidatedRead,
    WaitMode, read_is_clean,
};
use fencelock_testkit::RedisServer;

use crate::support::{Keys, POLL_DEADLINE, TestRedis};

fn rw_opts(client: &LockClient) -> LockOptions {
    client.options().ttl(Duration::from_secs(5))
}

#[tokio::test]
async fn readers_share_a_name_and_a_writer_holds_it_alone() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("config")?;
    let opts = rw_opts(&t.client);

    let first = lock.try_write(&opts).await?;
    ensure!(first.access() == Some(Access::Write) && first.slot().is_none());
    let first_fence = first.fence();
    ensure!(first.release().await?.is_released());

    let a = lock.try_read(&opts).await?;
    let b = lock.try_read(&opts).await?;
    ensure!(a.access() == Some(Access::Read) && b.access() == Some(Access::Read));
    // Both readers carry the epoch of the last writer.
    ensure!(a.fence() == first_fence && b.fence() == first_fence);
    let stored = t.server.hgetall(a.key());
    ensure!(
        stored.get("rw").map(String::as_str) == Some("1"),
        "{stored:?}"
    );
    ensure!(
        stored.contains_key("r0") && stored.contains_key("r1"),
        "{stored:?}"
    );
    match lock.try_write(&opts).await {
        Err(Error::Contended { name, .. }) => ensure!(name == "config"),
        other => bail!("a writer must wait for readers, got {other:?}"),
    }
    ensure!(a.release().await?.is_released());
    match lock.try_write(&opts).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a writer must wait for the last reader, got {other:?}"),
    }
    ensure!(b.release().await?.is_released());
    ensure!(
        !t.server.exists("lock:{config}"),
        "the hash goes with its last holder"
    );

    let writer = lock.try_write(&opts).await?;
    ensure!(
        writer.fence() > first_fence,
        "a later writer mints a greater fence"
    );
    match lock.try_read(&opts).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a reader must wait for the writer, got {other:?}"),
    }
    match lock.try_write(&opts).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a second writer must wait, got {other:?}"),
    }
    let fence = writer.fence();
    ensure!(writer.release().await?.is_released());
    let reader = lock.try_read(&opts).await?;
    ensure!(
        reader.fence() == fence,
        "the epoch is the last writer's fence"
    );
    ensure!(reader.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_validated_read_is_torn_once_a_later_writer_wrote() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("doc")?;
    let doc = t.client.fenced_hash("doc:data")?;
    let opts = rw_opts(&t.client);
    let writer = lock.try_write(&opts).await?;
    ensure!(
        doc.write(writer.fence(), writer.token(), "v1")
            .await?
            .is_accepted()
    );
    ensure!(writer.release().await?.is_released());

    // A reader that is not renewed and pauses past its lease.
    let short = opts
        .clone()
        .ttl(Duration::from_millis(300))
        .renewal(Renewal::Off);
    let reader = lock.try_read(&short).await?;
    let epoch = reader.fence();
    ensure!(
        doc.read_validated(epoch).await?.is_clean(),
        "nothing wrote after the epoch"
    );
    tokio::time::timeout(POLL_DEADLINE, reader.lost()).await?;
    // A writer comes in once the reader's lease lapsed in Redis.
    let later = lock
        .write(&opts.clone().wait(POLL_DEADLINE))
        .await
        .context("the writer after the reader's lease")?;
    ensure!(later.fence() > epoch);
    ensure!(
        doc.write(later.fence(), later.token(), "v2")
            .await?
            .is_accepted()
    );

    match doc.read_validated(epoch).await? {
        ValidatedRead::Torn { value, fence } => {
            ensure!(fence == later.fence(), "the writer's fence: {fence}");
            ensure!(value.value.as_deref() == Some("v2"));
        }
        other => bail!("a read after a later writer wrote must be torn: {other:?}"),
    }
    // Negative control: the plain read gives the same value and no warning.
    let plain = doc.read().await?;
    ensure!(plain.value.as_deref() == Some("v2"));
    // A reader granted after that writer has its fence as epoch: clean.
    ensure!(later.release().await?.is_released());
    drop(reader);
    let fresh = lock.try_read(&opts).await?;
    ensure!(doc.read_validated(fresh.fence()).await?.is_clean());
    ensure!(fresh.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_reader_mints_its_epoch_when_the_fence_key_is_missing() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("lost")?;
    let doc = t.client.fenced_hash("lost:data")?;
    let opts = rw_opts(&t.client);
    let writer = lock.try_write(&opts).await?;
    ensure!(
        doc.write(writer.fence(), writer.token(), "v1")
            .await?
            .is_accepted()
    );
    let written = writer.fence();
    ensure!(writer.release().await?.is_released());
    // The fence key is lost (a restart without persistence).
    t.server.cmd(&["DEL", "lock:{lost}:fence"]);
    let reader = lock.try_read(&opts).await?;
    ensure!(
        reader.fence() >= written,
        "clock mode: the minted epoch {} is at least the fence {written} at the resource",
        reader.fence(),
    );
    ensure!(
        t.server.exists("lock:{lost}:fence"),
        "the epoch was minted and stored"
    );
    ensure!(doc.read_validated(reader.fence()).await?.is_clean());
    // Negative control: an epoch of nothing (no fence read back) would
    // call the writer's earlier value torn.
    ensure!(!read_is_clean(Some(written), Fence::new(0)));
    ensure!(reader.release().await?.is_released());
    Ok(())
}

/// Readers and writers holding at once, counted while each holds.
#[derive(Debug, Default)]
struct Census {
    /// Readers holding now, plus 1000 per writer.
    now: AtomicI64,
    /// The most readers seen at once.
    most_readers: AtomicI64,
}

/// `workers` tasks each take the lock `cycles` times, one in `write_every`
/// as the writer, checking that a writer is alone; returns the most
/// readers that held at once.
async fn contend(
    server: &RedisServer,
    mode: WaitMode,
    workers: usize,
    cycles: usize,
    write_every: usize,
) -> Result<i64> {
    let census = Arc::new(Census::default());
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = LockClient::connect(&server.url()).await?;
        let census = census.clone();
        tasks.push(tokio::spawn(async move {
            let lock = client.rwlock("shared")?;
            let opts = client
                .options()
                .wait_mode(mode)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(30));
            for c in 0..cycles {
                let write = write_every > 0 && (w + c) % write_every == 0;
                let (lease, weight) = if write {
                    (lock.write(&opts).await?, 1000)
                } else {
                    (lock.read(&opts).await?, 1)
                };
                let now = census.now.fetch_add(weight, Ordering::SeqCst) + weight;
                ensure!(
                    if write { now == 1000 } else { now < 1000 },
                    "{} held with others: census {now}",
                    if write { "a writer" } else { "a reader" }
                );
                census.most_readers.fetch_max(now % 1000, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(300)).await;
                census.now.fetch_sub(weight, Ordering::SeqCst);
                ensure!(!lease.is_lost(), "a lease was lost while held");
                ensure!(lease.release().await?.is_released());
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(census.most_readers.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_a_writer_is_never_with_anyone_in_every_wait_mode() -> Result<()> {
    let server = RedisServer::start();
    for mode in [WaitMode::Poll, WaitMode::Notify, WaitMode::Fair] {
        contend(&server, mode, 8, 20, 4).await?;
    }
    // Negative control: the census does see holders together (readers
    // alone share), so a writer let in with them would be caught.
    let most = contend(&server, WaitMode::Notify, 6, 20, 0).await?;
    ensure!(most >= 2, "readers never shared ({most})");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_queues_readers_and_writers_in_one_order() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("fifo")?;
    let fair = rw_opts(&t.client)
        .wait_mode(WaitMode::Fair)
        .wait(Duration::from_secs(20));
    let first = lock.try_read(&fair).await?;

    let spawn = |access: Access| {
        let lock = lock.clone();
        let opts = fair.clone();
        tokio::spawn(async move {
            match access {
                Access::Read => lock.read(&opts).await,
                Access::Write => lock.write(&opts).await,
            }
        })
    };
    let queued = |n: u64| {
        let client = t.client.clone();
        async move {
            crate::support::poll_async("the waiter to queue", POLL_DEADLINE, || async {
                Ok((client.waiters("fifo", KeyLayout::HashTagged).await? == n).then_some(()))
            })
            .await
        }
    };
    let writer = spawn(Access::Write);
    queued(1).await?;
    // A reader that comes later waits for the queued writer, though only
    // readers hold the lock.
    match lock.try_read(&fair).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a fair reader must not pass a queued writer: {other:?}"),
    }
    let reader = spawn(Access::Read);
    queued(2).await?;
    // Negative control: notify promises no order, and lets it pass.
    let passer = lock.try_read(&rw_opts(&t.client)).await?;
    ensure!(passer.release().await?.is_released());

    ensure!(!writer.is_finished() && !reader.is_finished());
    ensure!(first.release().await?.is_released());
    let writer = tokio::time::timeout(POLL_DEADLINE, writer).await???;
    ensure!(writer.access() == Some(Access::Write));
    ensure!(
        !reader.is_finished(),
        "the later reader waits for the writer"
    );
    let fence = writer.fence();
    ensure!(writer.release().await?.is_released());
    let reader = tokio::time::timeout(POLL_DEADLINE, reader).await???;
    ensure!(reader.fence() == fence);
    ensure!(reader.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_waiting_writer_is_woken_when_the_last_reader_leaves() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("wake")?;
    let opts = rw_opts(&t.client);
    let a = lock.try_read(&opts).await?;
    let b = lock.try_read(&opts).await?;
    let waiting = {
        let (lock, opts) = (lock.clone(), opts.clone().wait(Duration::from_secs(20)));
        tokio::spawn(async move { lock.write(&opts).await })
    };
    crate::support::poll_async("the writer to queue", POLL_DEADLINE, || async {
        Ok((t.client.waiters("wake", KeyLayout::HashTagged).await? == 1).then_some(()))
    })
    .await?;
    let epoch = a.fence();
    ensure!(a.release().await?.is_released());
    ensure!(!waiting.is_finished());
    ensure!(b.release().await?.is_released());
    // Woken well before the readers' 5 s leases would have lapsed.
    let writer = tokio::time::timeout(Duration::from_secs(3), waiting).await???;
    ensure!(writer.fence() > epoch);
    ensure!(writer.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn rw_leases_are_renewed_and_a_lapsed_one_is_lost() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("renew")?;
    let opts = t.client.options().ttl(Duration::from_millis(600));
    let reader = lock.try_read(&opts).await?;
    let other = lock.try_read(&opts).await?;
    // Renewed by the keeper (every 200 ms): alive after three ttls.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    ensure!(t.server.hgetall(reader.key()).len() == 3, "rw, r0 and r1");
    ensure!(!reader.is_lost() && !other.is_lost());
    // Another holder's field deleted under it: its next renewal loses it.
    t.server.cmd(&["HDEL", reader.key(), "r1"]);
    tokio::time::timeout(POLL_DEADLINE, other.lost()).await?;
    ensure!(!reader.is_lost());
    ensure!(reader.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_revoke_deposes_every_reader() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("report")?;
    let doc = t.client.fenced_hash("report:data")?;
    let opts = rw_opts(&t.client);
    let a = lock.try_read(&opts).await?;
    let b = lock.try_read(&opts).await?;
    let revoked = t
        .client
        .revoke("report", &t.client.options(), &[&doc])
        .await?;
    let deposed = revoked.deposed.context("a holder was deposed")?;
    ensure!(
        deposed.holder == a.holder_id(),
        "the lowest reader is named"
    );
    ensure!(revoked.fence > a.fence());
    ensure!(!t.server.exists("lock:{report}"), "every reader is gone");
    // Their validated reads are torn once the seal landed.
    ensure!(!doc.read_validated(b.fence()).await?.is_clean());
    // A writer gets the lock at once, above the revocation fence.
    let writer = lock.try_write(&opts).await?;
    ensure!(writer.fence() > revoked.fence);
    ensure!(!a.release().await?.is_released());
    ensure!(!b.release().await?.is_released());
    ensure!(writer.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn inspect_shows_the_writer_and_the_readers() -> Result<()> {
    let t = TestRedis::start().await?;
    let lock = t.client.rwlock("seen")?;
    let opts = rw_opts(&t.client);
    let writer = lock.try_write(&opts).await?;
    match t.client.inspect("seen", KeyLayout::HashTagged).await? {
        LockState::RwLock {
            writer: Some(w),
            readers,
            last_fence,
        } => {
            ensure!(w.holder == writer.holder_id() && w.fence == Some(writer.fence()));
            ensure!(readers.is_empty() && last_fence == Some(writer.fence()));
        }
        other => bail!("{other:?}"),
    }
    let fence = writer.fence();
    ensure!(writer.release().await?.is_released());
    let (a, b) = (lock.try_read(&opts).await?, lock.try_read(&opts).await?);
    match t.client.inspect("seen", KeyLayout::HashTagged).await? {
        LockState::RwLock {
            writer: None,
            readers,
            ..
        } => {
            let ids: Vec<_> = readers.iter().map(|r| r.holder.clone()).collect();
            ensure!(ids == [a.holder_id(), b.holder_id()], "{ids:?}");
            ensure!(readers.iter().all(|r| r.fence == Some(fence)));
        }
        other => bail!("{other:?}"),
    }
    ensure!(t.client.lock_names("*", KeyLayout::HashTagged).await? == ["seen"]);
    // No holder's token reaches the output.
    let shown = format!(
        "{:?}",
        t.client.inspect("seen", KeyLayout::HashTagged).await?
    );
    ensure!(!shown.contains(a.token()) && !shown.contains(b.token()));
    ensure!(a.release().await?.is_released() && b.release().await?.is_released());
    ensure!(matches!(
        t.client.inspect("seen", KeyLayout::HashTagged).await?,
        LockState::Free { .. }
    ));
    Ok(())
}

#[tokio::test]
async fn a_name_is_one_kind_of_lock_while_held() -> Result<()> {
    let t = TestRedis::start().await?;
    let opts = rw_opts(&t.client).wait(Duration::from_secs(20));
    let rw = t.client.rwlock("kind")?;

    // A read-write lock held: a mutex and a semaphore are refused at once,
    // even when they would wait, and nothing is changed.
    let reader = rw.try_read(&opts).await?;
    let before = t.server.hgetall(reader.key());
    let started = tokio::time::Instant::now();
    for (asked, attempt) in [
        ("mutex", t.client.acquire("kind", &opts).await),
        (
            "semaphore",
            t.client.acquire("kind", &opts.clone().permits(2)).await,
        ),
    ] {
        match attempt {
            Err(Error::KindConflict {
                name,
                held: "read-write lock",
                asked: got,
            }) => ensure!(name == "kind" && got == asked),
            other => bail!("a {asked} on a read-write lock: {other:?}"),
        }
    }
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    ensure!(
        t.server.hgetall(reader.key()) == before,
        "nothing was changed"
    );
    ensure!(reader.release().await?.is_released());

    // A mutex and a semaphore held: a read-write lock is refused.
    let mutex = t.client.try_acquire("kind", &opts).await?;
    for access in [Access::Read, Access::Write] {
        match t.client.acquire("kind", &opts.clone().access(access)).await {
            Err(Error::KindConflict {
                held: "mutex",
                asked: "read-write lock",
                ..
            }) => {}
            other => bail!("{access:?} on a mutex: {other:?}"),
        }
    }
    ensure!(mutex.release().await?.is_released());
    let permit = t
        .client
        .try_acquire("kind", &opts.clone().permits(2))
        .await?;
    match rw.write(&opts).await {
        Err(Error::KindConflict {
            held: "semaphore",
            asked: "read-write lock",
            ..
        }) => {}
        other => bail!("a writer on a semaphore: {other:?}"),
    }
    ensure!(permit.release().await?.is_released());
    // Free again: the name may change kind.
    let writer = rw.try_write(&opts).await?;
    ensure!(writer.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn bad_rwlock_options_are_refused_before_sending() -> Result<()> {
    let t = TestRedis::start().await?;
    let rw = t.client.rwlock("opts")?;
    let calls = t.server.script_calls();
    let both = t.client.options().permits(3);
    match rw.try_read(&both).await {
        Err(e @ Error::InvalidOption(_)) => {
            ensure!(e.to_string().contains("permits") && e.to_string().contains("read"))
        }
        other => bail!("permits with access: {other:?}"),
    }
    let guide = t.client.options().layout(KeyLayout::Guide);
    match rw.try_write(&guide).await {
        Err(e @ Error::InvalidOption(_)) => ensure!(e.to_string().contains("guide")),
        other => bail!("the guide layout: {other:?}"),
    }
    ensure!(t.server.script_calls() == calls, "nothing was sent");
    for bad in ["", "a\u{0}b", &"x".repeat(100_000)] {
        match t.client.rwlock(bad) {
            Err(Error::InvalidName { .. }) => {}
            other => bail!("the name {:?}: {other:?}", bad.get(..10)),
        }
    }
    Ok(())
}

#[tokio::test]
async fn with_read_and_with_write_release_on_every_path() -> Result<()> {
    let t = TestRedis::start().await?;
    let rw = t.client.rwlock("scoped")?;
    let opts = rw_opts(&t.client);
    let epoch = rw
        .with_write(&opts, |lease| async move { lease.fence() })
        .await?;
    let seen = rw
        .with_read(
            &opts,
            |lease| async move { (lease.fence(), lease.access()) },
        )
        .await?;
    ensure!(seen == (epoch, Some(Access::Read)));
    ensure!(!t.server.exists("lock:{scoped}"), "released");
    Ok(())
}

#[tokio::test]
async fn a_user_with_the_readme_rule_uses_rwlocks() -> Result<()> {
    let server = RedisServer::start();
    let url = server.acl_user("fencelock", &fencelock_testkit::acl::readme_acl_rule());
    let client = LockClient::connect(&url).await?;
    let lock = client.rwlock("acl")?;
    let fair = client
        .options()
        .wait_mode(WaitMode::Fair)
        .wait(Duration::from_secs(20));
    let reader = lock.try_read(&fair).await?;
    let waiting = {
        let (lock, fair) = (lock.clone(), fair.clone());
        tokio::spawn(async move { lock.write(&fair).await })
    };
    crate::support::poll_async("the writer to queue", POLL_DEADLINE, || async {
        Ok((client.waiters("acl", KeyLayout::HashTagged).await? == 1).then_some(()))
    })
    .await?;
    // The fair queue is read (a reader may not pass the writer).
    ensure!(matches!(
        lock.try_read(&fair).await,
        Err(Error::Contended { .. })
    ));
    reader.extend().await?;
    ensure!(matches!(
        client.inspect("acl", KeyLayout::HashTagged).await?,
        LockState::RwLock { .. }
    ));
    ensure!(reader.release().await?.is_released());
    let writer = tokio::time::timeout(POLL_DEADLINE, waiting).await???;
    ensure!(writer.release().await?.is_released());
    Ok(())
}

/// A client's, a lock's and a lease's `Debug` name holders by their public
/// id: neither the password nor any held token (a mutex's, a permit's, a
/// reader's) reaches them.
#[tokio::test]
async fn a_client_holding_every_kind_shows_no_secret() -> Result<()> {
    let secret = "rw-s3cret-pw";
    let server =
        RedisServer::start_with(fencelock_testkit::RedisConfig::default().with_password(secret));
    let url = server.url();
    ensure!(url.contains(secret), "the URL carries the password: {url}");
    let client = LockClient::connect(&url).await?;
    let lock = client.rwlock("secret")?;
    let reader = lock.try_read(&client.options()).await?;
    let mutex = client.try_acquire("plain", &client.options()).await?;
    let permit = client
        .try_acquire("pool", &client.options().permits(2))
        .await?;
    let shown = format!("{lock:?} {client:?} {reader:?} {mutex:?} {permit:?}");
    ensure!(!shown.contains(secret), "the password: {shown}");
    for lease in [&reader, &mutex, &permit] {
        ensure!(!shown.contains(lease.token()), "a token: {shown}");
        ensure!(shown.contains(&lease.holder_id()), "the holder id: {shown}");
    }
    for lease in [reader, mutex, permit] {
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}
