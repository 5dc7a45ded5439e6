//! `runpython serve`: the MCP server of `runpython mcp` over Streamable HTTP (rmcp's
//! `StreamableHttpService` under axum), for agents on other machines and for many hosts behind a load
//! balancer.
//!
//! - `/mcp` needs `Authorization: Bearer <token>`: a static token from `--tokens-file` or
//!   `RUNPYTHON_TOKENS` (`name:token` entries, compared in constant time), or with `--jwks` an OAuth
//!   access token (a JWT checked by `oauth.rs`; its tenant is `jwt:<claim>`). Anything else is
//!   a 401 with `WWW-Authenticate`. The token's name is the client's `ClientScope` and its
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

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use runpython_core::RunPython;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::admission::RunGate;
use crate::lines::MAX_LINE_BYTES;
use crate::server::Server;
use crate::Error;
use auth::AppState;
pub use oauth::OAuthConfig;

mod auth;
mod body;
mod listener;
mod oauth;
mod overload;
mod sessions;
mod slots;

pub use auth::TOKENS_ENV;

/// After the drain, how long the last replies get to reach their clients before sessions close.
const REPLY_GRACE: Duration = Duration::from_millis(500);

/// How [`HttpServer`] is set up (`runpython serve`'s flags; the engine's are `runpython mcp`'s).
#[derive(Debug, Clone)]
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
    /// Connections one token may hold (`None`: a quarter of `max_connections`; 0: no limit).
    pub max_connections_per_token: Option<usize>,
    /// Live MCP sessions one token may have (0: no limit).
    pub max_sessions_per_token: usize,
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// A request's body must arrive whole within this of its headers.
    pub body_timeout: Duration,
    /// Bytes each token's tenant may keep in the store (`None`: no quota).
    pub max_stored_bytes_per_token: Option<u64>,
    /// OAuth access tokens, when accepted.
    pub oauth: Option<OAuthConfig>,
}

async fn health(State(state): State<AppState>) -> Response {
    let gate = state.gate();
    let runs = gate.in_flight();
    if gate.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "draining", "runs_in_flight": runs})),
        )
            .into_response()
    } else {
        axum::Json(json!({
            "status": "ok",
            "runs_in_flight": runs,
            "max_runs_in_flight": gate.capacity(),
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

/// The MCP server over Streamable HTTP, bound and ready: [`HttpServer::local_addr`] says where (a
/// port of 0 in [`ServeConfig::bind`] is the system's choice), [`HttpServer::run`] serves.
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    local: SocketAddr,
    app: Router,
    limits: listener::ConnectionLimits,
    gate: Arc<RunGate>,
    sessions_ct: CancellationToken,
    drain_timeout: Duration,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("local", &self.local)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Loads the tokens (and the JWKS), checks the configuration against `engine`, and listens on
    /// [`ServeConfig::bind`]. Each token's calls go to its own tenant of `engine`.
    pub async fn bind(engine: RunPython, config: ServeConfig) -> Result<Self, Error> {
        let tokens = auth::load_tokens(config.tokens_file.as_ref(), config.oauth.is_some())?;
        let oauth = match config.oauth.clone() {
            Some(oauth) => Some(oauth::Verifier::new(oauth).await?),
            None => None,
        };
        if engine.store().is_none() && config.max_stored_bytes_per_token.is_some() {
            return Err(Error::config(
                "--max-stored-bytes-per-token needs a store to count in (--store)",
            ));
        }
        // A call waiting for its turn gets one within a run's timeout: every run ahead of it ends
        // by then.
        let gate = RunGate::new(
            config.max_runs_per_token,
            config.max_runs_in_flight,
            engine.limits().timeout,
        );
        let server = Server::new(engine, Arc::clone(&gate), config.max_stored_bytes_per_token)?;
        let sessions_ct = CancellationToken::new();
        let mut http = StreamableHttpServerConfig::default()
            .with_cancellation_token(sessions_ct.child_token())
            .with_max_request_body_bytes(MAX_LINE_BYTES);
        if !config.allowed_hosts.is_empty() {
            let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
            hosts.extend(config.allowed_hosts.iter().cloned());
            http = http.with_allowed_hosts(hosts);
        } else if !config.bind.ip().is_loopback() {
            // Behind a load balancer the Host header is the service's public name; bearer tokens
            // guard the endpoint, and --allowed-host narrows it again.
            tracing::warn!(
                "bound to {}: any Host header is accepted (pass --allowed-host NAME to check it)",
                config.bind
            );
            http = http.disable_allowed_hosts();
        }
        let owners = sessions::Owners::new(config.max_sessions_per_token);
        let mcp = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(sessions::OwnedSessions::new(Arc::clone(&owners))),
            http,
        );
        let state = AppState::new(tokens, Arc::clone(&gate), oauth);
        // Outermost first: the token, the body whole by its deadline, the session's owner, the
        // host's capacity, then rmcp.
        let app = Router::new()
            .nest_service("/mcp", mcp)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&gate),
                overload::refuse_over_capacity,
            ))
            .layer(axum::middleware::from_fn_with_state(
                owners,
                sessions::bind_sessions,
            ))
            .layer(axum::middleware::from_fn_with_state(
                config.body_timeout,
                body::whole_by_deadline,
            ))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                auth::authenticate,
            ))
            .route("/healthz", get(health))
            .route(
                "/.well-known/oauth-protected-resource",
                get(auth::resource_metadata),
            )
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(auth::resource_metadata),
            )
            .with_state(state);
        let listen_error = |source| Error::Listen {
            addr: config.bind,
            source,
        };
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(listen_error)?;
        let local = listener.local_addr().map_err(listen_error)?;
        let nofile = listener::raise_nofile();
        let limits = listener::ConnectionLimits::within(
            config.max_connections,
            config.max_connections_per_token,
            nofile,
            config.header_timeout,
        );
        tracing::info!(
            max_runs_in_flight = config.max_runs_in_flight,
            open_files = nofile,
            max_connections = limits.slots.max_connections,
            max_unauthenticated = limits.slots.max_unauthenticated,
            max_connections_per_token = limits.slots.max_per_token,
            "serving MCP on http://{local}/mcp (health: http://{local}/healthz)"
        );
        Ok(Self {
            listener,
            local,
            app,
            limits,
            gate,
            sessions_ct,
            drain_timeout: config.drain_timeout,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves until SIGTERM or SIGINT, then drains: new runs are refused, runs in flight get
    /// [`ServeConfig::drain_timeout`], then sessions are closed.
    pub async fn run(self) -> Result<(), Error> {
        let Self {
            listener,
            app,
            limits,
            gate,
            sessions_ct,
            drain_timeout: bound,
            ..
        } = self;
        let drained = CancellationToken::new();
        let drain = {
            let drained = drained.clone();
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
        let server = listener::serve(listener, app, limits, drain);
        tokio::select! {
            () = server => {}
            // Connections that outlive the sessions (a client holding a stream open) get a short
            // grace.
            () = async {
                drained.cancelled().await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            } => tracing::warn!("connections still open 5 s after the drain; closing them"),
        }
        tracing::info!("stopped");
        Ok(())
    }
}
