//! The profiling driver of docs/notes/chart-run-profile.md (not built by the workspace: copy it to
//! tests/src/bin/ to build it, and take it out again). One engine (MODE=forked|pooled, STORE=file|
//! memory|none, WARM=comma-separated warm imports), N+1 runs of CELL with SETTLE ms before each; per
//! run one line: the host's wall time and every mark (the runner's, from instrument.py, and the
//! cell's own) as deltas from the one before, the first from the host's start of the call.
use std::time::Duration;
use runpython_core::{PoolConfig, RunPython, RunRequest, Store};
fn mono() -> i64 { let mut t = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 }; unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut t) }; t.tv_sec * 1_000_000_000 + t.tv_nsec }
fn main() -> Result<(), Box<dyn std::error::Error>> { runpython_tests::chart_bench::runtime()?.block_on(m()) }
async fn m() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mode = std::env::var("MODE").unwrap_or_else(|_| "forked".into());
    let store = std::env::var("STORE").unwrap_or_else(|_| "file".into());
    let warm: Vec<String> = std::env::var("WARM").unwrap_or_else(|_| "numpy,pandas,matplotlib.pyplot".into()).split(',').filter(|s| !s.is_empty()).map(String::from).collect();
    let mut b = RunPython::builder().timeout(Duration::from_secs(300))
        .env_root("/root/.cache/runpython/envs")
        .pool(PoolConfig { size: 1, idle: Duration::from_secs(600), warm_imports: warm, prestart: true, templates: mode == "forked" });
    match store.as_str() { "file" => b = b.store(Store::open(&format!("file://{}", dir.path().display()))?), "memory" => b = b.store(Store::open("memory://")?), _ => {} }
    for d in ["numpy==2.4.6", "pandas==3.1.1", "matplotlib==3.11.2"] { b = b.dependency(d); }
    let e = b.build()?;
    let code = std::fs::read_to_string(std::env::var("CELL").unwrap_or_else(|_| "/tmp/cb/prof/chart_cell_marked.py".into()))?;
    let n: usize = std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(8);
    let settle: u64 = std::env::var("SETTLE").map(|v| v.parse().unwrap()).unwrap_or(if mode == "forked" { 500 } else { 3000 });
    for i in 0..n + 1 {
        tokio::time::sleep(Duration::from_millis(settle)).await;
        let t0 = mono();
        let env = e.run(RunRequest::new(code.clone()).no_memo()).await?;
        let t1 = mono();
        let mut marks: Vec<(String, i64)> = Vec::new();
        for line in env.stderr.lines() { if let Some(rest) = line.strip_prefix("MARK ") { let mut p = rest.split(' '); marks.push((p.next().unwrap().into(), p.next().unwrap().parse()?)); } }
        if let Some(list) = env.return_value["_marks"].as_array() { for m in list { marks.push((m[0].as_str().unwrap().into(), m[1].as_i64().unwrap())); } }
        marks.sort_by_key(|m| m.1);
        let mut row = format!("{i} {:?} {:?} total={:.1}", env.status, env.isolation.as_ref().map(|i| i.start.clone()), (t1 - t0) as f64 / 1e6);
        let mut prev = t0;
        for (name, ns) in &marks { row += &format!(" {name}=+{:.1}", (ns - prev) as f64 / 1e6); prev = *ns; }
        row += &format!(" host_end=+{:.1}", (t1 - prev) as f64 / 1e6);
        if env.status != runpython_core::Status::Success { row += &format!(" ERR {:?} {}", env.error, env.stderr); }
        let other: Vec<&str> = env.stderr.lines().filter(|l| !l.starts_with("MARK ")).collect();
        if !other.is_empty() { row += &format!(" STDERR {:?}", other); }
        println!("{row}");
    }
    Ok(())
}
