//! The shared acceptance cases (ported from peers' test suites, `tests/acceptance/cases.jsonl`, a copy of
//! `shared/acceptance/cases.jsonl`), run against the `runpython` binary with the same checks as the shared
//! `run_cases.py`, including the cases that install packages from PyPI.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

fn check(case: &Value, envelope: &Value, rc: i32, elapsed: f64) -> Vec<String> {
    let x = &case["expect"];
    let mut bad = Vec::new();
    let mut want = |ok: bool, what: String| {
        if !ok {
            bad.push(what)
        }
    };
    for field in ["status", "return_value", "return_type", "stdout"] {
        if let Some(expected) = x.get(field) {
            want(
                &envelope[field] == expected,
                format!("{field} {} != {expected}", envelope[field]),
            );
        }
    }
    let err = &envelope["error"];
    if let Some(t) = x.get("error_type") {
        want(
            &err["type"] == t,
            format!("error.type {} != {t}", err["type"]),
        );
    }
    if let Some(types) = x.get("error_type_in").and_then(Value::as_array) {
        want(
            types.contains(&err["type"]),
            format!("error.type {} not in {types:?}", err["type"]),
        );
    }
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    if let Some(s) = x.get("error_message_contains").and_then(Value::as_str) {
        want(
            text(&err["message"]).contains(s),
            format!("error.message lacks {s:?}"),
        );
    }
    for s in x
        .get("traceback_contains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = s.as_str().unwrap_or("");
        want(
            text(&err["traceback"]).contains(s),
            format!("traceback lacks {s:?}"),
        );
    }
    for s in x
        .get("traceback_excludes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = s.as_str().unwrap_or("");
        want(
            !text(&err["traceback"]).contains(s),
            format!("traceback shows {s:?}"),
        );
    }
    for (key, field) in [("stdout_contains", "stdout"), ("stderr_contains", "stderr")] {
        if let Some(s) = x.get(key).and_then(Value::as_str) {
            want(
                text(&envelope[field]).contains(s),
                format!("{field} lacks {s:?}"),
            );
        }
    }
    if let Some(max) = x.get("stdout_max_chars").and_then(Value::as_u64) {
        let n = text(&envelope["stdout"]).chars().count() as u64;
        want(n <= max, format!("stdout has {n} chars"));
    }
    if x.get("truncated") == Some(&Value::Bool(true)) {
        want(
            !envelope["truncated"].is_null(),
            "truncated is empty".into(),
        );
    }
    if let Some(max) = x.get("max_seconds").and_then(Value::as_f64) {
        want(elapsed <= max, format!("took {elapsed:.1}s"));
    }
    let success = envelope["status"] == "success";
    want(
        rc == if success { 0 } else { 1 },
        format!("exit status {rc} does not match status"),
    );
    bad
}

#[test]
fn shared_acceptance_cases_pass() {
    let cases = include_str!("acceptance/cases.jsonl");
    let mut failures = Vec::new();
    let mut ran = 0;
    for line in cases.lines().filter(|l| !l.trim().is_empty()) {
        let case: Value = serde_json::from_str(line).unwrap();
        let code = case["code"].as_str().unwrap();
        let args: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let via_stdin = code.len() > 100_000;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_runpython"));
        cmd.args(["run", "--json"]).args(&args);
        if via_stdin {
            cmd.arg("-");
        } else {
            cmd.args(["-c", code]);
        }
        if let Some(env) = case["expect"]["env"].as_object() {
            for (k, v) in env {
                cmd.env(k, v.as_str().unwrap());
            }
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if via_stdin {
            stdin.write_all(code.as_bytes()).unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let elapsed = started.elapsed().as_secs_f64();
        let name = case["name"].as_str().unwrap();
        ran += 1;
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(envelope) => {
                let bad = check(&case, &envelope, out.status.code().unwrap_or(-1), elapsed);
                if !bad.is_empty() {
                    failures.push(format!("{name}: {}", bad.join("; ")));
                }
            }
            Err(_) => failures.push(format!(
                "{name}: stdout is not an envelope: {} / {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }
    assert!(ran >= 43, "only {ran} cases ran");
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
