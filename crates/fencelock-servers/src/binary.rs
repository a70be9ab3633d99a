//! Finding a server's binary: [`Binary`] names a program, the environment
//! variable that overrides it and the Debian package that provides it
//! ([`REDIS_SERVER`], [`ETCD`], …); [`Binary::locate`] finds it.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A program this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binary {
    /// Its name on `PATH`.
    pub name: &'static str,
    /// The environment variable that names another binary (a path, or a
    /// name looked up on `PATH`).
    pub env: &'static str,
    /// The Debian package that provides it.
    pub package: &'static str,
}

/// `redis-server` (also run as a sentinel: `redis-server sentinel.conf
/// --sentinel`).
pub const REDIS_SERVER: Binary = Binary {
    name: "redis-server",
    env: "FENCELOCK_REDIS_SERVER_BIN",
    package: "redis-server",
};

/// `redis-cli`.
pub const REDIS_CLI: Binary = Binary {
    name: "redis-cli",
    env: "FENCELOCK_REDIS_CLI_BIN",
    package: "redis-tools",
};

/// `etcd`.
pub const ETCD: Binary = Binary {
    name: "etcd",
    env: "FENCELOCK_ETCD_BIN",
    package: "etcd-server",
};

/// `etcdctl`.
pub const ETCDCTL: Binary = Binary {
    name: "etcdctl",
    env: "FENCELOCK_ETCDCTL_BIN",
    package: "etcd-client",
};

impl Binary {
    /// The binary to run: the one [`Binary::env`] names if set (a path
    /// must be an executable file, a bare name is looked up on `PATH`),
    /// else [`Binary::name`] on `PATH`.
    ///
    /// # Errors
    ///
    /// [`Error::NotExecutable`] for an override that names nothing
    /// executable, [`Error::MissingBinary`] (naming the package) when it
    /// is not on `PATH`.
    pub fn locate(&self) -> Result<PathBuf> {
        self.resolve(std::env::var_os(self.env), std::env::var_os("PATH"))
    }

    /// [`Binary::locate`] with the override and `PATH` given.
    ///
    /// # Errors
    ///
    /// As [`Binary::locate`].
    pub fn resolve(&self, overridden: Option<OsString>, path: Option<OsString>) -> Result<PathBuf> {
        match overridden.filter(|bin| !bin.is_empty()) {
            Some(bin) => {
                let bin = PathBuf::from(bin);
                let found = if bin.components().count() > 1 {
                    is_executable(&bin).then(|| bin.clone())
                } else {
                    find_on_path(&bin, path.as_deref())
                };
                found.ok_or(Error::NotExecutable {
                    env: self.env,
                    path: bin,
                })
            }
            None => {
                find_on_path(Path::new(self.name), path.as_deref()).ok_or(Error::MissingBinary {
                    binary: self.name,
                    package: self.package,
                    env: self.env,
                })
            }
        }
    }

    /// [`Binary::locate`], preferring a binary named [`Binary::name`] in
    /// the directory of `beside` (e.g. `redis-cli` next to the
    /// `redis-server` in use) when no override is set.
    ///
    /// # Errors
    ///
    /// As [`Binary::locate`].
    pub fn locate_beside(&self, beside: &Path) -> Result<PathBuf> {
        if std::env::var_os(self.env).is_none_or(|bin| bin.is_empty()) {
            let candidate = beside.with_file_name(self.name);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
        self.locate()
    }
}

/// The first executable `name` in the directories of `path` (a `PATH`-style
/// list).
pub fn find_on_path(name: &Path, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_missing_from_path_names_its_package() {
        let empty = tempfile::tempdir().expect("tempdir");
        let error = REDIS_SERVER
            .resolve(None, Some(empty.path().as_os_str().to_owned()))
            .expect_err("nothing on PATH");
        assert_eq!(
            error.to_string(),
            "redis-server not found on PATH: install it with `apt-get install -y redis-server` (or set FENCELOCK_REDIS_SERVER_BIN)"
        );
    }

    #[test]
    fn an_override_must_be_executable() {
        let error = REDIS_SERVER
            .resolve(Some("/nonexistent/redis-server".into()), None)
            .expect_err("no such file");
        assert_eq!(
            error.to_string(),
            "FENCELOCK_REDIS_SERVER_BIN=/nonexistent/redis-server is not an executable file"
        );
        assert_eq!(
            REDIS_SERVER
                .resolve(Some("/bin/sh".into()), None)
                .expect("an executable"),
            PathBuf::from("/bin/sh")
        );
    }
}
