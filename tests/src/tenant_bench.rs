//! What one tenant can learn of, or take from, another: whether a read tells it that another holds
//! an id (reads of another tenant's artifact and of an id no one has, through the engine on a file
//! store, interleaved, median of each: a ratio within noise of 1 says the answer's timing carries
//! nothing), and how much slower a tenant's trivial run is while another floods the host.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_core::{RunPython, Store};
use runpython_store::memo_key;
use serde_json::{json, Map, Value};

use crate::mcp_bench::{bench_token, serve_host_with, stop, HttpClient};
use crate::stats::{p50, round3};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Adds `tenant_foreign_vs_missing_read`: the median time of a read of another tenant's artifact
/// over the median of a read of a missing one (both refused alike).
pub async fn foreign_vs_missing(m: &mut Map<String, Value>) -> Result<()> {
    const ROUNDS: usize = 400;
    let dir = tempfile::tempdir()?;
    let store = Store::open(&format!("file://{}", dir.path().display()))?;
    let alice = store.tenant("alice")?;
    let bob = RunPython::builder().store(store).build()?.tenant("bob")?;
    let theirs = alice.put_blob(vec![7u8; 4096]).await?;
    // An id of the same shape that no one has.
    let missing = memo_key([b"never stored".as_slice()]).as_str().to_owned();
    let (mut foreign, mut absent) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let order = if i % 2 == 0 {
            [(&theirs, true), (&missing, false)]
        } else {
            [(&missing, false), (&theirs, true)]
        };
        for (id, is_foreign) in order {
            let t = Instant::now();
            let read = bob.get_run_artifact(id).await;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if read.is_ok() {
                return Err("bob read alice's artifact".into());
            }
            if is_foreign {
                foreign.push(us);
            } else {
                absent.push(us);
            }
        }
    }
    m.insert(
        "tenant_foreign_vs_missing_read".into(),
        json!(round3(p50(foreign) / p50(absent))),
    );
    Ok(())
}

/// Adds `tenant_fair_latency_ratio`: the p50 latency of tenant B's trivial run (`1+1`, through
/// `runpython serve` over HTTP) while tenant A floods the host, over B's p50 alone, on a host with
/// the shipped limits (`--max-runs-in-flight`, `--max-runs-per-token`). A floods with 16 callers,
/// each starting a run of half a second again as soon as its last is answered (a refused one again
/// after 20 ms): it holds every place its share gives it, which is what a tenant can take from
/// another (the CPU its runs use is shared by the kernel, not by runpython). Also
/// `tenant_fair_flooded_ms`, B's p50 during the flood.
pub async fn fair_latency(bin: &Path, m: &mut Map<String, Value>) -> Result<()> {
    const CALLS: usize = 20;
    let (alice, bob) = (bench_token(), bench_token());
    let (host, base) = serve_host_with(
        bin,
        &[("alice", &alice), ("bob", &bob)],
        &["--no-store", "--timeout", "120"],
    )
    .await?;
    let url = format!("{base}/mcp");
    let b = HttpClient::connect(&url, &bob).await?;
    b.call(1, "1+1").await?;
    let alone = latencies(&b, 100, CALLS).await?;
    let flooding = Arc::new(AtomicBool::new(true));
    let mut flood = Vec::new();
    for _ in 0..16 {
        let (url, alice, flooding) = (url.clone(), alice.clone(), Arc::clone(&flooding));
        flood.push(tokio::spawn(async move {
            let a = HttpClient::connect(&url, &alice).await?;
            let mut id = 1;
            while flooding.load(Ordering::Relaxed) {
                id += 1;
                if a.call(id, "import time; time.sleep(0.5)").await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let flooded = latencies(&b, 1000, CALLS).await;
    flooding.store(false, Ordering::Relaxed);
    for task in flood {
        task.await??;
    }
    stop(host).await;
    let (alone, flooded) = (p50(alone), p50(flooded?));
    m.insert(
        "tenant_fair_latency_ratio".into(),
        json!(round3(flooded / alone)),
    );
    m.insert("tenant_fair_flooded_ms".into(), json!(round3(flooded)));
    Ok(())
}

/// Milliseconds of each of `calls` trivial runs of `client`, one at a time, after `first_id`.
async fn latencies(client: &HttpClient, first_id: u64, calls: usize) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(calls);
    for id in first_id..first_id + calls as u64 {
        // The pool refills between runs, as it does between a model's calls.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        client.call(id, "1+1").await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(samples)
}
