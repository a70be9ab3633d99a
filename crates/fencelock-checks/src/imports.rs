//! The import check: one file graph per crate root, its circles, and the
//! layer rules (the rules are in the crate docs).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;
use crate::graph::strongly_connected;
use crate::manifest::{Target, workspace_packages};
use crate::modtree::build;
use crate::tree::{SourceTree, is_under};

/// One import of a file by another: the first place it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The importing file, relative to the repository root.
    pub from: String,
    /// The file defining what it names.
    pub to: String,
    /// The line of the first path in `from` that names something of `to`
    /// (the first line where that path is written: see the crate docs,
    /// "Line numbers").
    pub line: usize,
    /// That path as written (`use ` before an import's, `(in name!)` after
    /// one in a macro's tokens).
    pub path: String,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} → {}  ({})",
            self.from, self.line, self.to, self.path
        )
    }
}

/// The file graph of one crate root.
#[derive(Debug, Clone)]
pub struct TargetGraph {
    /// The package it belongs to.
    pub package: String,
    /// The target (`lib`, `bin fencelock`, `test it`, ...).
    pub target: String,
    /// Its files (the root first, then in module order).
    pub files: Vec<String>,
    /// One edge per importing and imported pair of files, sorted.
    pub edges: Vec<Edge>,
}

/// A strongly connected component of more than one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The package.
    pub package: String,
    /// The target.
    pub target: String,
    /// Its files, sorted.
    pub files: Vec<String>,
    /// The edges between its files, sorted.
    pub edges: Vec<Edge>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} ({}): a circle of {} files",
            self.package,
            self.target,
            self.files.len()
        )?;
        for file in &self.files {
            writeln!(f, "  {file}")?;
        }
        writeln!(f, "  its edges:")?;
        for edge in &self.edges {
            writeln!(f, "    {edge}")?;
        }
        Ok(())
    }
}

impl TargetGraph {
    /// The graph of `target` of `package`.
    pub fn build(tree: &SourceTree, package: &str, target: &Target) -> Result<Self, Error> {
        let modules = build(tree, &target.root)?;
        let mut files: Vec<String> = Vec::new();
        for module in &modules.modules {
            if !files.contains(&module.file) {
                files.push(module.file.clone());
            }
        }
        let mut first: BTreeMap<(String, String), Edge> = BTreeMap::new();
        for raw in modules.edges() {
            let key = (raw.from.clone(), raw.to.clone());
            let earlier = first.get(&key).is_some_and(|e| e.line <= raw.line);
            if !earlier {
                first.insert(
                    key,
                    Edge {
                        from: raw.from,
                        to: raw.to,
                        line: raw.line,
                        path: raw.text,
                    },
                );
            }
        }
        Ok(TargetGraph {
            package: package.to_string(),
            target: target.name.clone(),
            files,
            edges: first.into_values().collect(),
        })
    }

    /// The strongly connected components of more than one file, sorted by
    /// their first file.
    pub fn circles(&self) -> Vec<Circle> {
        let index: BTreeMap<&str, usize> = self
            .files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.as_str(), i))
            .collect();
        let mut adjacency = vec![Vec::new(); self.files.len()];
        for edge in &self.edges {
            if let (Some(&a), Some(&b)) =
                (index.get(edge.from.as_str()), index.get(edge.to.as_str()))
            {
                adjacency[a].push(b);
            }
        }
        let mut circles: Vec<Circle> = strongly_connected(&adjacency)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|component| {
                let mut files: Vec<String> =
                    component.iter().map(|&i| self.files[i].clone()).collect();
                files.sort();
                let members: BTreeSet<&str> = files.iter().map(String::as_str).collect();
                let edges = self
                    .edges
                    .iter()
                    .filter(|e| {
                        members.contains(e.from.as_str()) && members.contains(e.to.as_str())
                    })
                    .cloned()
                    .collect();
                Circle {
                    package: self.package.clone(),
                    target: self.target.clone(),
                    files,
                    edges,
                }
            })
            .collect();
        circles.sort_by(|a, b| a.files.cmp(&b.files));
        circles
    }
}

/// The graph of every crate root of every workspace member, in the order
/// of the members and their targets (built on as many threads as the
/// machine has cores: parsing is most of the work).
pub fn workspace_graphs(tree: &SourceTree) -> Result<Vec<TargetGraph>, Error> {
    let jobs: Vec<(String, Target)> = workspace_packages(tree)?
        .into_iter()
        .flat_map(|p| {
            let name = p.name;
            p.targets.into_iter().map(move |t| (name.clone(), t))
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut built: Vec<(usize, Result<TargetGraph, Error>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((package, target)) = jobs.get(i) else {
                            break;
                        };
                        done.push((i, TargetGraph::build(tree, package, target)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    built.sort_by_key(|(i, _)| *i);
    built.into_iter().map(|(_, graph)| graph).collect()
}

/// A layer rule: the files under `from` must not import files under any
/// of `forbid`. A directory stands for the files under it and for the
/// file of the same name with `.rs` added (the same module's file in the
/// non-`mod.rs` layout); a file path stands for itself. A rule whose `from` has no files checks
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRule {
    /// The directory (or file) the rule is about, relative to the
    /// repository root.
    pub from: &'static str,
    /// What it must not import.
    pub forbid: &'static [&'static str],
}

/// An import that breaks a [`LayerRule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerViolation {
    /// The package.
    pub package: String,
    /// The target.
    pub target: String,
    /// The rule's `from`.
    pub layer: &'static str,
    /// The forbidden directory or file it imports.
    pub forbidden: &'static str,
    /// The import.
    pub edge: Edge,
}

impl fmt::Display for LayerViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {} must not import {}: {}",
            self.package, self.target, self.layer, self.forbidden, self.edge
        )
    }
}

/// Every edge of `graphs` that breaks one of `rules`.
pub fn layer_violations(graphs: &[TargetGraph], rules: &[LayerRule]) -> Vec<LayerViolation> {
    let mut out = Vec::new();
    for graph in graphs {
        for edge in &graph.edges {
            for rule in rules.iter().filter(|r| is_under(&edge.from, r.from)) {
                for forbidden in rule.forbid.iter().filter(|f| is_under(&edge.to, f)) {
                    out.push(LayerViolation {
                        package: graph.package.clone(),
                        target: graph.target.clone(),
                        layer: rule.from,
                        forbidden,
                        edge: edge.clone(),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
