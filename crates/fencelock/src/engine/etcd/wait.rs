//! Waiting for a turn on etcd, for a mutex's and a read-write lock's
//! waiters: the keys in the way ([`Ahead`]), the watch for the deletion of
//! the newest of them, the sessions kept alive meanwhile ([`wait_turn`]),
//! and the move of a waiter's key to the holder's session
//! ([`move_to_session`]).

use tokio::time::Instant;

use super::attempt::{TXN_RETRY, WaitSessions};
use super::session::Session;
use crate::error::Result;
use crate::options::Access;
use crate::store::etcd::{EtcdConn, Look, RwKeys, attach, look, look_rw, watch_deletion};

/// Moves the waiter's key (created at `revision`) from the waiter session
/// to the holder's `session`, sent again while it fails transiently and
/// both live. `Ok(false)`: the key is gone (the waiter session expired), or
/// the holder's session is.
pub(super) async fn move_to_session(
    conn: &EtcdConn,
    key: &str,
    revision: i64,
    holder: &str,
    session: &Session,
    waiter: &Session,
) -> Result<bool> {
    loop {
        match attach(conn, key, revision, holder, session.id).await {
            Err(e)
                if e.is_retryable()
                    && Instant::now() + TXN_RETRY
                        < session.valid_until().min(waiter.valid_until()) =>
            {
                tokio::time::sleep(TXN_RETRY).await;
            }
            other => return other,
        }
    }
}

/// The keys a waiter waits for.
#[derive(Clone, Copy)]
pub(super) enum Ahead<'a> {
    /// A mutex's: every key before it under this prefix.
    Mutex(&'a str),
    /// A read-write lock's acquisition of this side: every key before it
    /// for a writer, every writer's key before it for a reader.
    RwLock(&'a RwKeys, Access),
}

/// Waits until no key in the way of ours (`key`, create revision
/// `revision`) is left, watching the newest of them (the one just before
/// ours, for a mutex) for its deletion, and keeping the sessions alive
/// every third of the shorter one. `Ok(false)`: a session or our key is
/// gone. `Ok(true)` is only as recent as the read that found our key
/// first: a linearizable one, unless our key is a mutex's on the waiter
/// session, whose move to the holder's session compares it again (`look`);
/// a read-write lock's look compares its key in the read itself
/// (`look_rw`).
pub(super) async fn wait_turn(
    conn: &EtcdConn,
    ahead: Ahead<'_>,
    (key, revision): (&str, i64),
    mut predecessor: Option<String>,
    sessions: &WaitSessions<'_>,
) -> Result<bool> {
    let every = sessions.every();
    let mut next_keep_alive = Instant::now() + every;
    loop {
        let watched = match predecessor.take() {
            Some(p) => p,
            None => {
                let seen = match ahead {
                    Ahead::Mutex(prefix) => {
                        look(conn, prefix, key, revision, sessions.waiter.is_some()).await?
                    }
                    Ahead::RwLock(keys, access) => {
                        look_rw(conn, keys, (key, access), revision).await?
                    }
                };
                match seen {
                    Look::Gone => return Ok(false),
                    Look::First => return Ok(true),
                    Look::Behind(key) => key,
                }
            }
        };
        let Some(mut deletion) = watch_deletion(conn, &watched).await? else {
            continue;
        };
        // Wait for the watch to end, keeping the sessions alive meanwhile.
        loop {
            tokio::select! {
                () = deletion.ended() => break,
                () = tokio::time::sleep_until(next_keep_alive) => {
                    match sessions.keep_alive(conn).await {
                        Ok(true) => next_keep_alive = Instant::now() + every,
                        Ok(false) => return Ok(false),
                        Err(e) => {
                            if Instant::now() >= sessions.valid_until() {
                                return Err(e);
                            }
                            next_keep_alive = Instant::now() + every / 4;
                        }
                    }
                }
            }
        }
    }
}
