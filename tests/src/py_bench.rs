//! The Python package's side of the benchmark harness: `crates/runpython-py/benches/bench.py`, run by the
//! interpreter of a venv with the release wheel (`cargo xtask bench` makes it and names it in
//! `RUNPYTHON_BENCH_PYTHON`), driven one request per line so its measurements interleave with the
//! harness's own.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

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
