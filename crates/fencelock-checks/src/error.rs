//! The checks' error type: what stops a check from reading the sources at
//! all (as opposed to what a check finds in them, which is its result).

use std::path::PathBuf;

/// Why the sources could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `git ls-files` could not be run, or failed.
    #[error("`git ls-files` in {root}: {message}")]
    Git {
        /// The repository root it ran in.
        root: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A listed file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file, relative to the repository root.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A Rust source file did not parse.
    #[error("{path}:{line}: does not parse as Rust: {message}")]
    Parse {
        /// The file, relative to the repository root.
        path: String,
        /// The first line of code of the top-level item the parser
        /// stopped in.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A `mod x;` declaration whose file is not in the tree.
    #[error(
        "{path}:{line}: `mod {name};` has no file (looked for {looked_for}; a new file must be added to git)"
    )]
    MissingModule {
        /// The file with the declaration.
        path: String,
        /// Its line (of the first `mod name;` of the file).
        line: usize,
        /// The module's name.
        name: String,
        /// The candidate files, comma-separated.
        looked_for: String,
    },
    /// A workspace member's `Cargo.toml` is not in the tree.
    #[error("workspace member {member} has no Cargo.toml in the tree")]
    MissingManifest {
        /// The member's directory.
        member: String,
    },
}
