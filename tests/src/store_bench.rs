//! The store's own figures: a memo hit (no process, the envelope from the in-memory cache), how many
//! times 16 identical memoized runs at once really run (coalescing), and blob throughput per backend.

use std::path::Path;
use std::time::{Duration, Instant};

use runpython_core::{tool_fn, RunPython, Store};
use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};
use crate::Moto;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Adds `memo_hit_us`, `memo_coalesced_runs` and `store_put_get_mib_s_{memory,file,s3}` (s3 when moto
/// is installed); `scratch` holds the file backend's blobs.
pub async fn figures(m: &mut Map<String, Value>, scratch: &Path) -> Result<()> {
    // A memo hit: no process, the envelope from the in-memory cache in front of the store.
    let memo = RunPython::builder()
        .memoize(Duration::from_secs(3600))
        .build()?;
    memo.run("1+1").await?;
    let mut hits = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        let e = memo.run("1+1").await?;
        hits.push(t.elapsed().as_secs_f64() * 1e6);
        assert!(e.cached);
    }
    m.insert("memo_hit_us".into(), json!(round3(p50(hits))));

    // Coalescing: 16 identical memoized runs at once in one engine; a pure tool counts how many times
    // the code really ran (target 1: the first runs, the others wait for its envelope).
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = std::sync::Arc::clone(&executions);
    let coalescing = RunPython::builder()
        .memoize(Duration::from_secs(3600))
        .tool(
            tool_fn("count", "Counts executions.", None, move |_| {
                let counter = std::sync::Arc::clone(&counter);
                async move {
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(json!(null))
                }
            })
            .pure(),
        )
        .build()?;
    let mut identical = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let engine = coalescing.clone();
        identical.spawn(async move { engine.run("count()\nsum(range(1000))").await });
    }
    for run in identical.join_all().await {
        assert_eq!(run?.return_value, json!(499500));
    }
    m.insert(
        "memo_coalesced_runs".into(),
        json!(executions.load(std::sync::atomic::Ordering::SeqCst)),
    );

    // Blob throughput per backend: put then get 8 MiB objects.
    let moto = Moto::start().ok().flatten();
    let mut backends = vec![
        ("memory", "memory://".to_owned()),
        (
            "file",
            format!("file://{}", scratch.join("blobs").display()),
        ),
    ];
    if let Some(moto) = &moto {
        moto.create_bucket("bench")?;
        backends.push(("s3", moto.url("bench", "throughput")));
    }
    for (name, url) in backends {
        let store = Store::open(&url)?;
        let blob: Vec<u8> = (0..8u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
            .collect();
        let rounds = 4;
        let t = Instant::now();
        for i in 0..rounds {
            let mut b = blob.clone();
            b[0] = i as u8; // distinct content, distinct blob
            let id = store.put_blob(b).await?;
            let back = store.get_run_artifact(&id).await?;
            assert_eq!(back.len(), blob.len());
        }
        let mib = (rounds * 2 * 8) as f64;
        m.insert(
            format!("store_put_get_mib_s_{name}"),
            json!(round3(mib / t.elapsed().as_secs_f64())),
        );
    }
    drop(moto);
    Ok(())
}
