//! The README's shell snippets, run as written: each ```sh block of the
//! README either runs here against a private redis-server (the
//! `fencelock` under test first on `PATH`, `FENCELOCK_URL` naming the
//! server) or is listed, with why, under "Examples the tests run" in the
//! README. A snippet that stops working, or a new one that is neither run
//! nor listed, fails the suite.

use std::path::Path;
use std::process::Command;

use fencelock_testkit::RedisServer;

use crate::support::BIN;

/// The README, as the repository holds it.
fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The ```sh blocks of `text`, each as its lines.
fn sh_blocks(text: &str) -> Vec<Vec<&str>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim_start() == "```sh" => current = Some(Vec::new()),
            None => {}
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some(block) => block.push(line),
        }
    }
    blocks
}

/// A block's first command: its first line without a trailing comment.
fn first_command(block: &[&str]) -> String {
    let line = block.iter().find(|l| !l.trim().is_empty()).copied();
    let line = line.unwrap_or_default();
    line.split(" #").next().unwrap_or(line).trim().to_string()
}

/// The blocks this file runs, by first command.
const RUN_HERE: [&str; 3] = [
    "fencelock run invoice-42 -- sh -c 'fencelock write invoice:42 closed'",
    "fencelock run --permits 2 encoders -c 'echo \"slot $FENCELOCK_SLOT, fence $FENCELOCK_FENCE\"'",
    "fencelock run --write config -- fencelock write config:data v2",
];

/// The `run --permits` snippet of "Command line", as the README holds it
/// (checked against the README's block).
const PERMITS_SNIPPET: &str = r#"fencelock run --permits 2 encoders -c 'echo "slot $FENCELOCK_SLOT, fence $FENCELOCK_FENCE"'
# inside, write, read and update use the slot's own pair: value:SLOT, fence:SLOT, holder:SLOT
fencelock run --permits 2 flushers -- sh -c 'fencelock write partitions flushed'
fencelock read partitions --slot 0   # partitions slot 0: "flushed" (fence …, holder …)"#;

/// The `run --read`/`--write` snippet of "Command line", as the README
/// holds it (checked against the README's block).
const RWLOCK_SNIPPET: &str = r#"fencelock run --write config -- fencelock write config:data v2
# readers share the lock; a reader's FENCELOCK_FENCE is the write epoch it saw, not a write fence
fencelock run --read config -- fencelock read --validate config:data   # exit 75 if a later writer wrote it"#;

/// Runs `script` with `sh -e` against `server`, the `fencelock` under test
/// first on `PATH`: its stdout.
fn run_snippet(server: &RedisServer, script: &str) -> String {
    let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .env("PATH", path)
        .env("FENCELOCK_URL", server.url())
        .env_remove("FENCELOCK_REDIS_URL")
        .env_remove("FENCELOCK_SLOT")
        .env_remove("FENCELOCK_ACCESS")
        .env_remove("FENCELOCK_FENCE")
        .env_remove("FENCELOCK_TOKEN")
        .output()
        .expect("runs sh");
    assert!(
        out.status.success(),
        "the snippet failed ({:?}):\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The read-modify-write snippet of "Command line": the fenced write, the
/// update through a command, and the update by hand (`read --register`,
/// `jq`, `write`) each do what the README says.
#[test]
fn the_readme_read_modify_write_snippet_runs_as_written() {
    let text = readme();
    let block = sh_blocks(&text)
        .into_iter()
        .find(|b| first_command(b) == RUN_HERE[0])
        .expect("the README's read-modify-write snippet");
    let server = RedisServer::start();
    run_snippet(&server, &block.join("\n"));
    // `write invoice:42 closed`, then two increments of `counter`.
    let value = |key: &str| server.query::<Option<String>>(&["HGET", key, "value"]);
    assert_eq!(value("invoice:42").as_deref(), Some("closed"));
    assert_eq!(value("counter").as_deref(), Some("2"));
}

/// The `run --permits` snippet of "Command line" runs as written: the
/// first permit's slot and fence printed, the write in slot 0's pair of
/// the resource, and the read of that pair. The README's block is this
/// snippet.
#[test]
fn the_readme_permits_snippet_runs_as_written() {
    let text = readme();
    let block = sh_blocks(&text)
        .into_iter()
        .find(|b| first_command(b) == RUN_HERE[1])
        .expect("the README's run --permits block");
    assert_eq!(block.join("\n").trim_end(), PERMITS_SNIPPET);
    let server = RedisServer::start();
    let stdout = run_snippet(&server, PERMITS_SNIPPET);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with("slot 0, fence "), "{stdout}");
    assert!(
        lines[1].starts_with("partitions slot 0: accepted (fence "),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("partitions slot 0: \"flushed\" (fence "),
        "{stdout}"
    );
    let stored: Vec<Option<String>> = server.query(&["HMGET", "partitions", "value:0", "value"]);
    assert_eq!(stored, [Some("flushed".to_string()), None]);
}

/// The `run --read`/`--write` snippet of "Command line" runs as written:
/// the writer's fenced write, then a reader's validated read of it, clean
/// (exit 0) with the writer's fence. When the README holds the block (its
/// first command is in [`RUN_HERE`]), it is this snippet.
#[test]
fn the_readme_rwlock_snippet_runs_as_written() {
    let text = readme();
    if let Some(block) = sh_blocks(&text)
        .into_iter()
        .find(|b| first_command(b) == RUN_HERE[2])
    {
        assert_eq!(block.join("\n").trim_end(), RWLOCK_SNIPPET);
    }
    let server = RedisServer::start();
    let stdout = run_snippet(&server, RWLOCK_SNIPPET);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let fence = lines[0]
        .strip_prefix("config:data: accepted (fence ")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        lines[1].starts_with(&format!("config:data: \"v2\" (fence {fence}, holder ")),
        "{stdout}"
    );
}

/// Every ```sh block of the README is run here or listed, with why it is
/// not, under "Examples the tests run".
#[test]
fn every_readme_snippet_is_run_or_listed_as_excluded() {
    let text = readme();
    let section = text
        .split("\n### Examples the tests run\n")
        .nth(1)
        .and_then(|rest| rest.split("\n#").next())
        .expect("the README section \"Examples the tests run\"");
    let blocks = sh_blocks(&text);
    assert!(blocks.len() >= 4, "found only {} sh blocks", blocks.len());
    for block in blocks {
        let first = first_command(&block);
        assert!(
            RUN_HERE.contains(&first.as_str()) || section.contains(&format!("`{first}`")),
            "the README's snippet starting with `{first}` is neither run by the tests nor listed, with why, under \"Examples the tests run\""
        );
    }
}
