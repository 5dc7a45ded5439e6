//! Runs forked from a warm template (issue 20): what one run does never reaches another forked from the
//! same template, nor the template; a template that died or whose environment changed is replaced;
//! where templates cannot serve a run, it takes the fresh path and says so. The hostile and boundary
//! suites run again with every run forked (CI: `RUNPYTHON_TEMPLATES=require`); this suite pins what
//! is particular to forking. A test that needs a kernel feature the machine lacks prints why and
//! passes without asserting.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::time::{Duration, Instant};

use runpython_core::{PoolConfig, RunPython, RunPythonBuilder, Sandbox, Status};
use serde_json::{json, Value};

fn templated(warm: &[&str]) -> RunPythonBuilder {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .pool(PoolConfig {
            size: 2,
            idle: Duration::from_secs(300),
            warm_imports: warm.iter().map(|w| (*w).to_owned()).collect(),
            prestart: false,
            templates: true,
        })
}

/// True when runs of the default configuration can be forked here; prints why not.
fn forkable() -> bool {
    let report = templated(&[]).build().unwrap().isolation_report().unwrap();
    if report.start != "template" {
        eprintln!(
            "skipped: runs cannot be forked from a template here: {:?}",
            report.missing
        );
    }
    report.start == "template"
}

async fn run(engine: &RunPython, code: &str) -> Value {
    let e = engine.run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{code}: {:?}", e.error);
    assert_eq!(e.isolation.as_ref().unwrap().start, "template", "{code}");
    e.return_value
}

#[tokio::test(flavor = "multi_thread")]
async fn two_forked_runs_share_no_writes_globals_random_streams_or_files() {
    if !forkable() {
        return;
    }
    let engine = templated(&["random"]).build().unwrap();
    let write = r#"import builtins, os, random, sys
for path in ('mine.txt', '/tmp/mine.txt', '/dev/shm/mine', os.path.expanduser('~/mine')):
    with open(path, 'w') as f:
        f.write('a')
sys.left_by_a = builtins.left_by_a = random.left_by_a = 1
global_of_a = 1
[random.getrandbits(64), os.getpid(), os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/pid')]"#;
    let look = r#"import builtins, os, random, sys
seen = [p for p in ('mine.txt', '/tmp/mine.txt', '/dev/shm/mine', os.path.expanduser('~/mine')) if os.path.exists(p)]
left = [m.__name__ for m in (sys, builtins, random) if hasattr(m, 'left_by_a')]
[random.getrandbits(64), seen, left, 'global_of_a' in globals(), os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/pid')]"#;
    let a = run(&engine, write).await;
    let b = run(&engine, look).await;
    assert_eq!(b[1], json!([]), "files of another run: {b}");
    assert_eq!(b[2], json!([]), "globals of another run: {b}");
    assert_eq!(b[3], json!(false));
    assert_ne!(a[0], b[0], "two runs drew the same random numbers");
    assert_ne!(a[2], b[4], "two runs share a network namespace");
    assert_ne!(a[3], b[5], "two runs share a PID namespace");
    // And at the same time: each sees its own scratch, not the other's half-written one.
    let (a, b) = tokio::join!(engine.run(write), engine.run(look));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(
        a.is_success() && b.is_success(),
        "{:?} {:?}",
        a.error,
        b.error
    );
    assert_eq!(b.return_value[1], json!([]));
    assert_ne!(a.return_value[0], b.return_value[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_run_can_neither_signal_its_siblings_nor_reach_its_template() {
    if !forkable() {
        return;
    }
    let engine = templated(&[]).build().unwrap();
    let sibling = engine.run("import time\ntime.sleep(4)\n'alive'");
    let attack = r#"import os, signal
me = os.getpid()
visible = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
signalled = []
for pid in range(1, 4096):
    if pid == me:
        continue
    try:
        os.kill(pid, signal.SIGKILL)
        signalled.append(pid)
    except (ProcessLookupError, PermissionError):
        pass
def attempt(path):
    try:
        with open(path, 'rb') as f:
            f.read(16)
        return 'read'
    except OSError as e:
        return type(e).__name__
init = [attempt('/proc/1/' + what) for what in ('environ', 'mem', 'maps', 'root/etc/hostname')]
parent = [l.split()[1] for l in open('/proc/1/status') if l.startswith('PPid:')][0]
fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
[visible, signalled, init, parent, fds]"#;
    let (sibling, attacked) = tokio::join!(sibling, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        engine.run(attack).await
    });
    let (sibling, attacked) = (sibling.unwrap(), attacked.unwrap());
    assert_eq!(sibling.return_value, json!("alive"), "{:?}", sibling.error);
    assert_eq!(attacked.status, Status::Success, "{:?}", attacked.error);
    let got = &attacked.return_value;
    // Its own init and itself, and nothing of the template or of other runs.
    assert_eq!(
        got[0],
        json!([1, 2]),
        "processes outside the run are visible: {got}"
    );
    assert_eq!(got[1], json!([]), "the run could signal: {got}");
    for outcome in got[2].as_array().unwrap() {
        assert_ne!(outcome, &json!("read"), "the run's init is readable: {got}");
    }
    assert_eq!(
        got[3],
        json!("0"),
        "the init's parent (the template) shows: {got}"
    );
    assert!(
        got[4]
            .as_array()
            .unwrap()
            .iter()
            .all(|fd| fd.as_u64() < Some(6)),
        "descriptors beyond the run's own: {got}"
    );
    // The template took no harm.
    assert_eq!(run(&engine, "1 + 1").await, json!(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_template_is_replaced() {
    if !forkable() {
        return;
    }
    let engine = templated(&[]).build().unwrap();
    assert_eq!(run(&engine, "1").await, json!(1));
    let before = engine.templates().await;
    assert_eq!(before.len(), 1, "{before:?}");
    let pid = before[0].pid;
    assert!(
        before[0].runs >= 1 && before[0].memory_bytes > 0,
        "{before:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !engine.templates().await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the killed template still answers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        assert_eq!(run(&engine, "2").await, json!(2));
    }
    let after = engine.templates().await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0].pid, pid, "the dead template was not replaced");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forked_run_is_held_to_its_own_memory_limit_and_the_template_does_not_grow() {
    if !forkable() {
        return;
    }
    let engine = templated(&[]).memory_limit(256 << 20).build().unwrap();
    assert_eq!(run(&engine, "1").await, json!(1));
    let before = engine.templates().await[0].memory_bytes;
    let e = engine
        .run("chunks = []\nfor _ in range(8):\n    chunks.append(b'x' * (64 << 20))\nlen(chunks)")
        .await
        .unwrap();
    let isolation = e.isolation.clone().unwrap();
    assert_eq!(isolation.start, "template");
    if isolation.memory.enforced_by.starts_with("cgroup") {
        assert_eq!(e.status, Status::Error, "512 MiB fit in a 256 MiB run");
        let error = e.error.unwrap();
        assert!(error.message.contains("memory limit"), "{error:?}");
    } else {
        eprintln!("no cgroup here: the run's memory is limited per process only");
    }
    let after = engine.templates().await[0].memory_bytes;
    assert!(
        after < before + (32 << 20),
        "the template grew from {before} to {after} bytes"
    );
    assert_eq!(run(&engine, "3").await, json!(3));
}

#[tokio::test(flavor = "multi_thread")]
async fn isolation_says_which_path_each_run_took() {
    let fresh = RunPython::builder()
        .pool(PoolConfig {
            size: 0,
            templates: false,
            ..PoolConfig::default()
        })
        .build()
        .unwrap();
    let e = fresh.run("1").await.unwrap();
    assert_eq!(e.isolation.unwrap().start, "fresh");
    assert_eq!(fresh.isolation_report().unwrap().start, "fresh");
    // A configuration templates cannot serve (no namespaces) takes the fresh path, and says so.
    let off = templated(&[]).sandbox(Sandbox::off()).build().unwrap();
    assert_eq!(off.isolation_report().unwrap().start, "fresh");
    let e = off.run("1").await.unwrap();
    assert_eq!(e.return_value, json!(1), "{:?}", e.error);
    assert_eq!(e.isolation.unwrap().start, "fresh");
    assert!(off.templates().await.is_empty());
    if !forkable() {
        return;
    }
    let forked = templated(&[]).build().unwrap();
    let e = forked.run("1").await.unwrap();
    let isolation = e.isolation.unwrap();
    assert_eq!(isolation.start, "template");
    assert_eq!(
        isolation,
        runpython_core::Isolation {
            uid: isolation.uid,
            bridge: isolation.bridge.clone(),
            ..forked.isolation_report().unwrap()
        }
    );
}

fn uv_available() -> bool {
    if runpython_core::UvProvider::find().is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "uv not found ($RUNPYTHON_TOOLS_BIN or PATH); CI requires it"
    );
    eprintln!("skipped: uv not found in $RUNPYTHON_TOOLS_BIN or on PATH");
    false
}

/// numpy's global generator is re-seeded in each run (a fork would otherwise copy its state: numpy
/// loads `numpy.random` lazily, so the template warms it explicitly), its thread pool is stopped in
/// the template, and a template whose environment changed is replaced.
#[tokio::test(flavor = "multi_thread")]
async fn numpy_draws_differ_between_runs_and_a_changed_environment_replaces_the_template() {
    if !forkable() || !uv_available() {
        return;
    }
    let engine = templated(&["numpy", "numpy.random"])
        .dependency("numpy")
        .build()
        .unwrap();
    let draw = "import numpy\n[numpy.random.rand(), numpy.random.default_rng().random()]";
    let a = run(&engine, draw).await;
    let b = run(&engine, draw).await;
    assert_ne!(a[0], b[0], "numpy's global generator was shared");
    assert_ne!(a[1], b[1]);
    let templates = engine.templates().await;
    let template = templates
        .iter()
        .find(|t| t.site_dir.is_some())
        .unwrap_or_else(|| panic!("no template for the numpy environment: {templates:?}"));
    let site = template.site_dir.clone().unwrap();
    // The environment changes on disk (as a reinstall in place would change it).
    std::fs::File::open(&site)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(2))
        .unwrap();
    run(&engine, draw).await;
    let replaced = engine.templates().await;
    let now = replaced
        .iter()
        .find(|t| t.site_dir.as_ref() == Some(&site))
        .unwrap();
    assert_ne!(
        now.pid, template.pid,
        "the template of a changed environment was kept"
    );
}

/// The Python package drops engines on threads of its own, outside any Tokio runtime: a template and
/// its ready forks go then too, without a panic and without a survivor.
#[test]
fn an_engine_with_templates_dropped_outside_a_runtime_leaves_nothing() {
    if !forkable() {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let engine = templated(&[]).build().unwrap();
    let pid = runtime.block_on(async {
        assert_eq!(run(&engine, "1").await, json!(1));
        engine.templates().await[0].pid
    });
    drop(engine); // on this thread, not the runtime's
    let gone = |pid: u32| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(
            Instant::now() < deadline,
            "the template outlived its engine"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(runtime);
}

/// The check of a forked run from outside finds it in namespaces of its own, never another live
/// run's. A namespace's number is the kernel's to reuse the moment the namespace is freed, which is
/// when a run's processes exit, before its host has let go of the run: a burst of runs then found a
/// new run "in another run's namespace", failed it (`fork_unverified`) and discarded its template.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_forked_runs_is_never_mistaken_for_runs_sharing_a_namespace() {
    if !forkable() {
        return;
    }
    let engine = templated(&[]).build().unwrap();
    run(&engine, "1").await;
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for i in 0..40 {
                let e = engine.run(format!("{worker} * 100 + {i}")).await;
                match e {
                    Ok(e) if e.status == Status::Success => {
                        assert_eq!(e.return_value, json!(worker * 100 + i));
                        assert_eq!(e.isolation.as_ref().unwrap().start, "template");
                    }
                    other => failed.push(format!("{other:?}")),
                }
            }
            failed
        }));
    }
    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.unwrap());
    }
    assert!(
        failed.is_empty(),
        "{} runs failed: {failed:#?}",
        failed.len()
    );
}
