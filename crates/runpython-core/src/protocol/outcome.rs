//! How a child ended, and the runner's result record, turned into the envelope's status, value and
//! error. Pure: no process, no I/O; unit-tested over every ending.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use runpython_bridge::Stop;
use serde_json::Value;

use crate::error::Error;
use crate::protocol::envelope::{Envelope, ErrorInfo, Status};

/// Why a run's child stopped being waited for.
#[derive(Debug)]
pub(crate) enum Ending {
    /// The interpreter exited.
    Exited(std::process::ExitStatus),
    /// The runner wrote its result and closed its streams; the interpreter is still exiting.
    Answered,
    TimedOut,
    Cancelled,
    /// The bridge stopped the run (a suspension, a replay divergence, a protocol violation).
    Bridge(Stop),
}

/// What the runner wrote on its result pipe (at most the cap; `overflow` when it wrote more).
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub bytes: Vec<u8>,
    pub overflow: bool,
}

/// Fills the envelope's status, value and error from how the run ended. `timeout` is the run's
/// wall-clock limit (for the message); a cancelled run is `Err(Cancelled)`.
pub(crate) fn apply_ending(
    envelope: &mut Envelope,
    ending: Ending,
    answer: &Answer,
    max_return_bytes: usize,
    timeout: Duration,
) -> Result<(), Error> {
    match ending {
        Ending::Cancelled => return Err(Error::Cancelled),
        Ending::TimedOut => {
            envelope.status = Status::Timeout;
            envelope.error = Some(ErrorInfo::new(
                "Timeout",
                format!(
                    "the code ran longer than the {} timeout and was stopped; make it faster or raise the timeout",
                    human_duration(timeout)
                ),
            ));
        }
        Ending::Bridge(Stop::Suspended(suspension)) => {
            envelope.status = Status::Suspended;
            envelope.suspension = Some(serde_json::json!({
                "id": suspension.id,
                "tool": suspension.tool,
                "args": suspension.args,
                "run_id": envelope.run_id,
            }));
        }
        Ending::Bridge(Stop::Diverged {
            step,
            recorded,
            called,
        }) => {
            envelope.status = Status::Error;
            envelope.error = Some(ErrorInfo::new(
                "ReplayDiverged",
                format!(
                    "at step {step} the resumed code called {called}, but the journal recorded \
                     {recorded}; a resumed script must make the same tool calls in the same order up \
                     to its suspension (wrap values that change between runs in once(...))"
                ),
            ));
        }
        Ending::Bridge(stop) => {
            let why = match stop {
                Stop::Failed(e) => e.to_string(),
                other => format!("{other:?}"),
            };
            envelope.status = Status::Error;
            envelope.error = Some(ErrorInfo::new(
                "SandboxError",
                format!("the code broke the tool bridge's protocol and the run was stopped: {why}"),
            ));
        }
        Ending::Answered => apply_result(
            envelope,
            std::process::ExitStatus::from_raw(0),
            answer,
            max_return_bytes,
        ),
        Ending::Exited(status) => apply_result(envelope, status, answer, max_return_bytes),
    }
    Ok(())
}

/// The run went over its tool-call budget: whatever it returned, it is a `ToolCallLimit` error.
pub(crate) fn apply_tool_limit(envelope: &mut Envelope, max_calls: u32, tree: Option<u32>) {
    envelope.status = Status::Error;
    envelope.return_value = Value::Null;
    envelope.return_typed = None;
    envelope.return_type = None;
    let message = match tree {
        Some(max) => format!(
            "this run and the runs nested with it made more than {max} tool calls, their shared \
             budget; batch the work into fewer calls"
        ),
        None => format!(
            "the code made more than {max_calls} tool calls, the run's budget; batch the work into fewer calls"
        ),
    };
    envelope.error = Some(ErrorInfo::new("ToolCallLimit", message));
}

/// The kernel killed a process of the run for going over the run's memory limit: when that ended the
/// run, the error says so instead of a bare SIGKILL.
pub(crate) fn apply_memory_limit(envelope: &mut Envelope, limit_bytes: u64) {
    let Some(error) = &mut envelope.error else {
        return;
    };
    if error.kind == "ProcessExited" && error.signal == Some(libc::SIGKILL) {
        error.message = format!(
            "the run went over its memory limit of {} MiB (everything its processes held, shared \
             memory and files in /tmp included) and the kernel killed it; use less memory or raise \
             the limit",
            limit_bytes >> 20
        );
    }
}

/// Fills the envelope from the runner's result record, or explains why there is none.
fn apply_result(
    envelope: &mut Envelope,
    status: std::process::ExitStatus,
    answer: &Answer,
    max_return_bytes: usize,
) {
    let (bytes, overflow) = (answer.bytes.as_slice(), answer.overflow);
    if overflow {
        envelope.status = Status::Error;
        envelope.error = Some(ErrorInfo::new(
            "ReturnValueTooLarge",
            format!(
                "the result was larger than the limit of {} bytes of JSON; return a smaller value",
                max_return_bytes
            ),
        ));
        return;
    }
    if bytes.is_empty() {
        let mut error = ErrorInfo::new("ProcessExited", String::new());
        error.message = match (status.code(), status.signal()) {
            (Some(code), _) => {
                error.exit_code = Some(code);
                format!("the Python process exited with status {code} before the code finished")
            }
            (None, Some(signal)) => {
                error.signal = Some(signal);
                let name = nix::sys::signal::Signal::try_from(signal)
                    .map(|s| s.as_str())
                    .unwrap_or("unknown signal");
                format!("the Python process was killed by signal {signal} ({name}) before the code finished")
            }
            (None, None) => "the Python process ended without a result".into(),
        };
        envelope.status = Status::Error;
        envelope.error = Some(error);
        return;
    }
    #[derive(serde::Deserialize)]
    struct RunnerResult {
        status: String,
        #[serde(default)]
        return_value: Value,
        #[serde(default)]
        return_type: Option<String>,
        #[serde(default)]
        error: Option<ErrorInfo>,
        #[serde(default)]
        return_preview: Option<Value>,
        #[serde(default)]
        return_repr: Option<String>,
        #[serde(default)]
        return_typed: Option<Value>,
        #[serde(default)]
        displays: Vec<Value>,
    }
    let parsed = serde_json::from_slice::<RunnerResult>(bytes).map(|mut result| {
        // Integers stay as written (any size); floats as the host writes them.
        runpython_bridge::canonical_floats(&mut result.return_value);
        if let Some(preview) = &mut result.return_preview {
            runpython_bridge::canonical_floats(preview);
        }
        if let Some(typed) = &mut result.return_typed {
            runpython_bridge::canonical_floats(typed);
        }
        result
    });
    if let Ok(result) = &parsed {
        envelope.displays = result.displays.clone();
        envelope.images = take_images(&mut envelope.displays);
    }
    match parsed {
        Ok(result) if result.status == "success" => {
            envelope.return_value = result.return_value;
            envelope.return_type = result.return_type;
            envelope.return_preview = result.return_preview;
            envelope.return_repr = result.return_repr;
            envelope.return_typed = result.return_typed;
        }
        Ok(result) => {
            envelope.return_preview = result.return_preview;
            envelope.status = Status::Error;
            envelope.error = Some(result.error.unwrap_or_else(|| {
                ErrorInfo::new(
                    "SandboxError",
                    "the runner reported an error without details",
                )
            }));
        }
        Err(e) => {
            envelope.status = Status::Error;
            envelope.error = Some(ErrorInfo::new(
                "SandboxError",
                format!("the runner's result could not be read ({e}); did the code write to file descriptor 3?"),
            ));
        }
    }
}

pub(crate) fn human_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0} s")
    } else {
        format!("{secs} s")
    }
}

/// The inline image data of the runner's displays, taken out of them (the JSON envelope carries
/// the file and the artifact; the data is for clients that show images).
fn take_images(displays: &mut [Value]) -> Vec<crate::protocol::envelope::DisplayImage> {
    let mut images = Vec::new();
    for (index, display) in displays.iter_mut().enumerate() {
        let Some(formats) = display.get_mut("formats").and_then(Value::as_object_mut) else {
            continue;
        };
        for (mime, format) in formats.iter_mut() {
            let data = format.as_object_mut().and_then(|f| f.remove("data"));
            if let Some(Value::String(data)) = data {
                images.push(crate::protocol::envelope::DisplayImage {
                    display: index,
                    mime: mime.clone(),
                    data,
                });
            }
        }
    }
    images
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(ending: Ending, result: &str) -> Envelope {
        let mut e = Envelope::empty("r".into());
        let answer = Answer {
            bytes: result.as_bytes().to_vec(),
            overflow: false,
        };
        apply_ending(&mut e, ending, &answer, 100, Duration::from_millis(1500)).unwrap();
        e
    }

    fn exited(code: i32) -> Ending {
        Ending::Exited(std::process::ExitStatus::from_raw(code << 8))
    }

    #[test]
    fn a_success_record_fills_value_type_and_preview() {
        let e = ended(
            Ending::Answered,
            r#"{"status":"success","return_type":"int","return_preview":null,"return_value":2}"#,
        );
        assert_eq!(e.status, Status::Success);
        assert_eq!(
            (e.return_value, e.return_type.as_deref()),
            (serde_json::json!(2), Some("int"))
        );
    }

    #[test]
    fn an_error_record_keeps_the_codes_exception() {
        let e = ended(
            exited(0),
            r#"{"status":"error","error":{"type":"ZeroDivisionError","message":"division by zero","traceback":"tb"}}"#,
        );
        assert_eq!(e.status, Status::Error);
        let error = e.error.unwrap();
        assert_eq!(
            (error.kind.as_str(), error.traceback.as_deref()),
            ("ZeroDivisionError", Some("tb"))
        );
    }

    #[test]
    fn no_record_is_a_process_exit_with_its_code_or_signal() {
        let e = ended(exited(3), "");
        let error = e.error.unwrap();
        assert_eq!(
            (error.kind.as_str(), error.exit_code),
            ("ProcessExited", Some(3))
        );
        let e = ended(Ending::Exited(std::process::ExitStatus::from_raw(9)), "");
        let error = e.error.unwrap();
        assert_eq!(error.signal, Some(9));
        assert!(error.message.contains("SIGKILL"), "{}", error.message);
    }

    #[test]
    fn an_unreadable_record_or_an_overflow_are_named() {
        let e = ended(exited(0), "{garbage");
        assert_eq!(e.error.unwrap().kind, "SandboxError");
        let mut e = Envelope::empty("r".into());
        let answer = Answer {
            bytes: Vec::new(),
            overflow: true,
        };
        apply_ending(&mut e, exited(0), &answer, 100, Duration::from_secs(1)).unwrap();
        let error = e.error.unwrap();
        assert_eq!(error.kind, "ReturnValueTooLarge");
        assert!(error.message.contains("100 bytes"), "{}", error.message);
    }

    #[test]
    fn a_timeout_names_the_limit_and_a_cancellation_is_an_error() {
        let e = ended(Ending::TimedOut, "");
        assert_eq!(e.status, Status::Timeout);
        assert!(e.error.unwrap().message.contains("1.5 s timeout"));
        let mut e = Envelope::empty("r".into());
        assert!(matches!(
            apply_ending(
                &mut e,
                Ending::Cancelled,
                &Answer::default(),
                1,
                Duration::from_secs(1)
            ),
            Err(Error::Cancelled)
        ));
    }

    #[test]
    fn bridge_stops_become_suspension_divergence_or_sandbox_error() {
        let e = ended(
            Ending::Bridge(Stop::Suspended(runpython_bridge::Suspension {
                id: "s1".into(),
                tool: "ask".into(),
                args: serde_json::json!({"q": 1}),
            })),
            "",
        );
        assert_eq!(e.status, Status::Suspended);
        assert_eq!(e.suspension.unwrap()["id"], "s1");
        let e = ended(
            Ending::Bridge(Stop::Diverged {
                step: 2,
                recorded: "a()".into(),
                called: "b()".into(),
            }),
            "",
        );
        assert_eq!(e.error.unwrap().kind, "ReplayDiverged");
    }

    #[test]
    fn going_over_the_tool_budget_replaces_the_value() {
        let mut e = ended(
            Ending::Answered,
            r#"{"status":"success","return_type":"int","return_value":2}"#,
        );
        apply_tool_limit(&mut e, 5, None);
        assert_eq!((e.status, e.return_value), (Status::Error, Value::Null));
        assert_eq!(e.error.unwrap().kind, "ToolCallLimit");
    }
}
