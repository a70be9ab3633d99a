//! # fencelock-checks
//!
//! Checks of the workspace's own sources, run as ordinary tests
//! (`cargo nextest run -p fencelock-checks`): the workspace test
//! (`tests/workspace.rs`) runs them on the repository, the unit tests on
//! small synthetic trees. Dev tooling: no other crate depends on this one.
//! The `check-imports` binary shows the import graph's circles for humans
//! (`cargo run -p fencelock-checks --bin check-imports [-- --crate NAME]`,
//! `-- --file PATH` for every edge of one file).
//!
//! Both checks read the files git tracks ([`SourceTree::from_git`]): a new
//! file counts once it is added.
//!
//! ## 1. No import circles between the files of a crate
//!
//! Every crate root of every workspace member has its own graph: the
//! library (`src/lib.rs`), each binary (`src/main.rs`, `src/bin/*`), each
//! integration test (`tests/*.rs`, `tests/*/main.rs`), bench and example,
//! and those `Cargo.toml` names with `path`. Its nodes are the source files
//! of that crate, found from the root by following `mod x;` declarations
//! (to the file named after the module, or `mod.rs` in the directory named
//! after it, or the file a `#[path = "..."]` names); an inline
//! `mod x { ... }` belongs to its file.
//!
//! An edge A → B exists when file A has a `use` or a path that names an
//! item of file B, resolved through re-exports to the file that defines it:
//!
//! - paths in code, types, patterns, expressions and attributes' paths,
//!   and in macro invocations' tokens (`tracing::debug!(.. crate::holder::
//!   holder_id(x) ..)`, `tokio::select! { .. }`, `macro_rules!` bodies with
//!   `$crate::`). Inside a macro's tokens only paths of two segments or
//!   more count: a lone name there cannot be told from a field name, a
//!   binding or a format argument (a name a `use` brought in is counted at
//!   its `use`);
//! - a path starts with `crate::`, `super::`, `self::`, a child module's
//!   name, or a name in scope: an item of the module, a name a `use` of the
//!   module brought in (`use super::scripts::{self, Lua};` then
//!   `scripts::GRANT`), one of a glob import (`use x::*`), or one a `use`
//!   inside the same function or block brought in. The first name that is
//!   none of these is another crate's (`std::`, `redis::`, and every
//!   `::name::`): ignored;
//! - a path is followed segment by segment through modules and the `use`
//!   declarations there (`pub`, `pub(crate)`, ... or private: a child sees
//!   its parent's), so `crate::store::redis::X`, where `store/redis/mod.rs`
//!   has `pub(crate) use conn::X`, is an edge to `store/redis/conn.rs`. It
//!   ends at the first item (what follows is a variant or an associated
//!   item), or
//!   at a module: a path naming a module itself is an edge to that module's
//!   file. A name a module does not show (made by a macro, say) ends the
//!   path at that module;
//! - a `use` line is an edge to the file of every name it imports (a glob,
//!   to the file of its module);
//! - a lone name outside macros counts when it is an item brought in by a
//!   `use` or a glob import; a lone name that is a module is a local
//!   variable of that name (a module is only ever a prefix): no edge.
//!
//! What makes no edge:
//!
//! - `mod` declarations themselves, and `pub(in path)` visibilities;
//! - test-only code: items under `#[cfg(test)]` (also `all(test, ..)`),
//!   among them `mod tests;` children and everything in them, and files
//!   whose inner `#![cfg(test)]` makes them test-only: not in the graph at
//!   all;
//! - a façade's re-export of its own descendants: `pub use child::X` (any
//!   visibility) in a file whose module has a descendant that defines `X`
//!   makes no edge from the façade to the child's file (an inline module
//!   of the file re-exporting it counts as the file). A re-export of a non-descendant
//!   (`pub use crate::other::Y` in a `mod.rs`) is an ordinary edge. Paths
//!   through either resolve onward to the defining file;
//! - a path to the file itself.
//!
//! Not modelled: name spaces (a type and a function of one name are one
//! name), macro-expanded items, enum variants brought in by `use Enum::*`
//! (the `use` line counts, a variant used later does not), and `use`
//! paths that only the code inside a block can see (all the module's
//! block-level `use` declarations are in scope for all its code).
//!
//! [`TargetGraph::circles`] reports every strongly connected component of
//! more than one file (Tarjan's algorithm) with its files and, for each
//! edge inside it, the first line and the path that make it: what to cut.
//! [`layer_violations`] checks [`LayerRule`]s: files under one directory
//! that must not import files under others.
//!
//! ### Line numbers
//!
//! The parser's tokens carry no positions (proc-macro2's `span-locations`
//! feature would give them, but it would switch proc-macro2, syn and every
//! derive macro to another build whenever this crate is built with the
//! rest of the workspace). The lines come from a scan of each file's text
//! instead: a small lexer of its own skips comments, strings, char
//! literals and lifetimes and ignores spaces and line breaks, so `crate ::
//! a` followed by `:: x` on the next line is the path `crate::a::x`. A
//! line is **the first line where that path is written** in the file, not
//! necessarily the line of the occurrence that made the edge:
//!
//! - a path of code or of a macro's tokens: the first place the whole
//!   path is written (generic arguments between its segments allowed:
//!   `a::<T>::b`), outside `use` declarations, and not as the end of a
//!   longer path (after `::`), the start of one (before `::name`), a field
//!   or method (after `.`) or a macro variable (after `$`); a lone name
//!   also not as the name of a definition (after `fn`, `struct`, `enum`,
//!   `union`, `trait`, `type`, `mod`, `static`, `const`, `macro_rules!`)
//!   nor of a field (before a single `:`). That place may be in test-only
//!   code, or in another inline module of the file where the same words
//!   name something else. Failing that: inside a `use` (one in a macro's
//!   tokens), then where most of its leading segments are written
//!   (`<T as a::Trait>::f`), then the first occurrence of its first name;
//! - a name a `use` imports: the line of that name (or of its `*`) in the
//!   first `use` of the file that imports it, groups followed across lines
//!   (`use super::{` then `a,` then `b::C,` has `super::b::C` on the line
//!   of `b::C`);
//! - a `mod x;` with no file: the first `mod x;` of the file;
//! - a file that does not parse: the first line of code of the top-level
//!   item the parser stops in (the compiler shows the exact place).
//!
//! An edge's line is the smallest of the lines of the paths that make it.
//!
//! ## 2. Every cited file exists
//!
//! [`check_references`] checks that every file a text of the repository
//! cites exists, and every section it cites is a heading of that document.
//!
//! **What is read.** The files of the tree that [`is_text_kind`] names
//! (`.rs`, `.lua`, `.toml`, `.md`, `.sh`, and everything under `scripts/`
//! and `.ci/`), whole: comments, docs, strings and code alike.
//!
//! **What a citation is.** A run of the characters of paths (letters,
//! digits, `_`, `-`, `.`, `/`) that ends in `.md`, `.rs`, `.lua`, `.toml`
//! or `.sh` after its last name, once a sentence's final `.` is dropped;
//! the last name has something before its extension. Skipped:
//!
//! - URLs (`scheme://...` up to the next space, quote, bracket or
//!   backtick);
//! - runs with `*`, `{`, `}`, `<`, `>`, `$`, `~`, `@` or `%`: globs
//!   (`scripts/*.lua`), placeholders (`<name>.rs`), names a program builds
//!   (`{stem}.rs`, `$DIR/x.sh`), home and other non-repository paths;
//! - absolute paths (`/etc/...`): files of the machine, not of the
//!   repository;
//! - in Rust files, a string literal that is nothing but a path (`"x.sh"`,
//!   `include_str!("scripts/grant.lua")`, `#[path = "..."]`): a path the
//!   program builds, joins or includes (the compiler checks the last two);
//! - a `.sh` citation without a directory, or in `./` (`-- ./report.sh`):
//!   a script of the reader's, as in the command lines of examples.
//!
//! **Resolution.** A citation starting with `./` or `../` is relative to
//! the citing file's directory and must name a file exactly. Any other
//! resolves when some file's path equals it or ends with it after a `/`
//! (so `redis/scripts/grant.lua` resolves to
//! `crates/fencelock/src/store/redis/scripts/grant.lua`).
//!
//! **Sections.** A Markdown citation followed by `§` and a number
//! (`§2`, `§2.4`; a sentence's final `.` is not part of it), and any
//! further `§` numbers joined to it by `,`, `and`, `or`, `&` or `/`, cite
//! sections of that document; the number may start the next line when the
//! citation ends one (after the next line's comment marks: `///`, `//!`,
//! `//`, `--`, `#`, `*`, `>`). A section exists when the document (one of
//! the files the citation resolves to) has an ATX heading (`#` to `######`,
//! outside fenced code blocks) whose text starts with the number, maybe
//! after a `§`, followed by the end, a space, or a `.` and a space:
//! `## 2. Locks` is §2, `### 2.4 Fenced writes` and `## 2.4. Fenced
//! writes` are §2.4 (a heading `## 2.4` is not §2). A `§` with no document
//! before it cites nothing checkable and is not read.

mod allowlist;
mod error;
mod graph;
mod imports;
mod lines;
mod manifest;
mod modtree;
mod refs;
mod resolve;
mod tree;

pub use allowlist::{Drift, drift};
pub use error::Error;
pub use imports::{
    Circle, Edge, LayerRule, LayerViolation, TargetGraph, layer_violations, workspace_graphs,
};
pub use manifest::{Package, Target, package, workspace_packages};
pub use refs::{Problem, References, Unresolved, check_references};
pub use tree::{SourceTree, is_text_kind};
