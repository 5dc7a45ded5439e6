//! `runpython doctor`: what this host gives runs, as text or JSON.

use std::process::ExitCode;

use crate::args::DoctorArgs;
use crate::hosting;
use crate::human;
use crate::settings;

/// With the engine's report, whether a `runpython host` serves runs with these flags from here (its
/// socket's path, and whether something of this user's listens on it): the question a person asks
/// when a run was not handed to the host they started.
pub(crate) async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = settings::engine(&args.engine).await?.doctor().await;
    let socket = hosting::socket_path(&args.engine);
    let serving = matches!(socket.as_deref().and_then(hosting::connect), Some(Ok(_)));
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(fields) = value.as_object_mut() {
            fields.insert(
                "host".into(),
                serde_json::json!({"socket": socket, "serving": serving}),
            );
        }
        say!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        human::print_doctor(&report);
        let host = match (&socket, serving) {
            (Some(path), true) => format!("serving runs with these flags at {}", path.display()),
            (Some(_), false) => "none for these flags, this directory and this environment (start \
                                 one with `runpython host` and the same flags, from here)"
                .to_owned(),
            (None, _) => "none: no private runtime directory for its socket".to_owned(),
        };
        say!("  warm host       {host}");
    }
    Ok(ExitCode::SUCCESS)
}
