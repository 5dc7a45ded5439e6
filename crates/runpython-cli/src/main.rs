//! `runpython`: the thin command line over runpython-core and runpython-mcp. The only crate that
//! prints. `args` is what clap reads, `settings` turns it into an engine or a server's
//! configuration, `commands` holds one file per command, `human` prints what a person reads.
//!
//! Exit status: 0 when the envelope's status is `success`, 1 for any other status, 2 for usage or
//! infrastructure errors (a one-line reason on stderr).

/// `println!` that never panics: a reader that went away (`runpython ... | head`) is not a crash.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics on a closed stderr.
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics on a closed stderr.
macro_rules! say_err_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod args;
mod commands;
mod hosting;
mod human;
mod settings;

use std::process::ExitCode;

use args::{Cli, Command};
use clap::Parser;
use runpython_core::error_report;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging(
        cli.verbose,
        matches!(cli.command, Command::Serve(_) | Command::Host(_)),
    );
    if let Command::Run(args) = &cli.command {
        // A warm host for these flags runs the code; this process only prints.
        if let Some(outcome) = commands::hosted(args) {
            return exit_status(outcome);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say_err!("runpython: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let mut stopped_by = None;
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => until_signal(commands::run(args), true, &mut stopped_by).await,
            Command::Host(args) => commands::host(args).await,
            Command::Resume(args) => {
                until_signal(commands::resume(args), true, &mut stopped_by).await
            }
            Command::ToolSpec(args) => commands::tool_spec(args).await,
            Command::Mcp(args) => until_signal(commands::mcp(args), true, &mut stopped_by).await,
            // Ctrl-C is the repl's own: it stops a cell, or clears the line.
            Command::Repl(args) => until_signal(commands::repl(args), false, &mut stopped_by).await,
            Command::Serve(args) => commands::serve(args).await,
            Command::Artifacts { command } => commands::artifacts(command).await,
            Command::Gc(store) => commands::gc(store).await,
            Command::Doctor(args) => commands::doctor(args).await,
            Command::Runs { json, store } => commands::runs(json, store).await,
        }
    });
    // The runs' cgroups and directories are removed by threads of this process: they finish before
    // the exit, so a one-shot command leaves none behind. Bounded: a cgroup that will not empty is
    // the next host's sweep's, not a hang. Stopped by a signal, the runtime is not waited for past
    // half a second: a blocking read of stdin (`mcp`'s) may never return, and every task that held
    // a run has been dropped by then.
    match stopped_by {
        Some(_) => runtime.shutdown_timeout(std::time::Duration::from_millis(500)),
        None => drop(runtime),
    }
    runpython_core::settle_cleanup(std::time::Duration::from_secs(2));
    if let Some(signal) = stopped_by {
        return end_by(signal);
    }
    exit_status(outcome)
}

/// `work` (a command that runs code here: `run`, `resume`, `mcp`, `repl`), until it ends or this
/// process gets SIGTERM, SIGHUP or, with `interrupt`, SIGINT. A signal drops `work`, which stops its
/// runs: their processes are killed and their cgroups and run directories handed to their removal,
/// which `main` waits for before it ends the process by the same signal (`stopped_by`), as a
/// process killed by it would end. Without this, the signal's default action ended the process at once and left the runs'
/// directories and cgroups behind. A signal ignored when the process started (`nohup`, a shell's
/// background job) stays ignored.
async fn until_signal(
    work: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
    interrupt: bool,
    stopped_by: &mut Option<nix::sys::signal::Signal>,
) -> anyhow::Result<ExitCode> {
    use nix::sys::signal::Signal;
    use tokio::signal::unix::{signal, SignalKind};
    let watch = |which: Signal, kind: SignalKind| {
        if ignored(which) || (which == Signal::SIGINT && !interrupt) {
            return None;
        }
        signal(kind).ok()
    };
    let mut watched = [
        (Signal::SIGINT, SignalKind::interrupt()),
        (Signal::SIGTERM, SignalKind::terminate()),
        (Signal::SIGHUP, SignalKind::hangup()),
    ]
    .map(|(which, kind)| (which, watch(which, kind)));
    let received = async {
        let [(int, a), (term, b), (hup, c)] = &mut watched;
        tokio::select! {
            () = next(a) => *int,
            () = next(b) => *term,
            () = next(c) => *hup,
        }
    };
    tokio::select! {
        outcome = work => outcome,
        signal = received => {
            say_err!("runpython: stopped by {signal}");
            *stopped_by = Some(signal);
            Ok(ExitCode::from(128 + signal as u8))
        }
    }
}

/// The next arrival of a watched signal; never, for one not watched.
async fn next(watched: &mut Option<tokio::signal::unix::Signal>) {
    match watched {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Whether `signal` is ignored (`SIG_IGN`), as this process was started.
fn ignored(signal: nix::sys::signal::Signal) -> bool {
    let mut current = std::mem::MaybeUninit::<nix::libc::sigaction>::zeroed();
    // SAFETY: a query (a null new action) that writes the current one into `current`.
    let queried =
        unsafe { nix::libc::sigaction(signal as i32, std::ptr::null(), current.as_mut_ptr()) };
    // SAFETY: zeroed, then filled by a successful query.
    queried == 0 && unsafe { current.assume_init() }.sa_sigaction == nix::libc::SIG_IGN
}

/// Ends the process by `signal` with its default action, as it would have ended without a handler
/// (a shell then sees a process killed by SIGINT, and stops its loop); `128 + signal` where the
/// signal does not end it.
fn end_by(signal: nix::sys::signal::Signal) -> ExitCode {
    use nix::sys::signal::{raise, sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restores the default action; no handler of ours runs after this.
    let _ = unsafe { sigaction(signal, &default) };
    let _ = raise(signal);
    ExitCode::from(128 + signal as u8)
}

fn exit_status(outcome: anyhow::Result<ExitCode>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            // Each cause once: store errors carry theirs in their own text already.
            say_err!("runpython: {}", error_report(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

/// Logs go to stderr through `tracing`: `RUST_LOG` when set, else warnings (`serve`: one line per
/// call too), `-v` info, `-vv` debug.
fn init_logging(verbose: u8, serving: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (verbose, serving) {
        // rmcp logs every error reply as a warning: a client's mistake, not the server's.
        (0, false) => "warn,rmcp=error",
        (0, true) | (1, _) => "warn,rmcp=error,runpython=info",
        _ => "info,runpython=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
