//! The Python package (`crates/runpython-py`): its wheel built with maturin, installed into a fresh
//! venv, its pytest suite, mypy on its examples and stubtest on its stubs; and the venvs the benchmark
//! harness measures it (and the chart cell's yardsticks) with.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{python3, root, step};

/// maturin releases that set `PYO3_BUILD_EXTENSION_MODULE` themselves (the crate has no
/// `extension-module` feature, so `cargo test --workspace` still links).
const MATURIN: &str = "maturin>=1.9.4,<2";
/// What the tests and the examples need besides the wheel.
const TEST_PACKAGES: &[&str] = &["pytest", "mypy", "pydantic>=2", "pydantic-ai-slim"];

fn crate_dir() -> PathBuf {
    root().join("crates/runpython-py")
}

/// maturin in the tools venv (`target/tools/venv`, made by the bootstrap), installed on first use.
fn maturin(tools_bin: &Path) -> Result<PathBuf> {
    let maturin = tools_bin.join("maturin");
    if !maturin.exists() {
        step(
            "install maturin into the tools venv",
            Command::new(tools_bin.join("python")).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                MATURIN,
            ]),
        )?;
    }
    Ok(maturin)
}

/// Builds the wheel (`release`: optimized, for the benchmarks) into `out` and returns its path.
pub(crate) fn build_wheel(tools_bin: &Path, release: bool, out: &Path) -> Result<PathBuf> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    let mut cmd = Command::new(maturin(tools_bin)?);
    cmd.current_dir(crate_dir())
        .args(["build", "--quiet", "--out"])
        .arg(out)
        // The wheel is abi3 (CPython >= 3.10): any interpreter of those builds it; use the one
        // the tests will run on.
        .arg("--interpreter")
        .arg(python3()?);
    if release {
        cmd.arg("--release");
    }
    step("build the runpython wheel (maturin)", &mut cmd)?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [wheel] => Ok(wheel.clone()),
        other => bail!(
            "maturin left {} wheels in {}: {other:?}",
            other.len(),
            out.display()
        ),
    }
}

/// The interpreter the venvs are made from, as a path (uv is given no shim to resolve).
fn base_python() -> Result<PathBuf> {
    let out = Command::new(python3()?)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("cannot ask python3 where it is")?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// An empty venv at `venv` (what was there removed), made by uv from the tools venv; returns its python.
fn empty_venv(tools_bin: &Path, venv: &Path) -> Result<PathBuf> {
    if venv.exists() {
        std::fs::remove_dir_all(venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    step(
        &format!("create a fresh venv ({})", venv.display()),
        Command::new(tools_bin.join("uv"))
            .args(["venv", "--quiet", "--python"])
            .arg(base_python()?)
            .arg(venv)
            .env("UV_PYTHON_DOWNLOADS", "never"),
    )?;
    Ok(venv.join("bin/python"))
}

/// A fresh venv at `venv` with `wheel[extra]` and `packages`, installed by uv from the tools venv;
/// returns its python.
pub(crate) fn fresh_venv(
    tools_bin: &Path,
    venv: &Path,
    wheel: &Path,
    extra: Option<&str>,
    packages: &[&str],
) -> Result<PathBuf> {
    let python = empty_venv(tools_bin, venv)?;
    let uv = tools_bin.join("uv");
    let requirement = match extra {
        Some(extra) => format!("runpython[{extra}] @ file://{}", wheel.display()),
        None => format!("runpython @ file://{}", wheel.display()),
    };
    step(
        &format!("install {requirement} and {packages:?}"),
        Command::new(&uv)
            .args(["pip", "install", "--quiet", "--python"])
            .arg(&python)
            .arg(&requirement)
            .args(packages),
    )?;
    Ok(python)
}

/// `cargo xtask py`: the wheel, a fresh venv, pytest, mypy on the examples against the stubs,
/// stubtest. Returns the wheel.
pub(crate) fn ci(tools_bin: &Path) -> Result<PathBuf> {
    let wheel = ci_wheel(tools_bin)?;
    checks(tools_bin, &wheel)?;
    Ok(wheel)
}

/// The wheel CI tests (a debug build, in `target/wheels/ci`).
pub(crate) fn ci_wheel(tools_bin: &Path) -> Result<PathBuf> {
    build_wheel(tools_bin, false, &root().join("target/wheels/ci"))
}

/// The package's checks against `wheel`: a fresh venv, pytest, mypy on the examples, stubtest.
pub(crate) fn checks(tools_bin: &Path, wheel: &Path) -> Result<()> {
    let python = fresh_venv(
        tools_bin,
        &root().join("target/py-test-venv"),
        wheel,
        None,
        TEST_PACKAGES,
    )?;
    let dir = crate_dir();
    step(
        "python package: pytest",
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(dir.join("tests"))
            .current_dir(&dir)
            .env("RUNPYTHON_TOOLS_BIN", tools_bin),
    )?;
    step(
        "python package: mypy --strict on the examples",
        Command::new(&python)
            .args(["-m", "mypy", "--strict", "--cache-dir"])
            .arg(root().join("target/py-test-venv/mypy-cache"))
            .arg(dir.join("examples"))
            .current_dir(&dir),
    )?;
    // The stubs against the installed module: every name, signature and class as the runtime has it.
    // runpython.integrations.* are typed inline and need their frameworks, absent here: stubtest/ says
    // so (they are checked in their own venvs by `cargo xtask integrations`).
    step(
        "python package: stubtest",
        Command::new(&python)
            .args(["-m", "mypy.stubtest", "runpython", "--mypy-config-file"])
            .arg(dir.join("stubtest/mypy.ini"))
            .arg("--allowlist")
            .arg(dir.join("stubtest/allowlist.txt"))
            .current_dir(std::env::temp_dir()),
    )
}

/// For `cargo xtask bench`: a release wheel in `target/py-bench-venv`; returns the venv's python,
/// which the harness runs the Python benchmark with, and the wheel.
pub(crate) fn bench_python(tools_bin: &Path) -> Result<(PathBuf, PathBuf)> {
    let wheel = build_wheel(tools_bin, true, &root().join("target/wheels/bench"))?;
    let python = fresh_venv(
        tools_bin,
        &root().join("target/py-bench-venv"),
        &wheel,
        None,
        &[],
    )?;
    Ok((python, wheel))
}

/// For `cargo xtask bench`'s chart yardsticks: `target/chart-bench-venv` with the chart cell's pinned
/// data stack, ipykernel and jupyter_client (`tests/benches/jupyter_requirements.txt`); returns its
/// python, the interpreter the Jupyter kernel and the plain process run on (the one runpython runs).
pub(crate) fn chart_python(tools_bin: &Path) -> Result<PathBuf> {
    let python = empty_venv(tools_bin, &root().join("target/chart-bench-venv"))?;
    step(
        "install the chart yardsticks' Jupyter kernel and data stack",
        Command::new(tools_bin.join("uv"))
            .args(["pip", "install", "--quiet", "--python"])
            .arg(&python)
            .arg("-r")
            .arg(root().join("tests/benches/jupyter_requirements.txt")),
    )?;
    Ok(python)
}
