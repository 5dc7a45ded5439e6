//! Fitting an envelope into its byte budget: every byte is paid for in a model's context window.
//!
//! The budget is met by shrinking what has a fuller copy elsewhere (output heads and tails, previews,
//! the artifact list, the traceback's middle), step by step, never by dropping the status or the
//! error's type.

use serde_json::{json, Map, Value};

use runpython_store::{Artifact, ArtifactKind};

use crate::child::Captured;
use crate::protocol::envelope::{Envelope, ListTruncation};

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
    // 0. Kept items the envelope already carries whole are not listed (the run's manifest lists them
    //    all): the script (the caller wrote it), the output streams, an inline return value. A later
    //    step that takes such content out of the envelope lists its artifact again.
    let mut withheld = withhold_carried(envelope);
    if size(envelope) <= budget {
        return;
    }
    // 1. A long artifact list keeps its first entries; the rest are counted.
    cap_artifacts(envelope, 20, 120);
    // 2. Output: halve the kept head and tail until it fits (the kept text is an artifact when kept).
    let mut chars = max_output_chars;
    while size(envelope) > budget && chars > MIN_OUTPUT_CHARS {
        chars = (chars / 2).max(MIN_OUTPUT_CHARS);
        render_output(envelope, stdout, stderr, chars);
    }
    if chars < max_output_chars {
        let truncated = envelope.truncated.clone().unwrap_or_default();
        relist(envelope, &mut withheld, |kind| match kind {
            ArtifactKind::Stdout => truncated.stdout.is_some(),
            ArtifactKind::Stderr => truncated.stderr.is_some(),
            _ => false,
        });
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
        envelope.return_typed = None;
        relist(envelope, &mut withheld, |kind| {
            kind == ArtifactKind::ReturnValue
        });
    }
    // 5. The error keeps its type, the end of its traceback and the head and tail of its message.
    for (lines, chars) in [(30, 2000), (8, 300)] {
        if size(envelope) <= budget {
            return;
        }
        if let Some(error) = &mut envelope.error {
            error.message = head_and_tail(&error.message, chars);
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

/// Takes out of the artifact list what the envelope carries whole, and returns it (the script aside).
fn withhold_carried(envelope: &mut Envelope) -> Vec<Artifact> {
    let inline_value = !envelope.return_value.is_null();
    let (withheld, listed) = std::mem::take(&mut envelope.artifacts)
        .into_iter()
        .partition(|a| match a.kind {
            ArtifactKind::Script => true,
            // The envelope's text is what was kept (both cut to the same output limit).
            ArtifactKind::Stdout | ArtifactKind::Stderr => true,
            ArtifactKind::ReturnValue => inline_value,
            ArtifactKind::File => false,
        });
    envelope.artifacts = listed;
    withheld
        .into_iter()
        .filter(|a: &Artifact| a.kind != ArtifactKind::Script)
        .collect()
}

/// Lists again, first and with a short preview, the withheld artifacts of the kinds `wanted` accepts.
fn relist(
    envelope: &mut Envelope,
    withheld: &mut Vec<Artifact>,
    wanted: impl Fn(ArtifactKind) -> bool,
) {
    let (back, keep): (Vec<Artifact>, Vec<Artifact>) = std::mem::take(withheld)
        .into_iter()
        .partition(|a| wanted(a.kind));
    *withheld = keep;
    for (i, mut artifact) in back.into_iter().enumerate() {
        artifact.preview = clip(&artifact.preview, 120);
        envelope.artifacts.insert(i, artifact);
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

/// At most about `chars` characters of `text`: its head and tail around a marker counting the rest
/// (the runner cuts messages the same way, so the end of a message, often the news, stays).
fn head_and_tail(text: &str, chars: usize) -> String {
    let total = text.chars().count();
    if total <= chars {
        return text.to_owned();
    }
    let half = chars / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(total - half).collect();
    format!(
        "{head}\n…[{} characters omitted]…\n{tail}",
        total - 2 * half
    )
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
    use crate::child::HeadTail;
    use crate::protocol::envelope::{ErrorInfo, Status};

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

    fn kept(kind: ArtifactKind, name: &str) -> Artifact {
        Artifact {
            id: format!("id-{name}"),
            name: name.into(),
            kind,
            bytes: 10,
            preview: "p".repeat(300),
        }
    }

    fn listed(e: &Envelope) -> Vec<&str> {
        e.artifacts.iter().map(|a| a.name.as_str()).collect()
    }

    #[test]
    fn artifacts_the_envelope_carries_are_listed_only_once_taken_out_of_it() {
        let all = vec![
            kept(ArtifactKind::Script, "script.py"),
            kept(ArtifactKind::Stdout, "stdout.txt"),
            kept(ArtifactKind::Stderr, "stderr.txt"),
            kept(ArtifactKind::ReturnValue, "return_value.json"),
            kept(ArtifactKind::File, "chart.png"),
        ];
        let small = captured("hello\n");
        let mut e = Envelope::empty("r".into());
        e.stdout = "hello\n".into();
        e.return_value = json!({"n": 1});
        e.artifacts = all.clone();
        fit(&mut e, 8192, &small, &small, 10_000);
        assert_eq!(listed(&e), ["chart.png"]);
        assert_eq!(e.return_value, json!({"n": 1}));

        // A value the envelope only previews is listed, so the whole value stays reachable.
        let mut e = Envelope::empty("r".into());
        e.return_preview = Some(json!({"type": "DataFrame"}));
        e.artifacts = all.clone();
        fit(&mut e, 8192, &small, &small, 10_000);
        assert_eq!(listed(&e), ["return_value.json", "chart.png"]);

        // Output shrunk to fit the budget: the kept stream is listed again, with a short preview.
        let big = captured(&"o".repeat(50_000));
        let mut e = Envelope::empty("r".into());
        render_output(&mut e, &big, &small, 10_000);
        e.return_value = json!([1, 2, 3]);
        e.artifacts = all.clone();
        fit(&mut e, 4096, &big, &small, 10_000);
        assert!(serde_json::to_vec(&e).unwrap().len() <= 4096);
        assert!(e.stdout.chars().count() < 10_000);
        assert_eq!(listed(&e), ["stdout.txt", "chart.png"]);
        assert!(e.artifacts[0].preview.chars().count() <= 121);

        // An inline value that cannot fit becomes a preview, and its artifact is listed.
        let mut e = Envelope::empty("r".into());
        e.return_value = json!("v".repeat(20_000));
        e.artifacts = all;
        fit(&mut e, 4096, &small, &small, 10_000);
        assert!(e.return_value.is_null() && e.return_preview.is_some());
        assert_eq!(listed(&e), ["return_value.json", "chart.png"]);
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
