//! `fencelock doctor`: the library's deployment audit
//! ([`fencelock::LockClient::audit`]) printed one line per check, or as one
//! JSON object; the exit code is the worst status.

use fencelock::audit::{Audit, Check, Status};
use fencelock::{LockClient, LockOptions};
use serde_json::json;

use crate::cli::{DoctorArgs, Global};
use crate::{connect, exit, redact};

/// Exit code when a check warns.
pub(crate) const WARNINGS: u8 = 1;
/// Exit code when a check fails.
pub(crate) const FAILURES: u8 = 2;

pub(crate) async fn run(global: &Global, args: &DoctorArgs) -> anyhow::Result<u8> {
    let defaults = LockOptions::default()
        .layout(global.layout.into())
        .fence_mode(
            global
                .fence_mode
                .map_or(fencelock::FenceMode::Clock, Into::into),
        )
        .ttl(args.ttl);
    let defaults = match global.fence_epoch {
        Some(epoch) => defaults.fence_epoch(epoch),
        None => defaults,
    };
    let client = connect::builder(global, connect::url(global))?
        .defaults(defaults.clone())
        .connect()
        .await?;
    let audit = client.audit().await?;
    if args.json {
        let object = to_json(&audit, &client, &defaults);
        println!("{}", redact::scrub(&object.to_string()));
    } else {
        print!("{}", redact::scrub(&render(&audit, &client, &defaults)));
    }
    Ok(code(audit.worst()))
}

/// The exit code for the worst status.
fn code(worst: Status) -> u8 {
    match worst {
        Status::Ok => exit::OK,
        Status::Warn => WARNINGS,
        Status::Fail => FAILURES,
    }
}

/// What the audit assumed: prefix, fence mode, ttl.
fn settings(client: &LockClient, opts: &LockOptions) -> String {
    format!(
        "prefix {}, {} fences, ttl {}",
        client.prefix(),
        fence_mode(client, opts),
        humantime::format_duration(opts.ttl_value())
    )
}

/// The fences the audit assumed: `clock` or `counter` on Redis, `revision`
/// (create revisions) on etcd.
fn fence_mode(client: &LockClient, opts: &LockOptions) -> &'static str {
    if client.backend_kind() == "etcd" {
        return "revision";
    }
    match opts.fence_mode_value() {
        fencelock::FenceMode::Counter => "counter",
        _ => "clock",
    }
}

/// A header, one line per check (`STATUS  NAME  found; fix: …`), a summary.
fn render(audit: &Audit, client: &LockClient, opts: &LockOptions) -> String {
    let width = audit
        .checks()
        .iter()
        .map(|c| c.name().len())
        .max()
        .unwrap_or(0);
    let mut text = format!(
        "fencelock doctor: {} ({})\n",
        audit.url(),
        settings(client, opts)
    );
    for check in audit.checks() {
        text.push_str(&line(check, width));
        text.push('\n');
    }
    let count = |status| {
        audit
            .checks()
            .iter()
            .filter(|c| c.status() == status)
            .count()
    };
    let (fails, warns) = (count(Status::Fail), count(Status::Warn));
    text.push_str(&match (fails, warns) {
        (0, 0) => "all checks passed\n".to_owned(),
        _ => format!(
            "{fails} failure{}, {warns} warning{}\n",
            if fails == 1 { "" } else { "s" },
            if warns == 1 { "" } else { "s" }
        ),
    });
    text
}

/// One check on one line.
fn line(check: &Check, width: usize) -> String {
    let mut text = format!(
        "{:<4}  {:<width$}  {}",
        check.status().as_str(),
        check.name(),
        check.found()
    );
    if let Some(fix) = check.fix() {
        text.push_str("; fix: ");
        text.push_str(fix);
    }
    text
}

/// `{"url", "prefix", "fence_mode", "ttl_ms", "status", "checks": [{name,
/// status, found, fix}]}`.
fn to_json(audit: &Audit, client: &LockClient, opts: &LockOptions) -> serde_json::Value {
    let checks: Vec<serde_json::Value> = audit
        .checks()
        .iter()
        .map(|c| {
            json!({
                "name": c.name(), "status": c.status().as_str(),
                "found": c.found(), "fix": c.fix(),
            })
        })
        .collect();
    json!({
        "url": audit.url(),
        "prefix": client.prefix(),
        "backend": client.backend_kind(),
        "fence_mode": fence_mode(client, opts),
        "ttl_ms": u64::try_from(opts.ttl_value().as_millis()).unwrap_or(u64::MAX),
        "status": audit.worst().as_str(),
        "checks": checks,
    })
}
