//! The benchmark harness's figures for runs forked from templates (`runpython-bench` prints them with the
//! others): the CPU of a pandas run forked from a template against the same run on a pooled interpreter,
//! runs per second, a template's memory.

use std::time::{Duration, Instant};

use crate::stats::{floor_ms, p50, round3};
use runpython_core::{PoolConfig, RunPython};
use serde_json::{json, Map, Value};

type BoxError = Box<dyn std::error::Error>;

/// CPU time used by this process and everything it starts (a cgroup v1 `cpuacct` group of its own,
/// which the runs' sandboxes leave alone: they make memory and pids groups only). `Err` (why) where
/// this user cannot make one. Dropped, the process moves back to the root group and the group goes.
#[derive(Debug)]
pub struct CpuMeter {
    dir: std::path::PathBuf,
    usage: std::path::PathBuf,
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        let _ = std::fs::write(
            "/sys/fs/cgroup/cpuacct/cgroup.procs",
            std::process::id().to_string(),
        );
        let _ = std::fs::remove_dir(&self.dir); // refused while a process of the harness remains
    }
}

impl CpuMeter {
    pub fn start() -> Result<Self, String> {
        let dir = std::path::PathBuf::from(format!(
            "/sys/fs/cgroup/cpuacct/runpython-bench-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()))
            .map_err(|e| format!("no cpuacct group of its own ({}: {e})", dir.display()))?;
        Ok(Self {
            usage: dir.join("cpuacct.usage"),
            dir,
        })
    }

    /// CPU milliseconds used so far.
    pub fn ms(&self) -> f64 {
        std::fs::read_to_string(&self.usage)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1e6
    }
}

/// A trivial run forked from a template against the interpreter floor (`python -I -S -c pass`),
/// interleaved (`warm_run_ms`, `run_vs_floor_warm`), and the template's memory (`template_rss_mib`).
/// Between runs the harness lets the replacement fork be made, as it lets the pool refill. Returns
/// the engine, for the throughput figure.
pub async fn trivial_figures(
    m: &mut Map<String, Value>,
    python: &std::path::Path,
    rounds: usize,
) -> Result<RunPython, BoxError> {
    let forked = crate::deps_bench::pool_engine(Vec::new(), true)?;
    let e = forked.run("1+1").await?;
    if e.isolation.as_ref().map(|i| i.start.as_str()) != Some("template") {
        return Err(format!(
            "runs are not forked from a template here: {:?}",
            e.isolation
        )
        .into());
    }
    let (mut forked_ms, mut floor4) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        tokio::time::sleep(Duration::from_millis(40)).await;
        let t = Instant::now();
        let e = forked.run("1+1").await?;
        forked_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(e.return_value, json!(2));
        floor4.push(floor_ms(python)?);
    }
    let (forked_ms, floor4) = (p50(forked_ms), p50(floor4));
    m.insert("warm_run_ms".into(), json!(round3(forked_ms)));
    m.insert(
        "run_vs_floor_warm".into(),
        json!(round3(forked_ms / floor4)),
    );
    if let Some(t) = forked.templates().await.first() {
        m.insert(
            "template_rss_mib".into(),
            json!(round3(t.memory_bytes as f64 / 1048576.0)),
        );
    }
    Ok(forked)
}

/// Runs per second with 16 runs at a time on `engine`, 64 runs in all.
pub async fn runs_per_s_16(engine: &RunPython, code: &'static str) -> Result<f64, BoxError> {
    engine.run(code).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let e = engine.run(code).await?;
                assert!(e.is_success(), "{:?}", e.error);
            }
            Ok::<_, runpython_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(64.0 / t.elapsed().as_secs_f64())
}

/// The pandas figures: the CPU one run summing a DataFrame costs forked from a template holding pandas
/// (`pandas_run_cpu_ms`), against the same run on a pooled single-use interpreter that imported pandas
/// before it (`pandas_run_cpu_ms_pooled`: its start and its import are the run's too, since each
/// interpreter serves one run); wall times; the template's memory; forked runs per second. Each round
/// counts the CPU of everything the harness runs from the run's start until its replacement (a fork,
/// an interpreter) is ready.
pub async fn pandas_figures(
    m: &mut Map<String, Value>,
    cpu: Result<&CpuMeter, &String>,
) -> Result<(), BoxError> {
    let pandas_code = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000), 'b': range(1000)})\nint(df['a'].sum() + df['b'].sum())";
    let with_pandas = |templates: bool| {
        RunPython::builder()
            .timeout(Duration::from_secs(300))
            .dependency("pandas")
            .pool(PoolConfig {
                size: 1,
                idle: Duration::from_secs(600),
                warm_imports: vec!["pandas".into()],
                prestart: true,
                templates,
            })
            .build()
    };
    let pandas_forked = with_pandas(true)?;
    let pandas_pooled = with_pandas(false)?;
    for engine in [&pandas_forked, &pandas_pooled] {
        let e = engine.run(pandas_code).await?; // prepares the environment, starts the template
        if e.return_value != json!(999_000) {
            return Err(format!("the pandas run failed: {:?}", e.error).into());
        }
    }
    match cpu {
        Ok(cpu) => {
            let per_run = |settle: Duration| {
                let cpu = &cpu;
                move |engine: RunPython| async move {
                    let (mut cpu_ms, mut wall_ms) = (Vec::new(), Vec::new());
                    for _ in 0..10 {
                        tokio::time::sleep(settle).await;
                        let (c, t) = (cpu.ms(), Instant::now());
                        let e = engine.run(pandas_code).await?;
                        wall_ms.push(t.elapsed().as_secs_f64() * 1e3);
                        assert_eq!(e.return_value, json!(999_000), "{:?}", e.error);
                        tokio::time::sleep(settle).await;
                        cpu_ms.push(cpu.ms() - c);
                    }
                    Ok::<_, Box<dyn std::error::Error>>((p50(cpu_ms), p50(wall_ms)))
                }
            };
            let (forked_cpu, forked_wall) =
                per_run(Duration::from_millis(300))(pandas_forked.clone()).await?;
            let (pooled_cpu, pooled_wall) =
                per_run(Duration::from_millis(2500))(pandas_pooled.clone()).await?;
            m.insert("pandas_run_cpu_ms".into(), json!(round3(forked_cpu)));
            m.insert("pandas_run_cpu_ms_pooled".into(), json!(round3(pooled_cpu)));
            m.insert(
                "pandas_cpu_pooled_vs_template".into(),
                json!(round3(pooled_cpu / forked_cpu)),
            );
            m.insert("pandas_run_ms".into(), json!(round3(forked_wall)));
            m.insert("pandas_run_ms_pooled".into(), json!(round3(pooled_wall)));
        }
        Err(why) => {
            m.insert("pandas_run_cpu_ms".into(), json!(format!("skipped: {why}")));
        }
    }
    if let Some(t) = pandas_forked
        .templates()
        .await
        .iter()
        .find(|t| t.site_dir.is_some())
    {
        m.insert(
            "pandas_template_rss_mib".into(),
            json!(round3(t.memory_bytes as f64 / 1048576.0)),
        );
    }
    m.insert(
        "pandas_runs_per_s_16_concurrent".into(),
        json!(round3(runs_per_s_16(&pandas_forked, pandas_code).await?)),
    );
    drop((pandas_forked, pandas_pooled));
    Ok(())
}
