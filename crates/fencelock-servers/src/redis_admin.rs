//! Talking to a running redis-server: URLs ([`server_url`]), one bounded
//! command ([`run_command`], [`query`]), the readiness probe ([`probe`]) and
//! reading `INFO` ([`info_field`], [`online_replicas`]).

use std::fmt::Write as _;
use std::time::Duration;

use redis::{FromRedisValue, RedisResult, Value};

/// Per-attempt connect and read timeout of the readiness probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// `SCHEME://[:PASSWORD@]127.0.0.1:PORT/` (password percent-encoded), with
/// `#insecure` (no check of the server's certificate) if `insecure`.
pub fn server_url(scheme: &str, port: u16, password: Option<&str>, insecure: bool) -> String {
    let auth = match password {
        Some(password) => format!(":{}@", percent_encode_userinfo(password)),
        None => String::new(),
    };
    let fragment = if insecure { "#insecure" } else { "" };
    format!("{scheme}://{auth}127.0.0.1:{port}/{fragment}")
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Runs one command (`args[0]` and its arguments) on a fresh connection of
/// `client`; `timeout` bounds the connect and, separately, the request (so
/// a paused server fails after about `timeout` instead of hanging).
///
/// # Errors
///
/// The connection error, an error reply, or an empty `args`.
pub fn run_command(client: &redis::Client, args: &[&str], timeout: Duration) -> RedisResult<Value> {
    let Some((name, rest)) = args.split_first() else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a redis command needs at least its name",
        )));
    };
    let mut con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    let mut cmd = redis::cmd(name);
    for arg in rest {
        cmd.arg(*arg);
    }
    cmd.query(&mut con)
}

/// [`run_command`] on the server at the plain `url`, the reply converted to
/// `T`.
///
/// # Errors
///
/// The error, naming the command and the URL's address.
pub fn query<T: FromRedisValue>(url: &str, args: &[&str], timeout: Duration) -> Result<T, String> {
    let what = || format!("{} on {}", args.join(" "), address(url));
    let client = redis::Client::open(url).map_err(|e| format!("{}: {e}", what()))?;
    let value = run_command(&client, args, timeout).map_err(|e| format!("{}: {e}", what()))?;
    redis::from_redis_value(value).map_err(|e| format!("{}: {e}", what()))
}

/// `127.0.0.1:PORT` of a URL (without its password).
fn address(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    host.split('/').next().unwrap_or(host)
}

/// Checks that the server `client` reaches is the process `pid` (not
/// another server that took the port) and answers `PING` (not still
/// loading its data).
///
/// # Errors
///
/// Why not, as text.
pub fn probe(client: &redis::Client, pid: u32) -> Result<(), String> {
    let mut con = client
        .get_connection_with_timeout(PROBE_TIMEOUT)
        .map_err(|e| e.to_string())?;
    con.set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    con.set_write_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let info: redis::InfoDict = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .map_err(|e| e.to_string())?;
    let server_pid: Option<u32> = info.get("process_id");
    if server_pid != Some(pid) {
        return Err(format!(
            "the port is served by another process (process_id {server_pid:?}, expected {pid})"
        ));
    }
    redis::cmd("PING")
        .query::<String>(&mut con)
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The value of `field` in `INFO`/`CLUSTER INFO` text (`field:value`
/// lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// How many replicas `INFO replication` text lists as in sync
/// (`slaveN:…,state=online,…`).
pub fn online_replicas(info: &str) -> usize {
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encodes_password() {
        assert_eq!(
            server_url("redis", 7000, None, false),
            "redis://127.0.0.1:7000/"
        );
        assert_eq!(
            server_url("redis", 7000, Some("p@ss:w/rd"), false),
            "redis://:p%40ss%3Aw%2Frd@127.0.0.1:7000/"
        );
        assert_eq!(
            server_url("rediss", 7000, None, true),
            "rediss://127.0.0.1:7000/#insecure"
        );
        assert_eq!(address("redis://:pw@127.0.0.1:7000/"), "127.0.0.1:7000");
    }

    #[test]
    fn info_fields_and_replicas() {
        let info = "role:master\r\nslave0:ip=127.0.0.1,port=1,state=online,offset=1\r\nslave1:ip=127.0.0.1,port=2,state=wait_bgsave\r\n";
        assert_eq!(info_field(info, "role"), Some("master"));
        assert_eq!(online_replicas(info), 1);
    }
}
