//! A host at its capacity, said over HTTP: a `run_python` or `resume` call arriving while the host has
//! `--max-runs-in-flight` runs and its tenant holds its share of them is answered at once with
//! `503 Service Unavailable`, `Retry-After` and the JSON-RPC error of
//! [`crate::admission::Refusal::OverCapacity`] as the body (MCP clients read a JSON-RPC error at a
//! non-2xx status as the request's answer), so neither the client nor a proxy waits on a host that
//! will not serve it. A tenant under its share goes on, to wait for its turn at the gate.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use runpython_core::{RESUME_TOOL, RUN_PYTHON_TOOL};
use serde_json::{json, Value};

use super::body::Whole;
use crate::admission::{ClientScope, Refusal, RunGate, OVER_CAPACITY, RETRY_AFTER_S};

/// The middleware on `/mcp` (inside authentication: an unauthenticated caller learns nothing of
/// the host's load; and inside the body's deadline, which read the message whole).
pub async fn refuse_over_capacity(
    State(gate): State<Arc<RunGate>>,
    request: Request,
    next: Next,
) -> Response {
    let scope = request.extensions().get::<ClientScope>().cloned();
    let refusal = scope.as_ref().and_then(|scope| gate.refuses_at_once(scope));
    let (Some(scope), Some(refusal)) = (scope, refusal) else {
        return next.run(request).await;
    };
    let message: Option<Value> = request
        .extensions()
        .get::<Whole>()
        .and_then(|whole| serde_json::from_slice(&whole.0).ok());
    match message.as_ref().and_then(run_call_id) {
        Some(id) if request.method() == Method::POST => {
            tracing::info!(
                tenant = %scope,
                max_runs_in_flight = gate.capacity(),
                "refused a run: over capacity (the tenant holds its share)"
            );
            over_capacity(id, &refusal)
        }
        _ => next.run(request).await,
    }
}

/// The id of a JSON-RPC `tools/call` that starts a run, `None` for any other message (a batch
/// included: it goes on, and each run in it meets the gate).
fn run_call_id(message: &Value) -> Option<Value> {
    let name = message["params"]["name"].as_str()?;
    let runs = name == RUN_PYTHON_TOOL || name == RESUME_TOOL;
    (message["method"] == "tools/call" && runs).then(|| message.get("id").cloned())?
}

fn over_capacity(id: Value, refusal: &Refusal) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": OVER_CAPACITY, "message": refusal.message(), "data": refusal.data()},
    });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_calls_that_start_runs_are_refused_for_capacity() {
        let call = |name: &str| json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name}});
        assert_eq!(run_call_id(&call("run_python")), Some(json!(7)));
        assert_eq!(run_call_id(&call("resume")), Some(json!(7)));
        assert_eq!(run_call_id(&call("get_run_artifact")), None);
        assert_eq!(
            run_call_id(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
            None
        );
        assert_eq!(
            run_call_id(&json!({"method": "tools/call", "params": {"name": "run_python"}})),
            None
        );
        assert_eq!(run_call_id(&json!([call("run_python")])), None);
    }

    #[test]
    fn the_refusal_is_a_503_with_retry_after() {
        let response = over_capacity(json!(3), &Refusal::OverCapacity { limit: 8 });
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
