//! Paths resolved to the files that define what they name, and the edges
//! of one crate root's file graph (the rules are in the crate docs).

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{ImplItem, Item};

use crate::modtree::{ModId, ModTree, impl_item_attrs, is_test_only, item_attrs};

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Res {
    /// A module.
    Module(ModId),
    /// An item defined in this module (or something inside it: a variant,
    /// an associated item).
    Item(ModId),
    /// Something of another crate.
    External,
}

/// One path of a file that names something of another file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawEdge {
    /// The file with the path.
    pub(crate) from: String,
    /// The file defining what it names.
    pub(crate) to: String,
    /// The first line where the path is written in `from`.
    pub(crate) line: usize,
    /// The path as written (`use ` before an import's).
    pub(crate) text: String,
}

/// A `(module, name, through globs)` being resolved: a re-export loop ends
/// there.
type Guard = Vec<(ModId, String, bool)>;

impl ModTree {
    /// What `path` names when written in module `ctx`; `local` adds the
    /// imports of `ctx`'s functions and blocks. `None` when its first
    /// segment is nothing the crate defines or imports (a local variable,
    /// a generic parameter, the prelude).
    pub(crate) fn resolve(&self, ctx: ModId, path: &[String], local: bool) -> Option<Res> {
        self.resolve_in(ctx, path, local, &mut Vec::new())
    }

    fn resolve_in(
        &self,
        ctx: ModId,
        path: &[String],
        local: bool,
        guard: &mut Guard,
    ) -> Option<Res> {
        let (first, rest) = path.split_first()?;
        let mut cur = match first.as_str() {
            "::" => return Some(Res::External),
            "crate" | "$crate" => Res::Module(0),
            "self" => Res::Module(ctx),
            "super" => Res::Module(self.modules[ctx].parent?),
            "Self" => return None,
            name => self.lookup(ctx, name, local, guard)?,
        };
        for seg in rest {
            cur = match cur {
                Res::Module(m) => match seg.as_str() {
                    "super" => Res::Module(self.modules[m].parent?),
                    "self" => Res::Module(m),
                    // A name this module does not show (made by a macro,
                    // say): the module itself is the best answer.
                    name => self.lookup(m, name, false, guard).unwrap_or(Res::Module(m)),
                },
                other => return Some(other),
            };
        }
        Some(cur)
    }

    /// What `name` is in module `m`: a child module, an item, an import,
    /// or a name of a glob import.
    fn lookup(&self, m: ModId, name: &str, local: bool, guard: &mut Guard) -> Option<Res> {
        let module = &self.modules[m];
        if let Some(&child) = module.children.get(name) {
            return Some(Res::Module(child));
        }
        if module.items.contains(name) {
            return Some(Res::Item(m));
        }
        if module.externs.contains(name) {
            return Some(Res::External);
        }
        let locals = if local {
            module.local_imports.as_slice()
        } else {
            &[]
        };
        let imports = module.imports.iter().chain(locals);
        for import in imports.clone() {
            if import.glob || import.binding.as_deref() != Some(name) {
                continue;
            }
            let key = (m, name.to_string(), false);
            if guard.contains(&key) {
                continue;
            }
            guard.push(key);
            let found = self.resolve_in(m, &import.path, false, guard);
            guard.pop();
            if found.is_some() {
                return found;
            }
        }
        let key = (m, name.to_string(), true);
        if guard.contains(&key) {
            return None;
        }
        guard.push(key);
        let mut found = None;
        for import in imports.filter(|i| i.glob) {
            if let Some(Res::Module(g)) = self.resolve_in(m, &import.path, false, guard)
                && g != m
                && let Some(res) = self.lookup(g, name, false, guard)
            {
                found = Some(res);
                break;
            }
        }
        guard.pop();
        found
    }

    /// Whether module `m` is a strict descendant of module `of`.
    pub(crate) fn is_descendant(&self, m: ModId, of: ModId) -> bool {
        let mut cur = self.modules[m].parent;
        while let Some(p) = cur {
            if p == of {
                return true;
            }
            cur = self.modules[p].parent;
        }
        false
    }

    /// The outermost module of the file module `m` is in: `m` itself, or
    /// the module whose inline block holds it.
    fn file_module(&self, m: ModId) -> ModId {
        let mut cur = m;
        while let Some(parent) = self.modules[cur].parent {
            if self.modules[parent].file != self.modules[m].file {
                break;
            }
            cur = parent;
        }
        cur
    }

    /// The file of what `res` names, if it is of this crate.
    fn file_of(&self, res: Res) -> Option<&str> {
        match res {
            Res::Module(m) | Res::Item(m) => Some(&self.modules[m].file),
            Res::External => None,
        }
    }

    /// Every path of the crate that names something of another file, in
    /// module order.
    pub(crate) fn edges(&self) -> Vec<RawEdge> {
        let mut out = Vec::new();
        for (id, module) in self.modules.iter().enumerate() {
            for import in module.imports.iter().chain(&module.local_imports) {
                let target = match self.resolve(id, &import.path, false) {
                    Some(Res::Module(t) | Res::Item(t)) => t,
                    _ => continue,
                };
                // A façade's re-export of its own descendants is no edge
                // (of the file's: an inline module's re-export of a
                // sibling's child is the file's re-export too).
                if import.public && self.is_descendant(target, self.file_module(id)) {
                    continue;
                }
                let to = &self.modules[target].file;
                if *to == module.file {
                    continue;
                }
                let glob = if import.glob { "::*" } else { "" };
                out.push(RawEdge {
                    from: module.file.clone(),
                    to: to.clone(),
                    line: self
                        .lines(&module.file)
                        .map_or(1, |l| l.import(&import.path, import.glob)),
                    text: format!("use {}{glob}", import.path.join("::")),
                });
            }
            let mut paths = Paths {
                tree: self,
                ctx: id,
                out: &mut out,
            };
            for item in &module.body {
                paths.visit_item(item);
            }
        }
        out
    }
}

/// Visits the code of one module and records its paths' edges.
struct Paths<'a> {
    tree: &'a ModTree,
    ctx: ModId,
    out: &'a mut Vec<RawEdge>,
}

impl Paths<'_> {
    /// An edge for the path `segments` (written as `text`) if it names
    /// something of another file; its line is looked up in the text only
    /// then.
    fn record(&mut self, segments: &[String], text: String) {
        let Some(res) = self.tree.resolve(self.ctx, segments, true) else {
            return;
        };
        // A lone name that is a module is a local variable or binding of
        // that name: a module is only ever a path's prefix.
        if segments.len() == 1 && matches!(res, Res::Module(_)) {
            return;
        }
        let from = &self.tree.modules[self.ctx].file;
        if let Some(to) = self.tree.file_of(res)
            && to != from
        {
            self.out.push(RawEdge {
                from: from.clone(),
                to: to.to_string(),
                line: self.tree.lines(from).map_or(1, |l| l.path(segments)),
                text,
            });
        }
    }

    /// The paths `a::b::c` (two segments or more) in a macro's tokens.
    fn tokens(&mut self, stream: TokenStream, mac: &str) {
        let tts: Vec<TokenTree> = stream.into_iter().collect();
        let is_punct =
            |i: usize, c: char| matches!(tts.get(i), Some(TokenTree::Punct(p)) if p.as_char() == c);
        let colons_at = |i: usize| {
            matches!(tts.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
                && is_punct(i + 1, ':')
        };
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream(), mac);
                    i += 1;
                }
                TokenTree::Ident(ident) => {
                    let after = |c: char| i > 0 && is_punct(i - 1, c);
                    let dollar = after('$');
                    // A field or method (`.x`), a lifetime, a macro
                    // variable, or a path after `::` (a leading `::` or
                    // `<T>::`): not the start of a path of this crate.
                    let field = after('.') && !(i >= 2 && is_punct(i - 2, '.'));
                    let skip = field
                        || after('\'')
                        || (dollar && ident != "crate")
                        || (i >= 2 && colons_at(i - 2));
                    let mut segments = vec![if dollar {
                        "$crate".to_string()
                    } else {
                        ident.to_string()
                    }];
                    let mut j = i + 1;
                    while colons_at(j) {
                        match tts.get(j + 2) {
                            Some(TokenTree::Ident(next)) => {
                                segments.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if !skip && segments.len() >= 2 {
                        let text = format!("{} (in {mac}!)", segments.join("::"));
                        self.record(&segments, text);
                    }
                    i = j;
                }
                TokenTree::Punct(_) | TokenTree::Literal(_) => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        if !is_test_only(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if !is_test_only(impl_item_attrs(item)) {
            visit::visit_impl_item(self, item);
        }
    }

    // Counted from the module's imports.
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}

    // A module inside a function: not followed.
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    // `pub(in crate::x)` says who may see an item, not what it uses.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && !path.segments.is_empty() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let text = segments.join("::");
            self.record(&segments, text);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        let name = mac
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        self.tokens(mac.tokens.clone(), &name);
    }
}
