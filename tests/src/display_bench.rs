//! What showing a chart costs: a run that makes one small matplotlib figure and shows it (a display:
//! the PNG drawn and written, its entry in the envelope) against the same run that makes it and
//! closes it, alternating, in one engine whose environment holds matplotlib. Timed inside the run
//! from the figure's start to the end of `show()` (or `close`), since a matplotlib run's start
//! (its import and font cache, ~0.8 s here) would drown the difference; the host-side run times are
//! reported beside it.

use std::time::{Duration, Instant};

use runpython_core::{RunPython, RunRequest, Status};
use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const MAKE: &str = "import time\nimport matplotlib.pyplot as plt\nt = time.perf_counter()\nfig = plt.figure(figsize=(2, 2), dpi=50)\nplt.plot([1, 3, 2])\n";

/// Adds `display_png_overhead_ms` and the two run times behind it.
pub async fn display_figures(m: &mut Map<String, Value>) -> Result<(), BoxError> {
    let engine = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let shown = format!("{MAKE}plt.show()\n(time.perf_counter() - t) * 1e3");
    let closed = format!("{MAKE}plt.close('all')\n(time.perf_counter() - t) * 1e3");
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
            let inside = e.return_value.as_f64().unwrap_or(f64::NAN);
            Ok::<_, BoxError>((t.elapsed().as_secs_f64() * 1e3, inside, e.displays.len()))
        }
    };
    // The first run installs matplotlib into the environment cache.
    run(closed.clone()).await?;
    let (mut with, mut without, mut run_with, mut run_without) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..10 {
        let (ms, inside, displays) = run(shown.clone()).await?;
        if displays != 1 {
            return Err(format!("the shown figure made {displays} displays").into());
        }
        with.push(inside);
        run_with.push(ms);
        let (ms, inside, _) = run(closed.clone()).await?;
        without.push(inside);
        run_without.push(ms);
    }
    let (with, without) = (p50(with), p50(without));
    m.insert("display_png_ms".into(), json!(round3(with)));
    m.insert("display_png_ms_closed".into(), json!(round3(without)));
    m.insert(
        "display_png_overhead_ms".into(),
        json!(round3(with - without)),
    );
    m.insert("display_png_run_ms".into(), json!(round3(p50(run_with))));
    m.insert(
        "display_png_run_ms_closed".into(),
        json!(round3(p50(run_without))),
    );
    Ok(())
}
