//! Whether a read tells one tenant that another holds an id: reads of another tenant's artifact and
//! of an id no one has, through the engine on a file store, interleaved, median of each. A ratio
//! within noise of 1 says the answer's timing carries nothing.

use std::time::Instant;

use runpython_core::{RunPython, Store};
use runpython_store::memo_key;
use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};

/// Adds `tenant_foreign_vs_missing_read`: the median time of a read of another tenant's artifact
/// over the median of a read of a missing one (both refused alike).
pub async fn foreign_vs_missing(
    m: &mut Map<String, Value>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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
