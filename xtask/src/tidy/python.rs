//! Python as an import graph: each `.py` file a module, each import it makes resolved to an absolute
//! module path.
//!
//! The imports are read by Python's own parser: [`IMPORTS_PY`] runs under the machine's `python3`
//! and prints, for every file, each `import a.b [as c]`, `from [.]a import b [as c]` (at any depth:
//! module level, in functions, under `if`/`try`), and each `__import__("literal")` and
//! `importlib.import_module("literal")`. Imports of computed names are not seen; nothing in a string
//! or a comment counts. A module-level import also binds a name, followed like a Rust re-export:
//! `from pkg import Name`, where `pkg/__init__.py` has `from pkg.impl import Name`, leads to
//! `pkg.impl` too.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::graph::{ModuleGraph, Reference, SourceFile};

/// Prints `{path: [[line, level, module, name, alias, binds], …] or "why it did not parse"}` for
/// the files named on its command line.
const IMPORTS_PY: &str = r#"
import ast, json, sys

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

def literal(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

def dynamic(call):
    """(level, module, fromlist) of __import__("m") or import_module("m"), else None."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name not in ("__import__", "import_module") or not call.args:
        return None
    module = literal(call.args[0])
    if module is None:
        return None
    if name == "import_module":
        dots = len(module) - len(module.lstrip("."))
        return dots, module[dots:], []
    kw = {k.arg: k.value for k in call.keywords}
    level = call.args[4] if len(call.args) > 4 else kw.get("level")
    level = level.value if isinstance(level, ast.Constant) and isinstance(level.value, int) else 0
    fromlist = call.args[3] if len(call.args) > 3 else kw.get("fromlist")
    names = [literal(e) for e in fromlist.elts] if isinstance(fromlist, (ast.List, ast.Tuple)) else []
    return level, module, [n for n in names if n]

def imports(tree):
    found = []
    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            line = getattr(child, "lineno", 0)
            if isinstance(child, ast.Import):
                found.extend([line, 0, a.name, None, a.asname, top] for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.extend([line, child.level, child.module or "", a.name, a.asname, top]
                             for a in child.names)
            elif isinstance(child, ast.Call) and (d := dynamic(child)):
                level, module, names = d
                found.append([line, level, module, None, None, False])
                found.extend([line, level, module, n, None, False] for n in names)
            visit(child, top and not isinstance(child, SCOPES))
    visit(tree, True)
    return found

out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            out[path] = imports(ast.parse(f.read(), filename=path))
    except (SyntaxError, ValueError, OSError) as e:
        out[path] = f"{type(e).__name__}: {e}"
json.dump(out, sys.stdout)
"#;

/// A Python file and the module it is.
#[derive(Debug, Clone)]
pub(super) struct PyFile {
    pub(super) path: PathBuf,
    /// Relative to the workspace root, for messages.
    pub(super) shown: String,
    /// `["pkg", "mod"]` for `pkg/mod.py`, `["pkg"]` for `pkg/__init__.py`.
    pub(super) module: Vec<String>,
    /// An `__init__.py`: its relative imports start from its own module.
    pub(super) package: bool,
}

/// One import as the parser saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Import {
    line: usize,
    /// Leading dots of a relative import.
    level: usize,
    /// Dotted, as written after the dots (empty for `from . import x`).
    module: String,
    /// What `from … import` takes (`*` for all); `None` for `import a.b`.
    name: Option<String>,
    alias: Option<String>,
    /// A module-level static import: it binds a name of the module.
    binds: bool,
}

/// Every `.py` file of the package tree under `dir` (a `sys.path` entry), named by its dotted path.
pub(super) fn package_files(root: &Path, dir: &Path) -> Result<Vec<PyFile>> {
    let mut paths = Vec::new();
    python_files(dir, &mut paths)?;
    Ok(paths
        .into_iter()
        .filter_map(|path| {
            let relative = path.strip_prefix(dir).ok()?;
            let mut module: Vec<String> = relative
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let stem = module.pop()?.strip_suffix(".py")?.to_owned();
            let package = stem == "__init__";
            if !package {
                module.push(stem);
            }
            Some(PyFile {
                shown: shown(root, &path),
                path,
                module,
                package,
            })
        })
        .collect())
}

/// Every `.py` file under `dir`, `__pycache__` and hidden directories left out, sorted.
pub(super) fn python_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(()); // a directory this checkout does not have
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type()?.is_dir() {
            if name != "__pycache__" && name != "target" && !name.starts_with('.') {
                python_files(&entry.path(), out)?;
            }
        } else if name.ends_with(".py") {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(())
}

pub(super) fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The graph of `files`, shown in messages under `base`, with a problem for each file that does not
/// parse.
pub(super) fn graph(base: &str, files: Vec<PyFile>) -> Result<(ModuleGraph, Vec<String>)> {
    let parsed = parse(&files)?;
    let mut problems = Vec::new();
    let mut read = Vec::new();
    for file in files {
        match parsed.get(file.path.to_string_lossy().as_ref()) {
            Some(Value::Array(entries)) => {
                let imports = entries.iter().filter_map(import_of).collect();
                read.push((file, imports));
            }
            Some(Value::String(why)) => problems.push(format!(
                "{} cannot be parsed ({why}): fix it so its imports can be checked",
                file.shown
            )),
            _ => bail!("the import reader said nothing of {}", file.path.display()),
        }
    }
    Ok((from_imports(base, read), problems))
}

/// What [`IMPORTS_PY`] prints for `files`, by path.
fn parse(files: &[PyFile]) -> Result<serde_json::Map<String, Value>> {
    if files.is_empty() {
        return Ok(serde_json::Map::new());
    }
    let python = crate::python3()?;
    let out = Command::new(&python)
        .args(["-I", "-S", "-c", IMPORTS_PY])
        .args(files.iter().map(|f| &f.path))
        .output()
        .with_context(|| format!("cannot start {}", python.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!(
            "reading the Python imports with {} failed ({}): {}",
            python.display(),
            out.status,
            stderr.trim_end().lines().last().unwrap_or_default()
        );
    }
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Object(map)) => Ok(map),
        _ => bail!(
            "the Python import reader printed no JSON object: {}",
            String::from_utf8_lossy(&out.stdout)
        ),
    }
}

fn import_of(entry: &Value) -> Option<Import> {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    Some(Import {
        line: usize::try_from(entry.get(0)?.as_u64()?).ok()?,
        level: usize::try_from(entry.get(1)?.as_u64()?).ok()?,
        module: text(entry.get(2)?)?,
        name: text(entry.get(3)?),
        alias: text(entry.get(4)?),
        binds: entry.get(5)?.as_bool()?,
    })
}

/// The graph of files whose imports were read.
pub(super) fn from_imports(base: &str, files: Vec<(PyFile, Vec<Import>)>) -> ModuleGraph {
    let files = files
        .into_iter()
        .map(|(file, imports)| {
            let mut references = Vec::new();
            let mut bindings = Vec::new();
            for import in &imports {
                let Some(path) = resolve(&file, import) else {
                    continue; // a relative import past the top-level package (an ImportError)
                };
                if import.binds {
                    bindings.extend(binding(import, &path));
                }
                references.push(Reference {
                    path,
                    line: import.line,
                    written: written(import),
                });
            }
            SourceFile {
                shown: file.shown,
                module: file.module,
                references,
                bindings,
            }
        })
        .collect();
    ModuleGraph::new(base, files)
}

/// The absolute module path `import` names from `file`; `None` for a relative import with no
/// package to be relative to.
fn resolve(file: &PyFile, import: &Import) -> Option<Vec<String>> {
    let mut path = if import.level == 0 {
        Vec::new()
    } else {
        let package = if file.package {
            &file.module[..]
        } else {
            file.module.split_last()?.1
        };
        // `.` is the package itself, each further dot one package up.
        let keep = package.len().checked_sub(import.level - 1)?;
        if keep == 0 {
            return None;
        }
        package[..keep].to_vec()
    };
    path.extend(
        import
            .module
            .split('.')
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
    if let Some(name) = import.name.as_ref().filter(|n| *n != "*") {
        path.push(name.clone());
    }
    Some(path)
}

/// The name a module-level import binds, and what it stands for.
fn binding(import: &Import, path: &[String]) -> Option<(String, Vec<String>)> {
    match (&import.name, &import.alias) {
        (Some(name), _) if name == "*" => None,
        (Some(name), alias) => Some((alias.clone().unwrap_or_else(|| name.clone()), path.to_vec())),
        (None, Some(alias)) => Some((alias.clone(), path.to_vec())),
        // `import a.b` binds `a`.
        (None, None) => {
            let first = path.first()?;
            Some((first.clone(), vec![first.clone()]))
        }
    }
}

/// The import as a dotted path, dots of a relative import included (`..pkg.name`).
fn written(import: &Import) -> String {
    let mut text = ".".repeat(import.level);
    text.push_str(&import.module);
    if let Some(name) = &import.name {
        if !import.module.is_empty() {
            text.push('.');
        }
        text.push_str(name);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(relative: &str) -> PyFile {
        let mut module: Vec<String> = relative
            .trim_end_matches(".py")
            .split('/')
            .map(str::to_owned)
            .collect();
        let package = module.last().is_some_and(|m| m == "__init__");
        if package {
            module.pop();
        }
        PyFile {
            path: PathBuf::from(relative),
            shown: format!("py/{relative}"),
            module,
            package,
        }
    }

    fn import(line: usize, level: usize, module: &str, name: Option<&str>) -> Import {
        Import {
            line,
            level,
            module: module.to_owned(),
            name: name.map(str::to_owned),
            alias: None,
            binds: true,
        }
    }

    #[test]
    fn relative_imports_start_from_the_package() {
        let r = |f: &str, level, module: &str, name| {
            resolve(&file(f), &import(1, level, module, name)).map(|p| p.join("."))
        };
        assert_eq!(
            r("pkg/a/m.py", 1, "", Some("n")).as_deref(),
            Some("pkg.a.n")
        );
        assert_eq!(
            r("pkg/a/m.py", 1, "x", Some("y")).as_deref(),
            Some("pkg.a.x.y")
        );
        assert_eq!(
            r("pkg/a/m.py", 2, "b", Some("c")).as_deref(),
            Some("pkg.b.c")
        );
        // An `__init__.py`'s `.` is its own package.
        assert_eq!(
            r("pkg/a/__init__.py", 1, "m", None).as_deref(),
            Some("pkg.a.m")
        );
        assert_eq!(
            r("pkg/a/__init__.py", 2, "", Some("t")).as_deref(),
            Some("pkg.t")
        );
        assert_eq!(r("pkg/m.py", 1, "", Some("*")).as_deref(), Some("pkg"));
        // Past the top-level package, and relative to no package at all.
        assert_eq!(r("pkg/m.py", 2, "", Some("x")), None);
        assert_eq!(r("top.py", 1, "", Some("x")), None);
        assert_eq!(
            r("pkg/m.py", 0, "os.path", None).as_deref(),
            Some("os.path")
        );
    }

    #[test]
    fn a_relative_import_circle_three_packages_down_is_found() {
        let graph = from_imports(
            "py",
            vec![
                (file("pkg/__init__.py"), vec![]),
                (file("pkg/a/__init__.py"), vec![]),
                (
                    file("pkg/a/b/__init__.py"),
                    vec![import(1, 1, "x", Some("f"))],
                ),
                (file("pkg/a/b/x.py"), vec![import(3, 1, "", Some("y"))]),
                (file("pkg/a/b/y.py"), vec![import(4, 3, "a.b.x", Some("g"))]),
            ],
        );
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].place, "py/pkg/a/b/");
        let m = &cycles[0].message;
        assert!(m.contains(": x -> y -> x\n"), "{m}");
        assert!(m.contains("x -> y: py/pkg/a/b/x.py:3 names `.y`"), "{m}");
        assert!(
            m.contains("y -> x: py/pkg/a/b/y.py:4 names `...a.b.x.g`"),
            "{m}"
        );
    }

    #[test]
    fn a_name_taken_from_a_package_leads_to_the_module_its_init_took_it_from() {
        // integrations/x.py takes `tool` from the package; the package's __init__ took it from
        // _tools; _tools importing integrations closes a circle through the re-export.
        let graph = from_imports(
            "py",
            vec![
                (
                    file("pkg/__init__.py"),
                    vec![import(5, 0, "pkg._tools", Some("tool"))],
                ),
                (
                    file("pkg/_tools.py"),
                    vec![import(9, 0, "pkg.integrations.x", None)],
                ),
                (file("pkg/integrations/__init__.py"), vec![]),
                (
                    file("pkg/integrations/x.py"),
                    vec![import(2, 0, "pkg", Some("tool"))],
                ),
            ],
        );
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(cycles[0]
            .message
            .contains("integrations -> _tools: py/pkg/integrations/x.py:2 names `pkg.tool`"));
    }

    #[test]
    fn bare_imports_between_sibling_modules_make_a_circle() {
        let graph = from_imports(
            "child",
            vec![
                (file("runner.py"), vec![import(30, 0, "session", None)]),
                (
                    file("session.py"),
                    vec![import(12, 0, "runner", Some("_helper"))],
                ),
                (file("json_.py"), vec![import(1, 0, "sys", None)]),
            ],
        );
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].place, "child/");
        assert!(cycles[0].message.contains("runner -> session -> runner"));
        assert!(cycles[0]
            .message
            .contains("session -> runner: py/session.py:12 names `runner._helper`"));
    }

    #[test]
    fn the_parser_reads_every_kind_of_import_and_nothing_in_strings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.py");
        std::fs::write(
            &path,
            concat!(
                "\"\"\"Docs: from runpython import NotThis\"\"\"\n",
                "import a.b as c, d\n",
                "from .e import f as g\n",
                "def h():\n",
                "    from . import i\n",
                "    __import__('j.k', None, None, ['l'])\n",
                "    importlib.import_module('..m')\n",
                "    __import__(computed)\n",
                "s = 'import not_this'\n",
                "# import not_this_either\n",
            ),
        )
        .unwrap();
        let files = vec![PyFile {
            path: path.clone(),
            shown: "m.py".into(),
            module: vec!["m".into()],
            package: false,
        }];
        let parsed = parse(&files).unwrap();
        let imports: Vec<Import> = parsed[path.to_string_lossy().as_ref()]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(import_of)
            .collect();
        let shown: Vec<String> = imports
            .iter()
            .map(|i| {
                format!(
                    "{}:{}{}",
                    i.line,
                    written(i),
                    if i.binds { " binds" } else { "" }
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "2:a.b binds",
                "2:d binds",
                "3:.e.f binds",
                "5:.i",
                "6:j.k",
                "6:j.k.l",
                "7:..m",
            ]
        );
        assert_eq!(imports[0].alias.as_deref(), Some("c"));
    }

    #[test]
    fn a_file_that_does_not_parse_is_a_problem_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.py");
        std::fs::write(&path, "def f(:\n").unwrap();
        let (_, problems) = graph(
            "x",
            vec![PyFile {
                path,
                shown: "x/broken.py".into(),
                module: vec!["broken".into()],
                package: false,
            }],
        )
        .unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("x/broken.py cannot be parsed (SyntaxError:"),
            "{problems:?}"
        );
    }
}
