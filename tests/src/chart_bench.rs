//! The real-work yardstick (issue 37): the chart cell agents send (`tests/benches/chart_cell.py`: a
//! 20,000-row pandas frame grouped, a matplotlib line chart shown, a small value last) through
//! runpython's best one-shot paths and a live session, against the same cell in a warm Jupyter kernel
//! (ipykernel through jupyter_client) and as a plain Python process, in one loop of interleaved rounds
//! so a noisy machine moves them together. The data stack is pinned (`chart_requirements.txt`) and
//! installed the same into runpython's environment and the yardsticks' venv.
//!
//! Every runpython call is checked (success, the value, a `line` chart among its displays with its
//! PNG kept as an artifact, forked runs really forked) and so is every yardstick call (its PNG, its
//! value): a broken run cannot look fast.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use runpython_core::{Envelope, PoolConfig, RunPython, RunRequest, Status, Store};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::stats::{p50, round3};
use crate::template_bench::CpuMeter;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The cell, as agents send it and as every path below runs it.
pub const CHART_CELL: &str = include_str!("../benches/chart_cell.py");
const REQUIREMENTS: &str = include_str!("../benches/chart_requirements.txt");

/// Imported by the pooled interpreters and the template before a run: the cell's imports.
const WARM: &[&str] = &["numpy", "pandas", "matplotlib.pyplot"];
const ROUNDS: usize = 10;
/// After a pooled run, the time its replacement needs (an interpreter importing the data stack and
/// building matplotlib's font cache in its fresh scratch), during which nothing else runs: the next
/// pooled run finds a ready interpreter (the pooled path's best case), and the window's CPU is the
/// run's and its replacement's.
const POOL_REFILL: Duration = Duration::from_millis(3000);
/// After a forked run: its replacement fork made, and the host's collection settled.
const SETTLE: Duration = Duration::from_millis(300);

/// The harness's runtime: tokio's multi-threaded one, as a host's would be.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn benches_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches")
}

/// The pinned data stack, as dependency specs.
/// The chart cell's pinned data stack (`benches/chart_requirements.txt`).
pub fn chart_pins() -> Vec<String> {
    REQUIREMENTS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Adds the chart figures. `python` is the yardsticks' venv interpreter (`RUNPYTHON_BENCH_CHART_PYTHON`,
/// made by `cargo xtask bench` from `jupyter_requirements.txt`).
/// `cpu`, when this user could make one, counts the CPU of the one-shot runs too. `runpython`, the CLI
/// beside the bench, adds the cell as `runpython run` hands it to a `runpython host` declaring the
/// same warm environment (`chart_cli_hosted_ms`: the whole client process).
pub async fn chart_figures(
    m: &mut Map<String, Value>,
    python: &Path,
    cpu: Option<&CpuMeter>,
    runpython: Option<&Path>,
) -> Result<(), BoxError> {
    let store_dir = tempfile::tempdir()?;
    // What `runpython mcp` keeps runs in by default: a local file store (the PNG becomes an artifact).
    let url = format!("file://{}", store_dir.path().display());
    let engine = |size: usize, templates: bool| -> Result<RunPython, BoxError> {
        // Pooled interpreters and sessions: the pins as the engine's dependencies, the stack imported
        // ahead by the pool.
        let mut builder = RunPython::builder()
            .timeout(Duration::from_secs(300))
            .store(Store::open(&url)?)
            .pool(PoolConfig {
                size,
                idle: Duration::from_secs(600),
                warm_imports: WARM.iter().map(|w| (*w).to_owned()).collect(),
                prestart: size > 0,
                templates,
            });
        for pin in chart_pins() {
            builder = builder.dependency(pin);
        }
        Ok(builder.build()?)
    };
    let pooled = engine(1, false)?;
    // The product's path: the data stack declared a warm environment, as `--warm` declares it.
    let forked = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .store(Store::open(&url)?)
        .warm_environment(chart_pins())
        .build()?;
    forked.warm_up(|_| {}).await?;
    let sessions = engine(0, false)?;
    let one_shot = |engine: &RunPython| {
        let engine = engine.clone();
        async move {
            let t = Instant::now();
            let e = engine.run(RunRequest::new(CHART_CELL).no_memo()).await?;
            Ok::<_, BoxError>((t.elapsed().as_secs_f64() * 1e3, e))
        }
    };

    // First calls, excluded: the environment prepared (installed the first time), the template and
    // the pooled interpreter started, the session's interpreter, the kernel's imports and caches.
    let (_, e) = one_shot(&forked).await?;
    check_chart(&e, "the first forked run")?;
    if e.isolation.as_ref().map(|i| i.start.as_str()) != Some("template") {
        return Err(format!(
            "the chart runs are not forked from a template here: {:?}",
            e.isolation
        )
        .into());
    }
    let (_, e) = one_shot(&pooled).await?;
    check_chart(&e, "the first pooled run")?;
    let session = sessions.session();
    check_chart(&session.run(CHART_CELL).await?, "the first session cell")?;
    let mut kernel = Kernel::start(python).await?;
    kernel.cell().await?;
    let cold_dir = tempfile::tempdir()?;
    cold_process(python, cold_dir.path()).await?; // builds its matplotlib cache, as a used machine has
    let cli = match runpython {
        Some(runpython) => Some(CliCell::start(runpython, &url, store_dir.path()).await?),
        None => None,
    };
    if let Some(cli) = &cli {
        cli.run().await?; // its first run, excluded as the others' are
    }
    tokio::time::sleep(POOL_REFILL).await;

    let (mut jupyter, mut cold, mut cells) = (vec![], vec![], vec![]);
    let (mut pooled_ms, mut forked_ms, mut pooled_cpu, mut forked_cpu) =
        (vec![], vec![], vec![], vec![]);
    let mut cli_ms = vec![];
    let cpu_now = || cpu.map_or(0.0, CpuMeter::ms);
    for _ in 0..ROUNDS {
        // Each one-shot run's CPU counts its replacement's making too (an interpreter importing the
        // data stack, or a fork), over a window in which nothing else runs.
        let c = cpu_now();
        let (ms, e) = one_shot(&pooled).await?;
        check_chart(&e, "a pooled run")?;
        pooled_ms.push(ms);
        tokio::time::sleep(POOL_REFILL).await;
        pooled_cpu.push(cpu_now() - c);
        let c = cpu_now();
        let (ms, e) = one_shot(&forked).await?;
        check_chart(&e, "a forked run")?;
        if e.isolation.as_ref().map(|i| i.start.as_str()) != Some("template") {
            return Err(format!("a chart run was not forked: {:?}", e.isolation).into());
        }
        forked_ms.push(ms);
        tokio::time::sleep(SETTLE).await;
        forked_cpu.push(cpu_now() - c);
        jupyter.push(kernel.cell().await?);
        let t = Instant::now();
        let e = session.run(CHART_CELL).await?;
        cells.push(t.elapsed().as_secs_f64() * 1e3);
        check_chart(&e, "a session cell")?;
        cold.push(cold_process(python, cold_dir.path()).await?);
        if let Some(cli) = &cli {
            cli_ms.push(cli.run().await?);
            tokio::time::sleep(SETTLE).await;
        }
    }
    kernel.stop().await;
    session.close().await?;
    if let Some(cli) = cli {
        cli.stop()?;
    }

    let jupyter = p50(jupyter);
    let (pooled_ms, forked_ms) = (p50(pooled_ms), p50(forked_ms));
    let run = pooled_ms.min(forked_ms);
    let cell = p50(cells);
    m.insert("jupyter_cell_ms".into(), json!(round3(jupyter)));
    m.insert("chart_cold_process_ms".into(), json!(round3(p50(cold))));
    m.insert("chart_run_pooled_ms".into(), json!(round3(pooled_ms)));
    m.insert("chart_run_forked_ms".into(), json!(round3(forked_ms)));
    m.insert("chart_run_ms".into(), json!(round3(run)));
    m.insert(
        "chart_run_vs_jupyter_cell".into(),
        json!(round3(run / jupyter)),
    );
    if cpu.is_some() {
        m.insert(
            "chart_run_cpu_ms_pooled".into(),
            json!(round3(p50(pooled_cpu))),
        );
        m.insert(
            "chart_run_cpu_ms_forked".into(),
            json!(round3(p50(forked_cpu))),
        );
    }
    if !cli_ms.is_empty() {
        let cli = p50(cli_ms);
        m.insert("chart_cli_hosted_ms".into(), json!(round3(cli)));
        m.insert(
            "chart_cli_hosted_vs_jupyter_cell".into(),
            json!(round3(cli / jupyter)),
        );
    }
    m.insert("chart_session_cell_ms".into(), json!(round3(cell)));
    m.insert(
        "chart_session_vs_jupyter_cell".into(),
        json!(round3(cell / jupyter)),
    );
    Ok(())
}

/// The cell as a person or an agent's shell runs it: `runpython run --warm PINS --store URL CELL`, a
/// whole process, handed to a `runpython host` started with the same flags. Each run is checked as
/// the library's are, and to have been served by the host (its log names the run).
struct CliCell {
    host: crate::start_bench::CliHost,
    runpython: PathBuf,
    flags: Vec<String>,
    cell: PathBuf,
}

impl CliCell {
    async fn start(runpython: &Path, url: &str, dir: &Path) -> Result<Self, BoxError> {
        let cell = dir.join("chart_cell.py");
        std::fs::write(&cell, CHART_CELL)?;
        let flags = vec![
            "--timeout".to_owned(),
            "300".to_owned(),
            "--store".to_owned(),
            url.to_owned(),
            "--warm".to_owned(),
            chart_pins().join(","),
        ];
        let (program, host_flags) = (runpython.to_owned(), flags.clone());
        // Starting it installs nothing new (the library's forked engine prepared the same pins) but
        // waits for its template: off the runtime's threads.
        let host = tokio::task::spawn_blocking(move || {
            let flags: Vec<&str> = host_flags.iter().map(String::as_str).collect();
            crate::start_bench::CliHost::start(&program, &flags).map_err(|e| e.to_string())
        })
        .await??;
        Ok(Self {
            host,
            runpython: runpython.to_owned(),
            flags,
            cell,
        })
    }

    /// One run: its whole process's milliseconds.
    async fn run(&self) -> Result<f64, BoxError> {
        let t = Instant::now();
        let out = Command::new(&self.runpython)
            .arg("run")
            .args(&self.flags)
            .args(["--json", "--no-cache"])
            .arg(&self.cell)
            .stdin(Stdio::null())
            .output()
            .await?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let e: Envelope = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "runpython run printed no envelope ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        check_chart(&e, "a hosted CLI run")?;
        // The host logs a run once it has sent its envelope: the line may be a moment behind.
        let line = format!("run {} ", e.run_id);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.host.log().contains(&line) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !self.host.log().contains(&line) {
            return Err(format!(
                "the hosted CLI run {} was not served by the host: {}",
                e.run_id,
                self.host.log()
            )
            .into());
        }
        Ok(ms)
    }

    fn stop(self) -> Result<(), BoxError> {
        self.host.stop().map(drop).map_err(|e| e.to_string().into())
    }
}

/// The chart cell's envelope as it must be: success, its value, a `line` chart among its displays
/// whose PNG is a kept artifact.
pub fn check_chart(e: &Envelope, what: &str) -> Result<(), BoxError> {
    let fail = |why: String| -> BoxError {
        let tail: String = e
            .stderr
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!(
            "{what} of the chart cell {why}; its error: {:?}; the tail of its stderr: {tail}",
            e.error
        )
        .into()
    };
    if e.status != Status::Success {
        return Err(fail(format!("ended {:?}", e.status)));
    }
    if e.return_value["rows"] != json!(20_000) || e.return_value["days"] != json!(90) {
        return Err(fail(format!("returned {}", e.return_value)));
    }
    let Some(chart) = e.displays.iter().find(|d| d["chart"]["type"] == "line") else {
        return Err(fail(format!("showed no line chart: {:?}", e.displays)));
    };
    let png = &chart["formats"]["image/png"];
    let kept = png["artifact_id"]
        .as_str()
        .is_some_and(|id| e.artifacts.iter().any(|a| a.id == id && a.bytes > 0));
    if !kept {
        return Err(fail(format!("kept no PNG artifact for its chart: {png}")));
    }
    Ok(())
}

/// The plain process: `python chart_cold.py chart_cell.py DIR` with `MPLBACKEND=Agg` and a matplotlib
/// cache in `dir` (kept across rounds, as a machine that ran Python before has one); its PNG checked.
async fn cold_process(python: &Path, dir: &Path) -> Result<f64, BoxError> {
    let png = dir.join("figure_1.png");
    let _ = std::fs::remove_file(&png);
    let t = Instant::now();
    let out = Command::new(python)
        .arg(benches_dir().join("chart_cold.py"))
        .arg(benches_dir().join("chart_cell.py"))
        .arg(dir)
        .env("MPLBACKEND", "Agg")
        .env("MPLCONFIGDIR", dir.join("matplotlib"))
        .stdin(Stdio::null())
        .output()
        .await?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let value: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let drawn = std::fs::read(&png).is_ok_and(|b| b.starts_with(b"\x89PNG"));
    if !out.status.success() || value["rows"] != json!(20_000) || !drawn {
        return Err(format!(
            "the chart cell as a plain process ({} chart_cold.py) failed ({}, a PNG drawn: {drawn}): {}",
            python.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(ms)
}

/// The warm Jupyter kernel, through `jupyter_kernel.py` (a `KernelManager` and a blocking client in
/// the venv's interpreter), one cell per line asked.
struct Kernel {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Kernel {
    async fn start(python: &Path) -> Result<Self, BoxError> {
        let mut child = Command::new(python)
            .arg(benches_dir().join("jupyter_kernel.py"))
            .arg(benches_dir().join("chart_cell.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its failures are told on stderr, which `cargo xtask bench` shows when the harness fails.
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {} jupyter_kernel.py: {e}", python.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the kernel driver's pipes were not made".into());
        };
        Ok(Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// One cell, executed until the kernel is idle again: its milliseconds, as the driver measured
    /// them (the driver checked its PNG and its value).
    async fn cell(&mut self) -> Result<f64, BoxError> {
        self.stdin.write_all(b"cell\n").await?;
        self.stdin.flush().await?;
        let line = self
            .lines
            .next_line()
            .await?
            .ok_or("the Jupyter kernel driver ended without an answer")?;
        let answer: Value = serde_json::from_str(&line)
            .map_err(|e| format!("the Jupyter kernel driver printed {line:?}: {e}"))?;
        match (answer["ms"].as_f64(), answer["png_bytes"].as_u64()) {
            (Some(ms), Some(png))
                if png > 0
                    && answer["value"]
                        .as_str()
                        .is_some_and(|v| v.contains("'rows': 20000")) =>
            {
                Ok(ms)
            }
            _ => Err(format!("the Jupyter kernel's cell failed: {answer}").into()),
        }
    }

    async fn stop(mut self) {
        drop(self.stdin); // the driver shuts its kernel down at the end of its input
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
