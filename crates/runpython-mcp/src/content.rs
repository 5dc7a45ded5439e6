//! What a call answers in MCP's terms: a served call's content (the value as JSON text and as
//! `structuredContent`, display images as `image` content, artifacts as `resource_link`s), a call
//! that could not be served (`isError` with a machine-readable code), and the artifacts' resource
//! URIs and MIME types.

use rmcp::model::CallToolResult;
use runpython_core::DisplayImage;
use serde_json::{json, Value};

/// The URI scheme of artifacts served as resources: `runpython://artifact/<id>`.
pub const ARTIFACT_URI_PREFIX: &str = "runpython://artifact/";

/// A served call: the value as structured content and as JSON text; an envelope's display images
/// as `image` content (what a client shows a vision model) and its artifacts as resource links.
pub(crate) fn success(value: Value, envelope: bool, images: &[DisplayImage]) -> CallToolResult {
    let mut content = vec![json!({"type": "text", "text": value.to_string()})];
    for image in images {
        content.push(json!({"type": "image", "data": image.data, "mimeType": image.mime}));
    }
    if envelope {
        for artifact in value["artifacts"].as_array().into_iter().flatten() {
            if let Ok(artifact) = serde_json::from_value(artifact.clone()) {
                let mut link = resource_json(&artifact);
                link["type"] = json!("resource_link");
                content.push(link);
            }
        }
    }
    let result = json!({
        "content": content,
        "structuredContent": value,
        "isError": false,
        "resultType": "complete",
    });
    serde_json::from_value(result).unwrap_or_else(|e| {
        CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
            "internal error: the result is not an MCP result: {e}"
        ))])
    })
}

/// A call that could not be served, with its machine-readable code.
pub(crate) fn failure(code: &str, message: &str) -> CallToolResult {
    let result = json!({
        "content": [{"type": "text", "text": message}],
        "structuredContent": {"error": {"code": code, "message": message}},
        "isError": true,
        "resultType": "complete",
    });
    serde_json::from_value(result).unwrap_or_else(|_| {
        CallToolResult::error(vec![rmcp::model::ContentBlock::text(message.to_owned())])
    })
}

/// How a call ended, for the log line: the envelope's status, or the error's code.
pub(crate) fn result_status(result: &CallToolResult) -> String {
    let structured = result.structured_content.as_ref();
    if result.is_error == Some(true) {
        let code = structured
            .and_then(|v| v["error"]["code"].as_str())
            .unwrap_or("error");
        return format!("error {code}");
    }
    structured
        .and_then(|v| v["status"].as_str())
        .unwrap_or("ok")
        .to_owned()
}

pub(crate) fn resource_json(artifact: &runpython_core::Artifact) -> Value {
    json!({
        "uri": format!("{ARTIFACT_URI_PREFIX}{}", artifact.id),
        "name": artifact.name,
        "mimeType": mime_type(&artifact.name),
        "size": artifact.bytes,
    })
}

/// The MIME type of binary content read by id (no name to go by): the formats runs make most.
pub(crate) fn sniff_mime_type(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else if bytes.starts_with(b"%PDF-") {
        "application/pdf"
    } else if bytes.starts_with(b"PAR1") {
        "application/vnd.apache.parquet"
    } else {
        "application/octet-stream"
    }
}

/// A MIME type from a file name's extension (what clients need to render CSVs and plots).
fn mime_type(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("csv") => "text/csv",
        Some("json") => "application/json",
        Some("txt" | "log") => "text/plain",
        Some("py") => "text/x-python",
        Some("md") => "text/markdown",
        Some("html" | "htm") => "text/html",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("svg") => "image/svg+xml",
        Some("pdf") => "application/pdf",
        Some("parquet") => "application/vnd.apache.parquet",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_get_the_mime_types_clients_render() {
        assert_eq!(mime_type("out/table.CSV"), "text/csv");
        assert_eq!(mime_type("plot_1.png"), "image/png");
        assert_eq!(mime_type("blob"), "application/octet-stream");
    }
}
