//! The agent-framework integrations (`runpython.integrations.*`): for each, the wheel with that extra in
//! a fresh venv of its own (the framework's current release from the index, installed with uv), its
//! tests (`crates/runpython-py/tests_integrations/<module>/`, each a real agent run driven by the
//! framework's own test or fake model) and mypy `--strict` on the module and its example.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::{pypkg, root, step};

/// One integration: its extra, its module under `runpython.integrations` (also its tests' directory),
/// and what its tests need besides the extra.
struct Integration {
    extra: &'static str,
    module: &'static str,
    test_packages: &'static [&'static str],
}

const INTEGRATIONS: &[Integration] = &[
    Integration {
        extra: "smolagents",
        module: "smolagents",
        test_packages: &[],
    },
    Integration {
        extra: "langchain",
        module: "langchain",
        // `create_agent`, the agent loop the test drives (the extra needs only langchain-core).
        test_packages: &["langchain"],
    },
    Integration {
        extra: "deepagents",
        module: "deepagents",
        test_packages: &[],
    },
    Integration {
        extra: "pydantic-ai",
        module: "pydantic_ai",
        test_packages: &[],
    },
    Integration {
        extra: "openai-agents",
        module: "openai_agents",
        test_packages: &[],
    },
    Integration {
        extra: "fastmcp",
        module: "fastmcp",
        test_packages: &[],
    },
];

const TEST_PACKAGES: &[&str] = &["pytest", "mypy"];

/// `cargo xtask integrations`: each integration in its own venv, two at a time (see [`jobs`]).
/// `wheel`: one already built; else it is built here.
pub(crate) fn ci(tools_bin: &Path, wheel: Option<&Path>) -> Result<()> {
    let wheel = match wheel {
        Some(w) => w.to_path_buf(),
        None => pypkg::ci_wheel(tools_bin)?,
    };
    crate::concurrently(2, jobs(tools_bin, &wheel))
}

/// One job per integration, for [`crate::concurrently`]: its venv, pytest on its tests, mypy
/// `--strict` on its module and example. Each has a venv and a mypy cache of its own, so they share
/// nothing but uv's cache, which uv locks.
pub(crate) fn jobs<'a>(
    tools_bin: &'a Path,
    wheel: &'a Path,
) -> Vec<Box<dyn FnOnce() -> Result<()> + Send + 'a>> {
    INTEGRATIONS
        .iter()
        .map(|it| {
            Box::new(move || one(tools_bin, wheel, it)) as Box<dyn FnOnce() -> Result<()> + Send>
        })
        .collect()
}

fn one(tools_bin: &Path, wheel: &Path, it: &Integration) -> Result<()> {
    let dir = root().join("crates/runpython-py");
    let tests = dir.join("tests_integrations");
    let venv = root().join(format!("target/integrations/{}", it.module));
    let packages: Vec<&str> = TEST_PACKAGES
        .iter()
        .chain(it.test_packages)
        .copied()
        .collect();
    let python = pypkg::fresh_venv(tools_bin, &venv, wheel, Some(it.extra), &packages)?;
    step(
        &format!("integration {}: pytest", it.extra),
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(tests.join(it.module))
            .current_dir(&dir)
            .env("RUNPYTHON_TOOLS_BIN", tools_bin),
    )?;
    // mypy takes a package or files, not both: the module as installed, then the example.
    let module = format!("runpython.integrations.{}", it.module);
    let example = tests
        .join(it.module)
        .join(format!("example_{}.py", it.module));
    for (what, target) in [
        ("module", ["-p", module.as_str()]),
        ("example", ["--", &*example.to_string_lossy()]),
    ] {
        step(
            &format!("integration {}: mypy --strict on the {what}", it.extra),
            Command::new(&python)
                .args(["-m", "mypy", "--strict", "--cache-dir"])
                .arg(venv.join("mypy-cache"))
                .args(target)
                .current_dir(&tests),
        )?;
    }
    Ok(())
}

/// For `cargo xtask bench`: a venv with the bench wheel and smolagents, for the
/// `smolagents_step_overhead_ms` figure; returns its python.
pub(crate) fn bench_python(tools_bin: &Path, wheel: &Path) -> Result<PathBuf> {
    pypkg::fresh_venv(
        tools_bin,
        &root().join("target/py-bench-smolagents-venv"),
        wheel,
        Some("smolagents"),
        &[],
    )
}
