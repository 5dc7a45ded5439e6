//! `runpython serve`: the MCP server of `runpython mcp` over Streamable HTTP (rmcp's
//! `StreamableHttpService` under axum), for agents on other machines and for many hosts behind a load
//! balancer.
//!
//! - `/mcp` needs `Authorization: Bearer <token>`: a static token from `--tokens-file` or
//!   `RUNPYTHON_TOKENS` (`name:token` entries, compared in constant time), or with `--jwks` an OAuth
//!   access token (a JWT checked by [`crate::oauth`]; its tenant is `jwt:<claim>`). Anything else is
//!   a 401 with `WWW-Authenticate`. The token's name is the client's [`ClientScope`] and its
//!   tenant: its runs, artifacts, checkpoints, sessions and memo entries are its own and invisible to
//!   every other token, it has its own run limit and stored-bytes quota
//!   (`--max-stored-bytes-per-token`), the log line of each call names it, and an MCP session
//!   (`Mcp-Session-Id`) made with one token is unknown (404) to every other.
//! - `/.well-known/oauth-protected-resource` (and `…/mcp`): the resource metadata (RFC 9728) when
//!   access tokens are accepted.
//! - `GET /healthz`: 200 `{"status": "ok", "runs_in_flight": n, "max_runs_in_flight": m}`, 503 with
//!   `"draining"` once shutdown has begun (so a load balancer stops sending work), no token needed.
//! - Capacity: at most `--max-runs-in-flight` runs at once on the host, whoever they are for. A
//!   `run_python` or `resume` call over it is answered at once with a 503, `Retry-After` and a
//!   JSON-RPC error (`over_capacity`, `retry_after_s`) in the body, before it reaches the MCP service
//!   (a call that loses the race for the last place inside gets the same JSON-RPC error in-band).
//! - SIGTERM or SIGINT: new runs are refused, runs in flight may finish within `--drain-timeout`,
//!   then sessions are closed and the process exits (runs still going are killed with it).
//! - It binds 127.0.0.1 unless `--bind` says otherwise.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use runpython_core::RunPython;
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use crate::lines::MAX_LINE_BYTES;
use crate::mcp::{ClientScope, RunGate, Server};
use crate::oauth::{quoted, Refused, Verifier};

/// The environment variable holding tokens, as `name:token` entries separated by commas or newlines.
pub const TOKENS_ENV: &str = "RUNPYTHON_TOKENS";

/// Shortest token accepted: a guessable token is no authentication.
const MIN_TOKEN_CHARS: usize = 16;

/// After the drain, how long the last replies get to reach their clients before sessions close.
const REPLY_GRACE: Duration = Duration::from_millis(500);

/// MCP sessions remembered per server (their token binding); the oldest are forgotten first.
const MAX_SESSIONS: usize = 10_000;

/// How `serve` is set up (the engine's flags are `runpython mcp`'s).
#[derive(Debug)]
pub struct ServeConfig {
    /// Where to listen.
    pub bind: SocketAddr,
    /// The tokens file, if any.
    pub tokens_file: Option<PathBuf>,
    /// Concurrent runs per token (0: no limit).
    pub max_runs_per_token: usize,
    /// Concurrent runs on this host, all tokens together (0: no limit).
    pub max_runs_in_flight: usize,
    /// How long in-flight runs may take to finish after SIGTERM/SIGINT.
    pub drain_timeout: Duration,
    /// `Host` values accepted besides loopback names.
    pub allowed_hosts: Vec<String>,
    /// Connections at once (within what the descriptor limit leaves).
    pub max_connections: usize,
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// A request's body must arrive within this.
    pub body_timeout: Duration,
    /// Bytes each token's tenant may keep in the store (`None`: no quota).
    pub max_stored_bytes_per_token: Option<u64>,
    /// OAuth access tokens, when accepted.
    pub oauth: Option<crate::oauth::OAuthConfig>,
}

/// Bearer tokens by value's check: name and secret.
#[derive(Clone)]
struct Tokens(Arc<Vec<(String, Vec<u8>)>>);

impl Tokens {
    /// The name of the token `presented` is, checking every token so the time taken says nothing
    /// about which one matched or how much of it did (lengths aside).
    fn name_of(&self, presented: &[u8]) -> Option<&str> {
        let mut found = None;
        for (name, secret) in self.0.iter() {
            if bool::from(secret.as_slice().ct_eq(presented)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// Reads `name:token` entries (blank lines and `#` comments skipped).
fn parse_tokens(text: &str, source: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut tokens: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, entry) in text
        .split(['\n', ','])
        .map(str::trim)
        .enumerate()
        .filter(|(_, e)| !e.is_empty() && !e.starts_with('#'))
    {
        let Some((name, secret)) = entry.split_once(':') else {
            bail!(
                "{source}: entry {} is not NAME:TOKEN (the name is what logs and limits show)",
                i + 1
            );
        };
        let (name, secret) = (name.trim(), secret.trim());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!("{source}: token name {name:?} must be letters, digits, '-', '_' or '.'");
        }
        if secret.chars().count() < MIN_TOKEN_CHARS {
            bail!(
                "{source}: the token of {name} is {} characters, under the minimum of {MIN_TOKEN_CHARS}; \
                 make one with e.g. `openssl rand -hex 32`",
                secret.chars().count()
            );
        }
        if tokens.iter().any(|(n, _)| n == name) {
            bail!("{source}: the token name {name} appears twice");
        }
        tokens.push((name.to_owned(), secret.as_bytes().to_vec()));
    }
    Ok(tokens)
}

fn load_tokens(file: Option<&PathBuf>, oauth: bool) -> anyhow::Result<Tokens> {
    let mut tokens = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the tokens file {}", path.display()))?;
        tokens.extend(parse_tokens(&text, &path.display().to_string())?);
    }
    if let Ok(text) = std::env::var(TOKENS_ENV) {
        for (name, secret) in parse_tokens(&text, TOKENS_ENV)? {
            if tokens.iter().any(|(n, _)| *n == name) {
                bail!("the token name {name} is in both the tokens file and {TOKENS_ENV}");
            }
            tokens.push((name, secret));
        }
    }
    if tokens.is_empty() && !oauth {
        bail!(
            "runpython serve needs at least one bearer token: pass --tokens-file FILE or set {TOKENS_ENV} \
             (NAME:TOKEN entries), or accept OAuth access tokens with --jwks"
        );
    }
    Ok(Tokens(Arc::new(tokens)))
}

/// Which token made each MCP session, so no other token can use it.
#[derive(Default)]
struct SessionOwners {
    owners: HashMap<String, String>,
    order: VecDeque<String>,
}

impl SessionOwners {
    fn bind(&mut self, session: String, token: String) {
        if self.owners.insert(session.clone(), token).is_none() {
            self.order.push_back(session);
        }
        while self.order.len() > MAX_SESSIONS {
            if let Some(old) = self.order.pop_front() {
                self.owners.remove(&old);
            }
        }
    }
}

#[derive(Clone)]
struct AppState {
    tokens: Tokens,
    sessions: Arc<Mutex<SessionOwners>>,
    gate: Arc<RunGate>,
    oauth: Option<Verifier>,
}

/// A 401: `WWW-Authenticate` says the scheme, where the resource metadata is (with access tokens
/// accepted) and, for a token presented and refused, `error="invalid_token"` and why (RFC 6750).
fn unauthorized(state: &AppState, host: Option<&str>, why: &str, presented: bool) -> Response {
    let mut challenge = "Bearer realm=\"runpython\"".to_owned();
    if let Some(oauth) = &state.oauth {
        challenge.push_str(&format!(
            ", resource_metadata=\"{}\"",
            quoted(&oauth.metadata_url(host))
        ));
    }
    if presented {
        challenge.push_str(&format!(
            ", error=\"invalid_token\", error_description=\"{}\"",
            quoted(why)
        ));
    }
    let mut response = (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": {"code": "unauthorized", "message": why}})),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    // The connection ends with the refusal, and says so: a client must not send its next request on
    // a connection that has made no authenticated one (it counts against the unauthenticated cap,
    // and one reused as the server let it go was a race the client lost, "disconnected without a
    // response").
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn host_of(request: &Request) -> Option<String> {
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            h.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c))
        })
        .map(str::to_owned)
}

/// `/.well-known/oauth-protected-resource`: the resource metadata (RFC 9728), when access tokens are
/// accepted.
async fn resource_metadata(State(state): State<AppState>, request: Request) -> Response {
    match &state.oauth {
        Some(oauth) => {
            axum::Json(oauth.metadata(host_of(&request).as_deref())).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": {"code": "not_found", "message": "this server takes no OAuth access tokens (start it with --jwks)"}})),
        )
            .into_response(),
    }
}

/// Bearer authentication and the binding of MCP sessions to the token that made them.
async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let host = host_of(&request);
    let Some(presented) = presented else {
        return unauthorized(
            &state,
            host.as_deref(),
            "this server needs `Authorization: Bearer <token>`",
            false,
        );
    };
    let name = match state.tokens.name_of(presented.as_bytes()) {
        Some(name) => name.to_owned(),
        None => {
            let refused = match &state.oauth {
                Some(oauth) => match oauth.verify(presented).await {
                    Ok(tenant) => Ok(tenant),
                    Err(Refused(why)) => Err(why),
                },
                None => Err("the bearer token is not one this server accepts".to_owned()),
            };
            match refused {
                Ok(tenant) => tenant,
                Err(why) => {
                    tracing::info!(reason = %why, "refused a bearer token");
                    return unauthorized(&state, host.as_deref(), &why, true);
                }
            }
        }
    };
    if let Some(connection) = request
        .extensions()
        .get::<Arc<crate::listener::Connection>>()
    {
        connection.authenticated();
    }
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(session) = &session {
        let owner = state
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .owners
            .get(session)
            .cloned();
        if owner.is_some_and(|owner| owner != name) {
            // As if it did not exist: a session id says nothing to a client it does not belong to.
            return (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"error": {"code": "session_not_found", "message": "no such MCP session"}})),
            )
                .into_response();
        }
    }
    request
        .extensions_mut()
        .insert(ClientScope::Token(name.clone()));
    let response = next.run(request).await;
    if session.is_none() {
        if let Some(made) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            state
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .bind(made.to_owned(), name);
        }
    }
    response
}

async fn health(State(state): State<AppState>) -> Response {
    let runs = state.gate.in_flight();
    if state.gate.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "draining", "runs_in_flight": runs})),
        )
            .into_response()
    } else {
        axum::Json(json!({
            "status": "ok",
            "runs_in_flight": runs,
            "max_runs_in_flight": state.gate.capacity(),
        }))
        .into_response()
    }
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
        () = terminate => tracing::info!("SIGTERM: draining"),
    }
}

/// Serves until SIGTERM or SIGINT, then drains.
pub async fn serve(python: RunPython, config: ServeConfig) -> anyhow::Result<()> {
    let tokens = load_tokens(config.tokens_file.as_ref(), config.oauth.is_some())?;
    let oauth = match config.oauth.clone() {
        Some(oauth) => Some(Verifier::new(oauth).await?),
        None => None,
    };
    if python.store().is_none() && config.max_stored_bytes_per_token.is_some() {
        bail!("--max-stored-bytes-per-token needs a store to count in (--store)");
    }
    let gate = RunGate::new(config.max_runs_per_token, config.max_runs_in_flight);
    let server = Server::new(python, Arc::clone(&gate), config.max_stored_bytes_per_token)?;
    let sessions_ct = CancellationToken::new();
    let mut http = StreamableHttpServerConfig::default()
        .with_cancellation_token(sessions_ct.child_token())
        .with_max_request_body_bytes(MAX_LINE_BYTES);
    if !config.allowed_hosts.is_empty() {
        let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
        hosts.extend(config.allowed_hosts.iter().cloned());
        http = http.with_allowed_hosts(hosts);
    } else if !config.bind.ip().is_loopback() {
        // Behind a load balancer the Host header is the service's public name; bearer tokens guard
        // the endpoint, and --allowed-host narrows it again.
        tracing::warn!(
            "bound to {}: any Host header is accepted (pass --allowed-host NAME to check it)",
            config.bind
        );
        http = http.disable_allowed_hosts();
    }
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        http,
    );
    let state = AppState {
        tokens,
        sessions: Arc::default(),
        gate: Arc::clone(&gate),
        oauth,
    };
    let app = Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&gate),
            crate::overload::refuse_over_capacity,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .route("/healthz", get(health))
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(resource_metadata),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("cannot listen on {}", config.bind))?;
    let local = listener.local_addr()?;
    let nofile = crate::listener::raise_nofile();
    let limits = crate::listener::ConnectionLimits::within(
        config.max_connections,
        nofile,
        config.header_timeout,
        config.body_timeout,
    );
    tracing::info!(
        max_runs_in_flight = config.max_runs_in_flight,
        open_files = nofile,
        max_connections = limits.max_connections,
        max_unauthenticated = limits.max_unauthenticated,
        "serving MCP on http://{local}/mcp (health: http://{local}/healthz)"
    );
    // The one line a supervisor or test waits for, whatever the log level.
    {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "runpython serve: listening on http://{local}"
        );
    }

    let drained = CancellationToken::new();
    let drain = {
        let (gate, drained, sessions_ct) =
            (Arc::clone(&gate), drained.clone(), sessions_ct.clone());
        let bound = config.drain_timeout;
        async move {
            shutdown_signal().await;
            gate.start_draining();
            let in_flight = gate.in_flight();
            if in_flight > 0 {
                tracing::info!(in_flight, "waiting up to {bound:?} for runs in flight");
            }
            if tokio::time::timeout(bound, gate.drained()).await.is_err() {
                tracing::warn!(
                    in_flight = gate.in_flight(),
                    "runs still in flight after {bound:?}; stopping them"
                );
            }
            // The last runs' replies are written after their runs leave the gate: let them out.
            tokio::time::sleep(REPLY_GRACE).await;
            sessions_ct.cancel();
            drained.cancel();
        }
    };
    let server = crate::listener::serve(listener, app, limits, drain);
    tokio::select! {
        () = server => {}
        // Connections that outlive the sessions (a client holding a stream open) get a short grace.
        () = async {
            drained.cancelled().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        } => tracing::warn!("connections still open 5 s after the drain; closing them"),
    }
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_are_named_long_and_unique() {
        let tokens = parse_tokens(
            "# team tokens\nalice: 0123456789abcdef0123\n\nbob:fedcba9876543210fedc",
            "f",
        )
        .unwrap();
        assert_eq!(tokens.len(), 2);
        let tokens = Tokens(Arc::new(tokens));
        assert_eq!(tokens.name_of(b"0123456789abcdef0123"), Some("alice"));
        assert_eq!(tokens.name_of(b"fedcba9876543210fedc"), Some("bob"));
        assert_eq!(tokens.name_of(b"0123456789abcdef012"), None);
        assert_eq!(tokens.name_of(b""), None);
        assert!(parse_tokens("alice:short", "f")
            .unwrap_err()
            .to_string()
            .contains("minimum"));
        assert!(parse_tokens("0123456789abcdef0123", "f").is_err());
        assert!(parse_tokens("a:0123456789abcdef0123,a:0123456789abcdef0124", "f").is_err());
    }
}
