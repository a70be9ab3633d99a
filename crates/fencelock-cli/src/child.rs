//! Child processes that cannot outlive `fencelock`, and why one could not
//! be started.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

use tokio::process::Command;

/// Asks the kernel to kill the child when this process dies: a private
/// redis-server never outlives an interrupted command, and the command of
/// `fencelock update` never runs on after `fencelock` was killed.
///
/// The signal fires when the *thread* that forked the child exits; the CLI
/// runs on a current-thread runtime, so that is the main thread. (The
/// command of `fencelock run` has its whole tree watched instead, see
/// `watchdog`.)
pub(crate) fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only makes the
    // async-signal-safe prctl system call.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}

/// Exit code of a command that exists but cannot be executed (as shells).
pub(crate) const NOT_EXECUTABLE: u8 = 126;
/// Exit code of a command that does not exist (as shells).
pub(crate) const NOT_FOUND: u8 = 127;

/// Why `program` could not be started, as the shell's exit code and a
/// message for `fencelock: MESSAGE`.
///
/// `execve` says "no such file" both when the program is missing and when the
/// program exists but its `#!` interpreter (or ELF loader) does not; shells
/// tell them apart, and so does this: 127 "command not found" only when no
/// such file exists, 126 with the interpreter line named otherwise. A file
/// without execute permission (or a directory) is 126 as well.
pub(crate) fn exec_failure(program: &OsStr, error: &std::io::Error) -> (u8, String) {
    let shown = program.to_string_lossy();
    match error.raw_os_error() {
        Some(libc::ENOENT) => match locate(program) {
            None => (NOT_FOUND, format!("{shown}: command not found")),
            Some(path) => match interpreter_line(&path) {
                Some(line) => {
                    let interpreter = line
                        .trim_start_matches("#!")
                        .trim_start_matches([' ', '\t'])
                        // Not split_whitespace: a CRLF script's "\r" is
                        // the usual culprit and must stay visible.
                        .split([' ', '\t'])
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    (
                        NOT_EXECUTABLE,
                        format!(
                            "{shown}: bad interpreter: {interpreter:?} not found (its first line is {line:?})"
                        ),
                    )
                }
                None => (
                    NOT_EXECUTABLE,
                    format!(
                        "{shown}: cannot execute: its program loader (ELF interpreter) is missing"
                    ),
                ),
            },
        },
        Some(libc::EACCES) if locate(program).is_some_and(|p| p.is_dir()) => {
            (NOT_EXECUTABLE, format!("{shown}: is a directory"))
        }
        Some(libc::EACCES) => (
            NOT_EXECUTABLE,
            format!(
                "{shown}: permission denied (not executable: chmod +x, or run it with its interpreter)"
            ),
        ),
        Some(libc::ENOEXEC) => (
            NOT_EXECUTABLE,
            format!("{shown}: cannot execute: not a program, nor a script starting with #!"),
        ),
        _ => (NOT_EXECUTABLE, format!("{shown}: cannot execute: {error}")),
    }
}

/// The file `program` names: the path itself if it has a `/`, else the first
/// match on `PATH` (as `execvp` searches it).
fn locate(program: &OsStr) -> Option<PathBuf> {
    let path = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return path.exists().then(|| path.to_path_buf());
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.exists())
}

/// The `#!` line of a script, if the file starts with one.
fn interpreter_line(path: &Path) -> Option<String> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = &head[..n];
    if !head.starts_with(b"#!") {
        return None;
    }
    let end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    Some(
        String::from_utf8_lossy(&head[..end])
            .trim_end_matches(' ')
            .to_string(),
    )
}
