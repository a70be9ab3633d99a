//! Where a waiter stands in an etcd lock's queue, and the watch for the
//! deletion of the key just before it (see `engine::etcd` for the wait
//! that uses them); a semaphore's waiters watch every deletion under the
//! semaphore's keys instead (`watch_deletions`).

use etcd_client::{
    EventType, GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions, WatchStream,
};

use super::conn::EtcdConn;
use crate::error::Result;

/// Where our key stands.
pub(crate) enum Look {
    /// Our key is gone (our lease expired).
    Gone,
    /// No key before ours: our turn.
    First,
    /// This key is just before ours.
    Behind(String),
}

/// Reads the two newest keys up to our create revision: ours, and the one
/// just before it if any.
///
/// `compared_after`: a transaction that compares our key's create revision
/// (the move to the holder's session, `attach`) runs after a `First`,
/// before anyone is told the lock is theirs. Then a serializable read
/// (served by the member, without a quorum round) is enough when it shows
/// our own key: it is a snapshot at a revision at or after our key's
/// creation, and keys created before ours can only disappear, never come
/// back; so "none before ours" in it is true now, and a key before ours
/// in it is watched only once a linearizable read found it still there.
/// What it cannot tell is that our own key is still there: a revoke
/// deletes the first key, ours once the key before it went, and a member
/// that has not applied the revoke yet still shows it first; the compare
/// that follows finds it gone. A member lagging behind may not show our
/// key yet: then a linearizable read decides. Without such a compare
/// (a waiter on the holder's session is told it holds at once) the read
/// is linearizable: a quorum round trip (etcd's ReadIndex, no Raft write)
/// more than a serializable read, once per look.
pub(crate) async fn look(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    compared_after: bool,
) -> Result<Look> {
    if !compared_after {
        return read_queue(conn, prefix, key, revision, false).await;
    }
    match read_queue(conn, prefix, key, revision, true).await? {
        Look::Gone => read_queue(conn, prefix, key, revision, false).await,
        seen => Ok(seen),
    }
}

async fn read_queue(
    conn: &EtcdConn,
    prefix: &str,
    key: &str,
    revision: i64,
    serializable: bool,
) -> Result<Look> {
    let mut options = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(revision)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_keys_only();
    if serializable {
        options = options.with_serializable();
        #[cfg(feature = "testing")]
        {
            options = conn.stale(options);
        }
    }
    let reply = conn
        .get(prefix, Some(options))
        .await
        .map_err(|e| conn.error(e, "reading the lock's queue"))?;
    let kvs = reply.kvs();
    match kvs.first() {
        Some(own) if own.key() == key.as_bytes() && own.create_revision() == revision => {}
        _ => return Ok(Look::Gone),
    }
    Ok(match kvs.get(1).and_then(|kv| kv.key_str().ok()) {
        Some(before) => Look::Behind(before.to_owned()),
        None => Look::First,
    })
}

/// A watch for the deletion of one key, started before the key was seen
/// still there (see [`watch_deletion`]).
#[derive(Debug)]
pub(crate) struct Deletion {
    stream: WatchStream,
}

impl Deletion {
    /// Completes when the watch ends: the key was deleted, or the watch was
    /// cancelled, compacted or broken. Any end means: look again.
    pub(crate) async fn ended(&mut self) {
        loop {
            match self.stream.message().await {
                Ok(Some(reply)) if reply.canceled() => return,
                Ok(Some(reply)) => {
                    if reply
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return;
                    }
                }
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// Watches `key` for its deletion. `None`: look again (the watch was not
/// created, or the key is gone already).
///
/// The watch starts now, then a read checks that the key is still there: a
/// watch from a past revision would start "unsynced" in etcd, and unsynced
/// watches get their events up to 100 ms late (etcd syncs them in the
/// background), which would slow every hand-over. A deletion after the
/// check comes after the watch's start: seen.
pub(crate) async fn watch_deletion(conn: &EtcdConn, key: &str) -> Result<Option<Deletion>> {
    let mut stream = conn
        .watch(
            key,
            Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
        )
        .await
        .map_err(|e| conn.error(e, "watching the lock"))?;
    match stream.message().await {
        Ok(Some(reply)) if reply.created() && !reply.canceled() => {}
        _ => return Ok(None),
    }
    let still_there = conn
        .get(key, Some(GetOptions::new().with_count_only()))
        .await
        .map_err(|e| conn.error(e, "reading the lock's queue"))?
        .count()
        > 0;
    Ok(still_there.then_some(Deletion { stream }))
}

/// A watch for deletions under one prefix (a semaphore's keys: a slot
/// freed, a waiter gone), kept open across the waits of one acquisition.
#[derive(Debug)]
pub(crate) struct Deletions {
    stream: WatchStream,
}

impl Deletions {
    /// Completes at the next deletion (`true`) or when the watch ends
    /// (`false`: cancelled, compacted or broken; watch again).
    pub(crate) async fn next(&mut self) -> bool {
        loop {
            match self.stream.message().await {
                Ok(Some(reply)) if reply.canceled() => return false,
                Ok(Some(reply)) => {
                    if reply
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return true;
                    }
                }
                Ok(None) | Err(_) => return false,
            }
        }
    }
}

/// Watches every key under `prefix` for deletions, from now. `None`: the
/// watch was not created (the caller reads again, and watches again).
/// A deletion after this returns is seen: the caller reads what it waits
/// for after the watch is created, so nothing between is missed (and the
/// watch starts "synced" in etcd, see [`watch_deletion`]).
pub(crate) async fn watch_deletions(conn: &EtcdConn, prefix: &str) -> Result<Option<Deletions>> {
    let mut stream = conn
        .watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoPut]),
            ),
        )
        .await
        .map_err(|e| conn.error(e, "watching the semaphore"))?;
    match stream.message().await {
        Ok(Some(reply)) if reply.created() && !reply.canceled() => Ok(Some(Deletions { stream })),
        _ => Ok(None),
    }
}
