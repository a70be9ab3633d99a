//! The fenced read-write lock on etcd (`LockClient::rwlock`, feature
//! `etcd`), against a real etcd member: a key per acquisition,
//! `NAME/rw/r/LEASE/ACQ` for a reader and `NAME/rw/w/LEASE/ACQ` for a
//! writer, on the client's session; a writer's fence is its key's create
//! revision, a reader's epoch its own key's.
//!
//! - sharing and exclusion: readers together, a writer alone, refusals
//!   that leave no key;
//! - fences and epochs: every reader's epoch above every earlier writer's
//!   fence and below every later writer's; validated reads torn once a
//!   later writer wrote, where an epoch from the grant's read revision
//!   (the negative control) calls them clean;
//! - one queue in every wait mode: a writer waits for the readers ahead of
//!   it and is woken when the last goes, without spinning (etcd #6408:
//!   counted in etcd's requests, with the counter shown to see a polling
//!   loop), a later reader waits for the queued writer;
//! - loss: renewed leases last, a revoked session's lease is lost, and a
//!   waiter whose key went with its session is never granted (etcd
//!   #16221), while a waiter that trusts its predecessor's deletion (the
//!   negative control) would hold beside a reader;
//! - revoke: every holder deposed, waiters queued again, the seal above
//!   every reader's epoch (the mutex's fence rule, the negative control,
//!   would leave a reader's reads clean);
//! - kinds: a mutex, a semaphore and a read-write lock refuse each other
//!   at once, in every direction, changing nothing;
//! - inspect, waiters and lock names; a lost join reply keeps one key; a
//!   waiter that times out or is dropped leaves no key;
//! - contention: a writer never with anyone, with a negative control.
//!
//! Every test name has `etcd` in it: nextest runs them one at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use etcd_client::{EventType, WatchOptions};
use fencelock::testing::etcd_hold_next_reply;
use fencelock::{
    Access, Error, FENCE_EPOCH_SIZE, Fence, KeyLayout, Lease, LockClient, LockOptions, LockState,
    LossReason, ValidatedRead, WaitMode, WriteOutcome, holder_id, read_is_clean,
};
use fencelock_testkit::EtcdCluster;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::etcd::{TestEtcd, keys_under};
use crate::support::{POLL_DEADLINE, poll_async};

/// `client`'s options with a ttl of 5 s (a waiter queues on the waiter
/// session).
fn rw_opts(client: &LockClient) -> LockOptions {
    client.options().ttl(Duration::from_secs(5))
}

/// The fence of create revision `revision` in the default epoch.
fn fence_at(revision: i64) -> Fence {
    Fence::new(FENCE_EPOCH_SIZE + u64::try_from(revision).unwrap_or(0))
}

/// Polls until `client` counts `n` waiters of `name`.
async fn waiters_reach(client: &LockClient, name: &str, n: u64) -> Result<()> {
    poll_async("the waiters to queue", POLL_DEADLINE, || async {
        Ok((client.waiters(name, KeyLayout::default()).await? == n).then_some(()))
    })
    .await
}

/// `access` of `name` on a client of its own, waiting with `opts`.
async fn spawn_side(
    t: &TestEtcd,
    name: &str,
    access: Access,
    opts: &LockOptions,
) -> Result<JoinHandle<fencelock::Result<Lease>>> {
    let client = LockClient::connect(&t.cluster.url()).await?;
    let (name, opts) = (name.to_owned(), opts.clone().access(access));
    Ok(tokio::spawn(
        async move { client.acquire(&name, &opts).await },
    ))
}

/// The `Range` and `Txn` requests the member has answered.
fn kv_requests(cluster: &EtcdCluster) -> f64 {
    ["Range", "Txn"]
        .iter()
        .map(|method| {
            cluster.metric(
                0,
                &format!("grpc_server_handled_total{{grpc_code=\"OK\",grpc_method=\"{method}\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}}"),
            )
        })
        .sum()
}

/// The current revision of the member.
async fn revision_now(admin: &mut etcd_client::Client) -> Result<i64> {
    let reply = admin.get("probe", None).await?;
    Ok(reply.header().context("a header")?.revision())
}

/// Readers share a name, each with a key `lock:NAME/rw/r/…` holding its
/// holder id and its create revision as its epoch; a writer's key is
/// `lock:NAME/rw/w/…`, its fence the create revision. A writer excludes
/// readers and writers, readers exclude writers; refusals leave no key,
/// and nothing is left once all are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_readers_share_and_a_writer_holds_alone() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let lock = t.client.rwlock("config")?;
    let opts = rw_opts(&t.client);

    let first = lock.try_write(&opts).await?;
    ensure!(first.access() == Some(Access::Write) && first.slot().is_none());
    ensure!(
        first.key().starts_with("lock:config/rw/w/"),
        "{}",
        first.key()
    );
    let keys = keys_under(&mut admin, "lock:config/").await?;
    ensure!(keys.len() == 1 && keys[0].0 == first.key(), "{keys:?}");
    ensure!(first.fence() == fence_at(keys[0].1));
    let stored = admin.get(first.key(), None).await?;
    ensure!(stored.kvs()[0].value_str()? == holder_id(first.token()));
    for (what, refused) in [
        ("a second writer", lock.try_write(&opts).await),
        ("a reader", lock.try_read(&opts).await),
    ] {
        match refused {
            Err(Error::Contended { name, .. }) => ensure!(name == "config"),
            other => bail!("{what} beside a writer: {other:?}"),
        }
    }
    ensure!(
        keys_under(&mut admin, "lock:config/").await?.len() == 1,
        "a refusal leaves no key"
    );
    let first_fence = first.fence();
    ensure!(first.release().await?.is_released());

    let a = lock.try_read(&opts).await?;
    let b = lock.try_read(&opts).await?;
    ensure!(a.access() == Some(Access::Read) && b.access() == Some(Access::Read));
    let keys = keys_under(&mut admin, "lock:config/").await?;
    ensure!(keys.len() == 2, "{keys:?}");
    for (lease, (key, revision, session)) in [&a, &b].into_iter().zip(&keys) {
        ensure!(lease.key() == key && key.starts_with("lock:config/rw/r/"));
        ensure!(
            lease.fence() == fence_at(*revision),
            "the epoch is its own revision"
        );
        ensure!(*session == keys[0].2, "one session for the client's leases");
    }
    ensure!(first_fence < a.fence() && a.fence() < b.fence());
    match lock.try_write(&opts).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a writer beside readers: {other:?}"),
    }
    ensure!(a.release().await?.is_released());
    match lock.try_write(&opts).await {
        Err(Error::Contended { .. }) => {}
        other => bail!("a writer must wait for the last reader: {other:?}"),
    }
    let b_fence = b.fence();
    ensure!(b.release().await?.is_released());
    let writer = lock.try_write(&opts).await?;
    ensure!(writer.fence() > b_fence);
    ensure!(writer.release().await?.is_released());
    ensure!(keys_under(&mut admin, "lock:config/").await?.is_empty());
    Ok(())
}

/// Every reader's epoch lies above the fence of every writer queued before
/// it and below the fence of every writer queued after it (W1 < R1 < W2 <
/// R2 < W3), so a validated read is torn exactly when a later writer wrote.
///
/// Negative control: an epoch taken from the revision at which the reader
/// was granted (what `etcdctl lock` exports as `ETCD_LOCK_REV`) lies above
/// the fence of a writer that queued behind the reader, and calls that
/// writer's later write clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_epochs_lie_between_the_writers_fences_and_reads_tear() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let lock = t.client.rwlock("doc")?;
    let doc = t.client.fenced_key("res/doc")?;
    let opts = rw_opts(&t.client).wait(Duration::from_secs(20));

    let w1 = lock.try_write(&opts).await?;
    ensure!(doc.write(w1.fence(), w1.token(), "v1").await?.is_accepted());
    let w1_fence = w1.fence();
    ensure!(w1.release().await?.is_released());
    let r1 = lock.try_read(&opts).await?;
    ensure!(r1.fence() > w1_fence);
    ensure!(doc.read_validated(r1.fence()).await?.is_clean());

    // Queued behind r1: a writer, a reader, a writer.
    let w2 = spawn_side(&t, "doc", Access::Write, &opts).await?;
    waiters_reach(&t.client, "doc", 1).await?;
    let r2 = spawn_side(&t, "doc", Access::Read, &opts).await?;
    waiters_reach(&t.client, "doc", 2).await?;
    let w3 = spawn_side(&t, "doc", Access::Write, &opts).await?;
    waiters_reach(&t.client, "doc", 3).await?;

    let r1_fence = r1.fence();
    ensure!(r1.release().await?.is_released());
    let w2 = tokio::time::timeout(POLL_DEADLINE, w2).await???;
    ensure!(w2.fence() > r1_fence);
    ensure!(doc.write(w2.fence(), w2.token(), "v2").await?.is_accepted());
    match doc.read_validated(r1_fence).await? {
        ValidatedRead::Torn { value, fence } => {
            ensure!(fence == w2.fence() && value.value.as_deref() == Some("v2"));
        }
        other => bail!("a read after a later writer wrote must be torn: {other:?}"),
    }
    let w2_fence = w2.fence();
    ensure!(w2.release().await?.is_released());
    let r2 = tokio::time::timeout(POLL_DEADLINE, r2).await???;
    ensure!(r2.fence() > w2_fence);
    ensure!(doc.read_validated(r2.fence()).await?.is_clean());
    // The revision at which r2 was granted: w3 had queued before it.
    let granted_at = revision_now(&mut admin).await?;

    // r2 is lost (its key deleted, as its session's expiry would) while
    // it still reads: w3 comes in and writes.
    admin.delete(r2.key(), None).await?;
    let w3 = tokio::time::timeout(POLL_DEADLINE, w3).await???;
    ensure!(
        w3.fence() > r2.fence(),
        "a later writer's fence is above the epoch"
    );
    ensure!(doc.write(w3.fence(), w3.token(), "v3").await?.is_accepted());
    match doc.read_validated(r2.fence()).await? {
        ValidatedRead::Torn { fence, .. } => ensure!(fence == w3.fence()),
        other => bail!("the lost reader's read must be torn: {other:?}"),
    }
    tokio::time::timeout(POLL_DEADLINE, r2.lost())
        .await
        .context("the lost reader's loss signal")?;
    // Negative control: the grant's read revision as the epoch.
    let header_epoch = fence_at(granted_at);
    ensure!(w3.fence() < header_epoch, "w3 queued before r2 was granted");
    ensure!(
        read_is_clean(Some(w3.fence()), header_epoch),
        "the header revision would call w3's write clean"
    );
    ensure!(!read_is_clean(Some(w3.fence()), r2.fence()));
    let w3_fence = w3.fence();
    ensure!(w3.release().await?.is_released());
    let fresh = lock.try_read(&opts).await?;
    ensure!(fresh.fence() > w3_fence);
    ensure!(doc.read_validated(fresh.fence()).await?.is_clean());
    ensure!(fresh.release().await?.is_released());
    Ok(())
}

/// One queue in every wait mode, on either session (ttl 5 s: waiters on
/// the waiter session; ttl 2 s: on the holder's): with two readers
/// holding, a writer queues, and a reader after it waits for it (a try is
/// refused too). The writer is not let in when the first reader leaves,
/// and is woken at once when the last one does; the later reader comes in
/// after the writer. While the writer waits it sends etcd no requests
/// beyond its sessions' keep-alives (etcd #6408: RWMutex's write path
/// could spin).
///
/// Negative control: the request counter does see a loop of reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_queue_is_fifo_and_a_waiting_writer_does_not_spin() -> Result<()> {
    let t = TestEtcd::single().await?;
    for (mode, ttl) in [
        (WaitMode::Fair, 5),
        (WaitMode::Notify, 2),
        (WaitMode::Poll, 5),
    ] {
        let name = format!("fifo-{mode:?}");
        let lock = t.client.rwlock(&name)?;
        let opts = t
            .client
            .options()
            .wait_mode(mode)
            .ttl(Duration::from_secs(ttl))
            .wait(Duration::from_secs(20));
        let r1 = lock.try_read(&opts).await?;
        let r2 = lock.try_read(&opts).await?;
        let writer = spawn_side(&t, &name, Access::Write, &opts).await?;
        waiters_reach(&t.client, &name, 1).await?;
        let reader = spawn_side(&t, &name, Access::Read, &opts).await?;
        waiters_reach(&t.client, &name, 2).await?;
        match lock.try_read(&opts).await {
            Err(Error::Contended { .. }) => {}
            other => bail!("{mode:?}: a reader must not pass a queued writer: {other:?}"),
        }

        let before = kv_requests(&t.cluster);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let spent = kv_requests(&t.cluster) - before;
        ensure!(
            spent < 15.0,
            "{mode:?}: {spent} requests in a second of waiting"
        );

        let (r1_fence, r2_fence) = (r1.fence(), r2.fence());
        ensure!(r1.release().await?.is_released());
        tokio::time::sleep(Duration::from_millis(200)).await;
        ensure!(
            !writer.is_finished(),
            "{mode:?}: the writer passed a reader"
        );
        let released = Instant::now();
        ensure!(r2.release().await?.is_released());
        let w = tokio::time::timeout(POLL_DEADLINE, writer).await???;
        let took = released.elapsed();
        ensure!(
            took < Duration::from_secs(1),
            "{mode:?}: woken after {took:?}"
        );
        ensure!(w.access() == Some(Access::Write));
        ensure!(w.fence() > r2_fence && r2_fence > r1_fence);
        tokio::time::sleep(Duration::from_millis(200)).await;
        ensure!(
            !reader.is_finished(),
            "{mode:?}: the later reader must wait for the writer"
        );
        let w_fence = w.fence();
        ensure!(w.release().await?.is_released());
        let r3 = tokio::time::timeout(POLL_DEADLINE, reader).await???;
        ensure!(r3.fence() > w_fence);
        ensure!(r3.release().await?.is_released());
    }
    // Negative control: twenty reads are counted as twenty requests.
    let before = kv_requests(&t.cluster);
    for _ in 0..20 {
        t.client.inspect("fifo-Fair", KeyLayout::default()).await?;
    }
    let counted = kv_requests(&t.cluster) - before;
    ensure!(counted >= 20.0, "a polling loop went uncounted ({counted})");
    Ok(())
}

/// Renewed readers and writers outlive their ttl; a lease whose session
/// is revoked behind the client's back is lost (Expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_leases_are_renewed_and_lost_with_their_session() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let other = LockClient::connect(&t.cluster.url()).await?;
    let opts = t.client.options().ttl(Duration::from_secs(2));
    let doomed = t.client.rwlock("renew")?.try_read(&opts).await?;
    let kept = other.rwlock("renew")?.try_read(&opts).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(!doomed.is_lost() && !kept.is_lost(), "renewed leases lost");
    let session = keys_under(&mut admin, doomed.key())
        .await?
        .first()
        .map(|(_, _, lease)| *lease)
        .context("the doomed reader's key")?;
    admin.lease_revoke(session).await?;
    tokio::time::timeout(Duration::from_secs(5), doomed.lost())
        .await
        .context("the loss signal of the reader whose session died")?;
    ensure!(doomed.loss_reason() == Some(LossReason::Expired));
    ensure!(!kept.is_lost(), "the other client's reader was lost");
    ensure!(!doomed.release().await?.is_released());
    ensure!(kept.release().await?.is_released());
    // The client's next lease lives on a new session; a writer renews too.
    let writer = t.client.rwlock("renew")?.try_write(&opts).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(!writer.is_lost());
    let now = keys_under(&mut admin, writer.key()).await?;
    ensure!(now.first().is_some_and(|(_, _, lease)| *lease != session));
    ensure!(writer.release().await?.is_released());
    Ok(())
}

/// A waiter whose session is revoked while it waits is never granted on
/// its deleted key (etcd #16221): with a writer holding, a writer B waits
/// and a reader C waits behind B; B's session is revoked, then the holder
/// leaves. C is granted (nothing is ahead of it now) and B, queued again,
/// waits for C and gets a fence above C's.
///
/// Negative control: a waiter that takes its predecessor's deletion for
/// the grant (RWMutex's wait, as bare etcd calls), its key gone with its
/// revoked lease, declares itself the writer while reader C holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_a_waiter_whose_session_was_revoked_is_never_granted() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let name = "revoked-waiter";
    let lock = t.client.rwlock(name)?;
    // A ttl of 2 s: B's key lives on its holder session, with no move to
    // compare it again once it is first.
    let opts = t
        .client
        .options()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(20));
    let holder = lock.try_write(&opts).await?;
    let b = spawn_side(&t, name, Access::Write, &opts).await?;
    waiters_reach(&t.client, name, 1).await?;
    let keys = keys_under(&mut admin, "lock:revoked-waiter/").await?;
    let (b_key, b_revision, b_session) = keys.get(1).cloned().context("B's key")?;
    ensure!(b_key.contains("/rw/w/"), "{keys:?}");

    // The negative control's waiter: a key of its own behind B, waiting
    // for the holder's key to go, as RWMutex does.
    let naive_lease = admin.lease_grant(30, None).await?.id();
    let naive_key = format!("lock:{name}/rw/w/{naive_lease:x}/1");
    admin
        .put(
            naive_key.as_str(),
            "naive",
            Some(etcd_client::PutOptions::new().with_lease(naive_lease)),
        )
        .await?;
    let mut events = admin
        .watch(
            holder.key(),
            Some(WatchOptions::new().with_start_revision(b_revision)),
        )
        .await?;
    let naive = tokio::spawn(async move {
        while let Some(reply) = events.message().await? {
            if reply
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                return anyhow::Ok(Instant::now());
            }
        }
        bail!("the watch ended")
    });

    let c = spawn_side(&t, name, Access::Read, &opts).await?;
    waiters_reach(&t.client, name, 3).await?;
    admin.lease_revoke(b_session).await?;
    admin.lease_revoke(naive_lease).await?;
    ensure!(keys_under(&mut admin, &b_key).await?.is_empty());

    ensure!(holder.release().await?.is_released());
    let c = tokio::time::timeout(POLL_DEADLINE, c).await???;
    ensure!(c.access() == Some(Access::Read));
    let naive_granted = tokio::time::timeout(POLL_DEADLINE, naive).await???;
    // Negative control: the naive waiter says it writes while C reads.
    ensure!(!c.is_lost() && naive_granted.elapsed() < POLL_DEADLINE);
    ensure!(
        keys_under(&mut admin, &naive_key).await?.is_empty(),
        "the naive waiter's key is gone, and it writes anyway"
    );
    // Ours: B waits for C.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(!b.is_finished(), "B was granted while reader C holds");
    let c_fence = c.fence();
    ensure!(c.release().await?.is_released());
    let b = tokio::time::timeout(POLL_DEADLINE, b).await???;
    ensure!(b.fence() > c_fence && b.key() != b_key);
    ensure!(b.fence() > fence_at(b_revision));
    ensure!(b.release().await?.is_released());
    Ok(())
}

/// A revoke of a read-write lock deposes every reader at once (the oldest
/// is named), seals the resource above every reader's epoch (their
/// validated reads are torn), and the writer that waited queues again
/// and gets the lock above the revocation fence. A revoke of a writer
/// refuses its later writes.
///
/// Negative control: the mutex's rule (the revocation fence just below
/// the next key's revision) gives the fence of the last reader here, which
/// leaves that reader's reads clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_revoke_deposes_every_holder_and_seals_above_every_epoch() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let lock = t.client.rwlock("report")?;
    let doc = t.client.fenced_key("res/report")?;
    let opts = rw_opts(&t.client).wait(Duration::from_secs(20));
    let w0 = lock.try_write(&opts).await?;
    ensure!(doc.write(w0.fence(), w0.token(), "v0").await?.is_accepted());
    ensure!(w0.release().await?.is_released());

    let a = lock.try_read(&opts).await?;
    let b = lock.try_read(&opts).await?;
    let writer = spawn_side(&t, "report", Access::Write, &opts).await?;
    waiters_reach(&t.client, "report", 1).await?;
    let keys = keys_under(&mut admin, "lock:report/").await?;
    let waiting = keys.get(2).context("the writer's key")?.1;
    ensure!(doc.read_validated(b.fence()).await?.is_clean());

    let revoked = t
        .client
        .revoke("report", &t.client.options(), &[&doc])
        .await?;
    let deposed = revoked.deposed.clone().context("a holder was deposed")?;
    ensure!(
        deposed.holder == a.holder_id(),
        "the oldest reader is named"
    );
    ensure!(deposed.fence == Some(a.fence()));
    ensure!(revoked.fence > b.fence() && revoked.fence > a.fence());
    ensure!(revoked.sealed[0].outcome == WriteOutcome::Accepted);
    for reader in [&a, &b] {
        ensure!(!doc.read_validated(reader.fence()).await?.is_clean());
    }
    let writer = tokio::time::timeout(POLL_DEADLINE, writer).await???;
    ensure!(
        writer.fence() > revoked.fence,
        "the waiter queued again above it"
    );
    ensure!(
        doc.write(writer.fence(), writer.token(), "v1")
            .await?
            .is_accepted()
    );
    for reader in [&a, &b] {
        tokio::time::timeout(POLL_DEADLINE, reader.lost())
            .await
            .context("a deposed reader's loss signal")?;
        ensure!(reader.loss_reason() == Some(LossReason::TakenOver));
    }
    // Negative control: the mutex's fence rule.
    ensure!(
        waiting == revision_of(&b)? + 1,
        "the writer queued right behind b"
    );
    let mutex_rule = fence_at(waiting - 1);
    ensure!(
        read_is_clean(Some(mutex_rule), b.fence()),
        "a seal at the mutex's revocation fence leaves b's reads clean"
    );
    ensure!(writer.release().await?.is_released());

    // A writer deposed: its later writes are refused.
    let w = lock.try_write(&opts).await?;
    let revoked = t
        .client
        .revoke("report", &t.client.options(), &[&doc])
        .await?;
    let deposed = revoked.deposed.clone().context("the writer was deposed")?;
    ensure!(deposed.holder == w.holder_id() && deposed.fence == Some(w.fence()));
    ensure!(revoked.fence > w.fence());
    ensure!(!doc.write(w.fence(), w.token(), "late").await?.is_accepted());
    ensure!(keys_under(&mut admin, "lock:report/").await?.is_empty());
    let next = lock.try_write(&opts).await?;
    ensure!(next.fence() > revoked.fence);
    ensure!(
        doc.write(next.fence(), next.token(), "v2")
            .await?
            .is_accepted()
    );
    let next_fence = next.fence();
    ensure!(next.release().await?.is_released());
    // A free read-write lock: nothing deposed.
    let free = t.client.revoke("report", &t.client.options(), &[]).await?;
    ensure!(free.deposed.is_none() && free.fence > next_fence);
    Ok(())
}

/// The create revision behind a lease's fence.
fn revision_of(lease: &Lease) -> Result<i64> {
    Ok(i64::try_from(lease.fence().get() - FENCE_EPOCH_SIZE)?)
}

/// One name is one kind while it has holders: a read-write lock held,
/// a mutex (once, waiting on its holder session, waiting on the waiter
/// session) and a semaphore are refused at once; a mutex or a semaphore
/// held, readers and writers are refused at once (the same three ways);
/// nothing is written. Negative control: once the holders are gone,
/// every kind takes the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_and_the_other_kinds_refuse_each_other_at_once() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let waiting = Duration::from_secs(5);
    let name = "kind";
    let base = t.client.options();
    let ways = [
        (base.clone(), false),
        (base.clone().ttl(Duration::from_secs(2)).wait(waiting), true),
        (
            base.clone().ttl(Duration::from_secs(10)).wait(waiting),
            true,
        ),
    ];
    let take = |opts: LockOptions, wait: bool| {
        let client = t.client.clone();
        async move {
            if wait {
                client.acquire(name, &opts).await
            } else {
                client.try_acquire(name, &opts).await
            }
        }
    };

    for held_by in [Access::Read, Access::Write] {
        let holder = t
            .client
            .try_acquire(name, &base.clone().access(held_by))
            .await?;
        let before = keys_under(&mut admin, "lock:kind/").await?;
        let mut asks: Vec<(LockOptions, bool, &str)> =
            ways.iter().map(|(o, w)| (o.clone(), *w, "mutex")).collect();
        asks.push((base.clone().permits(2), false, "semaphore"));
        asks.push((base.clone().permits(2).wait(waiting), true, "semaphore"));
        for (opts, wait, asked) in asks {
            let started = Instant::now();
            match take(opts, wait).await {
                Err(Error::KindConflict {
                    name: n,
                    held: "read-write lock",
                    asked: got,
                }) => ensure!(n == name && got == asked),
                other => bail!("a {asked} on a read-write lock: {other:?}"),
            }
            ensure!(
                started.elapsed() < Duration::from_secs(2),
                "refused at once"
            );
        }
        ensure!(
            keys_under(&mut admin, "lock:kind/").await? == before,
            "nothing was written"
        );
        ensure!(holder.release().await?.is_released());
    }

    for (held, holder_opts) in [
        ("mutex", base.clone()),
        ("semaphore", base.clone().permits(2)),
    ] {
        let holder = t.client.try_acquire(name, &holder_opts).await?;
        let before = keys_under(&mut admin, "lock:kind/").await?;
        for access in [Access::Read, Access::Write] {
            for (opts, wait) in &ways {
                let started = Instant::now();
                match take(opts.clone().access(access), *wait).await {
                    Err(e @ Error::KindConflict { .. }) => {
                        let text = e.to_string();
                        ensure!(
                            text.contains(&format!("held as a {held}"))
                                && text.contains("asked for as a read-write lock"),
                            "{text}"
                        );
                    }
                    other => bail!("{access:?} on a {held}: {other:?}"),
                }
                ensure!(
                    started.elapsed() < Duration::from_secs(2),
                    "refused at once"
                );
            }
        }
        ensure!(
            keys_under(&mut admin, "lock:kind/").await? == before,
            "nothing was written"
        );
        ensure!(holder.release().await?.is_released());
    }

    // Negative control: free, the name takes any kind.
    for opts in [
        base.clone().access(Access::Write),
        base.clone(),
        base.clone().permits(2),
        base.clone().access(Access::Read),
    ] {
        let lease = t.client.try_acquire(name, &opts).await?;
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}

/// inspect shows the writer (holder id, fence, time left) or the readers
/// (each with its epoch), not the waiters; waiters counts the keys behind
/// the holders; lock names list the read-write lock; no token is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_inspect_waiters_and_lock_names_show_its_holders() -> Result<()> {
    let t = TestEtcd::single().await?;
    let ttl = Duration::from_secs(5);
    let lock = t.client.rwlock("seen")?;
    let opts = rw_opts(&t.client).wait(Duration::from_secs(20));
    let writer = lock.try_write(&opts).await?;
    let queued = spawn_side(&t, "seen", Access::Read, &opts).await?;
    waiters_reach(&t.client, "seen", 1).await?;
    match t.client.inspect("seen", KeyLayout::default()).await? {
        LockState::RwLock {
            writer: Some(w),
            readers,
            last_fence: None,
        } => {
            ensure!(w.holder == writer.holder_id() && w.fence == Some(writer.fence()));
            ensure!(w.remaining <= ttl && w.remaining >= ttl / 2, "{w:?}");
            ensure!(readers.is_empty(), "a queued reader is not a holder");
        }
        other => bail!("{other:?}"),
    }
    ensure!(writer.release().await?.is_released());
    let queued = tokio::time::timeout(POLL_DEADLINE, queued).await???;
    let (a, b) = (lock.try_read(&opts).await?, lock.try_read(&opts).await?);
    let waiting = spawn_side(&t, "seen", Access::Write, &opts).await?;
    waiters_reach(&t.client, "seen", 1).await?;
    let behind = spawn_side(&t, "seen", Access::Read, &opts).await?;
    waiters_reach(&t.client, "seen", 2).await?;
    let m = t
        .client
        .try_acquire("seen-mutex", &t.client.options())
        .await?;
    let state = t.client.inspect("seen", KeyLayout::default()).await?;
    match &state {
        LockState::RwLock {
            writer: None,
            readers,
            last_fence: None,
        } => {
            let shown: Vec<_> = readers
                .iter()
                .map(|r| (r.holder.clone(), r.fence))
                .collect();
            let want: Vec<_> = [&queued, &a, &b]
                .iter()
                .map(|l| (l.holder_id(), Some(l.fence())))
                .collect();
            ensure!(shown == want, "{shown:?}");
        }
        other => bail!("{other:?}"),
    }
    let printed = format!("{state:?}");
    ensure!(
        ![&queued, &a, &b]
            .iter()
            .any(|l| printed.contains(l.token()))
    );
    let names = t.client.lock_names("*", KeyLayout::default()).await?;
    ensure!(names == ["seen", "seen-mutex"], "{names:?}");
    for lease in [queued, a, b, m] {
        ensure!(lease.release().await?.is_released());
    }
    let w = tokio::time::timeout(POLL_DEADLINE, waiting).await???;
    ensure!(w.release().await?.is_released());
    let r = tokio::time::timeout(POLL_DEADLINE, behind).await???;
    ensure!(r.release().await?.is_released());
    ensure!(matches!(
        t.client.inspect("seen", KeyLayout::default()).await?,
        LockState::Free { last_fence: None }
    ));
    ensure!(t.client.waiters("seen", KeyLayout::default()).await? == 0);
    Ok(())
}

/// A join whose reply is lost (etcd applied it) is sent again and finds
/// its key: one key, the fence its create revision. A waiter that times
/// out, and one that is dropped, leave no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_a_lost_reply_keeps_one_key_and_a_waiter_that_gives_up_leaves_none()
-> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let lock = t.client.rwlock("lost")?;
    let opts = rw_opts(&t.client);
    for access in [Access::Read, Access::Write] {
        let deliver = etcd_hold_next_reply(&t.client, true)?;
        let acquire = {
            let lock = lock.clone();
            let opts = opts.clone();
            tokio::spawn(async move {
                match access {
                    Access::Read => lock.try_read(&opts).await,
                    Access::Write => lock.try_write(&opts).await,
                }
            })
        };
        let admin_ref = &admin;
        let (first, revision, _) = poll_async("the first send's key", POLL_DEADLINE, || {
            let mut admin = admin_ref.clone();
            async move { Ok(keys_under(&mut admin, "lock:lost/").await?.first().cloned()) }
        })
        .await?;
        drop(deliver);
        let held = acquire.await??;
        ensure!(held.key() == first && held.fence() == fence_at(revision));
        ensure!(keys_under(&mut admin, "lock:lost/").await?.len() == 1);
        ensure!(held.release().await?.is_released());
    }

    let writer = lock.try_write(&opts).await?;
    let timed_out = lock
        .read(&opts.clone().wait(Duration::from_millis(300)))
        .await;
    ensure!(
        matches!(&timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    ensure!(keys_under(&mut admin, "lock:lost/").await?.len() == 1);
    let dropped = spawn_side(
        &t,
        "lost",
        Access::Read,
        &opts.clone().wait(Duration::from_secs(20)),
    )
    .await?;
    waiters_reach(&t.client, "lost", 1).await?;
    dropped.abort();
    let _ = dropped.await;
    let admin_ref = &admin;
    poll_async("the dropped waiter's key to go", POLL_DEADLINE, || {
        let mut admin = admin_ref.clone();
        async move { Ok((keys_under(&mut admin, "lock:lost/").await?.len() == 1).then_some(())) }
    })
    .await?;
    ensure!(writer.release().await?.is_released());
    ensure!(keys_under(&mut admin, "lock:lost/").await?.is_empty());
    Ok(())
}

/// Readers and writers holding at once, counted while each holds, and the
/// fences they were given.
#[derive(Debug, Default)]
struct Census {
    /// Readers holding now, plus 1000 per writer.
    now: AtomicI64,
    /// The most readers seen at once.
    most_readers: AtomicI64,
    /// The last writer's fence, in grant order.
    last_writer: Mutex<u64>,
}

/// `workers` clients each take the lock `cycles` times, one in
/// `write_every` as the writer (none if 0), half of them on the waiter
/// session (ttl 5 s) and half on the holder's (2 s): a writer must be
/// alone, writers' fences must grow in grant order, and a reader's epoch
/// must be above the fence of every writer granted before it. Returns the
/// most readers that held at once.
async fn contend(t: &TestEtcd, workers: usize, cycles: usize, write_every: usize) -> Result<i64> {
    let census = Arc::new(Census::default());
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = LockClient::connect(&t.cluster.url()).await?;
        let census = census.clone();
        tasks.push(tokio::spawn(async move {
            let lock = client.rwlock("shared")?;
            let ttl = Duration::from_secs(if w % 2 == 0 { 5 } else { 2 });
            let opts = client.options().ttl(ttl).wait(Duration::from_secs(60));
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
                {
                    let mut last = census.last_writer.lock().await;
                    let fence = lease.fence().get();
                    if write {
                        ensure!(fence > *last, "writer fence {fence} after {last}");
                        *last = fence;
                    } else {
                        ensure!(fence > *last, "reader epoch {fence} below writer {last}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
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

/// Six clients, one grant in three a writer's: never a writer with anyone
/// else, writers' fences growing, every reader's epoch above the writers
/// before it, nothing left behind. Negative control: the same census on
/// readers alone sees them share, so a writer let in with readers would
/// be caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_etcd_rwlock_a_writer_is_never_with_anyone() -> Result<()> {
    let t = TestEtcd::single().await?;
    let mut admin = t.admin().await?;
    let started = Instant::now();
    contend(&t, 6, 25, 3).await?;
    let most = contend(&t, 6, 25, 0).await?;
    ensure!(most >= 2, "readers never shared ({most})");
    eprintln!("300 contended read-write grants in {:?}", started.elapsed());
    let left = keys_under(&mut admin, "lock:shared/").await?;
    ensure!(left.is_empty(), "{left:?}");
    Ok(())
}
