//! The secrets proxy end to end on loopback: a client on the run's side, the proxy as the relay
//! would call it, and a recording destination (plaintext or TLS from a test CA, HTTP/1.1 or h2).
//!
//! Why this file is long: one end-to-end scenario per rule the proxy keeps, all on one harness (the
//! destination, the relay's part, the run's clients); split, the harness would be shared anyway.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1 as client1, http2 as client2};
use hyper::header::{self, HeaderMap};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;

const VALUE: &str = "sk-live-THE+real/value=";

/// A secret the operator allowed over plain HTTP too, so that the rewrite is tested on plaintext
/// (`only_verified_tls_gets_a_value_unless_plain_http_is_allowed` tests the default).
fn secret(name: &str, value: &str, hosts: &[&str]) -> Secret {
    let mut secret = Secret::new(
        name,
        value,
        hosts.iter().map(|h| h.parse().unwrap()).collect(),
    );
    secret.over_http = true;
    secret
}

/// The run's secrets; a test CA is always trusted too, so a host without roots runs the tests.
fn run_secrets(secrets: Vec<Secret>, cas: &[Vec<u8>]) -> Arc<RunSecrets> {
    let mut cas = cas.to_vec();
    cas.push(test_ca().0);
    Arc::new(RunSecrets::new(secrets, &cas).unwrap())
}

fn placeholder(secrets: &RunSecrets, name: &str) -> String {
    secrets
        .placeholders()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1
}

/// What the destination received.
#[derive(Debug, Clone)]
struct Seen {
    version: Version,
    target: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A destination on loopback recording every request, answering `200 hello`; with TLS it offers
/// `alpn` and serves HTTP/2 when the client picks it.
async fn destination(tls: Option<(Arc<ServerConfig>, Vec<&'static [u8]>)>) -> (SocketAddr, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Log = Arc::default();
    let acceptor = tls.map(|(config, alpn)| {
        let mut config = (*config).clone();
        config.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
        TlsAcceptor::from(Arc::new(config))
    });
    let seen = Arc::clone(&log);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&seen);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    None => serve_recording(tcp, false, seen).await,
                    Some(acceptor) => {
                        let tls = acceptor.accept(tcp).await.unwrap();
                        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                        serve_recording(tls, h2, seen).await;
                    }
                }
            });
        }
    });
    (addr, log)
}

async fn serve_recording<IO>(io: IO, h2: bool, seen: Log)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes().to_vec();
            seen.lock().unwrap().push(Seen {
                version: parts.version,
                target: parts.uri.to_string(),
                headers: parts.headers,
                body,
            });
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"hello"))))
        }
    });
    let io = TokioIo::new(io);
    if h2 {
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await;
    }
}

/// The relay's part: the run's connection accepted on loopback, the destination connected, and
/// the proxy joining them for `api.test`.
struct Relayed {
    client: TcpStream,
    counters: Arc<Counters>,
    misuses: Arc<Mutex<Vec<Misuse>>>,
    task: tokio::task::JoinHandle<()>,
}

async fn relay(secrets: &Arc<RunSecrets>, destination: SocketAddr) -> Relayed {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (child, _) = listener.accept().await.unwrap();
    let upstream = TcpStream::connect(destination).await.unwrap();
    let counters = Arc::new(Counters::default());
    let misuses: Arc<Mutex<Vec<Misuse>>> = Arc::default();
    let report = Arc::clone(&misuses);
    let misuse: Arc<dyn Fn(Misuse) + Send + Sync> =
        Arc::new(move |m| report.lock().unwrap().push(m));
    let task = tokio::spawn(Arc::clone(secrets).intercept(
        child,
        upstream,
        "api.test".into(),
        destination.port(),
        Arc::clone(&counters),
        misuse,
    ));
    Relayed {
        client,
        counters,
        misuses,
        task,
    }
}

/// A test CA and a server configuration for `api.test` it issued.
fn test_ca() -> (Vec<u8>, Arc<ServerConfig>) {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["api.test".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    (ca.pem().into_bytes(), Arc::new(config))
}

/// The run's TLS: trusting the run's CA only, offering `alpn`, SNI `name`.
async fn tls_client(
    tcp: TcpStream,
    ca_pem: &str,
    alpn: &[&[u8]],
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(name.to_owned()).unwrap(), tcp)
        .await
}

async fn http1<IO>(io: IO) -> client1::SendRequest<Full<Bytes>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = client1::handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(conn);
    send
}

async fn http2<IO>(io: IO) -> client2::SendRequest<Full<Bytes>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = client2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// A GET for `api.test` with these headers (`Host` for HTTP/1.1, the authority for h2).
fn get(target: &str, h2: bool, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut req = if h2 {
        Request::get(format!("https://api.test{target}"))
    } else {
        Request::get(target).header(header::HOST, "api.test")
    };
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::new())).unwrap()
}

async fn text_of(response: Response<Incoming>) -> (StatusCode, String) {
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn header<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.headers.get(name).unwrap().to_str().unwrap()
}

#[tokio::test]
async fn plain_http_gets_bearer_and_basic_credentials_filled_in() {
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[]);
    let ph = placeholder(&secrets, "API_KEY");
    let (addr, log) = destination(None).await;
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;

    let bearer = format!("Bearer {ph}");
    let response = client
        .send_request(get(
            "/v1",
            false,
            &[("authorization", &bearer), ("x-other", "plain")],
        ))
        .await
        .unwrap();
    assert_eq!(text_of(response).await, (StatusCode::OK, "hello".into()));
    let basic = format!("Basic {}", STANDARD.encode(format!("user:{ph}")));
    let response = client
        .send_request(get("/v2", false, &[("authorization", &basic)]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(header(&seen[0], "authorization"), format!("Bearer {VALUE}"));
    assert_eq!(header(&seen[0], "x-other"), "plain");
    assert_eq!(seen[0].target, "/v1");
    let sent = header(&seen[1], "authorization")
        .strip_prefix("Basic ")
        .unwrap();
    assert_eq!(
        STANDARD.decode(sent).unwrap(),
        format!("user:{VALUE}").as_bytes()
    );
    assert!(relayed.misuses.lock().unwrap().is_empty());
    assert!(relayed.counters.sent_so_far() > 0);
    assert!(relayed.counters.received_so_far() > 0);
}

#[tokio::test]
async fn only_verified_tls_gets_a_value_unless_plain_http_is_allowed() {
    let mut tls_only = secret("API_KEY", VALUE, &["api.test"]);
    tls_only.over_http = false;
    // Plaintext: refused before anything is sent, and reported naming the secret, the host and
    // the flag that would allow it.
    let secrets = run_secrets(vec![tls_only.clone()], &[]);
    let bearer = format!("Bearer {}", placeholder(&secrets, "API_KEY"));
    let (addr, log) = destination(None).await;
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;
    let request = get("/", false, &[("authorization", &bearer)]);
    let (status, body) = text_of(client.send_request(request).await.unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("--secret-over-http API_KEY"), "{body}");
    assert!(
        log.lock().unwrap().is_empty(),
        "the plaintext listener got it"
    );
    let misuses = relayed.misuses.lock().unwrap().clone();
    assert_eq!((misuses.len(), misuses[0].host.as_str()), (1, "api.test"));
    assert!(misuses[0].reason.contains("plaintext"), "{misuses:?}");
    // A request without the placeholder passes as it is.
    let relayed = relay(&secrets, addr).await;
    let response = http1(relayed.client)
        .await
        .send_request(get("/", false, &[]));
    assert_eq!(response.await.unwrap().status(), StatusCode::OK);

    // TLS whose certificate the host cannot verify for the host: nothing sent, and reported.
    let (_, unknown) = test_ca();
    let (addr, log) = destination(Some((unknown, vec![b"http/1.1"]))).await;
    let relayed = relay(&secrets, addr).await;
    let tls = tls_client(relayed.client, secrets.ca_pem(), &[b"http/1.1"], "api.test");
    let mut client = http1(tls.await.unwrap()).await;
    let request = get("/", false, &[("authorization", &bearer)]);
    let (status, body) = text_of(client.send_request(request).await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(log.lock().unwrap().is_empty());
    let misuses = relayed.misuses.lock().unwrap().clone();
    assert_eq!(misuses.len(), 1, "{misuses:?}");
    assert!(
        misuses[0]
            .reason
            .starts_with("its value was not sent to api.test:"),
        "{misuses:?}"
    );
    assert!(!misuses[0].reason.contains(VALUE));
}

/// ALPN ids a client offers.
type Alpn = &'static [&'static [u8]];

#[tokio::test]
async fn https_is_intercepted_with_the_run_ca_over_http1_and_h2_either_way() {
    let (ca, server) = test_ca();
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[ca]);
    let ph = placeholder(&secrets, "API_KEY");
    let bearer = format!("Bearer {ph}");
    // (the run's ALPN, the destination's): same version, and each crossing.
    let cases: [(Alpn, Vec<&'static [u8]>, Version); 4] = [
        (&[b"http/1.1"], vec![b"http/1.1"], Version::HTTP_11),
        (&[b"h2"], vec![b"h2", b"http/1.1"], Version::HTTP_2),
        (&[b"h2"], vec![b"http/1.1"], Version::HTTP_11),
        (&[b"http/1.1"], vec![b"h2", b"http/1.1"], Version::HTTP_2),
    ];
    for (run_alpn, dest_alpn, dest_version) in cases {
        let h2 = run_alpn == [b"h2"];
        let (addr, log) = destination(Some((Arc::clone(&server), dest_alpn))).await;
        let relayed = relay(&secrets, addr).await;
        let tls = tls_client(relayed.client, secrets.ca_pem(), run_alpn, "api.test")
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol() == Some(b"h2"), h2);
        let request = get("/v1/models?x=1", h2, &[("authorization", &bearer)]);
        let response = if h2 {
            http2(tls).await.send_request(request).await.unwrap()
        } else {
            http1(tls).await.send_request(request).await.unwrap()
        };
        let case = format!("run h2 {h2}, destination {dest_version:?}");
        assert_eq!(
            text_of(response).await,
            (StatusCode::OK, "hello".into()),
            "{case}"
        );
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{case}");
        assert_eq!(seen[0].version, dest_version, "{case}");
        assert_eq!(header(&seen[0], "authorization"), format!("Bearer {VALUE}"));
        assert!(
            seen[0].target.ends_with("/v1/models?x=1"),
            "{case}: {}",
            seen[0].target
        );
        if dest_version == Version::HTTP_11 {
            assert_eq!(header(&seen[0], "host"), "api.test", "{case}");
        }
    }
}

#[tokio::test]
async fn tls_for_another_name_than_the_destination_is_closed() {
    let (ca, server) = test_ca();
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[ca]);
    let (addr, log) = destination(Some((server, vec![b"http/1.1"]))).await;
    let relayed = relay(&secrets, addr).await;
    let tls = tls_client(
        relayed.client,
        secrets.ca_pem(),
        &[b"http/1.1"],
        "evil.test",
    )
    .await;
    assert!(tls.is_err(), "a handshake for another name must fail");
    relayed.task.await.unwrap();
    assert!(log.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_request_for_another_host_on_the_connection_is_misdirected() {
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[]);
    let (addr, log) = destination(None).await;
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;
    let mut req = get("/", false, &[]);
    req.headers_mut()
        .insert(header::HOST, "evil.test".parse().unwrap());
    let (status, _) = text_of(client.send_request(req).await.unwrap()).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert!(log.lock().unwrap().is_empty());
    assert!(relayed.misuses.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_placeholder_sent_where_its_secret_may_not_go_is_refused_and_reported() {
    let secrets = run_secrets(
        vec![
            secret("API_KEY", VALUE, &["api.test"]),
            secret("OTHER_KEY", "other-value", &["other.test"]),
        ],
        &[],
    );
    let other = placeholder(&secrets, "OTHER_KEY");
    let (addr, log) = destination(None).await;
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;

    let bearer = format!("Bearer {other}");
    let (status, body) = text_of(
        client
            .send_request(get("/", false, &[("authorization", &bearer)]))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body.contains("OTHER_KEY") && body.contains("api.test"),
        "{body}"
    );
    assert!(!body.contains("other-value"), "{body}");

    // In the query, and inside Basic credentials, too (each on a new connection: a 403 closes it).
    for req in [
        get(&format!("/?k={}", other.to_lowercase()), false, &[]),
        get(
            "/",
            false,
            &[(
                "proxy-authorization",
                &format!("basic {}", STANDARD.encode(format!("u:{other}"))),
            )],
        ),
    ] {
        let relayed = relay(&secrets, addr).await;
        let mut client = http1(relayed.client).await;
        let response = client.send_request(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(relayed.misuses.lock().unwrap().len(), 1);
    }

    assert!(
        log.lock().unwrap().is_empty(),
        "the destination saw nothing"
    );
    let misuses = relayed.misuses.lock().unwrap().clone();
    assert_eq!(misuses.len(), 1);
    assert_eq!(misuses[0].secret, "OTHER_KEY");
    assert_eq!(misuses[0].host, "api.test");
    assert_eq!(misuses[0].port, addr.port());
    assert!(misuses[0].reason.contains("other.test"), "{:?}", misuses[0]);
}

#[tokio::test]
async fn after_rotation_only_the_new_placeholder_is_filled_in() {
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[]);
    let old = placeholder(&secrets, "API_KEY");
    secrets.rotate();
    let new = placeholder(&secrets, "API_KEY");
    assert_ne!(old, new);
    assert_eq!(secrets.placeholder_in(old.as_bytes()), Some("API_KEY"));
    assert_eq!(
        secrets.placeholder_in(format!("x.{}.evil.test", new.to_uppercase()).as_bytes()),
        Some("API_KEY")
    );
    assert_eq!(secrets.placeholder_in(b"rp_nothing_here"), None);

    let (addr, log) = destination(None).await;
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;
    let headers = [("x-new", new.as_str()), ("x-old", old.as_str())];
    let response = client
        .send_request(get("/", false, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = log.lock().unwrap().clone();
    assert_eq!(header(&seen[0], "x-new"), VALUE);
    assert_eq!(header(&seen[0], "x-old"), old);
}

#[test]
fn placeholders_look_like_keys_and_are_fresh() {
    let a = random_placeholder().unwrap();
    let b = random_placeholder().unwrap();
    assert_eq!(a.len(), PLACEHOLDER_LEN);
    assert!(a.starts_with("rp_"));
    assert!(a[3..].bytes().all(|c| c.is_ascii_alphanumeric()), "{a}");
    assert_ne!(a, b);
}

#[tokio::test]
async fn the_scanner_finds_a_placeholder_split_across_chunks() {
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[]);
    let ph = placeholder(&secrets, "API_KEY");
    let stream = format!("GET /?k={ph} HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n");
    for split in [1, 8, 10, 30, 50, stream.len() - 1] {
        let mut scanner = secrets.scanner();
        let (a, b) = stream.as_bytes().split_at(split);
        let found = [scanner.feed(a), scanner.feed(b)];
        assert!(
            found.iter().flatten().any(|n| n == "API_KEY"),
            "split at {split}"
        );
    }
    // One byte at a time.
    let mut scanner = secrets.scanner();
    let hits = stream
        .as_bytes()
        .chunks(1)
        .filter_map(|c| scanner.feed(c))
        .count();
    assert_eq!(hits, 1);
    let mut scanner = secrets.scanner();
    assert_eq!(scanner.feed(b"nothing to see"), None);
    assert_eq!(scanner.feed(&ph.as_bytes()[..20]), None);
}

#[tokio::test]
async fn an_upgrade_is_joined_after_the_101() {
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[]);
    let ph = placeholder(&secrets, "API_KEY");
    // A destination that answers any upgrade with 101, then echoes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let head = Arc::new(Mutex::new(String::new()));
    let seen = Arc::clone(&head);
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let request = read_head(&mut tcp).await;
        *seen.lock().unwrap() = request;
        tcp.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
        )
        .await
        .unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => tcp.write_all(&buf[..n]).await.unwrap(),
            }
        }
    });
    let relayed = relay(&secrets, addr).await;
    let mut client = relayed.client;
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\
         Authorization: Bearer {ph}\r\n\r\n"
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let response = read_head(&mut client).await;
    assert!(response.starts_with("HTTP/1.1 101"), "{response}");
    client.write_all(b"ping over the upgrade").await.unwrap();
    let mut echo = [0u8; 21];
    client.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"ping over the upgrade");
    let head = head.lock().unwrap().clone();
    assert!(
        head.contains(&format!("authorization: Bearer {VALUE}")),
        "{head}"
    );
    assert!(!head.contains(&ph), "{head}");
    drop(client);
    tokio::time::timeout(std::time::Duration::from_secs(5), relayed.task)
        .await
        .expect("the connection ends when the run closes its end")
        .unwrap();
}

/// Reads up to the end of an HTTP head.
async fn read_head(tcp: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

#[tokio::test]
async fn query_and_body_substitution_are_opt_in_and_bodies_are_capped() {
    let mut opted = secret("API_KEY", VALUE, &["api.test"]);
    opted.in_query = true;
    opted.body_limit = Some(1024);
    let headers_only = secret("PLAIN_KEY", "plain-value", &["api.test"]);
    let secrets = run_secrets(vec![opted, headers_only], &[]);
    let ph = placeholder(&secrets, "API_KEY");
    let plain = placeholder(&secrets, "PLAIN_KEY");
    let (addr, log) = destination(None).await;
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;

    let body = format!(r#"{{"key":"{ph}","plain":"{plain}"}}"#);
    let req = Request::post(format!("/v1?key={ph}&plain={plain}"))
        .header(header::HOST, "api.test")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    assert_eq!(
        client.send_request(req).await.unwrap().status(),
        StatusCode::OK
    );
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen[0].target,
        format!("/v1?key=sk-live-THE%2Breal%2Fvalue%3D&plain={plain}")
    );
    let expected = format!(r#"{{"key":"{VALUE}","plain":"{plain}"}}"#);
    assert_eq!(String::from_utf8_lossy(&seen[0].body), expected);
    assert_eq!(
        header(&seen[0], "content-length"),
        expected.len().to_string()
    );

    // A chunked body is sent whole, with its length.
    let relayed = relay(&secrets, addr).await;
    let mut raw = relayed.client;
    let chunk = format!("k={ph}");
    let request = format!(
        "POST /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    raw.write_all(request.as_bytes()).await.unwrap();
    let response = read_head(&mut raw).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let seen = log.lock().unwrap().clone();
    assert_eq!(String::from_utf8_lossy(&seen[1].body), format!("k={VALUE}"));
    assert!(!seen[1].headers.contains_key("transfer-encoding"));

    // Over the limit: 413 from the proxy, reported, nothing sent.
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;
    let req = Request::post("/big")
        .header(header::HOST, "api.test")
        .body(Full::new(Bytes::from(vec![b'x'; 2000])))
        .unwrap();
    let (status, body) = text_of(client.send_request(req).await.unwrap()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(log.lock().unwrap().len(), 2);
    let misuses = relayed.misuses.lock().unwrap().clone();
    assert_eq!(misuses.len(), 1);
    assert_eq!(misuses[0].secret, "API_KEY");
    assert_eq!(misuses[0].reason, "body over 1024 bytes");
}

#[tokio::test]
async fn values_appear_in_no_debug_output_refusal_or_report() {
    let secrets = run_secrets(
        vec![
            secret("API_KEY", VALUE, &["api.test"]),
            secret("BAD_KEY", "line\nbreak", &["api.test"]),
            secret("OTHER_KEY", "other-value", &["other.test"]),
        ],
        &[],
    );
    let debug = format!("{secrets:?} {:?}", secret("API_KEY", VALUE, &["api.test"]));
    assert!(
        debug.contains("API_KEY") && debug.contains("api.test"),
        "{debug}"
    );
    assert!(
        !debug.contains(VALUE) && !debug.contains("other-value"),
        "{debug}"
    );

    let (addr, _log) = destination(None).await;
    let mut answers = Vec::new();
    for (name, value) in [
        ("x-bad", placeholder(&secrets, "BAD_KEY")),
        ("x-misplaced", placeholder(&secrets, "OTHER_KEY")),
    ] {
        let relayed = relay(&secrets, addr).await;
        let mut client = http1(relayed.client).await;
        let response = client
            .send_request(get("/", false, &[(name, &value)]))
            .await
            .unwrap();
        let (status, body) = text_of(response).await;
        assert!(status.is_client_error(), "{status} {body}");
        answers.push(body);
        answers.extend(
            relayed
                .misuses
                .lock()
                .unwrap()
                .iter()
                .map(|m| format!("{m:?}")),
        );
    }
    assert_eq!(answers.len(), 3, "{answers:?}");
    for answer in answers {
        for value in [VALUE, "line\nbreak", "other-value"] {
            assert!(!answer.contains(value), "{answer}");
        }
    }
}

#[test]
fn interception_follows_the_secrets_hosts() {
    let secrets = run_secrets(
        vec![
            secret("A", "a", &["api.test:443"]),
            secret("B", "b", &["*.corp.test", "10.0.0.0/8"]),
        ],
        &[],
    );
    let ip = |s: &str| s.parse().unwrap();
    assert!(secrets.intercepts(&["API.test."], ip("1.2.3.4"), 443));
    assert!(!secrets.intercepts(&["api.test"], ip("1.2.3.4"), 80));
    assert!(secrets.intercepts(&["x.corp.test"], ip("1.2.3.4"), 80));
    assert!(!secrets.intercepts(&["corp.test"], ip("1.2.3.4"), 80));
    assert!(secrets.intercepts(&[], ip("10.1.2.3"), 5432));
    assert!(secrets.intercepts(&[], ip("::ffff:10.1.2.3"), 5432));
    assert!(!secrets.intercepts(&[], ip("11.1.2.3"), 5432));
    assert!(secrets.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
}

#[tokio::test]
async fn the_run_side_closes_when_the_destination_closed_its_end() {
    let secrets = run_secrets(vec![secret("API_KEY", VALUE, &["api.test"])], &[]);
    // A destination that answers once (no `Connection: close`) and then closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        read_head(&mut tcp).await;
        tcp.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
    });
    let relayed = relay(&secrets, addr).await;
    let mut client = http1(relayed.client).await;
    let response = client.send_request(get("/", false, &[])).await.unwrap();
    assert_eq!(text_of(response).await, (StatusCode::OK, "ok".into()));
    // The run's client keeps its connection; the proxy ends it, so a pool sees it closed.
    tokio::time::timeout(std::time::Duration::from_secs(5), relayed.task)
        .await
        .expect("the proxy closes the run's end once the destination closed")
        .unwrap();
    assert!(client.ready().await.is_err());
}
