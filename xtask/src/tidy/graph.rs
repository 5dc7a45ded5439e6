//! The import graph of one crate's modules, and its cycles.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::rust_files;
use super::scan::Scan;

/// One crate's source files, each with its module path and the paths it names.
#[derive(Debug, Default)]
pub(super) struct ModuleGraph {
    files: Vec<SourceFile>,
}

#[derive(Debug)]
struct SourceFile {
    /// Relative to `src/`, for messages.
    shown: String,
    /// The module the file is: `[]` for `lib.rs`, `["x"]` for `x.rs` and `x/mod.rs`, `["x", "c"]` …
    module: Vec<String>,
    scan: Scan,
}

/// Where an edge comes from: the first place one module names the other.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Evidence {
    file: String,
    line: usize,
    path: String,
}

type Edges = BTreeMap<(String, String), Evidence>;

impl ModuleGraph {
    pub(super) fn scan(src: &Path) -> Result<Self> {
        let mut paths = Vec::new();
        rust_files(src, &mut paths)?;
        let mut files = Vec::new();
        for path in paths {
            let relative = path.strip_prefix(src).unwrap_or(&path);
            let Some(module) = module_of(relative) else {
                continue;
            };
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            files.push(SourceFile {
                shown: relative.display().to_string(),
                module,
                scan: Scan::of(&text),
            });
        }
        Ok(Self { files })
    }

    #[cfg(test)]
    fn from_sources(sources: &[(&str, &str)]) -> Self {
        let files = sources
            .iter()
            .filter_map(|(path, text)| {
                Some(SourceFile {
                    shown: (*path).to_owned(),
                    module: module_of(Path::new(path))?,
                    scan: Scan::of(text),
                })
            })
            .collect();
        Self { files }
    }

    /// The cycles at the top level and inside each directory module, as messages.
    pub(super) fn cycles(&self, shown_src: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let mut levels = vec![Vec::new()];
        levels.extend(
            self.files
                .iter()
                .filter(|f| f.module.len() >= 2)
                .map(|f| f.module[..1].to_vec())
                .collect::<BTreeSet<_>>(),
        );
        for parent in levels {
            let (nodes, edges) = self.level(&parent);
            for (cycle, component) in find_cycles(&nodes, &edges) {
                let place = if parent.is_empty() {
                    format!("{shown_src}/")
                } else {
                    format!("{shown_src}/{}/", parent.join("/"))
                };
                let mut text = format!(
                    "modules of {place} import each other in a circle: {}",
                    cycle.join(" -> ")
                );
                let shown_edge = |text: &mut String, (from, to): &(String, String)| {
                    if let Some(e) = edges.get(&(from.clone(), to.clone())) {
                        let _ = write!(
                            text,
                            "\n    {from} -> {to}: {shown_src}/{}:{} names `{}`",
                            e.file, e.line, e.path
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
                    "\n  Dependencies between modules must point one way (STYLE.md 14). Move what both \
                     sides need into a leaf module that both import (types many modules share, like a \
                     request, an event or a config, belong there, not in the hub that uses them), or \
                     move a helper into the module that owns its job.",
                );
                problems.push(text);
            }
        }
        problems
    }

    /// The nodes (children of module `parent`) and the edges between them.
    fn level(&self, parent: &[String]) -> (BTreeSet<String>, Edges) {
        let depth = parent.len();
        let child_of = |module: &[String]| -> Option<String> {
            (module.len() > depth && module[..depth] == *parent).then(|| module[depth].clone())
        };
        let nodes: BTreeSet<String> = self
            .files
            .iter()
            .filter_map(|f| child_of(&f.module))
            .collect();
        // What the parent's root file (`lib.rs`, `x/mod.rs` or `x.rs`) re-exports from its children.
        let mut reexports = BTreeMap::new();
        for file in self.files.iter().filter(|f| f.module == parent) {
            for (name, path) in &file.scan.uses {
                let absolute = resolve(&file.module, &path.segments, true);
                if let Some(from) = absolute.as_deref().and_then(child_of) {
                    if nodes.contains(&from) && name != &from {
                        reexports.insert(name.clone(), from);
                    }
                }
            }
        }
        let mut edges = Edges::new();
        for file in &self.files {
            // A file deeper than the level's nodes belongs to one node; the parent's root file to none.
            let Some(from) = child_of(&file.module) else {
                continue;
            };
            for (inside, path) in &file.scan.references {
                let mut module = file.module.clone();
                module.extend(inside.iter().cloned());
                let Some(absolute) = resolve(&module, &path.segments, false) else {
                    continue;
                };
                let Some(first) = absolute.get(depth) else {
                    continue;
                };
                if absolute[..depth] != *parent {
                    continue;
                }
                let to = if nodes.contains(first) {
                    first.clone()
                } else if let Some(from_module) = reexports.get(first) {
                    from_module.clone()
                } else {
                    continue;
                };
                if to != from {
                    edges.entry((from.clone(), to)).or_insert_with(|| Evidence {
                        file: file.shown.clone(),
                        line: path.line,
                        path: path.segments.join("::"),
                    });
                }
            }
        }
        (nodes, edges)
    }
}

/// The module a file under `src/` is; `None` for files that are not modules of the library.
fn module_of(relative: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.first().is_some_and(|p| p == "bin") || (parts.is_empty() && stem == "main") {
        return None;
    }
    if !(parts.is_empty() && stem == "lib") && stem != "mod" {
        parts.push(stem.to_owned());
    }
    Some(parts)
}

/// The absolute module path `segments` names from inside `module`. `use` paths in a root file may also
/// start with a child's name (2018 uniform paths), which `bare_is_child` allows.
fn resolve(module: &[String], segments: &[String], bare_is_child: bool) -> Option<Vec<String>> {
    let (first, rest) = segments.split_first()?;
    let mut absolute = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => {
            let mut base = module.to_vec();
            base.pop()?;
            let mut rest = rest;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend(rest.iter().filter(|s| *s != "self").cloned());
            return Some(base);
        }
        _ if bare_is_child => {
            let mut base = module.to_vec();
            base.push(first.clone());
            base
        }
        _ => return None,
    };
    absolute.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(absolute)
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
                if m != start && !parent.contains_key(m) {
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

    #[test]
    fn files_map_to_modules() {
        let m = |p: &str| module_of(Path::new(p));
        assert_eq!(m("lib.rs"), Some(vec![]));
        assert_eq!(m("run.rs"), Some(vec!["run".to_owned()]));
        assert_eq!(m("sandbox/mod.rs"), Some(vec!["sandbox".to_owned()]));
        assert_eq!(
            m("sandbox/probe.rs"),
            Some(vec!["sandbox".to_owned(), "probe".to_owned()])
        );
        assert_eq!(m("main.rs"), None);
        assert_eq!(m("bin/tool.rs"), None);
        assert_eq!(m("runner.py"), None);
    }

    #[test]
    fn super_and_self_resolve_against_the_module() {
        let module = ["x".to_owned(), "c".to_owned()];
        let r = |p: &str| {
            let segments: Vec<String> = p.split("::").map(str::to_owned).collect();
            resolve(&module, &segments, false).map(|v| v.join("::"))
        };
        assert_eq!(r("super::d::E").as_deref(), Some("x::d::E"));
        assert_eq!(r("super::super::y").as_deref(), Some("y"));
        assert_eq!(r("self::inner").as_deref(), Some("x::c::inner"));
        assert_eq!(r("crate::a::self").as_deref(), Some("a"));
        assert_eq!(r("super::super::super::too_far"), None);
        assert_eq!(r("std::fmt"), None);
    }

    fn cycles_of(sources: &[(&str, &str)]) -> Vec<String> {
        ModuleGraph::from_sources(sources).cycles("src")
    }

    #[test]
    fn a_two_module_circle_is_reported_with_where_each_edge_comes_from() {
        let problems = cycles_of(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::Thing;"),
            ("b.rs", "fn f() {\n    crate::a::helper();\n}"),
            ("c.rs", "use crate::a::X;"),
        ]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let p = &problems[0];
        assert!(p.contains("a -> b -> a"), "{p}");
        assert!(
            p.contains("a -> b: src/a.rs:1 names `crate::b::Thing`"),
            "{p}"
        );
        assert!(
            p.contains("b -> a: src/b.rs:2 names `crate::a::helper`"),
            "{p}"
        );
        assert!(p.contains("leaf module"), "{p}");
    }

    #[test]
    fn one_way_imports_pass() {
        let problems = cycles_of(&[
            ("lib.rs", "mod a; mod b; pub use a::Thing; use crate::b::*;"),
            (
                "a.rs",
                "use crate::b::Thing; #[cfg(test)] mod tests { use super::*; }",
            ),
            ("b.rs", "pub struct Thing; use crate::Error;"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn a_name_the_root_re_exports_leads_to_the_module_that_defines_it() {
        let problems = cycles_of(&[
            (
                "lib.rs",
                "mod a; mod b;\npub use a::{Request as Req, Other};\npub use b::Thing;",
            ),
            ("a.rs", "use crate::Thing;"),
            ("b.rs", "fn f(r: crate::Req) {}"),
        ]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("a -> b -> a"), "{}", problems[0]);
        assert!(problems[0].contains("`crate::Req`"), "{}", problems[0]);
    }

    #[test]
    fn the_longest_circle_is_shown_as_its_shortest_way_around() {
        let problems = cycles_of(&[
            ("lib.rs", ""),
            ("a.rs", "use crate::b::X; use crate::c::Y;"),
            ("b.rs", "use crate::c::X;"),
            ("c.rs", "use crate::a::X;"),
            ("d.rs", "use crate::a::X;"),
        ]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains(": a -> c -> a\n"), "{}", problems[0]);
        assert!(
            problems[0].contains("takes in 3 modules (a, b, c); the other imports among them:"),
            "{}",
            problems[0]
        );
        assert!(
            problems[0].contains("a -> b: src/a.rs:1"),
            "{}",
            problems[0]
        );
        assert!(
            !problems[0].contains("d ->"),
            "d is not in the circle: {}",
            problems[0]
        );
    }

    #[test]
    fn children_of_a_directory_module_are_checked_one_level_down() {
        let problems = cycles_of(&[
            ("lib.rs", "mod sandbox; mod run;"),
            ("run.rs", "use crate::sandbox::Plan;"),
            (
                "sandbox/mod.rs",
                "mod probe; mod decide; pub use decide::Plan;",
            ),
            ("sandbox/probe.rs", "use super::decide::Layers;"),
            ("sandbox/decide.rs", "use crate::sandbox::probe::Probe;"),
            ("sandbox/seccomp.rs", "use super::Plan;\nuse crate::run::X;"),
        ]);
        // sandbox <-> run at the top level; probe <-> decide inside sandbox; seccomp -> decide through
        // the re-export is one way.
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0]
                .contains("modules of src/ import each other in a circle: run -> sandbox -> run"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].contains(
                "of src/sandbox/ import each other in a circle: decide -> probe -> decide"
            ),
            "{}",
            problems[1]
        );
        assert!(
            problems[1]
                .contains("probe -> decide: src/sandbox/probe.rs:1 names `super::decide::Layers`"),
            "{}",
            problems[1]
        );
    }
}
