//! The connection seam: [`RedisConn`], the one connection type the rest of
//! the library talks to Redis through.
//!
//! A client has one multiplexed, auto-reconnecting connection for its calls
//! and, once a waiter needs it, one pub/sub connection. Which kind of Redis
//! deployment is behind them is this module's business only: [`Link`] has a
//! variant per deployment (one standalone server today), and every call goes
//! through [`RedisConn::run`] (a typed script call, by SHA, reloaded
//! transparently on `NOSCRIPT`) or [`RedisConn::cmd`] (a plain command),
//! which map client errors to [`Error`] variants that name the
//! URL without its password.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, IntoConnectionInfo, ScriptInvocation};

use super::ops::{Publish, ScriptCall};
use super::url::{redact, redact_url_in};
use super::{audit, errors};
use crate::error::{Error, Result, is_transient};

/// Connection settings chosen by the client builder.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// How a [`RedisConn`] reaches its Redis: one variant per kind of
/// deployment.
#[derive(Clone)]
enum Link {
    /// One standalone server.
    Standalone(ConnectionManager),
}

/// A multiplexed, auto-reconnecting connection to one Redis deployment.
#[derive(Clone)]
pub(crate) struct RedisConn {
    link: Link,
    /// The URL without its password, for error messages.
    url: String,
    /// Kept to open the client's pub/sub connection when first needed.
    client: redis::Client,
    settings: ConnSettings,
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConn").field("url", &self.url).finish()
    }
}

impl RedisConn {
    /// Connects, failing fast with an error that names the URL.
    pub(crate) async fn connect(url: &str, settings: &ConnSettings) -> Result<Self> {
        let shown = redact(url);
        let bad_url = |e: redis::RedisError| {
            Error::InvalidOption(format!(
                "bad Redis URL {shown}: {}",
                redact_url_in(&e.to_string(), url)
            ))
        };
        let info = url.into_connection_info().map_err(bad_url)?;
        let db = info.redis_settings().db();
        let client = redis::Client::open(info).map_err(bad_url)?;
        let connect_error = |e: redis::RedisError| connect_error(&shown, db, e);
        let manager = ConnectionManager::new_with_config(client.clone(), manager_config(settings))
            .await
            .map_err(connect_error)?;
        // The manager only opens a socket (and AUTHs if the URL has a
        // password): a server that requires a password, or one that accepts
        // TCP but answers nothing, would only fail at the first lock call
        // (a grant without AUTH is even cut off as "unauthenticated multibulk
        // length"). One PING makes `connect` fail fast with Auth/Unreachable.
        redis::cmd("PING")
            .query_async::<String>(&mut manager.clone())
            .await
            .map_err(connect_error)?;
        // Best effort: an ACL user without INFO still gets its locks.
        if let Ok(info) = redis::cmd("INFO")
            .arg("memory")
            .query_async::<String>(&mut manager.clone())
            .await
            && let Some(warning) = audit::eviction_warning(&info)
        {
            tracing::warn!(url = %shown, "{warning}");
            crate::metrics::deployment_warning("evicting_maxmemory_policy");
        }
        Ok(RedisConn {
            link: Link::Standalone(manager),
            url: shown,
            client,
            settings: settings.clone(),
        })
    }

    /// Opens a second, RESP3 connection for pub/sub: pushes go to `sender`,
    /// and subscriptions are restored automatically after a reconnect.
    pub(super) async fn connect_pubsub(
        &self,
        sender: impl redis::aio::AsyncPushSender,
    ) -> Result<ConnectionManager> {
        let info = self.client.get_connection_info().clone();
        let redis_settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let db = redis_settings.db();
        let client = redis::Client::open(info.set_redis_settings(redis_settings))
            .map_err(|e| connect_error(&self.url, db, e))?;
        let config = manager_config(&self.settings)
            .set_push_sender(sender)
            .set_automatic_resubscription();
        ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| connect_error(&self.url, db, e))
    }

    /// Maps a client error on the pub/sub connection.
    pub(super) fn error(&self, e: redis::RedisError) -> Error {
        self.map_error(e, &[])
    }

    /// The URL without its password.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The command that publishes wake-ups on this deployment.
    pub(crate) fn publish(&self) -> Publish {
        match self.link {
            Link::Standalone(_) => Publish::Publish,
        }
    }

    /// Runs a script call and decodes its reply.
    pub(crate) async fn run<C: ScriptCall>(&self, call: &C) -> Result<C::Reply> {
        let keys = call.keys();
        let invocation = invocation(call);
        match &self.link {
            Link::Standalone(manager) => invocation.invoke_async(&mut manager.clone()).await,
        }
        .map_err(|e| self.map_error(e, &keys))
    }

    /// Runs a plain command on `key` (used for reads such as `HMGET`).
    pub(crate) async fn cmd<T: FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> Result<T> {
        match &self.link {
            Link::Standalone(manager) => cmd.query_async(&mut manager.clone()).await,
        }
        .map_err(|e| self.map_error(e, &[key]))
    }

    fn map_error(&self, e: redis::RedisError, keys: &[&str]) -> Error {
        if let (Some(code), Some(detail)) = (e.code(), e.detail())
            && let Some(error) = errors::classify(code, detail, keys)
        {
            return error;
        }
        if e.kind() == redis::ErrorKind::AuthenticationFailed
            || e.code() == Some("NOAUTH")
            || e.code() == Some("WRONGPASS")
        {
            return Error::Auth {
                url: self.url.clone(),
                source: e,
            };
        }
        if is_transient(&e) {
            return Error::Unreachable {
                url: self.url.clone(),
                source: e,
            };
        }
        Error::Redis(e)
    }
}

/// The script invocation (by SHA, `NOSCRIPT` reloads) of `call`.
pub(crate) fn invocation<C: ScriptCall>(call: &C) -> ScriptInvocation<'static> {
    let mut invocation = call.script().prepare_invoke();
    for key in call.keys() {
        invocation.key(key);
    }
    invocation.arg(call);
    invocation
}

/// How the connection managers of a client connect and reconnect.
fn manager_config(settings: &ConnSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        // Reconnects happen in the background after a failed command; keep
        // them quick so a restarted Redis is found again promptly.
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
}

/// An error while connecting to `url` (shown without its password), whose
/// database number is `db`.
fn connect_error(url: &str, db: i64, e: redis::RedisError) -> Error {
    if e.to_string().contains("DB index is out of range") {
        return Error::Config {
            url: url.to_string(),
            detail: format!(
                "the server has no database {db} (raise its `databases` setting, or use a lower number)"
            ),
        };
    }
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
    {
        Error::Auth {
            url: url.to_string(),
            source: e,
        }
    } else {
        Error::Unreachable {
            url: url.to_string(),
            source: e,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencelock_testkit::RedisServer;

    use super::*;
    use crate::backend::ops::{Checked, Grant, GrantReply, Mint, PassOn, Release};
    use crate::backend::wire::{QueueMember, Wake, wake_channel};
    use crate::keys::{KeyLayout, LockKeys};
    use crate::options::{LockOptions, WaitMode};

    /// The release script wakes a waiter with whichever publish command it is
    /// given: `SPUBLISH` (sharded pub/sub, for Cluster) reaches a connection
    /// subscribed with `SSUBSCRIBE` to the waiter's channel, which shares the
    /// lock's hash slot.
    #[tokio::test]
    async fn the_release_script_wakes_over_sharded_pub_sub() -> Result<()> {
        let server = RedisServer::start();
        let settings = ConnSettings {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
        };
        let conn = RedisConn::connect(&server.url(), &settings).await?;
        let keys = LockKeys::new("lock:", KeyLayout::HashTagged, "job")?;
        let channel = wake_channel(&keys, "ghostclient");
        let mut sub = redis::Client::open(server.url())
            .and_then(|c| c.get_connection())
            .map_err(Error::Redis)?;
        sub.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(Error::Redis)?;
        sub.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&channel).get_packed_command())
            .map_err(Error::Redis)?;
        let confirmed = sub.recv_response().map_err(Error::Redis)?;
        assert!(
            format!("{confirmed:?}").contains("ssubscribe"),
            "{confirmed:?}"
        );

        let opts = LockOptions::default();
        let mint = Mint::new(&opts);
        let granted = conn
            .run(&Grant {
                keys: &keys,
                mint,
                token: "holder",
                ttl: opts.ttl_value(),
                wait_mode: WaitMode::Notify,
                member: None,
                waiter_lease: opts.waiter_lease_value(),
                queued: false,
            })
            .await?;
        let GrantReply::Granted(fence) = granted else {
            panic!("the first grant was refused: {granted:?}");
        };
        // A young notify waiter (arrival far in the future): woken, not handed.
        let member = QueueMember {
            client: "ghostclient".into(),
            waiter: 7,
            mode: WaitMode::Notify,
            ttl: Duration::from_secs(10),
            handover: Duration::from_millis(100),
            token: "0b5e7a9c-0000-4000-8000-000000000001".into(),
        }
        .to_string();
        server.cmd(&["ZADD", &keys.queue, "99999999999999999", &member]);
        server.cmd(&["ZADD", &keys.waiters, "99999999999999", &member]);
        let value = crate::backend::wire::lock_value("holder", fence, KeyLayout::HashTagged);
        let released = conn
            .run(&Release {
                keys: &keys,
                mint,
                pass_on: PassOn {
                    wake_prefix: &keys.wake_prefix,
                    publish: Publish::SPublish,
                },
                value: &value,
            })
            .await?;
        assert_eq!(released, Checked::Done);
        let message = sub.recv_response().map_err(Error::Redis)?;
        let text = format!("{message:?}");
        assert!(
            text.contains("smessage")
                && text.contains(&channel)
                && text.contains(&format!("{:?}", Wake::Retry { waiter: 7 }.to_string())),
            "{text}"
        );
        Ok(())
    }
}
