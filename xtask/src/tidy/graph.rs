//! The import graph of one tree of modules (a crate's Rust, a Python package, the child's Python) and
//! its cycles, at every depth: inside each module with children, among those children.
//!
//! The graph knows no language: [`super::rust`] and [`super::python`] turn files into [`SourceFile`]s
//! whose references are already absolute module paths.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

/// One tree's files, each with its module path, the paths it names and the names it binds.
#[derive(Debug)]
pub(super) struct ModuleGraph {
    /// Where the tree is, for messages (`crates/x/src`).
    base: String,
    /// What to call the tree's root in messages, when not `base/`.
    root_place: Option<String>,
    files: Vec<SourceFile>,
    /// Every module a file is, and every module above one.
    modules: BTreeSet<Vec<String>>,
    /// What a module binds a name to (`use a::B as C;`, `from a import b`): `(module, name)` to the
    /// absolute path it stands for.
    bindings: BTreeMap<(Vec<String>, String), Vec<String>>,
}

/// One file of the tree.
#[derive(Debug)]
pub(super) struct SourceFile {
    /// Relative to the workspace root, for messages.
    pub(super) shown: String,
    /// The module the file is: `[]` for the tree's root (`lib.rs`), `["x"]` for `x.rs`, `x/mod.rs`,
    /// `x.py` or `x/__init__.py`, `["x", "c"]` for `x/c.rs` …
    pub(super) module: Vec<String>,
    /// Every path the file names that could lead into the tree, resolved to an absolute module path.
    pub(super) references: Vec<Reference>,
    /// The names the module itself binds to other paths, resolved: a name used through one of these
    /// (a re-export) also leads to where it points.
    pub(super) bindings: Vec<(String, Vec<String>)>,
}

/// A path one file names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reference {
    /// Absolute, from the tree's root.
    pub(super) path: Vec<String>,
    pub(super) line: usize,
    /// As written, for messages (`super::x::Y`, `..x.y`).
    pub(super) written: String,
}

/// Modules inside one module that import each other in a circle.
#[derive(Debug, Clone)]
pub(super) struct Cycle {
    /// The module they are children of, as a place (`crates/x/src/egress/`).
    pub(super) place: String,
    /// Every module of the circle (its strongly connected component).
    pub(super) modules: BTreeSet<String>,
    /// The circle, its edges and where each comes from, and what to do.
    pub(super) message: String,
}

/// Where an edge comes from: the first place one module names the other.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Evidence {
    file: String,
    line: usize,
    written: String,
}

type Edges = BTreeMap<(String, String), Evidence>;

/// How many re-exports a name is followed through before giving up (a chain this long is a loop).
const MAX_HOPS: usize = 16;

impl ModuleGraph {
    /// The graph of `files`, shown in messages under `base`.
    pub(super) fn new(base: impl Into<String>, files: Vec<SourceFile>) -> Self {
        let mut modules = BTreeSet::from([Vec::new()]);
        let mut bindings = BTreeMap::new();
        for file in &files {
            for depth in 0..=file.module.len() {
                modules.insert(file.module[..depth].to_vec());
            }
            for (name, target) in &file.bindings {
                bindings
                    .entry((file.module.clone(), name.clone()))
                    .or_insert_with(|| target.clone());
            }
        }
        Self {
            base: base.into(),
            root_place: None,
            files,
            modules,
            bindings,
        }
    }

    /// The graph, its root called `place` in messages (a tree that is not one directory).
    pub(super) fn root_shown_as(mut self, place: impl Into<String>) -> Self {
        self.root_place = Some(place.into());
        self
    }

    /// The cycles among the children of every module of the tree, the root first, then by path.
    pub(super) fn cycles(&self) -> Vec<Cycle> {
        let followed: Vec<Vec<Vec<Vec<String>>>> = self
            .files
            .iter()
            .map(|f| {
                f.references
                    .iter()
                    .map(|r| self.followed(&r.path))
                    .collect()
            })
            .collect();
        let mut cycles = Vec::new();
        for parent in self.modules.iter().filter(|m| self.has_children(m)) {
            let (nodes, edges) = self.level(parent, &followed);
            let place = self.place(parent);
            for (cycle, component) in find_cycles(&nodes, &edges) {
                let message = describe(&place, &cycle, &component, &edges);
                cycles.push(Cycle {
                    place: place.clone(),
                    modules: component,
                    message,
                });
            }
        }
        cycles
    }

    fn has_children(&self, module: &[String]) -> bool {
        self.files
            .iter()
            .any(|f| f.module.len() > module.len() && f.module[..module.len()] == *module)
    }

    fn place(&self, parent: &[String]) -> String {
        if let (true, Some(place)) = (parent.is_empty(), &self.root_place) {
            place.clone()
        } else if parent.is_empty() {
            format!("{}/", self.base)
        } else {
            format!("{}/{}/", self.base, parent.join("/"))
        }
    }

    /// `path` and every path it leads to through bindings: `crate::Name` where the root binds `Name`
    /// to `a::Name` also names `a::Name`, and so on down a chain of re-exports.
    fn followed(&self, path: &[String]) -> Vec<Vec<String>> {
        let mut all = vec![path.to_vec()];
        let mut at = path.to_vec();
        for _ in 0..MAX_HOPS {
            if self.modules.contains(&at) {
                break; // a module: nothing bound to follow
            }
            // The deepest module the path goes through binds (or defines) its next segment.
            let Some(depth) = (0..at.len())
                .rev()
                .find(|d| self.modules.contains(&at[..*d]))
            else {
                break;
            };
            let key = (at[..depth].to_vec(), at[depth].clone());
            let Some(target) = self.bindings.get(&key) else {
                break; // defined there, or brought in by a glob
            };
            let mut next = target.clone();
            next.extend(at[depth + 1..].iter().cloned());
            if all.contains(&next) {
                break;
            }
            all.push(next.clone());
            at = next;
        }
        all
    }

    /// The nodes (children of module `parent`) and the edges between them.
    fn level(
        &self,
        parent: &[String],
        followed: &[Vec<Vec<Vec<String>>>],
    ) -> (BTreeSet<String>, Edges) {
        let depth = parent.len();
        let child_of = |module: &[String]| -> Option<String> {
            (module.len() > depth && module[..depth] == *parent).then(|| module[depth].clone())
        };
        let nodes: BTreeSet<String> = self
            .files
            .iter()
            .filter_map(|f| child_of(&f.module))
            .collect();
        let mut edges = Edges::new();
        for (file, followed) in self.files.iter().zip(followed) {
            // A file deeper than the level's nodes belongs to one node; the parent's root file to none.
            let Some(from) = child_of(&file.module) else {
                continue;
            };
            for (reference, paths) in file.references.iter().zip(followed) {
                for to in paths.iter().filter_map(|p| child_of(p)) {
                    if to != from && nodes.contains(&to) {
                        edges.entry((from.clone(), to)).or_insert_with(|| Evidence {
                            file: file.shown.clone(),
                            line: reference.line,
                            written: reference.written.clone(),
                        });
                    }
                }
            }
        }
        (nodes, edges)
    }
}

/// The message for one circle: the circle, each of its edges with where it comes from, the other
/// imports among its modules, and what to do.
fn describe(place: &str, cycle: &[String], component: &BTreeSet<String>, edges: &Edges) -> String {
    let mut text = format!(
        "modules of {place} import each other in a circle: {}",
        cycle.join(" -> ")
    );
    let shown_edge = |text: &mut String, (from, to): &(String, String)| {
        if let Some(e) = edges.get(&(from.clone(), to.clone())) {
            let _ = write!(
                text,
                "\n    {from} -> {to}: {}:{} names `{}`",
                e.file, e.line, e.written
            );
        }
    };
    let on_cycle: Vec<(String, String)> = cycle
        .windows(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    for edge in &on_cycle {
        shown_edge(&mut text, edge);
    }
    let others: Vec<&(String, String)> = edges
        .keys()
        .filter(|(from, to)| component.contains(from) && component.contains(to))
        .filter(|edge| !on_cycle.contains(edge))
        .collect();
    if !others.is_empty() {
        let _ = write!(
            text,
            "\n  The circle takes in {} modules ({}); the other imports among them:",
            component.len(),
            component.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        for edge in others {
            shown_edge(&mut text, edge);
        }
    }
    text.push_str(
        "\n  Dependencies between modules must point one way (STYLE.md 14). Move what both sides \
         need into a leaf module that both import (types many modules share, like a request, an \
         event or a config, belong there, not in the hub that uses them), or move a helper into the \
         module that owns its job.",
    );
    text
}

/// One shortest cycle per strongly connected component of more than one node (starting and ending at its
/// smallest node), with the component.
fn find_cycles(nodes: &BTreeSet<String>, edges: &Edges) -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from.as_str()).or_default().push(to.as_str());
    }
    let reaches = |start: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([start]);
        while let Some(n) = queue.pop_front() {
            for &m in next.get(n).map(Vec::as_slice).unwrap_or_default() {
                if seen.insert(m.to_owned()) {
                    queue.push_back(m);
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&str, BTreeSet<String>> =
        nodes.iter().map(|n| (n.as_str(), reaches(n))).collect();
    let mut done = BTreeSet::new();
    let mut cycles = Vec::new();
    for start in nodes {
        if done.contains(start) || !reach[start.as_str()].contains(start) {
            continue;
        }
        // Its component: the nodes it reaches that reach it back.
        let component: BTreeSet<&str> = reach[start.as_str()]
            .iter()
            .map(String::as_str)
            .filter(|n| reach[n].contains(start))
            .collect();
        done.extend(component.iter().map(|n| (*n).to_owned()));
        let members: BTreeSet<String> = component.iter().map(|n| (*n).to_owned()).collect();
        // The shortest way around, by breadth-first search inside the component.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start.as_str()]);
        'search: while let Some(n) = queue.pop_front() {
            for &m in next.get(n).map(Vec::as_slice).unwrap_or_default() {
                if !component.contains(m) {
                    continue;
                }
                if m == start {
                    let mut cycle = vec![start.clone()];
                    let mut at = n;
                    while at != start {
                        cycle.push(at.to_owned());
                        at = parent[at];
                    }
                    cycle.push(start.clone());
                    cycle.reverse();
                    cycles.push((cycle, members.clone()));
                    break 'search;
                }
                if !parent.contains_key(m) {
                    parent.insert(m, n);
                    queue.push_back(m);
                }
            }
        }
    }
    cycles
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(dotted: &str) -> Vec<String> {
        dotted
            .split('.')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// A file of module `module` naming each of `names` (dotted, absolute) on lines 1, 2, …, and
    /// binding each `(name, dotted)` of `binds`.
    fn file(module: &str, names: &[&str], binds: &[(&str, &str)]) -> SourceFile {
        SourceFile {
            shown: format!("src/{}.x", module.replace('.', "/")),
            module: path(module),
            references: names
                .iter()
                .enumerate()
                .map(|(i, n)| Reference {
                    path: path(n),
                    line: i + 1,
                    written: (*n).to_owned(),
                })
                .collect(),
            bindings: binds
                .iter()
                .map(|(n, p)| ((*n).to_owned(), path(p)))
                .collect(),
        }
    }

    fn cycles_of(files: Vec<SourceFile>) -> Vec<Cycle> {
        ModuleGraph::new("src", files).cycles()
    }

    #[test]
    fn a_circle_three_modules_down_is_found_among_its_siblings() {
        let cycles = cycles_of(vec![
            file("", &[], &[]),
            file("a", &[], &[]),
            file("a.b", &[], &[]),
            file("a.b.c", &[], &[]),
            file("a.b.c.x", &["a.b.c.y.f"], &[]),
            file("a.b.c.y", &["a.b.c.x.g"], &[]),
            file("a.b.c.z", &["a.b.c.x.g"], &[]),
        ]);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].place, "src/a/b/c/");
        assert_eq!(
            cycles[0].modules,
            BTreeSet::from(["x".to_owned(), "y".to_owned()])
        );
        let m = &cycles[0].message;
        assert!(m.contains("modules of src/a/b/c/ import each other in a circle: x -> y -> x"));
        assert!(
            m.contains("x -> y: src/a/b/c/x.x:1 names `a.b.c.y.f`"),
            "{m}"
        );
        assert!(
            m.contains("y -> x: src/a/b/c/y.x:1 names `a.b.c.x.g`"),
            "{m}"
        );
    }

    #[test]
    fn a_path_into_a_siblings_descendant_is_an_edge_to_that_sibling() {
        // p/q/deep/er.x names p/r/s/t; p/r/s.x names p/q/deep: q and r import each other inside p,
        // though no file of one names the other's own file.
        let cycles = cycles_of(vec![
            file("p", &[], &[]),
            file("p.q", &[], &[]),
            file("p.q.deep", &[], &[]),
            file("p.q.deep.er", &["p.r.s.t.Item"], &[]),
            file("p.r", &[], &[]),
            file("p.r.s", &["p.q.deep.Thing"], &[]),
            file("p.r.s.t", &[], &[]),
        ]);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].place, "src/p/");
        assert!(
            cycles[0].message.contains(": q -> r -> q\n"),
            "{}",
            cycles[0].message
        );
        assert!(
            cycles[0]
                .message
                .contains("q -> r: src/p/q/deep/er.x:1 names `p.r.s.t.Item`"),
            "{}",
            cycles[0].message
        );
    }

    #[test]
    fn a_name_is_followed_through_a_chain_of_re_exports() {
        // The root binds `Plan` to `a::Plan`, a binds it to `a::inner::Plan`: b naming `crate::Plan`
        // depends on a (one level) and nothing inside a depends on b.
        let files = vec![
            file("", &[], &[("Plan", "a.Plan")]),
            file("a", &[], &[("Plan", "a.inner.Plan")]),
            file("a.inner", &["b.Helper"], &[]),
            file("a.other", &[], &[]),
            file("b", &["Plan.new"], &[]),
        ];
        let graph = ModuleGraph::new("src", files);
        assert_eq!(
            graph.followed(&path("Plan.new")),
            [
                path("Plan.new"),
                path("a.Plan.new"),
                path("a.inner.Plan.new")
            ]
        );
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(cycles[0].message.contains(": a -> b -> a\n"));
        assert!(cycles[0]
            .message
            .contains("b -> a: src/b.x:1 names `Plan.new`"));
    }

    #[test]
    fn a_binding_loop_ends() {
        let graph = ModuleGraph::new(
            "src",
            vec![
                file("", &[], &[("A", "m.B")]),
                file("m", &[], &[("B", "A")]),
            ],
        );
        assert_eq!(graph.followed(&path("A")), [path("A"), path("m.B")]);
    }

    #[test]
    fn the_longest_circle_is_shown_as_its_shortest_way_around() {
        let cycles = cycles_of(vec![
            file("", &[], &[]),
            file("a", &["b.X", "c.Y"], &[]),
            file("b", &["c.X"], &[]),
            file("c", &["a.X"], &[]),
            file("d", &["a.X"], &[]),
        ]);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        let m = &cycles[0].message;
        assert!(m.contains(": a -> c -> a\n"), "{m}");
        assert!(
            m.contains("takes in 3 modules (a, b, c); the other imports among them:"),
            "{m}"
        );
        assert!(m.contains("a -> b: src/a.x:1"), "{m}");
        assert!(!m.contains("d ->"), "d is not in the circle: {m}");
        assert!(m.contains("leaf module"), "{m}");
    }

    #[test]
    fn a_root_file_has_no_edges_and_names_outside_the_tree_lead_nowhere() {
        let cycles = cycles_of(vec![
            file("", &["a.X", "b.Y"], &[]),
            file("a", &["b.Y", "std.fmt"], &[]),
            file("b", &["Missing"], &[]),
        ]);
        assert!(cycles.is_empty(), "{cycles:?}");
    }
}
