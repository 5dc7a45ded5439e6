//! What the CLI test files share: running the binary and reading what it printed.

#![allow(dead_code)] // each test file uses the helpers it needs
#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// `runpython ARGS` with stdin closed, to its end.
pub fn runpython(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The JSON the command printed on stdout (its envelope or listing); panics with its stderr if none.
pub fn envelope(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); stderr: {}", text(&out.stderr)))
}
