//! What showing a chart costs: a run that makes one small matplotlib figure and shows it (a display:
//! the PNG drawn and written, its entry in the envelope) against the same run that makes it and
//! closes it, alternating, in one engine whose environment holds matplotlib.

use std::time::{Duration, Instant};

use runpython_core::{RunPython, RunRequest, Status};
use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const MAKE: &str = "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(2, 2), dpi=50)\nplt.plot([1, 3, 2])\n";

/// Adds `display_png_overhead_ms` and the two run times behind it.
pub async fn display_figures(m: &mut Map<String, Value>) -> Result<(), BoxError> {
    let engine = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let shown = format!("{MAKE}plt.show()");
    let closed = format!("{MAKE}plt.close('all')");
    let run = |code: String| {
        let engine = engine.clone();
        async move {
            let t = Instant::now();
            let e = engine
                .run(RunRequest::new(code).dependency("matplotlib").no_memo())
                .await?;
            if e.status != Status::Success {
                return Err(format!("the display bench's run failed: {:?}", e.error).into());
            }
            Ok::<_, BoxError>((t.elapsed().as_secs_f64() * 1e3, e.displays.len()))
        }
    };
    // The first run installs matplotlib into the environment cache.
    run(closed.clone()).await?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let (ms, displays) = run(shown.clone()).await?;
        if displays != 1 {
            return Err(format!("the shown figure made {displays} displays").into());
        }
        with.push(ms);
        without.push(run(closed.clone()).await?.0);
    }
    let (with, without) = (p50(with), p50(without));
    m.insert("display_png_run_ms".into(), json!(round3(with)));
    m.insert("display_png_run_ms_closed".into(), json!(round3(without)));
    m.insert(
        "display_png_overhead_ms".into(),
        json!(round3(with - without)),
    );
    Ok(())
}
