//! How `cargo xtask` runs a command: [`step`] names it, runs it and says how it ended and when;
//! [`concurrently`] runs jobs of steps a few at a time with each step's output kept in one piece.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// When this xtask started: each step says how far into the whole job it ended, so a slow CI log
/// shows where its time went without a second clock.
pub(crate) static XTASK_STARTED: std::sync::LazyLock<Instant> =
    std::sync::LazyLock::new(Instant::now);

thread_local! {
    /// Set on the threads of [`concurrently`]: their steps keep their output and print it in one piece
    /// when they end, so two jobs' lines never interleave.
    static CAPTURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub(crate) fn step(name: &str, cmd: &mut Command) -> Result<()> {
    let started = Instant::now();
    let (status, output) = if CAPTURED.get() {
        // One line now, so a step that never ends is still named in the log; the rest when it ends:
        // what it printed on stdout, then on stderr.
        eprintln!("--> {name}: started (at {:.0?})", XTASK_STARTED.elapsed());
        let out = cmd
            .output()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status, text)
    } else {
        eprintln!("==> {name}");
        let status = cmd
            .status()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        (status, String::new())
    };
    let ended = format!(
        "    {name}: {status} in {:.0?} (at {:.0?})",
        started.elapsed(),
        XTASK_STARTED.elapsed()
    );
    if CAPTURED.get() {
        // One write, under stderr's lock: this step's header, what it printed and how it ended.
        eprint!(
            "==> {name}\n{output}{}{ended}\n",
            if output.ends_with('\n') || output.is_empty() {
                ""
            } else {
                "\n"
            }
        );
    } else {
        eprintln!("{ended}");
    }
    if !status.success() {
        bail!("{name} failed ({status}): {cmd:?}");
    }
    Ok(())
}

/// Runs `jobs`, at most `width` at a time, each on a thread of its own whose steps print in one piece
/// ([`CAPTURED`]); every job runs even if another fails, and the failures are returned together. For the
/// parts of CI that wait on subprocesses one core at a time (pytest, mypy): two at once on a
/// two-core machine take about half the time.
pub(crate) fn concurrently<'a>(
    width: usize,
    jobs: Vec<Box<dyn FnOnce() -> Result<()> + Send + 'a>>,
) -> Result<()> {
    let queue = std::sync::Mutex::new(jobs.into_iter().collect::<std::collections::VecDeque<_>>());
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..width.max(1) {
            scope.spawn(|| {
                CAPTURED.set(true);
                loop {
                    let Some(job) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
                    else {
                        break;
                    };
                    if let Err(e) = job() {
                        eprintln!("==> failed: {e:#}");
                        failures.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    if failures.is_empty() {
        return Ok(());
    }
    bail!(
        "{}",
        failures
            .iter()
            .map(|e| format!("{e:#}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}
