//! The lines of what the import check reports, found in the file's text.
//!
//! The parser's tokens carry no positions (proc-macro2 only records them
//! with its `span-locations` feature), so each Rust file is scanned once
//! more by a small lexer of its own: identifiers, `::`, punctuation, and
//! literals, lifetimes and comments skipped (nested block comments, raw
//! strings, byte and C strings, char literals told from lifetimes). A
//! path's line is then looked up among those tokens; the rules are in the
//! crate docs ("Line numbers").

use std::collections::HashMap;

/// What the scan keeps of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// An identifier or keyword as written (`r#type`); `$crate` is one.
    Ident(String),
    /// `::`.
    PathSep,
    /// `->` or `=>`: not an angle bracket.
    Arrow,
    /// Any other punctuation character, brackets included.
    Punct(char),
    /// A literal or a lifetime: never part of a path.
    Other,
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    /// The line it starts on (1-based).
    line: usize,
}

/// A name a `use` declaration imports, as [`crate::modtree::Import`]
/// records it: its path (without `self`; a leading `::` is a segment
/// `"::"`) and whether it is a glob.
type UseKey = (Vec<String>, bool);

/// The keywords after which an identifier is the name being defined, not
/// a path.
const DEFINING: [&str; 9] = [
    "fn", "struct", "enum", "union", "trait", "type", "mod", "static", "const",
];

/// Generic arguments longer than this many tokens are not skipped (a `<`
/// that is a comparison finds no `>` of its own).
const MAX_GENERICS: usize = 256;

/// One Rust file's tokens, for finding the lines of its paths.
#[derive(Debug)]
pub(crate) struct Lines {
    tokens: Vec<Token>,
    /// The indices in `tokens` of each identifier, in order.
    idents: HashMap<String, Vec<usize>>,
    /// The first line of each name a `use` declaration imports.
    uses: HashMap<UseKey, usize>,
    /// Whether each token is part of a `use` declaration.
    in_use: Vec<bool>,
    /// The lines right after a line that ends a top-level item: whose
    /// last token is a `}` or `;` outside every bracket.
    after_items: Vec<usize>,
}

impl Lines {
    /// The scan of `text`.
    pub(crate) fn new(text: &str) -> Self {
        let (tokens, after_items) = lex(text);
        let mut idents: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, token) in tokens.iter().enumerate() {
            if let Tok::Ident(name) = &token.tok {
                idents.entry(name.clone()).or_default().push(i);
            }
        }
        let (uses, in_use) = use_names(&tokens);
        Lines {
            tokens,
            idents,
            uses,
            in_use,
            after_items,
        }
    }

    fn tok(&self, i: usize) -> Option<&Tok> {
        self.tokens.get(i).map(|t| &t.tok)
    }

    fn is_punct(&self, i: usize, c: char) -> bool {
        self.tok(i) == Some(&Tok::Punct(c))
    }

    fn is_ident(&self, i: usize, name: &str) -> bool {
        matches!(self.tok(i), Some(Tok::Ident(n)) if n == name)
    }

    fn line(&self, i: usize) -> usize {
        self.tokens.get(i).map_or(1, |t| t.line)
    }

    /// The line of the path `segments` (of code, or of a macro's tokens):
    /// the first place the whole path is written outside `use`
    /// declarations; else inside one (a `use` in a macro's tokens is read
    /// as code); else the first place the most of its leading segments
    /// are; else the first occurrence of its first name; else 1.
    pub(crate) fn path(&self, segments: &[String]) -> usize {
        let Some(first) = segments.first() else {
            return 1;
        };
        let Some(at) = self.idents.get(first.as_str()) else {
            return 1;
        };
        let lone = segments.len() == 1;
        let mut whole_in_use = None;
        let mut best: Option<(usize, usize)> = None;
        for &i in at {
            if !self.starts_path(i, lone) {
                continue;
            }
            let (matched, end) = self.matched(i, segments);
            if matched == segments.len() && self.ends_path(end) {
                if !self.in_use.get(i).copied().unwrap_or(false) {
                    return self.line(i);
                }
                whole_in_use = whole_in_use.or(Some(i));
            }
            if best.is_none_or(|(most, _)| matched > most) {
                best = Some((matched, i));
            }
        }
        let i = whole_in_use
            .or(best.map(|(_, i)| i))
            .or(at.first().copied());
        i.map_or(1, |i| self.line(i))
    }

    /// The line of the name a `use` declaration imports (`path`, without
    /// `self`; `glob` for `path::*`): the first `use` that imports it,
    /// its last name's line (or its `*`'s); else as [`Lines::path`].
    pub(crate) fn import(&self, path: &[String], glob: bool) -> usize {
        if let Some(&line) = self.uses.get(&(path.to_vec(), glob)) {
            return line;
        }
        let rest = match path.split_first() {
            Some((first, rest)) if first == "::" => rest,
            _ => path,
        };
        self.path(rest)
    }

    /// The line of the declaration `mod name;` (else of `mod name`, else
    /// of the first `name`, else 1).
    pub(crate) fn mod_decl(&self, name: &str) -> usize {
        let Some(at) = self.idents.get(name) else {
            return 1;
        };
        let after_mod = |i: usize| i > 0 && self.is_ident(i - 1, "mod");
        let found = at
            .iter()
            .find(|&&i| after_mod(i) && self.is_punct(i + 1, ';'))
            .or_else(|| at.iter().find(|&&i| after_mod(i)))
            .or(at.first());
        found.map_or(1, |&i| self.line(i))
    }

    /// The line a file that does not parse (its text `text`) is reported
    /// at: the first line of code of the top-level item the parser stops
    /// in. The file's prefixes that end after a top-level item parse up
    /// to that item and no longer from it on, so it is found by bisection
    /// over them (a few parses, on this error's path only).
    pub(crate) fn parse_error(&self, text: &str) -> usize {
        let starts: Vec<usize> = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        let parses = |line: usize| {
            starts
                .get(line - 1)
                .is_some_and(|&cut| syn::parse_file(&text[..cut]).is_ok())
        };
        // The prefix before `after_items[good - 1]` parses (`good == 0`:
        // the empty one); the one before `after_items[bad - 1]` does not
        // (`bad == len + 1`: the whole file).
        let (mut good, mut bad) = (0, self.after_items.len() + 1);
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if parses(self.after_items[mid - 1]) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        let parsed = good.checked_sub(1).map_or(0, |i| self.after_items[i] - 1);
        self.tokens
            .iter()
            .find(|t| t.line > parsed)
            .map_or(parsed + 1, |t| t.line)
    }

    /// Whether a path can start at identifier `i`: not after `::` (the
    /// rest of a longer path), `.` (a field or method; `..` is a range)
    /// or `$` (a macro variable). A lone name (`lone`) is also not a
    /// definition's (after `fn`, `struct`, ..., `macro_rules!`) nor a
    /// field's (before a single `:`).
    fn starts_path(&self, i: usize, lone: bool) -> bool {
        if i > 0 {
            match self.tok(i - 1) {
                Some(Tok::PathSep | Tok::Punct('$')) => return false,
                Some(Tok::Punct('.')) if !(i >= 2 && self.is_punct(i - 2, '.')) => return false,
                _ => {}
            }
        }
        if !lone {
            return true;
        }
        let defined = i > 0
            && (matches!(self.tok(i - 1), Some(Tok::Ident(k)) if DEFINING.contains(&k.as_str()))
                || (i >= 2 && self.is_punct(i - 1, '!') && self.is_ident(i - 2, "macro_rules")));
        !defined && !self.is_punct(i + 1, ':')
    }

    /// How many of `segments` are written from identifier `i` on (the
    /// first always is), joined by `::` with generic arguments allowed
    /// between (`a::<T>::b`, `A<T>::b`), and the index after the last.
    fn matched(&self, i: usize, segments: &[String]) -> (usize, usize) {
        let mut end = i + 1;
        let mut count = 1;
        for segment in segments.iter().skip(1) {
            let sep = self.skip_generics(end);
            if self.tok(sep) != Some(&Tok::PathSep) || !self.is_ident(sep + 1, segment) {
                break;
            }
            end = sep + 2;
            count += 1;
        }
        (count, end)
    }

    /// Whether a path ending before index `end` is whole: no further
    /// segment, group or glob follows it.
    fn ends_path(&self, end: usize) -> bool {
        let sep = self.skip_generics(end);
        !(self.tok(sep) == Some(&Tok::PathSep)
            && matches!(
                self.tok(sep + 1),
                Some(Tok::Ident(_) | Tok::Punct('{' | '*'))
            ))
    }

    /// The index after the generic arguments (`::<...>` or `<...>`) that
    /// start at `at`, or `at` when none do.
    fn skip_generics(&self, at: usize) -> usize {
        let open = if self.tok(at) == Some(&Tok::PathSep) && self.is_punct(at + 1, '<') {
            at + 1
        } else if self.is_punct(at, '<') {
            at
        } else {
            return at;
        };
        let mut depth = 0usize;
        for k in open..self.tokens.len().min(open + MAX_GENERICS) {
            match self.tok(k) {
                Some(Tok::Punct('<')) => depth += 1,
                Some(Tok::Punct('>')) => {
                    depth -= 1;
                    if depth == 0 {
                        return k + 1;
                    }
                }
                Some(Tok::Punct(';' | '{' | '}')) => return at,
                _ => {}
            }
        }
        at
    }
}

/// The first line of every name the `use` declarations of `tokens`
/// import (those in macros' tokens too), and whether each token is part
/// of one.
fn use_names(tokens: &[Token]) -> (HashMap<UseKey, usize>, Vec<bool>) {
    let mut out = HashMap::new();
    let mut in_use = vec![false; tokens.len()];
    for (i, token) in tokens.iter().enumerate() {
        let after_path = i > 0 && matches!(tokens[i - 1].tok, Tok::PathSep | Tok::Punct('.'));
        if !matches!(&token.tok, Tok::Ident(n) if n == "use") || after_path {
            continue;
        }
        let mut at = i + 1;
        let mut prefix = Vec::new();
        if tokens.get(at).map(|t| &t.tok) == Some(&Tok::PathSep) {
            prefix.push("::".to_string());
            at += 1;
        }
        use_tree(tokens, &mut at, &mut prefix, &mut out);
        for flag in in_use.iter_mut().take(at).skip(i) {
            *flag = true;
        }
    }
    (out, in_use)
}

/// Records the names of the use tree at `tokens[*at..]` under `prefix`
/// and moves `at` past it.
fn use_tree(
    tokens: &[Token],
    at: &mut usize,
    prefix: &mut Vec<String>,
    out: &mut HashMap<UseKey, usize>,
) {
    let tok = |i: usize| tokens.get(i).map(|t| &t.tok);
    let depth = prefix.len();
    while let Some(token) = tokens.get(*at) {
        match &token.tok {
            Tok::Ident(name) if tok(*at + 1) == Some(&Tok::PathSep) => {
                prefix.push(name.clone());
                *at += 2;
            }
            Tok::Ident(name) => {
                let mut path = prefix.clone();
                if name != "self" {
                    path.push(name.clone());
                }
                out.entry((path, false)).or_insert(token.line);
                *at += 1;
                if matches!(tok(*at), Some(Tok::Ident(n)) if n == "as") {
                    *at += 2;
                }
                break;
            }
            Tok::Punct('*') => {
                out.entry((prefix.clone(), true)).or_insert(token.line);
                *at += 1;
                break;
            }
            Tok::Punct('{') => {
                *at += 1;
                loop {
                    use_tree(tokens, at, prefix, out);
                    match tok(*at) {
                        Some(Tok::Punct(',')) => *at += 1,
                        Some(Tok::Punct('}')) => {
                            *at += 1;
                            break;
                        }
                        _ => break,
                    }
                }
                break;
            }
            _ => break,
        }
    }
    prefix.truncate(depth);
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_continue(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens of `text`, and the lines that start right after a
/// top-level item ([`Lines::after_items`]).
fn lex(text: &str) -> (Vec<Token>, Vec<usize>) {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut tokens: Vec<Token> = Vec::new();
    let mut after_items = Vec::new();
    let mut depth = 0usize;
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let start = line;
        let tok = match ch {
            '\n' => {
                // Only the line right after the item's end: one after a
                // `///` line would end in an attribute with no item.
                let ends_item = tokens
                    .last()
                    .is_some_and(|t| t.line == line && matches!(t.tok, Tok::Punct('}' | ';')));
                line += 1;
                i += 1;
                if depth == 0 && ends_item {
                    after_items.push(line);
                }
                continue;
            }
            _ if ch.is_whitespace() => {
                i += 1;
                continue;
            }
            '/' if at(i + 1) == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '/' if at(i + 1) == '*' => {
                i = block_comment_end(&c, i, &mut line);
                continue;
            }
            '"' => {
                i = string_end(&c, i + 1, &mut line);
                Tok::Other
            }
            '\'' => {
                i = quote_end(&c, i);
                Tok::Other
            }
            _ if is_ident_start(ch) => match prefixed_literal_end(&c, i, &mut line) {
                Some(end) => {
                    i = end;
                    Tok::Other
                }
                None => {
                    let from = i;
                    if ch == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
                        i += 2;
                    }
                    i += 1;
                    while is_ident_continue(at(i)) {
                        i += 1;
                    }
                    Tok::Ident(c[from..i].iter().collect())
                }
            },
            _ if ch.is_ascii_digit() => {
                i += 1;
                while is_ident_continue(at(i)) || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                    i += 1;
                }
                Tok::Other
            }
            ':' if at(i + 1) == ':' => {
                i += 2;
                Tok::PathSep
            }
            '-' | '=' if at(i + 1) == '>' => {
                i += 2;
                Tok::Arrow
            }
            _ => {
                match ch {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                i += 1;
                Tok::Punct(ch)
            }
        };
        // `$crate` is one name.
        if matches!(&tok, Tok::Ident(n) if n == "crate")
            && tokens.last().is_some_and(|t| t.tok == Tok::Punct('$'))
        {
            tokens.pop();
            tokens.push(Token {
                tok: Tok::Ident("$crate".to_string()),
                line: start,
            });
            continue;
        }
        tokens.push(Token { tok, line: start });
    }
    (tokens, after_items)
}

/// The end of the block comment (nested ones inside) that starts at `i`.
fn block_comment_end(c: &[char], i: usize, line: &mut usize) -> usize {
    let mut depth = 0usize;
    let mut j = i;
    while j < c.len() {
        match (c[j], c.get(j + 1).copied()) {
            ('/', Some('*')) => {
                depth += 1;
                j += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return j;
                }
            }
            (ch, _) => {
                if ch == '\n' {
                    *line += 1;
                }
                j += 1;
            }
        }
    }
    j
}

/// The end of the string whose text starts at `i` (after its `"`),
/// escapes allowed.
fn string_end(c: &[char], i: usize, line: &mut usize) -> usize {
    let mut j = i;
    while j < c.len() {
        match c[j] {
            '\\' => {
                if c.get(j + 1) == Some(&'\n') {
                    *line += 1;
                }
                j += 2;
            }
            '"' => return j + 1,
            ch => {
                if ch == '\n' {
                    *line += 1;
                }
                j += 1;
            }
        }
    }
    j
}

/// The end of the raw string whose `#`s (maybe none) and `"` start at
/// `i`, or `None` when no `"` follows the `#`s (a raw identifier).
fn raw_string_end(c: &[char], i: usize, line: &mut usize) -> Option<usize> {
    let hashes = c[i.min(c.len())..]
        .iter()
        .take_while(|&&ch| ch == '#')
        .count();
    if c.get(i + hashes) != Some(&'"') {
        return None;
    }
    let mut j = i + hashes + 1;
    while j < c.len() {
        if c[j] == '"'
            && c.len() >= j + 1 + hashes
            && c[j + 1..j + 1 + hashes].iter().all(|&ch| ch == '#')
        {
            return Some(j + 1 + hashes);
        }
        if c[j] == '\n' {
            *line += 1;
        }
        j += 1;
    }
    Some(j)
}

/// The end of the literal with a prefix (`b'x'`, `b"..."`, `c"..."`,
/// `r"..."`, `r#"..."#`, `br"..."`, `cr#"..."#`) that starts at `i`, or
/// `None` when what starts there is an identifier.
fn prefixed_literal_end(c: &[char], i: usize, line: &mut usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    match (at(i), at(i + 1)) {
        ('b', '\'') => Some(quote_end(c, i + 1)),
        ('b' | 'c', '"') => Some(string_end(c, i + 2, line)),
        ('b' | 'c', 'r') => raw_string_end(c, i + 2, line),
        ('r', _) => raw_string_end(c, i + 1, line),
        _ => None,
    }
}

/// The end of the char literal or lifetime that starts with the `'` at
/// `i`.
fn quote_end(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    if at(i + 1) == '\\' {
        // `'\n'`, `'\''`, `'\u{1F512}'`.
        let mut j = i + 3;
        while j < c.len() && c[j] != '\'' && c[j] != '\n' {
            j += 1;
        }
        return (j + 1).min(c.len());
    }
    if at(i + 2) == '\'' {
        return i + 3;
    }
    // A lifetime or label.
    let mut j = i + 1;
    while is_ident_continue(at(j)) {
        j += 1;
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(path: &str) -> Vec<String> {
        path.split("::").map(str::to_string).collect()
    }

    #[test]
    fn comments_strings_chars_and_lifetimes_are_no_paths() {
        let text = "// crate::a::X\n/* crate::a::X /* nested */ crate::a::X */\nconst S: &str = \"crate::a::X\";\nconst R: &str = r#\"crate::a::X \"# ;\nfn f<'a>(c: char) -> bool { c == '\\'' || c == '\"' }\nfn g() -> crate::a::X { crate::a::X }\n";
        let lines = Lines::new(text);
        assert_eq!(lines.path(&strings("crate::a::X")), 6);
    }

    #[test]
    fn a_path_is_found_across_spaces_lines_and_generic_arguments() {
        let text = "fn f() {\n    m!(crate :: a\n        :: f);\n    Vec::<u8>::new();\n    crate::b::<T>::c();\n}\n";
        let lines = Lines::new(text);
        assert_eq!(lines.path(&strings("crate::a::f")), 2);
        assert_eq!(lines.path(&strings("Vec::new")), 4);
        assert_eq!(lines.path(&strings("crate::b::c")), 5);
    }

    #[test]
    fn the_whole_path_wins_over_a_longer_one_and_a_suffix() {
        // `crate::a` on line 1 is the start of a longer path; `a::B` on
        // line 2 the end of one; the lone `B` on line 3 a field's name.
        let text = "fn f() -> crate::a::B { todo!() }\nfn g() -> crate::a::B { todo!() }\nstruct S { B: u8 }\nfn h() { let _ = crate::a; let _ = a::B; let _ = B; }\n";
        let lines = Lines::new(text);
        assert_eq!(lines.path(&strings("crate::a")), 4);
        assert_eq!(lines.path(&strings("a::B")), 4);
        assert_eq!(lines.path(&strings("B")), 4);
        // Not written whole anywhere: where most of it is.
        assert_eq!(lines.path(&strings("crate::a::C")), 1);
    }

    #[test]
    fn a_path_of_code_is_not_looked_for_in_use_declarations() {
        // A façade re-exports `Conn` on line 1 and uses it on line 3.
        let text = "pub(crate) use conn::{\n    Conn,\n};\nfn f(c: Conn) -> conn::Conn { c }\nmacro_rules! m { () => { use conn::Only; } }\n";
        let lines = Lines::new(text);
        assert_eq!(lines.path(&strings("Conn")), 4);
        assert_eq!(lines.path(&strings("conn::Conn")), 4);
        assert_eq!(lines.import(&strings("conn::Conn"), false), 2);
        // Written only in a `use` (of a macro's tokens): found there.
        assert_eq!(lines.path(&strings("conn::Only")), 5);
    }

    #[test]
    fn a_use_trees_names_are_on_their_own_lines() {
        let text = "use super::{\n    a,\n    b::C,\n    d::{self, e as f},\n    g::*,\n};\nuse ::std::fmt;\n";
        let lines = Lines::new(text);
        assert_eq!(lines.import(&strings("super::a"), false), 2);
        assert_eq!(lines.import(&strings("super::b::C"), false), 3);
        assert_eq!(lines.import(&strings("super::d"), false), 4);
        assert_eq!(lines.import(&strings("super::d::e"), false), 4);
        assert_eq!(lines.import(&strings("super::g"), true), 5);
        assert_eq!(
            lines.import(&["::".to_string(), "std".into(), "fmt".into()], false),
            7
        );
    }

    #[test]
    fn a_mod_declaration_and_a_parse_error_have_their_lines() {
        let text = "//! Docs.\n\nmod inline {\n    fn gone() {}\n}\nmod gone;\n\nfn ok() {}\n\nfn broken() {\n    let x = ;\n}\n";
        let lines = Lines::new(text);
        assert_eq!(lines.mod_decl("gone"), 6);
        assert!(syn::parse_file(text).is_err());
        assert_eq!(lines.parse_error(text), 10);
    }
}
