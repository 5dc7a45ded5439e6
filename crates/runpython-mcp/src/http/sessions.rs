//! `serve`'s MCP sessions (`Mcp-Session-Id`), each bound to the token that made it for exactly as
//! long as the session lives: rmcp's in-memory session manager, wrapped ([`OwnedSessions`]) so that
//! every session it makes and ends is known here; the binding is made when the `initialize` that
//! created the session is answered, and goes only when the session ends (its idle timeout, a
//! DELETE, shutdown). No other cap can drop it: a token has a limit of live sessions instead
//! (`--max-sessions-per-token`), past which its `initialize` is refused with 429.
//!
//! A request naming a session another token made, or one still being made, is answered exactly as
//! one naming no session at all (404). Session ids are never logged whole ([`crate::tag`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use serde_json::{json, Value};

use crate::admission::ClientScope;
use crate::tag::session_tag;

/// The header naming a request's MCP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// Live sessions and whose they are.
#[derive(Debug)]
pub(super) struct Owners {
    /// Live sessions one token may have (0: no limit).
    limit: usize,
    state: Mutex<OwnersState>,
}

#[derive(Debug, Default)]
struct OwnersState {
    /// Every live session, with its token once bound.
    sessions: HashMap<SessionId, Option<Arc<str>>>,
    /// Each token's live sessions and the ones it is making.
    held: HashMap<Arc<str>, usize>,
}

impl OwnersState {
    fn give_back(&mut self, token: &Arc<str>) {
        if let Some(n) = self.held.get_mut(token) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(token);
            }
        }
    }
}

/// A place for one more session of a token, held while its `initialize` is answered.
#[derive(Debug)]
struct Reservation {
    owners: Arc<Owners>,
    token: Arc<str>,
    spent: bool,
}

impl Reservation {
    /// Binds the session the `initialize` made (if it still lives) to the token.
    fn bind(mut self, id: &str) {
        let mut state = self.owners.lock();
        if let Some(owner @ None) = state.sessions.get_mut(id) {
            *owner = Some(Arc::clone(&self.token));
            self.spent = true;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.spent {
            self.owners.lock().give_back(&self.token);
        }
    }
}

impl Owners {
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OwnersState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token session `id` is bound to; `None` for an unknown session or one not bound yet.
    fn owner(&self, id: &str) -> Option<Arc<str>> {
        self.lock().sessions.get(id).cloned().flatten()
    }

    /// A place for one more session of `token`, or how many it holds (its limit).
    fn reserve(self: &Arc<Self>, token: &str) -> Result<Reservation, usize> {
        let mut state = self.lock();
        let held = state.held.get(token).copied().unwrap_or(0);
        if self.limit > 0 && held >= self.limit {
            return Err(held);
        }
        let token: Arc<str> = Arc::from(token);
        *state.held.entry(Arc::clone(&token)).or_default() += 1;
        Ok(Reservation {
            owners: Arc::clone(self),
            token,
            spent: false,
        })
    }

    fn made(&self, id: &SessionId) {
        self.lock().sessions.insert(Arc::clone(id), None);
    }

    fn ended(&self, id: &SessionId) {
        let mut state = self.lock();
        if let Some(Some(token)) = state.sessions.remove(id) {
            state.give_back(&token);
        }
    }
}

/// rmcp's session manager, telling [`Owners`] of each session it makes and ends.
#[derive(Debug)]
pub(super) struct OwnedSessions {
    inner: LocalSessionManager,
    owners: Arc<Owners>,
}

impl OwnedSessions {
    pub(super) fn new(owners: Arc<Owners>) -> Self {
        Self {
            inner: LocalSessionManager::default(),
            owners,
        }
    }
}

impl SessionManager for OwnedSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        self.owners.made(&id);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.owners.ended(id);
        // rmcp logs a failed close with the whole id; the failure is said here by its tag instead.
        if let Err(e) = self.inner.close_session(id).await {
            let message = e.to_string().replace(id.as_ref(), &session_tag(id));
            tracing::warn!(mcp_session = %session_tag(id), "closing an MCP session failed: {message}");
        }
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<
        impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<
        impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<
        impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.inner.resume(id, last_event_id).await
    }
}

/// The middleware on `/mcp` (inside authentication and the body's deadline): a request naming a
/// session is let through only for the session's token; an `initialize` takes a place among its
/// token's sessions and binds the session it makes.
pub(super) async fn bind_sessions(
    State(owners): State<Arc<Owners>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(ClientScope::Token(token)) = request.extensions().get::<ClientScope>().cloned() else {
        return next.run(request).await;
    };
    if let Some(id) = request.headers().get(SESSION_HEADER) {
        let owner = id.to_str().ok().and_then(|id| owners.owner(id));
        if owner.as_deref() != Some(token.as_str()) {
            // As if it did not exist: a session id says nothing to a client it does not belong to.
            return (
                StatusCode::NOT_FOUND,
                axum::Json(
                    json!({"error": {"code": "session_not_found", "message": "no such MCP session"}}),
                ),
            )
                .into_response();
        }
        return next.run(request).await;
    }
    let Some(id) = initialize_id(&request) else {
        return next.run(request).await;
    };
    let reservation = match owners.reserve(&token) {
        Ok(reservation) => reservation,
        Err(held) => {
            tracing::info!(tenant = %token, sessions = held, "refused an MCP session: the token's limit");
            return too_many_sessions(id, &token, held);
        }
    };
    let response = next.run(request).await;
    if let Some(made) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        tracing::info!(tenant = %token, mcp_session = %session_tag(made), "MCP session opened");
        reservation.bind(made);
    }
    response
}

/// The JSON-RPC id of a POSTed `initialize` (the body is whole: the deadline's middleware read it).
fn initialize_id(request: &Request) -> Option<Value> {
    if request.method() != Method::POST {
        return None;
    }
    let bytes = request.extensions().get::<super::body::Whole>()?;
    let message: Value = serde_json::from_slice(&bytes.0).ok()?;
    (message["method"] == "initialize").then(|| message.get("id").cloned().unwrap_or(Value::Null))
}

/// 429 with the JSON-RPC error an MCP client reads as the answer to its `initialize`.
fn too_many_sessions(id: Value, token: &str, held: usize) -> Response {
    let message = format!(
        "client {token} already has {held} MCP sessions open, its limit (the server's \
         --max-sessions-per-token); close one (DELETE it) or wait for an idle one to expire"
    );
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32011, "message": message, "data": {"code": "too_many_sessions", "sessions": held}},
    });
    let mut response = (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(60u64));
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_binding_lasts_as_long_as_its_session_whatever_other_tokens_make() {
        let owners = Owners::new(0);
        let alices: SessionId = Arc::from("alice-1");
        owners.made(&alices);
        owners.reserve("alice").unwrap().bind(&alices);
        for i in 0..20_000 {
            let id: SessionId = Arc::from(format!("bob-{i}"));
            owners.made(&id);
            owners.reserve("bob").unwrap().bind(&id);
        }
        assert_eq!(owners.owner("alice-1").as_deref(), Some("alice"));
        owners.ended(&alices);
        assert_eq!(owners.owner("alice-1"), None);
    }

    #[test]
    fn a_token_has_a_limit_of_sessions_and_a_session_not_bound_is_no_ones() {
        let owners = Owners::new(2);
        let ids: Vec<SessionId> = (0..3).map(|i| Arc::from(format!("s{i}"))).collect();
        owners.made(&ids[0]);
        owners.reserve("alice").unwrap().bind(&ids[0]);
        owners.made(&ids[1]);
        owners.reserve("alice").unwrap().bind(&ids[1]);
        assert_eq!(owners.reserve("alice").unwrap_err(), 2);
        owners.reserve("bob").unwrap();
        // A session being made is no one's; one that ended before it was bound binds nothing, and
        // gives its place back.
        owners.made(&ids[2]);
        assert_eq!(owners.owner("s2"), None);
        owners.ended(&ids[0]);
        let reservation = owners.reserve("alice").unwrap();
        reservation.bind("s0");
        assert_eq!(owners.owner("s0"), None);
        owners.reserve("alice").unwrap().bind(&ids[2]);
        assert_eq!(owners.owner("s2").as_deref(), Some("alice"));
        assert_eq!(owners.reserve("alice").unwrap_err(), 2);
    }
}
