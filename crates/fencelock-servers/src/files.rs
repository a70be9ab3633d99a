//! A server's files: its temporary directory ([`temp_dir`]), the config
//! files written into it ([`write_lines`]), the files its stdout and stderr
//! go to ([`append_file`]), and reading its log back ([`read_lossy`],
//! [`log_tail`]).

use std::fs::{File, OpenOptions};
use std::path::Path;

use tempfile::TempDir;

use crate::error::{Error, Result};

/// How many lines of a log [`log_tail`] keeps for an error.
pub const TAIL_LINES: usize = 40;

/// A fresh temporary directory named `prefix…`, in `parent` when given and
/// writable, else in the system's temporary directory. Removed when the
/// [`TempDir`] is dropped.
///
/// # Errors
///
/// [`Error::File`] if no directory can be made.
pub fn temp_dir(prefix: &str, parent: Option<&Path>) -> Result<TempDir> {
    let builder = tempfile::Builder::new().prefix(prefix).clone();
    if let Some(parent) = parent
        && let Ok(dir) = builder.tempdir_in(parent)
    {
        return Ok(dir);
    }
    builder.tempdir().map_err(|source| Error::File {
        path: std::env::temp_dir().join(format!("{prefix}*")),
        source,
    })
}

/// Writes `lines` to `path`, one a line.
///
/// # Errors
///
/// [`Error::File`] if the file cannot be written.
pub fn write_lines(path: &Path, lines: &[String]) -> Result<()> {
    let mut text = lines.join("\n");
    text.push('\n');
    write(path, text.as_bytes())
}

/// Writes `contents` to `path`, creating the directories above it.
///
/// # Errors
///
/// [`Error::File`] if a directory or the file cannot be written.
pub fn write(path: &Path, contents: &[u8]) -> Result<()> {
    let error = |source| Error::File {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(error)?;
    }
    std::fs::write(path, contents).map_err(error)
}

/// Opens `path` for appending, creating it (for a child's stdout/stderr).
///
/// # Errors
///
/// [`Error::File`] if it cannot be opened.
pub fn append_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| Error::File {
            path: path.to_owned(),
            source,
        })
}

/// The contents of `path` (invalid UTF-8 replaced), or `""` if unreadable.
pub fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> &str {
    let trimmed = text.trim_end();
    let mut start = trimmed.len();
    for _ in 0..lines {
        match trimmed[..start].rfind('\n') {
            Some(newline) => start = newline,
            None => return trimmed,
        }
    }
    trimmed[start..].trim_start_matches('\n')
}

/// The last [`TAIL_LINES`] lines of the file at `path` (empty if
/// unreadable).
pub fn log_tail(path: &Path) -> String {
    tail(&read_lossy(path), TAIL_LINES).to_owned()
}

/// The tails ([`log_tail`]) of the files at `paths` that are not empty,
/// each under a `--- NAME ---` line.
pub fn logs_tail(paths: &[&Path]) -> String {
    let mut text = String::new();
    for path in paths {
        let tail = log_tail(path);
        if tail.trim().is_empty() {
            continue;
        }
        if !text.is_empty() {
            text.push('\n');
        }
        let name = path
            .file_name()
            .unwrap_or(path.as_os_str())
            .to_string_lossy();
        text.push_str(&format!("--- {name} ---\n{tail}"));
    }
    text
}

/// The last non-empty line of the file at `path` (empty if unreadable).
pub fn last_line(path: &Path) -> String {
    read_lossy(path)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a\nb\nc", 5), "a\nb\nc");
        assert_eq!(tail("", 3), "");
        assert_eq!(tail("only\n\n", 1), "only");
    }
}
