//! Fitting an envelope into its byte budget: every byte is paid for in a model's context window.
//!
//! The budget is met by shrinking what has a fuller copy elsewhere (output heads and tails, previews,
//! the artifact list, the traceback's middle), step by step, never by dropping the status or the
//! error's type.

use serde_json::{json, Map, Value};

use crate::envelope::{Envelope, ListTruncation};
use crate::output::Captured;

/// Fewest characters an output stream is shrunk to.
const MIN_OUTPUT_CHARS: usize = 64;

fn size(envelope: &Envelope) -> usize {
    serde_json::to_vec(envelope).map_or(usize::MAX, |v| v.len())
}

/// Shrinks `envelope` until its JSON is at most `budget` bytes, or nothing more can go.
pub(crate) fn fit(
    envelope: &mut Envelope,
    budget: usize,
    stdout: &Captured,
    stderr: &Captured,
    max_output_chars: usize,
) {
    if size(envelope) <= budget {
        return;
    }
    // 1. A long artifact list keeps its first entries; the rest are counted.
    cap_artifacts(envelope, 20, 120);
    // 2. Output: halve the kept head and tail until it fits (the full text is an artifact when kept).
    let mut chars = max_output_chars;
    while size(envelope) > budget && chars > MIN_OUTPUT_CHARS {
        chars = (chars / 2).max(MIN_OUTPUT_CHARS);
        render_output(envelope, stdout, stderr, chars);
    }
    // 3. Previews get smaller, then go.
    for (items, text) in [(5, 80), (3, 40)] {
        if size(envelope) <= budget {
            return;
        }
        if let Some(p) = &envelope.return_preview {
            envelope.return_preview = Some(shrink(p, items, text, 0));
        }
    }
    // 4. An inline return value that does not fit becomes a preview of itself.
    if size(envelope) > budget && !envelope.return_value.is_null() {
        envelope.return_preview = Some(shrink(&json_preview(&envelope.return_value), 3, 40, 0));
        envelope.return_value = Value::Null;
    }
    // 5. The error keeps its type, the end of its traceback and the head of its message.
    for (lines, chars) in [(30, 2000), (8, 300)] {
        if size(envelope) <= budget {
            return;
        }
        if let Some(error) = &mut envelope.error {
            error.message = clip(&error.message, chars);
            if let Some(tb) = &error.traceback {
                error.traceback = Some(last_lines(tb, lines, chars));
            }
        }
    }
    // 6. Last resorts: fewer artifacts, no previews on them.
    if size(envelope) > budget {
        cap_artifacts(envelope, 5, 0);
    }
    if size(envelope) > budget {
        if let Some(p) = &envelope.return_preview {
            let kind = p.get("type").cloned().unwrap_or(Value::Null);
            envelope.return_preview =
                Some(json!({"type": kind, "note": "preview dropped to fit the envelope budget"}));
        }
    }
}

fn render_output(envelope: &mut Envelope, stdout: &Captured, stderr: &Captured, chars: usize) {
    let (out, out_t) = stdout.render(chars);
    let (err, err_t) = stderr.render(chars);
    envelope.stdout = out;
    envelope.stderr = err;
    let truncated = envelope.truncated.get_or_insert_with(Default::default);
    truncated.stdout = out_t;
    truncated.stderr = err_t;
    if truncated.is_empty() {
        envelope.truncated = None;
    }
}

fn cap_artifacts(envelope: &mut Envelope, keep: usize, preview_chars: usize) {
    for artifact in &mut envelope.artifacts {
        artifact.preview = clip(&artifact.preview, preview_chars);
    }
    let total = envelope.artifacts.len();
    if total > keep {
        envelope.artifacts.truncate(keep);
        let listed = envelope.truncated.get_or_insert_with(Default::default);
        let before = listed.artifacts.map_or(total, |a| a.total);
        listed.artifacts = Some(ListTruncation {
            total: before,
            omitted: before - keep,
        });
    }
}

fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text.to_owned(),
        Some(_) if chars == 0 => String::new(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// The first line and the last `n - 1` lines (where a traceback's news is), each clipped to `chars`.
fn last_lines(text: &str, n: usize, chars: usize) -> String {
    let lines: Vec<String> = text.lines().map(|l| clip(l, chars)).collect();
    if lines.len() <= n {
        return lines.join("\n") + "\n";
    }
    let rest = &lines[lines.len() - (n - 1)..];
    format!(
        "{}\n  …[{} lines omitted]…\n{}\n",
        lines[0],
        lines.len() - n,
        rest.join("\n")
    )
}

/// A smaller copy of a preview: at most `items` entries per list or object, text clipped.
fn shrink(value: &Value, items: usize, text: usize, depth: usize) -> Value {
    match value {
        Value::String(s) => Value::String(clip(s, text)),
        Value::Array(list) => Value::Array(
            list.iter()
                .take(items)
                .map(|v| shrink(v, items, text, depth + 1))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .take(if depth == 0 { usize::MAX } else { items })
                .map(|(k, v)| (clip(k, text), shrink(v, items, text, depth + 1)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

/// A preview built from a JSON value, for values that reached the host inline.
pub(crate) fn json_preview(value: &Value) -> Value {
    match value {
        Value::Array(list) => {
            json!({"type": "list", "length": list.len(), "items": list.iter().take(10).collect::<Vec<_>>()})
        }
        Value::Object(map) => {
            json!({"type": "dict", "size": map.len(), "items": map.iter().take(10).map(|(k, v)| (k.clone(), v.clone())).collect::<Map<_, _>>()})
        }
        Value::String(s) => {
            let chars: Vec<char> = s.chars().collect();
            let head: String = chars.iter().take(200).collect();
            let tail: String = chars[chars.len().saturating_sub(200)..].iter().collect();
            json!({"type": "str", "length": chars.len(), "head": head, "tail": tail})
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{ErrorInfo, Status};
    use crate::output::HeadTail;

    fn captured(text: &str) -> Captured {
        let mut c = HeadTail::new(10_000);
        c.push_str(text);
        c.into_captured()
    }

    #[test]
    fn huge_output_and_error_fit_and_keep_status_and_error_type() {
        let out = captured(&"o".repeat(50_000));
        let err = captured(&"e".repeat(50_000));
        let mut e = Envelope::failed(
            Status::Error,
            ErrorInfo::new("ValueError", "m".repeat(100_000)),
            "r".into(),
        );
        e.error.as_mut().unwrap().traceback =
            Some((0..5000).map(|i| format!("line {i}\n")).collect());
        render_output(&mut e, &out, &err, 10_000);
        fit(&mut e, 8192, &out, &err, 10_000);
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.len() <= 8192, "{} bytes", json.len());
        assert_eq!(e.status, Status::Error);
        assert_eq!(e.error.as_ref().unwrap().kind, "ValueError");
        assert!(e
            .error
            .as_ref()
            .unwrap()
            .traceback
            .as_ref()
            .unwrap()
            .contains("line 4999"));
        let t = e.truncated.unwrap().stdout.unwrap();
        assert_eq!(t.total_chars, 50_000);
    }

    #[test]
    fn an_envelope_within_budget_is_untouched() {
        let out = captured("hello\n");
        let mut e = Envelope::failed(Status::Success, ErrorInfo::new("x", "y"), "r".into());
        e.error = None;
        e.stdout = "hello\n".into();
        let before = e.clone();
        fit(&mut e, 8192, &out, &out, 10_000);
        assert_eq!(e, before);
    }
}
