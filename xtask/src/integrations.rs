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

/// Each integration in its own venv: pytest on its tests, mypy `--strict` on its module and example.
/// `wheel`: one `cargo xtask ci` already built; else it is built here.
pub(crate) fn ci(tools_bin: &Path, wheel: Option<&Path>) -> Result<()> {
    let wheel = match wheel {
        Some(w) => w.to_path_buf(),
        None => pypkg::build_wheel(tools_bin, false, &root().join("target/wheels/ci"))?,
    };
    let dir = root().join("crates/runpython-py");
    let tests = dir.join("tests_integrations");
    for it in INTEGRATIONS {
        let venv = root().join(format!("target/integrations/{}", it.module));
        let packages: Vec<&str> = TEST_PACKAGES
            .iter()
            .chain(it.test_packages)
            .copied()
            .collect();
        let python = pypkg::fresh_venv(tools_bin, &venv, &wheel, Some(it.extra), &packages)?;
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
