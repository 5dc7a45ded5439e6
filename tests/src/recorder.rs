//! A loopback HTTP server that records every request head it gets, plain or over TLS with a
//! certificate from a test CA: what the secrets suite and bench check substitutions against.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A test CA and what it signed for a set of names.
#[derive(Debug)]
pub struct TestCa {
    /// The CA's certificate (PEM): what clients and the host's upstream TLS trust.
    pub ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl TestCa {
    /// A CA and one server certificate for `names`.
    pub fn new(names: &[&str]) -> Result<TestCa, BoxError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "runpython recorder CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(TestCa {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes the CA, its certificate and key into `dir` (as `NAME-ca.pem`, `NAME-cert.pem`,
    /// `NAME-key.pem`), for another process to [`TestCa::load`].
    pub fn save(&self, dir: &Path, name: &str) -> std::io::Result<()> {
        std::fs::write(dir.join(format!("{name}-ca.pem")), &self.ca_pem)?;
        std::fs::write(dir.join(format!("{name}-cert.pem")), &self.cert_pem)?;
        std::fs::write(dir.join(format!("{name}-key.pem")), &self.key_pem)
    }

    /// What [`TestCa::save`] wrote.
    pub fn load(dir: &Path, name: &str) -> std::io::Result<TestCa> {
        let read = |part: &str| std::fs::read_to_string(dir.join(format!("{name}-{part}.pem")));
        Ok(TestCa {
            ca_pem: read("ca")?,
            cert_pem: read("cert")?,
            key_pem: read("key")?,
        })
    }
}

/// A running recorder.
#[derive(Debug)]
pub struct Recorder {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    /// Starts one on 127.0.0.1 (TLS with `ca`'s certificate when given). Each request gets
    /// `200 OK` with the body `ok`, on a kept-alive connection.
    pub async fn start(ca: Option<&TestCa>) -> Result<Recorder, BoxError> {
        Self::start_at(SocketAddr::from(([127, 0, 0, 1], 0)), ca, None).await
    }

    /// Starts one on `addr`, each request also appended to `file` (a JSON string per line: see
    /// [`Recorder::kept`]) when given, for another process to read.
    pub async fn start_at(
        addr: SocketAddr,
        ca: Option<&TestCa>,
        file: Option<PathBuf>,
    ) -> Result<Recorder, BoxError> {
        let listener = TcpListener::bind(addr).await?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let acceptor = match ca {
            Some(ca) => {
                let certs = rustls_pemfile(&ca.cert_pem)?;
                let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::try_from(pem_body(
                    &ca.key_pem,
                    "PRIVATE KEY",
                )?)?;
                let provider =
                    Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
                let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()?
                    .with_no_client_auth()
                    .with_single_cert(certs, key)?;
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
            }
            None => None,
        };
        let log = Log {
            seen: Arc::clone(&seen),
            file: file.map(Arc::new),
        };
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let log = log.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                serve(tls, log).await;
                            }
                        }
                        None => serve(stream, log).await,
                    }
                });
            }
        });
        Ok(Recorder { port, seen, task })
    }

    /// Every request head so far (request line and headers, as received).
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// What a recorder kept in `file` (none when it has not been written).
    pub fn kept(file: &Path) -> Vec<String> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

/// Where a recorder keeps what it saw.
#[derive(Clone)]
struct Log {
    seen: Arc<Mutex<Vec<String>>>,
    file: Option<Arc<PathBuf>>,
}

impl Log {
    fn push(&self, request: String) {
        if let Some(file) = &self.file {
            use std::io::Write as _;
            let line = serde_json::Value::String(request.clone()).to_string();
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(file.as_path())
            {
                let _ = writeln!(f, "{line}");
            }
        }
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(request);
        }
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, log: Log) {
    let mut have = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        have.extend_from_slice(&buf[..n]);
        while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&have[..end]).into_owned();
            // Bodies are read by their length and kept after the head.
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            while have.len() < end + 4 + len {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => have.extend_from_slice(&buf[..n]),
                }
            }
            let body = String::from_utf8_lossy(&have[end + 4..end + 4 + len]).into_owned();
            have.drain(..end + 4 + len);
            log.push(format!("{head}\r\n\r\n{body}"));
            let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            if stream.write_all(reply).await.is_err() {
                return;
            }
        }
    }
}

/// The DER of the first PEM block labelled `label`.
fn pem_body(pem: &str, label: &str) -> Result<Vec<u8>, BoxError> {
    use base64::Engine as _;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin).ok_or("no PEM block")? + begin.len();
    let stop = pem[start..].find(&end).ok_or("an unterminated PEM block")? + start;
    let text: String = pem[start..stop].split_whitespace().collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(text)?)
}

fn rustls_pemfile(
    pem: &str,
) -> Result<Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>, BoxError> {
    Ok(vec![pem_body(pem, "CERTIFICATE")?.into()])
}
