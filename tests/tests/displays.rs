//! Displays: `display(obj)` (a builtin, and `from runpython_display import display`), the last
//! expression's rich forms and matplotlib's figures become the envelope's `displays`, text inline
//! within bounds and images as files (artifacts of a kept run). matplotlib comes from PyPI through
//! the dependency provider.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::time::Duration;

use runpython_core::{Envelope, RunPython, RunRequest, Status, Store};
use serde_json::{json, Value};

fn kept() -> (tempfile::TempDir, RunPython) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let python = RunPython::builder()
        .store(store)
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    (dir, python)
}

fn ok(e: &Envelope) {
    assert_eq!(e.status, Status::Success, "{:?} {}", e.error, e.stderr);
}

const RICH: &str = r##"
class Html:
    def _repr_html_(self):
        return "<b>bold</b>"
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/markdown": "# title", "application/json": {"k": [1, 2]}, "text/plain": "Bundle!"}
"##;

#[tokio::test(flavor = "multi_thread")]
async fn objects_show_their_formats_and_a_trivial_run_shows_nothing() {
    let python = RunPython::builder().build().unwrap();
    let e = python
        .run(format!("{RICH}\ndisplay(Html())\nfrom runpython_display import display as d\nd(Bundle(), 42)\nHtml()"))
        .await
        .unwrap();
    ok(&e);
    let d = &e.displays;
    assert_eq!(d.len(), 4, "{d:?}");
    assert_eq!(d[0]["formats"]["text/html"], "<b>bold</b>");
    assert!(d[0]["formats"]["text/plain"]
        .as_str()
        .unwrap()
        .contains("Html object"));
    assert_eq!(d[1]["formats"]["text/markdown"], "# title");
    assert_eq!(d[1]["formats"]["application/json"], r#"{"k":[1,2]}"#);
    assert_eq!(d[1]["formats"]["text/plain"], "Bundle!");
    assert_eq!(d[2]["formats"], json!({"text/plain": "42"}));
    // The last expression, rich, is displayed too, besides its value.
    assert_eq!(d[3]["formats"]["text/html"], "<b>bold</b>");
    let trivial = python.run("x = 1\nx + 1").await.unwrap();
    assert!(trivial.displays.is_empty());
    assert!(!serde_json::to_string(&trivial)
        .unwrap()
        .contains("displays"));
}

#[tokio::test(flavor = "multi_thread")]
async fn cells_display_with_what_earlier_cells_defined() {
    let python = RunPython::builder().build().unwrap();
    let session = python.session();
    let first = session
        .run(format!("{RICH}\ndisplay(Html())"))
        .await
        .unwrap();
    ok(&first);
    assert_eq!(first.displays.len(), 1);
    let second = session.run("display(Bundle())").await.unwrap();
    ok(&second);
    assert_eq!(
        second.displays.len(),
        1,
        "each cell its own: {:?}",
        second.displays
    );
    assert_eq!(second.displays[0]["formats"]["text/markdown"], "# title");
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_large_displays_stay_within_the_envelope_budget() {
    let python = RunPython::builder().build().unwrap();
    let code = "class Big:\n    def _repr_html_(self):\n        return '<td>x</td>' * 100000\n    def __repr__(self):\n        return 'y' * 100000\nfor _ in range(10):\n    display(Big())";
    let e = python.run(code).await.unwrap();
    ok(&e);
    assert_eq!(e.displays.len(), 10);
    let bytes = serde_json::to_vec(&e).unwrap().len();
    assert!(bytes <= 8192, "{bytes} bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn matplotlib_figures_become_image_displays_kept_as_artifacts() {
    let (_dir, python) = kept();
    let code = "import matplotlib.pyplot as plt\n\
        plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3])\nplt.show()\n\
        fig, ax = plt.subplots(figsize=(2, 2), dpi=50)\nax.bar(['a', 'b'], [3, 5])\n\
        'done'";
    let e = python.run(RunRequest::new(code)).await.unwrap();
    ok(&e);
    assert_eq!(e.displays.len(), 2, "{:?}", e.displays);
    let png = |i: usize| -> &Value { &e.displays[i]["formats"]["image/png"] };
    assert_eq!(
        (png(0)["width"].as_u64(), png(0)["height"].as_u64()),
        (Some(400), Some(300))
    );
    assert_eq!(
        (png(1)["width"].as_u64(), png(1)["height"].as_u64()),
        (Some(100), Some(100))
    );
    for i in 0..2 {
        let id = png(i)["artifact_id"].as_str().unwrap();
        let artifact = e.artifacts.iter().find(|a| a.id == id).unwrap();
        assert_eq!(Some(artifact.name.as_str()), png(i)["file"].as_str());
        assert!(
            artifact.preview.starts_with("PNG image"),
            "{}",
            artifact.preview
        );
    }
    assert!(e.displays[0]["formats"]["text/plain"]
        .as_str()
        .unwrap()
        .contains("Figure"));
}
