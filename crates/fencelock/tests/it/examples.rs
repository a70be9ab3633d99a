//! The crate's examples (`examples/`), run as a user runs them: each must
//! exit 0 and say it reached its end. Cargo builds them with the tests
//! (`cargo test`, `cargo nextest run`), next to the test binaries; the
//! invoice example needs the `postgres` feature, on in `scripts/test`.

use std::path::PathBuf;
use std::process::{Command, Output};

use fencelock_testkit::{PgServer, RedisServer};

/// The built example `name`: `target/<profile>/examples/<name>`, the
/// directory above this test binary's `deps/`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test binary>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is not built: cargo builds examples with the tests (run `cargo test` or `cargo nextest run` with --all-features)",
        path.display()
    );
    path
}

fn assert_reached_its_end(out: &Output, how: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the invoice example ({how}) exited {:?}:\n{stdout}\n{stderr}",
        out.status.code()
    );
    assert!(
        stdout.contains(
            "ok: the stale holder's update was rejected; the row holds B's status and fence"
        ) && stdout.contains("lock_holder is B's holder id: true"),
        "the invoice example ({how}) did not reach its end:\n{stdout}\n{stderr}"
    );
}

/// `cargo run -p fencelock --features postgres --example invoice`, as the
/// README shows it: it starts its own redis-server and Postgres, A's stale
/// update is rejected and the row holds B's status, fence and holder id.
#[test]
fn the_invoice_example_runs_on_its_own_servers() {
    let out = Command::new(example("invoice"))
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_PG_URL")
        .output()
        .expect("runs the example");
    assert_reached_its_end(&out, "its own servers");
}

/// The same example on the servers `FENCELOCK_URL` and `FENCELOCK_PG_URL`
/// name.
#[test]
fn the_invoice_example_runs_on_the_servers_it_is_given() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    let db = pg.create_database("billing");
    let out = Command::new(example("invoice"))
        .env("FENCELOCK_URL", redis.url())
        .env("FENCELOCK_PG_URL", &db)
        .output()
        .expect("runs the example");
    assert_reached_its_end(&out, "FENCELOCK_URL and FENCELOCK_PG_URL");
    let status = pg.psql("billing", "SELECT status FROM invoices WHERE id = 42");
    assert_eq!(status.trim(), "closed by B");
}
