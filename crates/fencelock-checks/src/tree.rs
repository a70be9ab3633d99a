//! [`SourceTree`]: the repository's files as the checks see them, read from
//! git or given in memory (the unit tests' synthetic trees).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Error;

/// The files of a repository: every path, relative to the root with `/`
/// separators, and the text of those the checks read.
#[derive(Debug, Clone, Default)]
pub struct SourceTree {
    files: BTreeMap<String, Option<String>>,
}

/// Whether the checks read the text of the file at `path`: Rust, Lua,
/// TOML, Markdown and shell files, and everything under `scripts/` and
/// `.ci/`.
pub fn is_text_kind(path: &str) -> bool {
    const KINDS: [&str; 5] = [".rs", ".lua", ".toml", ".md", ".sh"];
    KINDS.iter().any(|ext| path.ends_with(ext))
        || path.starts_with("scripts/")
        || path.starts_with(".ci/")
}

impl SourceTree {
    /// The files git tracks under `root` (`git ls-files`), without
    /// `target/`; a tracked file deleted from the work tree is left out.
    /// The texts of the kinds [`is_text_kind`] names are read; a file that
    /// is not UTF-8 is listed without text.
    pub fn from_git(root: &Path) -> Result<Self, Error> {
        let git_error = |message: String| Error::Git {
            root: root.to_path_buf(),
            message,
        };
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["ls-files", "-z"])
            .output()
            .map_err(|e| git_error(e.to_string()))?;
        if !out.status.success() {
            return Err(git_error(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        let listing = String::from_utf8(out.stdout)
            .map_err(|_| git_error("a tracked path is not UTF-8".to_string()))?;
        let mut files = BTreeMap::new();
        for path in listing.split('\0').filter(|p| !p.is_empty()) {
            if path.starts_with("target/") {
                continue;
            }
            let on_disk: PathBuf = root.join(path);
            if !on_disk.is_file() {
                continue;
            }
            let text = if is_text_kind(path) {
                match std::fs::read(&on_disk) {
                    Ok(bytes) => String::from_utf8(bytes).ok(),
                    Err(source) => {
                        return Err(Error::Read {
                            path: path.to_string(),
                            source,
                        });
                    }
                }
            } else {
                None
            };
            files.insert(path.to_string(), text);
        }
        Ok(SourceTree { files })
    }

    /// A tree of the given files (path relative to the root, text), for
    /// tests on synthetic trees.
    pub fn from_memory<P, T>(files: impl IntoIterator<Item = (P, T)>) -> Self
    where
        P: Into<String>,
        T: Into<String>,
    {
        SourceTree {
            files: files
                .into_iter()
                .map(|(p, t)| (p.into(), Some(t.into())))
                .collect(),
        }
    }

    /// Whether the tree has a file at `path`.
    pub fn contains(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    /// The text of the file at `path`, if it is in the tree and was read.
    pub fn text(&self, path: &str) -> Option<&str> {
        self.files.get(path).and_then(|t| t.as_deref())
    }

    /// Every path, in order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// The paths directly in directory `dir` (no trailing `/`; `""` is the
    /// root), in order.
    pub fn files_in(&self, dir: &str) -> impl Iterator<Item = &str> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.paths().filter(move |p| {
            p.strip_prefix(prefix.as_str())
                .is_some_and(|rest| !rest.contains('/'))
        })
    }

    /// The directories directly in `dir` that hold at least one file, in
    /// order.
    pub fn dirs_in(&self, dir: &str) -> Vec<String> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut dirs: Vec<String> = self
            .paths()
            .filter_map(|p| p.strip_prefix(prefix.as_str()))
            .filter_map(|rest| rest.split_once('/').map(|(d, _)| format!("{prefix}{d}")))
            .collect();
        dirs.dedup();
        dirs
    }
}

/// The directory of `path` (`""` for a file at the root).
pub(crate) fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// `dir` and `rest` joined with `/`, `.` and `..` components resolved;
/// `None` when `..` climbs above the root.
pub(crate) fn join(dir: &str, rest: &str) -> Option<String> {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// Whether `path` is `dir` itself, a file under `dir/`, or `dir` with
/// `.rs` added (the module file of the same module in the non-`mod.rs`
/// layout).
pub(crate) fn is_under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/') || rest == ".rs")
}
