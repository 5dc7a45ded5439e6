//! `runpython doctor`: what this host gives runs, as text or JSON.

use std::process::ExitCode;

use crate::args::DoctorArgs;
use crate::human;
use crate::settings;

pub(crate) async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = settings::engine(&args.engine).await?.doctor().await;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        human::print_doctor(&report);
    }
    Ok(ExitCode::SUCCESS)
}
