//! Script calls: by SHA (`EVALSHA`), the script loaded and the call sent
//! again when the server does not have it (`NOSCRIPT`, after `SCRIPT
//! FLUSH`, a restart or a failover), so a flushed script cache is never
//! mistaken for "not held"; a call sent behind a `PING` when it must wake
//! a waiter first; and a call with its `WAIT` for replicas in one pipeline.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{FromRedisValue, RedisError};

use super::conn::{Link, RedisConn};
use super::ops::ScriptCall;
use crate::error::{Error, Result};

impl RedisConn {
    /// Runs a script call and decodes its reply.
    pub(crate) async fn run<C: ScriptCall>(&self, call: &C) -> Result<C::Reply> {
        self.invoke(call)
            .await
            .map_err(|e| self.map_error(e, &call.keys()))
    }

    /// Runs a script call and decodes its reply, leaving errors as the
    /// client library gives them.
    pub(super) async fn invoke<C: ScriptCall>(
        &self,
        call: &C,
    ) -> std::result::Result<C::Reply, RedisError> {
        let (cmd, script) = (evalsha(call), &call.script().script);
        // The key a call sent behind a PING is routed by (on a Cluster).
        let behind_ping = if call.wake_first() {
            call.keys().first().copied()
        } else {
            None
        };
        let sent = Sent {
            cmd: &cmd,
            script,
            behind_ping,
        };
        let reply =
            match &self.link {
                Link::Standalone { conn, .. } => evalsha_on(&mut conn.clone(), sent).await,
                Link::Cluster { conn, .. } => evalsha_on(&mut conn.clone(), sent).await,
                // Boxed: following a failover makes this future several times
                // larger than the others, and every call would carry its size.
                Link::Sentinel(link) => {
                    Box::pin(link.on_master(move |mut conn| async move {
                        evalsha_on(&mut conn, sent).await
                    }))
                    .await
                }
            }?;
        Ok(C::Reply::from_redis_value(reply)?)
    }

    /// Runs a script call and then `WAIT replicas timeout` in one pipeline
    /// on one connection, so the `WAIT` covers exactly the call's writes;
    /// returns the reply and how many replicas acknowledged. Behind
    /// Sentinel a failover retries both together on the new master (a
    /// `WAIT` on another connection than the write's would count nothing).
    pub(crate) async fn run_replicated<C: ScriptCall>(
        &self,
        call: &C,
        replicas: u32,
        timeout: Duration,
    ) -> Result<(C::Reply, u32)> {
        let keys = call.keys();
        let lua = call.script();
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(lua.script.get_hash())
            .arg(keys.len())
            .arg(&*keys)
            .arg(call);
        // WAIT 0 would wait forever: at least 1 ms.
        pipe.cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis().max(1));
        let route = keys.first().copied();
        let replied = match self.pipeline(&pipe, route).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(lua.source);
                self.plain::<String>(&load, route)
                    .await
                    .map_err(|e| self.map_error(e, &keys))?;
                self.pipeline(&pipe, route).await
            }
            replied => replied,
        };
        let (reply, acked): (redis::Value, i64) = replied.map_err(|e| self.map_error(e, &keys))?;
        let reply =
            C::Reply::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
        Ok((reply, u32::try_from(acked).unwrap_or(0)))
    }
}

/// The script invocation (by SHA, `NOSCRIPT` reloads) of `call`, for
/// raw calls of the testing surface.
#[cfg(feature = "testing")]
pub(crate) fn invocation<C: ScriptCall>(call: &C) -> redis::ScriptInvocation<'static> {
    invocation_of(call, call.script())
}

/// The invocation of `call` running `lua` in place of its own script (a
/// deliberately broken variant of it), for the testing surface.
#[cfg(feature = "testing")]
pub(crate) fn invocation_of<C: ScriptCall>(
    call: &C,
    lua: &'static super::scripts::Lua,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = lua.script.prepare_invoke();
    for key in call.keys().iter() {
        invocation.key(key);
    }
    invocation.arg(call);
    invocation
}

/// The `EVALSHA` command of `call`, its arguments written straight into
/// the command (a `ScriptInvocation` allocates each one on its own first,
/// then copies them all into a command like this one).
fn evalsha<C: ScriptCall>(call: &C) -> redis::Cmd {
    let keys = call.keys();
    // Room for a grant's arguments (SHA, key, token, …): a command that
    // outgrows its buffer reallocates it on every call.
    let mut cmd = redis::Cmd::with_capacity(16, 256);
    cmd.arg("EVALSHA")
        .arg(call.script().script.get_hash())
        .arg(keys.len());
    for key in keys.iter() {
        cmd.arg(key);
    }
    cmd.arg(call);
    cmd
}

/// Whether `e` says that the server does not have the script.
fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A connection that script calls are sent on.
trait SendCmd: redis::aio::ConnectionLike {
    /// Sends `cmd`; a server error in the reply is an `Err`.
    fn send<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl std::future::Future<Output = std::result::Result<redis::Value, RedisError>> + Send + 'a;

    /// Sends `PING` and `cmd` in one write, to the node of `key`, and
    /// returns `cmd`'s reply (see `Release::wake_first`).
    fn send_behind_ping<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
        key: &'a str,
    ) -> impl std::future::Future<Output = std::result::Result<redis::Value, RedisError>> + Send + 'a;
}

/// `PING`, then `cmd`: a pipeline whose second reply is the one wanted.
fn behind_ping(cmd: &redis::Cmd) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("PING").add_command(cmd.clone());
    pipe
}

/// The one reply asked of a pipeline, its server error as an `Err`.
fn only_reply(values: Vec<redis::Value>) -> std::result::Result<redis::Value, RedisError> {
    values
        .into_iter()
        .next()
        .ok_or_else(|| RedisError::from((redis::ErrorKind::Client, "no reply")))?
        .extract_error()
}

impl SendCmd for ConnectionManager {
    /// With the manager's own `send_packed_command`: going through its
    /// `ConnectionLike` implementation, as `query_async` does, boxes a
    /// future of 1.3 KB for each call, too large for the allocator's
    /// per-thread cache (measured: about one large allocation per lock
    /// cycle, and with it a consolidation of the allocator's free lists).
    async fn send(&mut self, cmd: &redis::Cmd) -> std::result::Result<redis::Value, RedisError> {
        self.send_packed_command(cmd).await?.extract_error()
    }

    async fn send_behind_ping(
        &mut self,
        cmd: &redis::Cmd,
        _key: &str,
    ) -> std::result::Result<redis::Value, RedisError> {
        only_reply(self.send_packed_commands(&behind_ping(cmd), 1, 1).await?)
    }
}

impl SendCmd for ClusterConnection {
    async fn send(&mut self, cmd: &redis::Cmd) -> std::result::Result<redis::Value, RedisError> {
        cmd.query_async(self).await
    }

    async fn send_behind_ping(
        &mut self,
        cmd: &redis::Cmd,
        key: &str,
    ) -> std::result::Result<redis::Value, RedisError> {
        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
        only_reply(self.route_pipeline(behind_ping(cmd), 1, 1, route).await?)
    }
}

/// One script call as sent: its `EVALSHA` command, its script, and the key
/// to route by if it goes behind a `PING`.
#[derive(Clone, Copy)]
struct Sent<'a> {
    cmd: &'a redis::Cmd,
    script: &'a redis::Script,
    behind_ping: Option<&'a str>,
}

/// Runs `sent` on `conn`, loading the script first if the server does not
/// have it.
async fn evalsha_on(
    conn: &mut impl SendCmd,
    sent: Sent<'_>,
) -> std::result::Result<redis::Value, RedisError> {
    let reply = match sent.behind_ping {
        Some(key) => conn.send_behind_ping(sent.cmd, key).await,
        None => conn.send(sent.cmd).await,
    };
    match reply {
        Err(e) if is_noscript(&e) => {
            sent.script.load_async(conn).await?;
            conn.send(sent.cmd).await
        }
        reply => reply,
    }
}
