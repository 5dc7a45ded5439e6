//! A host for the host-cost tests (`tests/host_costs.rs`): runs one scenario in a process of its own
//! and prints one JSON object: what the run returned and what it cost this process, its peak resident
//! memory (`VmHWM`) and the bytes it wrote (`wchar`), so each figure is this scenario's alone.
//!
//! Usage: `runpython-costs SCENARIO STORE_DIR [N] [BYTES]`
//! - `journal N BYTES`: N sequential tool calls whose argument and result are BYTES long.
//! - `durable N BYTES`: the same in a durable run (every call journaled in the store).
//! - `read-artifact N BYTES`: an artifact of BYTES zeros is stored, then N threads of the code read one
//!   byte of it at once.
//! - `files N`: the code leaves N empty files in nested directories.

use std::time::Duration;

use runpython_core::{tool_fn, PoolConfig, RunPython, Store};
use serde_json::{json, Value};

fn status_field(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: runpython-costs SCENARIO STORE_DIR [N] [BYTES]";
    let scenario = args.get(1).ok_or(usage)?.clone();
    let dir = args.get(2).ok_or(usage)?.clone();
    let n: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let bytes: usize = args.get(4).map_or(Ok(0), |s| s.parse())?;
    let store = Store::open(&format!("file://{dir}"))?;
    let echo = tool_fn(
        "echo",
        "Returns its argument.",
        Some(json!({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]})),
        |args| async move { Ok(args.get("x").cloned().unwrap_or(Value::Null)) },
    );
    let mut builder = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .pool(PoolConfig {
            size: 0,
            ..PoolConfig::default()
        })
        .store(store.clone())
        .tool(echo);
    let code = match scenario.as_str() {
        "journal" | "durable" => {
            if scenario == "durable" {
                builder = builder.durable(true);
            }
            format!(
                "v = 'x' * {bytes}\nfor _ in range({n}):\n    assert len(echo(x=v)) == {bytes}\n{n}"
            )
        }
        "read-artifact" => {
            let zeros = tokio::io::AsyncReadExt::take(tokio::io::repeat(0), bytes as u64);
            let (id, _) = store.put_blob_reader(zeros).await?;
            format!(
                "import threading\nout = []\n\
                 ts = [threading.Thread(target=lambda: out.append(read_artifact({id:?}, 0, 1))) for _ in range({n})]\n\
                 [t.start() for t in ts]\n[t.join() for t in ts]\nlen(out)"
            )
        }
        "files" => format!(
            "import os\nfor i in range({n}):\n    d = os.path.join(*['d%d' % (i % 10)] * 8)\n    os.makedirs(d, exist_ok=True)\n    open(os.path.join(d, 'f%d' % i), 'w').close()\n{n}"
        ),
        other => return Err(format!("unknown scenario {other:?}; {usage}").into()),
    };
    let python = builder.build()?;
    let wchar_before = status_field("/proc/self/io", "wchar:");
    let envelope = python.run(code).await?;
    let wchar = status_field("/proc/self/io", "wchar:") - wchar_before;
    let peak_kib = status_field("/proc/self/status", "VmHWM:");
    drop(python);
    println!(
        "{}",
        json!({"envelope": envelope, "peak_rss_kib": peak_kib, "wchar": wchar})
    );
    Ok(())
}
