//! What one run costs its host outside the sandbox, where the cgroup, the tmpfs and the rlimits do
//! not reach: memory the host holds for it, bytes it writes for it, what it keeps of it. Each figure
//! is a difference or a ratio against the same run made small, measured in one test, each scenario in
//! a host process of its own (`runpython-costs`) so its peak memory is its alone.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::process::Command;

use serde_json::Value;

/// Runs `runpython-costs SCENARIO DIR N BYTES` with a fresh store; its report and the store's size.
fn costs(scenario: &str, n: usize, bytes: usize) -> (Value, u64) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_runpython-costs"))
        .args([scenario, dir.path().to_str().unwrap()])
        .args([n.to_string(), bytes.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{scenario}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["envelope"]["status"], "success",
        "{scenario}: {}",
        report["envelope"]
    );
    (report, dir_size(dir.path()))
}

fn dir_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.path().symlink_metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

fn peak_mib(report: &Value) -> f64 {
    report["peak_rss_kib"].as_u64().unwrap() as f64 / 1024.0
}

#[test]
fn reading_a_byte_of_a_large_artifact_costs_the_host_the_byte() {
    let (small, _) = costs("read-artifact", 0, 192 << 20);
    let (reads, _) = costs("read-artifact", 8, 192 << 20);
    assert_eq!(reads["envelope"]["return_value"], 8);
    let grew = peak_mib(&reads) - peak_mib(&small);
    eprintln!("8 one-byte reads of 192 MiB: the host's peak grew {grew:.1} MiB");
    assert!(
        grew < 96.0,
        "8 one-byte reads of 192 MiB cost the host {grew:.0} MiB"
    );
}

#[test]
fn journaled_values_cost_the_host_bounded_memory() {
    let (small, _) = costs("journal", 24, 8);
    let (large, _) = costs("journal", 24, 4 << 20);
    let grew = peak_mib(&large) - peak_mib(&small);
    eprintln!("24 journaled 4 MiB values: the host's peak grew {grew:.1} MiB");
    assert!(
        grew < 64.0,
        "24 journaled 4 MiB values cost the host {grew:.0} MiB"
    );
    let (small, _) = costs("durable", 24, 8);
    let (large, _) = costs("durable", 24, 4 << 20);
    let grew = peak_mib(&large) - peak_mib(&small);
    eprintln!("24 journaled 4 MiB values, durable: the host's peak grew {grew:.1} MiB");
    assert!(
        grew < 64.0,
        "24 journaled 4 MiB values of a durable run cost the host {grew:.0} MiB"
    );
}

#[test]
fn a_durable_run_writes_the_same_per_call_whatever_its_length() {
    let per_call = |n: usize| {
        let (report, _) = costs("durable", n, 1 << 20);
        report["wchar"].as_u64().unwrap() as f64 / n as f64
    };
    let (ten, forty) = (per_call(10), per_call(40));
    eprintln!("bytes written per durable call: {ten:.0} at 10 calls, {forty:.0} at 40");
    assert!(
        forty / ten < 1.6,
        "bytes written per call: {ten:.0} at 10 calls, {forty:.0} at 40"
    );
}

#[test]
fn files_past_the_cap_grow_the_store_by_a_bounded_amount() {
    let (_, few) = costs("files", 200, 0);
    let (_, many) = costs("files", 20_000, 0);
    eprintln!("store growth: {few} bytes for 200 files, {many} for 20,000");
    assert!(
        (many as f64) < 4.0 * few as f64,
        "a run leaving 200 files grew the store by {few} bytes, 20,000 files by {many}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_of_busy_processes_leaves_the_other_runs_their_cpu() {
    use std::time::{Duration, Instant};

    use runpython_core::{PoolConfig, RunPython};

    let engine = || {
        RunPython::builder()
            .timeout(Duration::from_secs(60))
            .pool(PoolConfig {
                size: 0,
                ..PoolConfig::default()
            })
            .build()
            .unwrap()
    };
    let (busy, trivial) = (engine(), engine());
    if trivial.isolation_report().unwrap().cpu.cpus.is_none() {
        eprintln!("skipped: this host gives runs no CPU share (no cgroup cpu controller)");
        return;
    }
    let p50 = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    async fn timed(python: &RunPython) -> f64 {
        let t = Instant::now();
        let e = python.run("1 + 1").await.unwrap();
        assert_eq!(e.return_value, serde_json::json!(2));
        t.elapsed().as_secs_f64()
    }
    for _ in 0..2 {
        timed(&trivial).await;
    }
    let mut alone = Vec::new();
    for _ in 0..5 {
        alone.push(timed(&trivial).await);
    }
    // 32 processes spinning until the run is stopped.
    let spin = "import os, time\nfor _ in range(31):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass";
    let mut handle = busy.start(spin);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut beside = Vec::new();
    for _ in 0..5 {
        beside.push(timed(&trivial).await);
    }
    handle.cancel();
    let (alone, beside) = (p50(alone), p50(beside));
    eprintln!(
        "a trivial run: {:.1} ms alone, {:.1} ms beside 32 busy processes",
        alone * 1e3,
        beside * 1e3
    );
    assert!(
        beside < 3.0 * alone,
        "a trivial run took {beside:.3} s beside a busy run, {alone:.3} s alone"
    );
}
