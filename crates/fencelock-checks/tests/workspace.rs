//! The checks on this repository (read from `CARGO_MANIFEST_DIR/../..`,
//! the files git tracks). The rules are the crate docs of
//! `fencelock-checks`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use fencelock_checks::{
    LayerRule, SourceTree, TargetGraph, check_references, drift, layer_violations, workspace_graphs,
};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files that are in an import circle today, while the circles are
/// being cut. The list may only shrink: the test fails when a circle holds
/// a file not listed here (a new circle, or a file joining one), and when
/// a listed file is in no circle any more (delete its entry; the message
/// names it). Once it is empty, the test demands no circles at all.
const KNOWN_CIRCLES: &[&str] = &[];

/// Everything above the library's foundation.
const FOUNDATION_FORBIDS: &[&str] = &[
    "crates/fencelock/src/store",
    "crates/fencelock/src/audit",
    "crates/fencelock/src/engine",
    "crates/fencelock/src/lease",
    "crates/fencelock/src/resource",
    "crates/fencelock/src/client.rs",
];

/// What the layers of the library must not import: knowledge points one
/// way, client → resource → lease → engine → audit → store → foundation. A rule whose directory
/// does not exist (yet) checks nothing and says nothing.
const LAYERS: &[LayerRule] = &[
    // The store: I/O only; it knows nothing of what is built on it.
    LayerRule {
        from: "crates/fencelock/src/store",
        forbid: &[
            "crates/fencelock/src/audit",
            "crates/fencelock/src/engine",
            "crates/fencelock/src/lease",
            "crates/fencelock/src/resource",
            "crates/fencelock/src/client.rs",
        ],
    },
    // The audit reads the store; the engine runs it.
    LayerRule {
        from: "crates/fencelock/src/audit",
        forbid: &[
            "crates/fencelock/src/engine",
            "crates/fencelock/src/lease",
            "crates/fencelock/src/resource",
            "crates/fencelock/src/client.rs",
        ],
    },
    // The engine hands out grants, never leases.
    LayerRule {
        from: "crates/fencelock/src/engine",
        forbid: &[
            "crates/fencelock/src/lease",
            "crates/fencelock/src/resource",
            "crates/fencelock/src/client.rs",
        ],
    },
    LayerRule {
        from: "crates/fencelock/src/lease",
        forbid: &[
            "crates/fencelock/src/resource",
            "crates/fencelock/src/client.rs",
        ],
    },
    LayerRule {
        from: "crates/fencelock/src/resource",
        forbid: &["crates/fencelock/src/client.rs"],
    },
    // The foundation (errors, fences, holders, keys, options, metrics)
    // needs nothing above it.
    LayerRule {
        from: "crates/fencelock/src/error",
        forbid: FOUNDATION_FORBIDS,
    },
    LayerRule {
        from: "crates/fencelock/src/fence",
        forbid: FOUNDATION_FORBIDS,
    },
    LayerRule {
        from: "crates/fencelock/src/holder",
        forbid: FOUNDATION_FORBIDS,
    },
    LayerRule {
        from: "crates/fencelock/src/keys",
        forbid: FOUNDATION_FORBIDS,
    },
    LayerRule {
        from: "crates/fencelock/src/options",
        forbid: FOUNDATION_FORBIDS,
    },
    LayerRule {
        from: "crates/fencelock/src/metrics",
        forbid: FOUNDATION_FORBIDS,
    },
];

/// One test for both import rules: the graphs are built once (most of
/// the check's time is parsing).
#[test]
fn imports_close_no_new_circles_and_keep_to_the_layers() -> anyhow::Result<()> {
    let tree = SourceTree::from_git(&repo_root())?;
    let graphs = workspace_graphs(&tree)?;
    // The library's graph is there: an empty answer below is not an empty
    // workspace.
    assert!(
        graphs
            .iter()
            .any(|g| g.package == "fencelock" && g.target == "lib" && g.files.len() > 1)
    );
    let message = [circles_beyond_the_known(&graphs), layer_breaches(&graphs)].concat();
    assert!(message.is_empty(), "{message}");
    Ok(())
}

/// What differs from `KNOWN_CIRCLES`, for a developer ("" when nothing).
fn circles_beyond_the_known(graphs: &[TargetGraph]) -> String {
    let circles: Vec<_> = graphs.iter().flat_map(|g| g.circles()).collect();
    let in_circles: BTreeSet<&str> = circles
        .iter()
        .flat_map(|c| c.files.iter().map(String::as_str))
        .collect();
    let found = drift(in_circles.iter().copied(), KNOWN_CIRCLES);
    let mut message = String::new();
    if !found.unexpected.is_empty() {
        message.push_str("files in an import circle that KNOWN_CIRCLES does not list:\n");
        for file in &found.unexpected {
            message.push_str(&format!("  {file}\n"));
        }
        message.push_str("\nthe circles they are in (cutting one edge of a circle breaks it):\n\n");
        for circle in circles
            .iter()
            .filter(|c| c.files.iter().any(|f| found.unexpected.contains(f)))
        {
            message.push_str(&format!("{circle}\n"));
        }
    }
    if !found.stale.is_empty() {
        message.push_str(
            "KNOWN_CIRCLES lists files that are in no circle any more; delete these entries:\n",
        );
        for file in &found.stale {
            message.push_str(&format!("  {file:?},\n"));
        }
    }
    let listed: BTreeSet<&str> = KNOWN_CIRCLES.iter().copied().collect();
    if listed.len() != KNOWN_CIRCLES.len() {
        message.push_str("KNOWN_CIRCLES lists a file twice\n");
    }
    message
}

/// The imports that break `LAYERS`, for a developer ("" when none).
fn layer_breaches(graphs: &[TargetGraph]) -> String {
    let violations = layer_violations(graphs, LAYERS);
    if violations.is_empty() {
        return String::new();
    }
    let mut message = String::from("imports across the layers:\n");
    for violation in &violations {
        message.push_str(&format!("  {violation}\n"));
    }
    message
}

/// The citations that do not resolve today (`path`, or `path §N` for a
/// section), while the documents they cite are being written. The list may
/// only shrink: the test fails when a citation not listed here does not
/// resolve, and when a listed one resolves (or is no longer made: delete
/// its entry; the message names it). Once it is empty, every citation must
/// resolve.
const KNOWN_UNRESOLVED: &[&str] = &[];

/// Files the reference check does not read: this one, whose
/// `KNOWN_UNRESOLVED` names the unresolved citations themselves (read, it
/// would keep every entry alive).
const NOT_READ: &[&str] = &["crates/fencelock-checks/tests/workspace.rs"];

#[test]
fn every_cited_file_and_section_exists_beyond_the_known_ones() -> anyhow::Result<()> {
    let tree = SourceTree::from_git(&repo_root())?;
    let references = check_references(&tree, NOT_READ);
    // The repository cites its own files in many places: none checked
    // would mean nothing was read.
    assert!(references.checked > 0, "no citation found");
    let found = drift(
        references.unresolved.iter().map(|u| u.cited.as_str()),
        KNOWN_UNRESOLVED,
    );
    let mut message = String::new();
    if !found.unexpected.is_empty() {
        message.push_str("citations that do not resolve (and KNOWN_UNRESOLVED does not list):\n");
        for u in references
            .unresolved
            .iter()
            .filter(|u| found.unexpected.contains(&u.cited))
        {
            message.push_str(&format!("  {u}\n"));
        }
    }
    if !found.stale.is_empty() {
        message.push_str(
            "KNOWN_UNRESOLVED lists citations that resolve now or are no longer made; delete these entries:\n",
        );
        for cited in &found.stale {
            message.push_str(&format!("  {cited:?},\n"));
        }
    }
    assert!(message.is_empty(), "{message}");
    Ok(())
}
