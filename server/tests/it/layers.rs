//! The one-way floors of `server/src`, checked: every file has a floor (ARCHITECTURE.md, "Floors"),
//! imports run downward, the few that run upward are listed here with their reason, no import
//! circle spans more than three files, and the wing rules hold (only the router imports the
//! pipeline; storage, index, embedding and guards import nothing above entries and keys; stages
//! ask the route's adapter in `api/` instead of matching on `Route`).
//!
//! Imports are read with `syn` from the source itself: `use` items and every `crate::`, `super::`
//! and `self::` path in code and types, outside `#[cfg(test)]`. A name a module imports and a child
//! then imports from it is followed to the file that defines it, and a module re-exporting its own
//! children (`pub use child::Item`) is a facade, not a dependency. Paths inside macro calls are not
//! read (they are tokens to `syn`); a stage that names a module only inside `format!` does not
//! depend on it anyway.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Floors, lowest first: each file imports only from its own floor or below (its own module family
/// apart). A file is placed by the longest prefix that matches its path under `server/src`.
const FLOORS: &[(&str, u8)] = &[
    // 1. Small shared names: the clock, the outcome, errors, SSE framing, delivery.
    ("timing.rs", 1),
    ("outcome.rs", 1),
    ("error.rs", 1),
    ("sse.rs", 1),
    ("downstream.rs", 1),
    ("lock.rs", 1),
    ("priority.rs", 1),
    // 2. What a request is: its body, policy, keys and the entry it becomes.
    ("ingress.rs", 2),
    ("policy.rs", 2),
    ("key.rs", 2),
    ("entry.rs", 2),
    // 3. One adapter per API: what differs between the APIs, asked by the cache and the renderer.
    ("api/", 3),
    // 3. Storage, index, embedding, guards: import nothing above floor 2.
    ("store/", 3),
    ("index.rs", 3),
    ("index/", 3),
    ("embed.rs", 3),
    ("guard.rs", 3),
    ("guard/", 3),
    // 4. Settings and observation: the layered config, live settings, the request log, stats, traces.
    ("config.rs", 4),
    ("config/", 4),
    ("live.rs", 4),
    ("verify/settings.rs", 4),
    ("record.rs", 4),
    ("stats.rs", 4),
    ("savings.rs", 4),
    ("otel.rs", 4),
    // 5. The cache and what the lookup consults; the upstream client and the renderer.
    ("cache/", 5),
    ("semantic.rs", 5),
    ("backfill.rs", 5),
    ("reembed.rs", 5),
    ("feedback.rs", 5),
    ("shadow.rs", 5),
    ("replica.rs", 5),
    ("verify/", 5),
    ("upstream.rs", 5),
    ("cors.rs", 5),
    ("render.rs", 5),
    // 6. The gateway's state: one `Arc` per part, assembled at start.
    ("state.rs", 6),
    // 7. The pipeline wing: the stages that take an `Exchange`.
    ("pipeline/", 7),
    // 8. Wiring and operator routes: the router, connections, admin.
    ("serve/", 8),
    ("admin/", 8),
    ("lib.rs", 8),
    ("main.rs", 8),
];

/// Imports allowed to run upward, each with its reason. At most eight (issue 21); one that no
/// longer exists must leave this list too, so that it says what the tree is.
const UPWARD: &[(&str, &str, &str)] = &[];

/// The only files that may name a `Route::` path (a variant or an associated item): the adapters,
/// the file that defines `Route`, and the router that picks a route per URL. Stages ask
/// `api::of(route)` instead, so a new API is a new adapter, not an edit in every stage.
const ROUTE_NAMERS: &[&str] = &["api/", "ingress.rs", "lib.rs"];

/// Files whose imports may only reach floors 1 and 2 (and their own family): the storage, index,
/// embedding and guard rooms are used by the cache and must not know it.
const LOW_ROOMS: &[&str] = &["store", "index.rs", "embed.rs", "guard"];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, as paths relative to `server/src` with `/` separators.
fn rust_files(dir: &Path, base: &Path, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, base, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(base).expect("under src");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The module path of a file: `pipeline/forward.rs` is `[pipeline, forward]`, `store/mod.rs` and
/// `store.rs` are `[store]`, `lib.rs` is the crate root.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn floor_of(file: &str) -> u8 {
    FLOORS
        .iter()
        .filter(|(prefix, _)| {
            file == *prefix || (prefix.ends_with('/') && file.starts_with(prefix))
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, floor)| floor)
        .unwrap_or_else(|| {
            panic!("server/src/{file} has no floor: add it to FLOORS here and to ARCHITECTURE.md")
        })
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// A path one file names, with whether it is a `pub` re-export.
struct Named {
    path: Vec<String>,
    reexport: bool,
}

/// Reads one file's imports: `use` trees and `crate::`/`super::`/`self::` paths.
struct Reader<'a> {
    /// The module being read: the file's, then an inline `mod` inside it while that is read.
    module: Vec<String>,
    children: &'a BTreeSet<String>,
    named: Vec<Named>,
    /// Names this module brings into scope with `use`: name → absolute path.
    scope: HashMap<String, Vec<String>>,
    /// Paths through `Route::` (`Route::Responses`, `ingress::Route::name`) outside tests.
    route_paths: usize,
}

impl Reader<'_> {
    /// An absolute module path for `segments` as written in this module, or `None` for a path into
    /// another crate or to a local item.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.to_vec(),
            "super" => {
                let mut m = self.module.to_vec();
                m.pop();
                m
            }
            child if self.children.contains(child) => {
                let mut m = self.module.to_vec();
                m.push(child.to_owned());
                m.extend(rest.iter().cloned());
                return Some(m);
            }
            _ => return None,
        };
        let mut rest = rest;
        while let Some((s, tail)) = rest.split_first() {
            if s != "super" {
                break;
            }
            base.pop();
            rest = tail;
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, reexport: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, reexport);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut full = prefix.clone();
                if name != "self" {
                    full.push(name.clone());
                }
                let local = if name == "self" {
                    prefix.last().cloned()
                } else {
                    Some(name)
                };
                self.import(full, local, reexport);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.import(full, Some(r.rename.to_string()), reexport);
            }
            syn::UseTree::Glob(_) => self.import(prefix.clone(), None, reexport),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item, reexport);
                }
            }
        }
    }

    fn import(&mut self, written: Vec<String>, local: Option<String>, reexport: bool) {
        if let Some(path) = self.absolute(&written) {
            if let Some(local) = local {
                self.scope.insert(local, path.clone());
            }
            self.named.push(Named { path, reexport });
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        // An inline `mod` (a SIMD kernel's) is a module of its own: `super::` in it is the file's.
        if let syn::Item::Mod(m) = item {
            if m.content.is_some() && !is_cfg_test(&m.attrs) {
                self.module.push(m.ident.to_string());
                syn::visit::visit_item(self, item);
                self.module.pop();
                return;
            }
        }
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_cfg_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        // `use ::name` is another crate, whatever this module's children are called.
        if item.leading_colon.is_some() {
            return;
        }
        let reexport = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &item.tree, reexport);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        // `Route` followed by a segment, written bare or through `ingress`: the type alone (a
        // field's or a parameter's) is no match on the route.
        let through_route = segments
            .windows(2)
            .enumerate()
            .any(|(i, pair)| pair[0] == "Route" && (i == 0 || segments[i - 1] == "ingress"));
        if through_route {
            self.route_paths += 1;
        }
        // `::sled::Error` names the crate even inside `store/`, which has a child called `sled`.
        if segments.len() > 1 && path.leading_colon.is_none() {
            if let Some(abs) = self.absolute(&segments) {
                self.named.push(Named {
                    path: abs,
                    reexport: false,
                });
            }
        }
        syn::visit::visit_path(self, path);
    }
}

/// The import graph of `server/src`: file → the files it imports.
struct Graph {
    files: Vec<String>,
    edges: BTreeMap<String, BTreeSet<String>>,
    /// File → how many `Route::` paths it names outside tests.
    route_paths: BTreeMap<String, usize>,
}

fn read_graph() -> Graph {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    files.sort();
    // The binary's `main.rs` is its own crate: it reaches the library by name, not by `crate::`.
    files.retain(|f| f != "main.rs");
    let module_file: HashMap<Vec<String>, String> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut children: HashMap<Vec<String>, BTreeSet<String>> = HashMap::new();
    for module in module_file.keys() {
        if let Some((last, parent)) = module.split_last() {
            children
                .entry(parent.to_vec())
                .or_default()
                .insert(last.clone());
        }
    }
    let no_children = BTreeSet::new();
    let mut named: HashMap<String, Vec<Named>> = HashMap::new();
    let mut scopes: HashMap<Vec<String>, HashMap<String, Vec<String>>> = HashMap::new();
    let mut route_paths = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(src.join(file)).expect("read source");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let module = module_of(file);
        let mut reader = Reader {
            module: module.clone(),
            children: children.get(&module).unwrap_or(&no_children),
            named: Vec::new(),
            scope: HashMap::new(),
            route_paths: 0,
        };
        reader.visit_file(&ast);
        route_paths.insert(file.clone(), reader.route_paths);
        scopes.insert(module.clone(), reader.scope);
        named.insert(file.clone(), reader.named);
    }
    // The file that defines what `path` names: the deepest module file on it, following a name
    // that module only imports to where it comes from.
    let resolve = |path: &[String]| -> Option<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let depth = (0..=path.len())
                .rev()
                .find(|&n| module_file.contains_key(&path[..n]))?;
            let module = &path[..depth];
            let followed = path
                .get(depth)
                .and_then(|name| scopes.get(module).and_then(|s| s.get(name)))
                .filter(|target| target.as_slice() != path.as_slice());
            match followed {
                Some(target) => {
                    let mut next = target.clone();
                    next.extend(path[depth + 1..].iter().cloned());
                    path = next;
                }
                None => return module_file.get(module).cloned(),
            }
        }
        None
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let out = edges.entry(file.clone()).or_default();
        for n in &named[file] {
            let Some(target) = resolve(&n.path) else {
                continue;
            };
            let target_module = module_of(&target);
            let own_child =
                target_module.len() > module.len() && target_module.starts_with(&module);
            if target == *file || (n.reexport && own_child) {
                continue;
            }
            out.insert(target);
        }
    }
    Graph {
        files,
        edges,
        route_paths,
    }
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: HashMap<&'g str, usize>,
        low: HashMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn connect<'g>(s: &mut State<'g>, v: &'g str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                connect(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for file in &graph.files {
        if !state.index.contains_key(file.as_str()) {
            connect(&mut state, file);
        }
    }
    state.found
}

/// The room a file belongs to for the family exemption: its first path segment (`store/redis.rs`
/// and `store.rs` are both `store`).
fn family(file: &str) -> &str {
    file.split('/')
        .next()
        .map_or(file, |first| first.trim_end_matches(".rs"))
}

#[test]
fn imports_run_down_the_floors_of_server_src() {
    let graph = read_graph();
    assert!(
        graph.files.len() > 40 && graph.edges.values().map(BTreeSet::len).sum::<usize>() > 100,
        "the reader found too few files or imports to be reading the tree: {} files",
        graph.files.len()
    );
    assert!(UPWARD.len() <= 8, "more than eight upward imports listed");
    // A floor that names no file any more is a stale line of the map.
    for (prefix, _) in FLOORS {
        assert!(
            graph
                .files
                .iter()
                .any(|f| f == prefix || (prefix.ends_with('/') && f.starts_with(prefix)))
                || *prefix == "main.rs",
            "FLOORS names {prefix}, which is no longer in server/src"
        );
    }
    let mut problems = Vec::new();
    let mut upward_seen = BTreeSet::new();
    for (from, targets) in &graph.edges {
        let floor = floor_of(from);
        for to in targets {
            let to_floor = floor_of(to);
            if to_floor <= floor || family(from) == family(to) {
                continue;
            }
            match UPWARD.iter().find(|(f, t, _)| f == from && t == to) {
                Some(_) => {
                    upward_seen.insert((from.as_str(), to.as_str()));
                }
                None => problems.push(format!(
                    "{from} (floor {floor}) imports {to} (floor {to_floor}): move the name it needs down, or pass it in"
                )),
            }
        }
    }
    for (from, to, _) in UPWARD {
        if !upward_seen.contains(&(*from, *to)) {
            problems.push(format!(
                "UPWARD lists {from} -> {to}, which no longer exists: remove it"
            ));
        }
    }
    let found = circles(&graph);
    // For the reader of `--nocapture`: what is left of circles, all within the bound.
    eprintln!(
        "{} files, {} imports, circles: {:?}",
        graph.files.len(),
        graph.edges.values().map(BTreeSet::len).sum::<usize>(),
        found
    );
    for circle in found {
        if circle.len() > 3 {
            problems.push(format!(
                "an import circle of {} files: {}",
                circle.len(),
                circle.join(", ")
            ));
        }
    }
    for (from, targets) in &graph.edges {
        for to in targets {
            if to.starts_with("pipeline/") && !from.starts_with("pipeline/") && from != "lib.rs" {
                problems.push(format!(
                    "{from} imports {to}: nothing outside pipeline/ but the router imports it"
                ));
            }
            let low = LOW_ROOMS.iter().any(|room| family(from) == family(room));
            if low && family(from) != family(to) && floor_of(to) > 2 {
                problems.push(format!(
                    "{from} imports {to}: storage, index, embedding and guards import nothing above entries and keys"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the floors of server/src are broken (ARCHITECTURE.md, \"Floors\"):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn stages_ask_the_adapter_instead_of_matching_on_the_route() {
    let graph = read_graph();
    // The reader sees them where they must be: the router's four handlers, the adapters' lookup.
    assert!(graph.route_paths["lib.rs"] >= 4, "{:?}", graph.route_paths);
    assert!(
        graph.route_paths["api/mod.rs"] >= 4,
        "{:?}",
        graph.route_paths
    );
    let stray: Vec<String> = graph
        .route_paths
        .iter()
        .filter(|(file, n)| {
            **n > 0
                && !ROUTE_NAMERS.iter().any(|allowed| {
                    *file == allowed || (allowed.ends_with('/') && file.starts_with(allowed))
                })
        })
        .map(|(file, n)| format!("{file} ({n})"))
        .collect();
    assert!(
        stray.is_empty(),
        "`Route::` outside api/, ingress.rs and lib.rs: ask `api::of(route)` (ARCHITECTURE.md, \"Floors\"): {}",
        stray.join(", ")
    );
}

#[test]
fn the_reader_follows_imports_through_a_module_to_their_file() {
    // Pins what the floor check relies on, on files whose imports are known.
    let graph = read_graph();
    let of = |file: &str| graph.edges.get(file).cloned().unwrap_or_default();
    // `use super::exchange::{Found, How}` and `use super::Exchange` (re-exported by pipeline/mod.rs).
    let lookup = of("pipeline/lookup.rs");
    assert!(lookup.contains("pipeline/exchange.rs"), "{lookup:?}");
    assert!(!lookup.contains("pipeline/mod.rs"), "{lookup:?}");
    // `crate::timing::unix_ms` in code, not in a `use`.
    assert!(of("store/redis.rs").contains("timing.rs"));
    // A module's facade re-exports of its own children are not dependencies on them: cache/mod.rs
    // re-exports `flight::Flight` (and uses it, which is an import of its own child, not a circle).
    assert!(!of("cache/flight.rs").is_empty());
    // `#[cfg(test)]` modules are not read: backfill's tests start the semantic stage.
    assert!(
        !of("backfill.rs").contains("semantic.rs"),
        "{:?}",
        of("backfill.rs")
    );
}
