//! Bad input against a real `redis-server`: every case gets a clear error and
//! changes nothing (checked through `DBSIZE`, the keys themselves, and the
//! server's script-call count where "nothing was sent" is the contract).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use fencelock::{
    Error, Fence, FenceMode, KeyLayout, LockClient, LockOptions, MAX_NAME_LEN, MAX_TTL, MIN_TTL,
    Renewal,
};
use fencelock_testkit::{RedisConfig, RedisServer};

use crate::support::Keys;
use crate::support::TestRedis;
use tokio::time::Instant;

/// Names rejected in the default layout, with what is wrong with them.
fn bad_names() -> Vec<(String, &'static str)> {
    vec![
        (String::new(), "empty"),
        ("x".repeat(MAX_NAME_LEN + 1), "513 bytes"),
        ("a\nb".into(), "newline"),
        ("a\u{7}b".into(), "BEL control char"),
        ("tab\there".into(), "tab"),
        ("a\u{0}b".into(), "NUL"),
        ("a{b}".into(), "braces"),
        ("{x}".into(), "a whole hash tag"),
        ("half{open".into(), "an opening brace"),
    ]
}

/// Empty, 513-byte, control-character and (default layout) brace names are
/// refused with `Error::InvalidName` by `try_acquire`, `acquire`,
/// `with_lock` (whose work never runs), `inspect` and `keys`, before
/// anything reaches Redis.
#[tokio::test(flavor = "multi_thread")]
async fn invalid_names_are_rejected_before_anything_is_sent() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let opts = LockOptions::default();
    let calls_before = server.script_calls();
    for (name, what) in bad_names() {
        let errors = [
            client.try_acquire(&name, &opts).await.err(),
            client.acquire(&name, &opts).await.err(),
            client
                .with_lock(&name, &opts, |_| async {
                    panic!("the critical section ran for a bad name ({what})")
                })
                .await
                .err(),
            client.inspect(&name, KeyLayout::HashTagged).await.err(),
            client.keys(&name, KeyLayout::HashTagged).err(),
        ];
        for (i, err) in errors.into_iter().enumerate() {
            let err = err.with_context(|| format!("call {i} accepted a name with {what}"))?;
            ensure!(
                matches!(err, Error::InvalidName { .. }),
                "{what} (call {i}): expected InvalidName, got {err:?}"
            );
            ensure!(err.is_invalid_input() && !err.is_retryable());
            ensure!(
                err.to_string().starts_with("invalid name"),
                "{what}: unclear message {err}"
            );
        }
    }
    ensure!(server.dbsize() == 0, "a rejected name wrote keys");
    ensure!(
        server.script_calls() == calls_before,
        "a rejected name reached Redis"
    );
    Ok(())
}

/// The limits are where the docs say: a 512-byte name is accepted, and
/// braces are allowed in the guide layout (it has no hash tag).
#[tokio::test(flavor = "multi_thread")]
async fn a_512_byte_name_and_guide_layout_braces_are_accepted() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let longest = "n".repeat(MAX_NAME_LEN);
    let lease = client
        .try_acquire(&longest, &LockOptions::default())
        .await?;
    ensure!(server.exists(&format!("lock:{{{longest}}}")));
    ensure!(lease.release().await?.is_released());

    let guide = LockOptions::default().layout(KeyLayout::Guide);
    let lease = client.try_acquire("a{b}", &guide).await?;
    ensure!(server.exists("lock:a{b}"));
    ensure!(lease.release().await?.is_released());
    Ok(())
}

/// ttl 0, ttl 5 ms and 9 ms (below `MIN_TTL`), ttl above `MAX_TTL`, and a
/// renewal interval of zero or ≥ ttl are refused with
/// `Error::InvalidOption` naming the value, before anything is sent
/// (`DBSIZE` 0, no script call); the same options as client defaults make
/// `connect` fail.
#[tokio::test(flavor = "multi_thread")]
async fn invalid_options_are_rejected_before_anything_is_sent() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let base = LockOptions::default();
    let ttl = Duration::from_secs(1);
    let bad = [
        (base.clone().ttl(Duration::ZERO), "ttl 0", "0ns"),
        (
            base.clone().ttl(Duration::from_millis(5)),
            "ttl 5 ms",
            "5ms",
        ),
        (
            base.clone().ttl(MIN_TTL - Duration::from_millis(1)),
            "ttl 9 ms",
            "9ms",
        ),
        (
            base.clone().ttl(MAX_TTL + Duration::from_secs(1)),
            "ttl above the maximum",
            "2592001s",
        ),
        (
            base.clone().ttl(ttl).renewal(Renewal::Every(ttl)),
            "renewal interval = ttl",
            "1s",
        ),
        (
            base.clone()
                .ttl(ttl)
                .renewal(Renewal::Every(Duration::from_secs(5))),
            "renewal interval > ttl",
            "5s",
        ),
        (
            base.clone()
                .ttl(ttl)
                .renewal(Renewal::Every(Duration::ZERO)),
            "renewal interval 0",
            "0ns",
        ),
    ];
    let calls_before = server.script_calls();
    for (opts, what, shown) in &bad {
        let errors = [
            opts.validate().err(),
            client.try_acquire("job", opts).await.err(),
            client.acquire("job", opts).await.err(),
            client
                .with_lock("job", opts, |_| async {
                    panic!("the critical section ran with {what}")
                })
                .await
                .err(),
        ];
        for (i, err) in errors.into_iter().enumerate() {
            let err = err.with_context(|| format!("call {i} accepted {what}"))?;
            ensure!(
                matches!(err, Error::InvalidOption(_)),
                "{what} (call {i}): expected InvalidOption, got {err:?}"
            );
            ensure!(err.is_invalid_input());
            ensure!(
                err.to_string().contains(shown),
                "{what}: the message does not show the value {shown}: {err}"
            );
        }
        let err = LockClient::builder(server.url())
            .defaults(opts.clone())
            .connect()
            .await
            .err()
            .with_context(|| format!("connect accepted defaults with {what}"))?;
        ensure!(matches!(err, Error::InvalidOption(_)), "{what}: {err:?}");
    }
    ensure!(MIN_TTL == Duration::from_millis(10));
    ensure!(
        base.ttl(MIN_TTL).validate().is_ok(),
        "MIN_TTL itself is valid"
    );
    ensure!(server.dbsize() == 0, "rejected options wrote keys");
    ensure!(
        server.script_calls() == calls_before,
        "rejected options reached Redis"
    );
    Ok(())
}

/// A prefix with braces (it would break the hash tag) is refused by
/// `connect` with `Error::InvalidOption`.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefix_with_braces_is_rejected() -> Result<()> {
    let server = RedisServer::start();
    for prefix in ["lock{", "}lock:", "{x}:"] {
        let err = LockClient::builder(server.url())
            .prefix(prefix)
            .connect()
            .await
            .err()
            .with_context(|| format!("prefix {prefix:?} accepted"))?;
        ensure!(matches!(err, Error::InvalidOption(_)), "{err:?}");
        ensure!(err.to_string().contains(prefix), "{err}");
    }
    ensure!(server.dbsize() == 0);
    Ok(())
}

/// A wait of zero means "try once": on a held lock `acquire` returns
/// `Contended` after a single grant call (counted by the server) and without
/// sleeping (well under 250 ms, a bound loose enough for a loaded machine),
/// and the holder is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn wait_zero_on_a_held_lock_returns_contended_quickly() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let holder = client.try_acquire("held", &LockOptions::default()).await?;
    let before: Option<String> = server.query(&["GET", "lock:{held}"]);
    let calls_before = server.script_calls();
    let started = Instant::now();
    let err = client
        .acquire("held", &LockOptions::default().wait(Duration::ZERO))
        .await
        .expect_err("held");
    let elapsed = started.elapsed();
    ensure!(
        err.is_contended() && matches!(err, Error::Contended { .. }),
        "{err:?}"
    );
    ensure!(
        elapsed < Duration::from_millis(250),
        "a single attempt took {elapsed:?}"
    );
    ensure!(server.script_calls() - calls_before == 1);
    ensure!(server.query::<Option<String>>(&["GET", "lock:{held}"]) == before);
    ensure!(holder.release().await?.is_released());
    Ok(())
}

/// Checks `err` is `WrongType` naming `key`, not retryable, with a message
/// that tells the user nothing was changed.
fn ensure_wrong_type(err: &Error, key: &str, what: &str) -> Result<()> {
    match err {
        Error::WrongType { key: named, .. } => {
            ensure!(
                named.contains(key),
                "{what}: WrongType names {named:?}, not {key:?}"
            );
        }
        other => bail!("{what}: expected WrongType, got {other:?}"),
    }
    ensure!(
        !err.is_retryable(),
        "{what}: WrongType must not be retryable"
    );
    ensure!(
        err.to_string().contains("nothing was changed"),
        "{what}: {err}"
    );
    Ok(())
}

const MODES: [FenceMode; 2] = [FenceMode::Clock, FenceMode::Counter];

/// A lock key holding a hash (`HSET lock:{x} a b`): `try_acquire` and
/// `acquire` (at once, without waiting) fail with `WrongType` naming the key;
/// the hash is unchanged and no fence key was created — in both fence modes.
#[tokio::test(flavor = "multi_thread")]
async fn lock_key_holding_a_hash_is_wrong_type_and_left_unchanged() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&["HSET", "lock:{x}", "a", "b"]);
    for mode in MODES {
        let opts = LockOptions::default()
            .fence_mode(mode)
            .wait(Duration::from_secs(10));
        let err = client.try_acquire("x", &opts).await.expect_err("hash");
        ensure_wrong_type(&err, "lock:{x}", &format!("try_acquire {mode:?}"))?;
        let started = Instant::now();
        let err = client.acquire("x", &opts).await.expect_err("hash");
        ensure_wrong_type(&err, "lock:{x}", &format!("acquire {mode:?}"))?;
        ensure!(
            started.elapsed() < Duration::from_secs(2),
            "acquire retried a WrongType for {:?}",
            started.elapsed()
        );
        let state = client.inspect("x", KeyLayout::HashTagged).await;
        ensure!(
            matches!(state, Err(Error::WrongType { .. })),
            "inspect: {state:?}"
        );
    }
    let hash: Vec<String> = server.query(&["HGETALL", "lock:{x}"]);
    ensure!(hash == ["a", "b"], "the hash changed: {hash:?}");
    ensure!(server.query::<i64>(&["PTTL", "lock:{x}"]) == -1);
    ensure!(!server.exists("lock:{x}:fence"), "a fence was minted");
    ensure!(server.dbsize() == 1);
    Ok(())
}

/// A fence key holding a list (default layout, both fence modes): `WrongType`
/// naming the fence key, the list unchanged, no lock key created.
#[tokio::test(flavor = "multi_thread")]
async fn fence_key_holding_a_list_is_wrong_type_and_no_lock_is_created() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&["RPUSH", "lock:{y}:fence", "1", "2"]);
    for mode in MODES {
        let err = client
            .try_acquire("y", &LockOptions::default().fence_mode(mode))
            .await
            .expect_err("list");
        ensure_wrong_type(&err, "lock:{y}:fence", &format!("{mode:?}"))?;
        ensure!(
            !server.exists("lock:{y}"),
            "{mode:?}: a lock key was created"
        );
    }
    let list: Vec<String> = server.query(&["LRANGE", "lock:{y}:fence", "0", "-1"]);
    ensure!(list == ["1", "2"], "the list changed: {list:?}");
    ensure!(server.dbsize() == 1);
    Ok(())
}

/// A fence key holding a non-integer string (`abc`), in counter and clock
/// mode and both layouts: `WrongType`, the string unchanged, no lock key.
#[tokio::test(flavor = "multi_thread")]
async fn fence_key_holding_a_non_integer_string_is_wrong_type_and_no_lock_is_created() -> Result<()>
{
    let TestRedis { server, client } = TestRedis::start().await?;
    for (layout, lock, fence) in [
        (KeyLayout::HashTagged, "lock:{z}", "lock:{z}:fence"),
        (KeyLayout::Guide, "lock:z", "lock:z:fence"),
    ] {
        server.cmd(&["SET", fence, "abc"]);
        for mode in MODES {
            let opts = LockOptions::default().layout(layout).fence_mode(mode);
            let err = client.try_acquire("z", &opts).await.expect_err("abc");
            ensure_wrong_type(&err, fence, &format!("{layout:?}/{mode:?}"))?;
            ensure!(!server.exists(lock), "{layout:?}/{mode:?}: lock created");
            ensure!(server.query::<Option<String>>(&["GET", fence]).as_deref() == Some("abc"));
        }
    }
    ensure!(server.dbsize() == 2);
    Ok(())
}

/// Clock mode, fence key holding a string Lua's `tonumber` accepts but that
/// is not a decimal integer (`1.5`, `0x10`, ` 7`, `1e3`): the docs promise
/// `WrongType` for "a fence key [that] holds a non-integer" with nothing
/// overwritten — as counter mode does (`INCR` refuses them). Fails today:
/// clock mode grants and overwrites the key.
#[tokio::test(flavor = "multi_thread")]
async fn clock_fence_key_holding_a_non_integer_numeral_is_wrong_type_and_left_unchanged()
-> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let mut failures = Vec::new();
    for (i, junk) in ["1.5", "0x10", " 7", "1e3"].into_iter().enumerate() {
        let name = format!("numeral-{i}");
        let (lock, fence) = (format!("lock:{{{name}}}"), format!("lock:{{{name}}}:fence"));
        server.cmd(&["SET", &fence, junk]);
        // Counter mode refuses it (INCR): the reference behaviour.
        let counter = client
            .try_acquire(
                &name,
                &LockOptions::default().fence_mode(FenceMode::Counter),
            )
            .await;
        ensure!(
            matches!(counter, Err(Error::WrongType { .. })),
            "counter mode with fence {junk:?}: {counter:?}"
        );
        let clock = client.try_acquire(&name, &LockOptions::default()).await;
        let stored: Option<String> = server.query(&["GET", &fence]);
        let lock_created = server.exists(&lock);
        if !matches!(clock, Err(Error::WrongType { .. }))
            || lock_created
            || stored.as_deref() != Some(junk)
        {
            failures.push(format!(
                "fence key {junk:?}: clock mode returned {:?}, lock key created: {lock_created}, fence key now {stored:?}",
                clock.as_ref().map(|l| l.fence())
            ));
        }
        if let Ok(lease) = clock {
            lease.release().await?;
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// A fence key holding a number the grant script cannot turn into a valid
/// fence — in clock mode `inf`, `nan`, `1e300`, `99999999999999999999`,
/// `9223372036854775807` (Lua doubles; `string.format('%d')` of them yields
/// i64::MIN), in counter mode `-5` (INCR gives -4) — must be refused with an
/// error naming the fence key, before anything is written. Fails today for
/// `nan` (clock) and `-5` (counter): the script writes the lock key and a
/// garbage fence, the client then reports `UnexpectedReply` ("negative
/// fence") and the lock stays held by nobody until its ttl.
#[tokio::test(flavor = "multi_thread")]
async fn fence_key_holding_an_out_of_range_number_is_refused_and_no_lock_is_orphaned() -> Result<()>
{
    let TestRedis { server, client } = TestRedis::start().await?;
    let cases = [
        (FenceMode::Clock, "inf"),
        (FenceMode::Clock, "nan"),
        (FenceMode::Clock, "1e300"),
        (FenceMode::Clock, "99999999999999999999"),
        (FenceMode::Clock, "9223372036854775807"),
        (FenceMode::Counter, "-5"),
    ];
    let mut failures = Vec::new();
    for (i, (mode, junk)) in cases.into_iter().enumerate() {
        let name = format!("range-{i}");
        let (lock, fence) = (format!("lock:{{{name}}}"), format!("lock:{{{name}}}:fence"));
        server.cmd(&["SET", &fence, junk]);
        let result = client
            .try_acquire(&name, &LockOptions::default().fence_mode(mode))
            .await;
        let stored: Option<String> = server.query(&["GET", &fence]);
        let lock_value: Option<String> = server.query(&["GET", &lock]);
        let clear_error = result
            .as_ref()
            .err()
            .is_some_and(|e| matches!(e, Error::WrongType { key, .. } if *key == fence));
        if !clear_error || lock_value.is_some() || stored.as_deref() != Some(junk) {
            failures.push(format!(
                "{mode:?} fence key {junk:?}: try_acquire returned {:?}; lock key now {lock_value:?} (held by nobody); fence key now {stored:?}",
                result.as_ref().map(|l| l.fence()).map_err(ToString::to_string)
            ));
        }
        if let Ok(lease) = result {
            lease.release().await?;
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// `connect` to a URL where nothing listens fails within 5 s with
/// `Error::Unreachable` whose message names host and port.
#[tokio::test(flavor = "multi_thread")]
async fn unreachable_redis_fails_fast_with_an_error_naming_the_url() -> Result<()> {
    let url = RedisServer::client_url_unreachable();
    let host_port = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    let started = Instant::now();
    let err = LockClient::connect(&url)
        .await
        .err()
        .context("connected to a port where nothing listens")?;
    let elapsed = started.elapsed();
    ensure!(
        matches!(err, Error::Unreachable { .. }),
        "expected Unreachable, got {err:?}"
    );
    ensure!(err.is_connection() && err.is_retryable());
    ensure!(
        err.to_string().contains(&host_port),
        "the message does not name {host_port}: {err}"
    );
    ensure!(
        elapsed < Duration::from_secs(5),
        "connect took {elapsed:?} to fail"
    );
    Ok(())
}

/// `connect` to a frozen server (SIGSTOP: TCP accepts, nothing answers) with
/// short timeouts fails within a few seconds with `Error::Unreachable`
/// naming the URL, instead of hanging.
#[tokio::test(flavor = "multi_thread")]
async fn connect_to_a_frozen_server_times_out_with_unreachable() -> Result<()> {
    let server = RedisServer::start();
    let _paused = server.pause_guard();
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        LockClient::builder(server.url())
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .connect(),
    )
    .await
    .context("connect to a frozen server hung for 15 s")?;
    let elapsed = started.elapsed();
    match result {
        Ok(client) => {
            // The connection may be lazy; the first call must then fail fast.
            let err = client
                .try_acquire("frozen", &LockOptions::default())
                .await
                .err()
                .context("acquired on a frozen server")?;
            ensure!(err.is_connection(), "{err:?}");
            ensure!(err.to_string().contains(&server.addr()), "{err}");
        }
        Err(err) => {
            ensure!(matches!(err, Error::Unreachable { .. }), "{err:?}");
            ensure!(err.to_string().contains(&server.addr()), "{err}");
        }
    }
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "failing took {elapsed:?} with 500 ms timeouts"
    );
    Ok(())
}

/// A server with a password: connecting with a wrong password (with and
/// without a username) fails with `Error::Auth` whose message names the
/// server but not the password; with the right password a lock works and
/// `LockClient::url()` hides it. Nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn authentication_failures_are_auth_errors_that_hide_the_password() -> Result<()> {
    const RIGHT: &str = "s3cret-right";
    const WRONG: &str = "wrong-hunter2";
    let server = RedisServer::start_with(RedisConfig::default().with_password(RIGHT));
    let addr = server.addr();

    let wrong_url = format!("redis://:{WRONG}@{addr}/");
    let err = LockClient::connect(&wrong_url)
        .await
        .err()
        .context("connected with a wrong password")?;
    ensure!(
        matches!(err, Error::Auth { .. }),
        "wrong password: expected Auth, got {err:?}"
    );
    ensure!(err.is_connection() && !err.is_retryable());
    let text = err.to_string();
    ensure!(
        text.contains(&addr),
        "the message does not name {addr}: {text}"
    );
    ensure!(
        !text.contains(WRONG) && !format!("{err:?}").contains(WRONG),
        "the error shows the password: {text}"
    );

    // A username and a wrong password (ACL form).
    let err = LockClient::connect(&format!("redis://default:{WRONG}@{addr}/"))
        .await
        .err()
        .context("connected with user + wrong password")?;
    ensure!(matches!(err, Error::Auth { .. }), "{err:?}");
    ensure!(!err.to_string().contains(WRONG), "{err}");

    let client = LockClient::connect(&server.url()).await?;
    ensure!(
        !client.url().contains(RIGHT),
        "LockClient::url shows the password: {}",
        client.url()
    );
    ensure!(server.dbsize() == 0);
    let lease = client.try_acquire("job", &LockOptions::default()).await?;
    ensure!(lease.release().await?.is_released());
    Ok(())
}

/// No password for a server that requires one: `Error::Auth` naming the
/// URL, at `connect` or at the latest on the first lock call. Fails today:
/// `connect` succeeds (it sends nothing), and the first grant — an `EVALSHA`
/// with more than 10 arguments — is cut off by Redis with
/// "Protocol error: unauthenticated multibulk length" (`Error::Redis`,
/// neither `Auth` nor naming the URL).
#[tokio::test(flavor = "multi_thread")]
async fn missing_password_is_an_auth_error_naming_the_url() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_password("needed"));
    let addr = server.addr();
    let err = match LockClient::connect(&format!("redis://{addr}/")).await {
        Err(e) => e,
        Ok(client) => client
            .try_acquire("job", &LockOptions::default())
            .await
            .err()
            .context("acquired without a password")?,
    };
    ensure!(
        matches!(err, Error::Auth { .. }),
        "no password: expected Auth, got {err:?}"
    );
    ensure!(err.to_string().contains(&addr), "{err}");
    ensure!(server.dbsize() == 0);
    Ok(())
}

/// Malformed URLs are `Error::InvalidOption` (not `Unreachable`), and a
/// password inside a malformed URL is not shown in the message.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_urls_are_invalid_options_and_hide_passwords() -> Result<()> {
    for url in [
        "not a url",
        "",
        "http://127.0.0.1:6379/",
        "redis://127.0.0.1:notaport/",
        "redis://:pw-in-bad-url@127.0.0.1:notaport/",
    ] {
        let started = Instant::now();
        let err = LockClient::connect(url)
            .await
            .err()
            .with_context(|| format!("{url:?} was accepted"))?;
        ensure!(
            matches!(err, Error::InvalidOption(_)),
            "{url:?}: expected InvalidOption, got {err:?}"
        );
        ensure!(err.is_invalid_input());
        ensure!(
            !err.to_string().contains("pw-in-bad-url"),
            "the message shows the password: {err}"
        );
        ensure!(started.elapsed() < Duration::from_secs(1));
    }
    Ok(())
}

/// A URL whose raw (not percent-encoded) password contains `/`, `#` or `?`
/// — common in generated passwords — is rejected or refused without the
/// password, or any part of it, appearing in the error message.
#[tokio::test(flavor = "multi_thread")]
async fn errors_never_show_a_raw_password_with_url_special_characters() -> Result<()> {
    let server = RedisServer::start_with(RedisConfig::default().with_password("right"));
    let addr = server.addr();
    let mut leaks = Vec::new();
    for (password, secret_part) in [
        ("ab/cd-leak1", "cd-leak1"),
        ("ab#cd-leak2", "cd-leak2"),
        ("ab?cd-leak3", "cd-leak3"),
        ("leak4-ab/cd", "leak4-ab"),
    ] {
        let url = format!("redis://:{password}@{addr}/");
        let result = tokio::time::timeout(Duration::from_secs(10), LockClient::connect(&url))
            .await
            .with_context(|| format!("connect with password {password:?} hung"))?;
        let err = match result {
            Err(e) => e,
            Ok(client) => match client.try_acquire("job", &LockOptions::default()).await {
                Err(e) => e,
                Ok(_) => bail!("password {password:?} was accepted"),
            },
        };
        let text = err.to_string();
        if text.contains(secret_part) {
            leaks.push(format!("password {password:?}: {text}"));
        }
    }
    ensure!(
        leaks.is_empty(),
        "error messages show passwords:\n{}",
        leaks.join("\n")
    );
    Ok(())
}

/// A fenced-hash resource key holding a string: `write`, `register`,
/// `update` and `read` fail with `WrongType` naming the key, and the string
/// is unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn fenced_hash_key_holding_a_string_is_wrong_type_and_unchanged() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    server.cmd(&["SET", "invoice:1:data", "plain string"]);
    let hash = client.fenced_hash("invoice:1:data")?;
    let fence = Fence::new(7);
    let errors = [
        hash.write(fence, "holder-token", "new").await.err(),
        hash.register(fence, "holder-token").await.err(),
        hash.update(fence, "holder-token", |_| "updated".to_string())
            .await
            .err(),
        hash.read().await.err(),
    ];
    for (i, err) in errors.into_iter().enumerate() {
        let err = err.with_context(|| format!("call {i} accepted a string key"))?;
        ensure_wrong_type(&err, "invoice:1:data", &format!("call {i}"))?;
    }
    ensure!(
        server
            .query::<Option<String>>(&["GET", "invoice:1:data"])
            .as_deref()
            == Some("plain string")
    );
    ensure!(server.dbsize() == 1);
    Ok(())
}

/// Fenced-hash bad input: an empty holder token is `InvalidOption` and
/// writes nothing; empty, oversized and control-character resource keys are
/// `InvalidName`.
#[tokio::test(flavor = "multi_thread")]
async fn fenced_hash_bad_holder_and_bad_keys_are_rejected_before_anything_is_sent() -> Result<()> {
    let TestRedis { server, client } = TestRedis::start().await?;
    let hash = client.fenced_hash("res")?;
    let err = hash
        .write(Fence::new(1), "", "v")
        .await
        .err()
        .context("empty holder accepted")?;
    ensure!(matches!(err, Error::InvalidOption(_)), "{err:?}");
    let err = hash
        .register(Fence::new(1), "")
        .await
        .err()
        .context("empty holder accepted")?;
    ensure!(matches!(err, Error::InvalidOption(_)), "{err:?}");
    for key in [String::new(), "r".repeat(MAX_NAME_LEN + 1), "a\nb".into()] {
        let err = client
            .fenced_hash(&key)
            .err()
            .with_context(|| format!("resource key {key:?} accepted"))?;
        ensure!(matches!(err, Error::InvalidName { .. }), "{err:?}");
    }
    ensure!(server.dbsize() == 0);
    Ok(())
}

/// Connect and response timeouts of zero or beyond a day are refused by
/// `connect` before anything is sent, for every kind of URL, naming the
/// timeout: unchecked, `Duration::MAX` overflowed the deadline arithmetic
/// (a panic on Sentinel and etcd URLs). Control: a day is taken (the URL
/// then fails as unreachable, not as an option).
#[tokio::test(flavor = "multi_thread")]
async fn out_of_range_connect_and_response_timeouts_are_refused() -> Result<()> {
    let urls = [
        "redis://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/mymaster",
        "etcd://127.0.0.1:1",
    ];
    for url in urls {
        for (what, bad) in [
            ("connect timeout", Duration::MAX),
            ("connect timeout", Duration::ZERO),
            ("response timeout", Duration::MAX),
            ("response timeout", Duration::from_secs(24 * 3600 + 1)),
        ] {
            let builder = LockClient::builder(url);
            let builder = if what == "connect timeout" {
                builder.connect_timeout(bad)
            } else {
                builder.response_timeout(bad)
            };
            match builder.connect().await {
                Err(Error::InvalidOption(msg)) => {
                    ensure!(msg.contains(what), "{url} {what} {bad:?}: {msg}")
                }
                other => bail!("{url} {what} {bad:?}: expected InvalidOption, got {other:?}"),
            }
        }
        let day = Duration::from_secs(24 * 3600);
        let result = LockClient::builder(url)
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(day)
            .connect()
            .await;
        ensure!(
            !matches!(result, Err(Error::InvalidOption(_))),
            "control: a one-day response timeout on {url} was refused: {result:?}"
        );
    }
    Ok(())
}
