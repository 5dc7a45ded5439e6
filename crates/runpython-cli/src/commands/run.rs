//! `runpython run`: the code from a file, `-c` or stdin, with its inputs, variables and files;
//! output streamed as it comes (or the envelope with `--json`).

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runpython_core::{Envelope, Event, RunPython, RunRequest};

use super::runs::resume_command;
use crate::args::run_flags::{Input, RunFile};
use crate::args::RunArgs;
use crate::hosting::{self, Frame, WireFile, WireInput, WireRun};
use crate::human::{finish, for_terminal, StatusLine};
use crate::settings;

/// Prints the envelope; the exit status is the code's (a store that failed after the code ran is
/// named in the envelope, `kept: false`, and in human mode on stderr).
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let wire = wire_run(&args)?;
    let python = settings::engine(&args.engine).await?;
    settings::warm_up(&args.engine, &python).await?;
    let request = request(wire)?;
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
                Event::Stdout(text) => print_stdout(&text),
                Event::Stderr(text) => print_stderr(&text),
                Event::Resumable { run_id } => say_err!("{}", resumable_notice(&python, &run_id)),
                _ => {}
            }
        }
        handle.wait().await?
    };
    finish(&envelope, args.json)
}

/// The run handed to the warm host for these flags (`runpython host`), when one is there: its
/// output printed as it comes and its envelope as in [`run`], without starting an engine here.
/// `None`: no host serves these flags from here (or `--no-host`); the caller runs the code itself.
/// Called before any async runtime exists: the client is a blocking socket.
pub(crate) fn hosted(args: &RunArgs) -> Option<anyhow::Result<ExitCode>> {
    if args.no_host {
        return None;
    }
    Some(
        match hosting::connect(&hosting::socket_path(&args.engine)?)? {
            Ok(stream) => hosted_on(stream, args),
            Err(reason) => Err(anyhow::anyhow!("{reason}")),
        },
    )
}

fn hosted_on(stream: std::os::unix::net::UnixStream, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let wire = wire_run(args)?;
    hosting::send(&stream, &wire).context("sending the run to the runpython host")?;
    let mut status = StatusLine::new();
    loop {
        let frame =
            hosting::receive::<Frame>(&stream).context("reading the runpython host's answer")?;
        let Some(frame) = frame else {
            bail!(
                "the runpython host serving this run stopped before it finished, so its outcome is \
                 unknown; run it again (--no-host runs it in this process)"
            );
        };
        if !matches!(frame, Frame::Status(_)) {
            status.clear();
        }
        match frame {
            Frame::Status(text) => status.show_text(&text),
            Frame::Stdout(text) => print_stdout(&text),
            Frame::Stderr(text) => print_stderr(&text),
            Frame::Notice(text) => say_err!("{text}"),
            Frame::Envelope(json) => {
                let envelope: Envelope = serde_json::from_str(&json)
                    .context("the runpython host sent an envelope this runpython cannot read")?;
                return finish(&envelope, args.json);
            }
            Frame::Failed(reason) => bail!("{reason}"),
            Frame::Ready => {
                bail!("the runpython host said Ready twice: a host of another version?")
            }
        }
    }
}

fn print_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let text = for_terminal(text, std::io::stdout().is_terminal());
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

fn print_stderr(text: &str) {
    let text = for_terminal(text, std::io::stderr().is_terminal());
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// What a person is told when a run is durable.
pub(crate) fn resumable_notice(python: &RunPython, run_id: &str) -> String {
    let store = python.store().map_or("", |s| s.url());
    format!(
        "runpython: durable run {run_id}; if this host stops, `runpython runs` lists it and `{}` \
         (with this run's tool flags) continues it",
        resume_command(run_id, store, python.tenant_name(), false)
    )
}

/// The run `args` describe, with the code and the `--file`s read here (the code from a file, `-c`
/// or stdin).
fn wire_run(args: &RunArgs) -> anyhow::Result<WireRun> {
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
    let inputs = args
        .inputs
        .iter()
        .map(|(name, input)| {
            let input = match input {
                Input::Json(value) => WireInput::Json(serde_json::to_string(value)?),
                Input::Artifact(id) => WireInput::Artifact(id.clone()),
            };
            Ok((name.clone(), input))
        })
        .collect::<anyhow::Result<_>>()?;
    let files = args
        .files
        .iter()
        .map(|(name, file)| {
            let file = match file {
                RunFile::Path(path) => WireFile::Bytes(read_run_file(path)?),
                RunFile::Artifact(id) => WireFile::Artifact(id.clone()),
            };
            Ok((name.clone(), file))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(WireRun {
        code,
        no_memo: args.no_cache,
        env: args.env.clone(),
        inputs,
        files,
        stream: !args.json,
    })
}

/// The engine's request for `wire` (here, or in the host it was sent to).
pub(crate) fn request(wire: WireRun) -> anyhow::Result<RunRequest> {
    let mut request = RunRequest::new(wire.code);
    if wire.no_memo {
        request = request.no_memo();
    }
    for (name, value) in wire.env {
        request = request.env(name, value);
    }
    for (name, input) in wire.inputs {
        request = match input {
            WireInput::Json(text) => request.input(
                &name,
                serde_json::from_str::<serde_json::Value>(&text)
                    .with_context(|| format!("--input {name}: not JSON"))?,
            ),
            WireInput::Artifact(id) => request.input_artifact(name, id),
        };
    }
    for (name, file) in wire.files {
        request = match file {
            WireFile::Bytes(bytes) => request.file(name, bytes),
            WireFile::Artifact(id) => request.file_artifact(name, id),
        };
    }
    Ok(request)
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
