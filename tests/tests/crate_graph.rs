//! The crate graph of DESIGN.md, checked against `cargo metadata`: the sandbox depends on no crate of
//! ours, the egress on the sandbox alone (whose descriptors it serves), deps on the sandbox and the
//! egress, the bridge and the store on nothing of ours; core composes them; the MCP server depends on
//! core alone, the CLI on core and the MCP server, the Python package on core only, xtask on nothing
//! of ours. The sandbox builds without the egress's HTTP, TLS and DNS stack.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

const LEAVES: &[&str] = &["runpython-sandbox", "runpython-bridge", "runpython-store"];

fn workspace_deps() -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: BTreeSet<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null()) // normal dependencies, not dev/build
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|name| members.contains(name))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

#[test]
fn leaves_depend_on_no_workspace_crate() {
    let graph = workspace_deps();
    for leaf in LEAVES {
        assert_eq!(graph[*leaf], BTreeSet::new(), "{leaf} must stay a leaf");
    }
}

#[test]
fn the_egress_serves_the_sandbox_and_depends_on_nothing_else_of_ours() {
    assert_eq!(
        workspace_deps()["runpython-egress"],
        BTreeSet::from(["runpython-sandbox".to_owned()])
    );
}

#[test]
fn installs_use_the_sandbox_and_its_egress_and_nothing_else_of_ours() {
    assert_eq!(
        workspace_deps()["runpython-deps"],
        BTreeSet::from([
            "runpython-sandbox".to_owned(),
            "runpython-egress".to_owned()
        ])
    );
}

/// The sandbox is mechanism: the crates behind the egress's resolver, proxy and TLS are not in its
/// normal dependency tree.
#[test]
fn the_sandbox_builds_without_the_http_tls_and_dns_stack() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "runpython-sandbox",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(crates.contains("libc"), "{tree}");
    for stack in [
        "hyper",
        "hyper-util",
        "tokio-rustls",
        "rustls",
        "rcgen",
        "hickory-proto",
        "psl",
        "runpython-egress",
    ] {
        assert!(
            !crates.contains(stack),
            "runpython-sandbox depends on {stack}:\n{tree}"
        );
    }
}

#[test]
fn core_composes_the_leaves_and_the_cli_is_thin() {
    let graph = workspace_deps();
    let mut composed: BTreeSet<String> = LEAVES.iter().map(|s| s.to_string()).collect();
    composed.insert("runpython-egress".to_owned());
    composed.insert("runpython-deps".to_owned());
    assert_eq!(graph["runpython-core"], composed);
    assert_eq!(
        graph["runpython-cli"],
        BTreeSet::from(["runpython-core".to_owned(), "runpython-mcp".to_owned()])
    );
    assert_eq!(graph["xtask"], BTreeSet::new());
}

#[test]
fn the_mcp_server_serves_core_and_nothing_depends_on_it_but_the_cli() {
    let graph = workspace_deps();
    assert_eq!(
        graph["runpython-mcp"],
        BTreeSet::from(["runpython-core".to_owned()])
    );
    let dependents: BTreeSet<&str> = graph
        .iter()
        .filter(|(_, deps)| deps.contains("runpython-mcp"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(dependents, BTreeSet::from(["runpython-cli"]));
}

#[test]
fn the_python_package_wraps_core_only() {
    assert_eq!(
        workspace_deps()["runpython-py"],
        BTreeSet::from(["runpython-core".to_owned()])
    );
}
