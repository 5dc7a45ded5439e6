//! The host checks every run forked from a template from outside before the run gets code: a warm
//! package that makes the template skip one of a forked run's layers is caught, the run never runs,
//! and the call fails naming the layer. The package here is a real wheel, installed through the
//! dependency path and imported by the template as a warm module, as a poisoned package would be.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::path::{Path, PathBuf};
use std::time::Duration;

use runpython_core::{Error, PoolConfig, RunPython, RunPythonBuilder, Status};

/// The poison: `runpython_poison_<layer>` makes the template skip `<layer>` in every run it forks, by
/// replacing the code forked runs take their sandbox with (`runpython_forked`), as any package imported
/// into a template could.
const POISON: &str = r#"
import sys

def skip(layer):
    t = sys.modules["runpython_forked"]
    S = t.Sys
    if layer == "none":
        return
    if layer == "no_new_privs":
        # Without it the kernel refuses Landlock and seccomp to an unprivileged process: skipped too.
        S.landlock = lambda self, ruleset, rules: None
        S.seccomp = lambda self, program: None
        prctl = S.prctl
        def patched(self, option, arg, step):
            if option == t.PR_SET_NO_NEW_PRIVS:
                return
            return prctl(self, option, arg, step)
        S.prctl = patched
    elif layer == "capabilities":
        S.drop_capabilities = lambda self: None
    elif layer == "seccomp":
        S.seccomp = lambda self, program: None
    elif layer == "cgroup":
        every = t.Fds.all
        t.Fds.all = lambda self, name: [] if name == "cgroup" else every(self, name)
    else:
        setup = t._setup
        def patched(s, command, fds, *rest):
            command = dict(command)
            if layer == "netns":
                command["net"] = False
            elif layer == "userns":
                command["userns"] = False
            elif layer == "rlimits":
                command["rlimits"] = []
            return setup(s, command, fds, *rest)
        t._setup = patched
"#;

/// Each layer the poison can skip, and what the host's error names for it.
const LAYERS: &[(&str, &str)] = &[
    ("no_new_privs", "no_new_privs"),
    ("capabilities", "capabilities"),
    ("seccomp", "seccomp"),
    ("cgroup", "cgroup"),
    ("netns", "its net namespace is its template's"),
    ("userns", "its user namespace is its template's"),
    ("rlimits", "rlimits"),
];

/// Writes the poison as a wheel (a zip with its dist-info) into `dir`; its path.
fn poison_wheel(dir: &Path) -> PathBuf {
    let wheel = dir.join("runpython_poison-0.1-py3-none-any.whl");
    let mut modules = vec![("runpython_poison.py".to_owned(), POISON.to_owned())];
    for layer in LAYERS.iter().map(|(l, _)| *l).chain(["none"]) {
        modules.push((
            format!("runpython_poison_{layer}.py"),
            format!("import runpython_poison\nrunpython_poison.skip({layer:?})\n"),
        ));
    }
    let script = r#"
import base64, hashlib, json, sys, zipfile
path, modules = sys.argv[1], json.loads(sys.argv[2])
info = "runpython_poison-0.1.dist-info/"
files = dict(modules)
files[info + "METADATA"] = "Metadata-Version: 2.1\nName: runpython-poison\nVersion: 0.1\n"
files[info + "WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append("%s,sha256=%s,%d" % (name, digest, len(text.encode())))
record.append(info + "RECORD,,")
files[info + "RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(path, "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
"#;
    let modules = serde_json::to_string(&modules).unwrap();
    let python = runpython_deps::Interpreter::discover(None)
        .unwrap()
        .executable;
    let made = std::process::Command::new(python)
        .args(["-c", script])
        .arg(&wheel)
        .arg(modules)
        .status()
        .unwrap();
    assert!(made.success(), "the poison wheel was not written");
    wheel
}

fn engine(wheel: &Path, layer: &str) -> RunPythonBuilder {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .dependency(format!("runpython-poison @ file://{}", wheel.display()))
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(300),
            warm_imports: vec![format!("runpython_poison_{layer}")],
            prestart: false,
            templates: true,
        })
}

fn ready() -> Option<bool> {
    let report = RunPython::builder()
        .pool(PoolConfig {
            templates: true,
            ..PoolConfig::default()
        })
        .build()
        .unwrap()
        .isolation_report()
        .unwrap();
    if report.start != "template" {
        eprintln!("skipped: runs cannot be forked here: {:?}", report.missing);
        return None;
    }
    if runpython_core::UvProvider::find().is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI requires uv");
        eprintln!("skipped: uv not found");
        return None;
    }
    Some(report.memory.enforced_by.contains("cgroup"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_package_that_skips_a_layer_of_forked_runs_is_caught_before_any_code_runs() {
    let Some(cgroups) = ready() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wheel = poison_wheel(dir.path());
    let code = "1 + 1";

    // The package that skips nothing: every run is forked and checked, and passes.
    let honest = engine(&wheel, "none").build().unwrap();
    for _ in 0..2 {
        let e = honest.run(code).await.unwrap();
        assert_eq!(e.status, Status::Success, "{:?}", e.error);
        assert_eq!(e.isolation.as_ref().unwrap().start, "template");
    }

    for (layer, named) in LAYERS {
        if *layer == "cgroup" && !cgroups {
            eprintln!("cgroup: not checked, runs have no cgroup here");
            continue;
        }
        let poisoned = engine(&wheel, layer).build().unwrap();
        for attempt in 0..2 {
            // An error, never an envelope: the run was killed before it was handed the code.
            let got = poisoned.run(code).await;
            match got {
                Err(e @ Error::ForkUnverified(_)) => {
                    assert_eq!(e.code(), "fork_unverified");
                    assert!(e.to_string().contains(named), "{layer}: {e}");
                }
                other => panic!(
                    "{layer} (attempt {attempt}): the poisoned fork was not caught: {other:?}"
                ),
            }
        }
        // The template that forked it was discarded: the one there now (if any) is another.
        let pids: Vec<u32> = poisoned.templates().await.iter().map(|t| t.pid).collect();
        assert!(pids.len() <= 1, "{layer}: {pids:?}");
    }
}
