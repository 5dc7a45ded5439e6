//! `runpython run`: the code from a file, `-c` or stdin, with its inputs, variables and files;
//! output streamed as it comes (or the envelope with `--json`).

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runpython_core::{Event, RunRequest};

use super::runs::resume_command;
use crate::args::run_flags::{Input, RunFile};
use crate::args::RunArgs;
use crate::human::{finish, for_terminal, StatusLine};
use crate::settings;

/// Prints the envelope; the exit status is the code's (a store that failed after the code ran is
/// named in the envelope, `kept: false`, and in human mode on stderr).
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let code = match (&args.code, &args.file) {
        (Some(code), _) => code.clone(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut code = String::new();
            std::io::stdin()
                .read_to_string(&mut code)
                .context("cannot read the code from stdin")?;
            code
        }
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        (None, None) => bail!("no code given: pass a FILE, -c CODE, or - to read stdin"),
    };
    let python = settings::engine(&args.engine).await?;
    settings::warm_up(&args.engine, &python).await?;
    let mut request = RunRequest::new(code);
    if args.no_cache {
        request = request.no_memo();
    }
    for (name, value) in args.env {
        request = request.env(name, value);
    }
    for (name, input) in args.inputs {
        request = match input {
            Input::Json(value) => request.input(name, value),
            Input::Artifact(id) => request.input_artifact(name, id),
        };
    }
    for (name, file) in args.files {
        request = match file {
            RunFile::Path(path) => {
                let bytes = read_run_file(&path)?;
                request.file(name, bytes)
            }
            RunFile::Artifact(id) => request.file_artifact(name, id),
        };
    }

    let json = args.json;
    let envelope = if json {
        python.run(request).await?
    } else {
        let mut handle = python.start(request);
        let mut status = StatusLine::new();
        while let Some(event) = handle.next_event().await {
            if !matches!(event, Event::Dependencies(_)) {
                status.clear();
            }
            match event {
                Event::Dependencies(step) => status.show(&step),
                Event::Stdout(text) => {
                    let mut out = std::io::stdout().lock();
                    let text = for_terminal(&text, std::io::stdout().is_terminal());
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                }
                Event::Stderr(text) => {
                    let text = for_terminal(&text, std::io::stderr().is_terminal());
                    let _ = std::io::stderr().lock().write_all(text.as_bytes());
                }
                Event::Resumable { run_id } => {
                    let store = python.store().map_or("", |s| s.url());
                    say_err!(
                        "runpython: durable run {run_id}; if this host stops, `runpython runs` lists it \
                         and `{}` (with this run's tool flags) continues it",
                        resume_command(&run_id, store, python.tenant_name(), false)
                    );
                }
                _ => {}
            }
        }
        handle.wait().await?
    };
    finish(&envelope, args.json)
}

/// A `--file`'s bytes, read by the host before the run (never a path the code names).
fn read_run_file(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| format!("--file {}", path.display()))?;
    if !meta.is_file() {
        bail!("--file {}: not a regular file", path.display());
    }
    if meta.len() > runpython_core::MAX_INLINE_FILE as u64 {
        bail!(
            "--file {}: {} bytes, over the {} a run takes directly; store it with `runpython \
             artifacts put {}` and pass --file @ID=NAME",
            path.display(),
            meta.len(),
            runpython_core::MAX_INLINE_FILE,
            path.display()
        );
    }
    std::fs::read(path).with_context(|| format!("--file {}", path.display()))
}
