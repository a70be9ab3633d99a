//! The module tree of one crate root: its modules found by following
//! `mod x;` declarations, each with the file it lives in, the names it
//! defines and the names its `use` declarations bring in. Test-only code
//! (`#[cfg(test)]`) is left out.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItem, Item, Meta, Token, UseTree, Visibility};

use crate::error::Error;
use crate::lines::Lines;
use crate::tree::{SourceTree, join, parent_dir};

/// A module's index in [`ModTree::modules`]; the crate root is 0.
pub(crate) type ModId = usize;

/// One module of a crate.
pub(crate) struct Module {
    /// The parent module (`None` for the crate root).
    pub(crate) parent: Option<ModId>,
    /// The file the module's items are in (an inline `mod x { ... }` is in
    /// the file of its parent).
    pub(crate) file: String,
    /// The child modules by name.
    pub(crate) children: BTreeMap<String, ModId>,
    /// The names of the items defined here (not modules, not imports).
    pub(crate) items: BTreeSet<String>,
    /// Names of external crates brought in by `extern crate`.
    pub(crate) externs: BTreeSet<String>,
    /// The module's `use` declarations, one per imported name.
    pub(crate) imports: Vec<Import>,
    /// The `use` declarations inside its functions and blocks: in scope
    /// for the module's own code only.
    pub(crate) local_imports: Vec<Import>,
    /// The items whose paths count (everything but `mod` and `use`).
    pub(crate) body: Vec<Item>,
}

/// One name (or glob) of a `use` declaration.
#[derive(Debug, Clone)]
pub(crate) struct Import {
    /// The name it brings into scope (`None` for a glob and for `as _`).
    pub(crate) binding: Option<String>,
    /// The path it names, one segment each; a leading `::` is a first
    /// segment `"::"`.
    pub(crate) path: Vec<String>,
    /// `use path::*`.
    pub(crate) glob: bool,
    /// Any `pub`, `pub(crate)`, `pub(super)`, `pub(in ...)`.
    pub(crate) public: bool,
}

/// The modules of one crate root.
pub(crate) struct ModTree {
    /// Every module; the crate root first.
    pub(crate) modules: Vec<Module>,
    /// The scan of each of its files' text, for the lines of its paths.
    lines: HashMap<String, Lines>,
}

impl ModTree {
    /// The scan of `file`, one of the crate's files.
    pub(crate) fn lines(&self, file: &str) -> Option<&Lines> {
        self.lines.get(file)
    }
}

/// The module tree of the crate whose root file is `root`.
pub(crate) fn build(tree: &SourceTree, root: &str) -> Result<ModTree, Error> {
    let mut builder = Builder {
        tree,
        modules: Vec::new(),
        loading: Vec::new(),
        lines: HashMap::new(),
    };
    let parsed = builder.parse(root)?;
    let id = builder.new_module(None, root);
    builder.load(id, parsed, root, parent_dir(root))?;
    Ok(ModTree {
        modules: builder.modules,
        lines: builder.lines,
    })
}

struct Builder<'t> {
    tree: &'t SourceTree,
    modules: Vec<Module>,
    /// The files being loaded, outermost first (a `#[path]` loop stops).
    loading: Vec<String>,
    /// The scan of each file read.
    lines: HashMap<String, Lines>,
}

impl Builder<'_> {
    fn new_module(&mut self, parent: Option<ModId>, file: &str) -> ModId {
        self.modules.push(Module {
            parent,
            file: file.to_string(),
            children: BTreeMap::new(),
            items: BTreeSet::new(),
            externs: BTreeSet::new(),
            imports: Vec::new(),
            local_imports: Vec::new(),
            body: Vec::new(),
        });
        self.modules.len() - 1
    }

    fn parse(&mut self, file: &str) -> Result<syn::File, Error> {
        let text = self.tree.text(file).unwrap_or_default();
        let lines = Lines::new(text);
        match syn::parse_file(text) {
            Ok(parsed) => {
                self.lines.insert(file.to_string(), lines);
                Ok(parsed)
            }
            Err(e) => Err(Error::Parse {
                path: file.to_string(),
                line: lines.parse_error(text),
                message: e.to_string(),
            }),
        }
    }

    /// Fills module `id` with the items of `parsed`, the content of `file`,
    /// whose `mod x;` children are looked up in `child_dir`.
    fn load(
        &mut self,
        id: ModId,
        parsed: syn::File,
        file: &str,
        child_dir: &str,
    ) -> Result<(), Error> {
        self.loading.push(file.to_string());
        let filled = self.fill(id, parsed.items, file, child_dir, false);
        self.loading.pop();
        filled
    }

    fn fill(
        &mut self,
        id: ModId,
        items: Vec<Item>,
        file: &str,
        child_dir: &str,
        inline: bool,
    ) -> Result<(), Error> {
        for item in items {
            if is_test_only(item_attrs(&item)) {
                continue;
            }
            match item {
                Item::Mod(m) => self.child(id, m, file, child_dir, inline)?,
                Item::Use(u) => {
                    let public = !matches!(u.vis, Visibility::Inherited);
                    let mut prefix = Vec::new();
                    if u.leading_colon.is_some() {
                        prefix.push("::".to_string());
                    }
                    flatten(&u.tree, &mut prefix, public, &mut self.modules[id].imports);
                }
                Item::ExternCrate(e) => {
                    let name = e.rename.map_or(e.ident, |(_, alias)| alias);
                    self.modules[id].externs.insert(name.to_string());
                }
                other => {
                    let module = &mut self.modules[id];
                    module.items.extend(item_names(&other));
                    BlockUses {
                        out: &mut module.local_imports,
                    }
                    .visit_item(&other);
                    module.body.push(other);
                }
            }
        }
        Ok(())
    }

    fn child(
        &mut self,
        parent: ModId,
        m: syn::ItemMod,
        file: &str,
        child_dir: &str,
        inline: bool,
    ) -> Result<(), Error> {
        let name = m.ident.to_string();
        let path_attr = path_attr(&m.attrs);
        if let Some((_, items)) = m.content {
            let id = self.new_module(Some(parent), file);
            self.modules[parent].children.insert(name.clone(), id);
            let dir = join(child_dir, path_attr.as_deref().unwrap_or(&name)).unwrap_or_default();
            return self.fill(id, items, file, &dir, true);
        }
        let candidates: Vec<String> = match &path_attr {
            Some(p) => {
                let base = if inline { child_dir } else { parent_dir(file) };
                join(base, p).into_iter().collect()
            }
            None => [format!("{name}.rs"), format!("{name}/mod.rs")]
                .iter()
                .filter_map(|c| join(child_dir, c))
                .collect(),
        };
        let Some(found) = candidates.iter().find(|c| self.tree.contains(c)).cloned() else {
            return Err(Error::MissingModule {
                path: file.to_string(),
                line: self.lines.get(file).map_or(1, |l| l.mod_decl(&name)),
                name,
                looked_for: candidates.join(", "),
            });
        };
        let is_mod_rs = found == "mod.rs" || found.ends_with("/mod.rs");
        let sub_dir = if path_attr.is_some() || is_mod_rs {
            parent_dir(&found).to_string()
        } else {
            found.trim_end_matches(".rs").to_string()
        };
        if self.loading.contains(&found) {
            return Ok(());
        }
        let parsed = self.parse(&found)?;
        // A file that is test-only as a whole (`#![cfg(test)]`).
        if is_test_only(&parsed.attrs) {
            return Ok(());
        }
        let id = self.new_module(Some(parent), &found);
        self.modules[parent].children.insert(name, id);
        self.load(id, parsed, &found, &sub_dir)
    }
}

/// Collects the `use` declarations inside an item's functions and blocks.
struct BlockUses<'a> {
    out: &'a mut Vec<Import>,
}

impl<'ast> Visit<'ast> for BlockUses<'_> {
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

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut prefix = Vec::new();
        if u.leading_colon.is_some() {
            prefix.push("::".to_string());
        }
        flatten(&u.tree, &mut prefix, false, self.out);
    }

    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

/// One [`Import`] per name (or glob) of a use tree under `prefix`.
fn flatten(tree: &UseTree, prefix: &mut Vec<String>, public: bool, out: &mut Vec<Import>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, public, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let (binding, path) = named(prefix, &n.ident, &n.ident);
            out.push(Import {
                binding,
                path,
                glob: false,
                public,
            });
        }
        UseTree::Rename(r) => {
            let (binding, path) = named(prefix, &r.ident, &r.rename);
            out.push(Import {
                binding,
                path,
                glob: false,
                public,
            });
        }
        UseTree::Glob(_) => out.push(Import {
            binding: None,
            path: prefix.clone(),
            glob: true,
            public,
        }),
        UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, public, out);
            }
        }
    }
}

/// The binding and path of `prefix::ident as binding` (`self` names the
/// prefix itself; `_` binds nothing).
fn named(
    prefix: &[String],
    ident: &syn::Ident,
    binding: &syn::Ident,
) -> (Option<String>, Vec<String>) {
    let mut path = prefix.to_vec();
    let bound = if ident == "self" && binding == "self" {
        prefix.last().cloned()
    } else {
        Some(binding.to_string())
    };
    if ident != "self" {
        path.push(ident.to_string());
    }
    (bound.filter(|b| b != "_"), path)
}

/// The value of a `#[path = "..."]` attribute.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Whether some `#[cfg(...)]` of `attrs` holds only under `cfg(test)`:
/// `test`, `all(.., test, ..)`, or `any(..)` of such.
pub(crate) fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<Meta>()
                .is_ok_and(|meta| requires_test(&meta))
    })
}

fn requires_test(meta: &Meta) -> bool {
    let nested = |list: &syn::MetaList| -> Vec<Meta> {
        list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            .map(|p| p.into_iter().collect())
            .unwrap_or_default()
    };
    match meta {
        Meta::Path(p) => p.is_ident("test"),
        Meta::List(list) if list.path.is_ident("all") => nested(list).iter().any(requires_test),
        Meta::List(list) if list.path.is_ident("any") => {
            let all = nested(list);
            !all.is_empty() && all.iter().all(requires_test)
        }
        _ => false,
    }
}

/// The attributes of an item.
pub(crate) fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of an item of an `impl` block.
pub(crate) fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(i) => &i.attrs,
        ImplItem::Fn(i) => &i.attrs,
        ImplItem::Type(i) => &i.attrs,
        ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The names an item defines in its module.
fn item_names(item: &Item) -> Vec<String> {
    let ident = match item {
        Item::Const(i) => Some(&i.ident),
        Item::Enum(i) => Some(&i.ident),
        Item::Fn(i) => Some(&i.sig.ident),
        Item::Static(i) => Some(&i.ident),
        Item::Struct(i) => Some(&i.ident),
        Item::Trait(i) => Some(&i.ident),
        Item::TraitAlias(i) => Some(&i.ident),
        Item::Type(i) => Some(&i.ident),
        Item::Union(i) => Some(&i.ident),
        Item::Macro(i) => i.ident.as_ref(),
        Item::ForeignMod(f) => {
            return f
                .items
                .iter()
                .filter_map(|i| match i {
                    syn::ForeignItem::Fn(f) => Some(f.sig.ident.to_string()),
                    syn::ForeignItem::Static(s) => Some(s.ident.to_string()),
                    syn::ForeignItem::Type(t) => Some(t.ident.to_string()),
                    _ => None,
                })
                .collect();
        }
        _ => None,
    };
    ident
        .map(ToString::to_string)
        .into_iter()
        .filter(|n| n != "_")
        .collect()
}
