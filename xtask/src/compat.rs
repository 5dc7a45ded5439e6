//! `cargo xtask compat`: CPython's own regression suite (the `test` package of the interpreter runs
//! use) module by module, inside `runpython run` and in a plain process, compared test by test.
//!
//! - `cargo xtask compat` — the ci list (`compat/ci_modules.txt`) in six passes: a plain process
//!   and four inside (root host and unprivileged host, each fresh and forked from a template), and
//!   for the modules that use sockets ([`POLICY_MODULES`]) a fifth: fresh runs of the unprivileged
//!   host under a network policy, whose every bind, listen and connect the host performs. It
//!   prints, per module and pass, the tests run, passed, failed and skipped, and every test that
//!   passes in the plain process but not inside; it fails when such a test is not a listed exclusion
//!   (`compat/exclusions.txt`, each with its reason) after one rerun.
//! - `cargo xtask compat --all` — the whole suite (for a release), its table written into
//!   `docs/compat.md`.
//! - `--modules a,b`, `--passes plain,root-fresh,...`, `--jobs N`, `--timeout SECONDS` narrow a run;
//!   `--docs` only rewrites `docs/compat.md`'s list of exclusions.
//!
//! Each module runs under regrtest with its default resources (none: no `network`, so nothing reaches
//! past loopback) in a process of its own, through `compat/driver.py` and `compat/regrtest_json.py`,
//! which write each test's outcome. The plain pass runs as the unprivileged user the unprivileged
//! passes use (a root host's runs never run code as root either), so a test that needs root is
//! skipped in both places. Modules run three per core at a time across all passes (they mostly
//! wait), the same module's passes side by side, so every pass sees the same load.

mod compare;
mod run;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

pub(crate) use compare::Comparison;
use run::{Pass, Setup};

/// The ci list: modules (or a package's submodules) that together take a few minutes per pass.
const CI_MODULES: &str = include_str!("compat/ci_modules.txt");

/// The modules the `user-policy` pass runs: those of the ci list whose tests bind, listen and connect
/// sockets on the run's loopback (servers and clients, event loops, select and poll), which under a
/// network policy are performed by the host.
pub(crate) const POLICY_MODULES: &[&str] = &[
    "test_socket",
    "test_selectors",
    "test_asyncio.test_events",
    "test_asyncio.test_sock_lowlevel",
    "test_asyncio.test_streams",
    "test_asyncio.test_server",
    "test_asyncio.test_sendfile",
    "test_asyncio.test_sslproto",
    "test_httplib",
    "test_httpservers",
    "test_urllib2_localnet",
    "test_docxmlrpc",
    "test_smtplib",
    "test_asyncore",
    "test_asynchat",
    "test_logging",
    "test_select",
    "test_poll",
];

/// Tests that pass in a plain process and not inside, each with its reason.
const EXCLUSIONS: &str = include_str!("compat/exclusions.txt");

/// A module's wall-clock limit in the ci list, and in `--all` (some of the suite's modules take
/// minutes on two cores).
const CI_TIMEOUT: u64 = 300;
const ALL_TIMEOUT: u64 = 1200;

/// What one invocation runs.
#[derive(Debug)]
struct Options {
    all: bool,
    modules: Option<Vec<String>>,
    passes: Vec<Pass>,
    jobs: usize,
    timeout: Option<u64>,
    docs_only: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        all: false,
        modules: None,
        passes: Pass::ALL.to_vec(),
        jobs: default_jobs(),
        timeout: None,
        docs_only: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--all" => options.all = true,
            "--docs" => options.docs_only = true,
            "--modules" => {
                options.modules = Some(value("--modules")?.split(',').map(str::to_owned).collect())
            }
            "--passes" => {
                options.passes = value("--passes")?
                    .split(',')
                    .map(Pass::parse)
                    .collect::<Result<_>>()?
            }
            "--jobs" => {
                let jobs = value("--jobs")?;
                options.jobs =
                    jobs.parse().ok().filter(|&n| n > 0).with_context(|| {
                        format!("--jobs {jobs}: give a number of modules at once")
                    })?
            }
            "--timeout" => {
                let timeout = value("--timeout")?;
                options.timeout = Some(timeout.parse().with_context(|| {
                    format!("--timeout {timeout}: give a module's limit in seconds")
                })?)
            }
            other => bail!(
                "cargo xtask compat: unknown argument {other:?}; usage: cargo xtask compat [--all] \
                 [--modules a,b] [--passes plain,root-fresh,root-forked,user-fresh,user-forked] \
                 [--jobs N] [--timeout SECONDS] [--docs]"
            ),
        }
    }
    Ok(options)
}

/// `cargo xtask compat [...]`.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let options = parse(args)?;
    let exclusions = compare::Exclusions::parse(EXCLUSIONS)?;
    let docs = crate::root().join("docs/compat.md");
    if options.docs_only {
        return compare::write_docs(&docs, &exclusions, None);
    }
    compare::check_docs(&docs, &exclusions)?;
    let comparison = run_passes(&options, &exclusions)?;
    comparison.print();
    if options.all {
        compare::write_docs(&docs, &exclusions, Some(&comparison))?;
        eprintln!("==> wrote {}", docs.display());
    }
    comparison.verdict()
}

/// The ci list in every pass (for `cargo xtask ci`): fails on a test newly failing inside.
pub(crate) fn ci() -> Result<()> {
    main(&[])
}

/// `cpython_tests_pass_ratio` for the bench: the ci list in every pass, in one run.
pub(crate) fn pass_ratio() -> Result<f64> {
    let options = parse(&[])?;
    let exclusions = compare::Exclusions::parse(EXCLUSIONS)?;
    let comparison = run_passes(&options, &exclusions)?;
    comparison.print();
    Ok(comparison.pass_ratio())
}

fn run_passes(options: &Options, exclusions: &compare::Exclusions) -> Result<Comparison> {
    crate::build_cli()?;
    let setup = Setup::new()?;
    let passes = setup.available(&options.passes);
    if !passes.contains(&Pass::Plain) {
        bail!("cargo xtask compat: the plain pass is what the others are compared with; keep it in --passes");
    }
    let listed: Vec<(String, Vec<String>)> = match (&options.modules, options.all) {
        (Some(modules), _) => modules.iter().map(|m| (m.clone(), Vec::new())).collect(),
        (None, true) => setup
            .list_suite()?
            .into_iter()
            .map(|m| (m, Vec::new()))
            .collect(),
        (None, false) => ci_modules(),
    };
    let modules: Vec<String> = listed.iter().map(|(m, _)| m.clone()).collect();
    let narrowed: BTreeMap<String, Vec<String>> = listed.into_iter().collect();
    let timeout = options
        .timeout
        .unwrap_or(if options.all { ALL_TIMEOUT } else { CI_TIMEOUT });
    eprintln!(
        "==> compat: {} modules × {} passes ({}), {} at a time, python {}",
        modules.len(),
        passes.len(),
        passes
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", "),
        options.jobs,
        setup.python.display()
    );
    let started = std::time::Instant::now();
    let jobs: Vec<run::Job> = modules
        .iter()
        .flat_map(|module| {
            passes
                .iter()
                .filter(|pass| pass.covers(module))
                .map(|&pass| run::Job {
                    pass,
                    module: module.clone(),
                    matching: narrowed[module].clone(),
                })
        })
        .collect();
    let results = setup.run_all(jobs, options.jobs, timeout);
    let mut comparison = Comparison::new(&modules, &passes, results, exclusions);
    // A test that differs runs once more inside, alone: what passes then was the machine's load.
    let mut reruns = comparison.reruns();
    for job in &mut reruns {
        if job.matching.is_empty() {
            job.matching = narrowed[&job.module].clone();
        }
    }
    if !reruns.is_empty() {
        eprintln!("==> compat: {} reruns of tests that differ", reruns.len());
        let again = setup.run_all(reruns, options.jobs, timeout);
        comparison.absorb_reruns(again);
    }
    eprintln!("==> compat: done in {:.0?}", started.elapsed());
    Ok(comparison)
}

/// Modules at once: three per core. The suite's modules mostly wait (timeouts, sleeps, child
/// processes): over the ci list a pass's modules take about a fifth of their wall time in CPU, so
/// three per core keeps the cores busy without starving a test of its time slices.
fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 3)
}

/// The ci list's modules, in its order (slowest first, so the modules at once finish together), each
/// with the regrtest `--match` patterns that narrow it (none: the whole module).
fn ci_modules() -> Vec<(String, Vec<String>)> {
    CI_MODULES
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut words = l.split_whitespace().map(str::to_owned);
            let module = words.next().unwrap_or_default();
            (module, words.collect())
        })
        .collect()
}

/// One module's outcome in one pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct ModuleRun {
    /// regrtest's exit code, `"timeout"` or `"signal N"`.
    pub exit: String,
    pub seconds: f64,
    /// CPU the module's processes took (those regrtest waited for).
    pub cpu_seconds: f64,
    pub passed: std::collections::BTreeSet<String>,
    pub failed: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    /// Why regrtest skipped the whole module, when it did.
    pub module_skipped: Option<String>,
    /// The tail of regrtest's output when it did not exit 0.
    pub log: Option<String>,
}

impl ModuleRun {
    /// A result of `driver.py`.
    fn from_json(value: &serde_json::Value) -> Result<Self> {
        let tests = &value["tests"];
        let map = |v: &serde_json::Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let Some(passed) = tests["passed"].as_array() else {
            bail!("the driver's result has no tests.passed: {value}");
        };
        Ok(Self {
            exit: match &value["exit"] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            },
            seconds: value["seconds"].as_f64().unwrap_or(0.0),
            cpu_seconds: value["cpu_seconds"].as_f64().unwrap_or(0.0),
            passed: passed
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            failed: map(&tests["failed"]),
            skipped: map(&tests["skipped"]),
            module_skipped: value["skipped"].as_str().map(str::to_owned),
            log: value["log"].as_str().map(str::to_owned),
        })
    }
}

/// Where `cargo xtask compat` keeps its files for one invocation (removed at the end).
fn work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("runpython-compat-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ci_list_has_at_least_sixty_modules_and_the_ones_the_issue_names() {
        let modules: Vec<String> = ci_modules().into_iter().map(|(m, _)| m).collect();
        assert!(modules.len() >= 60, "{}", modules.len());
        for needed in [
            "test_socket",
            "test_selectors",
            "test_subprocess",
            "test_os",
            "test_signal",
            "test_pty",
            "test_fcntl",
            "test_mmap",
            "test_logging",
            "test_httpservers",
            "test_xmlrpc",
            "test_tempfile",
            "test_shutil",
            "test_zipfile",
            "test_sqlite3",
        ] {
            assert!(modules.iter().any(|m| m == needed), "{needed} is missing");
        }
        assert!(modules.iter().any(|m| m.starts_with("test_asyncio")));
        assert!(modules
            .iter()
            .any(|m| m.starts_with("test_multiprocessing")));
        let mut sorted = modules.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), modules.len(), "a module is listed twice");
    }

    #[test]
    fn a_driver_result_reads_into_a_module_run() {
        let value = serde_json::json!({
            "module": "test_x", "exit": 2, "seconds": 1.5,
            "tests": {"passed": ["a"], "failed": {"b": "AssertionError: no"}, "skipped": {"c": "why"}},
            "log": "tail"
        });
        let run = ModuleRun::from_json(&value).unwrap();
        assert_eq!(run.exit, "2");
        assert!(run.passed.contains("a"));
        assert_eq!(run.failed["b"], "AssertionError: no");
        assert_eq!(run.skipped["c"], "why");
        assert_eq!(run.log.as_deref(), Some("tail"));
        assert!(ModuleRun::from_json(&serde_json::json!({"tests": {}})).is_err());
    }

    #[test]
    fn arguments_are_parsed_or_refused_with_the_usage() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&[
            "--modules",
            "test_os,test_pty",
            "--passes",
            "plain,user-fresh",
        ]))
        .unwrap();
        assert_eq!(o.modules.unwrap(), ["test_os", "test_pty"]);
        assert_eq!(o.passes, [Pass::Plain, Pass::UserFresh]);
        let e = parse(&args(&["--bogus"])).unwrap_err().to_string();
        assert!(e.contains("usage"), "{e}");
        assert!(parse(&args(&["--passes", "nope"])).is_err());
        assert!(parse(&args(&["--jobs", "0"])).is_err());
    }
}
