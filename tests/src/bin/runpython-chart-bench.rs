//! The chart figures of the benchmark harness alone (`chart_bench.rs`), for iterating on the cost of
//! real work without the whole `cargo xtask bench`: prints one JSON object.
//!
//! Usage: `RUNPYTHON_BENCH_CHART_PYTHON=target/chart-bench-venv/bin/python runpython-chart-bench`
//! (`cargo xtask bench` makes that venv; `tests/benches/jupyter_requirements.txt` says what it holds).
//! The hosted CLI figure needs the `runpython` binary beside this one (`cargo build --release -p
//! runpython-cli`); without it that figure is left out.

use serde_json::{Map, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Blocking threads kept alive: a session's interpreter dies with the thread that started it.
    runpython_tests::chart_bench::runtime()?.block_on(bench())
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let Some(python) = std::env::var_os("RUNPYTHON_BENCH_CHART_PYTHON") else {
        eprintln!(
            "runpython-chart-bench: set RUNPYTHON_BENCH_CHART_PYTHON to the python of a venv made from \
             tests/benches/jupyter_requirements.txt (cargo xtask bench makes target/chart-bench-venv)"
        );
        std::process::exit(2);
    };
    let mut m = Map::new();
    let cpu = runpython_tests::template_bench::CpuMeter::start().ok();
    let bin = std::env::current_exe()?.with_file_name("runpython");
    let runpython = bin.exists().then_some(bin.as_path());
    runpython_tests::chart_bench::chart_figures(&mut m, python.as_ref(), cpu.as_ref(), runpython)
        .await
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string(&Value::Object(m))?);
    Ok(())
}
