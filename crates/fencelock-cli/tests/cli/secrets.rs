//! Redis passwords never reach the output, with the built binary and a real
//! redis-server that requires one: `--help`, errors, `--verbose`, logs, the
//! metrics endpoint, `top`, every `--json`; in the three URL forms that
//! carry a password (`redis://:PW@`, `redis://USER:PW@`, `unix://…?pass=PW`),
//! and in Sentinel, Cluster, TLS and malformed URLs.
//! The command of `run` gets the URL (documented) unless `--no-url-env`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use fencelock_testkit::{RedisConfig, RedisServer, free_port, spawn_guarded};

use crate::support::{BIN, fencelock, http_get, poll};

const PASSWORD: &str = "s3cretPW-9f2a";
const WRONG: &str = "wr0ngSECRET-77";

/// `fencelock ARGS` with the URL in `FENCELOCK_REDIS_URL` (the form that
/// clap would print in --help).
fn with_url(url: &str, args: &[&str]) -> Command {
    let mut cmd = fencelock(args);
    cmd.env("FENCELOCK_REDIS_URL", url).stdin(Stdio::null());
    cmd
}

fn output(url: &str, args: &[&str]) -> Output {
    with_url(url, args).output().expect("run fencelock")
}

/// Neither password appears on stdout or stderr.
fn assert_clean(what: &str, text: &str) {
    for secret in [PASSWORD, WRONG] {
        assert!(!text.contains(secret), "{what} printed a password: {text}");
    }
}

fn all_of(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The URL forms that carry the password, for `server` (socket `sock`).
fn urls(server: &RedisServer, sock: &Path, password: &str) -> [String; 3] {
    let port = server.port();
    [
        format!("redis://:{password}@127.0.0.1:{port}"),
        format!("redis://alice:{password}@127.0.0.1:{port}"),
        format!("unix://{}?db=0&pass={password}", sock.display()),
    ]
}

/// Every command's --help with the password in FENCELOCK_REDIS_URL and the
/// token in FENCELOCK_TOKEN (clap prints env values unless told not to).
#[test]
fn help_hides_environment_values() {
    for sub in [
        "", "run", "status", "read", "write", "update", "top", "bench", "demo",
    ] {
        let args: Vec<&str> = [sub, "--help"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let out = with_url(&format!("redis://:{PASSWORD}@127.0.0.1:1"), &args)
            .env("FENCELOCK_TOKEN", WRONG)
            .env("FENCELOCK_FENCE", "4242424242")
            .output()
            .expect("help");
        assert_eq!(out.status.code(), Some(0));
        let text = all_of(&out);
        assert_clean(&format!("{sub} --help"), &text);
        assert!(!text.contains("4242424242"), "{sub} --help: {text}");
    }
}

/// Everything that prints, on a server that requires a password, with each
/// URL form: success paths, `--verbose`, logs, metrics, `top`, JSON, usage
/// and connection errors, a wrong password.
#[test]
fn passwords_never_reach_the_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("redis.sock");
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_password(PASSWORD)
            .with_arg("--unixsocket")
            .with_arg(sock.display().to_string())
            .with_arg("--unixsocketperm")
            .with_arg("700"),
    );
    server.cmd(&[
        "ACL",
        "SETUSER",
        "alice",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ]);
    let wrong = urls(&server, &sock, WRONG);
    let unreachable = [
        format!(
            "redis://:{PASSWORD}@{}",
            RedisServer::client_url_unreachable().trim_start_matches("redis://")
        ),
        format!("redis://alice:{PASSWORD}@127.0.0.1:1"),
        format!(
            "unix://{}/missing.sock?pass={PASSWORD}",
            dir.path().display()
        ),
    ];
    for (n, url) in urls(&server, &sock, PASSWORD).iter().enumerate() {
        let name = format!("job{n}");
        let go = dir.path().join(format!("go{n}"));
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let hold = format!(
            "\"$FENCELOCK_BIN\" write res{n} v --json; \"$FENCELOCK_BIN\" read --register res{n} --json; \
             \"$FENCELOCK_BIN\" update res{n} --json -- cat; \
             while [ ! -f {} ]; do sleep 0.02; done",
            go.display()
        );
        let mut run = {
            let mut c = with_url(
                url,
                &[
                    "run",
                    "--verbose",
                    "--ttl",
                    "300ms",
                    "--metrics-addr",
                    &addr,
                    &name,
                    "-c",
                    &hold,
                ],
            );
            c.env("FENCELOCK_LOG", "debug")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            spawn_guarded(c)
        };
        let metrics = poll("/metrics", Duration::from_secs(10), || {
            http_get(port, "/metrics").filter(|m| m.contains("fencelock_renewals_total"))
        });
        assert_clean("/metrics", &metrics);
        for args in [
            &["status", name.as_str(), "--json"][..],
            &["status", name.as_str()],
            &["top", "--once"],
            &["top", "--once", "--json"],
            &["read", &format!("res{n}"), "--json"],
        ] {
            let out = with_url(url, args)
                .env("FENCELOCK_LOG", "debug")
                .output()
                .expect("run");
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", all_of(&out));
            assert_clean(&format!("{url}: {args:?}"), &all_of(&out));
        }
        std::fs::write(&go, "").expect("touch");
        let status = run.wait_timeout(Duration::from_secs(10)).expect("run ends");
        let mut text = String::new();
        run.take_stdout()
            .expect("stdout")
            .read_to_string(&mut text)
            .expect("read");
        run.take_stderr()
            .expect("stderr")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(status.code(), Some(0), "{text}");
        assert!(text.contains("worst renewal lag"), "--verbose: {text}");
        assert!(
            text.contains("\"accepted\":true"),
            "nested write, update: {text}"
        );
        assert_clean(
            &format!("{url}: run --verbose, nested write/read/update, logs"),
            &text,
        );

        // The command gets the URL (documented), unless --no-url-env.
        let env = output(url, &["run", &name, "--", "env"]);
        assert!(
            String::from_utf8_lossy(&env.stdout).contains(&format!("FENCELOCK_REDIS_URL={url}"))
        );
        let env = output(url, &["run", "--no-url-env", &name, "--", "env"]);
        assert_eq!(env.status.code(), Some(0));
        let env = String::from_utf8_lossy(&env.stdout);
        assert!(env.contains("FENCELOCK_TOKEN="), "{env}");
        assert!(!env.contains("FENCELOCK_REDIS_URL"), "--no-url-env: {env}");

        // Errors: usage, wrong password (78), unreachable (69).
        let out = output(url, &["run", &name]);
        assert_eq!(out.status.code(), Some(64));
        assert_clean("a usage error", &all_of(&out));
        let out = Command::new(BIN)
            .args(["status", "--redis", url, "--bogus"])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(64));
        assert_clean("a usage error with --redis", &all_of(&out));
        for (bad, code) in [(&wrong[n], 78), (&unreachable[n], 69)] {
            // `--no-wait`: a waiting `run` behind Sentinel keeps trying to
            // connect until its --wait has passed.
            for args in [
                &["status", "job"][..],
                &["run", "--no-wait", "job", "--", "true"],
                &["top", "--once"],
            ] {
                let out = with_url(bad, args)
                    .env("FENCELOCK_LOG", "debug")
                    .output()
                    .expect("run");
                assert_eq!(
                    out.status.code(),
                    Some(code),
                    "{bad} {args:?}: {}",
                    all_of(&out)
                );
                assert_clean(&format!("{bad}: {args:?}"), &all_of(&out));
                assert!(
                    String::from_utf8_lossy(&out.stderr).contains("***"),
                    "{}",
                    all_of(&out)
                );
            }
        }
    }
}

/// The URL forms of the other topologies, with a password in every place one
/// can sit (userinfo, `sentinel_password`, `pass`), and malformed URLs around
/// a password: unreachable or refused, never shown.
#[test]
fn passwords_in_topology_urls_and_malformed_urls_never_reach_the_output() {
    let unreachable = [
        format!("redis+sentinel://:{PASSWORD}@127.0.0.1:1/mymaster"),
        format!(
            "redis+sentinel://alice:{PASSWORD}@127.0.0.1:1,127.0.0.1:2/mymaster?sentinel_password={WRONG}"
        ),
        format!("redis+sentinel://127.0.0.1:1/m?sentinel_pass={WRONG}&db=0"),
        format!("redis+cluster://:{PASSWORD}@127.0.0.1:1,127.0.0.1:2"),
        format!("rediss://alice:{PASSWORD}@127.0.0.1:1/0"),
        format!("redis+unix:///nonexistent/redis.sock?user=alice&pass={PASSWORD}"),
    ];
    for url in &unreachable {
        let out = output(url, &["status", "job"]);
        assert_eq!(out.status.code(), Some(69), "{}", all_of(&out));
        assert_clean(url, &all_of(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("***"),
            "the URL is named, redacted: {}",
            all_of(&out)
        );
    }
    let malformed = [
        format!("redis://:{PASSWORD}@"),
        format!("redis://:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis+sentinel://:{PASSWORD}@127.0.0.1:1"),
        format!("redis://:{PASSWORD}@127.0.0.1:1/notadb"),
        format!("redis://:pa/ss?{PASSWORD}#x@127.0.0.1:1"),
        format!("bogus://:{PASSWORD}@127.0.0.1:1"),
        format!("redis+sentinel://127.0.0.1:1/m?SENTINEL_PASS={WRONG}"),
        format!("redis+unix:///nonexistent/redis.sock?user=alice&password={PASSWORD}"),
    ];
    for url in &malformed {
        let out = output(url, &["status", "job"]);
        let code = out.status.code();
        assert!(
            matches!(code, Some(64 | 69 | 78)),
            "{url}: exit {code:?}: {}",
            all_of(&out)
        );
        assert_clean(url, &all_of(&out));
    }
}

/// The part every secret of the sweep shares: no output may contain it.
const STEM: &str = "Zq9Xw";

/// URLs of every form with a secret (containing [`STEM`]) in every place
/// one can sit, well-formed or by mistake: userinfo with and without a
/// user, percent-encoded, non-ASCII, misspelt and unknown parameters, a
/// `db` that is no number, a bare word in the query, a fragment. `redis`
/// requires a password; nothing listens on `closed`.
fn secret_urls(redis: &str, closed: u16, sock: &str) -> Vec<String> {
    let s = format!("{STEM}-s3cret");
    let encoded = format!("{STEM}%2Ds3cr%C3%A9t");
    let unicode = format!("{STEM}-pässwört");
    let c = format!("127.0.0.1:{closed}");
    vec![
        format!("redis://:{s}@{redis}"),
        format!("redis://alice:{s}@{redis}"),
        format!("redis://{s}@{redis}"),
        format!("redis://:{encoded}@{redis}/0"),
        format!("redis://alice:{unicode}@{redis}"),
        format!("redis://{redis}/?pasword={s}"),
        format!("redis://{redis}/?{s}"),
        format!("redis://{redis}/{s}"),
        format!("redis://{redis}/0#{s}"),
        format!("rediss://:{s}@{redis}"),
        format!("unix://{sock}?pass={s}"),
        format!("unix://{sock}?password={s}"),
        format!("redis+unix://{sock}?db={s}"),
        format!("redis+sentinel://:{s}@{c}/mymaster?sentinel_password={s}"),
        format!("redis+sentinel://{s}@{c}/mymaster"),
        format!("redis+sentinel://{c}/mymaster?sentinel_pasword={s}"),
        format!("redis+sentinel://{c}/mymaster?db={s}"),
        format!("redis+sentinel://{c}/mymaster?{s}"),
        format!("rediss+sentinel://alice:{encoded}@{c}/m"),
        format!("redis+cluster://:{s}@{c}"),
        format!("redis+cluster://{s}@{c}"),
        format!("redis+cluster://{c}?pasword={s}"),
        format!("rediss+cluster://alice:{unicode}@{c}"),
        format!("etcd://root:{s}@{c}"),
        format!("etcd://{s}@{c}"),
        format!("etcd://{c}?auth={s}"),
        format!("etcd://{c}?token={s}"),
        format!("etcd://{c}?{s}"),
        format!("etcds://root:{encoded}@{c}"),
        s.clone(),
    ]
}

/// Every URL of [`secret_urls`], given as `--url` or in `FENCELOCK_URL`,
/// through `status` (text and JSON), `doctor` and `run` with trace
/// logs: the command fails as usage (64), unreachable (69) or configuration
/// (78), and no byte of stdout or stderr shows the secret.
#[test]
fn secrets_in_every_url_form_never_reach_any_output() {
    let server = RedisServer::start_with(RedisConfig::default().with_password(PASSWORD));
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("nothing.sock");
    // `run --no-wait`: a waiting `run` behind Sentinel or a Cluster keeps
    // trying to connect for its whole --wait (a failover may be under way),
    // which would only make this sweep slow; what it prints is the same.
    let commands: [&[&str]; 4] = [
        &["status", "job"],
        &["status", "job", "--json"],
        &["doctor"],
        &["run", "--no-wait", "job", "--", "true"],
    ];
    for url in secret_urls(&server.addr(), free_port(), &sock.display().to_string()) {
        // The commands of one URL at once: most fail at connect, in
        // milliseconds, and a TLS handshake to a plaintext port takes the
        // connect timeout.
        std::thread::scope(|scope| {
            for (n, args) in commands.iter().enumerate() {
                let url = &url;
                scope.spawn(move || {
                    let mut cmd = if n == 0 {
                        let mut cmd = fencelock(&["--url", url]);
                        cmd.args(*args);
                        cmd
                    } else {
                        with_url(url, args)
                    };
                    let out = cmd
                        .env("FENCELOCK_URL", url)
                        .env("FENCELOCK_LOG", "trace")
                        .stdin(Stdio::null())
                        .output()
                        .expect("run fencelock");
                    let text = all_of(&out);
                    assert!(
                        matches!(out.status.code(), Some(64 | 69 | 78)),
                        "{args:?} with a URL of the sweep: exit {:?}: {text}",
                        out.status.code()
                    );
                    assert!(!text.contains(STEM), "{args:?} printed a secret: {text}");
                });
            }
        });
    }
}
