//! A session's restore on a second engine: a 50-cell session whose cells each take 20 ms, brought back
//! from its snapshot (the cells after it replayed), against one of its cells (issue 42: before
//! snapshots, a restore replayed every cell).

use std::time::{Duration, Instant};

use runpython_core::RunPython;
use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};

/// Adds `session_restore_ms` (the restored session's first cell, restore included),
/// `session_restore_snapshot_ms` (the snapshot's load, by the interpreter's clock),
/// `session_restore_replayed` (cells replayed after it) and `session_restore_vs_cell` (the restore
/// less the snapshot's load, over the p50 of one of the session's cells).
pub async fn restore_figures(
    m: &mut Map<String, Value>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = tempfile::tempdir()?;
    let url = format!("file://{}", dir.path().display());
    let engine = || {
        RunPython::builder()
            .timeout(Duration::from_secs(120))
            .store(runpython_core::Store::open(&url)?)
            .build()
    };
    let first = engine()?;
    let fifty = first.session();
    fifty.run("import time\nrows = []").await?;
    let mut own = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        fifty
            .run("time.sleep(0.02)\nrows.append(len(rows))")
            .await?;
        own.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let id = fifty.id().to_owned();
    drop(fifty);
    drop(first); // the first host is gone, its interpreter with it
    let second = engine()?;
    let t = Instant::now();
    let e = second.session_with_id(&id)?.run("len(rows)").await?;
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    if !(e.restored && e.return_value == json!(50)) {
        return Err(format!("the session did not come back whole: {e:?}").into());
    }
    let restore = e
        .restore
        .ok_or("a restored cell without its restore report")?;
    let load_ms = restore.snapshot_ms.unwrap_or(0.0);
    m.insert("session_restore_ms".into(), json!(round3(restore_ms)));
    m.insert("session_restore_snapshot_ms".into(), json!(round3(load_ms)));
    m.insert("session_restore_replayed".into(), json!(restore.replayed));
    m.insert(
        "session_restore_vs_cell".into(),
        json!(round3((restore_ms - load_ms) / p50(own))),
    );
    Ok(())
}
