//! The reference check: every file a text of the repository cites exists,
//! and every section it cites is a heading of that document (the rules are
//! in the crate docs).

use std::fmt;

use crate::tree::{SourceTree, is_text_kind, join, parent_dir};

/// The extensions of cited files.
const CITED: [&str; 5] = ["md", "rs", "lua", "toml", "sh"];

/// Characters that make a run no citation (globs, placeholders, built
/// names, non-repository paths).
const NOT_A_PATH: [char; 9] = ['*', '{', '}', '<', '>', '$', '~', '@', '%'];

/// Why a citation does not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// No file of the tree is the cited path.
    NoSuchFile,
    /// The document exists, but has no heading of the cited section.
    NoSuchSection,
}

/// A citation that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The citing file, relative to the repository root.
    pub file: String,
    /// Its line.
    pub line: usize,
    /// What it cites: the path (relative to the root when written `./` or
    /// `../`), and ` §N` for a section.
    pub cited: String,
    /// Why it does not resolve.
    pub problem: Problem,
}

impl fmt::Display for Unresolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.problem {
            Problem::NoSuchFile => "no such file",
            Problem::NoSuchSection => "the document has no heading of that section",
        };
        write!(
            f,
            "{}:{}: cites {}: {why}",
            self.file, self.line, self.cited
        )
    }
}

/// What the check read and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// How many citations (files and sections) it checked.
    pub checked: usize,
    /// Those that do not resolve, in file and line order.
    pub unresolved: Vec<Unresolved>,
}

/// One citation as found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Citation {
    line: usize,
    path: String,
    sections: Vec<String>,
}

/// Every citation of every text file of `tree` (but those in `skip`),
/// checked.
pub fn check_references(tree: &SourceTree, skip: &[&str]) -> References {
    let mut out = References::default();
    for file in tree.paths() {
        if !is_text_kind(file) || skip.contains(&file) {
            continue;
        }
        let Some(text) = tree.text(file) else {
            continue;
        };
        for citation in citations(file, text) {
            out.checked += 1 + citation.sections.len();
            let (cited, targets) = resolve(tree, file, &citation.path);
            let missing = |cited: String, problem| Unresolved {
                file: file.to_string(),
                line: citation.line,
                cited,
                problem,
            };
            if targets.is_empty() {
                out.unresolved
                    .push(missing(cited.clone(), Problem::NoSuchFile));
            }
            for section in &citation.sections {
                let found = targets
                    .iter()
                    .any(|t| tree.text(t).is_some_and(|doc| has_section(doc, section)));
                if !found {
                    let problem = if targets.is_empty() {
                        Problem::NoSuchFile
                    } else {
                        Problem::NoSuchSection
                    };
                    out.unresolved
                        .push(missing(format!("{cited} §{section}"), problem));
                }
            }
        }
    }
    out
}

/// The citation `cited` of `file` as reported, and the files it resolves
/// to.
fn resolve(tree: &SourceTree, file: &str, cited: &str) -> (String, Vec<String>) {
    if cited.starts_with("./") || cited.starts_with("../") {
        return match join(parent_dir(file), cited) {
            Some(path) if tree.contains(&path) => (path.clone(), vec![path]),
            Some(path) => (path, Vec::new()),
            None => (cited.to_string(), Vec::new()),
        };
    }
    let suffix = format!("/{cited}");
    let targets = tree
        .paths()
        .filter(|p| *p == cited || p.ends_with(&suffix))
        .map(str::to_string)
        .collect();
    (cited.to_string(), targets)
}

/// Whether Markdown `doc` has a heading of section `number`.
fn has_section(doc: &str, number: &str) -> bool {
    let mut fenced = false;
    for line in doc.lines() {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() <= 3
            && (trimmed.starts_with("```") || trimmed.starts_with("~~~"))
        {
            fenced = !fenced;
            continue;
        }
        if fenced || line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 {
            continue;
        }
        let rest = &trimmed[hashes..];
        if !rest.starts_with([' ', '\t']) {
            continue;
        }
        let title = rest.trim_start();
        let title = title.strip_prefix('§').map_or(title, str::trim_start);
        if let Some(after) = title.strip_prefix(number) {
            let mut chars = after.chars();
            match chars.next() {
                None => return true,
                Some(c) if c.is_whitespace() => return true,
                Some('.') if chars.next().is_none_or(char::is_whitespace) => return true,
                _ => {}
            }
        }
    }
    false
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/') || NOT_A_PATH.contains(&c)
}

/// The citations of `text`, the content of `file`.
fn citations(file: &str, text: &str) -> Vec<Citation> {
    let rust = file.ends_with(".rs");
    let lines: Vec<Vec<char>> = text
        .lines()
        .map(|l| without_urls(l.chars().collect()))
        .collect();
    let mut out = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let mut i = 0;
        while i < line.len() {
            if !is_path_char(line[i]) || (i > 0 && line[i - 1] == '\\') {
                i += 1;
                continue;
            }
            let start = i;
            while i < line.len() && is_path_char(line[i]) && line[i] != '\\' {
                i += 1;
            }
            let mut end = i;
            while end > start && line[end - 1] == '.' {
                end -= 1;
            }
            // Most runs are words: no `.`, no file.
            if !line[start..end].contains(&'.') {
                continue;
            }
            let run: String = line[start..end].iter().collect();
            if !is_citation(&run) {
                continue;
            }
            if rust && whole_literal(line, start, i) {
                continue;
            }
            let sections = if run.ends_with(".md") {
                sections_after(&lines, index, end)
            } else {
                Vec::new()
            };
            out.push(Citation {
                line: index + 1,
                path: run,
                sections,
            });
        }
    }
    out
}

/// Whether the run `path` is a citation by the rules of the module docs.
fn is_citation(path: &str) -> bool {
    if path.contains(NOT_A_PATH) || path.starts_with('/') {
        return false;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    let Some((stem, ext)) = name.rsplit_once('.') else {
        return false;
    };
    // `.rs` alone is a kind of file, not a file.
    if stem.trim_start_matches('.').is_empty() || !CITED.contains(&ext) {
        return false;
    }
    // A script of the reader's: `report.sh`, `./report.sh`.
    let in_dir = path.strip_prefix("./").unwrap_or(path).contains('/');
    ext != "sh" || in_dir
}

/// Whether `line[start..end]` is the whole of a string literal: a `"`
/// (maybe escaped) before it and after it.
fn whole_literal(line: &[char], start: usize, end: usize) -> bool {
    let before = start > 0 && line[start - 1] == '"';
    let after = match line.get(end) {
        Some('"') => true,
        Some('\\') => line.get(end + 1) == Some(&'"'),
        _ => false,
    };
    before && after
}

/// `line` with its URLs blanked out.
fn without_urls(mut line: Vec<char>) -> Vec<char> {
    let mut i = 0;
    while i + 3 <= line.len() {
        if line[i] == ':' && line[i + 1] == '/' && line[i + 2] == '/' {
            let mut start = i;
            while start > 0
                && (line[start - 1].is_ascii_alphanumeric()
                    || matches!(line[start - 1], '+' | '.' | '-'))
            {
                start -= 1;
            }
            if start < i {
                let mut end = i;
                while end < line.len()
                    && !line[end].is_whitespace()
                    && !matches!(line[end], '"' | '\'' | '<' | '>' | '`' | ')' | ']')
                {
                    end += 1;
                }
                for c in &mut line[start..end] {
                    *c = ' ';
                }
                i = end;
                continue;
            }
        }
        i += 1;
    }
    line
}

/// The section numbers after a Markdown citation that ends at
/// `lines[index][end]`.
fn sections_after(lines: &[Vec<char>], index: usize, end: usize) -> Vec<String> {
    let line = &lines[index];
    let mut at = end;
    while at < line.len() && line[at].is_whitespace() {
        at += 1;
    }
    let (source, at) = if at == line.len() {
        match lines.get(index + 1) {
            Some(next) => (next.as_slice(), after_comment_marks(next)),
            None => return Vec::new(),
        }
    } else {
        (line.as_slice(), at)
    };
    let mut sections = Vec::new();
    let mut at = at;
    while let Some((number, next)) = section_at(source, at) {
        sections.push(number);
        at = next;
        // `, §2.3`, ` and §2.3`, ...
        let mut probe = at;
        while probe < source.len() && source[probe].is_whitespace() {
            probe += 1;
        }
        let rest: String = source[probe..].iter().take(4).collect();
        let joiner = [",", "and", "or", "&", "/"]
            .iter()
            .find(|j| rest.starts_with(**j))
            .map_or(0, |j| j.len());
        if joiner == 0 {
            break;
        }
        at = probe + joiner;
        while at < source.len() && source[at].is_whitespace() {
            at += 1;
        }
    }
    sections
}

/// `§N` or `§N.M...` at `line[at]`: its number and where it ends.
fn section_at(line: &[char], at: usize) -> Option<(String, usize)> {
    if line.get(at) != Some(&'§') {
        return None;
    }
    let mut i = at + 1;
    while line.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    let digits_from = |i: usize| {
        line[i.min(line.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    let first = digits_from(i);
    if first == 0 {
        return None;
    }
    let start = i;
    i += first;
    while line.get(i) == Some(&'.') && digits_from(i + 1) > 0 {
        i += 1 + digits_from(i + 1);
    }
    Some((line[start..i].iter().collect(), i))
}

/// Where the text of a comment line starts: after its indentation and its
/// comment marks.
fn after_comment_marks(line: &[char]) -> usize {
    let mut i = 0;
    loop {
        while i < line.len() && line[i].is_whitespace() {
            i += 1;
        }
        let rest: String = line[i..].iter().take(3).collect();
        let mark = ["///", "//!", "//", "--", "#", "*", ">"]
            .iter()
            .find(|m| rest.starts_with(**m))
            .map_or(0, |m| m.len());
        if mark == 0 {
            return i;
        }
        i += mark;
    }
}

#[cfg(test)]
mod tests;
