//! Context-window economy: previews instead of bulk, an envelope within its budget, data by reference.
//! The pandas and matplotlib cases install those packages from PyPI through the dependency provider.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::time::Duration;

use runpython_core::{ArtifactKind, Envelope, RunPython, RunRequest, Sandbox, Status, Store};
use serde_json::{json, Value};

const BUDGET: usize = 8192;

fn kept() -> (tempfile::TempDir, RunPython) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let python = RunPython::builder()
        .store(store)
        .timeout(Duration::from_secs(300))
        .max_return_bytes(20_000_000)
        .build()
        .unwrap();
    (dir, python)
}

fn size(e: &Envelope) -> usize {
    serde_json::to_vec(e).unwrap().len()
}

fn artifact<'a>(e: &'a Envelope, name: &str) -> &'a runpython_core::Artifact {
    e.artifacts
        .iter()
        .find(|a| a.name == name)
        .unwrap_or_else(|| panic!("no artifact {name}: {:?}", e.artifacts))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_100k_row_dataframe_costs_a_preview_and_stays_reachable() {
    let (_dir, python) = kept();
    let code = "import pandas as pd\nimport numpy as np\n\
        pd.DataFrame({'id': np.arange(100_000), 'score': np.linspace(0, 1, 100_000), 'name': ['n%d' % i for i in range(100_000)]})";
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert!(size(&e) <= BUDGET, "{} bytes", size(&e));
    assert_eq!(e.return_value, Value::Null);
    assert_eq!(e.return_type.as_deref(), Some("DataFrame"));
    let p = e.return_preview.as_ref().unwrap();
    assert_eq!(p["shape"], json!([100_000, 3]));
    assert_eq!(p["columns"][0], json!({"name": "id", "dtype": "int64"}));
    assert_eq!(p["columns"][1]["dtype"], "float64");
    assert_eq!(p["head"][1], json!([1, 1.000010000100001e-05, "n1"]));
    // The full table is an artifact, in pandas' split orientation.
    let full = python
        .get_run_artifact(&artifact(&e, "return_value.json").id)
        .await
        .unwrap();
    let full: Value = serde_json::from_slice(&full).unwrap();
    assert_eq!(full["data"].as_array().unwrap().len(), 100_000);
    assert_eq!(full["columns"], json!(["id", "score", "name"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_10_mb_list_is_previewed_and_kept_whole() {
    let (_dir, python) = kept();
    let e = python
        .run("['x' * 100 for _ in range(100_000)]")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert!(size(&e) <= BUDGET);
    let p = e.return_preview.as_ref().unwrap();
    assert_eq!(
        (p["type"].as_str(), p["length"].as_u64()),
        (Some("list"), Some(100_000))
    );
    let a = artifact(&e, "return_value.json");
    assert!(a.bytes > 10_000_000, "{} bytes", a.bytes);
    // With the default 1 MB cap the value is too large to keep, but the model still sees what it was.
    let e = RunPython::builder()
        .build()
        .unwrap()
        .run("['x' * 100 for _ in range(100_000)]")
        .await
        .unwrap();
    assert_eq!(e.error.as_ref().unwrap().kind, "ReturnValueTooLarge");
    assert_eq!(e.return_preview.as_ref().unwrap()["length"], 100_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn numpy_arrays_get_shape_dtype_and_range() {
    let python = RunPython::builder()
        .inline_return_bytes(100)
        .build()
        .unwrap();
    let e = python
        .run("import numpy as np\nnp.arange(1000, dtype=np.float32).reshape(10, 100) - 5")
        .await
        .unwrap();
    let p = e.return_preview.expect("a preview");
    assert_eq!(p["shape"], json!([10, 100]));
    assert_eq!(p["dtype"], "float32");
    assert_eq!(
        (p["min"].as_f64(), p["max"].as_f64()),
        (Some(-5.0), Some(994.0))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn previews_never_import_a_library_the_code_did_not() {
    let python = RunPython::builder()
        .inline_return_bytes(10)
        .build()
        .unwrap();
    let e = python.run("import sys\nx = {'k%d' % i: list(range(i)) for i in range(50)}\nx['mods'] = sorted(m for m in ('pandas', 'numpy', 'polars') if m in sys.modules)\nx").await.unwrap();
    let p = e.return_preview.unwrap();
    assert_eq!(p["type"], "dict");
    assert_eq!(p["size"], 51);
    assert_eq!(
        p["items"]["k3"],
        json!({"type": "list", "length": 3, "items": [0, 1, 2]})
    );
    let e = python
        .run("import sys\n[m for m in ('pandas', 'numpy', 'polars') if m in sys.modules]")
        .await
        .unwrap();
    assert_eq!(e.return_value, json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_matplotlib_chart_becomes_a_png_artifact_with_its_dimensions() {
    let (_dir, python) = kept();
    let code = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3), dpi=100)\nax.plot([1, 2, 3], [2, 1, 3])\nfig.savefig('chart.png')\nplt.figure(figsize=(2, 2), dpi=50)\nplt.plot([0, 1])\nplt.show()";
    let e = python.run(RunRequest::new(code)).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?} {}", e.error, e.stderr);
    let saved = artifact(&e, "chart.png");
    assert_eq!(saved.kind, ArtifactKind::File);
    assert!(
        saved.preview.starts_with("PNG image, 400×300 pixels"),
        "{}",
        saved.preview
    );
    let shown = artifact(&e, "figure_2.png");
    assert!(
        shown.preview.starts_with("PNG image, 100×100 pixels"),
        "{}",
        shown.preview
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_artifact_passes_by_reference_into_a_second_run() {
    let (_dir, python) = kept();
    let first = python
        .run("import csv\nwith open('rows.csv', 'w', newline='') as f:\n    w = csv.writer(f)\n    w.writerow(['city', 'n'])\n    w.writerows([['Oslo', 3], ['Lima', 5]])\nsave_artifact('totals.json', {'total': 8})")
        .await
        .unwrap();
    assert_eq!(first.status, Status::Success, "{:?}", first.error);
    let rows = artifact(&first, "rows.csv");
    assert!(
        rows.preview.starts_with("CSV, 2 columns (city, n), 2 rows"),
        "{}",
        rows.preview
    );
    let totals_id = first.return_value.as_str().unwrap().to_owned();
    assert_eq!(artifact(&first, "totals.json").id, totals_id);
    let second = python
        .run(
            RunRequest::new(
                "[rows[1]['city'], load_artifact(totals)['total'], len(read_artifact(totals))]",
            )
            .input_artifact("rows", &rows.id)
            .input("totals", json!(totals_id)),
        )
        .await
        .unwrap();
    assert_eq!(
        second.return_value,
        json!(["Lima", 8, 11]),
        "{:?}",
        second.error
    );
    let missing = python
        .run(RunRequest::new("1").input_artifact("x", "ab".repeat(32)))
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("no artifact"), "{missing}");
}

#[tokio::test(flavor = "multi_thread")]
async fn adversarial_output_errors_and_files_stay_within_budget() {
    let (_dir, python) = kept();
    let cases = [
        "import sys\nfor i in range(20000):\n    print(i, 'x' * 80)\n    sys.stderr.write('e' * 120 + '\\n')",
        "raise ValueError('m' * 1_000_000)",
        "def f(n):\n    return f(n + 1)\nf(0)",
        "import os\nos.makedirs('many')\nfor i in range(3000):\n    open(f'many/f{i}.txt', 'w').write('x' * 300)",
        "print('\\u00e9' * 100000)\n{'k' + str(i): 'v' * 100 for i in range(1000)}",
    ];
    for code in cases {
        let e = python.run(code).await.unwrap();
        let bytes = size(&e);
        assert!(bytes <= BUDGET, "{bytes} bytes for {code:?}");
        if e.status == Status::Error {
            assert!(!e.error.as_ref().unwrap().kind.is_empty());
        }
    }
    let e = python.run("raise KeyError('k' * 100000)").await.unwrap();
    assert_eq!(
        e.error.as_ref().unwrap().kind,
        "KeyError",
        "the error type always survives"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_matplotlib_run_leaves_stderr_to_what_the_code_printed() {
    // Text on a figure needs fonts: matplotlib builds its font cache (fontconfig's `fc-list` included)
    // in the run's own writable config and cache homes, and says nothing about it.
    let code = "import sys\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3])\n\
                ax.set_title('temperatures')\nfig.savefig('chart.png')\nprint('drawn', file=sys.stderr)";
    for sandbox in [Sandbox::default(), Sandbox::off()] {
        let python = RunPython::builder()
            .sandbox(sandbox.clone())
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        for attempt in 0..2 {
            let e = python.run(code).await.unwrap();
            assert_eq!(e.status, Status::Success, "{:?}", e.error);
            assert_eq!(e.stderr, "drawn\n", "run {attempt} with {sandbox:?}");
        }
    }
}
