//! `LockClient::audit` on real servers: a clean server passes every check
//! and the probe leaves no key behind; a user with the README's rule passes
//! too; a user missing a part of the rule whose absence the library does not
//! report as an error (pub/sub, `INFO`, `SCAN`, `ZCARD`) is told by the
//! audit, as is one missing a lock permission. The other WARN and FAIL rows
//! are provoked through `fencelock doctor` (the CLI's tests).

use anyhow::{Context, Result, ensure};
use fencelock::audit::{Audit, Status};
use fencelock::{FenceMode, LockClient, LockOptions};
use fencelock_testkit::RedisServer;
use fencelock_testkit::acl::readme_acl_rule;

use crate::acl::{NAMED_ELSEWHERE, rule_without};
use crate::support::{Keys, TestRedis};

/// The rows of a standalone master, in order.
const ROWS: [&str; 10] = [
    "topology",
    "version",
    "role",
    "replication",
    "eviction",
    "persistence",
    "clock",
    "fences",
    "permissions",
    "rtt",
];

fn names(audit: &Audit) -> Vec<&str> {
    audit.checks().iter().map(|c| c.name()).collect()
}

fn row<'a>(audit: &'a Audit, name: &str) -> Result<&'a fencelock::audit::Check> {
    audit
        .check(name)
        .with_context(|| format!("no {name} row in {audit:#?}"))
}

#[tokio::test]
async fn a_clean_server_passes_every_check_and_keeps_no_probe_keys() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let audit = client.audit().await?;
    ensure!(names(&audit) == ROWS, "{audit:#?}");
    ensure!(audit.worst() == Status::Ok, "{audit:#?}");
    ensure!(audit.checks().iter().all(|c| c.fix().is_none()));
    ensure!(audit.url() == client.url());
    ensure!(server.dbsize() == 0, "the probe left keys behind");

    // Counter fences: the probe's fence key never expires, so it must be
    // deleted too.
    let counter = LockClient::builder(server.url())
        .defaults(LockOptions::default().fence_mode(FenceMode::Counter))
        .connect()
        .await?;
    let audit = counter.audit().await?;
    // A test server keeps nothing on disk: counter fences fail there.
    ensure!(
        row(&audit, "persistence")?.status() == Status::Fail,
        "{audit:#?}"
    );
    ensure!(server.dbsize() == 0, "the probe left keys behind");
    Ok(())
}

#[tokio::test]
async fn a_user_with_the_readme_rule_passes_the_audit() -> Result<()> {
    let server = RedisServer::start();
    let client = LockClient::connect(&server.acl_user("fencelock", &readme_acl_rule())).await?;
    let audit = client.audit().await?;
    ensure!(audit.worst() == Status::Ok, "{audit:#?}");
    ensure!(server.dbsize() == 0, "the probe left keys behind");
    Ok(())
}

#[tokio::test]
async fn the_audit_names_each_missing_permission() -> Result<()> {
    let server = RedisServer::start();
    // Every part the library cannot report as an error, and one it can.
    let mut cases: Vec<(&str, Status)> = NAMED_ELSEWHERE
        .iter()
        .map(|part| (*part, Status::Warn))
        .collect();
    cases.push(("+zadd", Status::Fail));
    // Semaphores are a feature a mutex needs none of: a warning.
    cases.push(("+hgetall", Status::Warn));
    cases.push(("+hdel", Status::Warn));
    for (part, status) in cases {
        let url = server.acl_user("app", &rule_without(part));
        let audit = LockClient::connect(&url).await?.audit().await?;
        let permissions = row(&audit, "permissions")?;
        ensure!(
            permissions.status() == status
                && permissions.fix().is_some_and(|fix| fix.contains(part)),
            "without {part}: {permissions:#?}"
        );
        ensure!(audit.worst() == status, "without {part}: {audit:#?}");
    }

    // Under another prefix, the channel pattern to add is that prefix's.
    let rule: Vec<String> = rule_without("&lock:*")
        .into_iter()
        .map(|p| p.replace("lock:", "jobs:"))
        .collect();
    let client = LockClient::builder(server.acl_user("app", &rule))
        .prefix("jobs:")
        .connect()
        .await?;
    let audit = client.audit().await?;
    let permissions = row(&audit, "permissions")?;
    ensure!(
        permissions.status() == Status::Warn
            && permissions
                .fix()
                .is_some_and(|fix| fix.contains("add &jobs:* to")),
        "{permissions:#?}"
    );

    // Without INFO the server rows cannot be read, and say why.
    let url = server.acl_user("app", &rule_without("+info"));
    let audit = LockClient::connect(&url).await?.audit().await?;
    let version = row(&audit, "version")?;
    ensure!(
        version.status() == Status::Warn && version.found().contains("INFO"),
        "{version:#?}"
    );
    Ok(())
}
