//! Comparing the passes: which tests pass in the plain process and not inside, which of those are
//! listed exclusions, the table printed and written into `docs/compat.md`, and the verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::run::{Job, Pass};
use super::ModuleRun;

/// A test that passes in a plain process and not inside, for a reason that is the boundary itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exclusion {
    pub id: String,
    /// The passes it applies to.
    pub passes: Vec<Pass>,
    /// The text the passes were given as (`all`, `user`, `root-forked,user-forked`).
    pub passes_text: String,
    pub reason: String,
}

/// `exclusions.txt`: `TEST_ID PASSES REASON...` per line, `#` comments. PASSES is `all`, or a
/// comma-separated list of pass names and the groups `root`, `user`, `fresh`, `forked`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Exclusions(pub Vec<Exclusion>);

impl Exclusions {
    pub fn parse(text: &str) -> Result<Self> {
        let mut found = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let field = |text: &str| -> (String, String) {
                let text = text.trim_start();
                let end = text.find(char::is_whitespace).unwrap_or(text.len());
                (text[..end].to_owned(), text[end..].trim().to_owned())
            };
            let (id, rest) = field(line);
            let (passes_text, reason) = field(&rest);
            let (id, passes_text, reason) = (id.as_str(), passes_text.as_str(), reason.as_str());
            if passes_text.is_empty() {
                bail!(
                    "exclusions.txt line {}: {line:?} is not `TEST_ID PASSES REASON`",
                    n + 1
                );
            }
            if !id.starts_with("test.") || reason.is_empty() {
                bail!(
                    "exclusions.txt line {}: an exclusion is one test id (test.test_x.Case.test_y, \
                     never a whole module) and its reason",
                    n + 1
                );
            }
            let mut passes = Vec::new();
            for name in passes_text.split(',') {
                let group: Vec<Pass> = match name {
                    "all" => Pass::ALL[1..].to_vec(),
                    "root" => vec![Pass::RootFresh, Pass::RootForked],
                    "user" => vec![Pass::UserFresh, Pass::UserForked, Pass::UserPolicy],
                    "fresh" => vec![Pass::RootFresh, Pass::UserFresh, Pass::UserPolicy],
                    "forked" => vec![Pass::RootForked, Pass::UserForked],
                    other => vec![Pass::parse(other)
                        .with_context(|| format!("exclusions.txt line {}", n + 1))?],
                };
                passes.extend(group);
            }
            found.push(Exclusion {
                id: id.to_owned(),
                passes,
                passes_text: passes_text.to_owned(),
                reason: reason.to_owned(),
            });
        }
        Ok(Self(found))
    }

    fn find(&self, pass: Pass, id: &str) -> Option<&Exclusion> {
        self.0
            .iter()
            .find(|e| e.id == id && e.passes.contains(&pass))
    }
}

type Key = (Pass, String);

/// Every pass's results, and what differs.
#[derive(Debug)]
pub(crate) struct Comparison {
    modules: Vec<String>,
    passes: Vec<Pass>,
    runs: BTreeMap<Key, Result<ModuleRun, String>>,
    reruns: BTreeMap<Key, Result<ModuleRun, String>>,
    exclusions: Exclusions,
}

/// One inside pass of one module against the plain pass.
#[derive(Debug, Default)]
struct Diff {
    /// Passed in the plain process, not inside, not excluded, not passing on the rerun: why.
    lost: BTreeMap<String, String>,
    /// Excluded: the exclusion's reason.
    excluded: BTreeMap<String, String>,
    /// Passed on the rerun.
    flaky: BTreeSet<String>,
    /// Passed in both.
    kept: usize,
    /// A pass that produced no results.
    error: Option<String>,
}

impl Comparison {
    pub fn new(
        modules: &[String],
        passes: &[Pass],
        results: Vec<(Job, Result<ModuleRun, String>)>,
        exclusions: &Exclusions,
    ) -> Self {
        Self {
            modules: modules.to_vec(),
            passes: passes.to_vec(),
            runs: results
                .into_iter()
                .map(|(job, r)| ((job.pass, job.module), r))
                .collect(),
            reruns: BTreeMap::new(),
            exclusions: exclusions.clone(),
        }
    }

    fn inside(&self) -> impl Iterator<Item = Pass> + '_ {
        self.passes.iter().copied().filter(|&p| p != Pass::Plain)
    }

    fn diff(&self, pass: Pass, module: &str) -> Diff {
        let key = |p: Pass| (p, module.to_owned());
        let mut diff = Diff::default();
        let plain = match self.runs.get(&key(Pass::Plain)) {
            Some(Ok(run)) => run,
            Some(Err(e)) => {
                diff.error = Some(format!("the plain pass failed: {e}"));
                return diff;
            }
            None => return diff,
        };
        let inside = match self.runs.get(&key(pass)) {
            Some(Ok(run)) => run,
            Some(Err(e)) => {
                diff.error = Some(e.clone());
                return diff;
            }
            None => return diff,
        };
        let rerun = self.reruns.get(&key(pass)).and_then(|r| r.as_ref().ok());
        for id in &plain.passed {
            if inside.passed.contains(id) {
                diff.kept += 1;
            } else if let Some(exclusion) = self.exclusions.find(pass, id) {
                diff.excluded.insert(id.clone(), exclusion.reason.clone());
            } else if rerun.is_some_and(|r| r.passed.contains(id)) {
                diff.flaky.insert(id.clone());
                diff.kept += 1;
            } else {
                let why = inside
                    .failed
                    .get(id)
                    .map(|w| format!("failed: {w}"))
                    .or_else(|| inside.skipped.get(id).map(|w| format!("skipped: {w}")))
                    .or_else(|| fixture_of(inside, id))
                    .unwrap_or_else(|| match &inside.module_skipped {
                        Some(w) => format!("module skipped: {w}"),
                        None => format!("never ran (exit {})", inside.exit),
                    });
                diff.lost.insert(id.clone(), why);
            }
        }
        diff
    }

    /// The tests that differ, to run once more inside: by id where every id is one regrtest can
    /// match, else the whole module.
    pub fn reruns(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for module in &self.modules {
            for pass in self.inside() {
                let diff = self.diff(pass, module);
                if diff.lost.is_empty() {
                    continue;
                }
                let by_id = diff
                    .lost
                    .keys()
                    .all(|id| id.starts_with("test.") && !id.contains(' '));
                jobs.push(Job {
                    pass,
                    module: module.clone(),
                    matching: if by_id {
                        diff.lost.keys().cloned().collect()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
        jobs
    }

    pub fn absorb_reruns(&mut self, results: Vec<(Job, Result<ModuleRun, String>)>) {
        for (job, result) in results {
            self.reruns.insert((job.pass, job.module), result);
        }
    }

    /// Tests passing inside over tests passing in the plain process, over every module and inside
    /// pass (an excluded test counts as not passing).
    pub fn pass_ratio(&self) -> f64 {
        let (mut kept, mut total) = (0usize, 0usize);
        for module in &self.modules {
            let plain = match self.runs.get(&(Pass::Plain, module.clone())) {
                Some(Ok(run)) => run.passed.len(),
                _ => continue,
            };
            for pass in self.inside().filter(|p| p.covers(module)) {
                kept += self.diff(pass, module).kept;
                total += plain;
            }
        }
        if total == 0 {
            0.0
        } else {
            kept as f64 / total as f64
        }
    }

    fn cell(&self, pass: Pass, module: &str) -> String {
        match self.runs.get(&(pass, module.to_owned())) {
            Some(Ok(run)) => format!(
                "{}/{}/{}",
                run.passed.len(),
                run.failed.len(),
                run.skipped.len()
            ),
            Some(Err(_)) => "error".into(),
            None => "-".into(),
        }
    }

    /// The table (passed/failed/skipped per pass; `-N` tests lost inside, `xN` excluded, `~N`
    /// passed on the rerun), then every test that passes in the plain process and not inside.
    pub fn print(&self) {
        let mut out = String::new();
        let _ = write!(out, "{:<36}", "module (passed/failed/skipped)");
        for pass in &self.passes {
            let _ = write!(out, " {:>22}", pass.name());
        }
        out.push('\n');
        let mut details = String::new();
        for module in &self.modules {
            let _ = write!(out, "{module:<36}");
            for &pass in &self.passes {
                let mut cell = self.cell(pass, module);
                if pass != Pass::Plain {
                    let d = self.diff(pass, module);
                    for (n, mark) in [
                        (d.lost.len(), "-"),
                        (d.excluded.len(), "x"),
                        (d.flaky.len(), "~"),
                    ] {
                        if n > 0 {
                            let _ = write!(cell, " {mark}{n}");
                        }
                    }
                    for (id, why) in &d.lost {
                        let _ = writeln!(details, "  {} {id}: {why}", pass.name());
                    }
                    // Why tests never ran is in regrtest's output.
                    let unexplained = d.lost.values().any(|w| w.starts_with("never ran"));
                    if let (true, Some(Ok(run))) =
                        (unexplained, self.runs.get(&(pass, module.clone())))
                    {
                        let lines: Vec<&str> = run.log.as_deref().unwrap_or("").lines().collect();
                        for line in &lines[lines.len().saturating_sub(12)..] {
                            let _ = writeln!(details, "      | {line}");
                        }
                    }
                    for (id, why) in &d.excluded {
                        let _ = writeln!(details, "  {} {id}: excluded ({why})", pass.name());
                    }
                    for id in &d.flaky {
                        let _ = writeln!(details, "  {} {id}: passed on the rerun", pass.name());
                    }
                    if let Some(e) = &d.error {
                        let _ = writeln!(details, "  {} {module}: {e}", pass.name());
                    }
                }
                let _ = write!(out, " {cell:>22}");
            }
            out.push('\n');
        }
        if !details.is_empty() {
            out.push_str("\npassed in the plain process, not inside:\n");
            out.push_str(&details);
        }
        for stale in self.stale() {
            let _ = writeln!(
                out,
                "warning: exclusion {} ({}) is not needed: it passed inside",
                stale.id, stale.passes_text
            );
        }
        for &pass in &self.passes {
            let (mut wall, mut cpu) = (0.0, 0.0);
            for run in self.runs.iter().filter(|((p, _), _)| *p == pass) {
                if let (_, Ok(run)) = run {
                    wall += run.seconds;
                    cpu += run.cpu_seconds;
                }
            }
            let _ = writeln!(
                out,
                "{}: {wall:.0} s of modules, {cpu:.0} s of CPU",
                pass.name()
            );
        }
        let _ = writeln!(out, "\ncpython_tests_pass_ratio {:.4}", self.pass_ratio());
        print!("{out}");
    }

    /// Exclusions whose test passed inside in a pass they apply to.
    fn stale(&self) -> Vec<&Exclusion> {
        self.exclusions
            .0
            .iter()
            .filter(|e| {
                self.runs.iter().any(|((pass, _), run)| {
                    e.passes.contains(pass) && run.as_ref().is_ok_and(|r| r.passed.contains(&e.id))
                })
            })
            .collect()
    }

    /// `Err` when a test passes in the plain process and not inside without being excluded, or a
    /// pass produced no results.
    pub fn verdict(&self) -> Result<()> {
        let mut lost = 0;
        let mut errors = Vec::new();
        for module in &self.modules {
            for pass in self.inside() {
                let d = self.diff(pass, module);
                lost += d.lost.len();
                if let Some(e) = d.error {
                    errors.push(format!("{} {module}: {e}", pass.name()));
                }
            }
        }
        if lost > 0 || !errors.is_empty() {
            bail!(
                "compat: {lost} tests pass in a plain process and not inside (listed above), and \
                 {} modules gave no results{}; fix the sandbox, or list a test in \
                 xtask/src/compat/exclusions.txt with the reason it is the boundary itself",
                errors.len(),
                errors
                    .iter()
                    .map(|e| format!("\n  {}", e.lines().next().unwrap_or("")))
                    .collect::<String>()
            );
        }
        Ok(())
    }

    /// The suite's table for `docs/compat.md`.
    fn markdown(&self) -> String {
        let mut out = String::from("| module | plain: passed / failed / skipped |");
        for pass in self.inside() {
            let _ = write!(out, " {} |", pass.name());
        }
        out.push_str("\n|---|---|");
        for _ in self.inside() {
            out.push_str("---|");
        }
        out.push('\n');
        for module in &self.modules {
            let plain = match self.runs.get(&(Pass::Plain, module.clone())) {
                Some(Ok(run)) => match &run.module_skipped {
                    Some(why) if run.passed.is_empty() => {
                        format!("skipped: {}", why.replace('|', "/"))
                    }
                    _ => self.cell(Pass::Plain, module).replace('/', " / "),
                },
                Some(Err(_)) => "no result".into(),
                None => "-".into(),
            };
            let _ = write!(out, "| {module} | {plain} |");
            for pass in self.inside() {
                let d = self.diff(pass, module);
                let cell = match (&d.error, d.lost.len(), d.excluded.len()) {
                    (Some(_), _, _) => "no result".to_owned(),
                    (None, 0, 0) => "same".to_owned(),
                    (None, lost, excluded) => {
                        let mut c = Vec::new();
                        if lost > 0 {
                            c.push(format!("{lost} lost"));
                        }
                        if excluded > 0 {
                            c.push(format!("{excluded} excluded"));
                        }
                        c.join(", ")
                    }
                };
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
        let _ = write!(
            out,
            "\n`cpython_tests_pass_ratio` over these modules: {:.4}.\n",
            self.pass_ratio()
        );
        out
    }
}

/// Why `id` never ran, when a class or module fixture of it failed or skipped: unittest reports
/// those as `setUpClass (test.test_x.Case)` or `setUpModule (test.test_x)` in place of its tests.
fn fixture_of(run: &ModuleRun, id: &str) -> Option<String> {
    let covers = |fixture: &str| {
        let scope = fixture
            .split_once(" (")
            .and_then(|(_, rest)| rest.strip_suffix(')'));
        scope.is_some_and(|scope| id.starts_with(&format!("{scope}.")))
    };
    let found = |outcomes: &BTreeMap<String, String>, what: &str| {
        outcomes
            .iter()
            .find(|(fixture, _)| covers(fixture))
            .map(|(fixture, why)| format!("{what} with {fixture}: {why}"))
    };
    found(&run.failed, "failed").or_else(|| found(&run.skipped, "skipped"))
}

const EXCLUSIONS_BEGIN: &str = "<!-- exclusions: begin (cargo xtask compat --docs writes this list from xtask/src/compat/exclusions.txt) -->";
const EXCLUSIONS_END: &str = "<!-- exclusions: end -->";
const SUITE_BEGIN: &str = "<!-- suite: begin (cargo xtask compat --all writes this table) -->";
const SUITE_END: &str = "<!-- suite: end -->";

fn exclusions_markdown(exclusions: &Exclusions) -> String {
    if exclusions.0.is_empty() {
        return "No test is excluded.\n".into();
    }
    let mut out = String::from("| test | passes | why |\n|---|---|---|\n");
    for e in &exclusions.0 {
        let _ = writeln!(out, "| `{}` | {} | {} |", e.id, e.passes_text, e.reason);
    }
    out
}

/// `text` with what lies between `begin` and `end` replaced by `body`.
fn replace_block(text: &str, begin: &str, end: &str, body: &str) -> Result<String> {
    let (Some(start), Some(stop)) = (text.find(begin), text.find(end)) else {
        bail!("docs/compat.md lacks its generated block markers {begin:?} … {end:?}");
    };
    let start = start + begin.len();
    if stop < start {
        bail!("docs/compat.md's markers {begin:?} and {end:?} are out of order");
    }
    Ok(format!("{}\n{body}{}", &text[..start], &text[stop..]))
}

/// Rewrites `docs/compat.md`'s list of exclusions, and with `suite` its table.
pub(crate) fn write_docs(
    path: &Path,
    exclusions: &Exclusions,
    suite: Option<&Comparison>,
) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut text = replace_block(
        &text,
        EXCLUSIONS_BEGIN,
        EXCLUSIONS_END,
        &exclusions_markdown(exclusions),
    )?;
    if let Some(suite) = suite {
        text = replace_block(&text, SUITE_BEGIN, SUITE_END, &suite.markdown())?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `Err` when `docs/compat.md`'s list of exclusions is not `exclusions.txt`'s.
pub(crate) fn check_docs(path: &Path, exclusions: &Exclusions) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let want = replace_block(
        &text,
        EXCLUSIONS_BEGIN,
        EXCLUSIONS_END,
        &exclusions_markdown(exclusions),
    )?;
    if want != text {
        bail!(
            "docs/compat.md's list of exclusions differs from xtask/src/compat/exclusions.txt: \
             run `cargo xtask compat --docs`"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(passed: &[&str], failed: &[&str]) -> ModuleRun {
        ModuleRun {
            exit: "0".into(),
            passed: passed.iter().map(|s| s.to_string()).collect(),
            failed: failed
                .iter()
                .map(|s| (s.to_string(), "AssertionError".into()))
                .collect(),
            ..ModuleRun::default()
        }
    }

    fn job(pass: Pass) -> Job {
        Job {
            pass,
            module: "test_x".into(),
            matching: Vec::new(),
        }
    }

    #[test]
    fn exclusions_name_a_test_its_passes_and_a_reason() {
        let e = Exclusions::parse(
            "# comment\n\ntest.test_x.C.test_a user  setgroups is refused in a user namespace\n\
             test.test_x.C.test_b root-forked,user-fresh  why\n",
        )
        .unwrap();
        assert_eq!(
            e.0[0].passes,
            [Pass::UserFresh, Pass::UserForked, Pass::UserPolicy]
        );
        assert_eq!(e.0[0].reason, "setgroups is refused in a user namespace");
        assert_eq!(e.0[1].passes, [Pass::RootForked, Pass::UserFresh]);
        for bad in [
            "test_x all whole module",
            "test.test_x.C.test_a all",
            "test.x nope why",
        ] {
            assert!(Exclusions::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_test_lost_inside_fails_unless_excluded_or_passing_on_the_rerun() {
        let exclusions =
            Exclusions::parse("test.test_x.C.test_b root-fresh  the boundary").unwrap();
        let results = vec![
            (
                job(Pass::Plain),
                Ok(run(
                    &[
                        "test.test_x.C.test_a",
                        "test.test_x.C.test_b",
                        "test.test_x.C.test_c",
                    ],
                    &[],
                )),
            ),
            (
                job(Pass::RootFresh),
                Ok(run(
                    &["test.test_x.C.test_a"],
                    &["test.test_x.C.test_b", "test.test_x.C.test_c"],
                )),
            ),
        ];
        let mut c = Comparison::new(
            &["test_x".into()],
            &[Pass::Plain, Pass::RootFresh],
            results,
            &exclusions,
        );
        let d = c.diff(Pass::RootFresh, "test_x");
        assert_eq!(d.lost.keys().collect::<Vec<_>>(), ["test.test_x.C.test_c"]);
        assert!(d.excluded.contains_key("test.test_x.C.test_b"));
        assert!(c.verdict().is_err());
        assert!((c.pass_ratio() - 1.0 / 3.0).abs() < 1e-9);
        let reruns = c.reruns();
        assert_eq!(reruns.len(), 1);
        assert_eq!(reruns[0].matching, ["test.test_x.C.test_c"]);
        c.absorb_reruns(vec![(
            job(Pass::RootFresh),
            Ok(run(&["test.test_x.C.test_c"], &[])),
        )]);
        assert!(c.verdict().is_ok());
        assert!((c.pass_ratio() - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_pass_without_results_fails_the_verdict() {
        let results = vec![
            (job(Pass::Plain), Ok(run(&["test.test_x.C.test_a"], &[]))),
            (job(Pass::UserForked), Err("the run ended error".into())),
        ];
        let c = Comparison::new(
            &["test_x".into()],
            &[Pass::Plain, Pass::UserForked],
            results,
            &Exclusions::default(),
        );
        let e = c.verdict().unwrap_err().to_string();
        assert!(e.contains("1 modules gave no results"), "{e}");
    }

    #[test]
    fn the_docs_blocks_are_replaced_between_their_markers() {
        let page = format!("intro\n{EXCLUSIONS_BEGIN}\nold\n{EXCLUSIONS_END}\nafter\n");
        let e = Exclusions::parse("test.test_x.C.test_a all  why").unwrap();
        let new = replace_block(
            &page,
            EXCLUSIONS_BEGIN,
            EXCLUSIONS_END,
            &exclusions_markdown(&e),
        )
        .unwrap();
        assert!(
            new.contains("| `test.test_x.C.test_a` | all | why |"),
            "{new}"
        );
        assert!(new.starts_with("intro\n") && new.ends_with(&format!("{EXCLUSIONS_END}\nafter\n")));
        assert!(replace_block("nothing", EXCLUSIONS_BEGIN, EXCLUSIONS_END, "").is_err());
    }
}
