//! The benchmark harness behind `cargo xtask bench`: measures every metric side by side in one run on this
//! machine and prints one JSON object. Ratios matter more than absolute numbers on a noisy machine.

use std::process::Command;
use std::time::{Duration, Instant};

use runpython_core::{tool_fn, PoolConfig, RunPython, Store};
use runpython_tests::stats::{floor_ms, p50, round3};
use runpython_tests::template_bench::{runs_per_s_16, CpuMeter};
use serde_json::{json, Map, Value};

const ROUNDS: usize = 40;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

const SOCKETPAIR_ECHO: &str = r#"
import json, os, socket, sys, time
n = int(sys.argv[1])
a, b = socket.socketpair()
if os.fork() == 0:
    a.close(); buf = b""
    while True:
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = b.recv(65536)
            if not chunk: os._exit(0)
            buf += chunk
        size = int.from_bytes(buf[:4], "big"); msg = json.loads(buf[4:4 + size]); buf = buf[4 + size:]
        out = json.dumps({"type": "result", "id": msg["id"], "result": msg["kwargs"]["x"] + 1}).encode()
        b.sendall(len(out).to_bytes(4, "big") + out)
b.close(); buf = b""
t = time.perf_counter()
for i in range(n):
    data = json.dumps({"type": "call", "id": i, "tool": "inc", "args": [], "kwargs": {"x": i}}, separators=(",", ":")).encode()
    a.sendall(len(data).to_bytes(4, "big") + data)
    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
        buf += a.recv(65536)
    size = int.from_bytes(buf[:4], "big"); json.loads(buf[4:4 + size]); buf = buf[4 + size:]
print(n / (time.perf_counter() - t))
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    runpython_tests::chart_bench::runtime()?.block_on(bench())
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let mut m = Map::new();
    // Before anything starts: every process of the harness is then counted.
    let cpu = CpuMeter::start();
    let python = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .pool(PoolConfig {
            size: 0,
            ..PoolConfig::default()
        })
        .build()?;
    let interpreter = python.interpreter().await?.clone();
    m.insert(
        "machine".into(),
        json!(machine(&interpreter.minor_version())),
    );
    let bin = std::env::current_exe()?.with_file_name("runpython");
    match std::env::var("RUNPYTHON_BENCH_SECTIONS").as_deref() {
        Ok("fixed_costs") => {
            runpython_tests::start_bench::only(&mut m, &interpreter.executable, &bin, ROUNDS)
                .await
                .map_err(|e| e.to_string())?;
            println!("{}", serde_json::to_string(&Value::Object(m))?);
            return Ok(());
        }
        Ok("pooled_deps") => {
            // numpy's environment prepared, and its import timed once, as the full bench does.
            python.run("import numpy\nnumpy.__version__").await?;
            let e = python
                .run("import time\nt = time.perf_counter()\nimport numpy\n(time.perf_counter() - t) * 1000")
                .await?;
            let numpy_import = e.return_value.as_f64().ok_or("the numpy run failed")?;
            runpython_tests::deps_bench::warm_ratio_pooled(&mut m, numpy_import)
                .await
                .map_err(|e| e.to_string())?;
            println!("{}", serde_json::to_string(&Value::Object(m))?);
            return Ok(());
        }
        Ok("egress") => {
            runpython_tests::egress_bench::egress_figures(&mut m)
                .await
                .map_err(|e| e.to_string())?;
            println!("{}", serde_json::to_string(&Value::Object(m))?);
            return Ok(());
        }
        _ => {}
    }

    // Interpreter floor and a trivial cold run, interleaved so that noise hits both alike.
    let (mut floor, mut cold) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        python.run("1+1").await?;
    }
    for _ in 0..ROUNDS {
        floor.push(floor_ms(&interpreter.executable)?);
        let t = Instant::now();
        let e = python.run("1+1").await?;
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(e.return_value, json!(2));
    }
    let (floor, cold) = (p50(floor), p50(cold));
    m.insert("python_floor_ms".into(), json!(round3(floor)));
    m.insert("cold_run_ms".into(), json!(round3(cold)));
    m.insert("run_vs_floor_cold".into(), json!(round3(cold / floor)));

    // The same cold run from the Python package, interleaved with it from Rust. Measured here, while this
    // process is small: the sandbox forks the host, and later sections grow this one.
    runpython_tests::py_bench::package_runs(&python, &mut m, ROUNDS).await?;

    // MCP: the server's cost per call over stdio against the library's, also while this process is
    // small (its pool refills fork it). The `runpython` binary sits beside this one (`cargo xtask
    // bench` builds both).
    if bin.exists() {
        let (mcp_ms, lib_ms) = runpython_tests::mcp_bench::stdio_vs_library(&bin, ROUNDS)
            .await
            .map_err(|e| e.to_string())?;
        m.insert("mcp_stdio_call_ms".into(), json!(round3(mcp_ms)));
        m.insert("mcp_library_run_ms".into(), json!(round3(lib_ms)));
        m.insert(
            "mcp_call_overhead_ms".into(),
            json!(round3(mcp_ms - lib_ms)),
        );
        // The CLI's whole process against bubblewrap's around the same interpreter.
        runpython_tests::start_bench::cli_vs_bwrap(&mut m, &bin, &interpreter.executable, ROUNDS)
            .map_err(|e| e.to_string())?;
    }

    // Warm: runs served by interpreters the pool started ahead of time. Between runs the harness lets
    // the pool's background refill finish, so each measured run finds a ready interpreter.
    let pool = |warm| runpython_tests::deps_bench::pool_engine(warm, false);
    let warm_engine = pool(Vec::new())?;
    warm_engine.run("1+1").await?;
    let (mut warm, mut floor2) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        tokio::time::sleep(Duration::from_millis(40)).await;
        let t = Instant::now();
        let e = warm_engine.run("1+1").await?;
        warm.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(e.return_value, json!(2));
        floor2.push(floor_ms(&interpreter.executable)?);
    }
    let (warm, floor2) = (p50(warm), p50(floor2));
    m.insert("pooled_run_ms".into(), json!(round3(warm)));
    m.insert("run_vs_floor_pooled".into(), json!(round3(warm / floor2)));

    // Warm: a trivial run forked from a template, against the floor; its template's memory.
    let forked =
        runpython_tests::template_bench::trivial_figures(&mut m, &interpreter.executable, ROUNDS)
            .await
            .map_err(|e| e.to_string())?;

    // Throughput: 16 runs at a time on one engine (pool of 4), 64 runs in all.
    let busy = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .pool(PoolConfig {
            size: 4,
            idle: Duration::from_secs(600),
            warm_imports: Vec::new(),
            prestart: false,
            templates: false,
        })
        .build()?;
    busy.run("1+1").await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let busy = busy.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                busy.run("sum(range(1000))").await?;
            }
            Ok::<_, runpython_core::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    m.insert(
        "runs_per_s_16_concurrent_pooled".into(),
        json!(round3(64.0 / t.elapsed().as_secs_f64())),
    );
    drop(busy);
    let forked_per_s = runs_per_s_16(&forked, "sum(range(1000))")
        .await
        .map_err(|e| e.to_string())?;
    m.insert(
        "runs_per_s_16_concurrent".into(),
        json!(round3(forked_per_s)),
    );
    // What the kernel allows for the same namespaces, mounts and cgroup joins, without Python.
    runpython_tests::start_bench::ceiling_figures(&mut m, forked_per_s, &interpreter.executable)
        .map_err(|e| e.to_string())?;

    // The same trivial run, kept in a local file store (script, output, value, manifest written).
    let store_dir = tempfile::tempdir()?;
    let kept = RunPython::builder()
        .pool(PoolConfig {
            size: 0,
            ..PoolConfig::default()
        })
        .store(Store::open(&format!(
            "file://{}",
            store_dir.path().display()
        ))?)
        .build()?;
    let (mut kept_ms, mut kept_floor) = (Vec::new(), Vec::new());
    kept.run("1+1").await?;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        kept.run("1+1").await?;
        kept_ms.push(t.elapsed().as_secs_f64() * 1e3);
        kept_floor.push(floor_ms(&interpreter.executable)?);
    }
    let (kept_ms, kept_floor) = (p50(kept_ms), p50(kept_floor));
    m.insert("cold_run_kept_ms".into(), json!(round3(kept_ms)));
    m.insert(
        "run_vs_floor_kept".into(),
        json!(round3(kept_ms / kept_floor)),
    );

    // Memo hits, coalescing and blob throughput per backend.
    runpython_tests::store_bench::figures(&mut m, store_dir.path()).await?;

    // Dependencies: a run importing numpy from a prepared environment vs. a no-deps run, side by side,
    // and numpy's own import time inside the child.
    let with_numpy = "import numpy\nnumpy.__version__";
    python.run(with_numpy).await?; // prepares the environment (a real install the first time)
    let (mut plain, mut numpy, mut numpy_import) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..20 {
        let t = Instant::now();
        python.run("1+1").await?;
        plain.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let e = python
            .run("import time\nt = time.perf_counter()\nimport numpy\n(time.perf_counter() - t) * 1000")
            .await?;
        numpy.push(t.elapsed().as_secs_f64() * 1e3);
        numpy_import.push(
            e.return_value
                .as_f64()
                .ok_or_else(|| format!("numpy run failed: {:?}", e.error))?,
        );
    }
    let (plain, numpy) = (p50(plain), p50(numpy));
    m.insert("deps_warm_numpy_run_ms".into(), json!(round3(numpy)));
    m.insert(
        "numpy_import_ms".into(),
        json!(round3(p50(numpy_import.clone()))),
    );
    m.insert("deps_warm_ratio".into(), json!(round3(numpy / plain)));

    // The same with the pool, numpy declared warm: the pooled interpreter imported it before the run.
    let numpy_import = p50(numpy_import);
    runpython_tests::deps_bench::warm_ratio_pooled(&mut m, numpy_import)
        .await
        .map_err(|e| e.to_string())?;

    // What sandboxing an install costs.
    runpython_tests::deps_bench::install_overhead(&mut m, &interpreter).await?;

    // pandas forked from a template against the same run on a pooled interpreter.
    runpython_tests::template_bench::pandas_figures(&mut m, cpu.as_ref()).await?;

    // Context economy: the envelope of a run returning a 100,000-row DataFrame, kept whole in a store
    // (its 4 MB of JSON is over the default 1 MB cap on what is kept, so the cap is raised).
    let df_store = tempfile::tempdir()?;
    let df_engine = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .max_return_bytes(20_000_000)
        .store(Store::open(&format!(
            "file://{}",
            df_store.path().display()
        ))?)
        .build()?;
    let e = df_engine
        .run("import pandas as pd\nimport numpy as np\npd.DataFrame({'id': np.arange(100_000), 'x': np.random.rand(100_000), 'name': ['n%d' % i for i in range(100_000)]})")
        .await?;
    let kept = e.artifacts.iter().any(|a| a.name == "return_value.json");
    if !e.is_success() || e.return_preview.is_none() || !kept {
        return Err(format!(
            "the DataFrame run gave no preview or did not keep the table: {:?}",
            e.error
        )
        .into());
    }
    m.insert(
        "envelope_bytes_large_df".into(),
        json!(serde_json::to_vec(&e)?.len()),
    );
    // And of an everyday run: a short script that prints a line and returns a small dict.
    let e = df_engine
        .run(
            "import statistics
data = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
def summarize(values):
    return {'n': len(values), 'mean': statistics.mean(values), 'max': max(values)}
print('summarized', len(data), 'values')
summarize(data)",
        )
        .await?;
    if !e.is_success() {
        return Err(format!("the small run failed: {:?}", e.error).into());
    }
    m.insert(
        "envelope_bytes_small_run".into(),
        json!(serde_json::to_vec(&e)?.len()),
    );

    // Import detection on a 10,000-line file.
    let source: String = (0..10_000)
        .map(|i| match i % 5 {
            0 => format!("import mod{i}\n"),
            1 => format!("from pkg{i}.sub import name\n"),
            2 => format!("def f{i}(x):\n"),
            3 => "    return [y * 2 for y in range(x) if y % 3]\n".to_owned(),
            _ => format!("value_{i} = {{'k': ({i}, 'text'), 'l': [1, 2, 3]}}\n"),
        })
        .collect();
    // Interleaved: the default (a thread per core for a file this size) and one thread.
    use runpython_deps::{ImportDetector, RuffImportDetector};
    let one_thread = RuffImportDetector::with_threads(1);
    let (mut detect, mut detect_one) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        let found = runpython_deps::detect_imports(&source)?;
        detect.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(found.len(), 4000);
        let t = Instant::now();
        let found = one_thread.detect(&source)?;
        detect_one.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(found.len(), 4000);
    }
    m.insert("import_detect_10k_ms".into(), json!(round3(p50(detect))));
    m.insert(
        "import_detect_10k_ms_1_thread".into(),
        json!(round3(p50(detect_one))),
    );

    // 1 GiB printed: host memory must stay flat and the envelope within the output limit.
    let _ = std::fs::write("/proc/self/clear_refs", "5"); // reset the peak-RSS counter
    let before = status_kib("VmRSS:");
    let t = Instant::now();
    let e = python
        .run("import sys\nline = 'x' * 1023 + '\\n'\nblock = line * 1024\nfor _ in range(1024):\n    sys.stdout.write(block)")
        .await?;
    let flood_s = t.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:");
    let total = e
        .truncated
        .as_ref()
        .and_then(|t| t.stdout.as_ref())
        .map_or(0, |t| t.total_chars);
    assert_eq!(total, 1 << 30, "the flood printed {total} characters");
    m.insert(
        "flood_rss_growth_mib".into(),
        json!(round3(peak.saturating_sub(before) as f64 / 1024.0)),
    );
    m.insert("flood_gib_per_s".into(), json!(round3(1.0 / flood_s)));
    m.insert(
        "flood_envelope_stdout_chars".into(),
        json!(e.stdout.chars().count()),
    );

    // Sequential tool calls through the bridge vs. a Python⇄Python socketpair with the same framing.
    let n: u32 = 20_000;
    let bridge = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .max_tool_calls(n + 1)
        .tool(tool_fn(
            "inc",
            "x + 1",
            Some(json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})),
            |a| async move { Ok(json!(a.get("x").and_then(Value::as_i64).unwrap_or(0) + 1)) },
        ))
        .build()?;
    let e = bridge
        .run(format!("import time\ninc(0)\nt = time.perf_counter()\nfor i in range({n}):\n    inc(i)\n{n} / (time.perf_counter() - t)"))
        .await?;
    let bridge_rate = e
        .return_value
        .as_f64()
        .ok_or_else(|| format!("bridge bench failed: {:?}", e.error))?;
    let out = Command::new(&interpreter.executable)
        .args(["-I", "-S", "-c", SOCKETPAIR_ECHO, &n.to_string()])
        .output()?;
    let ceiling: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    m.insert("bridge_calls_per_s".into(), json!(bridge_rate.round()));
    m.insert("socketpair_calls_per_s".into(), json!(ceiling.round()));
    m.insert(
        "bridge_vs_socketpair".into(),
        json!(round3(bridge_rate / ceiling)),
    );

    // A plain Python callable as the tool, against the Rust tool just measured.
    runpython_tests::py_bench::package_tools(&mut m, bridge_rate)?;

    // Human in the loop: a resumed run replaying 100 journaled calls vs. the original run making them.
    let hitl_dir = tempfile::tempdir()?;
    let hitl = RunPython::builder()
        .store(Store::open(&format!(
            "file://{}",
            hitl_dir.path().display()
        ))?)
        .approval("request_approval")
        .tool(tool_fn("inc", "x + 1", None, |a| async move {
            Ok(json!(
                a.arg(0, "x").and_then(Value::as_i64).unwrap_or(0) + 1
            ))
        }))
        .build()?;
    let code = "s = sum(inc(i) for i in range(100))\nok = request_approval(s)\n[s, ok]";
    let (mut original, mut resumed) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let t = Instant::now();
        let e = hitl.run(code).await?;
        original.push(t.elapsed().as_secs_f64() * 1e3);
        let id = e
            .suspension
            .as_ref()
            .and_then(|s| s["id"].as_str())
            .ok_or("no suspension")?
            .to_owned();
        let t = Instant::now();
        let done = hitl.resume(&e.run_id, [(id, json!(true))].into()).await?;
        resumed.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(done.return_value, json!([5050, true]));
    }
    let (original, resumed) = (p50(original), p50(resumed));
    m.insert("hitl_original_run_ms".into(), json!(round3(original)));
    m.insert("hitl_resumed_run_ms".into(), json!(round3(resumed)));
    m.insert(
        "replay_overhead_ratio".into(),
        json!(round3(resumed / original)),
    );

    // Sessions: a trivial cell in a live session (no process starts) against the floor, interleaved;
    // a 20-cell session restored (replayed) on a second engine sharing a file store; the memory an
    // idle session holds (the interpreter's RSS and its init's, read from the cgroup-less view of
    // /proc: every process of the run).
    {
        let store_dir = tempfile::tempdir()?;
        let url = format!("file://{}", store_dir.path().display());
        let engine = || {
            RunPython::builder()
                .timeout(Duration::from_secs(120))
                .store(runpython_core::Store::open(&url)?)
                .build()
        };
        let first = engine()?;
        let session = first.session();
        session.run("x = 0").await?;
        // The live session alone (no store), and the same cell recorded in a file store (durable:
        // its record and its run's manifest written before it answers), alternating.
        let before_live = session_processes().0;
        let live_engine = RunPython::builder()
            .timeout(Duration::from_secs(120))
            .build()?;
        let live = live_engine.session();
        live.run("x = 0").await?;
        let (mut cells, mut kept_cells, mut floor3) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS * 4 {
            let t = Instant::now();
            let e = live.run("x += 1").await?;
            cells.push(t.elapsed().as_secs_f64() * 1e6);
            assert!(e.is_success(), "{:?}", e.error);
            let t = Instant::now();
            let e = session.run("x += 1").await?;
            kept_cells.push(t.elapsed().as_secs_f64() * 1e6);
            assert!(e.is_success(), "{:?}", e.error);
        }
        // Gone before the idle session is measured below.
        live.close().await?;
        for _ in 0..100 {
            if session_processes().0 <= before_live {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..ROUNDS {
            floor3.push(floor_ms(&interpreter.executable)?);
        }
        let (cell_us, floor3) = (p50(cells), p50(floor3));
        m.insert("session_cell_us".into(), json!(round3(cell_us)));
        m.insert(
            "session_cell_vs_floor".into(),
            json!(round3(cell_us / 1e3 / floor3)),
        );
        m.insert(
            "session_cell_kept_us".into(),
            json!(round3(p50(kept_cells))),
        );
        // What an idle session holds: the RSS of the session's processes (its interpreter, its init).
        let pids = session.run("import os\nos.getpid()").await?;
        let _ = pids;
        let idle_kib = session_processes().1;
        m.insert(
            "session_idle_rss_mib".into(),
            json!(round3(idle_kib as f64 / 1024.0)),
        );
        drop(session);
        drop(first);
        runpython_tests::session_bench::restore_figures(&mut m)
            .await
            .map_err(|e| e.to_string())?;
    }

    // Egress: the same client to the same loopback server, through the policy and direct.
    runpython_tests::egress_bench::egress_figures(&mut m)
        .await
        .map_err(|e| e.to_string())?;
    // Displays: a run showing one small matplotlib figure against one that only makes it.
    runpython_tests::display_bench::display_figures(&mut m)
        .await
        .map_err(|e| e.to_string())?;
    // Real work: the chart cell through runpython's one-shot paths and a session, against a warm
    // Jupyter kernel and a plain Python process running it (their venv made by `cargo xtask bench`).
    match std::env::var_os("RUNPYTHON_BENCH_CHART_PYTHON") {
        Some(python) => runpython_tests::chart_bench::chart_figures(&mut m, python.as_ref(), cpu.as_ref().ok(), bin.exists().then_some(bin.as_path()))
            .await
            .map_err(|e| e.to_string())?,
        None => eprintln!(
            "skipped the chart figures: RUNPYTHON_BENCH_CHART_PYTHON names no venv with Jupyter and the data stack (cargo xtask bench makes one)"
        ),
    }
    // Secrets: an HTTPS request with the value put in by the host, against one passed through.
    runpython_tests::egress_bench::secret_figures(&mut m)
        .await
        .map_err(|e| e.to_string())?;

    // Tenants: a refused read of another tenant's id against one of a missing id.
    runpython_tests::tenant_bench::foreign_vs_missing(&mut m)
        .await
        .map_err(|e| e.to_string())?;

    // MCP: HTTP throughput with 16 concurrent clients, to one host and through a load balancer.
    if bin.exists() {
        let rate = runpython_tests::mcp_bench::http_calls_per_s(&bin, 16, 8)
            .await
            .map_err(|e| e.to_string())?;
        m.insert("http_calls_per_s".into(), json!(rate.round()));
        // A tenant's trivial run while another floods the host, against the same run alone.
        runpython_tests::tenant_bench::fair_latency(&bin, &mut m)
            .await
            .map_err(|e| e.to_string())?;
        // The same load through HAProxy (deploy/haproxy/haproxy.cfg as shipped) to three hosts.
        let haproxy = std::env::var_os("RUNPYTHON_TOOLS_BIN")
            .map(|dir| std::path::PathBuf::from(dir).join("haproxy"))
            .filter(|p| p.exists());
        match haproxy {
            Some(haproxy) => {
                let root = std::env::current_dir()?;
                let rate =
                    runpython_tests::mcp_bench::lb_calls_per_s(&bin, &haproxy, &root, 16, 8)
                        .await
                        .map_err(|e| e.to_string())?;
                m.insert("lb_calls_per_s".into(), json!(rate.round()));
            }
            None => eprintln!(
                "skipped lb_calls_per_s: no haproxy in RUNPYTHON_TOOLS_BIN (cargo xtask tools installs it)"
            ),
        }
    } else {
        eprintln!(
            "skipped the MCP figures: {} is not built (cargo build --release -p runpython-cli)",
            bin.display()
        );
    }

    println!("{}", serde_json::to_string(&Value::Object(m))?);
    Ok(())
}

/// The processes of every live session this host runs (those whose command line is a session
/// runner's, `--session`): how many, and their RSS summed in KiB (the init shares the interpreter's
/// start-up memory and holds little of its own).
fn session_processes() -> (usize, u64) {
    let (mut count, mut total) = (0, 0);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return (0, 0);
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains("--session") {
            continue;
        }
        count += 1;
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    (count, total)
}

fn machine(python: &str) -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1).map(|v| v.trim().to_owned()))
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({"cpu": cpu, "cores": cores, "kernel": kernel.trim(), "python": python})
}
