//! Who may call `/mcp`: bearer tokens (static ones from a file or [`TOKENS_ENV`], compared in
//! constant time; OAuth access tokens through [`super::oauth`]), the 401 that says how to
//! authenticate, and the resource metadata. The token's name becomes the request's
//! [`ClientScope`] (its tenant and its limits), and the connection's slot becomes the token's (429
//! when the token holds its share of connections, all busy). Which MCP session is whose is
//! [`super::sessions`]'.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use subtle::ConstantTimeEq;

use super::listener::Connection;
use super::oauth::{quoted, Refused, Verifier};
use super::slots::Crowded;
use crate::admission::{ClientScope, RunGate};
use crate::Error;

/// The environment variable holding tokens, as `name:token` entries separated by commas or newlines.
pub const TOKENS_ENV: &str = "RUNPYTHON_TOKENS";

/// Shortest token accepted: a guessable token is no authentication.
const MIN_TOKEN_CHARS: usize = 16;

/// Bearer tokens by value's check: name and secret.
#[derive(Clone)]
pub(super) struct Tokens(Arc<Vec<(String, Vec<u8>)>>);

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
fn parse_tokens(text: &str, source: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let mut tokens: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, entry) in text
        .split(['\n', ','])
        .map(str::trim)
        .enumerate()
        .filter(|(_, e)| !e.is_empty() && !e.starts_with('#'))
    {
        let Some((name, secret)) = entry.split_once(':') else {
            return Err(Error::config(format!(
                "{source}: entry {} is not NAME:TOKEN (the name is what logs and limits show)",
                i + 1
            )));
        };
        let (name, secret) = (name.trim(), secret.trim());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Error::config(format!(
                "{source}: token name {name:?} must be letters, digits, '-', '_' or '.'"
            )));
        }
        if secret.chars().count() < MIN_TOKEN_CHARS {
            return Err(Error::config(format!(
                "{source}: the token of {name} is {} characters, under the minimum of {MIN_TOKEN_CHARS}; \
                 make one with e.g. `openssl rand -hex 32`",
                secret.chars().count()
            )));
        }
        if tokens.iter().any(|(n, _)| n == name) {
            return Err(Error::config(format!(
                "{source}: the token name {name} appears twice"
            )));
        }
        tokens.push((name.to_owned(), secret.as_bytes().to_vec()));
    }
    Ok(tokens)
}

pub(super) fn load_tokens(file: Option<&PathBuf>, oauth: bool) -> Result<Tokens, Error> {
    let mut tokens = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::config_because(format!("cannot read the tokens file {}", path.display()), e)
        })?;
        tokens.extend(parse_tokens(&text, &path.display().to_string())?);
    }
    if let Ok(text) = std::env::var(TOKENS_ENV) {
        for (name, secret) in parse_tokens(&text, TOKENS_ENV)? {
            if tokens.iter().any(|(n, _)| *n == name) {
                return Err(Error::config(format!(
                    "the token name {name} is in both the tokens file and {TOKENS_ENV}"
                )));
            }
            tokens.push((name, secret));
        }
    }
    if tokens.is_empty() && !oauth {
        return Err(Error::config(format!(
            "runpython serve needs at least one bearer token: pass --tokens-file FILE or set {TOKENS_ENV} \
             (NAME:TOKEN entries), or accept OAuth access tokens with --jwks"
        )));
    }
    Ok(Tokens(Arc::new(tokens)))
}

#[derive(Clone)]
pub(super) struct AppState {
    tokens: Tokens,
    gate: Arc<RunGate>,
    oauth: Option<Verifier>,
}

impl AppState {
    pub(super) fn new(tokens: Tokens, gate: Arc<RunGate>, oauth: Option<Verifier>) -> Self {
        Self {
            tokens,
            gate,
            oauth,
        }
    }

    /// The gate runs are admitted through (what `/healthz` reports).
    pub(super) fn gate(&self) -> &RunGate {
        &self.gate
    }
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
pub(super) async fn resource_metadata(State(state): State<AppState>, request: Request) -> Response {
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

/// Bearer authentication: the request's [`ClientScope`], and its connection's slot the token's.
pub(super) async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
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
    if let Some(connection) = request.extensions().get::<Arc<Connection>>() {
        if let Err(crowded) = connection.authenticated(&name) {
            tracing::info!(
                tenant = %name,
                connections = crowded.held,
                "refused a request: the token holds its share of connections, all busy"
            );
            return too_many_connections(&name, crowded);
        }
    }
    request.extensions_mut().insert(ClientScope::Token(name));
    next.run(request).await
}

/// 429 for a token holding its share of connections, each in the middle of a request; the
/// connection ends with it.
fn too_many_connections(name: &str, crowded: Crowded) -> Response {
    let message = format!(
        "client {name} already holds {} connections, its share (the server's \
         --max-connections-per-token {}), each in the middle of a request; send this request on one \
         of them once it is answered, or wait",
        crowded.held, crowded.limit
    );
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        axum::Json(json!({"error": {"code": "too_many_connections", "message": message}})),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from(1u64));
    response
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
