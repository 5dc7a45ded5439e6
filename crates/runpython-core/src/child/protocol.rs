//! The host→child protocol: every message the host writes to a run's runner (its request, one line on
//! stdin) and to a session's interpreter (cells and interrupts, framed on its control socket), as
//! typed values. The child reads each one with `runpython_protocol.checked` against the same keys
//! (`child/python/runpython_protocol.py`): a key missing or unknown is an error in the child, never a
//! default. The bridge's part of a request is the bridge's own type ([`runpython_bridge::ClientSpec`]),
//! a fork's the sandbox's ([`runpython_sandbox::ForkCommand`], read by the template's Python, which is
//! the sandbox's too).
//!
//! The test at the bottom feeds Rust-built messages to the Python side and fails on any key one side
//! has and the other lacks.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

/// What the runner is given for one piece of code: a one-shot run's request, or a session cell's
/// ([`ControlMessage::Cell`]).
#[derive(Debug, Serialize)]
pub(crate) struct RunnerRequest<'a> {
    /// Where runpython's own Python modules are (their frames are hidden from tracebacks).
    pub code_dir: &'a Path,
    pub code: &'a str,
    /// Globals bound before the code runs; runpython's tagged JSON when `typed`.
    pub inputs: &'a Map<String, Value>,
    /// Inputs are tagged JSON, and the value's exact form is wanted back (`return_typed`).
    pub typed: bool,
    /// Environment variables set for the code (the request's own, then the secrets' placeholders).
    pub env: BTreeMap<String, String>,
    /// The trust bundle to write (the host's roots and the run's own CA), with secrets only.
    pub trust_bundle: Option<runpython_egress::TrustBundle>,
    /// Artifacts bound as globals: base64 inline, or `{"id", "bytes"}` to read through the bridge.
    pub input_artifacts: Map<String, Value>,
    /// Files written read-only into the working directory, in the same two forms.
    pub files: Map<String, Value>,
    /// Whether `read_artifact`, `load_artifact` and `save_artifact` are defined (a store is kept).
    pub artifact_helpers: bool,
    /// Whether the run's network is mediated: a connect refused with `EACCES` then asks the run's
    /// resolver why (runpython-egress's `why.rs`), to name the rule in the `PermissionError`.
    pub network_reasons: bool,
    pub max_return_bytes: usize,
    pub inline_return_bytes: usize,
    /// Bytes of PNG and JPEG displays that may come inline.
    pub image_budget: usize,
    /// Site directories to add (the run's environment; a session adds each once).
    pub site_dirs: Vec<&'a Path>,
    /// Where `save_artifact` writes, as the code sees it.
    pub saved_dir: &'a Path,
    /// Whether the value's `repr` comes back too (what a REPL prints).
    pub repr: bool,
    /// The tool bridge, when the run has tools.
    pub bridge: Option<runpython_bridge::ClientSpec>,
}

/// A message on a session interpreter's control socket. Each is one frame; a cell's frame carries
/// its stdout, stderr, result pipe and bridge connection as descriptors.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "made only to be serialized at once, never stored"
)]
pub(crate) enum ControlMessage<'a> {
    /// Run a cell.
    Cell(RunnerRequest<'a>),
    /// Interrupt the running cell (a `KeyboardInterrupt` in its code), or the snapshot being taken.
    Interrupt,
    /// Pickle the namespace into the frame's first descriptor (a pipe), at most `max_bytes`, and say
    /// how it went on its second (`runpython_snapshot.dump`).
    Snapshot {
        /// The snapshot's bound: past it the child stops and answers `too_large`.
        max_bytes: u64,
    },
    /// Load a snapshot from the frame's first descriptor (a pipe) into the namespace, and say how it
    /// went on its second (`runpython_snapshot.load`). Sent to a new interpreter only.
    Restore {
        /// The session's environment, added before the snapshot's modules are imported.
        site_dirs: Vec<&'a Path>,
    },
}

/// A command on a template's control socket. Each is one message; a fork's carries the descriptors
/// `fds` names, in order.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum TemplateCommand<'a> {
    /// Fork a run ahead of its request: it takes `command`'s sandbox and waits for its descriptors.
    Fork {
        /// What each attached descriptor is (`status`, `landlock`, `cgroup`).
        fds: Vec<&'a str>,
        #[serde(flatten)]
        command: &'a runpython_sandbox::ForkCommand,
    },
    /// The template's resident memory, threads and forks so far.
    Stat,
}

/// A message as the one line of JSON the child reads (a runner's request ends at its newline).
pub(crate) fn to_line<T: Serialize>(message: &T) -> Result<Vec<u8>, crate::Error> {
    let mut line =
        serde_json::to_vec(message).map_err(|e| crate::Error::Internal(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn python() -> std::path::PathBuf {
        runpython_deps::Interpreter::discover(None)
            .expect("a Python interpreter")
            .executable
    }

    fn full_request<'a>(inputs: &'a Map<String, Value>, dir: &'a Path) -> RunnerRequest<'a> {
        RunnerRequest {
            code_dir: dir,
            code: "1 + 1",
            inputs,
            typed: true,
            env: BTreeMap::from([("A".into(), "b".into())]),
            trust_bundle: Some(runpython_egress::TrustBundle {
                path: "/tmp/t.pem",
                pem: "pem".into(),
            }),
            input_artifacts: Map::new(),
            files: Map::new(),
            artifact_helpers: true,
            network_reasons: true,
            max_return_bytes: 1,
            inline_return_bytes: 1,
            image_budget: 1,
            site_dirs: vec![dir],
            saved_dir: dir,
            repr: false,
            bridge: None,
        }
    }

    /// Runs `runpython_protocol.checked` on `message` as the child would; its error, if any.
    fn checked_in_python(kind: &str, message: &Value) -> Result<(), String> {
        let dir = crate::child::code_dir().expect("the code directory");
        let script = format!(
            "import sys; sys.path.insert(0, sys.argv[1]); import runpython_protocol as p, runpython_tools as t\n\
             m = __import__('json').loads(sys.argv[2])\n\
             try:\n    p.{kind}(m)\n    m.get('bridge') and t._check_spec(m['bridge'])\n\
             except (p.ProtocolError, t.BridgeError) as e:\n    print(e); sys.exit(3)\n"
        );
        python_says(&script, dir, message)
    }

    /// Runs `script` with the code directory and `message` as its arguments: `Ok` when it exits 0,
    /// the line it printed when it exits 3 (a refusal).
    fn python_says(script: &str, dir: &std::path::Path, message: &Value) -> Result<(), String> {
        let out = Command::new(python())
            .args(["-I", "-S", "-c", script])
            .arg(dir)
            .arg(message.to_string())
            .output()
            .expect("python runs");
        match out.status.code() {
            Some(0) => Ok(()),
            Some(3) => Err(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
            _ => panic!(
                "python failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }

    #[test]
    fn the_child_reads_what_the_host_sends_and_refuses_a_key_missing_or_unknown() {
        let inputs = Map::new();
        let dir = Path::new("/tmp");
        let request = serde_json::to_value(full_request(&inputs, dir)).unwrap();
        assert_eq!(checked_in_python("run_request", &request), Ok(()));

        let mut unknown = request.clone();
        unknown["site_dir"] = Value::Null;
        let err = checked_in_python("run_request", &unknown).unwrap_err();
        assert!(err.contains("unknown key 'site_dir'"), "{err}");

        let mut missing = request.clone();
        missing.as_object_mut().unwrap().remove("typed");
        let err = checked_in_python("run_request", &missing).unwrap_err();
        assert!(err.contains("missing key 'typed'"), "{err}");

        let cell = serde_json::to_value(ControlMessage::Cell(full_request(&inputs, dir))).unwrap();
        assert_eq!(checked_in_python("control_message", &cell), Ok(()));
        let interrupt = serde_json::to_value(ControlMessage::Interrupt).unwrap();
        assert_eq!(checked_in_python("control_message", &interrupt), Ok(()));
        let snapshot = serde_json::to_value(ControlMessage::Snapshot { max_bytes: 1 }).unwrap();
        assert_eq!(checked_in_python("control_message", &snapshot), Ok(()));
        let restore = serde_json::to_value(ControlMessage::Restore {
            site_dirs: vec![dir],
        })
        .unwrap();
        assert_eq!(checked_in_python("control_message", &restore), Ok(()));
        let mut unknown = restore.clone();
        unknown["max_bytes"] = Value::from(1);
        let err = checked_in_python("control_message", &unknown).unwrap_err();
        assert!(err.contains("unknown key 'max_bytes'"), "{err}");
        let err =
            checked_in_python("control_message", &serde_json::json!({"type": "cel"})).unwrap_err();
        assert!(err.contains("'cel'"), "{err}");
    }

    #[test]
    fn the_bridge_client_reads_the_bridge_spec_the_host_sends() {
        let tool = runpython_bridge::tool_fn(
            "search",
            "Search.",
            Some(
                serde_json::json!({"type": "object", "properties": {"q": {"type": "string", "default": "x"}}}),
            ),
            |_| async { Ok(Value::Null) },
        );
        let mut tools = runpython_bridge::ToolSet::new();
        tools.insert(tool).unwrap();
        let (host, _child) = runpython_bridge::socket_pair().unwrap();
        let bridge =
            runpython_bridge::Bridge::new(host, tools, runpython_bridge::BridgeConfig::default())
                .unwrap();
        let inputs = Map::new();
        let mut request = full_request(&inputs, Path::new("/tmp"));
        request.bridge = Some(bridge.client_spec_fd(4));
        let mut request = serde_json::to_value(request).unwrap();
        assert_eq!(checked_in_python("run_request", &request), Ok(()));
        request["bridge"]["tools"][0]["params"][0]
            .as_object_mut()
            .unwrap()
            .remove("default");
        let err = checked_in_python("run_request", &request).unwrap_err();
        assert!(err.contains("missing key 'default'"), "{err}");
    }

    /// Runs the template's `checked_command` on `command` as a template would; its error, if any.
    fn template_checks(command: &Value) -> Result<(), String> {
        let dir = crate::child::code_dir().expect("the code directory");
        let script =
            "import sys; sys.path.insert(0, sys.argv[1]); import json, runpython_template as t\n\
             try:\n    t.checked_command(json.loads(sys.argv[2]))\n\
             except ValueError as e:\n    print(e); sys.exit(3)\n";
        python_says(script, dir, command)
    }

    #[test]
    fn the_template_reads_the_fork_command_the_host_sends() {
        let config =
            runpython_egress::Sandbox::default().map_network(runpython_egress::Network::mechanism);
        let plan = match runpython_sandbox::prepare_fork(
            &config,
            &python(),
            &[],
            std::time::Duration::from_secs(5),
        ) {
            Ok(plan) => plan,
            Err(e) => {
                eprintln!("skipped: runs cannot be forked here: {e}");
                return;
            }
        };
        let fork = serde_json::to_value(TemplateCommand::Fork {
            fds: vec!["status"],
            command: &plan.command,
        })
        .unwrap();
        assert_eq!(template_checks(&fork), Ok(()));
        let stat = serde_json::to_value(TemplateCommand::Stat).unwrap();
        assert_eq!(template_checks(&stat), Ok(()));
        let mut missing = fork.clone();
        missing["scratch"].as_object_mut().unwrap().remove("rebind");
        let err = template_checks(&missing).unwrap_err();
        assert!(err.contains("missing key 'rebind'"), "{err}");
        let mut unknown = fork;
        unknown["netns"] = Value::Bool(true);
        let err = template_checks(&unknown).unwrap_err();
        assert!(err.contains("unknown key 'netns'"), "{err}");
    }

    #[test]
    fn a_request_is_one_line() {
        let inputs = Map::from_iter([("s".into(), Value::from("a\nb"))]);
        let line = to_line(&full_request(&inputs, Path::new("/tmp"))).unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
    }
}
