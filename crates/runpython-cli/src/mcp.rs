//! The MCP server: `run_python`, `get_run_artifact` and (on durable engines) `resume`, with the runs'
//! artifacts as resources. One handler serves stdio (`runpython mcp`, [`serve_stdio`]) and Streamable
//! HTTP (`runpython serve`, `crate::serve`).
//!
//! A run's envelope is the tool's result whatever its status (the code raising or timing out is an
//! outcome the model should read): `structuredContent` is the envelope (the tools declare it as their
//! `outputSchema`), the same JSON is the text content for older clients, and each artifact is a
//! `resource_link` to `runpython://artifact/<id>`. Arguments that break the declared input schema
//! (an unknown tool, a missing or unknown argument, a wrong type) are a JSON-RPC `-32602` error;
//! a call that could not be served (an unknown run to resume, runpython's own failures) is a result
//! with `isError` and `structuredContent: {"error": {"code", "message"}}`, `code` from
//! `runpython_core::Error::code`. Cancelling a call (`notifications/cancelled`, or an HTTP client
//! going away) drops the run's future, which kills its processes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, ErrorData, Implementation,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use runpython_core::{
    DepsProgress, DisplayImage, Error, Event, RunPython, ToolFormat, RESUME_TOOL, RUN_PYTHON_TOOL,
};
use serde_json::{json, Map, Value};

pub use crate::admission::{ClientScope, RunGate};
use crate::admission::{Refusal, OVER_CAPACITY};
use crate::lines::{LineTransport, MAX_LINE_BYTES};

/// The URI scheme of artifacts served as resources: `runpython://artifact/<id>`.
pub const ARTIFACT_URI_PREFIX: &str = "runpython://artifact/";

/// Resources listed per `resources/list` page (newest runs first).
const RESOURCES_PAGE: usize = 100;

/// The largest artifact `resources/read` returns whole; larger ones are read in slices with
/// `get_run_artifact`.
const MAX_RESOURCE_BYTES: usize = 8 * 1024 * 1024;

/// Output progress is sent at most this often (dependency steps and tool calls always are).
const OUTPUT_PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// The MCP handler. Cheap to clone (the HTTP transport makes one per session).
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

struct Shared {
    python: RunPython,
    tools: Vec<Tool>,
    schemas: HashMap<String, Value>,
    gate: Arc<RunGate>,
    /// Bytes each token's tenant may keep in the store (`--max-stored-bytes-per-token`).
    quota: Option<u64>,
}

impl Server {
    /// A handler for `python`'s tools, admitting runs through `gate`; each token's runs are its own
    /// tenant's, keeping at most `quota` bytes in the store.
    pub fn new(python: RunPython, gate: Arc<RunGate>, quota: Option<u64>) -> anyhow::Result<Self> {
        let mut tools = Vec::new();
        let mut schemas = HashMap::new();
        for spec in python
            .tool_spec(ToolFormat::Mcp)
            .as_array()
            .into_iter()
            .flatten()
        {
            let tool: Tool = serde_json::from_value(spec.clone())
                .context("the tool definitions are not MCP tools")?;
            schemas.insert(tool.name.to_string(), spec["inputSchema"].clone());
            tools.push(tool);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                python,
                tools,
                schemas,
                gate,
                quota,
            }),
        })
    }

    /// The engine for `scope`'s calls: its tenant's (runs, artifacts, checkpoints, sessions and memo
    /// entries of its own; every other tenant's ids read as missing), under its quota. Stdio's is the
    /// engine as configured (the default tenant, the one the CLI's local commands use).
    fn engine(&self, scope: &ClientScope) -> Result<RunPython, Error> {
        let Some(tenant) = scope.tenant() else {
            return Ok(self.shared.python.clone());
        };
        let engine = self.shared.python.tenant(tenant)?;
        Ok(match self.shared.quota {
            Some(bytes) => engine.with_stored_bytes_quota(bytes),
            None => engine,
        })
    }
}

/// The caller of a request: the token name the HTTP layer put in the request's extensions, else stdio.
fn caller(context: &RequestContext<RoleServer>) -> ClientScope {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<ClientScope>())
        .cloned()
        .unwrap_or(ClientScope::Stdio)
}

/// The request's MCP session (`Mcp-Session-Id`), `-` for none (stdio, the stateless protocol): the
/// log line's, so a host's log shows which sessions a proxy sent it.
fn mcp_session(context: &RequestContext<RoleServer>) -> String {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned()
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.shared.python.store().is_some() {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build()
        } else {
            ServerCapabilities::builder().enable_tools().build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("runpython", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Run Python with run_python: each call is a fresh sandboxed process returning a JSON \
                 envelope (status, return_value, stdout, stderr, error, artifacts). A status other than \
                 success is the code's outcome, not a failure of the tool. Files a run writes are \
                 resources (runpython://artifact/<id>).",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.shared.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let scope = caller(&context);
        let name = request.name.to_string();
        let args = request.arguments.unwrap_or_default();
        let outcome = self.answer(&name, args, &scope, &context).await;
        let status = match &outcome {
            Ok(result) => result_status(result),
            Err(e) if e.code == ErrorCode(-32800) => "cancelled".to_owned(),
            Err(e) => format!("rpc_error {}", e.code.0),
        };
        tracing::info!(
            tenant = %scope,
            tool = %name,
            status = %status,
            ms = started.elapsed().as_millis() as u64,
            mcp_session = %mcp_session(&context),
            "call"
        );
        outcome.map(Into::into)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let scope = caller(&context);
        let engine = self
            .engine(&scope)
            .map_err(|e| ErrorData::internal_error(runpython_core::error_report(&e), None))?;
        let Some(store) = engine.store() else {
            return Ok(ListResourcesResult::default());
        };
        tracing::info!(tenant = %scope, method = "resources/list", "call");
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().map_err(|_| {
                ErrorData::invalid_params(
                    format!("cursor {cursor:?} is not one this server gave; list from the start"),
                    None,
                )
            })?,
        };
        let listing = store.list_artifacts(None).await.map_err(|e| {
            ErrorData::internal_error(format!("cannot list the store's artifacts: {e}"), None)
        })?;
        // Oldest run first in the listing; the newest are the ones a client wants.
        let newest: Vec<_> = listing.items.iter().rev().collect();
        let page: Vec<Value> = newest
            .iter()
            .skip(start)
            .take(RESOURCES_PAGE)
            .map(|item| {
                let mut link = resource_json(&item.artifact);
                link["description"] = json!(format!(
                    "{} of run {}: {}",
                    item.artifact.name, item.run_id, item.artifact.preview
                ));
                link
            })
            .collect();
        let next = start + page.len();
        let mut result = json!({"resources": page, "resultType": "complete"});
        if next < newest.len() {
            result["nextCursor"] = json!(next.to_string());
        }
        serde_json::from_value(result).map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let scope = caller(&context);
        let uri = request.uri.to_string();
        let outcome = self.read(&scope, &uri).await;
        tracing::info!(
            tenant = %scope,
            method = "resources/read",
            status = match &outcome {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("rpc_error {}", e.code.0),
            },
            "call"
        );
        outcome
    }
}

impl Server {
    /// `resources/read` of `uri` for `scope`.
    async fn read(
        &self,
        scope: &ClientScope,
        uri: &str,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = uri.to_owned();
        let engine = self
            .engine(scope)
            .map_err(|e| ErrorData::internal_error(runpython_core::error_report(&e), None))?;
        let Some(id) = uri.strip_prefix(ARTIFACT_URI_PREFIX) else {
            return Err(ErrorData::new(
                ErrorCode::RESOURCE_NOT_FOUND,
                format!(
                    "no resource {uri:?}: this server serves {ARTIFACT_URI_PREFIX}<artifact id>"
                ),
                Some(json!({"code": "not_found", "uri": uri})),
            ));
        };
        // A ranged read of at most the limit: an artifact over it is refused by its size alone,
        // never read into memory.
        let read = engine
            .get_run_artifact_range(id, 0, None, MAX_RESOURCE_BYTES as u64)
            .await;
        let bytes = match read {
            Ok((bytes, _)) => bytes,
            Err(runpython_core::Error::Store(runpython_core::StoreError::TooLarge {
                bytes,
                ..
            })) => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "artifact {id} is {bytes} bytes, over the {MAX_RESOURCE_BYTES}-byte limit of resources/read; \
                         read it in slices with get_run_artifact (offset, length)"
                    ),
                    Some(json!({"code": "too_large", "bytes": bytes})),
                ));
            }
            Err(e) => {
                let code = if e.code() == "not_found" || e.code() == "invalid_input" {
                    ErrorCode::RESOURCE_NOT_FOUND
                } else {
                    ErrorCode::INTERNAL_ERROR
                };
                return Err(ErrorData::new(
                    code,
                    e.to_string(),
                    Some(json!({"code": e.code(), "uri": uri})),
                ));
            }
        };
        let contents = match std::str::from_utf8(&bytes) {
            Ok(text) => json!({"uri": uri, "mimeType": "text/plain", "text": text}),
            Err(_) => json!({
                "uri": uri,
                "mimeType": sniff_mime_type(&bytes),
                "blob": base64::engine::general_purpose::STANDARD.encode(&bytes),
            }),
        };
        let result: ReadResourceResult =
            serde_json::from_value(json!({"contents": [contents], "resultType": "complete"}))
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(result.into())
    }

    async fn answer(
        &self,
        name: &str,
        args: Map<String, Value>,
        scope: &ClientScope,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let Some(schema) = self.shared.schemas.get(name) else {
            let names: Vec<&str> = self.shared.tools.iter().map(|t| t.name.as_ref()).collect();
            return Err(ErrorData::invalid_params(
                format!("no tool named {name:?}; the tools are {}", names.join(", ")),
                Some(json!({"code": "unknown_tool"})),
            ));
        };
        if let Err(why) = check_arguments(schema, &args) {
            return Err(ErrorData::invalid_params(
                format!("invalid arguments for {name}: {why}"),
                Some(json!({"code": "invalid_arguments"})),
            ));
        }
        // The caller's tenant's engine: a session id is the tenant's own (two clients choosing "s"
        // get two sessions, and each sees back the id it passed), and every id it reads by is looked
        // up among the tenant's own only.
        let engine = match self.engine(scope) {
            Ok(engine) => engine,
            Err(e) => return Ok(failure(e.code(), &runpython_core::error_report(&e))),
        };
        let runs_code = name == RUN_PYTHON_TOOL || name == RESUME_TOOL;
        let _admitted = if runs_code {
            match self.shared.gate.enter(scope) {
                Ok(admitted) => Some(admitted),
                // A full host is a JSON-RPC error, retryable: the call was not served here, and
                // may be elsewhere (a client's own limit or a drain is the tool's answer to read).
                Err(refusal @ Refusal::OverCapacity { .. }) => {
                    return Err(ErrorData::new(
                        ErrorCode(OVER_CAPACITY),
                        refusal.message(),
                        Some(refusal.data()),
                    ));
                }
                Err(refusal) => return Ok(failure(refusal.code(), &refusal.message())),
            }
        } else {
            None
        };
        let args = Value::Object(args);
        let work = async {
            if name == RUN_PYTHON_TOOL {
                Self::run_python(&engine, &args, context).await
            } else {
                engine
                    .handle_tool_call(name, &args)
                    .await
                    .map(|value| (value, Vec::new()))
            }
        };
        // Dropping `work` drops the run's future (or its handle), which kills the run's processes.
        let outcome = tokio::select! {
            outcome = work => outcome,
            () = context.ct.cancelled() => {
                return Err(ErrorData::new(ErrorCode(-32800), "the request was cancelled", None));
            }
        };
        Ok(match outcome {
            Ok((value, images)) => success(value, runs_code, &images),
            Err(e) => failure(e.code(), &runpython_core::error_report(&e)),
        })
    }

    /// `run_python`, reporting progress when the request asked for it.
    async fn run_python(
        python: &RunPython,
        args: &Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<(Value, Vec<DisplayImage>), Error> {
        let request = python.run_python_request(args)?;
        let with_images = |envelope: runpython_core::Envelope| {
            let images = envelope.images.clone();
            serde_json::to_value(&envelope)
                .map(|value| (value, images))
                .map_err(|e| Error::Internal(e.to_string()))
        };
        let Some(token) = context.meta.get_progress_token() else {
            return with_images(python.run(request).await?);
        };
        let mut handle = python.start(request);
        let mut progress = 0u32;
        let mut last_output: Option<Instant> = None;
        while let Some(event) = handle.next_event().await {
            let message = match event {
                Event::Dependencies(step) => match deps_message(&step) {
                    Some(m) => m,
                    None => continue,
                },
                Event::ToolCall { name } => format!("calling {name}"),
                Event::Stdout(text) | Event::Stderr(text) => {
                    if last_output.is_some_and(|t| t.elapsed() < OUTPUT_PROGRESS_EVERY) {
                        continue;
                    }
                    last_output = Some(Instant::now());
                    let line = text
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("");
                    format!("output: {}", line.chars().take(200).collect::<String>())
                }
                _ => continue,
            };
            progress += 1;
            let param = ProgressNotificationParam::new(token.clone(), f64::from(progress))
                .with_message(message);
            // A client that stopped listening does not stop the run.
            let _ = context.peer.notify_progress(param).await;
        }
        with_images(handle.wait().await?)
    }
}

fn deps_message(step: &DepsProgress) -> Option<String> {
    Some(match step {
        DepsProgress::Resolving { specs } => format!("resolving {}", specs.join(" ")),
        DepsProgress::Downloading { detail } => format!("downloading {detail}"),
        DepsProgress::Installing { detail } => format!("installing {detail}"),
        DepsProgress::Waiting { .. } => {
            "waiting for another run preparing the same environment".into()
        }
        DepsProgress::Done { elapsed, .. } => format!("dependencies ready in {elapsed:.1?}"),
        _ => return None,
    })
}

/// A served call: the value as structured content and as JSON text; an envelope's display images
/// as `image` content (what a client shows a vision model) and its artifacts as resource links.
fn success(value: Value, envelope: bool, images: &[DisplayImage]) -> CallToolResult {
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
fn failure(code: &str, message: &str) -> CallToolResult {
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
fn result_status(result: &CallToolResult) -> String {
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

fn resource_json(artifact: &runpython_core::Artifact) -> Value {
    json!({
        "uri": format!("{ARTIFACT_URI_PREFIX}{}", artifact.id),
        "name": artifact.name,
        "mimeType": mime_type(&artifact.name),
        "size": artifact.bytes,
    })
}

/// The MIME type of binary content read by id (no name to go by): the formats runs make most.
fn sniff_mime_type(bytes: &[u8]) -> &'static str {
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

/// Checks call arguments against a tool's declared input schema (the flat object schemas of
/// `runpython_core::ToolDefinition`): required properties, `additionalProperties: false`, each
/// property's `type`, `items.type` of arrays, `minimum`/`exclusiveMinimum`.
fn check_arguments(schema: &Value, args: &Map<String, Value>) -> Result<(), String> {
    let properties = schema["properties"].as_object();
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(key) = required.as_str() {
            if !args.contains_key(key) {
                return Err(format!("`{key}` is required"));
            }
        }
    }
    for (key, value) in args {
        let Some(property) = properties.and_then(|p| p.get(key)) else {
            if schema["additionalProperties"] == json!(false) {
                let known: Vec<&str> = properties
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                return Err(format!(
                    "unknown argument `{key}`; the arguments are {}",
                    known.join(", ")
                ));
            }
            continue;
        };
        if value.is_null()
            && !schema["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!(key)))
        {
            continue; // an optional argument given as null is the same as absent
        }
        if !has_type(value, &property["type"]) {
            return Err(format!("`{key}` must be {}, not {value}", property["type"]));
        }
        if let Some(item_type) = property["items"].get("type") {
            for item in value.as_array().into_iter().flatten() {
                if !has_type(item, item_type) {
                    return Err(format!("`{key}` items must be {item_type}, not {item}"));
                }
            }
        }
        if let (Some(n), Some(min)) = (value.as_f64(), property["minimum"].as_f64()) {
            if n < min {
                return Err(format!("`{key}` must be at least {min}, not {value}"));
            }
        }
        if let (Some(n), Some(min)) = (value.as_f64(), property["exclusiveMinimum"].as_f64()) {
            if n <= min {
                return Err(format!("`{key}` must be more than {min}, not {value}"));
            }
        }
    }
    Ok(())
}

fn has_type(value: &Value, expected: &Value) -> bool {
    match expected {
        Value::String(t) => match t.as_str() {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "null" => value.is_null(),
            _ => true,
        },
        Value::Array(types) => types.iter().any(|t| has_type(value, t)),
        _ => true,
    }
}

/// Serves on stdin and stdout until the client closes stdin.
pub async fn serve_stdio(python: RunPython) -> anyhow::Result<()> {
    let server = Server::new(python, RunGate::new(0, 0), None)?;
    let transport = LineTransport::new(tokio::io::stdin(), tokio::io::stdout(), MAX_LINE_BYTES);
    let running = server
        .serve(transport)
        .await
        .context("the MCP handshake on stdio failed")?;
    running.waiting().await.context("the MCP server stopped")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "dependencies": {"type": "array", "items": {"type": "string"}},
                "timeout": {"type": "number", "exclusiveMinimum": 0},
                "offset": {"type": "integer", "minimum": 0},
            },
            "required": ["code"],
            "additionalProperties": false,
        })
    }

    fn check(args: Value) -> Result<(), String> {
        check_arguments(&schema(), args.as_object().unwrap())
    }

    #[test]
    fn arguments_outside_the_declared_schema_are_refused() {
        assert!(check(json!({"code": "1", "timeout": 2.5, "dependencies": ["six"]})).is_ok());
        assert!(check(json!({"code": "1", "timeout": null})).is_ok());
        let unknown = check(json!({"code": "1", "source": "x"})).unwrap_err();
        assert!(unknown.contains("unknown argument `source`"), "{unknown}");
        assert!(check(json!({"timeout": 1}))
            .unwrap_err()
            .contains("`code` is required"));
        assert!(check(json!({"code": 1})).is_err());
        assert!(check(json!({"code": "1", "dependencies": [1]})).is_err());
        assert!(check(json!({"code": "1", "timeout": 0})).is_err());
        assert!(check(json!({"code": "1", "offset": -1})).is_err());
        assert!(check(json!({"code": "1", "offset": 1.5})).is_err());
    }

    #[test]
    fn artifacts_get_the_mime_types_clients_render() {
        assert_eq!(mime_type("out/table.CSV"), "text/csv");
        assert_eq!(mime_type("plot_1.png"), "image/png");
        assert_eq!(mime_type("blob"), "application/octet-stream");
    }
}
