//! Child processes that cannot outlive `fencelock`.

use tokio::process::Command;

/// Asks the kernel to kill the child when this process dies: a private
/// redis-server never outlives an interrupted command, and a command run
/// under a lock never runs on unsupervised after `fencelock run` was killed
/// (its lock would expire while it kept working).
///
/// The signal fires when the *thread* that forked the child exits; the CLI
/// runs on a current-thread runtime, so that is the main thread.
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
