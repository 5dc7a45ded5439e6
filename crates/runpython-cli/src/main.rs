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
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => commands::run(args).await,
            Command::Host(args) => commands::host(args).await,
            Command::Resume(args) => commands::resume(args).await,
            Command::ToolSpec(args) => commands::tool_spec(args).await,
            Command::Mcp(args) => commands::mcp(args).await,
            Command::Repl(args) => commands::repl(args).await,
            Command::Serve(args) => commands::serve(args).await,
            Command::Artifacts { command } => commands::artifacts(command).await,
            Command::Gc(store) => commands::gc(store).await,
            Command::Doctor(args) => commands::doctor(args).await,
            Command::Runs { json, store } => commands::runs(json, store).await,
        }
    });
    // The runs' cgroups are removed by a thread of this process: it finishes before the exit, so a
    // one-shot command leaves none behind. Bounded: a cgroup that will not empty is the next
    // host's sweep's, not a hang.
    drop(runtime);
    runpython_core::settle_cgroups(std::time::Duration::from_secs(2));
    exit_status(outcome)
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
