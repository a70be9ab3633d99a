//! `check-imports [--crate NAME] [--file PATH]`: the import circles of the
//! workspace's crates (or of one package), each with its files and, for
//! every edge inside it, the first line and path that make it; with
//! `--file`, every edge from and to that file instead. The rules are the
//! `fencelock-checks` crate's docs.

// A command-line tool prints its results on stdout.
#![allow(clippy::print_stdout)]

use std::path::Path;

use anyhow::{Context, bail};
use fencelock_checks::{SourceTree, workspace_graphs};

const USAGE: &str = "usage: check-imports [--crate NAME] [--file PATH]";

fn main() -> anyhow::Result<()> {
    let mut package: Option<String> = None;
    let mut file: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--crate" | "-p" => {
                package = Some(args.next().context("--crate needs a package name")?)
            }
            "--file" => file = Some(args.next().context("--file needs a path")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?} ({USAGE})"),
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tree = SourceTree::from_git(&root)?;
    let graphs: Vec<_> = workspace_graphs(&tree)?
        .into_iter()
        .filter(|g| package.as_ref().is_none_or(|p| *p == g.package))
        .collect();
    if graphs.is_empty() {
        bail!("no workspace package is named {package:?}");
    }
    if let Some(file) = file {
        for graph in graphs.iter().filter(|g| g.files.contains(&file)) {
            println!("{} ({}):", graph.package, graph.target);
            for edge in graph
                .edges
                .iter()
                .filter(|e| e.from == file || e.to == file)
            {
                println!("  {edge}");
            }
        }
        return Ok(());
    }
    let mut circles = 0;
    let mut files = 0;
    for graph in &graphs {
        for circle in graph.circles() {
            circles += 1;
            files += circle.files.len();
            println!("{circle}");
        }
    }
    println!("{circles} circle(s), {files} file(s) in them");
    Ok(())
}
