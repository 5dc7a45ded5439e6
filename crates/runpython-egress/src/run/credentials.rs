//! A run's secrets, as the rest of the host sees them: what the runner puts in the code's
//! environment (a placeholder per secret, the trust variables naming the run's bundle), the bundle
//! itself (the host's roots plus the run's own CA), and where a misuse is reported.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use super::secrets::{Misuse, RunSecrets};
use super::{Egress, Shared};

/// Where the runner writes the run's trust bundle (in the run's own `/tmp`), read-only.
pub(crate) const TRUST_BUNDLE_PATH: &str = "/tmp/.runpython-trust.pem";

/// The trust bundle a run with secrets gets, as its runner writes it: where (read-only), and the PEM
/// (the host's roots and the run's own CA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrustBundle {
    /// Where the runner writes it (`/tmp/.runpython-trust.pem`, which the trust variables name).
    pub path: &'static str,
    /// The host's roots, then the run's CA.
    pub pem: String,
}

/// What a run's or cell's runner gets for its secrets: the environment for the code (its request's
/// variables, then each secret's placeholder and the trust variables) and the trust bundle to write
/// (`None` without secrets). The runner's only: never part of the request's own `env`, so neither
/// memo keys nor journals hold a placeholder.
pub fn runner_env(
    request_env: &BTreeMap<String, String>,
    egress: Option<&Egress>,
) -> (BTreeMap<String, String>, Option<TrustBundle>) {
    let mut env = request_env.clone();
    let Some(egress) = egress else {
        return (env, None);
    };
    let Some(pem) = egress.trust_bundle() else {
        return (env, None);
    };
    env.extend(egress.secret_env());
    (
        env,
        Some(TrustBundle {
            path: TRUST_BUNDLE_PATH,
            pem,
        }),
    )
}

/// The variables TLS clients read their roots from, each set to [`TRUST_BUNDLE_PATH`] in a run
/// with secrets: OpenSSL (Python's `ssl`, curl), requests, curl, Node and pip.
const TRUST_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
];

/// The host's roots as PEM: its `SSL_CERT_FILE`, else the first system bundle found (Debian,
/// Fedora, Alpine, macOS layouts); empty when none is (the run then trusts its own CA only).
fn host_roots() -> &'static str {
    static ROOTS: OnceLock<String> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let configured = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
        configured
            .into_iter()
            .chain(
                [
                    "/etc/ssl/certs/ca-certificates.crt",
                    "/etc/pki/tls/certs/ca-bundle.crt",
                    "/etc/ssl/ca-bundle.pem",
                    "/etc/ssl/cert.pem",
                ]
                .map(std::path::PathBuf::from),
            )
            .find_map(|path| std::fs::read_to_string(path).ok())
            .unwrap_or_default()
    })
}

impl Shared {
    /// Logs a request or connection that carried a placeholder where its secret may not go.
    pub(crate) fn misuse(&self, ip: IpAddr, misuse: Misuse) {
        self.refused(
            "secret",
            Some(misuse.host),
            ip,
            misuse.port,
            format!("secret {}: {}", misuse.secret, misuse.reason),
        );
    }

    /// A callback reporting misuses on a connection to `ip`.
    pub(crate) fn misuse_reporter(
        self: &Arc<Self>,
        ip: IpAddr,
    ) -> Arc<dyn Fn(Misuse) + Send + Sync> {
        let shared = Arc::clone(self);
        Arc::new(move |misuse| shared.misuse(ip, misuse))
    }
}

impl Egress {
    fn run_secrets(&self) -> Option<&Arc<RunSecrets>> {
        self.shared.secrets.as_ref()
    }

    /// What the runner adds to the code's environment for this run or cell: each secret's
    /// placeholder under its name, and the trust variables naming [`TRUST_BUNDLE_PATH`]. Empty
    /// without secrets.
    fn secret_env(&self) -> Vec<(String, String)> {
        let Some(secrets) = self.run_secrets() else {
            return Vec::new();
        };
        let mut env = secrets.placeholders();
        env.extend(
            TRUST_VARIABLES
                .iter()
                .map(|name| ((*name).to_owned(), TRUST_BUNDLE_PATH.to_owned())),
        );
        env
    }

    /// The run's trust bundle: the host's roots and the run's CA, which signs the certificates the
    /// host shows for a secret's hosts. `None` without secrets.
    fn trust_bundle(&self) -> Option<String> {
        let secrets = self.run_secrets()?;
        let roots = host_roots();
        let sep = if roots.is_empty() || roots.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        Some(format!("{roots}{sep}{}", secrets.ca_pem()))
    }

    /// New placeholders for what runs next (a session's cell): the previous ones are no longer
    /// replaced by the value.
    pub fn rotate_secrets(&self) {
        if let Some(secrets) = self.run_secrets() {
            secrets.rotate();
        }
    }
}
