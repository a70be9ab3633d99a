//! What a hostile user found broken, each fixed and checked against a real
//! server (each test fails on the code before the fix):
//!
//! - in the guide layout, names whose keys would be another lock's fence key,
//!   wait queue or waiter leases are refused;
//! - a wait of `Duration::MAX` (and `wait_forever`) waits instead of
//!   panicking;
//! - a queue or waiter-lease key of the wrong type is reported by name
//!   before anything changes (release keeps the lock; a waiter leaves no
//!   member behind); no message carries script internals;
//! - stored resource fences with leading zeros compare by value;
//! - passwords in `?pass=` URLs, databases that do not exist and missing ACL
//!   permissions are reported as what they are;
//! - `inspect` and rejected writes show holder ids, never tokens;
//! - an evicting memory policy is warned about and counted at connect;
//! - invisible characters in names and bad prefixes are refused;
//! - a fenced hash at one of a lock's own keys is refused (it would break
//!   that lock's next grant).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::metrics::DEPLOYMENT_WARNINGS;
use fencelock::{
    Error, Fence, KeyLayout, LockClient, LockState, LossReason, ReleaseOutcome, Renewal, WaitMode,
    WriteOutcome, holder_id,
};
use fencelock_testkit::{RedisConfig, RedisServer};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use crate::support::fixture::Fixture;
use crate::support::{Keys, TestRedis};

/// No message fencelock gives shows what Redis appends to errors raised in
/// a script (its SHA and line).
fn ensure_clean(e: &Error) -> Result<()> {
    let text = e.to_string();
    ensure!(
        !text.contains("script:") && !text.contains("@user_script"),
        "error carries script internals: {text}"
    );
    Ok(())
}

#[tokio::test]
async fn guide_layout_names_that_would_share_a_key_are_refused() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let guide = client
        .options()
        .layout(KeyLayout::Guide)
        .renewal(Renewal::Off);
    let a = client.try_acquire("a", &guide).await?;
    for name in ["a:fence", "a:queue", "a:waiters", "a:wake:x"] {
        match client.try_acquire(name, &guide).await {
            Err(Error::InvalidName { reason, .. }) => {
                ensure!(reason.contains("share a key"), "{name}: {reason}")
            }
            other => bail!(
                "{name}: expected InvalidName, got {:?}",
                other.map(|l| l.fence())
            ),
        }
    }
    // Nothing was written for the refused names; `a` is intact.
    ensure!(server.get("lock:a").as_deref() == Some(a.token()));
    ensure!(server.dbsize() == 2, "only lock:a and lock:a:fence exist");
    ensure!(a.release().await?.is_released());
    Ok(())
}

#[tokio::test]
async fn a_wait_of_duration_max_waits_instead_of_panicking() -> Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let short = client
        .options()
        .ttl(Duration::from_millis(200))
        .renewal(Renewal::Off);
    for (i, opts) in [
        client.options().wait(Duration::MAX),
        client.options().wait_forever(),
        client
            .options()
            .wait(Duration::MAX)
            .wait_mode(WaitMode::Poll),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("forever-{i}");
        let _holder = client.try_acquire(&name, &short).await?;
        let lease = tokio::time::timeout(Duration::from_secs(5), client.acquire(&name, &opts))
            .await
            .context("the waiter did not get the lock after the holder's lease ran out")??;
        ensure!(lease.release().await?.is_released());
    }
    Ok(())
}

#[tokio::test]
async fn a_foreign_queue_key_is_named_and_the_release_changes_nothing() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&["RPUSH", "lock:{q}:queue", "foreign"]);
    let lease = client
        .try_acquire("q", &client.options().renewal(Renewal::Off))
        .await?;
    let e = match lease.release().await {
        Err(e) => e,
        Ok(outcome) => bail!("the release ignored the foreign queue key: {outcome:?}"),
    };
    ensure!(
        matches!(&e, Error::WrongType { key, detail } if key == "lock:{q}:queue" && detail == "a list"),
        "{e:?}"
    );
    ensure_clean(&e)?;
    ensure!(e.to_string().contains("nothing was changed"), "{e}");
    // True: the lock is still there (it expires by its ttl), the list intact.
    ensure!(server.exists("lock:{q}"), "the release deleted the lock");
    ensure!(server.query::<i64>(&["LLEN", "lock:{q}:queue"]) == 1);

    // A fair try_acquire of a free lock reads the queue first: refused,
    // nothing created.
    server.cmd(&["RPUSH", "lock:{f}:queue", "foreign"]);
    let fair = client.options().wait_mode(WaitMode::Fair);
    let e = client
        .try_acquire("f", &fair)
        .await
        .err()
        .context("granted over a foreign queue")?;
    ensure!(
        matches!(&e, Error::WrongType { key, .. } if key == "lock:{f}:queue"),
        "{e:?}"
    );
    ensure!(!server.exists("lock:{f}") && !server.exists("lock:{f}:fence"));
    Ok(())
}

#[tokio::test]
async fn a_foreign_waiters_key_is_named_and_no_member_is_left_behind() -> Result<()> {
    let f = Fixture::named("w").await?;
    let _holder = f.holder.try_acquire(&f.name, &f.holder.options()).await?;
    f.server.cmd(&["SET", "lock:{w}:waiters", "foreign"]);
    let e = f
        .waiter
        .acquire(
            &f.name,
            &f.waiter.options().wait(Duration::from_millis(300)),
        )
        .await
        .err()
        .context("acquired a held lock")?;
    ensure!(
        matches!(&e, Error::WrongType { key, detail } if key == "lock:{w}:waiters" && detail == "a string"),
        "{e:?}"
    );
    ensure_clean(&e)?;
    ensure!(
        !f.server.exists("lock:{w}:queue"),
        "the waiter left a member behind in the queue: {:?}",
        f.queue()
    );
    ensure!(f.server.get("lock:{w}:waiters").as_deref() == Some("foreign"));
    Ok(())
}

#[tokio::test]
async fn a_lock_key_of_another_type_is_not_ours_for_release_and_renewal() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let lease = client
        .try_acquire("t", &client.options().renewal(Renewal::Off))
        .await?;
    server.cmd(&["DEL", "lock:{t}"]);
    server.cmd(&["HSET", "lock:{t}", "a", "b"]);
    match lease.extend().await {
        Err(Error::LockLost {
            reason: LossReason::TakenOver,
            ..
        }) => {}
        other => bail!("extend over a hash: {other:?}"),
    }
    ensure!(lease.release().await? == ReleaseOutcome::NotOurs(LossReason::TakenOver));
    ensure!(
        server.hgetall("lock:{t}").len() == 1,
        "the hash was touched"
    );
    Ok(())
}

#[tokio::test]
async fn fence_keys_beyond_2_pow_53_are_wrong_type_naming_the_key() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    for (i, junk) in ["9007199254740991", "18446744073709551615", "0099"]
        .into_iter()
        .enumerate()
    {
        let name = format!("big-{i}");
        let fence_key = format!("lock:{{{name}}}:fence");
        server.cmd(&["SET", &fence_key, junk]);
        let e = client
            .try_acquire(&name, &client.options())
            .await
            .err()
            .with_context(|| format!("granted over the fence key {junk}"))?;
        ensure!(
            matches!(&e, Error::WrongType { key, .. } if *key == fence_key),
            "{junk}: {e:?}"
        );
        ensure!(
            e.is_config(),
            "{junk}: a bad fence key is a configuration error"
        );
        ensure_clean(&e)?;
        ensure!(server.get(&fence_key).as_deref() == Some(junk));
    }
    Ok(())
}

#[tokio::test]
async fn stored_resource_fences_with_leading_zeros_compare_by_value() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let hash = client.fenced_hash("doc")?;
    server.cmd(&[
        "HSET",
        "doc",
        "fence",
        "0099",
        "holder",
        &holder_id("x"),
        "value",
        "v",
    ]);
    ensure!(
        hash.write(Fence::new(100), "y", "newer")
            .await?
            .is_accepted()
    );
    server.cmd(&["HSET", "doc", "fence", "0099", "holder", &holder_id("x")]);
    ensure!(
        !hash
            .write(Fence::new(98), "y", "older")
            .await?
            .is_accepted()
    );
    ensure!(
        !hash
            .write(Fence::new(99), "y", "equal, other")
            .await?
            .is_accepted()
    );
    ensure!(
        hash.write(Fence::new(99), "x", "equal, same")
            .await?
            .is_accepted()
    );
    server.cmd(&["HSET", "doc", "fence", "1e3"]);
    let e = hash
        .write(Fence::new(5000), "x", "v")
        .await
        .err()
        .context("wrote over a non-integer stored fence")?;
    ensure!(
        matches!(&e, Error::WrongType { key, .. } if key == "doc"),
        "{e:?}"
    );
    Ok(())
}

#[tokio::test]
async fn passwords_in_query_strings_never_reach_an_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("nothing.sock");
    for url in [
        format!("unix://{}?pass=S3CRET-pw", missing.display()),
        format!("redis+unix://{}?db=0&password=S3CRET-pw", missing.display()),
        "redis://127.0.0.1:1/?password=S3CRET-pw".to_string(),
        "redis://user:S3CRET-pw@127.0.0.1:1/".to_string(),
    ] {
        let e = LockClient::connect(&url)
            .await
            .err()
            .with_context(|| format!("connected to {url}"))?;
        let shown = format!("{e} {e:?}");
        ensure!(!shown.contains("S3CRET"), "{url}: {shown}");
    }
    Ok(())
}

#[tokio::test]
async fn a_database_the_server_does_not_have_is_a_configuration_error() -> Result<()> {
    let server = RedisServer::start();
    let e = LockClient::connect(&format!("redis://{}/99", server.addr()))
        .await
        .err()
        .context("connected to database 99")?;
    ensure!(
        matches!(&e, Error::Config { detail, .. } if detail.contains("no database 99")),
        "{e:?}"
    );
    ensure!(e.is_config() && !e.is_connection(), "{e:?}");
    Ok(())
}

#[tokio::test]
async fn missing_acl_permissions_are_named_with_the_rule_to_add() -> Result<()> {
    let server = RedisServer::start();
    let user = |name: &str, rules: &[&str]| {
        let mut cmd = vec!["ACL", "SETUSER", name, "on", ">pw", "&*"];
        cmd.extend_from_slice(rules);
        server.cmd(&cmd);
        format!("redis://{name}:pw@{}/", server.addr())
    };
    let no_time = user("no-time", &["~*", "+@all", "-time"]);
    let other_keys = user("other-keys", &["~jobs:*", "+@all"]);
    let no_evalsha = user("no-evalsha", &["~*", "+@all", "-evalsha"]);
    let cases = [
        (no_time, "run the command TIME", "+time"),
        (other_keys, "access the key \"lock:{x}\"", "~lock:*"),
        (no_evalsha, "run the command EVALSHA", "+evalsha"),
    ];
    for (url, what, fix) in cases {
        let client = LockClient::connect(&url).await?;
        let e = client
            .try_acquire("x", &client.options())
            .await
            .err()
            .with_context(|| format!("{what}: granted"))?;
        match &e {
            Error::NoPermission { detail, fix: f } => {
                ensure!(detail == what && f.contains(fix), "{e}")
            }
            other => bail!("{what}: expected NoPermission, got {other:?}"),
        }
        ensure!(e.is_config(), "{e:?}");
        ensure_clean(&e)?;
    }
    Ok(())
}

#[tokio::test]
async fn inspect_and_rejections_show_holder_ids_never_tokens() -> Result<()> {
    let TestRedis {
        server: _server,
        client,
    } = TestRedis::start().await?;
    let lease = client.try_acquire("secret", &client.options()).await?;
    let state = client.inspect("secret", KeyLayout::HashTagged).await?;
    ensure!(!format!("{state:?}").contains(lease.token()), "{state:?}");
    ensure!(
        matches!(&state, LockState::Held { holder, .. } if *holder == lease.holder_id()),
        "{state:?}"
    );
    let hash = client.fenced_hash("secret:data")?;
    ensure!(
        hash.write(lease.fence(), lease.token(), "v")
            .await?
            .is_accepted()
    );
    let stale = hash
        .write(Fence::new(lease.fence().get() - 1), "someone-else", "x")
        .await?;
    ensure!(!format!("{stale:?}").contains(lease.token()), "{stale:?}");
    ensure!(
        stale
            == WriteOutcome::Rejected {
                current_fence: Some(lease.fence()),
                current_holder: Some(lease.holder_id()),
            }
    );
    // Knowing the public id is not enough to write as that holder.
    ensure!(
        !hash
            .write(lease.fence(), &lease.holder_id(), "forged")
            .await?
            .is_accepted()
    );
    ensure!(lease.release().await?.is_released());
    Ok(())
}

/// The warnings counter after connecting a client to `server`.
fn warnings_at_connect(server: &RedisServer) -> Result<u64> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(LockClient::connect(&server.url()))
    })?;
    Ok(snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == DEPLOYMENT_WARNINGS)
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum())
}

#[test]
fn an_evicting_memory_policy_is_counted_at_connect() -> Result<()> {
    let evicting = RedisServer::start_with(
        RedisConfig::default()
            .with_arg("--maxmemory")
            .with_arg("64mb")
            .with_arg("--maxmemory-policy")
            .with_arg("allkeys-lru"),
    );
    ensure!(warnings_at_connect(&evicting)? == 1);
    let safe = RedisServer::start_with(
        RedisConfig::default()
            .with_arg("--maxmemory")
            .with_arg("64mb")
            .with_arg("--maxmemory-policy")
            .with_arg("noeviction"),
    );
    ensure!(warnings_at_connect(&safe)? == 0);
    Ok(())
}

#[tokio::test]
async fn invisible_characters_and_bad_prefixes_are_refused() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    for name in ["pay\u{202E}lpt", "job\u{200B}", "\u{FEFF}x"] {
        let e = client
            .try_acquire(name, &client.options())
            .await
            .err()
            .with_context(|| format!("{name:?} accepted"))?;
        ensure!(matches!(e, Error::InvalidName { .. }), "{e:?}");
        ensure!(!e.to_string().contains(name), "shown raw: {e}");
    }
    let huge = "p".repeat(100_000);
    for prefix in ["jobs\n:", "a\u{202E}:", huge.as_str()] {
        let e = LockClient::builder(server.url())
            .prefix(prefix)
            .connect()
            .await
            .err()
            .with_context(|| format!("prefix {:?} accepted", &prefix[..prefix.len().min(10)]))?;
        ensure!(matches!(e, Error::InvalidOption(_)), "{e:?}");
        ensure!(e.to_string().len() < 400, "the message repeats the prefix");
    }
    ensure!(server.dbsize() == 0);
    Ok(())
}

#[tokio::test]
async fn a_fenced_hash_at_a_locks_own_key_is_refused_and_nothing_is_written() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let opts = client.options().renewal(Renewal::Off);
    let lease = client.try_acquire("job", &opts).await?;
    for key in [
        "lock:{job}",
        "lock:{job}:fence",
        "lock:{job}:queue",
        "lock:{job}:waiters",
        "lock:{free}",
    ] {
        match client.fenced_hash(key) {
            Err(Error::InvalidName { reason, .. }) => {
                ensure!(reason.contains("a lock's own keys"), "{key}: {reason}")
            }
            other => bail!("{key}: expected InvalidName, got {other:?}"),
        }
    }
    // Nothing was sent: the held lock's two keys are all there is.
    ensure!(server.dbsize() == 2, "keys were written");
    // Why: a hash where a free lock's key goes makes its next grant fail.
    server.cmd(&["HSET", "lock:{free}", "value", "x"]);
    ensure!(
        client.try_acquire("free", &opts).await.is_err(),
        "a grant over a hash succeeded"
    );
    // A key beside a lock's keys is a resource like any other.
    let beside = client.fenced_hash("lock:{job}:data")?;
    ensure!(
        beside
            .write(lease.fence(), lease.token(), "v")
            .await?
            .is_accepted()
    );
    lease.release().await?;
    Ok(())
}
