//! A host for the fault tests: runs `CODE` as a durable run kept in `STORE_URL`, with the command
//! tool `NAME=COMMAND`, prints `run RUN_ID` as soon as the run says its id (before the code starts),
//! then the envelope as JSON when the run ends. The test kills it mid-call and resumes the run.
//!
//! Usage: `runpython-durable-host STORE_URL NAME=COMMAND CODE`

use std::io::Write;
use std::time::Duration;

use runpython_core::{CommandTool, Event, PoolConfig, RunPython, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: runpython-durable-host STORE_URL NAME=COMMAND CODE";
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(tool), Some(code)) = (args.next(), args.next(), args.next()) else {
        return Err(usage.into());
    };
    let (name, command) = tool.split_once('=').ok_or(usage)?;
    let python = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .pool(PoolConfig {
            size: 0,
            ..PoolConfig::default()
        })
        .store(Store::open(&url)?)
        .durable(true)
        .tool(CommandTool::new(name, command))
        .build()?;
    let mut handle = python.start(code);
    while let Some(event) = handle.next_event().await {
        if let Event::Resumable { run_id } = event {
            println!("run {run_id}");
            std::io::stdout().flush()?;
        }
    }
    let envelope = handle.wait().await?;
    println!("{}", serde_json::to_string(&envelope)?);
    Ok(())
}
