//! The values of the command-tool flags: `--tool NAME=COMMAND`, `--tool-doc NAME=TEXT` and
//! `--tool-schema NAME=JSON` (`crate::settings` makes the tools of them and of `--tools-file`). The
//! model reads each tool's description and parameters; the command line stays on the host.

/// `NAME=VALUE` split at the first `=`, both parts non-empty.
pub(crate) fn name_and_value(s: &str, shape: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.trim().is_empty() => {
            Ok((name.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{s:?} is not {shape}")),
    }
}

/// `--tool NAME=COMMAND`.
pub(crate) fn parse_tool(s: &str) -> Result<(String, String), String> {
    name_and_value(s, "NAME=COMMAND")
}
