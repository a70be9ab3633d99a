//! The one place where this crate forks child processes.
//!
//! Every child is forked from a single dedicated, lazily started thread
//! that lives until the process exits. Each child gets
//! `prctl(PR_SET_PDEATHSIG, SIGKILL)` in a `pre_exec` hook, so the kernel
//! kills it as soon as the thread that forked it dies. Because that thread
//! is the long-lived spawner thread, "the forking thread died" means "this
//! process died" — even when it was killed with SIGKILL and no destructor
//! ran. Forking from the caller's thread instead would kill the child as
//! soon as, say, a short-lived tokio worker or blocking thread exits.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// A request to the spawner thread: the command to fork, and where to send
/// the result.
struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Sender side of the spawner thread's queue (`None` if the thread could
/// not be started); the thread itself holds the receiver for the rest of
/// the process's life.
static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();

/// Spawns `command` from the long-lived spawner thread, with a parent-death
/// signal of SIGKILL, and returns the child.
pub(crate) fn spawn(command: Command) -> io::Result<Child> {
    let spawner = SPAWNER
        .get_or_init(|| start_spawner_thread().ok())
        .as_ref()
        .ok_or_else(|| io::Error::other("the fencelock-servers spawner thread could not start"))?;
    let (reply, result) = mpsc::channel();
    spawner
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("the fencelock-servers spawner thread has stopped"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("the fencelock-servers spawner thread dropped a request"))?
}

fn start_spawner_thread() -> io::Result<mpsc::Sender<SpawnRequest>> {
    let (sender, requests) = mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new()
        .name("fencelock-spawner".to_owned())
        .spawn(move || {
            // The static sender is never dropped, so this loop only ends when
            // the process exits.
            for request in requests {
                let result = spawn_here(request.command);
                // If the requester is gone, nobody will ever kill this child:
                // do it now.
                if let Err(mpsc::SendError(Ok(mut child))) = request.reply.send(result) {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        })?;
    Ok(sender)
}

/// Forks `command` from the current thread with PR_SET_PDEATHSIG = SIGKILL.
/// std sets the user, group and process group before the hook runs, so
/// none of them clears the death signal.
fn spawn_here(mut command: Command) -> io::Result<Child> {
    let parent = Pid::this();
    // SAFETY: the hook runs in the forked child before exec and only makes
    // two async-signal-safe syscalls (prctl, getppid); it does not allocate.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // If the parent died between fork and prctl, the death signal was
            // never armed: the child has been re-parented, so give up.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from(Errno::ESRCH));
            }
            Ok(())
        });
    }
    command.spawn()
}
