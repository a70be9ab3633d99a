//! The reference check on small synthetic trees.
//!
//! The fixtures and the expected findings write `%` for the `.` before
//! the extension of each file name they cite, and [`tree`] and [`dotted`]
//! put it back: this source file itself then cites no file (the workspace
//! check reads it too).

use super::*;

fn tree(files: &[(&str, &str)]) -> SourceTree {
    SourceTree::from_memory(
        files
            .iter()
            .map(|(path, text)| (path.replace('%', "."), text.replace('%', "."))),
    )
}

/// `list` with `%` back to `.`.
fn dotted(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.replace('%', ".")).collect()
}

/// The unresolved citations of `files`, as `file:line: cites ...`.
fn unresolved(files: &[(&str, &str)]) -> Vec<String> {
    check_references(&tree(files), &[])
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_missing_cited_file_is_reported() {
    let found = unresolved(&[
        (
            "README%md",
            "# Demo\n\nThe scripts are in `scripts/setup%sh` and\nthe notes in `docs/notes%md`.\n",
        ),
        ("scripts/setup%sh", "#!/bin/sh\n"),
    ]);
    assert_eq!(
        found,
        dotted(&["README%md:4: cites docs/notes%md: no such file"])
    );
}

#[test]
fn a_cited_suffix_path_resolves_and_a_relative_one_must_match_exactly() {
    let files = [
        (
            "crates/a/src/backend/scripts/grant%lua",
            "-- After common%lua.\n",
        ),
        ("crates/a/src/backend/scripts/common%lua", "\n"),
        (
            "crates/a/src/lib%rs",
            "//! The scripts (backend/scripts/grant%lua) and ../../../README%md.\n//! Not ./backend/grant%lua.\n",
        ),
        ("README%md", "See crates/a/src/lib%rs and lib%rs.\n"),
    ];
    let references = check_references(&tree(&files), &[]);
    let shown: Vec<String> = references
        .unresolved
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        dotted(&["crates/a/src/lib%rs:2: cites crates/a/src/backend/grant%lua: no such file"])
    );
    assert_eq!(references.checked, 6);
}

#[test]
fn urls_and_what_is_clearly_no_path_are_ignored() {
    let files = [(
        "crates/a/src/lib%rs",
        concat!(
            "//! Docs at https://example%com/docs/gone%md and <http://localhost:9464/x%md>.\n",
            "//! Every scripts/*%lua, backend/{coalesce,conn}%rs, <name>%rs, $DIR/run%sh,\n",
            "//! ~/notes%md, /etc/redis/redis%toml, the `%rs` files, foo%rs-style names.\n",
            "//! fencelock run nightly -- ./report%sh (and cleanup%sh).\n",
            "fn main() {\n",
            "    let _ = dir.join(\"script%sh\");\n",
            "    let _ = include_str!(\"scripts/gone%lua\");\n",
            "    let _ = \"a message citing gone%md\";\n",
            "}\n",
        ),
    )];
    assert_eq!(
        unresolved(&files),
        dotted(&["crates/a/src/lib%rs:8: cites gone%md: no such file"])
    );
}

#[test]
fn a_section_reference_to_a_missing_heading_is_reported() {
    let files = [
        (
            "docs/design%md",
            concat!(
                "# Design\n\n## 1. Scope\n\n## 2. Locks\n\n### 2.1 Grant\n\n### 2.4. Fenced writes\n\n",
                "```text\n## 3. Not a heading: in a code block\n```\n\n## 6 Benchmarks\n",
            ),
        ),
        (
            "crates/a/src/lib%rs",
            concat!(
                "//! Grants (docs/design%md §2.1, §2.4 and §2.2) and design%md §2.\n",
                "//! The scenarios of docs/design%md §6. Not promised: docs/design%md\n",
                "//! §9; docs/design%md §3 is in a code block.\n",
            ),
        ),
        (
            "crates/a/src/x%lua",
            "-- Compare-and-delete (docs/design%md §2.4).\n",
        ),
    ];
    assert_eq!(
        unresolved(&files),
        dotted(&[
            "crates/a/src/lib%rs:1: cites docs/design%md §2.2: the document has no heading of that section",
            "crates/a/src/lib%rs:2: cites docs/design%md §9: the document has no heading of that section",
            "crates/a/src/lib%rs:3: cites docs/design%md §3: the document has no heading of that section",
        ])
    );
}

#[test]
fn a_section_of_a_missing_document_is_reported_as_a_missing_file() {
    let found = check_references(
        &tree(&[("README%md", "As docs/design%md §2.4 says.\n")]),
        &[],
    );
    let cited: Vec<(String, Problem)> = found
        .unresolved
        .iter()
        .map(|u| (u.cited.replace('.', "%"), u.problem))
        .collect();
    assert_eq!(
        cited,
        vec![
            ("docs/design%md".to_string(), Problem::NoSuchFile),
            ("docs/design%md §2%4".to_string(), Problem::NoSuchFile),
        ]
    );
}

#[test]
fn a_heading_is_its_section_exactly() {
    let doc = "## 2.4 Fenced writes\n## §7 Guide\n#### 10. Ten\n##3 no space\n";
    assert!(has_section(doc, "2.4"));
    assert!(has_section(doc, "7"));
    assert!(has_section(doc, "10"));
    assert!(!has_section(doc, "2"));
    assert!(!has_section(doc, "1"));
    assert!(!has_section(doc, "3"));
}

#[test]
fn skipped_files_are_not_read() {
    let files = [("a%md", "see gone%md\n"), ("b%md", "see gone%md\n")];
    let found = check_references(&tree(&files), &["a.md"]);
    let shown: Vec<String> = found.unresolved.iter().map(ToString::to_string).collect();
    assert_eq!(shown, dotted(&["b%md:1: cites gone%md: no such file"]));
}
