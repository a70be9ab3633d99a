//! The Redis side: one connection per client and the Lua scripts.
//!
//! Everything that talks to Redis goes through [`RedisConn::run`], which calls
//! a script by SHA (reloading it transparently on `NOSCRIPT`) and maps client
//! errors to [`Error`](crate::Error) variants that name the URL.

pub(crate) mod scripts;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, IntoConnectionInfo, Script};

use crate::error::{Error, Result, is_transient};

/// Connection settings chosen by the client builder.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// A multiplexed, auto-reconnecting connection to one Redis server.
#[derive(Clone)]
pub(crate) struct RedisConn {
    manager: ConnectionManager,
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
        let info = url
            .into_connection_info()
            .map_err(|e| Error::InvalidOption(format!("bad Redis URL {shown}: {e}")))?;
        let client = redis::Client::open(info)
            .map_err(|e| Error::InvalidOption(format!("bad Redis URL {shown}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout))
            // Reconnects happen in the background after a failed command; keep
            // them quick so a restarted Redis is found again promptly.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| connect_error(&shown, e))?;
        // The manager only opens a socket (and AUTHs if the URL has a
        // password): a server that requires a password, or one that accepts
        // TCP but answers nothing, would only fail at the first lock call
        // (a grant without AUTH is even cut off as "unauthenticated multibulk
        // length"). One PING makes `connect` fail fast with Auth/Unreachable.
        redis::cmd("PING")
            .query_async::<String>(&mut manager.clone())
            .await
            .map_err(|e| connect_error(&shown, e))?;
        Ok(RedisConn {
            manager,
            url: shown,
            client,
            settings: settings.clone(),
        })
    }

    /// Opens a second, RESP3 connection for pub/sub: pushes go to `sender`,
    /// and subscriptions are restored automatically after a reconnect.
    pub(crate) async fn connect_pubsub(
        &self,
        sender: impl redis::aio::AsyncPushSender,
    ) -> Result<ConnectionManager> {
        let info = self.client.get_connection_info().clone();
        let redis_settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(redis_settings))
            .map_err(|e| connect_error(&self.url, e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.response_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500))
            .set_push_sender(sender)
            .set_automatic_resubscription();
        ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| connect_error(&self.url, e))
    }

    /// Maps a client error on the pub/sub connection.
    pub(crate) fn error(&self, e: redis::RedisError) -> Error {
        self.map_error(e, &[])
    }

    /// The URL without its password.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Runs `script` with `keys` and `args` and converts the reply.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(*k);
        }
        for a in args {
            invocation.arg(*a);
        }
        let mut conn = self.manager.clone();
        invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.map_error(e, keys))
    }

    /// Runs a plain command (used for reads such as `PTTL`).
    pub(crate) async fn cmd<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.manager.clone();
        cmd.query_async(&mut conn)
            .await
            .map_err(|e| self.map_error(e, &[]))
    }

    fn map_error(&self, e: redis::RedisError, keys: &[&str]) -> Error {
        let text = e.to_string();
        if e.code() == Some("WRONGTYPE")
            || text.contains("WRONGTYPE")
            || text.contains("does not hold an integer")
            || text.contains("not an integer")
        {
            return Error::WrongType {
                key: keys.join(" or "),
                detail: e
                    .detail()
                    .unwrap_or(&text)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            };
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

fn connect_error(url: &str, e: redis::RedisError) -> Error {
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

/// Removes the password from a URL so it can be shown in errors and logs.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // Everything before the last '@' is credentials, even when a raw
    // (not percent-encoded) password contains '/', '?' or '#': a URL that
    // fails to parse is shown in the error, so it must be redacted too.
    match rest.rsplit_once('@') {
        Some((userinfo, host_and_path)) => {
            let user = userinfo
                .split([':', '/', '?', '#'])
                .next()
                .unwrap_or_default();
            format!("{scheme}://{user}:***@{host_and_path}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:7000/"), "redis://127.0.0.1:7000/");
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("rediss://u:p@h:1"), "rediss://u:***@h:1");
        assert_eq!(redact("redis://:a/b@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://u:a#b?c@h:1"), "redis://u:***@h:1");
    }
}
