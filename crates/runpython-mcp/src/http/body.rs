//! A request's body, read whole by its deadline: `--body-timeout` after the request's head arrived,
//! whatever pace its bytes come at (a timeout that restarts at each frame, as tower-http's does,
//! lets a body trickled a byte a second run forever). One that has not arrived by then is answered
//! `408 Request Timeout` and its connection closed; one over the size limit `413`. Only for
//! authenticated requests (inside the authentication middleware): an unauthenticated one is
//! refused before its body is read.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::lines::MAX_LINE_BYTES;

/// When a request's head arrived (the listener puts it in the request's extensions).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrived(pub(crate) Instant);

/// The whole body, in the request's extensions too, for the middlewares inside this one that look
/// at the message (which `initialize`, which run) without reading the body again.
#[derive(Debug, Clone)]
pub(super) struct Whole(pub(super) axum::body::Bytes);

/// The middleware: the body read whole before the request goes on, or the refusal.
pub(super) async fn whole_by_deadline(
    State(timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    let arrived = request
        .extensions()
        .get::<Arrived>()
        .map_or_else(Instant::now, |a| a.0);
    let (mut parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, MAX_LINE_BYTES);
    match tokio::time::timeout_at((arrived + timeout).into(), read).await {
        Ok(Ok(bytes)) => {
            parts.extensions.insert(Whole(bytes.clone()));
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("the request body is over the {MAX_LINE_BYTES}-byte limit of one message; send less (large data goes in files or stored artifacts)"),
                )
            } else {
                refusal(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("the request body could not be read: {e}"),
                )
            }
        }
        Err(_) => {
            tracing::info!(
                body_timeout_s = timeout.as_secs_f64(),
                "a request body did not arrive in time: 408, connection closed"
            );
            refusal(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive whole within {} s of its headers (the server's \
                     --body-timeout); send it at once",
                    timeout.as_secs_f64()
                ),
            )
        }
    }
}

/// A refusal that ends the connection: what is left of the body is never read.
fn refusal(status: StatusCode, code: &str, message: String) -> Response {
    let mut response = (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
