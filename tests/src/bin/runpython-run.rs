//! A library host for the boundary tests: runs the code given as its first argument with every
//! sandbox layer on and prints the envelope as JSON. Its other arguments, its environment and the
//! descriptors it inherits are what the code must not see.
//!
//! Usage: `runpython-run CODE [ARG...]`

use std::time::Duration;

use runpython_core::RunPython;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let code = std::env::args()
        .nth(1)
        .ok_or("usage: runpython-run CODE [ARG...]")?;
    let python = RunPython::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let envelope = python.run(code).await?;
    println!("{}", serde_json::to_string(&envelope)?);
    Ok(())
}
