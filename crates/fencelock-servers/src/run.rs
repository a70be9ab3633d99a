//! Running a command line tool to completion, bounded: [`run_with_timeout`]
//! (for `redis-cli`, `etcdctl`, `psql` and the like).

use std::fs::File;
use std::io::{self, Read as _, Seek as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::child::GuardedChild;

/// Runs `command` to completion, at most `timeout` (then kills it), and
/// returns its stdout.
///
/// # Errors
///
/// Its exit status and output when it fails, is killed, or cannot start.
pub fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<String, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = tempfile::tempfile().map_err(|e| e.to_string())?;
    let err = tempfile::tempfile().map_err(|e| e.to_string())?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err.try_clone().map_err(|e| e.to_string())?);
    let mut child = GuardedChild::spawn(command).map_err(|e| format!("spawn {program}: {e}"))?;
    let status = child.wait_timeout(timeout);
    let (stdout, stderr) = (read_all(out), read_all(err));
    match status {
        Some(status) if status.success() => Ok(stdout),
        Some(status) => Err(format!(
            "{program} failed ({status}): {}{}",
            stdout.trim(),
            stderr.trim()
        )),
        None => Err(format!(
            "{program} did not finish within {timeout:?} (killed); output so far: {}{}",
            stdout.trim(),
            stderr.trim()
        )),
    }
}

/// Everything written to `file` (from its start; invalid UTF-8 replaced).
pub fn read_all(mut file: File) -> String {
    let mut bytes = Vec::new();
    let _ = file.seek(io::SeekFrom::Start(0));
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}
