//! What the import check needs from the `Cargo.toml` files: the
//! workspace's members, each package's name and its targets (the crate
//! roots).
//!
//! This reads only the simple form the workspace writes: `members = [...]`
//! of strings (a trailing `/*` lists every directory with a `Cargo.toml`),
//! `name = "..."` and `path = "..."` lines in `[package]`, `[lib]`,
//! `[[bin]]`, `[[test]]`, `[[bench]]` and `[[example]]` tables, and
//! `autobins` and friends set to `false`. It is not a TOML parser.

use crate::error::Error;
use crate::tree::{SourceTree, join};

/// One crate root of a package: a library, binary, test, bench or example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// What it is and its name, as `lib`, `bin fencelock`, `test it`,
    /// `bench lock`, `example invoice`.
    pub name: String,
    /// Its root file, relative to the repository root.
    pub root: String,
}

/// A workspace member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// The package name (`[package] name`).
    pub name: String,
    /// Its directory, relative to the repository root.
    pub dir: String,
    /// Its crate roots.
    pub targets: Vec<Target>,
}

/// The members of the workspace whose `Cargo.toml` is at the root of
/// `tree`, in the order listed; a root manifest without `[workspace]` is a
/// workspace of the root package alone.
pub fn workspace_packages(tree: &SourceTree) -> Result<Vec<Package>, Error> {
    let Some(root) = tree.text("Cargo.toml") else {
        return Err(Error::MissingManifest {
            member: ".".to_string(),
        });
    };
    let mut dirs = Vec::new();
    match members(root) {
        Some(list) => {
            for member in list {
                if let Some(parent) = member.strip_suffix("/*") {
                    dirs.extend(
                        tree.dirs_in(parent)
                            .into_iter()
                            .filter(|d| tree.contains(&format!("{d}/Cargo.toml"))),
                    );
                } else {
                    dirs.push(member.trim_end_matches('/').to_string());
                }
            }
        }
        None => dirs.push(String::new()),
    }
    dirs.iter().map(|dir| package(tree, dir)).collect()
}

/// The package in directory `dir` (`""` for the root).
pub fn package(tree: &SourceTree, dir: &str) -> Result<Package, Error> {
    let manifest_path = join(dir, "Cargo.toml").unwrap_or_default();
    let Some(manifest) = tree.text(&manifest_path) else {
        return Err(Error::MissingManifest {
            member: dir.to_string(),
        });
    };
    let tables = tables(manifest);
    let name = tables
        .iter()
        .find(|t| t.header == "package")
        .and_then(|t| t.name.clone())
        .unwrap_or_else(|| dir.rsplit('/').next().unwrap_or(dir).to_string());
    let auto = |key: &str| {
        !tables
            .iter()
            .any(|t| t.header == "package" && t.disabled.iter().any(|d| d == key))
    };
    let mut targets: Vec<Target> = Vec::new();
    let mut add = |kind: &str, target_name: &str, root: String| {
        if tree.contains(&root) && !targets.iter().any(|t| t.root == root) {
            targets.push(Target {
                name: format!("{kind} {target_name}").trim_end().to_string(),
                root,
            });
        }
    };
    // Explicit tables first: their names win over the automatic ones.
    for table in &tables {
        let kind = match table.header.as_str() {
            "lib" => "lib",
            "bin" => "bin",
            "test" => "test",
            "bench" => "bench",
            "example" => "example",
            _ => continue,
        };
        let default_dir = match kind {
            "lib" | "bin" => "src/bin",
            "test" => "tests",
            "bench" => "benches",
            _ => "examples",
        };
        let target_name = table.name.clone().unwrap_or_default();
        let root = match (&table.path, kind) {
            (Some(path), _) => join(dir, path),
            (None, "lib") => join(dir, "src/lib.rs"),
            (None, _) if !target_name.is_empty() => {
                let single = join(dir, &format!("{default_dir}/{target_name}.rs"));
                let nested = join(dir, &format!("{default_dir}/{target_name}/main.rs"));
                match single {
                    Some(s) if tree.contains(&s) => Some(s),
                    _ => nested,
                }
            }
            _ => None,
        };
        let Some(root) = root else { continue };
        let shown = if kind == "lib" { "" } else { &target_name };
        add(kind, shown, root);
    }
    if let Some(lib) = join(dir, "src/lib.rs") {
        add("lib", "", lib);
    }
    let auto_dirs = [
        ("bin", "autobins", "src/bin"),
        ("test", "autotests", "tests"),
        ("bench", "autobenches", "benches"),
        ("example", "autoexamples", "examples"),
    ];
    for (kind, key, sub) in auto_dirs {
        if !auto(key) {
            continue;
        }
        if kind == "bin"
            && let Some(main) = join(dir, "src/main.rs")
        {
            add("bin", &name, main);
        }
        let Some(sub_dir) = join(dir, sub) else {
            continue;
        };
        let singles: Vec<String> = tree
            .files_in(&sub_dir)
            .filter(|p| p.ends_with(".rs"))
            .map(str::to_string)
            .collect();
        for file in singles {
            let stem = file
                .rsplit('/')
                .next()
                .and_then(|f| f.strip_suffix(".rs"))
                .unwrap_or_default()
                .to_string();
            add(kind, &stem, file);
        }
        for nested in tree.dirs_in(&sub_dir) {
            let main = format!("{nested}/main.rs");
            let target_name = nested.rsplit('/').next().unwrap_or_default().to_string();
            add(kind, &target_name, main);
        }
    }
    Ok(Package {
        name,
        dir: dir.to_string(),
        targets,
    })
}

/// One `[table]` or `[[table]]` of a manifest, with the keys read here.
#[derive(Debug, Default)]
struct Table {
    header: String,
    name: Option<String>,
    path: Option<String>,
    /// The `auto*` keys set to `false`.
    disabled: Vec<String>,
}

fn tables(manifest: &str) -> Vec<Table> {
    let mut out = vec![Table::default()];
    for line in manifest.lines() {
        let line = strip_comment(line).trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_start_matches('[');
            let header = header.trim_end_matches(']').trim();
            out.push(Table {
                header: header.to_string(),
                ..Table::default()
            });
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let Some(table) = out.last_mut() else {
            continue;
        };
        match key {
            "name" => table.name = quoted(value),
            "path" => table.path = quoted(value),
            k if k.starts_with("auto") && value == "false" => table.disabled.push(k.to_string()),
            _ => {}
        }
    }
    out
}

/// The strings of the root manifest's `members = [...]`, if it has one.
fn members(manifest: &str) -> Option<Vec<String>> {
    let mut in_workspace = false;
    let mut collecting = false;
    let mut list = String::new();
    for line in manifest.lines() {
        let line = strip_comment(line);
        let trimmed = line.trim();
        if !collecting && trimmed.starts_with('[') {
            in_workspace = trimmed == "[workspace]";
            continue;
        }
        if in_workspace && !collecting {
            if let Some(rest) = trimmed.strip_prefix("members")
                && let Some(rest) = rest.trim_start().strip_prefix('=')
            {
                collecting = true;
                list.push_str(rest);
            }
        } else if collecting {
            list.push_str(line);
        }
        if collecting && list.contains(']') {
            break;
        }
    }
    if !collecting {
        return None;
    }
    let inner = list.trim().trim_start_matches('[');
    let inner = inner.split(']').next().unwrap_or_default();
    Some(inner.split(',').filter_map(|s| quoted(s.trim())).collect())
}

/// The content of a `"..."` string.
fn quoted(value: &str) -> Option<String> {
    let rest = value.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

/// `line` without a `#` comment (one outside a `"..."` string).
fn strip_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_members_and_their_targets() {
        let tree = SourceTree::from_memory([
            (
                "Cargo.toml",
                "[workspace]\nmembers = [\n  \"crates/a\", # the library\n  \"crates/b\",\n]\n",
            ),
            (
                "crates/a/Cargo.toml",
                "[package]\nname = \"a\"\n\n[[bench]]\nname = \"speed\"\nharness = false\n",
            ),
            ("crates/a/src/lib.rs", ""),
            ("crates/a/benches/speed.rs", ""),
            ("crates/a/tests/it/main.rs", ""),
            ("crates/a/tests/it/support.rs", ""),
            ("crates/a/tests/one.rs", ""),
            (
                "crates/b/Cargo.toml",
                "[package]\nname = \"b-cli\"\n[[bin]]\nname = \"b\"\npath = \"src/main.rs\"\n",
            ),
            ("crates/b/src/main.rs", ""),
            ("crates/b/src/bin/tool.rs", ""),
        ]);
        let packages = workspace_packages(&tree).expect("the manifests read");
        let shown: Vec<(String, Vec<(String, String)>)> = packages
            .into_iter()
            .map(|p| {
                let targets = p.targets.into_iter().map(|t| (t.name, t.root)).collect();
                (p.name, targets)
            })
            .collect();
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            shown,
            vec![
                (
                    "a".to_string(),
                    pairs(&[
                        ("bench speed", "crates/a/benches/speed.rs"),
                        ("lib", "crates/a/src/lib.rs"),
                        ("test one", "crates/a/tests/one.rs"),
                        ("test it", "crates/a/tests/it/main.rs"),
                    ])
                ),
                (
                    "b-cli".to_string(),
                    pairs(&[
                        ("bin b", "crates/b/src/main.rs"),
                        ("bin tool", "crates/b/src/bin/tool.rs"),
                    ])
                ),
            ]
        );
    }
}
