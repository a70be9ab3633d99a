//! Usage errors and hostile option values, with the built binary: one line
//! that names what is wrong, exit 64, never a panic.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// Runs the binary without the environment variables that stand in for
/// options (so a missing option is really missing).
fn fencelock(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("FENCELOCK_REDIS_URL")
        .env_remove("FENCELOCK_FENCE")
        .env_remove("FENCELOCK_TOKEN")
        .env_remove("FENCELOCK_WAIT_MODE")
        .output()
        .expect("run fencelock")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A usage error is one line on stderr, exit 64, containing every `needle`.
fn assert_usage(args: &[&str], needles: &[&str]) {
    let out = fencelock(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line: {err}"
    );
    for needle in needles {
        assert!(
            err.contains(needle),
            "{args:?}: {needle:?} missing in {err}"
        );
    }
}

/// A missing required argument is named, with the help page of the
/// subcommand it belongs to.
#[test]
fn usage_errors_name_the_missing_argument() {
    assert_usage(
        &["run"],
        &[
            "missing required argument <NAME>",
            "(see fencelock run --help)",
        ],
    );
    assert_usage(
        &["read"],
        &[
            "missing required argument <RESOURCE>",
            "fencelock read --help",
        ],
    );
    assert_usage(
        &["write", "invoice:1"],
        &[
            "--fence <N>",
            "--holder <TOKEN>",
            "<VALUE>",
            "fencelock write --help",
        ],
    );
    assert_usage(
        &["--prefix", "run", "status"],
        &["<NAME>", "fencelock status --help"],
    );
    assert_usage(&["run", "job"], &["no command given"]);
    assert_usage(&[], &["no command given: use one of run, status"]);
    assert_usage(
        &["run", "--ttl", "soon", "job", "--", "true"],
        &["'soon'", "--ttl", "fencelock run --help"],
    );
}
