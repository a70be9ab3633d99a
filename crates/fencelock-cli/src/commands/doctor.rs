//! `fencelock doctor`: the library's deployment audit
//! ([`fencelock::LockClient::audit`]) printed one line per check, or as one
//! JSON object; the exit code is the worst status.

use std::time::Duration;

use clap::Args;
use fencelock::audit::{Audit, Check, Status};
use fencelock::{LockClient, LockOptions};
use serde_json::json;

use crate::arg_values::parse_duration;
use crate::global_options::GlobalOptions;
use crate::{connect, exit, redact};

/// Audit the deployment: on Redis version, role, replication, eviction,
/// persistence, clocks, the user's permissions and the round trip, and
/// every replica a failover could promote; on
/// etcd members, health, leader, version, database size, the shortest
/// lease and the round trip. One line per check (OK, WARN or FAIL, what
/// was found, what to change).
#[derive(Debug, Args)]
#[command(after_help = HELP)]
pub(crate) struct DoctorArgs {
    /// The lease ttl the round trip is judged against.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ttl: Duration,
    /// Print one JSON object on stdout: url, prefix, fence_mode, ttl_ms,
    /// status (the worst) and checks, an array of {name, status, found,
    /// fix}.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The rest of `fencelock doctor --help`, after the options.
const HELP: &str = "\
Checks (advisory ones only ever warn):
  topology     a standalone server (FAIL: a Cluster node or a Sentinel behind
               a plain redis:// URL)
  version      Redis 7.0 or newer (FAIL: older)
  role         a master (FAIL: a replica)
  replication  on a master with replicas, min-replicas-to-write set
               (advisory; FAIL: set, and no good replica, so writes stop)
  eviction     maxmemory-policy noeviction or no memory limit (advisory)
  persistence  counter fences need appendonly yes and appendfsync always
               (FAIL: no append-only file; WARN: another fsync policy, or
               one the user may not read with CONFIG GET)
  clock        the server clock within 1 s of this host's (advisory)
  fences       the server clock past every clock fence stored under the
               prefix (FAIL: behind one)
  permissions  fencelock's own operations on a probe lock under the prefix,
               deleted afterwards (FAIL: a lock operation refused; WARN: wake-
               ups, fenced hashes, top or INFO refused)
  rtt          median of 5 PINGs under 1/20 of --ttl (advisory)
--fence-mode, --prefix and --layout say what to check for. The clock row
also states the jumps of the server clock the ttl tolerates: forward under
2/3 of --ttl (a larger jump can expire held leases early), back under the
time since a lock's last grant (clock fences).

Behind Sentinel and in a Cluster every replica a failover could promote
gets rows named CHECK@HOST:PORT: replica (WARN: unreachable, not audited;
OK with replica-priority 0: never promoted, not audited), version,
replication (min-replicas-to-write set on the replica, advisory), eviction,
persistence, clock, and fences (FAIL: its clock is behind a stored clock
fence).

On etcd (--url etcd://…) the checks are:
  members      an odd number, at least 3 (WARN: one member, or an even number)
  health       every member answers (WARN: a minority does not; FAIL: no quorum)
  leader       all members agree on one leader (FAIL: none, or disagreement)
  version      etcd 3.4 or newer on every member (WARN: older, or mixed)
  db size      under 80 % of the quota (WARN: above; FAIL: a NOSPACE or
               CORRUPT alarm)
  lease        etcd's shortest lease at most --ttl (WARN: a crashed holder's
               lock lasts that long, not the ttl)
  rtt          median of 5 linearizable reads under 1/20 of --ttl (advisory)

Exit codes: 0 every check passed, 1 warnings, 2 failures; 69 Redis
unreachable, 78 refused (credentials, or the user may not run PING).

Examples:
  fencelock doctor
  fencelock --redis redis://redis.internal:6379 --fence-mode counter doctor
  fencelock doctor --json | jq -r '.checks[] | select(.status != \"OK\") | .fix'";

/// Exit code when a check warns.
pub(crate) const WARNINGS: u8 = 1;
/// Exit code when a check fails.
pub(crate) const FAILURES: u8 = 2;

/// `fencelock doctor`: exit 0, [`WARNINGS`] or [`FAILURES`], the worst check.
pub(crate) async fn exec(global: &GlobalOptions, args: &DoctorArgs) -> anyhow::Result<u8> {
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
    let connected = connect::builder(global, connect::url(global))?
        .defaults(defaults.clone())
        .connect()
        .await;
    let client = match connected {
        Ok(client) => client,
        // An etcd cluster of which no member with a leader answered (a lost
        // quorum, members paused): that is the audit's finding, as rows,
        // not a failed audit. Nothing listening at all stays exit 69.
        Err(e) if connect::is_etcd(global) && no_quorum(&e) => {
            print_no_quorum(global, &e, args.json);
            return Ok(FAILURES);
        }
        Err(e) => return Err(e.into()),
    };
    let audit = client.audit().await?;
    if args.json {
        let object = to_json(&audit, &client, &defaults);
        println!("{}", redact::scrub(&object.to_string()));
    } else {
        print!("{}", redact::scrub(&render(&audit, &client, &defaults)));
    }
    Ok(code(audit.worst()))
}

/// Whether a failed connect to etcd found members without a quorum: a
/// member answered that it has no leader, or the members took no request
/// in time (paused, cut off), rather than refusing the connection.
fn no_quorum(e: &fencelock::Error) -> bool {
    match e {
        fencelock::Error::Etcd { detail, source, .. } => {
            source.code() == Some("DeadlineExceeded") || detail.contains("no leader")
        }
        _ => false,
    }
}

/// The rows of an etcd cluster that no member with a leader answered: its
/// health and round trip both fail, with the connect error as the finding.
fn print_no_quorum(global: &GlobalOptions, e: &fencelock::Error, json: bool) {
    let url = redact::scrub(&fencelock::redact_url(&connect::url(global)));
    let found = redact::scrub(&e.to_string());
    let health = format!(
        "no quorum: no member with a leader answered within the connect and response timeouts ({found})"
    );
    let rtt = "no member answered a request in time".to_owned();
    let fix = "bring back a majority of the members (paused, stopped or cut off ones)";
    if json {
        let object = json!({
            "url": url,
            "backend": "etcd",
            "status": Status::Fail.as_str(),
            "checks": [
                {"name": "health", "status": Status::Fail.as_str(), "found": health, "fix": fix},
                {"name": "rtt", "status": Status::Fail.as_str(), "found": rtt, "fix": fix},
            ],
        });
        println!("{object}");
    } else {
        let fail = Status::Fail.as_str();
        print!(
            "fencelock doctor: {url}\n{fail:<4}  {:<6}  {health}\n{fail:<4}  {:<6}  {rtt}\n2 failures, 0 warnings\n",
            "health", "rtt"
        );
    }
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
