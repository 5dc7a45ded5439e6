//! The MCP handler: `run_python`, `get_run_artifact`, `close_session` and (on durable engines)
//! `resume`, with the runs' artifacts as resources. One handler serves stdio ([`crate::serve_stdio`])
//! and Streamable HTTP ([`crate::HttpServer`]).
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

use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, ErrorData, Implementation,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::ServerHandler;
use runpython_core::{DisplayImage, Error, Event, RunPython, RESUME_TOOL, RUN_PYTHON_TOOL};
use serde_json::{json, Map, Value};

use crate::admission::{ClientScope, Refusal, RunGate, OVER_CAPACITY};
use crate::content::{
    failure, resource_json, result_status, sniff_mime_type, success, ARTIFACT_URI_PREFIX,
};
use crate::host_details::HostDetails;
use crate::tools::{check_arguments, tool_list};

/// Resources listed per `resources/list` page (newest runs first).
const RESOURCES_PAGE: usize = 100;

/// The largest artifact `resources/read` returns whole; larger ones are read in slices with
/// `get_run_artifact`.
const MAX_RESOURCE_BYTES: usize = 8 * 1024 * 1024;

/// Output progress is sent at most this often (dependency steps and tool calls always are).
const OUTPUT_PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// The MCP handler. Cheap to clone (the HTTP transport makes one per session).
#[derive(Clone)]
pub(crate) struct Server {
    shared: Arc<Shared>,
}

struct Shared {
    python: RunPython,
    tools: Vec<Tool>,
    schemas: HashMap<String, Value>,
    gate: Arc<RunGate>,
    /// Bytes each token's tenant may keep in the store (`--max-stored-bytes-per-token`).
    quota: Option<u64>,
    /// What of the host HTTP tenants' answers must not carry.
    host: HostDetails,
}

impl Server {
    /// A handler for `python`'s tools, admitting runs through `gate`; each token's runs are its own
    /// tenant's, keeping at most `quota` bytes in the store.
    pub(crate) fn new(
        python: RunPython,
        gate: Arc<RunGate>,
        quota: Option<u64>,
    ) -> Result<Self, crate::Error> {
        let mut tools = Vec::new();
        let mut schemas = HashMap::new();
        for spec in tool_list(&python).as_array().into_iter().flatten() {
            let tool: Tool =
                serde_json::from_value(spec.clone()).map_err(crate::Error::ToolDefinitions)?;
            schemas.insert(tool.name.to_string(), spec["inputSchema"].clone());
            tools.push(tool);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                host: HostDetails::of(&python),
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

impl Server {
    /// What `scope` reads of runpython's failure `e`: all of it for stdio (the operator's own
    /// client), none of the host's details for a tenant.
    fn said(&self, scope: &ClientScope, e: &Error) -> String {
        match scope {
            ClientScope::Stdio => runpython_core::error_report(e),
            ClientScope::Token(tenant) => self.shared.host.message(e, tenant),
        }
    }

    /// `e` as an internal JSON-RPC error for `scope`.
    fn internal(&self, scope: &ClientScope, e: &Error) -> ErrorData {
        ErrorData::internal_error(self.said(scope, e), Some(json!({"code": e.code()})))
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

/// The request's MCP session (`Mcp-Session-Id`) as logs name it (its tag: the id is a capability),
/// `-` for none (stdio, the stateless protocol), so a host's log shows which sessions a proxy sent
/// it.
fn mcp_session(context: &RequestContext<RoleServer>) -> String {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.headers.get("mcp-session-id"))
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| "-".to_owned(), crate::tag::session_tag)
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
        let engine = self.engine(&scope).map_err(|e| self.internal(&scope, &e))?;
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
        let listing = store
            .list_artifacts(None)
            .await
            .map_err(|e| self.internal(&scope, &Error::Store(e)))?;
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
        let engine = self.engine(scope).map_err(|e| self.internal(scope, &e))?;
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
                    self.said(scope, &e),
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
            Err(e) => return Ok(failure(e.code(), &self.said(scope, &e))),
        };
        let runs_code = name == RUN_PYTHON_TOOL || name == RESUME_TOOL;
        let _admitted = if runs_code {
            // A call waiting for its turn stops waiting when it is cancelled.
            let entered = tokio::select! {
                entered = self.shared.gate.enter(scope) => entered,
                () = context.ct.cancelled() => {
                    return Err(ErrorData::new(ErrorCode(-32800), "the request was cancelled", None));
                }
            };
            match entered {
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
            Ok((mut value, images)) => {
                if runs_code && matches!(scope, ClientScope::Token(_)) {
                    self.shared.host.envelope(&mut value);
                }
                success(value, runs_code, &images)
            }
            Err(e) => failure(e.code(), &self.said(scope, &e)),
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
                Event::Dependencies(step) => match step.message() {
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
