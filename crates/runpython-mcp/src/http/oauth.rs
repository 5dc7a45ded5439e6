//! OAuth 2.1 access tokens for `serve`: runpython as a resource server in the MCP authorization spec.
//!
//! - A bearer token that is not one of the static tokens is checked as a JWT against the configured
//!   JWKS (a file, or a URL fetched at start, again every [`JWKS_TTL`], and at once when a token names
//!   a key id the set lacks, at most every [`JWKS_MIN_REFETCH`]): its signature (RS256/384/512,
//!   PS256/384/512, ES256, ES384 or EdDSA, never HMAC: a public key set cannot hold a shared
//!   secret), its expiry and not-before (30 s of leeway), its issuer and its audience. Its tenant is
//!   `jwt:<claim>` (`sub` unless configured otherwise), apart from every static token's name; the
//!   claim must be a string (a number is refused, naming the claim).
//! - A refused request gets a 401 whose `WWW-Authenticate` names the resource metadata URL (and
//!   `error="invalid_token"` when a token was presented), and
//!   `/.well-known/oauth-protected-resource` (also under `/mcp`) describes the server (RFC 9728), as
//!   MCP clients look for it to find the authorization server.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Map, Value};

use crate::error::BoxError;
use crate::Error;

/// A JWKS fetched by URL is fetched again after this.
const JWKS_TTL: Duration = Duration::from_secs(600);
/// A token naming a key the set lacks fetches the set again, at most this often.
const JWKS_MIN_REFETCH: Duration = Duration::from_secs(30);
/// The largest JWKS accepted.
const MAX_JWKS_BYTES: usize = 1 << 20;
/// The longest bearer token looked at as a JWT.
const MAX_TOKEN_BYTES: usize = 16 << 10;
/// The longest tenant claim accepted.
const MAX_CLAIM_BYTES: usize = 200;
/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 30;

/// How access tokens are checked (`--jwks`, `--jwt-issuer`, `--jwt-audience`, `--jwt-tenant-claim`,
/// `--resource-url`).
#[derive(Debug, Clone)]
pub struct OAuthConfig {
    /// The key set: a file path, or an `http(s)://` URL.
    pub jwks: String,
    /// The issuer tokens must name (`iss`), also the authorization server the metadata lists.
    pub issuer: String,
    /// The audience tokens must name (`aud`).
    pub audience: String,
    /// The claim naming the tenant.
    pub tenant_claim: String,
    /// This server's MCP endpoint as clients reach it (the metadata's `resource`); by default the
    /// audience when it is a URL, else `http://<Host>/mcp`.
    pub resource: Option<String>,
}

enum Source {
    File(PathBuf),
    Url(reqwest::Url, reqwest::Client),
}

struct Key {
    kid: Option<String>,
    alg: Option<Algorithm>,
    key: DecodingKey,
}

struct Keys {
    keys: Vec<Key>,
    fetched: Instant,
}

/// Checks access tokens; cheap to clone.
#[derive(Clone)]
pub(crate) struct Verifier {
    inner: Arc<VerifierInner>,
}

struct VerifierInner {
    config: OAuthConfig,
    source: Source,
    keys: RwLock<Keys>,
    refetch: tokio::sync::Mutex<Instant>,
}

/// Why a token was refused: said in `error_description` and the log, never echoing the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) String);

impl Verifier {
    /// Loads the key set (a startup error when it cannot be read or holds no usable key).
    pub(crate) async fn new(config: OAuthConfig) -> Result<Self, Error> {
        for (flag, value) in [
            ("--jwt-issuer", &config.issuer),
            ("--jwt-audience", &config.audience),
            ("--jwt-tenant-claim", &config.tenant_claim),
        ] {
            if value.trim().is_empty() {
                return Err(Error::config(format!("{flag} cannot be empty")));
            }
        }
        if let Some(resource) = &config.resource {
            let url = reqwest::Url::parse(resource).map_err(|e| {
                Error::config_because(format!("--resource-url {resource:?} is not a URL"), e)
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(Error::config(format!(
                    "--resource-url {resource:?} must be an http or https URL"
                )));
            }
        }
        let source = if config.jwks.starts_with("http://") || config.jwks.starts_with("https://") {
            let url = reqwest::Url::parse(&config.jwks).map_err(|e| {
                Error::config_because(format!("--jwks {:?} is not a URL", config.jwks), e)
            })?;
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| {
                    Error::config_because("cannot make the HTTP client that fetches the JWKS", e)
                })?;
            Source::Url(url, client)
        } else {
            Source::File(PathBuf::from(&config.jwks))
        };
        let keys = load(&source).await.map_err(|failure| Error::Config {
            message: format!("cannot load the JWKS {}: {}", config.jwks, failure.reason),
            source: failure.source,
        })?;
        tracing::info!(jwks = %config.jwks, keys = keys.len(), "access tokens accepted");
        Ok(Self {
            inner: Arc::new(VerifierInner {
                config,
                source,
                keys: RwLock::new(Keys {
                    keys,
                    fetched: Instant::now(),
                }),
                // The first token naming a key the set lacks may fetch it again at once.
                refetch: tokio::sync::Mutex::new(
                    Instant::now()
                        .checked_sub(JWKS_MIN_REFETCH)
                        .unwrap_or_else(Instant::now),
                ),
            }),
        })
    }

    /// The tenant `token` is for (`jwt:<claim>`), or why it is refused.
    pub(crate) async fn verify(&self, token: &str) -> Result<String, Refused> {
        if token.len() > MAX_TOKEN_BYTES || token.split('.').count() != 3 {
            return Err(Refused(
                "the bearer token is not one this server accepts".into(),
            ));
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Refused("the token's header is not a JWT header".into()))?;
        if !allowed(header.alg) {
            return Err(Refused(format!(
                "the token is signed with {:?}; this server accepts RS256/384/512, PS256/384/512, ES256, ES384 and EdDSA",
                header.alg
            )));
        }
        self.refresh_if_stale().await;
        let mut key = self.find(header.kid.as_deref(), header.alg);
        if key.is_none() && header.kid.is_some() && self.refetch_for_unknown_kid().await {
            key = self.find(header.kid.as_deref(), header.alg);
        }
        let Some(key) = key else {
            return Err(Refused(
                "no key of the server's JWKS matches the token's key id and algorithm".into(),
            ));
        };
        let config = &self.inner.config;
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_nbf = true;
        validation.set_issuer(&[&config.issuer]);
        validation.set_audience(&[&config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|e| Refused(describe(&e)))?;
        let claim = tenant_claim(&data.claims, &config.tenant_claim)?;
        if claim.is_empty() || claim.len() > MAX_CLAIM_BYTES || claim.chars().any(char::is_control)
        {
            return Err(Refused(format!(
                "the token's {} claim must be 1 to {MAX_CLAIM_BYTES} bytes without control characters",
                config.tenant_claim
            )));
        }
        Ok(format!("jwt:{claim}"))
    }

    /// The key for a token's `kid` and `alg`: the one with that id; without an id, the only key that
    /// fits the algorithm.
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let keys = self.inner.keys.read().unwrap_or_else(|p| p.into_inner());
        let fits = |k: &&Key| k.alg.is_none_or(|a| a == alg) && k.key.family() == alg.family();
        match kid {
            Some(kid) => keys
                .keys
                .iter()
                .filter(fits)
                .find(|k| k.kid.as_deref() == Some(kid))
                .map(|k| k.key.clone()),
            None => {
                let mut fitting = keys.keys.iter().filter(fits);
                match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(only.key.clone()),
                    _ => None,
                }
            }
        }
    }

    /// Fetches a URL's key set again once it is older than [`JWKS_TTL`] (keeping the old one when
    /// the fetch fails).
    async fn refresh_if_stale(&self) {
        if !matches!(self.inner.source, Source::Url(..)) {
            return;
        }
        let stale = self
            .inner
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .fetched
            .elapsed()
            > JWKS_TTL;
        if stale {
            if let Ok(mut last) = self.inner.refetch.try_lock() {
                self.reload(&mut last).await;
            }
        }
    }

    /// A token named a key the set lacks: fetch the set again if the last fetch is old enough.
    async fn refetch_for_unknown_kid(&self) -> bool {
        if !matches!(self.inner.source, Source::Url(..)) {
            return false;
        }
        let mut last = self.inner.refetch.lock().await;
        if last.elapsed() < JWKS_MIN_REFETCH {
            return false;
        }
        self.reload(&mut last).await
    }

    async fn reload(&self, last: &mut Instant) -> bool {
        *last = Instant::now();
        match load(&self.inner.source).await {
            Ok(keys) => {
                *self.inner.keys.write().unwrap_or_else(|p| p.into_inner()) = Keys {
                    keys,
                    fetched: Instant::now(),
                };
                true
            }
            Err(e) => {
                tracing::warn!(jwks = %self.inner.config.jwks, "cannot fetch the JWKS again (keeping the keys held): {e}");
                false
            }
        }
    }

    /// This server's resource identifier, for a request that came with `host`.
    pub(crate) fn resource(&self, host: Option<&str>) -> String {
        let config = &self.inner.config;
        if let Some(resource) = &config.resource {
            return resource.clone();
        }
        if config.audience.starts_with("https://") || config.audience.starts_with("http://") {
            return config.audience.clone();
        }
        format!("http://{}/mcp", host.unwrap_or("localhost"))
    }

    /// Where the resource metadata is for `resource` (RFC 9728: the well-known path inserted
    /// before the resource's path).
    pub(crate) fn metadata_url(&self, host: Option<&str>) -> String {
        let resource = self.resource(host);
        match reqwest::Url::parse(&resource) {
            Ok(url) => {
                let path = url.path().trim_end_matches('/');
                let origin = url.origin().ascii_serialization();
                format!("{origin}/.well-known/oauth-protected-resource{path}")
            }
            Err(_) => resource,
        }
    }

    /// The protected resource metadata document (RFC 9728).
    pub(crate) fn metadata(&self, host: Option<&str>) -> Value {
        json!({
            "resource": self.resource(host),
            "authorization_servers": [self.inner.config.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "runpython",
        })
    }
}

/// The tenant `claims` name by `name`: a string. A number is refused rather than read as its
/// digits (`123` and `"123"` were one tenant) or typed into the tenant's name (`jwt:#123`, a
/// name no operator would look for): a claim naming a principal is a string (`sub` is a
/// StringOrURI, RFC 7519), and an issuer sending a number can be told to send it as one.
fn tenant_claim(claims: &Map<String, Value>, name: &str) -> Result<String, Refused> {
    match claims.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other @ (Value::Number(_) | Value::Bool(_) | Value::Array(_) | Value::Object(_))) => {
            Err(Refused(format!(
                "the token's {name} claim is {other}, not a string; the tenant is named by a \
                 string claim (ask the issuer to send {name} as one)"
            )))
        }
        _ => Err(Refused(format!(
            "the token has no {name} claim (a string) to name its tenant"
        ))),
    }
}

fn allowed(alg: Algorithm) -> bool {
    use Algorithm::{EdDSA, ES256, ES384, PS256, PS384, PS512, RS256, RS384, RS512};
    matches!(
        alg,
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 | ES256 | ES384 | EdDSA
    )
}

fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => "the token expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "the token is for another audience".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not fit the key".into(),
        _ => "the token is not a valid JWT".into(),
    }
}

/// Why a key set could not be loaded: what to say, and the error under it.
struct LoadFailure {
    reason: String,
    source: Option<BoxError>,
}

impl LoadFailure {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            source: None,
        }
    }

    fn because(reason: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            reason: reason.into(),
            source: Some(source.into()),
        }
    }
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)?;
        match &self.source {
            Some(source) => write!(f, ": {}", runpython_core::error_report(source.as_ref())),
            None => Ok(()),
        }
    }
}

/// The usable keys of a JWKS: signature keys of the asymmetric kinds; the others (HMAC secrets,
/// encryption keys, kinds this build does not know) are skipped with a note.
async fn load(source: &Source) -> Result<Vec<Key>, LoadFailure> {
    let bytes = match source {
        Source::File(path) => {
            let bytes = std::fs::read(path)
                .map_err(|e| LoadFailure::because(format!("cannot read {}", path.display()), e))?;
            if bytes.len() > MAX_JWKS_BYTES {
                return Err(LoadFailure::new(format!(
                    "it is {} bytes, over the {MAX_JWKS_BYTES}-byte limit",
                    bytes.len()
                )));
            }
            bytes
        }
        Source::Url(url, client) => {
            let mut response = client
                .get(url.clone())
                .send()
                .await
                .map_err(|e| LoadFailure::because("the request failed", e))?;
            if !response.status().is_success() {
                return Err(LoadFailure::new(format!(
                    "the server answered {}",
                    response.status()
                )));
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| LoadFailure::because("the response broke off", e))?
            {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > MAX_JWKS_BYTES {
                    return Err(LoadFailure::new(format!(
                        "the response is over the {MAX_JWKS_BYTES}-byte limit"
                    )));
                }
            }
            bytes
        }
    };
    let set: Value =
        serde_json::from_slice(&bytes).map_err(|e| LoadFailure::because("it is not JSON", e))?;
    let Some(entries) = set.get("keys").and_then(Value::as_array) else {
        return Err(LoadFailure::new(
            "it is not a JWK set (an object with a \"keys\" array)",
        ));
    };
    let mut keys = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let jwk: Jwk = match serde_json::from_value(entry.clone()) {
            Ok(jwk) => jwk,
            Err(e) => {
                tracing::warn!("JWKS key {i} skipped: not a key this server reads ({e})");
                continue;
            }
        };
        if matches!(
            jwk.common.public_key_use,
            Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
        ) {
            continue;
        }
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(a) => match signing_algorithm(a) {
                Some(a) if allowed(a) => Some(a),
                _ => {
                    tracing::warn!("JWKS key {i} skipped: its algorithm {a:?} is not accepted");
                    continue;
                }
            },
        };
        if matches!(
            jwk.algorithm,
            jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
        ) {
            tracing::warn!(
                "JWKS key {i} skipped: a shared secret has no place in a public key set"
            );
            continue;
        }
        match DecodingKey::from_jwk(&jwk) {
            Ok(key) => keys.push(Key {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
            }),
            Err(e) => tracing::warn!("JWKS key {i} skipped: {e}"),
        }
    }
    if keys.is_empty() {
        return Err(LoadFailure::new(
            "it holds no usable signature key (RSA, EC P-256/P-384 or Ed25519)",
        ));
    }
    Ok(keys)
}

fn signing_algorithm(alg: KeyAlgorithm) -> Option<Algorithm> {
    Some(match alg {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// A value safe inside an HTTP quoted-string.
pub(crate) fn quoted(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() && *c != '"' && *c != '\\')
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_claim_is_a_string_and_a_number_is_refused_naming_the_claim() {
        let claims = |v: Value| Map::from_iter([("sub".to_owned(), v)]);
        assert_eq!(
            tenant_claim(&claims(json!("123")), "sub"),
            Ok("123".to_owned())
        );
        let Refused(why) = tenant_claim(&claims(json!(123)), "sub").unwrap_err();
        assert!(why.contains("sub claim is 123, not a string"), "{why}");
        let Refused(why) = tenant_claim(&Map::new(), "org").unwrap_err();
        assert!(why.contains("no org claim"), "{why}");
    }
}
