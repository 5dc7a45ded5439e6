//! TLS for intercepted connections: the run's own CA with a leaf certificate per name (cached), and
//! the host's client configuration for the destinations.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use tokio_rustls::rustls::crypto::{aws_lc_rs, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};

/// ALPN id of HTTP/2.
pub(super) const H2: &[u8] = b"h2";
/// ALPN id of HTTP/1.1.
pub(super) const HTTP1: &[u8] = b"http/1.1";

/// Days a certificate is valid before today (clocks differ).
const VALID_BEFORE_DAYS: i64 = 1;
/// Days a certificate is valid after today (a run or session is far shorter).
const VALID_AFTER_DAYS: i64 = 90;

/// Leaf configurations kept per run; past them, the cache starts again (a run naming this many
/// hosts is unusual, and a miss only costs a signature).
const MAX_LEAVES: usize = 256;

/// The crypto provider both directions use (chosen explicitly: the process may build others too).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(aws_lc_rs::default_provider())
}

/// A CA of the run's own, whose key never leaves the host, and the leaves it issued.
pub(super) struct RunCa {
    /// The CA certificate, PEM.
    pem: String,
    /// Its name and key, which sign the leaves.
    issuer: Issuer<'static, KeyPair>,
    /// A server configuration per name served.
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl RunCa {
    /// A fresh CA (ECDSA P-256).
    pub(super) fn new() -> Result<Self, String> {
        let key = KeyPair::generate().map_err(|e| format!("cannot make the run's CA key: {e}"))?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "runpython run CA");
        name.push(DnType::OrganizationName, "runpython");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params);
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("cannot make the run's CA certificate: {e}"))?;
        Ok(Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub(super) fn pem(&self) -> &str {
        &self.pem
    }

    /// The server configuration presenting a leaf for `name` (a DNS name or an address), ALPN h2
    /// and HTTP/1.1.
    pub(super) fn server_config(&self, name: &str) -> Result<Arc<ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(name) {
            return Ok(Arc::clone(config));
        }
        let config = Arc::new(self.issue(name)?);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name.to_owned(), Arc::clone(&config));
        Ok(config)
    }

    /// A fresh leaf for `name` (its own P-256 key), in a server configuration.
    fn issue(&self, name: &str) -> Result<ServerConfig, String> {
        let fail =
            |e: &dyn std::fmt::Display| format!("cannot issue a certificate for {name}: {e}");
        let key = KeyPair::generate().map_err(|e| fail(&e))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.subject_alt_names = vec![match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.try_into().map_err(|e| fail(&e))?),
        }];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params);
        let cert = params.signed_by(&key, &self.issuer).map_err(|e| fail(&e))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .map_err(|e| fail(&e))?;
        config.alpn_protocols = vec![H2.to_vec(), HTTP1.to_vec()];
        Ok(config)
    }
}

/// The host's TLS to the destinations: its native roots (`SSL_CERT_FILE` honoured) and the extra CAs.
pub(super) struct UpstreamTls {
    /// Offering h2 and HTTP/1.1.
    pub(super) any: Arc<ClientConfig>,
    /// Offering HTTP/1.1 only (a connection whose first request is an upgrade).
    pub(super) http1: Arc<ClientConfig>,
}

impl UpstreamTls {
    /// Client configurations trusting the host's roots and every certificate in `extra_pems`.
    pub(super) fn new(extra_pems: &[Vec<u8>]) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        // Unreadable or unparsable host roots are skipped (as reqwest does); the extra CAs still hold.
        let _ = roots.add_parsable_certificates(native.certs);
        for (index, pem) in extra_pems.iter().enumerate() {
            let mut added = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| {
                    format!(
                        "upstream CA bundle {} is not PEM certificates: {e}",
                        index + 1
                    )
                })?;
                roots.add(cert).map_err(|e| {
                    format!(
                        "upstream CA bundle {} holds a bad certificate: {e}",
                        index + 1
                    )
                })?;
                added += 1;
            }
            if added == 0 {
                return Err(format!(
                    "upstream CA bundle {} holds no PEM certificate",
                    index + 1
                ));
            }
        }
        if roots.is_empty() {
            return Err(
                "no trusted roots for the destinations: the host has none readable \
                        (set SSL_CERT_FILE to a PEM bundle) and no extra CA was given"
                    .into(),
            );
        }
        let roots = Arc::new(roots);
        let config = |alpn: Vec<Vec<u8>>| -> Result<Arc<ClientConfig>, String> {
            let mut config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("cannot configure TLS to the destinations: {e}"))?
                .with_root_certificates(Arc::clone(&roots))
                .with_no_client_auth();
            config.alpn_protocols = alpn;
            Ok(Arc::new(config))
        };
        Ok(Self {
            any: config(vec![H2.to_vec(), HTTP1.to_vec()])?,
            http1: config(vec![HTTP1.to_vec()])?,
        })
    }
}

/// Valid from yesterday for [`VALID_AFTER_DAYS`].
fn set_validity(params: &mut CertificateParams) {
    let today = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| (d.as_secs() / 86_400) as i64);
    let date = |days: i64| {
        let (y, m, d) = civil_from_days(days);
        rcgen::date_time_ymd(y, m, d)
    };
    params.not_before = date(today - VALID_BEFORE_DAYS);
    params.not_after = date(today + VALID_AFTER_DAYS);
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month as u8, day as u8)
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn day_counts_become_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }
}
