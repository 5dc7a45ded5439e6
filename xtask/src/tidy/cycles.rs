//! Which import graphs tidy checks, and the circles allowed in them for now.
//!
//! The trees: the Rust of every workspace package (`src/`, as `cargo metadata` lists the members, so
//! a new crate is checked without a change here); the Python that runs in the child (every `.py`
//! under a package's `src/`: the child's code directory holds them side by side and they import each
//! other by bare name); and each package's Python package tree (`python/`, maturin's source
//! directory).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::graph::Cycle;
use super::{python, rust};

/// A circle allowed for now: the module it is inside, as tidy prints it, and every module in it.
#[derive(Debug)]
pub(super) struct KnownCycle {
    pub(super) place: &'static str,
    pub(super) modules: &'static [&'static str],
}

/// Import circles that exist today, each allowed until the restructure that breaks it lands; then
/// its entry goes, and the list ends empty. An entry names its circle exactly: a circle not listed
/// fails, one that gained or lost a module fails, and an entry whose circle no longer exists fails,
/// so the list cannot go stale.
pub(super) const KNOWN_CYCLES: &[KnownCycle] = &[];

/// What messages call the child's code directory.
const CHILD_CODE: &str = "the child's code directory (the .py files under crates/*/src/)";

/// Files written into the child's code directory under another name than their own (see
/// `child/code_dir.rs` in runpython-core).
const CHILD_RENAMES: &[(&str, &str)] =
    &[("crates/runpython-bridge/src/client.py", "runpython_tools")];

/// Where [`KNOWN_CYCLES`] lives, for messages.
const THIS_FILE: &str = "xtask/src/tidy/cycles.rs";

/// The problems of every import graph, and the circles [`KNOWN_CYCLES`] allows (to list, not fail).
pub(super) fn check(root: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let packages = workspace_packages(root)?;
    let mut problems = Vec::new();
    let mut cycles = Vec::new();
    for dir in &packages {
        let src = dir.join("src");
        if src.is_dir() {
            let shown = python::shown(root, &src);
            let graph =
                rust::graph(&src, &shown).with_context(|| format!("scanning {}", src.display()))?;
            cycles.extend(graph.cycles());
        }
    }
    let (files, mut named) = child_files(root, &packages)?;
    problems.append(&mut named);
    let (child, mut unparsed) = python::graph(CHILD_CODE, files)?;
    problems.append(&mut unparsed);
    cycles.extend(child.root_shown_as(CHILD_CODE).cycles());
    for dir in &packages {
        let tree = dir.join("python");
        if tree.is_dir() {
            let files = python::package_files(root, &tree)?;
            let (graph, mut unparsed) = python::graph(&python::shown(root, &tree), files)?;
            problems.append(&mut unparsed);
            cycles.extend(graph.cycles());
        }
    }
    let (mut failed, allowed) = against_known(cycles, KNOWN_CYCLES);
    problems.append(&mut failed);
    Ok((problems, allowed))
}

/// The directory of every package of the workspace, from `cargo metadata`.
fn workspace_packages(root: &Path) -> Result<Vec<PathBuf>> {
    let out = crate::cargo()
        .current_dir(root)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .output()
        .context("cannot start `cargo metadata`")?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("`cargo metadata` printed no JSON")?;
    let mut dirs: Vec<PathBuf> = meta["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            Path::new(p["manifest_path"].as_str()?)
                .parent()
                .map(Path::to_path_buf)
        })
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        bail!("`cargo metadata` lists no package in {}", root.display());
    }
    Ok(dirs)
}

/// The child's modules: every `.py` under a package's `src/`, named by its file name (or its name
/// in [`CHILD_RENAMES`]); with a problem for a rename whose file is gone and for two files of one
/// name.
fn child_files(root: &Path, packages: &[PathBuf]) -> Result<(Vec<python::PyFile>, Vec<String>)> {
    let mut problems = Vec::new();
    for (path, _) in CHILD_RENAMES {
        if !root.join(path).is_file() {
            problems.push(format!(
                "{path} is in CHILD_RENAMES ({THIS_FILE}) but does not exist: update the entry to \
                 where the file moved, or remove it"
            ));
        }
    }
    let mut files: Vec<python::PyFile> = Vec::new();
    for dir in packages {
        let mut paths = Vec::new();
        python::python_files(&dir.join("src"), &mut paths)?;
        for path in paths {
            let shown = python::shown(root, &path);
            let name = match CHILD_RENAMES.iter().find(|(p, _)| *p == shown) {
                Some((_, name)) => (*name).to_owned(),
                None => path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            if let Some(twin) = files.iter().find(|f| f.module == [name.clone()]) {
                problems.push(format!(
                    "{shown} and {} are both the child's module `{name}`: rename one (the child \
                     imports its modules by bare name from one directory)",
                    twin.shown
                ));
                continue;
            }
            files.push(python::PyFile {
                path,
                shown,
                module: vec![name],
                package: false,
            });
        }
    }
    Ok((files, problems))
}

/// The cycles not in `known` as problems, the ones in it to list; and a problem for each entry of
/// `known` whose circle does not exist as listed.
fn against_known(cycles: Vec<Cycle>, known: &[KnownCycle]) -> (Vec<String>, Vec<String>) {
    let matches = |k: &KnownCycle, c: &Cycle| {
        k.place == c.place
            && k.modules
                .iter()
                .map(|m| (*m).to_owned())
                .collect::<BTreeSet<_>>()
                == c.modules
    };
    let mut problems = Vec::new();
    let mut allowed = Vec::new();
    for cycle in &cycles {
        if known.iter().any(|k| matches(k, cycle)) {
            allowed.push(format!(
                "{}\n  Allowed for now: KNOWN_CYCLES in {THIS_FILE} lists it until the restructure \
                 that breaks it.",
                cycle.message
            ));
        } else {
            problems.push(cycle.message.clone());
        }
    }
    for k in known {
        if !cycles.iter().any(|c| matches(k, c)) {
            problems.push(format!(
                "KNOWN_CYCLES in {THIS_FILE} allows a circle of {} in {}, which no longer exists as \
                 listed: remove the entry (a circle that changed is reported on its own and must be \
                 broken, not listed anew)",
                k.modules.join(", "),
                k.place
            ));
        }
    }
    (problems, allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(place: &str, modules: &[&str]) -> Cycle {
        Cycle {
            place: place.to_owned(),
            modules: modules.iter().map(|m| (*m).to_owned()).collect(),
            message: format!("circle of {} in {place}", modules.join(", ")),
        }
    }

    const KNOWN: &[KnownCycle] = &[KnownCycle {
        place: "src/a/",
        modules: &["x", "y"],
    }];

    #[test]
    fn a_listed_circle_is_allowed_and_listed() {
        let (problems, allowed) = against_known(vec![cycle("src/a/", &["y", "x"])], KNOWN);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(allowed.len(), 1);
        assert!(
            allowed[0].contains("Allowed for now: KNOWN_CYCLES"),
            "{allowed:?}"
        );
    }

    #[test]
    fn an_unlisted_circle_fails_and_so_does_one_that_grew() {
        let (problems, allowed) = against_known(
            vec![
                cycle("src/b/", &["p", "q"]),
                cycle("src/a/", &["x", "y", "z"]),
            ],
            KNOWN,
        );
        assert!(allowed.is_empty(), "{allowed:?}");
        // Both circles, and the entry that no longer matches.
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("circle of p, q in src/b/"));
        assert!(problems[1].contains("circle of x, y, z in src/a/"));
        assert!(problems[2].contains("allows a circle of x, y in src/a/, which no longer exists"));
    }

    #[test]
    fn an_entry_whose_circle_is_gone_fails() {
        let (problems, _) = against_known(Vec::new(), KNOWN);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("remove the entry"), "{problems:?}");
    }

    #[test]
    fn every_workspace_package_is_found() {
        let packages = workspace_packages(&crate::root()).unwrap();
        let root = crate::root();
        let shown: Vec<String> = packages.iter().map(|p| python::shown(&root, p)).collect();
        for expected in [
            "crates/runpython-core",
            "crates/runpython-sandbox",
            "tests",
            "xtask",
        ] {
            assert!(
                shown.iter().any(|s| s == expected),
                "{expected} not in {shown:?}"
            );
        }
    }

    #[test]
    fn the_child_modules_are_named_as_the_child_imports_them() {
        let root = crate::root();
        let (files, problems) = child_files(&root, &workspace_packages(&root).unwrap()).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let names: Vec<&str> = files.iter().map(|f| f.module[0].as_str()).collect();
        assert!(names.contains(&"runpython_tools"), "{names:?}");
        assert!(names.contains(&"runpython_runner"), "{names:?}");
        assert!(!names.contains(&"client"), "{names:?}");
    }
}
