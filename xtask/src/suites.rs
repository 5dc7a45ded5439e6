//! `cargo test --workspace` for CI, built once and run two suites at a time.
//!
//! `cargo test` runs its test executables one after another, and most of them spend their time
//! waiting on the runs, servers and interpreters they start: over the workspace the suites keep about
//! half of two cores busy. So CI builds them with `cargo test --no-run`, then runs the executables
//! itself, two at a time, longest first, each with what `cargo test` would give it (its package's
//! directory as the working directory, `CARGO_MANIFEST_DIR`). Suites that measure the machine's
//! share (CPU fairness, floods, bursts) run after, alone. The doc tests run after them through cargo.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};

use crate::{cargo, concurrently, step};

/// Suites that time or share out the machine: run alone, after the others, so a neighbour's load is
/// not what they measure.
const ALONE: &[&str] = &["host_costs", "serve_tenants", "serve_limits", "templates"];

/// The longest suites (tens of seconds each in CI), started first so that no long one is left to run
/// by itself at the end.
const LONGEST_FIRST: &[&str] = &[
    "mcp_sdk",
    "pool",
    "host",
    "run",
    "runpython_deps",
    "session_restore",
    "runpython_bridge",
    "store_s3",
    "displays",
    "hostile",
    "context",
    "nested",
];

/// Whether a test build in this process made the CLI's binary (`target/debug/runpython`). `cargo test`
/// builds it with the dev-dependencies' features unified in; `cargo build --bin runpython` resolves
/// without them and would rebuild the engine and a dozen dependencies (~40 s on a fresh clone) only to
/// make the same program again.
static CLI_BUILT: AtomicBool = AtomicBool::new(false);

/// True once a test build in this process made `target/debug/runpython`.
pub(crate) fn cli_built() -> bool {
    CLI_BUILT.load(Ordering::Relaxed)
}

/// One test executable `cargo test --no-run` built.
pub(crate) struct Suite {
    /// The target's name (`hostile`, `runpython_core` for a library's unit tests).
    name: String,
    pub(crate) executable: PathBuf,
    /// The package's directory: where `cargo test` runs it, and its `CARGO_MANIFEST_DIR`.
    package_dir: PathBuf,
}

/// Builds every test executable of the workspace and runs them as `cargo test --workspace
/// --no-fail-fast` would, two at a time; `tools` is passed on as `RUNPYTHON_TOOLS_BIN`.
pub(crate) fn workspace(tools: &Path) -> Result<()> {
    eprintln!("==> test: build");
    let mut suites = build(&[])?;
    let rank = |s: &Suite| {
        LONGEST_FIRST
            .iter()
            .position(|n| *n == s.name)
            .unwrap_or(LONGEST_FIRST.len())
    };
    suites.sort_by_key(rank);
    let (alone, shared): (Vec<Suite>, Vec<Suite>) = suites
        .into_iter()
        .partition(|s| ALONE.contains(&s.name.as_str()));
    eprintln!(
        "==> test: {} suites two at a time, then {} alone",
        shared.len(),
        alone.len()
    );
    let jobs = shared
        .iter()
        .map(|s| Box::new(move || run(s, tools)) as Box<dyn FnOnce() -> Result<()> + Send + '_>)
        .collect();
    // Every suite runs whatever another did (`--no-fail-fast`); the failures are reported at the end.
    let together = concurrently(2, jobs);
    let mut failed: Vec<String> = together
        .err()
        .map(|e| format!("{e:#}"))
        .into_iter()
        .collect();
    for suite in &alone {
        if let Err(e) = run(suite, tools) {
            failed.push(format!("{e:#}"));
        }
    }
    if let Err(e) = step(
        "test: doc tests",
        cargo()
            .args(["test", "--workspace", "--doc", "--no-fail-fast"])
            .env("RUNPYTHON_TOOLS_BIN", tools),
    ) {
        failed.push(format!("{e:#}"));
    }
    if !failed.is_empty() {
        bail!("test failures:\n{}", failed.join("\n"));
    }
    Ok(())
}

/// `cargo test --workspace --no-run` with `selection` (`--test NAME`…; none: every test target) and
/// the executables it built. Always the whole workspace's features: a subset of packages (`-p`)
/// unifies other features and rebuilds the engine and its dependencies.
pub(crate) fn build(selection: &[&str]) -> Result<Vec<Suite>> {
    let built = cargo()
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(selection)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot start cargo test --no-run")?;
    if !built.status.success() {
        bail!("building the tests failed ({})", built.status);
    }
    let artifacts = artifacts(&String::from_utf8_lossy(&built.stdout));
    if names_the_cli(&artifacts) {
        CLI_BUILT.store(true, Ordering::Relaxed);
    }
    parse(&artifacts)
}

/// `--test NAME` for each of `names`: a selection for [`build`] or `cargo test`.
pub(crate) fn selection<'a>(names: &[&'a str]) -> Vec<&'a str> {
    names.iter().flat_map(|name| ["--test", name]).collect()
}

/// The `compiler-artifact` messages of `cargo --message-format=json`'s output.
fn artifacts(messages: &str) -> Vec<serde_json::Value> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .collect()
}

/// Whether the artifacts name the CLI's binary (the `runpython` bin target, not its tests).
fn names_the_cli(artifacts: &[serde_json::Value]) -> bool {
    artifacts.iter().any(|m| {
        m["profile"]["test"] == false
            && m["target"]["name"] == "runpython"
            && m["target"]["kind"] == serde_json::json!(["bin"])
            && m["executable"].is_string()
    })
}

fn run(suite: &Suite, tools: &Path) -> Result<()> {
    step(
        &format!(
            "test {} ({})",
            suite.name,
            suite
                .executable
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ),
        Command::new(&suite.executable)
            .current_dir(&suite.package_dir)
            .env("CARGO_MANIFEST_DIR", &suite.package_dir)
            .env("RUNPYTHON_TOOLS_BIN", tools),
    )
}

/// The test executables among `cargo test --no-run --message-format=json`'s artifacts.
fn parse(artifacts: &[serde_json::Value]) -> Result<Vec<Suite>> {
    let suites: Vec<Suite> = artifacts
        .iter()
        .filter(|m| m["profile"]["test"] == true)
        .filter_map(|m| {
            Some(Suite {
                name: m["target"]["name"].as_str()?.replace('-', "_"),
                executable: PathBuf::from(m["executable"].as_str()?),
                package_dir: Path::new(m["manifest_path"].as_str()?)
                    .parent()?
                    .to_path_buf(),
            })
        })
        .collect();
    if suites.is_empty() {
        bail!("cargo test --no-run named no test executables");
    }
    Ok(suites)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_executables_are_read_from_cargos_messages_and_nothing_else() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","profile":{"test":true},"target":{"name":"hostile","kind":["test"]},"executable":"/t/debug/deps/hostile-1","manifest_path":"/w/tests/Cargo.toml"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":false},"target":{"name":"runpython-core","kind":["lib"]},"executable":null,"manifest_path":"/w/crates/runpython-core/Cargo.toml"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":true},"target":{"name":"runpython-core","kind":["lib"]},"executable":"/t/debug/deps/runpython_core-2","manifest_path":"/w/crates/runpython-core/Cargo.toml"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\nnot json\n"
        );
        let suites = parse(&artifacts(messages)).unwrap();
        let got: Vec<(&str, &Path, &Path)> = suites
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.executable.as_path(),
                    s.package_dir.as_path(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "hostile",
                    Path::new("/t/debug/deps/hostile-1"),
                    Path::new("/w/tests")
                ),
                (
                    "runpython_core",
                    Path::new("/t/debug/deps/runpython_core-2"),
                    Path::new("/w/crates/runpython-core")
                ),
            ]
        );
        assert!(parse(&artifacts(r#"{"reason":"build-finished","success":false}"#)).is_err());
        assert!(!names_the_cli(&artifacts(messages)));
    }

    #[test]
    fn the_clis_binary_is_named_by_its_bin_artifact_only() {
        let bin = r#"{"reason":"compiler-artifact","profile":{"test":false},"target":{"name":"runpython","kind":["bin"]},"executable":"/t/debug/runpython","manifest_path":"/w/crates/runpython-cli/Cargo.toml"}"#;
        let its_tests = r#"{"reason":"compiler-artifact","profile":{"test":true},"target":{"name":"runpython","kind":["bin"]},"executable":"/t/debug/deps/runpython-3","manifest_path":"/w/crates/runpython-cli/Cargo.toml"}"#;
        let a_library = r#"{"reason":"compiler-artifact","profile":{"test":false},"target":{"name":"runpython","kind":["cdylib"]},"executable":null,"manifest_path":"/w/crates/runpython-py/Cargo.toml"}"#;
        assert!(names_the_cli(&artifacts(&format!("{its_tests}\n{bin}\n"))));
        assert!(!names_the_cli(&artifacts(&format!(
            "{its_tests}\n{a_library}\n"
        ))));
        assert_eq!(
            selection(&["hostile", "run"]),
            ["--test", "hostile", "--test", "run"]
        );
    }
}
