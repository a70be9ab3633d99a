//! The watchdog of `fencelock run`: a small process between `run` and its
//! command that ties the whole command tree to the lock.
//!
//! `run` itself cannot do this: killed with SIGKILL it can do nothing, and
//! the parent-death signal (`PR_SET_PDEATHSIG`) reaches only its direct
//! child, so `sh -c 'sleep 30 | cat'` would leave `sleep` and `cat` running
//! without the lock. The watchdog is this binary started again (fork + exec,
//! so it is single-threaded and free of the async runtime) with the first
//! argument [`ARG`]. It
//!
//! - is a *child subreaper* (`PR_SET_CHILD_SUBREAPER`): a process of the tree
//!   whose parent exits is re-parented to the watchdog instead of init, so the
//!   watchdog's children are always the command plus every orphan of the tree
//!   (a double fork cannot escape it);
//! - starts the command (in a process group of its own unless `run` has a
//!   terminal), and exits with the command's exit status (its code, or 128+N
//!   if it died of signal N), after printing why a command could not start;
//! - by default exits only once *no process of the tree is left*, so `run`
//!   holds (and renews) the lock until then;
//! - gets SIGUSR2 when `run` dies (its parent-death signal) and then kills
//!   the whole tree with SIGKILL: the command's group, and every child of the
//!   watchdog again and again until none is left (killing a process
//!   re-parents its children to the watchdog).
//!
//! The tree is the command and every process started from it that stays in
//! the command's *session*. A process that starts a session of its own
//! (`setsid`, `daemon(3)`) has detached on purpose: it is neither waited for
//! nor stopped (a `setsid` process cannot re-enter the session, so none of
//! its descendants are either). Processes started by someone else on the
//! command's behalf (`systemd-run`, `at`, a container daemon) are not part of
//! the tree either. If the watchdog itself is killed with SIGKILL, only the
//! command is killed (its parent-death signal), not the rest of its tree.
//!
//! Signals from `run` (any other sender is ignored: with a terminal the
//! watchdog shares the foreground process group, and the command got those
//! already):
//!
//! | signal | the watchdog |
//! |---|---|
//! | SIGINT, SIGTERM, SIGHUP, SIGQUIT | forwards it to the command (its process group, when it has one), and to orphans outside that group once the command has exited |
//! | SIGUSR1 | the lock is lost: SIGTERM and SIGCONT to the whole tree, then waits for it to be gone (also with `--no-wait-children`) |
//! | SIGUSR2 | SIGKILL to the whole tree (after the grace, or when `run` died) |

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, getpid, getppid, getsid};

use crate::child;

/// `eprintln!` that never panics: a closed stderr must not take the
/// watchdog (and with it the watch over the tree) down.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The first argument that makes `fencelock` the watchdog.
pub(crate) const ARG: &str = "__watchdog";

/// Exit code of the watchdog when it cannot do its job.
const SOFTWARE: u8 = crate::exit::SOFTWARE;

/// The signals the watchdog waits for (blocked, then taken with
/// `sigtimedwait`, so no handler ever runs).
fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGCHLD,
    ] {
        set.add(sig);
    }
    set
}

/// Blocks the watchdog's signals. `run` calls it between fork and exec
/// (one `sigprocmask`, async-signal-safe): the mask survives exec, so a
/// signal sent before the watchdog is ready waits for it instead of killing
/// it.
pub(crate) fn block_signals() -> std::io::Result<()> {
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None).map_err(std::io::Error::from)
}

/// How `run` wants the command supervised.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mode {
    /// Start the command in a process group of its own (no terminal).
    pub(crate) own_group: bool,
    /// Exit only once no process of the tree is left.
    pub(crate) wait_children: bool,
    /// Say on stderr when the command exited but left processes behind.
    pub(crate) verbose: bool,
}

impl Mode {
    /// The mode as one argument: `g`, `w` and `v` for each flag set.
    pub(crate) fn to_arg(self) -> String {
        let mut arg = String::from("-");
        for (set, c) in [
            (self.own_group, 'g'),
            (self.wait_children, 'w'),
            (self.verbose, 'v'),
        ] {
            if set {
                arg.push(c);
            }
        }
        arg
    }

    fn from_arg(arg: &str) -> Mode {
        Mode {
            own_group: arg.contains('g'),
            wait_children: arg.contains('w'),
            verbose: arg.contains('v'),
        }
    }
}

/// The watchdog's arguments after [`ARG`]: `run`'s pid, the mode, the lock
/// name (for messages), the program and its arguments.
pub(crate) fn args(mode: Mode, name: &str, program: &str, program_args: &[String]) -> Vec<String> {
    let mut args = vec![
        ARG.to_string(),
        std::process::id().to_string(),
        mode.to_arg(),
        name.to_string(),
        program.to_string(),
    ];
    args.extend(program_args.iter().cloned());
    args
}

/// The watchdog's `main`: `args` are the arguments after [`ARG`].
pub(crate) fn main(args: Vec<OsString>) -> u8 {
    let [parent, mode, name, program, program_args @ ..] = args.as_slice() else {
        say!("fencelock: {ARG} is internal to `fencelock run`");
        return crate::exit::USAGE;
    };
    let Some(parent) = parent
        .to_str()
        .and_then(|p| p.parse().ok())
        .map(Pid::from_raw)
    else {
        say!("fencelock: {ARG} is internal to `fencelock run`");
        return crate::exit::USAGE;
    };
    let mode = Mode::from_arg(&mode.to_string_lossy());
    let name = name.to_string_lossy().into_owned();
    if let Err(e) = setup() {
        say!("fencelock: cannot watch the command: {e}");
        return SOFTWARE;
    }
    if getppid() != parent {
        // `run` died before we were ready: nothing was started.
        return SOFTWARE;
    }
    let mut command = std::process::Command::new(program);
    command.args(program_args);
    if mode.own_group {
        command.process_group(0);
    }
    // SAFETY: between fork and exec, one async-signal-safe prctl call. The
    // command dies with the watchdog if the watchdog is killed.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    // std resets the signal mask of the command before exec.
    let command = match command.spawn() {
        Ok(child) => Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX)),
        Err(e) => {
            let (code, message) = child::exec_failure(program, &e);
            say!("fencelock: {message}");
            return code;
        }
    };
    Watch {
        parent,
        mode,
        name,
        command,
        group: mode.own_group.then_some(command),
        me: getpid(),
        session: getsid(None).unwrap_or(Pid::from_raw(0)),
        set: handled(),
    }
    .run()
}

/// Blocks the signals (again: harmless if `run` did), names the process,
/// becomes a subreaper and asks for SIGUSR2 when `run` dies.
fn setup() -> nix::Result<()> {
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None)?;
    // `ps` would show "exe" (from /proc/self/exe).
    let _ = nix::sys::prctl::set_name(c"fencelock-watch");
    nix::sys::prctl::set_child_subreaper(true)?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGUSR2)
}

/// The watchdog's state.
struct Watch {
    parent: Pid,
    mode: Mode,
    name: String,
    /// The command's pid. Its zombie is only reaped at the very end, so its
    /// pid (the process group id) cannot be reused while we signal it.
    command: Pid,
    group: Option<Pid>,
    me: Pid,
    session: Pid,
    set: SigSet,
}

/// A child of the watchdog, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy)]
struct Proc {
    pid: Pid,
    state: char,
    pgid: Pid,
    sid: Pid,
}

impl Watch {
    fn run(self) -> u8 {
        let mut exit: Option<u8> = None;
        let mut wait_all = self.mode.wait_children;
        let mut killing = false;
        let mut announced = false;
        let mut child_event = false;
        // While only orphans are left, a poll catches one that detached
        // (setsid) without exiting; exits wake us at once (SIGCHLD).
        let mut poll = Duration::from_millis(20);
        loop {
            if getppid() != self.parent {
                // `run` died (also caught by SIGUSR2; this is the backstop).
                killing = true;
                wait_all = true;
            }
            if exit.is_none() {
                exit = self.command_exit();
            }
            let scan = exit.is_some() || killing || std::mem::take(&mut child_event);
            let orphans = if scan { self.orphans() } else { Vec::new() };
            if killing {
                self.signal_tree(Signal::SIGKILL, exit.is_none(), &orphans);
            }
            if let Some(code) = exit {
                if !wait_all || orphans.is_empty() {
                    if announced {
                        say!(
                            "fencelock: the command's last process exited; releasing lock {:?}",
                            self.name
                        );
                    }
                    let _ = waitpid(self.command, None);
                    return code;
                }
                if self.mode.verbose && !announced && !killing {
                    let pids: Vec<String> = orphans.iter().map(|p| p.pid.to_string()).collect();
                    say!(
                        "fencelock: the command exited (status {code}) but left processes running (pid {}); holding lock {:?} until they exit (--no-wait-children releases at once)",
                        pids.join(", "),
                        self.name
                    );
                    announced = true;
                }
            }
            let timeout = if killing {
                Duration::from_millis(5)
            } else if exit.is_some() {
                poll = (poll * 2).min(Duration::from_secs(1));
                poll
            } else {
                // Only the backstop check of the parent: the command's exit
                // and `run`'s death arrive as signals.
                Duration::from_millis(500)
            };
            let Some((sig, sender)) = wait_signal(&self.set, timeout) else {
                continue;
            };
            let from_run = sender == self.parent;
            match sig {
                libc::SIGCHLD => {
                    child_event = true;
                    poll = Duration::from_millis(20);
                }
                // The parent-death signal carries no useful sender.
                libc::SIGUSR2 => {
                    killing = true;
                    wait_all = true;
                }
                libc::SIGUSR1 if from_run => {
                    wait_all = true;
                    let orphans = self.orphans();
                    self.signal_tree(Signal::SIGTERM, exit.is_none(), &orphans);
                    // A stopped process handles SIGTERM only once continued.
                    self.signal_tree(Signal::SIGCONT, exit.is_none(), &orphans);
                }
                libc::SIGINT | libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT if from_run => {
                    if let Ok(sig) = Signal::try_from(sig) {
                        self.forward(sig, exit.is_none());
                    }
                }
                _ => {}
            }
        }
    }

    /// The command's exit status as a shell reports it, once it has exited;
    /// its zombie stays (WNOWAIT).
    fn command_exit(&self) -> Option<u8> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(self.command), flags) {
            Ok(WaitStatus::Exited(_, code)) => Some(code as u8),
            Ok(WaitStatus::Signaled(_, sig, _)) => Some(128u8.wrapping_add(sig as u8)),
            Ok(_) => None,
            // Already reaped (cannot happen) or gone: report a failure.
            Err(_) => Some(SOFTWARE),
        }
    }

    /// Reaps the watchdog's exited children (except the command's zombie)
    /// and returns the live ones in the command's session, the command
    /// excepted: the orphans of the tree.
    fn orphans(&self) -> Vec<Proc> {
        let mut live = Vec::new();
        for proc in children(self.me) {
            if proc.pid == self.command {
                continue;
            }
            if matches!(proc.state, 'Z' | 'X') {
                let _ = waitpid(proc.pid, Some(WaitPidFlag::WNOHANG));
            } else if proc.sid == self.session {
                live.push(proc);
            }
        }
        live
    }

    /// `sig` to the whole tree: the command's group (or the command itself,
    /// while it runs, when it has no group of its own) and the orphans.
    fn signal_tree(&self, sig: Signal, command_running: bool, orphans: &[Proc]) {
        match self.group {
            Some(group) => {
                let _ = killpg(group, sig);
            }
            None if command_running => {
                let _ = kill(self.command, sig);
            }
            None => {}
        }
        for proc in orphans {
            let _ = kill(proc.pid, sig);
        }
    }

    /// A signal `run` forwards: to the command's group (or the command); once
    /// the command has exited, also to orphans outside that group.
    fn forward(&self, sig: Signal, command_running: bool) {
        let orphans: Vec<Proc> = if command_running {
            Vec::new()
        } else {
            self.orphans()
                .into_iter()
                .filter(|p| Some(p.pgid) != self.group)
                .collect()
        };
        self.signal_tree(sig, command_running, &orphans);
    }
}

/// Waits up to `timeout` for one of the blocked signals in `set`: the signal
/// and the pid that sent it.
fn wait_signal(set: &SigSet, timeout: Duration) -> Option<(i32, Pid)> {
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    };
    // SAFETY: siginfo_t is plain old data; sigtimedwait fills it in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let sigset: &libc::sigset_t = set.as_ref();
    // SAFETY: valid pointers to a sigset, a siginfo and a timespec.
    let sig = unsafe { libc::sigtimedwait(sigset, &mut info, &timeout) };
    if sig <= 0 {
        return None;
    }
    // SAFETY: si_pid is meaningful for the signals we wait for (sent with
    // kill, the parent-death signal, SIGCHLD); 0 otherwise.
    let sender = unsafe { info.si_pid() };
    Some((sig, Pid::from_raw(sender)))
}

/// The children of `parent`, from `/proc` (the kernel's per-task `children`
/// list is not always compiled in).
fn children(parent: Pid) -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat(&stat)
        })
        .filter(|(ppid, _)| *ppid == parent)
        .map(|(_, proc)| proc)
        .collect()
}

/// `PID (COMM) STATE PPID PGRP SESSION …`; COMM may hold spaces and `)`.
fn parse_stat(stat: &str) -> Option<(Pid, Proc)> {
    let pid: i32 = stat.split_once(' ')?.0.parse().ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let mut number = || fields.next()?.parse::<i32>().ok().map(Pid::from_raw);
    let (ppid, pgid, sid) = (number()?, number()?, number()?);
    Some((
        ppid,
        Proc {
            pid: Pid::from_raw(pid),
            state,
            pgid,
            sid,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names() {
        let (ppid, proc) = parse_stat("4242 (a) b (c)) S 17 4242 13 0 -1 4194304").expect("parses");
        assert_eq!(ppid, Pid::from_raw(17));
        assert_eq!(proc.pid, Pid::from_raw(4242));
        assert_eq!(proc.state, 'S');
        assert_eq!(proc.pgid, Pid::from_raw(4242));
        assert_eq!(proc.sid, Pid::from_raw(13));
    }

    #[test]
    fn modes_round_trip() {
        let mode = Mode {
            own_group: true,
            wait_children: false,
            verbose: true,
        };
        let back = Mode::from_arg(&mode.to_arg());
        assert!(back.own_group && !back.wait_children && back.verbose);
    }
}
