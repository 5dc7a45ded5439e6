//! `cargo xtask docs`: every code block of `README.md` and `docs/*.md` is tested, so when the code
//! changes the docs fail, not their readers.
//!
//! - ```` ```sh ```` blocks run with bash (`-euo pipefail`), ```` ```python ```` blocks with the Python
//!   package's test venv (`target/py-test-venv`, made by `cargo xtask py`), both with the debug
//!   `runpython` binary, that venv and the tools on `PATH`. README's blocks run at the repository
//!   root (its commands are for a fresh clone); each page's blocks run in order in a scratch directory
//!   of their own (with `examples/` linked in), so one block may use what an earlier one wrote.
//! - A ```` ```text ```` block right after a runnable block is its printed result: each of its lines
//!   (blank ones and `...` aside) must appear, in order, within the lines the block printed.
//! - ```` ```json ```` blocks must parse. ```` ```rust ```` blocks are doctests: the pages holding them
//!   are included in runpython-core's docs under `cfg(doctest)` ([`DOCTEST_PAGES`] must list them).
//! - A block whose info string says `skip` is not run (the reason is the prose around it); the count
//!   is printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::root;

/// The pages whose ```` ```rust ```` blocks runpython-core runs as doctests (see its `lib.rs`).
const DOCTEST_PAGES: &[&str] = &["README.md", "docs/library.md", "docs/sessions.md"];

/// How long one block may take (a first run may install packages).
const BLOCK_SECONDS: u32 = 600;

/// One fenced block of a page.
#[derive(Debug, PartialEq)]
struct Block {
    /// The info string after the opening fence (`sh`, `python skip`, `rust,no_run`...).
    info: String,
    /// Its first line's number in the page (1-based), for messages.
    line: usize,
    text: String,
}

impl Block {
    fn lang(&self) -> &str {
        self.info
            .split(|c: char| c == ',' || c.is_whitespace())
            .next()
            .unwrap_or("")
    }
    fn skipped(&self) -> bool {
        self.info.split_whitespace().any(|w| w == "skip")
    }
}

/// The fenced blocks of a Markdown page, in order; with each runnable block, the `text` block that
/// follows it (its expected output), if one does with only blank lines between.
fn blocks(page: &str) -> Vec<(Block, Option<Block>)> {
    let mut found: Vec<Block> = Vec::new();
    let mut ends: Vec<usize> = Vec::new();
    let mut open: Option<(String, usize, Vec<&str>)> = None;
    for (i, line) in page.lines().enumerate() {
        match &mut open {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some((info.trim().to_owned(), i + 1, Vec::new()));
                }
            }
            Some((info, start, body)) => {
                if line.trim_end() == "```" {
                    found.push(Block {
                        info: std::mem::take(info),
                        line: *start,
                        text: body.join("\n") + "\n",
                    });
                    ends.push(i + 1);
                    open = None;
                } else {
                    body.push(line);
                }
            }
        }
    }
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < found.len() {
        let runnable = matches!(found[i].lang(), "sh" | "python");
        let next_is_output = runnable
            && i + 1 < found.len()
            && found[i + 1].lang() == "text"
            && lines[ends[i]..found[i + 1].line - 1]
                .iter()
                .all(|l| l.trim().is_empty());
        let block = std::mem::replace(
            &mut found[i],
            Block {
                info: String::new(),
                line: 0,
                text: String::new(),
            },
        );
        if next_is_output {
            let output = std::mem::replace(
                &mut found[i + 1],
                Block {
                    info: String::new(),
                    line: 0,
                    text: String::new(),
                },
            );
            out.push((block, Some(output)));
            i += 2;
        } else {
            out.push((block, None));
            i += 1;
        }
    }
    out
}

/// Whether `printed` shows every expected line (blank ones and `...` aside), in order, each within
/// one printed line; else the first expected line it lacks.
fn shows<'a>(printed: &str, expected: &'a str) -> Result<(), &'a str> {
    let mut printed = printed.lines();
    for want in expected.lines().map(str::trim) {
        if want.is_empty() || want == "..." {
            continue;
        }
        if !printed.any(|got| got.contains(want)) {
            return Err(want);
        }
    }
    Ok(())
}

/// Runs every block of every page; fails listing each block that failed.
pub(crate) fn check(tools_bin: &Path) -> Result<()> {
    let root = root();
    let python = root.join("target/py-test-venv/bin/python");
    if !python.exists() {
        bail!(
            "{} is missing: `cargo xtask py` makes it (the docs' Python blocks run on it)",
            python.display()
        );
    }
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .context("reading docs/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let path = format!(
        "{}:{}:{}:{}",
        root.join("target/debug").display(),
        root.join("target/py-test-venv/bin").display(),
        tools_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scratch = root.join("target/docs-scratch");
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).context("clearing target/docs-scratch")?;
    }
    let mut failures = Vec::new();
    let (mut ran, mut skipped) = (0, 0);
    for page in &pages {
        let shown = page
            .strip_prefix(&root)
            .unwrap_or(page)
            .display()
            .to_string();
        let text = std::fs::read_to_string(page).with_context(|| format!("reading {shown}"))?;
        let cwd = if shown == "README.md" {
            root.clone()
        } else {
            let dir = scratch.join(shown.replace('/', "_"));
            std::fs::create_dir_all(&dir)?;
            std::os::unix::fs::symlink(root.join("examples"), dir.join("examples"))?;
            dir
        };
        for (block, expected) in blocks(&text) {
            let at = format!("{shown}:{}", block.line);
            match block.lang() {
                "rust" if !DOCTEST_PAGES.contains(&shown.as_str()) => failures.push(format!(
                    "{at}: a rust block in a page runpython-core does not include as doctests; \
                     add the page to DOCTEST_PAGES and to runpython-core's lib.rs"
                )),
                "json" => {
                    if let Err(e) = serde_json::from_str::<serde_json::Value>(&block.text) {
                        failures.push(format!("{at}: the JSON does not parse: {e}"));
                    }
                }
                "sh" | "python" if block.skipped() => skipped += 1,
                "sh" | "python" => {
                    ran += 1;
                    let started = Instant::now();
                    eprintln!("==> docs {at} ({})", block.lang());
                    let mut cmd = Command::new("timeout");
                    cmd.arg(format!("{BLOCK_SECONDS}"));
                    if block.lang() == "sh" {
                        cmd.args(["bash", "-euo", "pipefail", "-c", &block.text]);
                    } else {
                        cmd.arg(&python).args(["-c", &block.text]);
                    }
                    let out = cmd
                        .current_dir(&cwd)
                        .env("PATH", &path)
                        .env("RUNPYTHON_TOOLS_BIN", tools_bin)
                        .output()
                        .with_context(|| format!("{at}: cannot start the block"))?;
                    let printed = String::from_utf8_lossy(&out.stdout);
                    let errors = String::from_utf8_lossy(&out.stderr);
                    eprintln!("    {at}: {} in {:.0?}", out.status, started.elapsed());
                    if !out.status.success() {
                        failures.push(format!(
                            "{at}: exited with {}\n--- stdout\n{printed}--- stderr\n{errors}",
                            out.status
                        ));
                    } else if let Some(expected) = expected {
                        if let Err(missing) = shows(&printed, &expected.text) {
                            failures.push(format!(
                                "{at}: its output lacks {missing:?} (expected at {shown}:{})\n--- stdout\n{printed}",
                                expected.line
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    eprintln!("docs: {ran} blocks ran, {skipped} skipped as marked");
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("docs: {failure}\n");
        }
        bail!("{} docs block(s) failed (listed above)", failures.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_pair_a_runnable_block_with_the_output_after_it() {
        let page = "# t\n```sh\necho hi\n```\n\n```text\nhi\n```\n```python skip\nx\n```\n```text\nout\n```\nprose\n```text\nalone\n```\n";
        let found = blocks(page);
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].0.text, "echo hi\n");
        assert_eq!(found[0].0.line, 2);
        assert_eq!(found[0].1.as_ref().unwrap().text, "hi\n");
        assert!(found[1].0.skipped() && found[1].0.lang() == "python");
        // A skipped block still owns its output block; a text block on its own is prose.
        assert!(found[1].1.is_some());
        assert_eq!(found[2].0.lang(), "text");
    }

    #[test]
    fn output_matches_in_order_within_lines() {
        assert_eq!(shows("a 1\nb 2\nc 3\n", "1\n...\n3\n"), Ok(()));
        assert_eq!(shows("a 1\nb 2\n", "2\n1\n"), Err("1"));
        assert_eq!(shows("x\n", "\n\n"), Ok(()));
    }
}
