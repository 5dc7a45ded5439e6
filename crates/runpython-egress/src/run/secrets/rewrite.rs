//! What happens to one request on an intercepted connection before it is forwarded: its host is
//! checked against the connection's, misplaced placeholders refuse it, and the current placeholders
//! of the secrets for this host become their values (headers always; query and body opted in).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::request::Parts;
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{StatusCode, Uri};

use super::http::{full, Body, Dest};
use super::{replace_all, Misuse, Secret};

/// Headers that describe one hop, not the message: dropped when a request or response crosses
/// between HTTP/1.1 and HTTP/2.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// A request the proxy answers itself.
#[derive(Debug)]
pub(super) struct Refused {
    /// The answer's status.
    pub(super) status: StatusCode,
    /// The answer's text (never a value).
    pub(super) body: String,
    /// What to report, when the refusal is about a secret.
    pub(super) misuse: Option<Misuse>,
}

impl Refused {
    /// A refusal that reports nothing.
    pub(super) fn plain(status: StatusCode, body: &str) -> Self {
        Self {
            status,
            body: body.to_owned(),
            misuse: None,
        }
    }
}

/// A secret and its current placeholder.
type ForHost<'a> = [(&'a Secret, String)];

/// A request made ready to forward: its body, and the secrets whose values are now in it.
pub(super) struct Rewritten {
    pub(super) body: Body,
    pub(super) filled: Vec<String>,
}

/// Checks and rewrites the request's head, and returns the body to forward. On a plaintext
/// connection only the secrets allowed over plain HTTP are filled in; a placeholder of another
/// secret for this host refuses the request.
pub(super) async fn request(
    dest: &Dest<'_>,
    parts: &mut Parts,
    body: Incoming,
) -> Result<Rewritten, Refused> {
    check_host(dest, parts)?;
    let texts = texts(parts);
    for text in &texts {
        misplaced(dest, text)?;
        if !dest.tls {
            plaintext(dest, text)?;
        }
    }
    let matching: Vec<_> = dest
        .secrets
        .for_host(dest.host, dest.port)
        .into_iter()
        .filter(|(secret, _)| dest.tls || secret.over_http)
        .collect();
    if matching.is_empty() {
        return Ok(Rewritten {
            body: body.boxed(),
            filled: Vec::new(),
        });
    }
    let mut filled = substitute_headers(&mut parts.headers, &matching)?;
    filled.extend(substitute_query(&mut parts.uri, &matching)?);
    let (body, in_body) = substitute_body(dest, &mut parts.headers, body, &matching).await?;
    filled.extend(in_body);
    filled.sort();
    filled.dedup();
    Ok(Rewritten { body, filled })
}

/// A host as compared: lowercase, without a trailing dot or an IPv6 address's brackets.
pub(super) fn normalize_host(host: &str) -> String {
    let host = host.strip_suffix('.').unwrap_or(host);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.to_ascii_lowercase()
}

/// Whether the request asks for an HTTP/1.1 upgrade (`Connection: upgrade` and an `Upgrade`).
pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// Drops the headers that describe one hop (and those `Connection` names).
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect();
    for name in named.iter().map(String::as_str).chain(HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// The request must be for the connection's destination (its target's authority and its `Host`):
/// one connection, one host, so a request cannot ride a secret's connection to another.
fn check_host(dest: &Dest<'_>, parts: &Parts) -> Result<(), Refused> {
    let mut hosts = Vec::new();
    if let Some(authority) = parts.uri.authority() {
        hosts.push(authority.host().to_owned());
    }
    let given = parts.headers.get_all(header::HOST);
    if given.iter().count() > 1 {
        return Err(Refused::plain(
            StatusCode::BAD_REQUEST,
            "runpython: the request has more than one Host header",
        ));
    }
    for value in given {
        let authority = value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<Authority>().ok())
            .ok_or_else(|| {
                Refused::plain(
                    StatusCode::BAD_REQUEST,
                    "runpython: the request's Host header is not a host",
                )
            })?;
        hosts.push(authority.host().to_owned());
    }
    match hosts.iter().find(|h| normalize_host(h) != dest.host) {
        None => Ok(()),
        Some(other) => Err(Refused::plain(
            StatusCode::MISDIRECTED_REQUEST,
            &format!(
                "runpython: this connection is to {}; a request for {other} needs a connection \
                 of its own",
                dest.host
            ),
        )),
    }
}

/// Everything of the head a placeholder could hide in: the target, header names and values, and
/// decoded Basic credentials.
fn texts(parts: &Parts) -> Vec<Vec<u8>> {
    let mut texts = vec![parts.uri.to_string().into_bytes()];
    for (name, value) in &parts.headers {
        texts.push(name.as_str().as_bytes().to_vec());
        texts.push(value.as_bytes().to_vec());
        if is_credentials(name) {
            texts.extend(decode_basic(value.as_bytes()));
        }
    }
    texts
}

/// Refuses (403, reported) a text holding a placeholder of a secret not for this host.
fn misplaced(dest: &Dest<'_>, text: &[u8]) -> Result<(), Refused> {
    let Some(secret) = dest.secrets.misplaced_in(text, dest.host, dest.port) else {
        return Ok(());
    };
    let hosts: Vec<String> = secret.hosts.iter().map(ToString::to_string).collect();
    let hosts = hosts.join(", ");
    Err(Refused {
        status: StatusCode::FORBIDDEN,
        body: format!(
            "runpython: {} is a secret for {hosts}, not for {}:{}; the request was not sent",
            secret.name, dest.host, dest.port
        ),
        misuse: Some(Misuse {
            secret: secret.name.clone(),
            host: dest.host.to_owned(),
            port: dest.port,
            reason: format!(
                "its placeholder was sent to {}:{}, which is not among its hosts ({hosts})",
                dest.host, dest.port
            ),
        }),
    })
}

/// Refuses (403, reported) a plaintext request holding a placeholder of a secret for this host
/// that may go only over TLS: its value would cross the network readable, to whoever answers for
/// the address.
fn plaintext(dest: &Dest<'_>, text: &[u8]) -> Result<(), Refused> {
    let Some(secret) = dest.secrets.tls_only_in(text, dest.host, dest.port) else {
        return Ok(());
    };
    let name = &secret.name;
    Err(Refused {
        status: StatusCode::FORBIDDEN,
        body: format!(
            "runpython: {name} is filled in only over HTTPS whose certificate verifies for {host}; \
             this request to {host}:{port} is plaintext and was not sent (the operator allows \
             plain HTTP for it with --secret-over-http {name})",
            host = dest.host,
            port = dest.port
        ),
        misuse: Some(Misuse {
            secret: name.clone(),
            host: dest.host.to_owned(),
            port: dest.port,
            reason: format!(
                "its placeholder was sent to {}:{} in plaintext; a secret goes only over TLS whose \
                 certificate verifies for its host (--secret-over-http {name} allows plain HTTP); \
                 the request was not sent",
                dest.host, dest.port
            ),
        }),
    })
}

/// Whether the header carries credentials (which may be Basic).
fn is_credentials(name: &header::HeaderName) -> bool {
    name == header::AUTHORIZATION || name == header::PROXY_AUTHORIZATION
}

/// The decoded credentials of `Basic <base64>`.
fn decode_basic(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    STANDARD.decode(token.trim()).ok()
}

/// Fills the secrets into every header value, inside Basic credentials too; the names of those
/// filled in.
fn substitute_headers(
    headers: &mut HeaderMap,
    matching: &ForHost<'_>,
) -> Result<Vec<String>, Refused> {
    let mut filled = Vec::new();
    for (name, value) in headers.iter_mut() {
        let mut bytes = value.as_bytes().to_vec();
        let mut changed = false;
        for (secret, placeholder) in matching {
            if let Some(new) = replace_all(&bytes, placeholder.as_bytes(), secret.value.as_bytes())
            {
                bytes = new;
                changed = true;
                filled.push(secret.name.clone());
            }
        }
        if is_credentials(name) {
            if let Some(mut credentials) = decode_basic(&bytes) {
                let mut inside = false;
                for (secret, placeholder) in matching {
                    if let Some(new) = replace_all(
                        &credentials,
                        placeholder.as_bytes(),
                        secret.value.as_bytes(),
                    ) {
                        credentials = new;
                        inside = true;
                        filled.push(secret.name.clone());
                    }
                }
                if inside {
                    bytes = format!("Basic {}", STANDARD.encode(credentials)).into_bytes();
                    changed = true;
                }
            }
        }
        if changed {
            let mut new = HeaderValue::from_bytes(&bytes).map_err(|_| {
                Refused::plain(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "runpython: a secret's value cannot be written in the {name} header (it \
                         holds a character a header may not); the request was not sent"
                    ),
                )
            })?;
            new.set_sensitive(true);
            *value = new;
        }
    }
    Ok(filled)
}

/// Fills the secrets that opted in into the target's query, percent-encoded; the names of those
/// filled in.
fn substitute_query(uri: &mut Uri, matching: &ForHost<'_>) -> Result<Vec<String>, Refused> {
    let Some((path, query)) = uri
        .path_and_query()
        .and_then(|pq| pq.as_str().split_once('?'))
    else {
        return Ok(Vec::new());
    };
    let mut query = query.as_bytes().to_vec();
    let mut filled = Vec::new();
    for (secret, placeholder) in matching.iter().filter(|(s, _)| s.in_query) {
        let value = percent_encode(secret.value.as_bytes());
        if let Some(new) = replace_all(&query, placeholder.as_bytes(), value.as_bytes()) {
            query = new;
            filled.push(secret.name.clone());
        }
    }
    if filled.is_empty() {
        return Ok(filled);
    }
    let invalid = || Refused::plain(StatusCode::BAD_REQUEST, "runpython: invalid request target");
    let mut target = format!("{path}?").into_bytes();
    target.extend_from_slice(&query);
    let target = PathAndQuery::try_from(target).map_err(|_| invalid())?;
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(target);
    *uri = Uri::from_parts(parts).map_err(|_| invalid())?;
    Ok(filled)
}

/// Every byte but the unreserved ones as `%XX`.
fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Buffers the body, when a secret for this host opted in to bodies, and fills those secrets in
/// (with the names of those filled in); a body over the largest such limit is refused (413,
/// reported).
async fn substitute_body(
    dest: &Dest<'_>,
    headers: &mut HeaderMap,
    mut body: Incoming,
    matching: &ForHost<'_>,
) -> Result<(Body, Vec<String>), Refused> {
    let Some((limit, secret)) = matching
        .iter()
        .filter_map(|(s, _)| s.body_limit.map(|limit| (limit, s)))
        .max_by_key(|(limit, _)| *limit)
    else {
        return Ok((body.boxed(), Vec::new()));
    };
    if body.is_end_stream() {
        return Ok((body.boxed(), Vec::new()));
    }
    let over = || Refused {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        body: format!(
            "runpython: {} is filled into request bodies of up to {limit} bytes; this one is \
             larger and was not sent",
            secret.name
        ),
        misuse: Some(Misuse {
            secret: secret.name.clone(),
            host: dest.host.to_owned(),
            port: dest.port,
            reason: format!("body over {limit} bytes"),
        }),
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(over());
    }
    let mut buffered = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Refused::plain(
                StatusCode::BAD_REQUEST,
                &format!("runpython: reading the request body failed: {e}"),
            )
        })?;
        // Trailers are dropped: the body is sent whole, with its length.
        if let Ok(data) = frame.into_data() {
            if buffered.len() + data.len() > limit {
                return Err(over());
            }
            buffered.extend_from_slice(&data);
        }
    }
    misplaced(dest, &buffered)?;
    let mut filled = Vec::new();
    for (secret, placeholder) in matching {
        if secret.body_limit.is_some_and(|l| buffered.len() <= l) {
            if let Some(new) =
                replace_all(&buffered, placeholder.as_bytes(), secret.value.as_bytes())
            {
                buffered = new;
                filled.push(secret.name.clone());
            }
        }
    }
    headers.remove(header::TRANSFER_ENCODING);
    headers.remove(header::TRAILER);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(buffered.len()));
    Ok((full(Bytes::from(buffered)), filled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_percent_encoded_in_a_query() {
        assert_eq!(percent_encode(b"a+b/c=d e~"), "a%2Bb%2Fc%3Dd%20e~");
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("close, x-hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key(header::ACCEPT));
    }

    #[test]
    fn basic_credentials_decode_whatever_the_scheme_case() {
        let token = STANDARD.encode("user:pw");
        assert_eq!(
            decode_basic(format!("bAsIc {token}").as_bytes()).as_deref(),
            Some(&b"user:pw"[..])
        );
        assert_eq!(decode_basic(b"Bearer abc"), None);
    }
}
