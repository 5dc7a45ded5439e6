//! A small host for the hostile tests: starts a run whose code leaves processes carrying a marker
//! (`setsid`, double-forked, signal-ignoring), prints `ready` once they are up, and waits. The test
//! then kills this host and checks that nothing carrying the marker survives.
//!
//! Usage: `runpython-host MARKER`

use std::io::Write;
use std::time::Duration;

use nix::sys::signal::{SigHandler, Signal};
use runpython_core::{Event, RunPython};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The test kills this host with SIGINT, SIGTERM or SIGKILL to see what its runs leave. A shell's
    // background job (`cmd &` without job control) starts with SIGINT and SIGQUIT ignored, and that
    // is inherited here: the SIGINT would do nothing and the test would wait on a host that never
    // ends. This host stands for one that dies of those signals, so it takes their default action.
    for signal in [Signal::SIGINT, Signal::SIGQUIT, Signal::SIGTERM] {
        // SAFETY: SIG_DFL installs no handler; nothing else in this process has set one yet.
        unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) }?;
    }
    let marker = std::env::args()
        .nth(1)
        .ok_or("usage: runpython-host MARKER")?;
    let python = RunPython::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let mut handle = python.start(runpython_tests::hostile_code(&marker));
    while let Some(event) = handle.next_event().await {
        if matches!(&event, Event::Stdout(s) if s.contains("ready")) {
            println!("ready");
            std::io::stdout().flush()?;
        }
    }
    let envelope = handle.wait().await?;
    println!("{}", serde_json::to_string(&envelope)?);
    Ok(())
}
