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
    // The last expression, rich, is displayed too, besides its value: what the value lacks only.
    assert_eq!(d[3]["formats"], json!({"text/html": "<b>bold</b>"}));
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

#[tokio::test(flavor = "multi_thread")]
async fn a_matplotlib_figure_carries_its_chart_as_data() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let code = r#"
import matplotlib.pyplot as plt
plt.figure(); plt.plot([1, 2, 3], [10, 20, 15], label="sales"); plt.title("Sales"); plt.xlabel("month"); plt.ylabel("EUR"); plt.legend(); plt.show()
plt.figure(); plt.bar(["a", "b", "c"], [3, 5, 2]); plt.title("Counts"); plt.show()
plt.figure(); plt.scatter([1, 2], [4, 8]); plt.show()
plt.figure(); plt.pie([1, 3], labels=["x", "y"]); plt.show()
fig, (a, b) = plt.subplots(1, 2); a.plot(range(100), [i * i for i in range(100)]); b.bar([1, 2], [1, 2]); plt.show()
"#;
    let e = python.run(code).await.unwrap();
    ok(&e);
    let chart = |i: usize| &e.displays[i]["chart"];
    assert_eq!(e.displays.len(), 5, "{:?}", e.displays);
    let line = chart(0);
    assert_eq!(line["type"], "line", "{line}");
    assert_eq!(
        (&line["title"], &line["x_label"], &line["y_label"]),
        (&json!("Sales"), &json!("month"), &json!("EUR"))
    );
    assert_eq!(line["elements"][0]["label"], "sales");
    assert_eq!(
        line["elements"][0]["points"],
        json!([[1, 10], [2, 20], [3, 15]])
    );
    let bar = chart(1);
    assert_eq!(bar["type"], "bar", "{bar}");
    let bars: Vec<(Value, Value)> = bar["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["label"].clone(), b["value"].clone()))
        .collect();
    assert_eq!(
        bars,
        [
            (json!("a"), json!(3)),
            (json!("b"), json!(5)),
            (json!("c"), json!(2))
        ]
    );
    assert_eq!(chart(2)["type"], "scatter", "{}", chart(2));
    assert_eq!(chart(2)["elements"][0]["points"], json!([[1, 4], [2, 8]]));
    let pie = chart(3);
    assert_eq!(pie["type"], "pie", "{pie}");
    assert_eq!(pie["elements"][1]["fraction"], 0.75);
    assert_eq!(pie["elements"][1]["label"], "y");
    let two = chart(4);
    assert_eq!(two["type"], "composite", "{two}");
    assert_eq!(two["axes"][0]["type"], "line");
    let long = &two["axes"][0]["elements"][0];
    assert_eq!(long["count"], 100, "{long}");
    assert_eq!((&long["min"], &long["max"]), (&json!(0), &json!(9801)));
    assert_eq!(two["axes"][1]["type"], "bar");
    assert!(serde_json::to_vec(&e).unwrap().len() <= 8192);
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_result_content_shows_the_model_its_chart_in_each_api() {
    use runpython_core::ToolFormat;
    let python = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let args = json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"});
    for format in [ToolFormat::Anthropic, ToolFormat::OpenAi, ToolFormat::Mcp] {
        let content = python
            .handle_tool_call_content("run_python", &args, format)
            .await
            .unwrap();
        let blocks = content.as_array().unwrap();
        assert_eq!(blocks.len(), 2, "{format:?}: {content}");
        let envelope: Value = serde_json::from_str(blocks[0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(envelope["status"], "success");
        let image = &blocks[1];
        let data = match format {
            ToolFormat::Anthropic => {
                assert_eq!(image["type"], "image");
                assert_eq!(image["source"]["media_type"], "image/png");
                image["source"]["data"].as_str().unwrap().to_owned()
            }
            ToolFormat::OpenAi => {
                assert_eq!(
                    (&blocks[0]["type"], &image["type"]),
                    (&json!("input_text"), &json!("input_image"))
                );
                let url = image["image_url"].as_str().unwrap();
                url.strip_prefix("data:image/png;base64,")
                    .unwrap()
                    .to_owned()
            }
            _ => {
                assert_eq!(image["mimeType"], "image/png");
                image["data"].as_str().unwrap().to_owned()
            }
        };
        assert!(data.starts_with("iVBORw0KGgo"), "a PNG: {}", &data[..20]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_returned_dataframe_costs_no_display_its_preview_already_says_it() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let e = python
        .run("import pandas as pd\npd.DataFrame({'a': range(100), 'b': ['x'] * 100})")
        .await
        .unwrap();
    ok(&e);
    assert!(e.displays.is_empty(), "{:?}", e.displays);
    // Shown on purpose, it is displayed (its table's HTML cut to fit).
    let e = python
        .run("import pandas as pd\ndisplay(pd.DataFrame({'a': range(100)}))")
        .await
        .unwrap();
    ok(&e);
    assert!(e.displays[0]["formats"]["text/html"]
        .as_str()
        .unwrap()
        .contains("<table"));
}

#[tokio::test(flavor = "multi_thread")]
async fn histograms_and_box_plots_carry_their_bins_and_statistics() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let code = r#"
import matplotlib.pyplot as plt
plt.figure(); plt.hist([1, 2, 2, 3, 3, 3, 4], bins=[1, 2, 3, 4, 5]); plt.title("Spread"); plt.show()
plt.figure(); plt.boxplot([[1, 2, 3, 4, 5, 100], [10, 11, 12]], tick_labels=["a", "b"]); plt.show()
"#;
    let e = python.run(code).await.unwrap();
    ok(&e);
    assert_eq!(e.displays.len(), 2, "{:?}", e.displays);
    let hist = &e.displays[0]["chart"];
    assert_eq!(hist["type"], "histogram", "{hist}");
    assert_eq!(hist["title"], "Spread");
    let bins: Vec<(Value, Value, Value)> = hist["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["start"].clone(), b["end"].clone(), b["count"].clone()))
        .collect();
    assert_eq!(
        bins,
        [
            (json!(1), json!(2), json!(1)),
            (json!(2), json!(3), json!(2)),
            (json!(3), json!(4), json!(3)),
            (json!(4), json!(5), json!(1)),
        ]
    );
    let boxes = &e.displays[1]["chart"];
    assert_eq!(boxes["type"], "box", "{boxes}");
    let first = &boxes["elements"][0];
    assert_eq!(first["label"], "a");
    assert_eq!(
        (&first["median"], &first["q1"], &first["q3"]),
        (&json!(3.5), &json!(2.25), &json!(4.75))
    );
    assert_eq!(first["outliers"], json!([100]));
    assert_eq!(boxes["elements"][1]["median"], 11);
    // The boxes' drawn lines are not reported again as line series.
    assert_eq!(boxes["elements"].as_array().unwrap().len(), 2, "{boxes}");
}

#[tokio::test(flavor = "multi_thread")]
async fn dataframes_plotly_altair_and_pil_show_their_own_forms() {
    let (_dir, python) = kept();
    let code = r#"
import pandas as pd
import plotly.graph_objects as go
import altair as alt
df = pd.DataFrame({"city": ["Oslo", "Rome", "Lima"], "temp": [3, 18, 22]})
display(df)
fig = go.Figure(go.Bar(x=df.city, y=df.temp), layout={"title": {"text": "Temperatures"}})
display(fig)
display(alt.Chart(df).mark_bar().encode(x="city", y="temp"))
from PIL import Image
display(Image.new("RGB", (4, 3), "red"))
"#;
    let e = python.run(code).await.unwrap();
    ok(&e);
    assert_eq!(e.displays.len(), 4, "{:?}", e.displays);
    let table = e.displays[0]["formats"]["text/markdown"].as_str().unwrap();
    assert!(table.starts_with("|  | city | temp |"), "{table}");
    assert!(table.contains("| 1 | Rome | 18 |"), "{table}");
    assert!(e.displays[0]["formats"]["text/html"]
        .as_str()
        .unwrap()
        .contains("<table"));
    // plotly: the figure's JSON as an artifact, and what it shows as text.
    let plotly = &e.displays[1]["formats"];
    let spec = &plotly["application/vnd.plotly.v1+json"];
    let id = spec["artifact_id"].as_str().unwrap();
    let bytes = python.get_run_artifact(id).await.unwrap();
    let figure: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(figure["data"][0]["type"], "bar");
    assert_eq!(figure["layout"]["title"]["text"], "Temperatures");
    assert!(plotly["text/plain"]
        .as_str()
        .unwrap()
        .contains("'Temperatures': 1 trace(s) (bar)"));
    // altair: the Vega-Lite spec as an artifact.
    let vega = &e.displays[2]["formats"]["application/vnd.vegalite.v5+json"];
    let bytes = python
        .get_run_artifact(vega["artifact_id"].as_str().unwrap())
        .await
        .unwrap();
    let spec: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(spec["mark"]["type"], "bar", "{spec}");
    // A PIL image shows itself as a PNG of its size.
    let png = &e.displays[3]["formats"]["image/png"];
    assert_eq!(
        (png["width"].as_u64(), png["height"].as_u64()),
        (Some(4), Some(3))
    );
    assert!(serde_json::to_vec(&e).unwrap().len() <= 8192);
}
