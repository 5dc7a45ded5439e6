//! What sandboxing an install costs: a small wheel installed with uv into a fresh environment,
//! sandboxed (every layer, the install copied out of its scratch) against the same install with the
//! install sandbox off, alternating, median of several.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use runpython_core::Sandbox;
use runpython_deps::{
    EnvProvider, Environments, InstallPolicy, Interpreter, Requirement, UvProvider,
};
use serde_json::{json, Map, Value};

use crate::stats::{p50, round3};

/// A one-module wheel, written by `python` into `dir`.
fn small_wheel(python: &Path, dir: &Path) -> std::io::Result<std::path::PathBuf> {
    const WRITE: &str = r#"
import base64, hashlib, sys, zipfile
out, name = sys.argv[1], "benchpkg"
files = {
    name + ".py": b"VALUE = 1\n",
    name + "-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: benchpkg\nVersion: 1.0\n",
    name + "-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
h = lambda d: "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
record = "".join("%s,%s,%d\n" % (k, h(v), len(v)) for k, v in files.items()) + name + "-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(out, "w") as z:
    for k, v in files.items():
        z.writestr(k, v)
    z.writestr(name + "-1.0.dist-info/RECORD", record)
"#;
    let wheel = dir.join("benchpkg-1.0-py3-none-any.whl");
    let status = Command::new(python)
        .args(["-c", WRITE])
        .arg(&wheel)
        .status()?;
    if !status.success() {
        return Err(std::io::Error::other("the bench wheel was not written"));
    }
    Ok(wheel)
}

/// `deps_install_ms` (sandboxed), `deps_install_unsandboxed_ms` and `deps_install_sandbox_overhead_ms`;
/// nothing when uv is not found.
pub async fn install_overhead(
    m: &mut Map<String, Value>,
    interpreter: &Interpreter,
) -> Result<(), Box<dyn std::error::Error>> {
    let Some(uv) = UvProvider::find() else {
        return Ok(());
    };
    let uv: Arc<dyn EnvProvider> = Arc::new(uv);
    let dir = tempfile::tempdir()?;
    let wheel = small_wheel(&interpreter.executable, dir.path())?;
    let spec = Requirement::parse(&format!("benchpkg @ file://{}", wheel.display()))?;
    let install = |sandbox: Sandbox| {
        let (uv, spec, root) = (uv.clone(), spec.clone(), dir.path().to_owned());
        async move {
            let envs = tempfile::tempdir_in(root)?;
            let envs = Environments::new(envs.path(), uv).with_policy(InstallPolicy {
                sandbox,
                ..InstallPolicy::default()
            });
            let t = Instant::now();
            envs.prepare(interpreter, &[spec], &|_| {}).await?;
            Ok::<f64, Box<dyn std::error::Error>>(t.elapsed().as_secs_f64() * 1e3)
        }
    };
    let (mut sandboxed, mut plain) = (Vec::new(), Vec::new());
    install(InstallPolicy::default_sandbox()).await?; // warm the page cache
    for _ in 0..9 {
        sandboxed.push(install(InstallPolicy::default_sandbox()).await?);
        plain.push(install(Sandbox::off()).await?);
    }
    let (sandboxed, plain) = (p50(sandboxed), p50(plain));
    m.insert("deps_install_ms".into(), json!(round3(sandboxed)));
    m.insert("deps_install_unsandboxed_ms".into(), json!(round3(plain)));
    m.insert(
        "deps_install_sandbox_overhead_ms".into(),
        json!(round3(sandboxed - plain)),
    );
    Ok(())
}

/// `deps_warm_ratio_pooled`: a pooled run importing numpy, which its pool declared warm (its
/// interpreter imported numpy before the run), over a pooled no-deps run, each pool of one
/// interpreter, alternating, medians of 20. Before each measured run the harness waits for the
/// pool's refill after the previous run to finish (it starts an interpreter and, for numpy's pool,
/// imports numpy: `numpy_import_ms` and more), so each run finds its interpreter ready, as the
/// figure says; a fixed 60 ms was shorter than numpy's refill on a slower machine, and its runs then
/// waited for it.
pub async fn warm_ratio_pooled(
    m: &mut Map<String, Value>,
    numpy_import_ms: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Duration;
    let with_numpy = "import numpy\nnumpy.__version__";
    let (plain_engine, numpy_engine) = (
        pool_engine(Vec::new(), false)?,
        pool_engine(vec!["numpy".into()], false)?,
    );
    numpy_engine.run(with_numpy).await?;
    plain_engine.run("1+1").await?;
    let refill = Duration::from_secs_f64((3.0 * numpy_import_ms).max(300.0) / 1e3);
    let (mut plain, mut numpy) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        tokio::time::sleep(refill).await;
        let t = Instant::now();
        plain_engine.run("1+1").await?;
        plain.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(refill).await;
        let t = Instant::now();
        let e = numpy_engine.run(with_numpy).await?;
        numpy.push(t.elapsed().as_secs_f64() * 1e3);
        if !e.is_success() {
            return Err(format!("the numpy run failed: {:?}", e.error).into());
        }
    }
    let (plain, numpy) = (p50(plain), p50(numpy));
    m.insert("deps_warm_pooled_plain_ms".into(), json!(round3(plain)));
    m.insert("deps_warm_pooled_numpy_ms".into(), json!(round3(numpy)));
    m.insert(
        "deps_warm_ratio_pooled".into(),
        json!(round3(numpy / plain)),
    );
    Ok(())
}

/// An engine with a pool of one, `warm` imported, for the bench's figures: with `from_templates`, its
/// runs are forked from a template of that interpreter; else the pool keeps one interpreter ready
/// ahead of each run (started again after it).
pub fn pool_engine(
    warm: Vec<String>,
    from_templates: bool,
) -> Result<runpython_core::RunPython, runpython_core::Error> {
    use runpython_core::{PoolConfig, RunPython};
    use std::time::Duration;
    RunPython::builder()
        .timeout(Duration::from_secs(120))
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(600),
            warm_imports: warm,
            prestart: !from_templates,
            templates: from_templates,
        })
        .build()
}
