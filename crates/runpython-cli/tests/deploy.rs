//! The Kubernetes recipe of `deploy/kubernetes/` as shipped: every manifest passes
//! `kubernetes-validate --strict` (the Kubernetes API's JSON schemas, offline: no cluster, unknown
//! fields refused), and every flag the Deployment passes to `runpython serve` is one it takes. The
//! proxies' recipes are run for real by `mcp_sdk.rs` (`load_balanced.py`).

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifests() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    found.sort();
    found
}

#[test]
fn kubernetes_manifests_pass_the_api_schemas_strictly() {
    let Some(bin) = std::env::var_os("RUNPYTHON_TOOLS_BIN") else {
        println!(
            "skipped: RUNPYTHON_TOOLS_BIN is unset (cargo xtask tools, then point it at its bin)"
        );
        return;
    };
    let validate = Path::new(&bin).join("kubernetes-validate");
    assert!(
        validate.exists(),
        "{} does not exist: run `cargo xtask tools`",
        validate.display()
    );
    let files = manifests();
    let kinds = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect::<String>();
    for kind in [
        "kind: Deployment",
        "kind: Service",
        "kind: PodDisruptionBudget",
        "kind: HorizontalPodAutoscaler",
        "kind: Secret",
        "kind: ConfigMap",
    ] {
        assert!(kinds.contains(kind), "no {kind} in deploy/kubernetes");
    }
    let out = Command::new(&validate)
        .arg("--strict")
        .args(&files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate refused:\n{text}");
    assert!(
        text.matches(" passed for resource ").count() >= 8,
        "fewer resources validated than shipped:\n{text}"
    );
}

#[test]
fn the_deployment_passes_serve_only_flags_it_takes() {
    let deployment =
        std::fs::read_to_string(repo().join("deploy/kubernetes/deployment.yaml")).unwrap();
    let flags: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|f| f.split('=').next().unwrap())
        .collect();
    assert!(flags.contains(&"max-runs-in-flight"), "{flags:?}");
    let help = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in flags {
        assert!(
            help.contains(&format!("--{flag}")),
            "deployment.yaml passes --{flag}, which `runpython serve` does not take"
        );
    }
}

/// `doctor --json [--no-store] [extra]` as JSON.
fn doctor(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(["doctor", "--json", "--no-store"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn require_isolation_refuses_exactly_where_doctor_reports_a_missing_layer() {
    let plain = doctor(&[]);
    // `missing` is left out when nothing is.
    let missing: Vec<String> = plain["isolation"]["missing"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    let required = doctor(&["--require-isolation"]);
    if missing.is_empty() {
        assert!(required["isolation"].is_object(), "{required}");
        assert!(required.get("isolation_error").is_none(), "{required}");
    } else {
        assert!(required["isolation"].is_null(), "{required}");
        let error = required["isolation_error"].as_str().unwrap();
        assert!(
            error.contains("isolation required but unavailable"),
            "{error}"
        );
        assert!(
            error.contains(&missing[0]),
            "{error} does not name {}",
            missing[0]
        );
    }
}
