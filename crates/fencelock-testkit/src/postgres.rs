//! Real PostgreSQL servers for tests: [`PgServer`].
//!
//! Each server gets its own temporary directory (data directory, Unix
//! socket, log), is initialised with `initdb` (trust authentication, superuser
//! `postgres`, `fsync=off`), listens on `127.0.0.1` on a free port, and is
//! stopped when the [`PgServer`] is dropped (fast shutdown, then SIGKILL) or
//! killed by the kernel when the test process dies: `initdb` and `postgres`
//! are forked from the testkit's spawner thread like every other child (see
//! [`crate::process`]). The server's own backend processes notice the
//! postmaster's death and exit by themselves.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (as in CI
//! containers), the testkit hands the directory to the `postgres` user and
//! runs `initdb` and `postgres` as that user (set-uid in the forked child,
//! not through `runuser`, so the kernel's parent-death signal still reaches
//! the real server process). As any other user, the servers run as that user.
//!
//! ```no_run
//! use fencelock_testkit::PgServer;
//!
//! let server = PgServer::start();
//! let url = server.create_database("invoices_test");
//! assert_eq!(server.psql("invoices_test", "SELECT 1 + 1"), "2");
//! # let _ = url;
//! ```
//!
//! # Finding the binaries
//!
//! [`PG_BINDIR_ENV`] if set; else the newest `/usr/lib/postgresql/*/bin`
//! (Debian and Ubuntu); else `initdb` and `postgres` on `PATH`. If none is
//! found the testkit panics with the command that installs them.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fencelock_servers::binary::is_executable;
use fencelock_servers::child::{children_of, nix_pid, wait_stopped};
use fencelock_servers::files::{append_file, logs_tail, read_lossy};
use fencelock_servers::run::read_all;
use fencelock_servers::wait::{Launch, launch, start_on_free_port};
use fencelock_servers::{Error, free_port};
use nix::sys::signal::{self, Signal};
use nix::unistd::User;
use tempfile::TempDir;

use crate::process::{GuardedChild, try_spawn_guarded};
use crate::server_process::{Pausable, PausedGuard};

/// Environment variable naming the directory that holds `initdb`, `postgres`
/// and `psql`, overriding the search.
pub const PG_BINDIR_ENV: &str = "FENCELOCK_PG_BINDIR";

/// Environment variable naming the directory in which servers get their
/// temporary directories, overriding the choice described on
/// [`PgServer::start`].
pub const PG_TMPDIR_ENV: &str = "FENCELOCK_PG_TMPDIR";

/// `/dev/shm` is used for data directories only with at least this much
/// free space (Docker's default `/dev/shm` is 64 MiB; a fresh cluster takes
/// about 40 MiB).
const MIN_SHM_FREE: u64 = 1 << 30;

const NOT_FOUND_MESSAGE: &str = "PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or on PATH: install them with `apt-get install -y postgresql` (or set FENCELOCK_PG_BINDIR)";

/// How long `initdb` may take.
const INITDB_DEADLINE: Duration = Duration::from_secs(60);
/// How long a freshly started server has to report itself ready.
const READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long `psql` may take for one statement.
const PSQL_DEADLINE: Duration = Duration::from_secs(30);
/// How long a fast shutdown may take on drop before SIGKILL.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);
/// How many fresh ports [`PgServer::start`] tries.
const START_ATTEMPTS: u32 = 5;

const LOG_FILE: &str = "postgres.log";
const INITDB_LOG: &str = "initdb.log";
const DATA_DIR: &str = "data";

/// The unprivileged account the server runs as when the tests run as root.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A PostgreSQL server (`postgres` postmaster) on `127.0.0.1`, in its own
/// temporary directory, with a trusted superuser `postgres`. Dropping it
/// stops the server (fast shutdown, SIGKILL after 5 s) and removes the
/// directory.
#[derive(Debug)]
pub struct PgServer {
    /// The postmaster. Dropped before `dir`.
    child: GuardedChild,
    port: u16,
    bindir: PathBuf,
    dir: TempDir,
}

impl PgServer {
    /// Initialises a fresh cluster and starts it on a free loopback port;
    /// returns once the server reports itself ready and accepts TCP
    /// connections. `initdb` takes about 1.5 s; the server starts in well
    /// under a second.
    ///
    /// The directory is made in [`PG_TMPDIR_ENV`] if set, else in `/dev/shm`
    /// when it is a writable memory file system with at least 1 GiB free
    /// (initdb writes ~40 MiB in ~1,000 files: on a busy disk that took 6.5 s
    /// instead of 1.3 s), else in the system's temporary directory.
    ///
    /// # Panics
    ///
    /// Panics if the binaries are missing (the message says `apt-get install
    /// -y postgresql`), if the tests run as root and there is no `postgres`
    /// user, or if `initdb` or the server fail; the message includes their
    /// logs.
    pub fn start() -> PgServer {
        let bindir = pg_bindir();
        let run_as = run_as();
        let base = base_dir();
        let dir = tempfile::Builder::new()
            .prefix("fencelock-pg-")
            .tempdir_in(&base)
            .unwrap_or_else(|error| {
                panic!(
                    "failed to create a temporary directory for postgres in {}: {error}",
                    base.display()
                )
            });
        if let Some(user) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap_or_else(
                |error| {
                    panic!(
                        "failed to hand {} to the postgres user: {error}",
                        dir.path().display()
                    )
                },
            );
        }
        initdb(&bindir, run_as, dir.path());

        let started = start_on_free_port(START_ATTEMPTS, free_port, |port| {
            launch_postgres(&bindir, run_as, port, dir.path())
        });
        match started {
            Ok((port, child)) => PgServer {
                child: child.into(),
                port,
                bindir,
                dir,
            },
            Err(error) => panic!("{}", failure_report(&error.to_string(), dir.path())),
        }
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The server's directory (`data/`, the Unix socket, `postgres.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory the binaries were taken from.
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// The server's log (empty if there is none yet).
    pub fn log(&self) -> String {
        read_lossy(&self.dir.path().join(LOG_FILE))
    }

    /// A superuser connection URL for the `postgres` database:
    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// A superuser connection URL for database `database`.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates database `name` (lowercase letters, digits and `_`, starting
    /// with a letter or `_`) and returns its superuser URL.
    ///
    /// # Panics
    ///
    /// Panics on a malformed name or if `CREATE DATABASE` fails (for example,
    /// the database exists).
    pub fn create_database(&self, name: &str) -> String {
        assert!(
            is_plain_identifier(name),
            "database name {name:?} must match [a-z_][a-z0-9_]* (at most 63 bytes)"
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        self.url_for(name)
    }

    /// Runs `sql` with `psql` as superuser in `database` and returns its
    /// output, unaligned and without headers (`SELECT 1` gives `"1"`; rows are
    /// separated by newlines, columns by `|`), trimmed.
    ///
    /// # Panics
    ///
    /// Panics if `psql` fails or reports an error; use [`PgServer::try_psql`]
    /// to inspect errors.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        self.try_psql(database, sql)
            .unwrap_or_else(|error| panic!("psql {sql:?} in {database:?} failed: {error}"))
    }

    /// Like [`PgServer::psql`], but returns `psql`'s error output instead of
    /// panicking.
    pub fn try_psql(&self, database: &str, sql: &str) -> Result<String, String> {
        let out = tempfile::tempfile().map_err(|e| e.to_string())?;
        let err = tempfile::tempfile().map_err(|e| e.to_string())?;
        let mut command = Command::new(self.bindir.join("psql"));
        command
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-U", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-d")
            .arg(database)
            .arg("-c")
            .arg(sql)
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(err.try_clone().map_err(|e| e.to_string())?);
        let mut child = try_spawn_guarded(command).map_err(|e| format!("spawn psql: {e}"))?;
        let status = child
            .wait_timeout(PSQL_DEADLINE)
            .ok_or_else(|| format!("psql did not finish within {PSQL_DEADLINE:?}"))?;
        let stdout = read_all(out);
        if status.success() {
            Ok(stdout.trim().to_owned())
        } else {
            Err(format!("{status}: {}", read_all(err).trim()))
        }
    }

    /// Freezes the whole server with SIGSTOP — the postmaster first (so it
    /// starts no new process), then every process it forked (backends,
    /// checkpointer, ...). Connections stay open but nothing answers until
    /// [`PgServer::resume`]; new connections hang in the listen backlog.
    /// Returns once the kernel reports every process as stopped.
    ///
    /// # Panics
    ///
    /// Panics if a process is still not stopped after 5 seconds.
    pub fn pause(&self) {
        self.child.stop();
        for pid in children_of(self.pid()) {
            let _ = signal::kill(nix_pid(pid), Signal::SIGSTOP);
            if let Err(error) = wait_stopped(pid, "a postgres process") {
                panic!("{error}");
            }
        }
    }

    /// Resumes a server frozen by [`PgServer::pause`] (SIGCONT to its
    /// processes, the postmaster last).
    pub fn resume(&self) {
        for pid in children_of(self.pid()) {
            let _ = signal::kill(nix_pid(pid), Signal::SIGCONT);
        }
        self.child.cont();
    }

    /// Pauses the server until the returned guard is dropped.
    pub fn pause_guard(&self) -> PgPausedGuard<'_> {
        PausedGuard::new(self)
    }

    /// Kills the server as a crash of its machine would: the postmaster and
    /// its backends with SIGKILL (no shutdown), the postmaster reaped. A
    /// backend left alive would serve its connection until it noticed the
    /// postmaster's death, so a statement sent right after the kill could
    /// still succeed. The server's System V shared memory segment, which
    /// only a clean shutdown removes, is released. Idempotent.
    pub fn kill(&mut self) {
        self.resume();
        if self.child.is_running() {
            // Listed while the postmaster is still their parent.
            let backends = children_of(self.pid());
            let _ = self.child.kill();
            for pid in backends {
                let _ = signal::kill(nix_pid(pid), Signal::SIGKILL);
            }
            release_shared_memory(&self.dir.path().join(DATA_DIR));
        }
    }
}

/// Cleans up after a server whose test process was killed (so no
/// [`PgServer`] destructor ran), given the server's directory
/// ([`PgServer::dir`]): releases its System V shared memory segment and
/// removes the directory. Call it only once the postmaster is gone.
pub fn remove_leftovers(dir: &Path) {
    release_shared_memory(&dir.join(DATA_DIR));
    let _ = std::fs::remove_dir_all(dir);
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // A fast shutdown (SIGINT) removes shared memory and ends every
        // backend; SIGKILL (by the GuardedChild) only if it takes too long.
        // Never panics.
        self.resume();
        if self.child.is_running() {
            self.child.signal(Signal::SIGINT);
            if self.child.wait_timeout(SHUTDOWN_DEADLINE).is_none() {
                self.kill();
            }
        }
    }
}

impl Pausable for PgServer {
    fn pause(&self) {
        PgServer::pause(self);
    }

    fn resume(&self) {
        PgServer::resume(self);
    }
}

/// Keeps a [`PgServer`] paused (SIGSTOP) until dropped, then resumes it.
/// Created by [`PgServer::pause_guard`].
pub type PgPausedGuard<'a> = PausedGuard<'a, PgServer>;

/// Where servers get their temporary directories (see [`PgServer::start`]).
fn base_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(PG_TMPDIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    // The statvfs field types are u64 on 64-bit Linux, narrower elsewhere.
    #[allow(clippy::useless_conversion)]
    let roomy = nix::sys::statvfs::statvfs(shm)
        .map(|fs| {
            u64::from(fs.blocks_available()).saturating_mul(u64::from(fs.fragment_size()))
                >= MIN_SHM_FREE
        })
        .unwrap_or(false);
    if roomy && nix::unistd::access(shm, nix::unistd::AccessFlags::W_OK).is_ok() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Runs `initdb` into `dir/data`.
fn initdb(bindir: &Path, run_as: Option<RunAs>, dir: &Path) {
    let mut command = Command::new(bindir.join("initdb"));
    command
        .arg("-D")
        .arg(dir.join(DATA_DIR))
        .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
        .arg("--no-sync")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log_file(&dir.join(INITDB_LOG)))
        .stderr(log_file(&dir.join(INITDB_LOG)));
    as_user(&mut command, run_as);
    let mut child = try_spawn_guarded(command).unwrap_or_else(|error| {
        panic!(
            "failed to spawn {}: {error}; {NOT_FOUND_MESSAGE}",
            bindir.join("initdb").display()
        )
    });
    match child.wait_timeout(INITDB_DEADLINE) {
        Some(status) if status.success() => {}
        Some(status) => panic!(
            "{}",
            failure_report(&format!("initdb failed ({status})"), dir)
        ),
        None => panic!(
            "{}",
            failure_report(
                &format!("initdb did not finish within {INITDB_DEADLINE:?}"),
                dir
            )
        ),
    }
}

/// Starts the postmaster on `port` and waits until it is ready.
fn launch_postgres(
    bindir: &Path,
    run_as: Option<RunAs>,
    port: u16,
    dir: &Path,
) -> Result<fencelock_servers::GuardedChild, Error> {
    let data = dir.join(DATA_DIR);
    let mut command = Command::new(bindir.join("postgres"));
    command
        .arg("-D")
        .arg(&data)
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(dir)
        .args(["-c", "listen_addresses=127.0.0.1"])
        // Test data is disposable: never wait for the disk.
        .args(["-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off"])
        // Dynamic shared memory as files in the data directory, so a killed
        // server leaves nothing behind in /dev/shm.
        .args(["-c", "dynamic_shared_memory_type=mmap"])
        .args(["-c", "max_connections=200"])
        .args(["-c", "shared_buffers=32MB"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(append_file(&dir.join(LOG_FILE))?)
        .stderr(append_file(&dir.join(LOG_FILE))?);
    as_user(&mut command, run_as);
    let server = format!("postgres on port {port}");
    let log = dir.join(LOG_FILE);
    let what = Launch {
        server: &server,
        port,
        deadline: READY_DEADLINE,
        logs: &[&log],
    };
    launch(command, what, |_| {
        if is_ready(&data, port) {
            Ok(())
        } else {
            Err("not ready".to_owned())
        }
    })
}

/// Ready when `postmaster.pid` (which only our server writes, in our data
/// directory) names our port and says `ready`, and the port accepts a TCP
/// connection.
fn is_ready(data: &Path, port: u16) -> bool {
    let pidfile = read_lossy(&data.join("postmaster.pid"));
    let lines: Vec<&str> = pidfile.lines().collect();
    let ours = lines.get(3).map(|l| l.trim()) == Some(port.to_string().as_str());
    let ready = lines.get(7).map(|l| l.trim()) == Some("ready");
    ours && ready
        && TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_millis(500),
        )
        .is_ok()
}

fn as_user(command: &mut Command, run_as: Option<RunAs>) {
    if let Some(user) = run_as {
        // Set in the forked child before exec (and before the spawner's
        // PR_SET_PDEATHSIG hook, which a uid change would otherwise clear).
        command.uid(user.uid).gid(user.gid);
        command.env("HOME", "/tmp").env("USER", "postgres");
    }
}

/// `Some(postgres user)` when running as root, else `None` (run as self).
fn run_as() -> Option<RunAs> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    match User::from_name("postgres") {
        Ok(Some(user)) => Some(RunAs {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }),
        _ => panic!(
            "the tests run as root, and PostgreSQL refuses to run as root, but there is no `postgres` user: install PostgreSQL with `apt-get install -y postgresql` (it creates the user) or run the tests as another user"
        ),
    }
}

/// The directory holding `initdb`, `postgres` and `psql`.
fn pg_bindir() -> PathBuf {
    resolve_bindir(
        std::env::var_os(PG_BINDIR_ENV),
        Path::new("/usr/lib/postgresql"),
        std::env::var_os("PATH"),
    )
}

fn resolve_bindir(
    overridden: Option<std::ffi::OsString>,
    debian_root: &Path,
    path: Option<std::ffi::OsString>,
) -> PathBuf {
    if let Some(dir) = overridden.filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        assert!(
            has_server_binaries(&dir),
            "{PG_BINDIR_ENV}={} does not contain executable initdb and postgres",
            dir.display()
        );
        return dir;
    }
    debian_bindir(debian_root)
        .or_else(|| path_bindir(path))
        .unwrap_or_else(|| panic!("{NOT_FOUND_MESSAGE}"))
}

/// The newest `<debian_root>/<major>/bin` with the server binaries.
fn debian_bindir(debian_root: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(debian_root).ok()?;
    entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let major: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_server_binaries(&bin).then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major)
        .map(|(_, bin)| bin)
}

/// The directory of `initdb` on `path`, if `postgres` is next to it.
fn path_bindir(path: Option<std::ffi::OsString>) -> Option<PathBuf> {
    let path = path?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("initdb"))
        .filter(|initdb| is_executable(initdb))
        // Resolve symlinks (e.g. /usr/local/bin/initdb -> .../15/bin/initdb)
        // so that postgres and psql are found next to the real binary.
        .filter_map(|initdb| std::fs::canonicalize(initdb).ok())
        .filter_map(|initdb| initdb.parent().map(Path::to_path_buf))
        .find(|dir| has_server_binaries(dir))
}

fn has_server_binaries(dir: &Path) -> bool {
    is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres"))
}

fn is_plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Marks the System V shared memory segment named in `postmaster.pid`
/// (line 7: key and id) for removal with `ipcrm`; the kernel frees it once
/// the last backend has detached. A server that shut down cleanly has
/// removed it already (then `ipcrm` fails harmlessly). Best effort.
fn release_shared_memory(data: &Path) {
    let pidfile = read_lossy(&data.join("postmaster.pid"));
    let Some(id) = pidfile
        .lines()
        .nth(6)
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|id| id.parse::<u32>().ok())
    else {
        return;
    };
    let mut command = Command::new("ipcrm");
    command
        .arg("-m")
        .arg(id.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Ok(mut child) = try_spawn_guarded(command) {
        let _ = child.wait_timeout(Duration::from_secs(5));
    }
}

/// Opens `path` for appending (a child's stdout or stderr).
///
/// # Panics
///
/// Panics if it cannot be opened.
fn log_file(path: &Path) -> std::fs::File {
    append_file(path).unwrap_or_else(|error| panic!("{error}"))
}

/// `headline`, followed by the logs of initdb and the server.
fn failure_report(headline: &str, dir: &Path) -> String {
    let logs = [dir.join(INITDB_LOG), dir.join(LOG_FILE)];
    let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    format!("{}\n{}", headline.trim_end(), logs_tail(&logs))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn plain_identifiers() {
        assert!(is_plain_identifier("invoices_test_1"));
        assert!(is_plain_identifier("_x"));
        assert!(!is_plain_identifier("1x"));
        assert!(!is_plain_identifier("Invoices"));
        assert!(!is_plain_identifier("a; DROP DATABASE postgres"));
        assert!(!is_plain_identifier(""));
    }

    #[test]
    #[should_panic(expected = "install them with `apt-get install -y postgresql`")]
    fn missing_binaries_panic_with_install_hint() {
        let empty = tempfile::tempdir().expect("tempdir");
        resolve_bindir(
            None,
            empty.path(),
            Some(empty.path().as_os_str().to_owned()),
        );
    }

    #[test]
    fn newest_debian_version_wins() {
        let root = tempfile::tempdir().expect("tempdir");
        for major in ["9", "15", "13", "notaversion"] {
            let bin = root.path().join(major).join("bin");
            std::fs::create_dir_all(&bin).expect("mkdir");
            for exe in ["initdb", "postgres"] {
                std::fs::write(bin.join(exe), "#!/bin/sh\n").expect("write");
                std::fs::set_permissions(bin.join(exe), std::fs::Permissions::from_mode(0o755))
                    .expect("chmod");
            }
        }
        assert_eq!(
            resolve_bindir(None, root.path(), None),
            root.path().join("15").join("bin")
        );
    }
}
