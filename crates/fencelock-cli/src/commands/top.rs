//! `fencelock top`: a live view of the locks whose names match a pattern.
//!
//! Lock names come from the library's `lock_names` (`SCAN` on every master,
//! never `KEYS`, which blocks the server), each lock is read with its atomic
//! `inspect`, and the waiters are its wait queue's length (notify and fair
//! modes; 0 when nobody queues). On a terminal the table is redrawn in place
//! every interval until Ctrl-C; `--once` prints one snapshot and exits.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use fencelock::{KeyLayout, LockClient, LockState};
use serde_json::json;

use crate::arg_values::parse_duration;
use crate::global_options::GlobalOptions;
use crate::{connect, exit};

/// Show the locks under a pattern, live: name, holder, fence, ttl left and
/// waiters (found with SCAN, never KEYS; on etcd, one range read).
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct TopArgs {
    /// Lock names to show, a Redis glob (e.g. `invoice:*`).
    #[arg(default_value = "*", value_name = "PATTERN")]
    pub(crate) pattern: String,
    /// Print one snapshot and exit.
    #[arg(long)]
    pub(crate) once: bool,
    /// Time between refreshes.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) interval: Duration,
    /// Print JSON: one array per snapshot, on one line.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The rest of `fencelock top --help`, after the options.
const HELP: &str = "\
Examples:
  fencelock top                 # every lock, redrawn every second
  fencelock top 'invoice:*' --interval 500ms
  fencelock top 'invoice:*' --once --json

PATTERN is a Redis glob on lock names (default *).";

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

/// `fencelock top`: snapshots until Ctrl-C, or one with `--once`.
pub(crate) async fn exec(global: &GlobalOptions, args: &TopArgs) -> anyhow::Result<u8> {
    let client = connect::client(global).await?;
    let layout: KeyLayout = global.layout.into();
    let pattern = &args.pattern;
    let live = !args.once && std::io::stdout().is_terminal();
    loop {
        let rows = snapshot(&client, layout, pattern).await?;
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

/// Reads every held lock whose name matches `pattern`, sorted by name.
async fn snapshot(
    client: &LockClient,
    layout: KeyLayout,
    pattern: &str,
) -> anyhow::Result<Vec<Row>> {
    let names = client.lock_names(pattern, layout).await?;
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
        // A queue key of another type counts as no waiters; a missing
        // permission is reported.
        let waiters = match client.waiters(&name, layout).await {
            Ok(n) => n,
            Err(e @ fencelock::Error::NoPermission { .. }) => return Err(e.into()),
            Err(_) => 0,
        };
        rows.push(Row {
            name,
            key: keys.lock().to_owned(),
            holder,
            fence: fence.map(|f| f.get()),
            remaining,
            waiters,
        });
    }
    Ok(rows)
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
