//! `cargo xtask tidy`: checks that fail the build on drift in how the code is laid out.
//!
//! - **Import graphs.** No import circle at any depth: inside every module that has children (a
//!   crate's root, a directory module, a Python package), among those children, a child depending on
//!   a sibling when its files name a path into that sibling or anything below it. Checked in the Rust
//!   of every workspace package, the Python that runs in the child, and each Python package tree
//!   (`cycles.rs` says which, and lists the circles allowed until their restructure). Each circle is
//!   printed as `a -> b -> a` with where each edge comes from.
//! - **Long files.** A `.rs` file under `crates/`, `xtask/` or `tests/` over [`MAX_LINES`] lines must say
//!   why in a module doc line starting with `//! Why this file is long:`. No `.rs` or `.py` file there
//!   is over [`HARD_MAX_LINES`] lines, a Rust file's inline tests aside, reason or not.
//! - **The security model's tests.** Every test `docs/security.md` names (`` `path::name` ``) exists.
//! - **Python suites.** The stdlib `unittest` suites of the Python that runs in the child.
//!
//! Rust is read by a small hand-written lexer (`scan.rs`: comments, strings, raw strings, char
//! literals and lifetimes are skipped; inline `mod name { … }` blocks are tracked), not a Rust parser:
//! it reads paths, not types, so a glob import (`use crate::x::*`) counts as an edge to x but the names
//! it brings in do not add edges of their own. Python is read by Python's own parser (`python.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

mod cycles;
mod graph;
mod python;
mod rust;
mod scan;

/// Above this many lines a file must say why it is long.
const MAX_LINES: usize = 700;

/// No source file (Rust or Python) is longer than this, its inline tests (`#[cfg(test)]` and what
/// follows) aside, whatever it says.
const HARD_MAX_LINES: usize = 800;

/// What a long file's module docs must start one line with.
const LONG_FILE_REASON: &str = "//! Why this file is long:";

/// The directories holding the Python suites, relative to the workspace root.
const PYTHON_SUITES: &[&str] = &[
    "crates/runpython-core/tests/python",
    "crates/runpython-bridge/tests/python",
    "crates/runpython-sandbox/tests/python",
];

/// Runs every check, prints every problem, and fails if there was one.
pub(crate) fn tidy() -> Result<()> {
    let root = crate::root();
    let (mut problems, allowed) = cycles::check(&root)?;
    for circle in &allowed {
        eprintln!("tidy: {circle}\n");
    }
    problems.extend(long_files(&root)?);
    problems.extend(security_tests(&root)?);
    for problem in &problems {
        eprintln!("tidy: {problem}\n");
    }
    let python = python_suites(&root);
    if !problems.is_empty() {
        bail!(
            "tidy found {} problem(s) in the layout of the code (listed above)",
            problems.len()
        );
    }
    python
}

fn python_suites(root: &Path) -> Result<()> {
    let python = crate::python3()?;
    for suite in PYTHON_SUITES {
        let dir = root.join(suite);
        crate::step(
            &format!("python tests in {suite}"),
            Command::new(&python)
                .args(["-m", "unittest", "discover", "-s"])
                .arg(&dir)
                .arg("-t")
                .arg(&dir),
        )?;
    }
    Ok(())
}

// ---- the security model's tests ----

/// The page whose every named test must exist.
const SECURITY_MODEL: &str = "docs/security.md";

/// A problem for every `` `path::name` `` in the security model whose file does not exist or does
/// not define `name` (`fn name` in Rust, `def name` in Python).
fn security_tests(root: &Path) -> Result<Vec<String>> {
    let page = std::fs::read_to_string(root.join(SECURITY_MODEL))
        .with_context(|| format!("reading {SECURITY_MODEL}"))?;
    let mut problems = Vec::new();
    let named = named_tests(&page);
    if named.is_empty() {
        problems.push(format!("{SECURITY_MODEL} names no test"));
    }
    for (file, name) in named {
        let text = std::fs::read_to_string(root.join(&file)).unwrap_or_default();
        let defined = text.lines().any(|l| {
            let mut l = l.trim_start();
            for prefix in ["pub(crate) ", "pub ", "async "] {
                l = l.strip_prefix(prefix).unwrap_or(l);
            }
            l.starts_with(&format!("fn {name}(")) || l.starts_with(&format!("def {name}("))
        });
        if !defined {
            problems.push(format!(
                "{SECURITY_MODEL} names `{file}::{name}`, which does not exist: fix the name, or the \
                 claim it backs"
            ));
        }
    }
    Ok(problems)
}

/// Every `` `dir/file.rs::name` `` or `` `dir/file.py::name` `` in a page, in order.
fn named_tests(page: &str) -> Vec<(String, String)> {
    page.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let (file, name) = code.split_once("::")?;
            let is_source = file.ends_with(".rs") || file.ends_with(".py");
            let is_name =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (is_source && is_name && file.contains('/')).then(|| (file.to_owned(), name.to_owned()))
        })
        .collect()
}

// ---- long files ----

/// `path (N lines)` for every long file without its reason.
fn long_files(root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    for dir in ["crates", "xtask", "tests"] {
        source_files(&root.join(dir), true, &mut files)?;
    }
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        if let Some(lines) = over_hard_limit(&text, file.extension().is_some_and(|e| e == "rs")) {
            let shown = file.strip_prefix(root).unwrap_or(&file);
            problems.push(format!(
                "{} has {lines} lines{}, over {HARD_MAX_LINES}: split it by job (STYLE.md 14)",
                shown.display(),
                if file.extension().is_some_and(|e| e == "rs") {
                    " before its inline tests"
                } else {
                    ""
                }
            ));
            continue;
        }
        if file.extension().is_some_and(|e| e == "py") {
            continue; // Python files have only the hard limit
        }
        if let Some(lines) = unexplained_length(&text) {
            let shown = file.strip_prefix(root).unwrap_or(&file);
            problems.push(format!(
                "{} has {lines} lines, over {MAX_LINES}, and does not say why. A file this long usually \
                 holds more than one job (STYLE.md 14): split it by job, or, if it is one job, add a \
                 module doc line starting with `{LONG_FILE_REASON}`",
                shown.display()
            ));
        }
    }
    Ok(problems)
}

/// The line count of a file over [`HARD_MAX_LINES`]; for Rust (`rust`), the lines before its
/// inline tests (`#[cfg(test)]` at the start of a line).
fn over_hard_limit(text: &str, rust: bool) -> Option<usize> {
    let lines = if rust {
        text.lines()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .count()
    } else {
        text.lines().count()
    };
    (lines > HARD_MAX_LINES).then_some(lines)
}

/// The line count of a file over the limit that lacks its reason.
fn unexplained_length(text: &str) -> Option<usize> {
    let lines = text.lines().count();
    let explained = text
        .lines()
        .any(|l| l.trim_start().starts_with(LONG_FILE_REASON));
    (lines > MAX_LINES && !explained).then_some(lines)
}

/// Every `.rs` file under `dir`, build output and hidden directories left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    source_files(dir, false, out)
}

/// Every `.rs` file under `dir` (and `.py` file, with `python`), build output and hidden directories
/// left out.
fn source_files(dir: &Path, python: bool, out: &mut Vec<PathBuf>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(()); // a directory this checkout does not have
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                source_files(&path, python, out)?;
            }
        } else if name.ends_with(".rs") || (python && name.ends_with(".py")) {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_passes_the_hard_limit_but_inline_tests_do_not_count() {
        let code = "fn f() {}\n".repeat(HARD_MAX_LINES + 1);
        assert_eq!(over_hard_limit(&code, true), Some(HARD_MAX_LINES + 1));
        let explained = format!("//! Why this file is long: no matter.\n{code}");
        assert!(over_hard_limit(&explained, true).is_some());
        let tested = format!(
            "{}#[cfg(test)]\nmod tests {{\n{code}}}\n",
            "fn g() {}\n".repeat(10)
        );
        assert_eq!(over_hard_limit(&tested, true), None);
        let python = "x = 1\n".repeat(HARD_MAX_LINES + 1);
        assert_eq!(over_hard_limit(&python, false), Some(HARD_MAX_LINES + 1));
        assert_eq!(
            over_hard_limit(&"#[cfg(test)]\n".repeat(HARD_MAX_LINES + 1), false),
            Some(HARD_MAX_LINES + 1)
        );
    }

    #[test]
    fn the_security_model_names_tests_as_path_and_function() {
        let page = "| x | `tests/tests/a.rs::one`, `b.py::two` and `crates/c/t.py::three` |\n`not::this` `x/y.rs::`";
        assert_eq!(
            named_tests(page),
            [
                ("tests/tests/a.rs".to_owned(), "one".to_owned()),
                ("crates/c/t.py".to_owned(), "three".to_owned())
            ]
        );
    }

    #[test]
    fn a_long_file_must_say_why() {
        let long = "fn f() {}\n".repeat(MAX_LINES + 1);
        assert_eq!(unexplained_length(&long), Some(MAX_LINES + 1));
        let explained = format!("//! Why this file is long: one job, many tests.\n{long}");
        assert_eq!(unexplained_length(&explained), None);
        assert_eq!(unexplained_length(&"x\n".repeat(MAX_LINES)), None);
    }
}
