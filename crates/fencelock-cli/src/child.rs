//! Child processes that cannot outlive `fencelock`, and why one could not
//! be started.

use std::ffi::OsStr;

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
pub(crate) fn exec_failure(program: &OsStr, error: &std::io::Error) -> (u8, String) {
    let shown = program.to_string_lossy();
    match error.kind() {
        std::io::ErrorKind::NotFound => (NOT_FOUND, format!("{shown}: command not found")),
        _ => (NOT_EXECUTABLE, format!("{shown}: cannot execute: {error}")),
    }
}
