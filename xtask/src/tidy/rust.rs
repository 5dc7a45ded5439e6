//! A crate's Rust as an import graph: each file under `src/` a module, each path it names resolved
//! against the module (and the inline modules) it is written in.
//!
//! Module y depends on x when y's files name a path into x: `crate::x::…` (in `use` trees and inline),
//! `super::…` and `self::…` paths that resolve there, and a name some module binds with `use` (a
//! re-export: `crate::Name` where the root has `pub use x::Name`), followed to where it points. The
//! crate's root (`lib.rs`, or `main.rs` without one) and each directory module's own file (`x.rs` or
//! `x/mod.rs`) have no edges at their own level.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};

use super::graph::{ModuleGraph, Reference, SourceFile};
use super::rust_files;
use super::scan::Scan;

/// The graph of the crate whose sources are in `src`, shown in messages as `shown_src`.
pub(super) fn graph(src: &Path, shown_src: &str) -> Result<ModuleGraph> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths)?;
    let has_lib = src.join("lib.rs").is_file();
    let mut sources = Vec::new();
    for path in paths {
        let relative = path.strip_prefix(src).unwrap_or(&path);
        let Some(module) = module_of(relative, has_lib) else {
            continue;
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        sources.push((
            format!("{shown_src}/{}", relative.display()),
            module,
            Scan::of(&text),
        ));
    }
    Ok(from_scans(shown_src, sources))
}

/// The graph of scanned files, each `(shown, module, scan)`.
fn from_scans(shown_src: &str, sources: Vec<(String, Vec<String>, Scan)>) -> ModuleGraph {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(_, m, _)| m.clone()).collect();
    let files = sources
        .into_iter()
        .map(|(shown, module, scan)| {
            let references = scan
                .references
                .iter()
                .filter_map(|(inside, path)| {
                    let mut at = module.clone();
                    at.extend(inside.iter().cloned());
                    Some(Reference {
                        path: resolve(&at, &path.segments)?,
                        line: path.line,
                        written: path.segments.join("::"),
                    })
                })
                .collect();
            let bindings = scan
                .uses
                .iter()
                .filter_map(|(name, path)| {
                    // 2018 paths: `use child::X` names a child module when there is one (else an
                    // extern crate, never ours).
                    let first = path.segments.first()?;
                    let absolute = if is_anchored(first) {
                        resolve(&module, &path.segments)?
                    } else {
                        let mut child = module.clone();
                        child.push(first.clone());
                        if !modules.contains(&child) {
                            return None;
                        }
                        child.extend(path.segments[1..].iter().filter(|s| *s != "self").cloned());
                        child
                    };
                    Some((name.clone(), absolute))
                })
                .collect();
            SourceFile {
                shown,
                module,
                references,
                bindings,
            }
        })
        .collect();
    ModuleGraph::new(shown_src, files)
}

/// The graph of in-memory sources, each `(path under src/, text)`.
#[cfg(test)]
pub(super) fn from_sources(sources: &[(&str, &str)]) -> ModuleGraph {
    let has_lib = sources.iter().any(|(p, _)| *p == "lib.rs");
    let scans = sources
        .iter()
        .filter_map(|(path, text)| {
            Some((
                format!("src/{path}"),
                module_of(Path::new(path), has_lib)?,
                Scan::of(text),
            ))
        })
        .collect();
    from_scans("src", scans)
}

fn is_anchored(first: &str) -> bool {
    matches!(first, "crate" | "super" | "self")
}

/// The module a file under `src/` is; `None` for files that are not modules of the crate's root
/// (`src/bin/`, and `main.rs` beside a `lib.rs`: another crate).
fn module_of(relative: &Path, has_lib: bool) -> Option<Vec<String>> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.first().is_some_and(|p| p == "bin") || (parts.is_empty() && stem == "main" && has_lib)
    {
        return None;
    }
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if !root && stem != "mod" {
        parts.push(stem.to_owned());
    }
    Some(parts)
}

/// The absolute module path an anchored path (`crate::`, `super::`, `self::`) names from inside
/// `module`; `None` for any other path, or a `super` past the root.
fn resolve(module: &[String], segments: &[String]) -> Option<Vec<String>> {
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
        _ => return None,
    };
    absolute.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(absolute)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_map_to_modules() {
        let m = |p: &str| module_of(Path::new(p), true);
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
        // A binary crate's root.
        assert_eq!(module_of(Path::new("main.rs"), false), Some(vec![]));
    }

    #[test]
    fn super_and_self_resolve_against_the_module() {
        let module = ["x".to_owned(), "c".to_owned(), "d".to_owned()];
        let r = |p: &str| {
            let segments: Vec<String> = p.split("::").map(str::to_owned).collect();
            resolve(&module, &segments).map(|v| v.join("::"))
        };
        assert_eq!(r("super::e::E").as_deref(), Some("x::c::e::E"));
        assert_eq!(r("super::super::y").as_deref(), Some("x::y"));
        assert_eq!(r("super::super::super::z::Z").as_deref(), Some("z::Z"));
        assert_eq!(r("self::inner").as_deref(), Some("x::c::d::inner"));
        assert_eq!(r("crate::a::self").as_deref(), Some("a"));
        assert_eq!(r("super::super::super::super::too_far"), None);
        assert_eq!(r("std::fmt"), None);
    }

    fn messages(sources: &[(&str, &str)]) -> Vec<String> {
        from_sources(sources)
            .cycles()
            .into_iter()
            .map(|c| c.message)
            .collect()
    }

    #[test]
    fn a_two_module_circle_is_reported_with_where_each_edge_comes_from() {
        let problems = messages(&[
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
    }

    #[test]
    fn one_way_imports_pass() {
        let problems = messages(&[
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
        let problems = messages(&[
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
    fn children_of_a_directory_module_are_checked_one_level_down() {
        let cycles = from_sources(&[
            ("lib.rs", "mod sandbox; mod run;"),
            ("run.rs", "use crate::sandbox::Plan;"),
            (
                "sandbox/mod.rs",
                "mod probe; mod decide; pub use decide::Plan;",
            ),
            ("sandbox/probe.rs", "use super::decide::Layers;"),
            ("sandbox/decide.rs", "use crate::sandbox::probe::Probe;"),
            ("sandbox/seccomp.rs", "use super::Plan;\nuse crate::run::X;"),
        ])
        .cycles();
        // sandbox <-> run at the top level; probe <-> decide inside sandbox; seccomp -> decide through
        // the re-export is one way.
        assert_eq!(cycles.len(), 2, "{cycles:?}");
        assert_eq!(cycles[0].place, "src/");
        assert!(
            cycles[0]
                .message
                .contains("modules of src/ import each other in a circle: run -> sandbox -> run"),
            "{}",
            cycles[0].message
        );
        assert_eq!(cycles[1].place, "src/sandbox/");
        assert!(
            cycles[1].message.contains("decide -> probe -> decide\n"),
            "{}",
            cycles[1].message
        );
        assert!(
            cycles[1]
                .message
                .contains("probe -> decide: src/sandbox/probe.rs:1 names `super::decide::Layers`"),
            "{}",
            cycles[1].message
        );
    }

    #[test]
    fn a_circle_three_directories_down_is_found_with_super_super_paths() {
        let cycles = from_sources(&[
            ("lib.rs", "mod egress;"),
            ("egress/mod.rs", "mod secrets; mod relay;"),
            ("egress/relay.rs", "use super::secrets::proxy::Proxy;"),
            ("egress/secrets/mod.rs", "mod proxy; mod rewrite;"),
            (
                "egress/secrets/proxy/mod.rs",
                "mod conn;\nfn f() {\n    super::rewrite::normalize();\n}",
            ),
            (
                "egress/secrets/proxy/conn.rs",
                "use super::super::rewrite::Rule;",
            ),
            ("egress/secrets/rewrite/mod.rs", "mod rules;"),
            // Three `super`s up from egress/secrets/rewrite/rules to egress, then down again.
            (
                "egress/secrets/rewrite/rules.rs",
                "use super::super::super::secrets::proxy::conn::Conn;",
            ),
        ])
        .cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        let c = &cycles[0];
        assert_eq!(c.place, "src/egress/secrets/");
        assert_eq!(
            c.modules,
            BTreeSet::from(["proxy".to_owned(), "rewrite".to_owned()])
        );
        assert!(
            c.message.contains(": proxy -> rewrite -> proxy\n"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains(
                "rewrite -> proxy: src/egress/secrets/rewrite/rules.rs:1 names \
                 `super::super::super::secrets::proxy::conn::Conn`"
            ),
            "{}",
            c.message
        );
        assert!(
            c.message
                .contains("proxy -> rewrite: src/egress/secrets/proxy/mod.rs:3 names `super::rewrite::normalize`"),
            "{}",
            c.message
        );
    }

    #[test]
    fn a_private_use_in_a_directory_module_is_followed_from_its_children() {
        // engine/mod.rs brings `Budget` in from budget/; engine/run.rs names it as `super::Budget`,
        // so run depends on budget inside engine, and budget on run closes a circle.
        let cycles = from_sources(&[
            ("lib.rs", "mod engine;"),
            ("engine/mod.rs", "mod budget; mod run; use budget::Budget;"),
            ("engine/run.rs", "fn f(b: super::Budget) {}"),
            ("engine/budget.rs", "use super::run::Attempt;"),
        ])
        .cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(
            cycles[0]
                .message
                .contains("run -> budget: src/engine/run.rs:1 names `super::Budget`"),
            "{}",
            cycles[0].message
        );
    }
}
