//! The CLI contract: exit statuses, human output, bad arguments.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn runpython(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn human_mode_prints_output_then_the_value() {
    let out = runpython(&["run", "-c", "print('hello')\n6 * 7"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "hello\n42\n");
}

#[test]
fn human_mode_prints_the_traceback_and_exits_1() {
    let out = runpython(&["run", "-c", "1/0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn json_mode_prints_exactly_one_envelope() {
    let out = runpython(&["run", "--json", "-c", "print('x')\n1"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "x\n");
    assert_eq!(v["return_value"], 1);
}

#[test]
fn code_from_a_file_and_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.py");
    std::fs::write(&file, "sum(range(5))").unwrap();
    let out = runpython(&["run", "--json", file.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], 10);

    let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(["run", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"'from stdin'")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], "from stdin");
}

fn assert_usage_error(args: &[&str], needle: &str) {
    let out = runpython(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout for a usage error");
}

#[test]
fn bad_arguments_exit_2_with_a_reason() {
    assert_usage_error(
        &["run", "--timeout", "-1", "-c", "1"],
        "positive number of seconds",
    );
    assert_usage_error(&["run", "--timeout", "soon", "-c", "1"], "not a number");
    assert_usage_error(
        &["run", "/nonexistent/job.py"],
        "cannot read /nonexistent/job.py",
    );
    assert_usage_error(&["run", "--input", "novalue", "-c", "1"], "NAME=JSON");
    assert_usage_error(&["run", "--input", "x={bad", "-c", "1"], "not JSON");
    assert_usage_error(
        &["run", "--input", "1x=1", "-c", "1"],
        "not a Python identifier",
    );
    assert_usage_error(&["run", "--tool", "nocommand", "-c", "1"], "NAME=COMMAND");
    assert_usage_error(
        &["run", "--max-output-chars", "0", "-c", "1"],
        "max-output-chars",
    );
    assert_usage_error(&["run"], "no code given");
    assert_usage_error(
        &["run", "--python", "/nonexistent/python3", "-c", "1"],
        "/nonexistent/python3",
    );
    assert_usage_error(&["frobnicate"], "unrecognized subcommand");
}
