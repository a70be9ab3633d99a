//! `fencelock bench` end to end: the built binary with its own private
//! redis-server, short scenarios. These tests check the output contract
//! (`--json` lines and their fields, `--plot`, exit codes) and the figures
//! that are correctness rather than speed (no overlaps, fair mode is fair),
//! never speed targets.
//!
//! Each full run takes several seconds, so the tests carry `heavy_` in their
//! names and nextest runs them one at a time (see `.config/nextest.toml`).

use std::collections::BTreeSet;
use std::process::Output;

use fencelock_testkit::{RedisConfig, RedisServer};
use serde_json::{Map, Value};

use crate::support::fencelock;

const MODES: [&str; 3] = ["poll", "notify", "fair"];

fn run(args: &[&str]) -> (Output, String, String) {
    let out = fencelock(args).output().expect("run fencelock bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// Every stdout line as a JSON object; panics on anything else.
fn json_lines(stdout: &str) -> Vec<Map<String, Value>> {
    assert!(!stdout.trim().is_empty(), "no output");
    stdout
        .lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("stdout line is not a JSON object: {line:?} ({other:?})"),
        })
        .collect()
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> &'a Value {
    obj.get(name)
        .unwrap_or_else(|| panic!("{name} missing in {obj:?}"))
}

/// A finite number (serde_json has no NaN: it prints `null` for one).
fn num(obj: &Map<String, Value>, name: &str) -> f64 {
    field(obj, name)
        .as_f64()
        .unwrap_or_else(|| panic!("{name} is not a number in {obj:?}"))
}

fn positive(obj: &Map<String, Value>, name: &str) -> f64 {
    let v = num(obj, name);
    assert!(v > 0.0, "{name} = {v} in {obj:?}");
    v
}

fn count(obj: &Map<String, Value>, name: &str) -> u64 {
    field(obj, name)
        .as_u64()
        .unwrap_or_else(|| panic!("{name} is not a non-negative integer in {obj:?}"))
}

fn text<'a>(obj: &'a Map<String, Value>, name: &str) -> &'a str {
    field(obj, name)
        .as_str()
        .unwrap_or_else(|| panic!("{name} is not a string in {obj:?}"))
}

fn by_scenario<'a>(
    objects: &'a [Map<String, Value>],
    scenario: &str,
) -> Vec<&'a Map<String, Value>> {
    objects
        .iter()
        .filter(|o| o.get("scenario").and_then(Value::as_str) == Some(scenario))
        .collect()
}

/// `ratio_to_bound` = cycles_per_s ÷ (ping ÷ 2), up to the printed rounding
/// (rates to integers, the ratio to 3 decimals).
fn assert_ratio(obj: &Map<String, Value>, ping_field: &str) {
    let expected = num(obj, "cycles_per_s") / (positive(obj, ping_field) / 2.0);
    let ratio = num(obj, "ratio_to_bound");
    assert!(
        (ratio - expected).abs() <= 0.002 + expected * 0.002,
        "ratio_to_bound {ratio} but cycles_per_s / ({ping_field} / 2) = {expected}: {obj:?}"
    );
}

/// Checks one contended object: every field present with a sensible type
/// and range, and no overlapping holders.
fn check_contended(obj: &Map<String, Value>, workers: u64) {
    assert_eq!(count(obj, "workers"), workers, "{obj:?}");
    let completions = count(obj, "completions");
    assert!(completions > 0, "{obj:?}");
    positive(obj, "completions_per_s");
    let utilization = positive(obj, "utilization");
    // Holders never overlap, so the lock cannot be held for more than the
    // wall time (a little rounding aside).
    assert!(utilization <= 1.001, "utilization {utilization}: {obj:?}");
    let (w50, w99) = (num(obj, "wait_p50_ms"), num(obj, "wait_p99_ms"));
    assert!(0.0 <= w50 && w50 <= w99, "{obj:?}");
    // Handoffs (grants to a different worker) may be absent in a short
    // run: their quantiles are then NaN, printed as null.
    let handoffs = count(obj, "handoffs");
    if handoffs > 0 {
        let (h50, h99) = (num(obj, "handoff_p50_ms"), num(obj, "handoff_p99_ms"));
        assert!(0.0 <= h50 && h50 <= h99, "{obj:?}");
    } else {
        assert!(field(obj, "handoff_p50_ms").is_null(), "{obj:?}");
        assert!(field(obj, "handoff_p99_ms").is_null(), "{obj:?}");
    }
    let jain = num(obj, "jain_fairness");
    assert!(
        jain >= 1.0 / workers as f64 - 1e-3 && jain <= 1.0 + 1e-3,
        "jain {jain}: {obj:?}"
    );
    // Every completion is at least a grant and a release script.
    assert!(num(obj, "commands_per_completion") >= 2.0, "{obj:?}");
    assert!(num(obj, "redis_cpu_ms_per_1k") >= 0.0, "{obj:?}");
    assert_eq!(count(obj, "overlaps"), 0, "holders overlapped: {obj:?}");
    // The handoff floor bounds the utilization: real hold ÷ (real hold +
    // floor), below 1 since a hand-over takes time.
    let floor = positive(obj, "handoff_floor_ms");
    let hold = positive(obj, "real_hold_ms");
    let bound = positive(obj, "utilization_bound");
    let expected = hold / (hold + floor);
    assert!(
        (bound - expected).abs() <= 0.002 && bound < 1.0,
        "utilization_bound {bound}, expected {expected}: {obj:?}"
    );
}

/// The fenced floor of a scenario: its rate, its ratio to the scenario's
/// bound (`ping_field` ÷ 2), and, for uncontended, the ratio of fencelock to it.
fn check_floor(obj: &Map<String, Value>, ping_field: &str) {
    let floor = positive(obj, "floor_cycles_per_s");
    let expected = floor / (positive(obj, ping_field) / 2.0);
    let ratio = num(obj, "floor_ratio_to_bound");
    assert!(
        (ratio - expected).abs() <= 0.002 + expected * 0.002,
        "floor_ratio_to_bound {ratio}, expected {expected}: {obj:?}"
    );
}

/// fencelock's references in an uncontended or many object: each rate
/// positive, each ratio the quotient of the printed rates (one round, so
/// the per-round ratio is the ratio of the rates), spreads ordered, the
/// latencies in µs ordered, and the Redis CPU per cycle of each.
fn check_cycles(obj: &Map<String, Value>, tasks: u64) {
    assert_eq!(count(obj, "tasks"), tasks, "{obj:?}");
    // --no-pin (or a server given by URL): nothing pinned, and so said.
    assert_eq!(text(obj, "placement"), "unpinned", "{obj:?}");
    assert!(
        field(obj, "client_cpu").is_null() && field(obj, "redis_cpu").is_null(),
        "{obj:?}"
    );
    assert_eq!(text(obj, "topology"), "standalone", "{obj:?}");
    assert_eq!(count(obj, "rounds"), 1, "{obj:?}");
    positive(obj, "cycles_per_s");
    assert_ratio(obj, "redis_ping_per_s");
    check_floor(obj, "redis_ping_per_s");
    for (ratio, of) in [
        ("ratio_to_floor", "floor_cycles_per_s"),
        ("ratio_to_unfenced", "unfenced_cycles_per_s"),
    ] {
        let expected = num(obj, "cycles_per_s") / positive(obj, of);
        let got = positive(obj, ratio);
        assert!(
            (got - expected).abs() <= 0.002 + expected * 0.002,
            "{ratio} {got}, expected {expected}: {obj:?}"
        );
        let (lo, hi) = (
            num(obj, &format!("{ratio}_min")),
            num(obj, &format!("{ratio}_max")),
        );
        assert!(lo <= got && got <= hi, "{ratio} spread: {obj:?}");
    }
    for what in ["acquire", "release", "ping"] {
        let (p50, p99) = (
            positive(obj, &format!("{what}_p50_us")),
            positive(obj, &format!("{what}_p99_us")),
        );
        assert!(p50 <= p99, "{what}: {obj:?}");
    }
    for cpu in [
        "redis_cpu_us_per_cycle",
        "floor_redis_cpu_us_per_cycle",
        "unfenced_redis_cpu_us_per_cycle",
        "client_cpu_us_per_cycle",
        "floor_client_cpu_us_per_cycle",
        "unfenced_client_cpu_us_per_cycle",
    ] {
        positive(obj, cpu);
    }
    // A cycle is at least two script calls and what they run.
    assert!(num(obj, "commands_per_cycle") >= 2.0, "{obj:?}");
    // redis-benchmark is installed with redis-tools: its PING rate and
    // fencelock's ratio to its bound are in the same run.
    positive(obj, "redis_benchmark_ping_per_s");
    positive(obj, "ratio_to_benchmark_bound");
}

/// The full default run on a private server, one round: one uncontended
/// object, one contended object per wait mode (poll, notify, fair in that
/// order), one many object, one held object per number of leases, nothing
/// but JSON on stdout, no progress text on a non-terminal stderr, exit 0.
#[test]
fn heavy_bench_json_prints_one_object_per_scenario_and_mode() {
    let (out, stdout, stderr) = run(&[
        "bench",
        "--no-pin",
        "--duration",
        "400ms",
        "--repeat",
        "1",
        "--workers",
        "4",
        "--tasks",
        "8",
        "--leases",
        "200",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        !stderr.contains('\r') && !stderr.contains("running"),
        "progress shown on a non-terminal stderr: {stderr:?}"
    );
    let objects = json_lines(&stdout);
    assert_eq!(objects.len(), 6, "{stdout}");

    let uncontended = by_scenario(&objects, "uncontended");
    assert_eq!(uncontended.len(), 1, "{stdout}");
    check_cycles(uncontended[0], 1);

    let contended = by_scenario(&objects, "contended");
    let modes: Vec<&str> = contended.iter().map(|o| text(o, "mode")).collect();
    assert_eq!(modes, MODES, "{stdout}");
    for obj in &contended {
        check_contended(obj, 4);
    }
    // FIFO: every worker gets its turn in order, so the counts per worker
    // differ by about one at most.
    let fair = contended[2];
    assert!(num(fair, "jain_fairness") >= 0.9, "{fair:?}");

    let many = by_scenario(&objects, "many");
    assert_eq!(many.len(), 1, "{stdout}");
    check_cycles(many[0], 8);

    let held = by_scenario(&objects, "held");
    let leases: Vec<u64> = held.iter().map(|o| count(o, "leases")).collect();
    assert_eq!(leases, [200], "{stdout}");
    for obj in held {
        assert_eq!(count(obj, "leases_lost"), 0, "{obj:?}");
        assert_eq!(num(obj, "ttl_ms"), 10_000.0, "{obj:?}");
        // Watched for at least one ttl: every lease renewed.
        assert!(num(obj, "window_s") >= 10.0, "{obj:?}");
        positive(obj, "client_bytes_per_lease");
        positive(obj, "redis_commands_per_s");
        for share in ["client_cpu_share", "redis_cpu_share"] {
            let v = num(obj, share);
            assert!((0.0..=2.0).contains(&v), "{share}: {obj:?}");
        }
        assert!(num(obj, "renewal_lag_max_ms") >= 0.0, "{obj:?}");
    }

    let scenarios: BTreeSet<&str> = objects.iter().map(|o| text(o, "scenario")).collect();
    assert_eq!(
        scenarios,
        BTreeSet::from(["uncontended", "contended", "many", "held"])
    );
}

/// By default the bench pins its own redis-server to the first CPU this
/// process may use and measures uncontended (and many) twice: with the
/// client on Redis's CPU, then on the next allowed CPU; each record says
/// which. With one CPU allowed (`taskset` leaves one) only the same-CPU
/// regime is measured, and the header says why the other is missing.
#[test]
fn heavy_bench_pins_its_own_server_and_measures_both_placements() {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .expect("this process's CPU affinity");
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    let args = [
        "bench",
        "--scenario",
        "uncontended",
        "--duration",
        "150ms",
        "--repeat",
        "1",
        "--json",
    ];
    let (out, stdout, stderr) = run(&args);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let objects = json_lines(&stdout);
    let placements: Vec<(&str, u64, u64)> = objects
        .iter()
        .map(|o| {
            (
                text(o, "placement"),
                count(o, "client_cpu"),
                count(o, "redis_cpu"),
            )
        })
        .collect();
    let (redis, other) = (cpus[0] as u64, cpus.get(1).map(|&c| c as u64));
    let mut expected = vec![("same_cpu", redis, redis)];
    expected.extend(other.map(|other| ("other_cpu", other, redis)));
    assert_eq!(placements, expected, "{stdout}");

    // One CPU: the same-CPU regime, and the note.
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", &cpus[0].to_string(), crate::support::BIN])
        .args(args.iter().filter(|a| **a != "--json"))
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_REDIS_URL");
    let out = cmd.output().expect("runs fencelock under taskset");
    let text_out = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text_out}");
    assert!(
        text_out.contains("the other-CPU regime was skipped")
            && text_out.contains(&format!("client on Redis's CPU {}", cpus[0]))
            && !text_out.contains("client on CPU"),
        "{text_out}"
    );
}

/// `--repeat 3`: every ratio is the median of three rounds, between the
/// smallest and the largest, which the object carries beside it.
#[test]
fn heavy_bench_repeat_reports_the_median_and_spread_of_the_rounds() {
    let (out, stdout, stderr) = run(&[
        "bench",
        "--no-pin",
        "--scenario",
        "uncontended",
        "--duration",
        "300ms",
        "--repeat",
        "3",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let objects = json_lines(&stdout);
    assert_eq!(objects.len(), 1, "{stdout}");
    let u = &objects[0];
    assert_eq!(count(u, "rounds"), 3, "{u:?}");
    for ratio in [
        "ratio_to_floor",
        "ratio_to_unfenced",
        "ratio_to_bound",
        "floor_ratio_to_bound",
        "unfenced_ratio_to_bound",
    ] {
        let (lo, mid, hi) = (
            positive(u, &format!("{ratio}_min")),
            positive(u, ratio),
            positive(u, &format!("{ratio}_max")),
        );
        assert!(lo <= mid && mid <= hi, "{ratio}: {u:?}");
    }
}

/// The topology runs of `fencelock bench` (docs/design.md §6): on a
/// 3-master Cluster and through TLS, uncontended and many are measured with
/// the library's connection for fencelock and one of the same type for the
/// references (PING to the node serving the lock; TLS PING over TLS), and
/// every record names its topology.
#[test]
fn heavy_bench_measures_a_cluster_and_tls_with_references_of_the_same_type() {
    let cluster = fencelock_testkit::RedisCluster::start();
    let server = fencelock_testkit::RedisServer::start_with(
        fencelock_testkit::RedisConfig::default().with_tls(fencelock_testkit::TlsConfig::default()),
    );
    let tls = server.tls_files().expect("TLS files");
    let ca = tls.ca_cert.display().to_string();
    let cluster_url = cluster.cluster_url();
    let tls_url = server.url();
    for (url, extra, topology) in [
        (cluster_url.as_str(), vec![], "cluster"),
        (tls_url.as_str(), vec!["--tls-ca", ca.as_str()], "tls"),
    ] {
        let mut args = vec![
            "--redis",
            url,
            "bench",
            "--scenario",
            "uncontended,many",
            "--duration",
            "300ms",
            "--repeat",
            "1",
            "--tasks",
            "16",
            "--json",
        ];
        args.extend(extra);
        let (out, stdout, stderr) = run(&args);
        assert_eq!(out.status.code(), Some(0), "{topology}: {stderr}");
        let objects = json_lines(&stdout);
        assert_eq!(objects.len(), 2, "{stdout}");
        for obj in &objects {
            assert_eq!(text(obj, "topology"), topology, "{obj:?}");
            positive(obj, "cycles_per_s");
            assert_ratio(obj, "redis_ping_per_s");
            check_floor(obj, "redis_ping_per_s");
            positive(obj, "ratio_to_unfenced");
        }
    }
}

/// `--plot FILE.svg` with `--json`: stdout stays pure JSON, and the SVG has
/// one polyline per wait mode in each of its two panels (acquire wait;
/// handoff, drawn for a mode only if it had handoffs) and names each mode.
#[test]
fn heavy_bench_plot_writes_an_svg_with_a_curve_per_mode_and_panel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svg_path = dir.path().join("waits.svg");
    let svg_arg = svg_path.to_str().expect("utf-8 temp path");
    let (out, stdout, stderr) = run(&[
        "bench",
        "--no-pin",
        "--scenario",
        "contended",
        "--duration",
        "1s",
        "--repeat",
        "1",
        "--workers",
        "4",
        "--json",
        "--plot",
        svg_arg,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let objects = json_lines(&stdout);
    let modes: Vec<&str> = objects.iter().map(|o| text(o, "mode")).collect();
    assert_eq!(modes, MODES, "{stdout}");
    for obj in &objects {
        assert_eq!(text(obj, "scenario"), "contended");
        check_contended(obj, 4);
    }
    let svg = std::fs::read_to_string(&svg_path).expect("the SVG was written");
    assert!(svg.trim_start().starts_with("<svg"), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    let with_handoffs = objects.iter().filter(|o| count(o, "handoffs") > 0).count();
    assert_eq!(
        svg.matches("<polyline").count(),
        MODES.len() + with_handoffs,
        "one wait curve per mode, one handoff curve per mode with handoffs: {stdout}"
    );
    for mode in MODES {
        assert!(svg.contains(&format!(">{mode} (")), "legend lacks {mode}");
    }
}

/// Bad arguments exit 64 (EX_USAGE) with a message on stderr and nothing on
/// stdout: no workers, no tasks, an unparsable duration. `--plot` without
/// the contended scenario also exits 64 and writes no file, and so does a
/// `--plot` path that cannot be created, before any scenario runs.
#[test]
fn bench_usage_errors_exit_64() {
    for args in [
        &["bench", "--workers", "0", "--json"][..],
        &["bench", "--tasks", "0", "--json"],
        &["bench", "--duration", "soon", "--json"],
    ] {
        let (out, stdout, stderr) = run(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?} printed {stdout:?}");
        let flag = args[1];
        assert!(stderr.contains(flag), "{args:?}: {stderr:?}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let svg_path = dir.path().join("none.svg");
    let (out, _, stderr) = run(&[
        "bench",
        "--scenario",
        "uncontended",
        "--duration",
        "200ms",
        "--json",
        "--plot",
        svg_path.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--plot"), "{stderr:?}");
    assert!(!svg_path.exists(), "an SVG was written without data");

    // A plot path that cannot be created is refused before anything runs
    // (with a 10 s duration, a run would print scenario lines first).
    let unwritable = dir.path().join("no-such-dir").join("waits.svg");
    let (out, stdout, stderr) = run(&[
        "bench",
        "--scenario",
        "contended",
        "--json",
        "--plot",
        unwritable.to_str().expect("utf-8 temp path"),
    ]);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stdout.is_empty(), "a scenario ran: {stdout:?}");
    assert!(
        stderr.contains("--plot") && stderr.contains("cannot create"),
        "{stderr:?}"
    );
}

/// The password of a `--redis` URL never reaches stdout or stderr: the
/// header shows the URL redacted (`redis://:***@…`, `unix://…?pass=***`),
/// and so does every error. A refused password exits 78 whichever scenario
/// connects first, an unreachable server 69.
#[test]
fn bench_never_shows_the_redis_password() {
    const PASSWORD: &str = "bench-secret-4711";
    const WRONG: &str = "wrong-secret-0815";
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().expect("utf-8 temp path");
    let server = RedisServer::start_with(
        RedisConfig::default()
            .with_password(PASSWORD)
            .with_arg("--unixsocket")
            .with_arg(socket),
    );
    let port = server.port();
    let no_secret = |args: &[&str], stdout: &str, stderr: &str| {
        for secret in [PASSWORD, WRONG] {
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "{args:?} showed a password:\nstdout:\n{stdout}\nstderr:\n{stderr}"
            );
        }
    };

    // The right password: the header shows the URL redacted.
    for (url, shown) in [
        (
            server.url(),
            format!("fencelock bench on redis://:***@127.0.0.1:{port}/:"),
        ),
        (
            format!("redis://default:{PASSWORD}@127.0.0.1:{port}/"),
            format!("fencelock bench on redis://default:***@127.0.0.1:{port}/:"),
        ),
        (
            format!("unix://{socket}?pass={PASSWORD}"),
            format!("fencelock bench on unix://{socket}?pass=***:"),
        ),
    ] {
        for json in [false, true] {
            let mut args = vec![
                "--redis",
                &url,
                "bench",
                "--scenario",
                "uncontended",
                "--duration",
                "100ms",
                "--repeat",
                "1",
            ];
            if json {
                args.push("--json");
            }
            let (out, stdout, stderr) = run(&args);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
            no_secret(&args, &stdout, &stderr);
            if json {
                assert_eq!(json_lines(&stdout).len(), 1, "{stdout}");
            } else {
                assert!(stdout.starts_with(&shown), "{args:?}: {stdout}");
            }
        }
    }

    // A wrong password, whichever scenario connects first (78); a password
    // under a query key the URL does not take (`password=`) is refused by
    // name (64) where fencelock's client connects first, and as no
    // password (78) where the bench's reference connection does; its
    // value is hidden either way.
    let wrong = format!("redis://:{WRONG}@127.0.0.1:{port}/");
    let wrong_user = format!("redis://default:{WRONG}@127.0.0.1:{port}/");
    let unix_password = format!("unix://{socket}?password={WRONG}");
    for (url, shown, code) in [
        (&wrong, format!("redis://:***@127.0.0.1:{port}/"), 78),
        (
            &wrong_user,
            format!("redis://default:***@127.0.0.1:{port}/"),
            78,
        ),
        (&unix_password, format!("unix://{socket}?password=***"), 64),
    ] {
        for scenario in ["uncontended", "contended", "many"] {
            let args = ["--redis", url, "bench", "--scenario", scenario];
            let (out, stdout, stderr) = run(&args);
            let codes: &[i32] = if code == 64 { &[64, 78] } else { &[code] };
            assert!(
                out.status.code().is_some_and(|c| codes.contains(&c)),
                "{args:?}: {:?} {stderr}",
                out.status.code()
            );
            no_secret(&args, &stdout, &stderr);
            assert!(stderr.contains(&shown), "{args:?}: {stderr}");
        }
    }

    // Unreachable: nothing listens on the socket or the port.
    let gone_socket = dir.path().join("gone.sock");
    let gone_socket = gone_socket.to_str().expect("utf-8 temp path");
    let closed = RedisServer::client_url_unreachable();
    let closed = closed.replace("redis://", &format!("redis://:{WRONG}@"));
    for url in [format!("unix://{gone_socket}?pass={WRONG}"), closed] {
        let args = ["--redis", &url, "bench", "--scenario", "uncontended"];
        let (out, stdout, stderr) = run(&args);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {stderr}");
        no_secret(&args, &stdout, &stderr);
        assert!(stderr.contains("***"), "{args:?}: {stderr}");
    }
}

/// Durations no run can use are refused before any server starts, naming
/// the flag (they used to overflow the engine's time arithmetic).
#[test]
fn bench_and_torture_refuse_durations_they_cannot_use() {
    for (args, flag) in [
        (&["bench", "--duration", "500000000000y"][..], "--duration"),
        (&["bench", "--duration", "0s"][..], "--duration"),
        (&["bench", "--hold", "500000000000y"][..], "--hold"),
        (&["torture", "--ttl", "500000000000y"][..], "--ttl"),
        (&["torture", "--hold", "500000000000y"][..], "--hold"),
        (
            &["torture", "--nemesis-interval", "500000000000y"][..],
            "--nemesis-interval",
        ),
        (
            &["torture", "--duration", "500000000000y"][..],
            "--duration",
        ),
    ] {
        let (out, stdout, stderr) = run(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stdout}{stderr}");
        assert!(
            stderr.contains(flag) && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
}

/// `held` against a Redis that restarts while the leases are held (and
/// keeps nothing): the run ends with the report, every lease counted as
/// lost, and exits 1, not with the broken connection.
#[test]
fn heavy_bench_held_reports_the_leases_a_restart_lost() {
    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out_path = dir.path().join("out.jsonl");
    let out = std::fs::File::create(&out_path).expect("an output file");
    let mut cmd = fencelock(&[
        "--url",
        &server.url(),
        "bench",
        "--scenario",
        "held",
        "--leases",
        "200",
        "--repeat",
        "1",
        "--json",
    ]);
    cmd.stdout(out).stderr(std::process::Stdio::null());
    let mut bench = fencelock_testkit::spawn_guarded(cmd);
    // Every lease held: its lock key and its fence key.
    crate::support::wait_for(
        "200 leases held",
        std::time::Duration::from_secs(30),
        || server.query::<i64>(&["DBSIZE"]) >= 400,
    );
    server.restart();
    let status = bench
        .wait_timeout(std::time::Duration::from_secs(60))
        .expect("bench ends");
    let stdout = std::fs::read_to_string(&out_path).expect("the output");
    assert_eq!(status.code(), Some(1), "{stdout}");
    let held = json_lines(&stdout);
    assert_eq!(held.len(), 1, "{stdout}");
    assert_eq!(count(&held[0], "leases_lost"), 200, "{stdout}");
}

/// `--cycles N --path P` runs exactly N cycles of one path and says so;
/// it is for Redis, and refuses what it cannot combine with.
#[test]
fn heavy_bench_cycles_runs_one_path_and_refuses_what_does_not_fit() {
    let server = RedisServer::start();
    for path in ["fencelock", "floor", "unfenced"] {
        let (out, stdout, stderr) = run(&[
            "--url",
            &server.url(),
            "bench",
            "--cycles",
            "7",
            "--path",
            path,
        ]);
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        assert_eq!(
            stdout.trim(),
            format!("7 cycles of {path} (after 20 warm-up cycles)")
        );
    }
    // No lock is left held: what stays is the fence keys of fencelock and
    // of the fenced floor, which outlive their locks by design.
    let keys = server.query::<Vec<String>>(&["KEYS", "*"]);
    assert!(
        keys.iter().all(|k| k.ends_with(":fence")) && keys.len() <= 2,
        "{keys:?}"
    );
    for (args, says) in [
        (
            &["bench", "--cycles", "5", "--scenario", "many"][..],
            "cannot be used with",
        ),
        (&["bench", "--path", "floor"][..], "--cycles"),
        (
            &["--url", "etcd://127.0.0.1:1", "bench", "--cycles", "5"][..],
            "--cycles is for Redis",
        ),
    ] {
        let (out, stdout, stderr) = run(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// `scripts/client-cost` (small counts, on the binary under test) prints
/// two figures of instructions per cycle for each path, the client's and
/// the server's; fencelock's client figure is above the unfenced
/// reference's. (With 4 cycles between the runs the server's figure is
/// within its background work's noise, so only its presence is checked.)
/// Single-threaded under valgrind, it runs beside the other tests, not in
/// the heavy group.
#[test]
fn client_cost_counts_instructions_per_cycle_of_every_path() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/client-cost");
    let out = std::process::Command::new(&script)
        .args(["2", "6"])
        .env("FENCELOCK_BIN", crate::support::BIN)
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_REDIS_URL")
        .output()
        .expect("runs scripts/client-cost");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    // The client's figure, and the server's.
    let figures = |path: &str| -> (u64, i64) {
        stdout
            .lines()
            .find_map(|l| {
                let mut words = l.strip_prefix(path)?.split_whitespace();
                let client = words.next()?.parse().ok()?;
                let server = words.next()?.parse().ok()?;
                Some((client, server))
            })
            .unwrap_or_else(|| panic!("no figures for {path}: {stdout}"))
    };
    let (fencelock, floor, unfenced) = (
        figures("fencelock").0,
        figures("floor").0,
        figures("unfenced").0,
    );
    assert!(fencelock > 0 && floor > 0 && unfenced > 0, "{stdout}");
    assert!(fencelock > unfenced, "{stdout}");
}
