//! `fencelock top`: a live view of the locks whose names match a pattern.
//!
//! Lock names come from the library's `lock_names` (`SCAN` on every master,
//! never `KEYS`, which blocks the server), each lock is read with its atomic
//! `inspect`, and the waiters are its wait queue's length (notify and fair
//! modes; 0 when nobody queues). A semaphore shows one row per held slot,
//! a read-write lock one per holder. On a terminal the table is redrawn in place
//! every interval until Ctrl-C; `--once` prints one snapshot and exits.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use fencelock::{KeyLayout, LockClient, LockState, PermitHolder, RwHolder};
use serde_json::json;

use crate::arg_values::parse_duration;
use crate::global_options::GlobalOptions;
use crate::{connect, exit, rwlock_view, semaphore_view};

/// Show the locks under a pattern, live: name, slot, holder, fence, ttl left
/// and waiters (found with SCAN, never KEYS; on etcd, one range read).
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

PATTERN is a Redis glob on lock names (default *).

A semaphore (`fencelock run --permits N`) has one row per held slot, its
SLOT column `SLOT/N` (a lock's is -) and its waiters on its first row. In
--json it is one object with `holder`, `fence` and `ttl_ms` null, and
`permits` and `holders` (an array of {slot, holder, fence, ttl_ms}
objects, by slot); a lock's object has neither.

A read-write lock (`fencelock run --read` or `--write`) has one row per
holder, its SLOT column `write` for the writer and `read` for each reader
(whose FENCE is its write epoch), its waiters on its first row. In --json
it is one object with `kind` \"rwlock\", `holder`, `fence` and `ttl_ms`
null, `writer` (a {holder, fence, ttl_ms} object, or null) and `readers`
(an array of such objects); a lock's and a semaphore's objects have no
`kind`.";

/// One held lock or semaphore.
#[derive(Debug)]
struct Row {
    name: String,
    key: String,
    held: Held,
    waiters: u64,
}

/// Who holds a row's name.
#[derive(Debug)]
enum Held {
    /// A lock, by one holder.
    Lock {
        holder: String,
        fence: Option<u64>,
        remaining: Option<Duration>,
    },
    /// A semaphore, by the holders of its held slots.
    Semaphore {
        permits: u32,
        holders: Vec<PermitHolder>,
    },
    /// A read-write lock, by its writer or its readers.
    RwLock {
        writer: Option<RwHolder>,
        readers: Vec<RwHolder>,
    },
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
        let held = match client.inspect(&name, layout).await? {
            LockState::Held {
                holder,
                fence,
                remaining,
            } => Held::Lock {
                holder,
                fence: fence.map(|f| f.get()),
                remaining,
            },
            LockState::Semaphore {
                permits, holders, ..
            } if !holders.is_empty() => Held::Semaphore { permits, holders },
            LockState::RwLock {
                writer, readers, ..
            } if writer.is_some() || !readers.is_empty() => Held::RwLock { writer, readers },
            _ => continue,
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
            held,
            waiters,
        });
    }
    Ok(rows)
}

/// One line of the table: slot, holder id, fence, time left, waiters.
struct Line<'a> {
    name: &'a str,
    slot: String,
    holder: &'a str,
    fence: Option<u64>,
    remaining: Option<Duration>,
    waiters: String,
}

/// The table's lines: one per lock, one per held slot of a semaphore, one
/// per holder of a read-write lock (their waiters on the first).
fn lines(rows: &[Row]) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    for r in rows {
        match &r.held {
            Held::Lock {
                holder,
                fence,
                remaining,
            } => lines.push(Line {
                name: &r.name,
                slot: "-".to_owned(),
                holder,
                fence: *fence,
                remaining: *remaining,
                waiters: r.waiters.to_string(),
            }),
            Held::Semaphore { permits, holders } => {
                for (i, h) in holders.iter().enumerate() {
                    lines.push(Line {
                        name: &r.name,
                        slot: format!("{}/{permits}", h.slot),
                        holder: &h.holder,
                        fence: h.fence.map(|f| f.get()),
                        remaining: Some(h.remaining),
                        waiters: if i == 0 {
                            r.waiters.to_string()
                        } else {
                            String::new()
                        },
                    });
                }
            }
            Held::RwLock { writer, readers } => {
                let holders = writer
                    .iter()
                    .map(|h| ("write", h))
                    .chain(readers.iter().map(|h| ("read", h)));
                for (i, (side, h)) in holders.enumerate() {
                    lines.push(Line {
                        name: &r.name,
                        slot: side.to_owned(),
                        holder: &h.holder,
                        fence: h.fence.map(|f| f.get()),
                        remaining: Some(h.remaining),
                        waiters: if i == 0 {
                            r.waiters.to_string()
                        } else {
                            String::new()
                        },
                    });
                }
            }
        }
    }
    lines
}

/// The table: name, slot, holder id, fence, ttl left, waiters.
fn render(rows: &[Row]) -> String {
    let lines = lines(rows);
    let width = lines
        .iter()
        .map(|l| l.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let slot_width = lines.iter().map(|l| l.slot.len()).max().unwrap_or(0).max(4);
    let mut text = format!(
        "{:<width$}  {:<slot_width$} {:<10} {:>20} {:>10} {:>8}\n",
        "NAME", "SLOT", "HOLDER", "FENCE", "TTL LEFT", "WAITERS"
    );
    for l in &lines {
        text.push_str(&format!(
            "{:<width$}  {:<slot_width$} {:<10} {:>20} {:>10} {:>8}\n",
            l.name,
            l.slot,
            l.holder,
            l.fence.map_or("?".to_owned(), |f| f.to_string()),
            l.remaining
                .map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64())),
            l.waiters
        ));
    }
    text
}

/// One JSON object per row: a lock's `holder`, `fence`, `ttl_ms`; a
/// semaphore's `permits` and `holders` besides (its `holder`, `fence` and
/// `ttl_ms` null); a read-write lock's `kind`, `writer` and `readers`
/// besides (its `holder`, `fence` and `ttl_ms` null).
fn to_json(rows: &[Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| match &r.held {
            Held::Lock {
                holder,
                fence,
                remaining,
            } => json!({
                "name": r.name, "key": r.key, "holder": holder, "fence": fence,
                "ttl_ms": remaining.map(|d| d.as_millis() as u64), "waiters": r.waiters,
            }),
            Held::Semaphore { permits, holders } => json!({
                "name": r.name, "key": r.key, "holder": null, "fence": null,
                "ttl_ms": null, "waiters": r.waiters,
                "permits": permits, "holders": semaphore_view::holders_json(holders),
            }),
            Held::RwLock { writer, readers } => {
                let mut object = json!({
                    "name": r.name, "key": r.key, "holder": null, "fence": null,
                    "ttl_ms": null, "waiters": r.waiters,
                });
                rwlock_view::add_json(&mut object, writer.as_ref(), readers);
                object
            }
        })
        .collect()
}
