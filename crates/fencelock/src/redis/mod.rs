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
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| connect_error(&shown, e))?;
        Ok(RedisConn {
            manager,
            url: shown,
        })
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
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{path}")
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
    }
}
