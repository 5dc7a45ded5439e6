//! The Python package's side of the benchmark harness: `crates/runpython-py/benches/bench.py`, run by the
//! interpreter of a venv with the release wheel (`cargo xtask bench` makes it and names it in
//! `RUNPYTHON_BENCH_PYTHON`), driven one request per line so its measurements interleave with the
//! harness's own.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};

/// The benchmark script, relative to the workspace root.
pub const SCRIPT: &str = "crates/runpython-py/benches/bench.py";

/// A running `bench.py`.
#[derive(Debug)]
pub struct PyBench {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PyBench {
    /// Starts the script with `python` from the workspace root `root`.
    pub fn start(python: &Path, root: &Path) -> std::io::Result<Self> {
        let mut child = Command::new(python)
            .arg(root.join(SCRIPT))
            .current_dir(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("the script's pipes were not made"));
        };
        Ok(Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    fn ask(&mut self, request: &str) -> std::io::Result<f64> {
        writeln!(self.stdin, "{request}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        line.trim().parse().map_err(|_| {
            std::io::Error::other(format!(
                "{SCRIPT} answered {line:?} to {request:?} (its stderr says why)"
            ))
        })
    }

    /// Wall milliseconds of one `rp.run("1+1")` from Python (no pool, no store).
    pub fn run_ms(&mut self) -> std::io::Result<f64> {
        self.ask("run")
    }

    /// Sequential calls per second of a plain Python callable as the tool, over `n` calls.
    pub fn tool_calls_per_s(&mut self, n: u32) -> std::io::Result<f64> {
        self.ask(&format!("tools {n}"))
    }
}

impl Drop for PyBench {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python package's benchmark script, when `cargo xtask bench` made its venv
/// (`RUNPYTHON_BENCH_PYTHON`); else a note in the figures.
fn python_bench(m: &mut Map<String, Value>) -> Result<Option<PyBench>, Box<dyn std::error::Error>> {
    let Some(python) = std::env::var_os("RUNPYTHON_BENCH_PYTHON") else {
        m.insert(
            "py_bench".into(),
            json!("skipped: RUNPYTHON_BENCH_PYTHON is not set (cargo xtask bench sets it)"),
        );
        return Ok(None);
    };
    let root = std::env::current_dir()?;
    Ok(Some(PyBench::start(std::path::Path::new(&python), &root)?))
}

/// `py_run_overhead_ms`: `rp.run("1+1")` from Python (the release wheel, no pool, no store) minus the
/// same run from Rust, p50 of each over interleaved rounds.
pub async fn package_runs(
    cold: &runpython_core::RunPython,
    m: &mut Map<String, Value>,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let Some(mut py) = python_bench(m)? else {
        return Ok(());
    };
    for _ in 0..3 {
        py.run_ms()?;
        cold.run("1+1").await?;
    }
    let (mut from_python, mut from_rust) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        from_python.push(py.run_ms()?);
        let t = Instant::now();
        let e = cold.run("1+1").await?;
        from_rust.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(e.return_value, json!(2));
    }
    let (from_python, from_rust) = (p50(from_python), p50(from_rust));
    m.insert("py_run_ms".into(), json!(round3(from_python)));
    m.insert("py_run_rust_ms".into(), json!(round3(from_rust)));
    m.insert(
        "py_run_overhead_ms".into(),
        json!(round3(from_python - from_rust)),
    );
    Ok(())
}

/// `py_tool_calls_per_s`: sequential calls of a plain Python callable as the tool, against the Rust
/// tool's rate measured just before (`bridge_calls_per_s`).
pub fn package_tools(
    m: &mut Map<String, Value>,
    rust_tool_rate: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let Some(mut py) = python_bench(m)? else {
        return Ok(());
    };
    let rate = py.tool_calls_per_s(20_000)?;
    m.insert("py_tool_calls_per_s".into(), json!(rate.round()));
    m.insert(
        "py_tool_vs_rust_tool".into(),
        json!(round3(rate / rust_tool_rate)),
    );
    Ok(())
}
