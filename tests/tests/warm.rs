//! Warm environments the operator declares: a run whose requirements are all within one is forked
//! from its template (which imported the packages and did their first-use work), a run of anything
//! else keeps the pooled or fresh path. The chart cell, the real work agents send, comes back whole
//! from a forked run: its value, its line chart as data and its PNG, with no font-cache message.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::time::Duration;

use runpython_core::{RunPython, RunRequest, Status};
use serde_json::json;

/// True when runs can be forked and uv is there to install; prints why not.
fn ready() -> bool {
    let report = RunPython::builder()
        .warm_environment(["numpy"])
        .build()
        .unwrap()
        .isolation_report()
        .unwrap();
    if report.start != "template" {
        eprintln!("skipped: runs cannot be forked here: {:?}", report.missing);
        return false;
    }
    if runpython_core::UvProvider::find().is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI requires uv");
        eprintln!("skipped: uv not found");
        return false;
    }
    true
}

fn start_of(e: &runpython_core::Envelope) -> &str {
    e.isolation.as_ref().map_or("", |i| i.start.as_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_within_a_warm_environment_is_forked_and_a_run_outside_it_is_not() {
    if !ready() {
        return;
    }
    let engine = RunPython::builder()
        .timeout(Duration::from_secs(60))
        .warm_environment(["numpy"])
        .build()
        .unwrap();
    engine.warm_up(|_| {}).await.unwrap();
    let templates = engine.templates().await;
    assert!(
        templates.iter().any(|t| t.site_dir.is_some()),
        "warm_up started no template: {templates:?}"
    );
    for _ in 0..2 {
        let e = engine
            .run("import numpy\nint(numpy.arange(4).sum())")
            .await
            .unwrap();
        assert_eq!(e.status, Status::Success, "{:?}", e.error);
        assert_eq!(e.return_value, json!(6));
        assert_eq!(
            start_of(&e),
            "template",
            "a run within the warm environment"
        );
    }
    // A dependency of what was declared is within it too (numpy has none: its own random module).
    let e = engine
        .run("import numpy.random\nnumpy.random.default_rng(1).integers(0, 9, 2).tolist()")
        .await
        .unwrap();
    assert_eq!(start_of(&e), "template", "{:?}", e.error);
    // Nothing to install: the standard library's path, not the warm template's.
    let e = engine.run("import json\njson.dumps(1)").await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_ne!(start_of(&e), "template");
    // A pin the environment does not hold: an environment of its own.
    let e = engine
        .run(RunRequest::new("1").dependency("numpy<1"))
        .await
        .unwrap();
    assert_ne!(start_of(&e), "template", "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_cell_in_a_warm_environment_comes_back_whole_with_no_font_cache_message() {
    if !ready() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let engine = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .store(runpython_core::Store::open(&format!("file://{}", store.path().display())).unwrap())
        .warm_environment(runpython_tests::chart_bench::chart_pins())
        .build()
        .unwrap();
    engine.warm_up(|_| {}).await.unwrap();
    for _ in 0..2 {
        let e = engine
            .run(RunRequest::new(runpython_tests::chart_bench::CHART_CELL).no_memo())
            .await
            .unwrap();
        runpython_tests::chart_bench::check_chart(&e, "a forked run").unwrap();
        assert_eq!(start_of(&e), "template");
        assert!(
            !e.stderr.contains("font cache"),
            "the run built matplotlib's font cache: {}",
            e.stderr
        );
        assert!(!e.images.is_empty(), "no PNG inline for MCP's image block");
    }
}
