//! The import check on small synthetic crates.

use super::*;

/// The graph of a library crate made of `files` (its root is
/// `src/lib.rs`).
fn graph(files: &[(&str, &str)]) -> TargetGraph {
    let tree = SourceTree::from_memory(files.iter().copied());
    let target = Target {
        name: "lib".to_string(),
        root: "src/lib.rs".to_string(),
    };
    TargetGraph::build(&tree, "demo", &target).expect("the synthetic crate reads")
}

fn circle_files(graph: &TargetGraph) -> Vec<Vec<String>> {
    graph.circles().into_iter().map(|c| c.files).collect()
}

fn has_edge(graph: &TargetGraph, from: &str, to: &str) -> bool {
    graph.edges.iter().any(|e| e.from == from && e.to == to)
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_two_file_circle_is_found() {
    let g = graph(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "src/b.rs",
            "pub struct B;\nfn make() -> crate::a::A { todo!() }\n",
        ),
    ]);
    let circles = g.circles();
    assert_eq!(circles.len(), 1);
    assert_eq!(circles[0].files, strings(&["src/a.rs", "src/b.rs"]));
    let shown: Vec<(usize, &str)> = circles[0]
        .edges
        .iter()
        .map(|e| (e.line, e.path.as_str()))
        .collect();
    assert_eq!(shown, vec![(1, "use crate::b::B"), (2, "crate::a::A")]);
}

#[test]
fn a_three_file_circle_through_a_reexport_is_found() {
    // a names `crate::facade::B`, which the façade re-exports from its
    // child `b`: the edge goes to the child's file, the façade stays out
    // of it.
    let g = graph(&[
        ("src/lib.rs", "mod a;\nmod c;\nmod facade;\n"),
        ("src/facade/mod.rs", "mod b;\npub(crate) use b::B;\n"),
        ("src/facade/b.rs", "pub(crate) struct B(crate::c::C);\n"),
        (
            "src/c.rs",
            "pub(crate) struct C;\nimpl C {\n    fn a(&self) -> crate::a::A { crate::a::A }\n}\n",
        ),
        (
            "src/a.rs",
            "pub(crate) struct A;\nfn b() -> Option<crate::facade::B> { None }\n",
        ),
    ]);
    assert_eq!(
        circle_files(&g),
        vec![strings(&["src/a.rs", "src/c.rs", "src/facade/b.rs"])]
    );
    assert!(has_edge(&g, "src/a.rs", "src/facade/b.rs"));
    assert!(!has_edge(&g, "src/a.rs", "src/facade/mod.rs"));
}

#[test]
fn a_facades_reexport_of_its_child_alone_makes_no_edge() {
    // The child uses what the façade defines; the façade only re-exports
    // the child's item (at every visibility): no circle.
    let g = graph(&[
        ("src/lib.rs", "mod facade;\npub use facade::Api;\n"),
        (
            "src/facade/mod.rs",
            "mod child;\nmod other;\npub use child::Api;\npub(crate) use child::Two;\npub(super) use self::child::Three;\npub(in crate) use other::Four;\npub(crate) struct Shared;\n",
        ),
        (
            "src/facade/child.rs",
            "use super::Shared;\npub struct Api(Shared);\npub struct Two;\npub struct Three;\n",
        ),
        ("src/facade/other.rs", "pub struct Four(super::Shared);\n"),
    ]);
    assert!(has_edge(&g, "src/facade/child.rs", "src/facade/mod.rs"));
    assert!(!has_edge(&g, "src/facade/mod.rs", "src/facade/child.rs"));
    assert!(!has_edge(&g, "src/facade/mod.rs", "src/facade/other.rs"));
    assert!(!has_edge(&g, "src/lib.rs", "src/facade/child.rs"));
    assert_eq!(circle_files(&g), Vec::<Vec<String>>::new());
}

#[test]
fn a_reexport_of_a_non_descendant_is_an_edge_and_resolves_onward() {
    // `pub use crate::store::Item` in a mod.rs is an ordinary edge; a path
    // through that re-export lands in the store's file, the defining one.
    let g = graph(&[
        ("src/lib.rs", "mod api;\nmod store;\nmod user;\n"),
        ("src/api/mod.rs", "pub(crate) use crate::store::Item;\n"),
        (
            "src/store.rs",
            "pub(crate) struct Item;\nfn f() { let _ = crate::user::go; }\n",
        ),
        (
            "src/user.rs",
            "pub(crate) fn go() -> crate::api::Item { crate::api::Item }\n",
        ),
    ]);
    assert!(has_edge(&g, "src/api/mod.rs", "src/store.rs"));
    assert!(has_edge(&g, "src/user.rs", "src/store.rs"));
    assert!(!has_edge(&g, "src/user.rs", "src/api/mod.rs"));
    assert_eq!(
        circle_files(&g),
        vec![strings(&["src/store.rs", "src/user.rs"])]
    );
}

#[test]
fn a_cfg_test_child_importing_super_glob_creates_no_circle() {
    // Without the exclusion, the `tests` child of `a` and the inline tests
    // of `b` would close a → b → a.
    let g = graph(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "use crate::b::B;\npub(crate) struct A(B);\n#[cfg(test)]\nmod tests;\n",
        ),
        ("src/a/tests.rs", "use super::*;\nuse crate::b::helper;\n"),
        (
            "src/b.rs",
            "pub(crate) struct B;\npub(crate) fn helper() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::a::A;\n}\n#[cfg(all(test, feature = \"x\"))]\nfn only_in_tests() -> crate::a::A { todo!() }\n",
        ),
    ]);
    assert!(has_edge(&g, "src/a.rs", "src/b.rs"));
    assert!(!g.files.iter().any(|f| f == "src/a/tests.rs"));
    assert!(!has_edge(&g, "src/b.rs", "src/a.rs"));
    assert_eq!(circle_files(&g), Vec::<Vec<String>>::new());
}

#[test]
fn a_path_inside_a_macro_invocation_counts() {
    let g = graph(&[
        ("src/lib.rs", "mod a;\nmod holder;\n"),
        (
            "src/a.rs",
            "pub(crate) async fn run(x: u64) {\n    tracing::debug!(holder = %crate::holder::holder_id(x), \"granted\");\n}\n",
        ),
        (
            "src/holder.rs",
            "pub(crate) fn holder_id(x: u64) -> u64 { x }\nasync fn go() {\n    tokio::select! {\n        _ = crate::a::run(1) => {}\n    }\n}\n",
        ),
    ]);
    let circles = g.circles();
    assert_eq!(circles.len(), 1);
    let paths: Vec<&str> = circles[0].edges.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "crate::holder::holder_id (in debug!)",
            "crate::a::run (in select!)"
        ]
    );
}

#[test]
fn a_module_alias_of_use_self_followed_by_its_path_counts() {
    // `use super::scripts::{self, Lua}` brings `scripts` into scope;
    // `scripts::GRANT` then resolves through the façade to the file of
    // `grant`.
    let g = graph(&[
        ("src/lib.rs", "mod backend;\n"),
        ("src/backend/mod.rs", "mod ops;\nmod scripts;\n"),
        (
            "src/backend/ops.rs",
            "use super::scripts::{self, Lua};\npub(crate) struct Op;\nfn grant() -> Lua {\n    Lua(scripts::GRANT)\n}\n",
        ),
        (
            "src/backend/scripts/mod.rs",
            "mod grant;\npub(crate) use grant::GRANT;\npub(crate) struct Lua(pub(crate) &'static str);\n",
        ),
        (
            "src/backend/scripts/grant.rs",
            "pub(crate) const GRANT: &str = \"\";\nfn op() -> Option<crate::backend::ops::Op> { None }\n",
        ),
    ]);
    let edge = g
        .edges
        .iter()
        .find(|e| e.from == "src/backend/ops.rs" && e.to == "src/backend/scripts/grant.rs")
        .expect("scripts::GRANT is an edge to the file of `grant`");
    assert_eq!((edge.line, edge.path.as_str()), (4, "scripts::GRANT"));
    assert_eq!(
        circle_files(&g),
        vec![strings(&[
            "src/backend/ops.rs",
            "src/backend/scripts/grant.rs"
        ])]
    );
}

#[test]
fn modules_external_crates_and_locals_resolve_as_written() {
    // `crate::metrics` names the module itself (an edge to its file);
    // `metrics::counter!` outside the root is the external crate, as are
    // `std::` and `::metrics::`; a local variable named like a child
    // module (`conn.run()`) is no edge.
    let g = graph(&[
        ("src/lib.rs", "mod backend;\npub mod metrics;\nmod user;\n"),
        ("src/metrics.rs", "pub fn family() {}\n"),
        (
            "src/backend/mod.rs",
            "mod conn;\nfn f(conn: Thing) { conn.run(); }\nstruct Thing;\n",
        ),
        ("src/backend/conn.rs", "pub(crate) fn open() {}\n"),
        (
            "src/user.rs",
            "fn f() {\n    metrics::counter!(\"x\").increment(1);\n    ::metrics::gauge!(\"y\");\n    let _ = std::mem::size_of::<u8>();\n    let _ = crate::metrics::family;\n}\nuse crate::metrics as m;\n",
        ),
    ]);
    assert!(!has_edge(&g, "src/backend/mod.rs", "src/backend/conn.rs"));
    let user: Vec<(&str, &str)> = g
        .edges
        .iter()
        .filter(|e| e.from == "src/user.rs")
        .map(|e| (e.to.as_str(), e.path.as_str()))
        .collect();
    assert_eq!(user, vec![("src/metrics.rs", "crate::metrics::family")]);
}

#[test]
fn a_mod_declaration_follows_path_attributes_and_both_layouts() {
    let g = graph(&[
        (
            "src/lib.rs",
            "mod a;\nmod b;\n#[path = \"elsewhere/c_impl.rs\"]\nmod c;\nmod d {\n    mod e;\n}\n",
        ),
        ("src/a.rs", "mod inner;\n"),
        ("src/a/inner.rs", "fn f() -> crate::b::B { todo!() }\n"),
        (
            "src/b/mod.rs",
            "pub(crate) struct B;\nfn g() { crate::c::h(); crate::d::e::x(); }\n",
        ),
        ("src/elsewhere/c_impl.rs", "pub(crate) fn h() {}\n"),
        ("src/d/e.rs", "pub(crate) fn x() {}\n"),
    ]);
    assert_eq!(
        g.files,
        strings(&[
            "src/lib.rs",
            "src/a.rs",
            "src/a/inner.rs",
            "src/b/mod.rs",
            "src/elsewhere/c_impl.rs",
            "src/d/e.rs",
        ])
    );
    assert!(has_edge(&g, "src/a/inner.rs", "src/b/mod.rs"));
    assert!(has_edge(&g, "src/b/mod.rs", "src/elsewhere/c_impl.rs"));
    assert!(has_edge(&g, "src/b/mod.rs", "src/d/e.rs"));
}

#[test]
fn a_missing_module_file_is_an_error() {
    let tree = SourceTree::from_memory([("src/lib.rs", "\nmod gone;\n")]);
    let target = Target {
        name: "lib".to_string(),
        root: "src/lib.rs".to_string(),
    };
    let err = TargetGraph::build(&tree, "demo", &target).expect_err("`gone` has no file");
    let Error::MissingModule {
        path,
        line,
        name,
        looked_for,
    } = err
    else {
        panic!("not a missing module: {err}");
    };
    assert_eq!(
        (path.as_str(), line, name.as_str()),
        ("src/lib.rs", 2, "gone")
    );
    assert_eq!(looked_for, ["src/gone.rs", "src/gone/mod.rs"].join(", "));
}

#[test]
fn a_layer_rule_violation_is_reported_and_an_absent_layer_checks_nothing() {
    let g = graph(&[
        ("src/lib.rs", "mod client;\nmod engine;\nmod store;\n"),
        ("src/client.rs", "pub(crate) struct Client;\n"),
        ("src/engine/mod.rs", "mod run;\n"),
        ("src/engine/run.rs", "pub(crate) fn run() {}\n"),
        ("src/store/mod.rs", "mod redis;\n"),
        (
            "src/store/redis.rs",
            "fn f() { crate::engine::run::run(); }\n",
        ),
    ]);
    const RULES: &[LayerRule] = &[
        LayerRule {
            from: "src/store",
            forbid: &["src/engine", "src/client.rs"],
        },
        LayerRule {
            from: "src/lease",
            forbid: &["src/store"],
        },
    ];
    let violations = layer_violations(&[g], RULES);
    let shown: Vec<(&str, &str, &str, &str, usize, &str)> = violations
        .iter()
        .map(|v| {
            let e = &v.edge;
            (
                v.layer,
                v.forbidden,
                e.from.as_str(),
                e.to.as_str(),
                e.line,
                e.path.as_str(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![(
            "src/store",
            "src/engine",
            "src/store/redis.rs",
            "src/engine/run.rs",
            1,
            "crate::engine::run::run"
        )]
    );
}

#[test]
fn an_inline_module_of_a_facade_reexports_for_its_file() {
    // lib.rs's inline `testing` re-exports an item of the wire module: a
    // re-export of the file's descendants; its function's path is an edge.
    let g = graph(&[
        (
            "src/lib.rs",
            "mod backend;\npub mod testing {\n    pub use crate::backend::wire::*;\n    pub use crate::backend::Fault;\n    pub fn go() { crate::backend::run() }\n}\n",
        ),
        (
            "src/backend/mod.rs",
            "pub(crate) mod wire;\nmod conn;\npub use conn::{Fault, run};\n",
        ),
        ("src/backend/wire.rs", "pub struct Value;\n"),
        (
            "src/backend/conn.rs",
            "pub struct Fault;\npub fn run() {}\n",
        ),
    ]);
    let from_lib: Vec<(&str, &str)> = g
        .edges
        .iter()
        .filter(|e| e.from == "src/lib.rs")
        .map(|e| (e.to.as_str(), e.path.as_str()))
        .collect();
    assert_eq!(
        from_lib,
        vec![("src/backend/conn.rs", "crate::backend::run")]
    );
}

#[test]
fn a_glob_import_is_an_edge_to_its_module_and_its_names_resolve_onward() {
    let g = graph(&[
        ("src/lib.rs", "mod api;\nmod user;\n"),
        (
            "src/api/mod.rs",
            "mod thing;\npub(crate) use thing::Thing;\npub(crate) fn helper() {}\n",
        ),
        ("src/api/thing.rs", "pub(crate) struct Thing;\n"),
        (
            "src/user.rs",
            "use crate::api::*;\n\nfn f() -> Thing {\n    Thing\n}\n",
        ),
    ]);
    let from_user: Vec<(&str, usize, &str)> = g
        .edges
        .iter()
        .filter(|e| e.from == "src/user.rs")
        .map(|e| (e.to.as_str(), e.line, e.path.as_str()))
        .collect();
    assert_eq!(
        from_user,
        vec![
            ("src/api/mod.rs", 1, "use crate::api::*"),
            ("src/api/thing.rs", 3, "Thing"),
        ]
    );
}

#[test]
fn a_file_that_is_test_only_as_a_whole_is_left_out() {
    let g = graph(&[
        (
            "src/lib.rs",
            "mod a;\nmod checks;\nmod inline {\n    #![cfg(test)]\n    fn f() -> crate::a::A { crate::a::A }\n}\n",
        ),
        ("src/a.rs", "pub(crate) struct A;\n"),
        (
            "src/checks.rs",
            "#![cfg(test)]\npub(crate) fn run() { let _ = crate::a::A; }\n",
        ),
    ]);
    assert_eq!(g.files, strings(&["src/lib.rs", "src/a.rs"]));
    assert!(!has_edge(&g, "src/lib.rs", "src/a.rs"));
    assert_eq!(circle_files(&g), Vec::<Vec<String>>::new());
}

#[test]
fn lines_are_found_in_the_text_across_lines_and_spaces() {
    // A name of a multi-line use tree is on its own line; a path in a
    // macro's tokens may have spaces around `::` and span lines; the
    // façade's re-export of `C` (no edge) is not where `C` is used.
    let g = graph(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "pub(crate) fn x() {}\n"),
        ("src/b/mod.rs", "mod c;\npub(crate) use c::C;\n"),
        ("src/b/c.rs", "pub(crate) struct C;\n"),
        (
            "src/c.rs",
            "use super::{\n    a,\n    b::C,\n};\n\nfn f() {\n    m!(\n        crate :: a\n            :: x()\n    );\n}\n",
        ),
    ]);
    let from_c: Vec<(&str, usize, &str)> = g
        .edges
        .iter()
        .filter(|e| e.from == "src/c.rs")
        .map(|e| (e.to.as_str(), e.line, e.path.as_str()))
        .collect();
    assert_eq!(
        from_c,
        vec![
            ("src/a.rs", 2, "use super::a"),
            ("src/b/c.rs", 3, "use super::b::C"),
        ]
    );
    let g = graph(&[
        ("src/lib.rs", "mod a;\n"),
        (
            "src/a.rs",
            "pub(crate) fn x() {}\n\nfn f() {\n    m!(\n        crate :: a\n            :: x()\n    );\n}\n",
        ),
    ]);
    assert!(g.edges.is_empty());
    let g = graph(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "pub(crate) fn x() {}\n"),
        (
            "src/b.rs",
            "fn f() {\n    m!(\n        crate :: a\n            :: x()\n    );\n}\n",
        ),
    ]);
    let shown: Vec<(usize, &str)> = g.edges.iter().map(|e| (e.line, e.path.as_str())).collect();
    assert_eq!(shown, vec![(3, "crate::a::x (in m!)")]);
}

#[test]
fn a_file_that_does_not_parse_is_an_error_at_its_item() {
    let tree = SourceTree::from_memory([
        ("src/lib.rs", "mod a;\n"),
        (
            "src/a.rs",
            "/// Fine.\nfn fine() {}\n\n/// Broken.\nfn broken() {\n    let = 1;\n}\n",
        ),
    ]);
    let target = Target {
        name: "lib".to_string(),
        root: "src/lib.rs".to_string(),
    };
    let err = TargetGraph::build(&tree, "demo", &target).expect_err("module `a` does not parse");
    let Error::Parse { path, line, .. } = err else {
        panic!("not a parse error: {err}");
    };
    // The first line of code of the item the parser stops in (`fn
    // broken`; its `///` comment is no code), not the `let` itself.
    assert_eq!((path.as_str(), line), ("src/a.rs", 5));
}
