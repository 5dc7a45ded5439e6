//! Secrets as configuration: what one is, and whether a policy allows the hosts its secrets are for
//! (checked before any run starts, so a secret that could never be used is a configuration error
//! instead of a run's surprise). The egress puts them to use (`egress::secrets`).

use std::fmt;

use super::pattern::{is_below, Host};
use super::{HostPattern, NetworkPolicy, ALLOW_HOST_FLAG, ALLOW_NETWORK_FLAG};

/// A credential the code may use but never read (`Debug` prints the name and hosts, never the value).
#[derive(Clone)]
pub struct Secret {
    /// The environment variable the run sees (holding a placeholder).
    pub name: String,
    /// The real value, held by the host only.
    pub value: String,
    /// Where it may be sent.
    pub hosts: Vec<HostPattern>,
    /// Also substitute it in the query string of a request's target (opt-in).
    pub in_query: bool,
    /// Also substitute it in request bodies up to this many bytes (opt-in); a larger body to one of
    /// its hosts is refused with 413 and reported.
    pub body_limit: Option<usize>,
    /// Also substitute it in plaintext HTTP to its hosts (opt-in: `--secret-over-http`). By
    /// default it goes only over TLS whose certificate verifies for the host; a plaintext request
    /// holding its placeholder is refused with 403 and reported.
    pub over_http: bool,
}

impl Secret {
    /// A secret substituted in headers only.
    pub fn new(name: impl Into<String>, value: impl Into<String>, hosts: Vec<HostPattern>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            hosts,
            in_query: false,
            body_limit: None,
            over_http: false,
        }
    }

    /// Whether the secret may be sent to `host` (a name or an address) at `port`.
    pub fn matches_host(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|p| p.matches_host(host, port))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self.hosts.iter().map(ToString::to_string).collect();
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<hidden>")
            .field("hosts", &hosts)
            .field("in_query", &self.in_query)
            .field("body_limit", &self.body_limit)
            .field("over_http", &self.over_http)
            .finish()
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.value == other.value
            && self.hosts == other.hosts
            && self.in_query == other.in_query
            && self.body_limit == other.body_limit
            && self.over_http == other.over_http
    }
}

impl Eq for Secret {}

impl NetworkPolicy {
    /// Checks every secret: a valid environment variable name, used once, with at least one host,
    /// each host a name or `*.name` (its HTTPS is intercepted under that name, so never an address)
    /// that this policy allows. The message says what to change; it never holds a value.
    pub fn check_secrets(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for secret in &self.secrets {
            let name = &secret.name;
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "secret {name:?}: its name is the environment variable the code reads, so it \
                     must be letters, digits and underscores, not starting with a digit"
                ));
            }
            if !seen.insert(name.as_str()) {
                return Err(format!("secret {name} is declared twice; declare it once"));
            }
            if secret.value.is_empty() {
                return Err(format!(
                    "secret {name} has an empty value; set the variable it is read from"
                ));
            }
            if secret.hosts.is_empty() {
                return Err(format!(
                    "secret {name} names no host; say where it may be sent, as {name}:api.example.com"
                ));
            }
            for host in &secret.hosts {
                self.allows_secret_host(host)
                    .map_err(|why| format!("secret {name}: {why}"))?;
            }
        }
        Ok(())
    }

    fn allows_secret_host(&self, host: &HostPattern) -> Result<(), String> {
        let covered = |candidate: &HostPattern| {
            let ports = match (candidate.port, host.port) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            ports
                && match (&candidate.host, &host.host) {
                    (Host::Name(a), Host::Name(b)) => a == b,
                    (Host::Subdomains(parent), Host::Name(b)) => is_below(b, parent),
                    (Host::Subdomains(a), Host::Subdomains(b)) => a == b || is_below(b, a),
                    _ => false,
                }
        };
        match &host.host {
            Host::Net(_) => Err(format!(
                "{host} is an address; a secret's hosts are names (its HTTPS is checked and \
                 intercepted under the name), as api.example.com or *.example.com"
            )),
            _ if self.public || self.allow.iter().any(covered) => Ok(()),
            _ => Err(format!(
                "it is for {host}, which the network policy does not allow; add \
                 {ALLOW_HOST_FLAG} {host} (or {ALLOW_NETWORK_FLAG})"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> NetworkPolicy {
        NetworkPolicy::allowing(allow.iter().copied()).unwrap_or_default()
    }

    fn secret(hosts: &[&str]) -> Secret {
        Secret::new(
            "API_KEY",
            "sk-value",
            hosts.iter().filter_map(|h| h.parse().ok()).collect(),
        )
    }

    #[test]
    fn a_secret_must_be_for_hosts_the_policy_allows() {
        let mut p = policy(&["api.example.com", "*.corp.test:443"]);
        for (hosts, ok) in [
            (&["api.example.com"][..], true),
            (&["api.example.com:443"][..], true),
            (&["db.corp.test"][..], true),
            (&["db.corp.test:443"][..], true),
            (&["db.corp.test:80"][..], false),
            (&["*.corp.test"][..], true),
            (&["*.eu.corp.test"][..], true),
            (&["other.example.com"][..], false),
            (&["api.example.com", "other.example.com"][..], false),
            (&["127.0.0.1"][..], false),
        ] {
            p.secrets = vec![secret(hosts)];
            let checked = p.check_secrets();
            assert_eq!(checked.is_ok(), ok, "{hosts:?}: {checked:?}");
            if let Err(why) = checked {
                assert!(!why.contains("sk-value"), "{why}");
            }
        }
    }

    #[test]
    fn public_mode_allows_any_name_but_never_an_address() {
        let mut p = NetworkPolicy::public_internet();
        p.secrets = vec![secret(&["api.anthropic.com"])];
        assert!(p.check_secrets().is_ok());
        p.secrets = vec![secret(&["10.0.0.0/8"])];
        assert!(p.check_secrets().is_err());
    }

    #[test]
    fn names_empty_values_and_duplicates_are_refused() {
        let mut p = NetworkPolicy::public_internet();
        let mut bad = secret(&["api.example.com"]);
        bad.name = "1KEY".into();
        p.secrets = vec![bad];
        assert!(p.check_secrets().is_err());
        let mut empty = secret(&["api.example.com"]);
        empty.value.clear();
        p.secrets = vec![empty];
        assert!(p.check_secrets().is_err());
        p.secrets = vec![secret(&["api.example.com"]), secret(&["api.example.com"])];
        assert!(p.check_secrets().unwrap_err().contains("twice"));
        p.secrets = vec![secret(&[])];
        assert!(p.check_secrets().unwrap_err().contains("no host"));
    }
}
