//! `fencelock top`: a live view of the locks whose names match a pattern.
//!
//! Lock keys are found with `SCAN … MATCH … TYPE string` (never `KEYS`, which
//! blocks the server), each is read with the library's atomic inspect, and
//! the waiters are the `ZCARD` of its wait queue (notify and fair modes; 0
//! when nobody queues). On a terminal the table is redrawn in place every
//! interval until Ctrl-C; `--once` prints one snapshot and exits.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use fencelock::{KeyLayout, LockClient, LockState};
use serde_json::json;

use crate::cli::{Global, TopArgs};
use crate::{connect, exit};

/// One held lock.
#[derive(Debug)]
struct Row {
    name: String,
    key: String,
    holder: String,
    fence: Option<u64>,
    remaining: Option<Duration>,
    waiters: u64,
}

pub(crate) async fn run(global: &Global, args: &TopArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let mut conn = redis::Client::open(connect::url(global))?
        .get_multiplexed_async_connection()
        .await?;
    let layout: KeyLayout = global.layout.into();
    let pattern = key_pattern(client.prefix(), layout, &args.pattern);
    let live = !args.once && std::io::stdout().is_terminal();
    loop {
        let rows = snapshot(&client, &mut conn, layout, &pattern).await?;
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", to_json(&rows))?;
        } else {
            if live {
                // Home and clear: redraw in place.
                write!(out, "\x1b[H\x1b[2J")?;
            }
            let title = format!(
                "fencelock top: {} lock{} matching {pattern} on {}{}",
                rows.len(),
                if rows.len() == 1 { "" } else { "s" },
                crate::redact::url(&connect::url(global)),
                if live {
                    format!(
                        " (every {}, Ctrl-C to quit)",
                        humantime::format_duration(args.interval)
                    )
                } else {
                    String::new()
                }
            );
            write!(out, "{title}\n{}", render(&rows))?;
        }
        out.flush()?;
        drop(out);
        if args.once {
            return Ok(exit::OK);
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(exit::OK),
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}

/// The SCAN pattern of lock keys whose names match `names` (a glob).
fn key_pattern(prefix: &str, layout: KeyLayout, names: &str) -> String {
    let prefix = glob_escape(prefix);
    match layout {
        KeyLayout::HashTagged => format!("{prefix}{{{names}}}"),
        _ => format!("{prefix}{names}"),
    }
}

/// Escapes glob metacharacters so the prefix matches literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock name of `key`, or `None` for a key that is not a lock key (a
/// fence key in the guide layout, or a stray key matching the pattern).
fn lock_name<'k>(prefix: &str, layout: KeyLayout, key: &'k str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?;
    match layout {
        KeyLayout::HashTagged => rest.strip_prefix('{')?.strip_suffix('}'),
        _ if rest.ends_with(":fence") => None,
        _ => Some(rest),
    }
}

/// SCANs the keyspace and reads every held lock found, sorted by name.
async fn snapshot(
    client: &LockClient,
    conn: &mut redis::aio::MultiplexedConnection,
    layout: KeyLayout,
    pattern: &str,
) -> anyhow::Result<Vec<Row>> {
    let mut names = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("string")
            .query_async(conn)
            .await
            .map_err(refused)?;
        names.extend(
            keys.iter()
                .filter_map(|k| lock_name(client.prefix(), layout, k))
                .map(str::to_owned),
        );
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort();
    names.dedup();
    let mut rows = Vec::with_capacity(names.len());
    for name in names {
        let Ok(keys) = client.keys(&name, layout) else {
            continue;
        };
        // Released between the SCAN and now: not shown.
        let LockState::Held {
            holder,
            fence,
            remaining,
        } = client.inspect(&name, layout).await?
        else {
            continue;
        };
        // A queue key of another type counts as no waiters; a refusal is
        // reported.
        let waiters: u64 = match redis::cmd("ZCARD").arg(&keys.queue).query_async(conn).await {
            Ok(n) => n,
            Err(e) if e.code() == Some("NOPERM") => return Err(refused(e)),
            Err(_) => 0,
        };
        rows.push(Row {
            name,
            key: keys.lock,
            holder,
            fence: fence.map(|f| f.get()),
            remaining,
            waiters,
        });
    }
    Ok(rows)
}

/// A command `top` sends itself, refused by the ACL user (`NOPERM … to
/// run the 'scan' command`), as the library's [`fencelock::Error::NoPermission`]
/// (exit 78, naming the permission to add); other errors as they are.
fn refused(e: redis::RedisError) -> anyhow::Error {
    let command = (e.code() == Some("NOPERM"))
        .then(|| e.detail())
        .flatten()
        .and_then(|detail| detail.split_once("to run the '"))
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command.to_owned());
    match command {
        Some(command) => fencelock::Error::NoPermission {
            detail: format!("run the command {}", command.to_uppercase()),
            fix: format!("+{}", command.to_lowercase()),
        }
        .into(),
        None => e.into(),
    }
}

/// The table: name, holder id, fence, ttl left, waiters.
fn render(rows: &[Row]) -> String {
    let width = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let mut text = format!(
        "{:<width$}  {:<10} {:>20} {:>10} {:>8}\n",
        "NAME", "HOLDER", "FENCE", "TTL LEFT", "WAITERS"
    );
    for r in rows {
        let holder = r.holder.clone();
        text.push_str(&format!(
            "{:<width$}  {:<10} {:>20} {:>10} {:>8}\n",
            r.name,
            holder,
            r.fence.map_or("?".to_owned(), |f| f.to_string()),
            r.remaining
                .map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64())),
            r.waiters
        ));
    }
    text
}

fn to_json(rows: &[Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            json!({
                "name": r.name, "key": r.key, "holder": r.holder, "fence": r.fence,
                "ttl_ms": r.remaining.map(|d| d.as_millis() as u64), "waiters": r.waiters,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_names() {
        assert_eq!(
            key_pattern("lock:", KeyLayout::HashTagged, "invoice:*"),
            "lock:{invoice:*}"
        );
        assert_eq!(key_pattern("a*", KeyLayout::Guide, "x"), "a\\*x");
        assert_eq!(
            lock_name("lock:", KeyLayout::HashTagged, "lock:{invoice:1}"),
            Some("invoice:1")
        );
        assert_eq!(
            lock_name("lock:", KeyLayout::HashTagged, "lock:{invoice:1}:fence"),
            None
        );
        assert_eq!(lock_name("lock:", KeyLayout::Guide, "lock:job:fence"), None);
        assert_eq!(
            lock_name("lock:", KeyLayout::Guide, "lock:job"),
            Some("job")
        );
    }
}
