//! What installs may do, whoever asks: the sandbox they run in, the network of the installer's own
//! configuration, what they read, which packages may be built from source and which installed.

use std::path::{Path, PathBuf};

use crate::job::installer_env;
use crate::requirement::{normalize_name, Requirement};
use crate::Error;

/// What installs may do, whoever asks: the sandbox they run in (its limits are the install's), which
/// packages may be built from source, and which the code may install at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPolicy {
    /// The sandbox every installer runs in ([`InstallPolicy::default_sandbox`]).
    pub sandbox: runpython_egress::Sandbox,
    /// Any package may be built from source (`--allow-source-builds`); by default only the
    /// operator's requirements ([`Source::Operator`](crate::Source::Operator)) may be, and everything else installs wheels.
    pub source_builds: bool,
    /// The distributions (PEP 503 names) the code may ask for; `None` allows any. The operator's
    /// requirements are always allowed; what an allowed package depends on comes with it.
    pub allowed_packages: Option<Vec<String>>,
}

impl Default for InstallPolicy {
    fn default() -> Self {
        Self {
            sandbox: Self::default_sandbox(),
            source_builds: false,
            allowed_packages: None,
        }
    }
}

impl InstallPolicy {
    /// Every layer a run gets, with the network of the installer's own configuration only (its
    /// indexes and find-links, PyPI and its file host by default, the operator's `name @ URL`
    /// requirements' hosts: see [`install_network`]), 2 GiB of scratch for the install and the
    /// installer's cache, 4 GiB of memory in all (the scratch's pages included), 512 processes and
    /// threads.
    pub fn default_sandbox() -> runpython_egress::Sandbox {
        runpython_egress::Sandbox {
            // The index hosts are added for each install (an empty allowlist until then).
            network: runpython_egress::Network::Policy(runpython_egress::NetworkPolicy::default()),
            disk_bytes: 2 << 30,
            run_memory_bytes: 4 << 30,
            memory_bytes: 16 << 30,
            file_size_bytes: 2 << 30,
            open_files: 4096,
            processes: 512,
            ..runpython_egress::Sandbox::default()
        }
    }

    /// Refuses a requirement the code asked for that the allowlist does not name.
    pub(crate) fn check(&self, requirements: &[Requirement]) -> Result<(), Error> {
        let Some(allowed) = &self.allowed_packages else {
            return Ok(());
        };
        for r in requirements {
            if !r.source().is_operator() && !allowed.iter().any(|a| normalize_name(a) == r.name()) {
                return Err(Error::NotAllowed {
                    package: r.name().to_owned(),
                    asked_by: r.source().clone(),
                });
            }
        }
        Ok(())
    }
}

/// The network an install gets: with a policy, the policy plus exactly the hosts of the installer's
/// own configuration (`UV_DEFAULT_INDEX`, `UV_INDEX_URL`, `UV_INDEX`, `UV_EXTRA_INDEX_URL`,
/// `UV_FIND_LINKS`, `PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`, `PIP_FIND_LINKS`; PyPI and
/// `files.pythonhosted.org` when no index replaces it) and the hosts of the operator's `name @ URL`
/// requirements (never the code's). Off or the host's network: as configured.
pub fn install_network(
    configured: &runpython_egress::Network,
    requirements: &[Requirement],
) -> runpython_egress::Network {
    use runpython_egress::{HostPattern, Network};
    let Network::Policy(policy) = configured else {
        return configured.clone();
    };
    let env: Vec<(String, String)> = installer_env()
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let var = |name: &str| {
        env.iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    let urls = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .flat_map(|n| var(n))
            .flat_map(|v| v.split(|c: char| c.is_whitespace() || c == ','))
            // `name=url` entries of UV_INDEX.
            .map(|entry| {
                entry
                    .rsplit_once('=')
                    .map_or(entry, |(_, url)| url)
                    .to_owned()
            })
            .filter(|url| !url.is_empty())
            .collect()
    };
    let mut sources = urls(&["UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"]);
    if sources.is_empty() {
        sources.push("https://pypi.org/simple".into());
    }
    sources.extend(urls(&[
        "UV_INDEX",
        "UV_EXTRA_INDEX_URL",
        "UV_FIND_LINKS",
        "PIP_EXTRA_INDEX_URL",
        "PIP_FIND_LINKS",
    ]));
    sources.extend(
        requirements
            .iter()
            .filter(|r| r.source().is_operator())
            .filter_map(|r| r.url().map(str::to_owned)),
    );
    let mut allow = policy.allow.clone();
    for url in sources {
        let Some(pattern) = host_of_url(&url) else {
            continue;
        };
        if pattern.starts_with("pypi.org:") {
            // PyPI's files live on their own host.
            if let Ok(files) = "files.pythonhosted.org:443".parse::<HostPattern>() {
                allow.push(files);
            }
        }
        if let Ok(pattern) = pattern.parse::<HostPattern>() {
            allow.push(pattern);
        }
    }
    allow.dedup();
    Network::Policy(runpython_egress::NetworkPolicy {
        allow,
        ..policy.clone()
    })
}

/// `host:port` of an `http(s)://` URL (the scheme's port when it names none); `None` for anything
/// else (a path, `file://`).
fn host_of_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.is_empty() {
        return None;
    }
    // `[v6]:port`, `[v6]`, `host:port`, `host`.
    let has_port = match hostport.rsplit_once(':') {
        Some((host, port)) => {
            port.parse::<u16>().is_ok() && (!host.contains(':') || host.ends_with(']'))
        }
        None => false,
    };
    Some(if has_port {
        hostport.to_ascii_lowercase()
    } else {
        format!("{}:{default}", hostport.to_ascii_lowercase())
    })
}

/// What an install reads besides the system, the interpreter and the installer: the local paths in
/// the installer's own configuration (indexes and find-links as paths or `file://` URLs, CA bundles,
/// configuration files) and the operator's `name @ file://` requirements. Never a path the code
/// named: its requirements' URLs are not read.
pub(crate) fn install_reads(requirements: &[Requirement]) -> Vec<PathBuf> {
    const PATHS: &[&str] = &[
        "UV_FIND_LINKS",
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
        "UV_DEFAULT_INDEX",
        "UV_INDEX",
        "UV_CONFIG_FILE",
        "PIP_FIND_LINKS",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_CONFIG_FILE",
        "PIP_CERT",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
    ];
    let local = |text: &str| -> Option<PathBuf> {
        // `name=url` entries of UV_INDEX, plain paths and file:// URLs.
        let text = text.rsplit_once('=').map_or(text, |(_, url)| url);
        let path = text.strip_prefix("file://").unwrap_or(text);
        let path = Path::new(path);
        (path.is_absolute() && path.exists()).then(|| path.to_owned())
    };
    let mut reads: Vec<PathBuf> = installer_env()
        .into_iter()
        .filter(|(name, _)| name.to_str().is_some_and(|n| PATHS.contains(&n)))
        .flat_map(|(_, value)| {
            value
                .to_string_lossy()
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter_map(local)
                .collect::<Vec<_>>()
        })
        .collect();
    reads.extend(
        requirements
            .iter()
            .filter(|r| r.source().is_operator())
            .filter_map(|r| r.url().and_then(local)),
    );
    reads.sort();
    reads.dedup();
    reads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requirement::Source;

    #[test]
    fn an_installs_hosts_are_its_indexes_and_the_operators_urls() {
        assert_eq!(
            host_of_url("https://pypi.org/simple").as_deref(),
            Some("pypi.org:443")
        );
        assert_eq!(
            host_of_url("http://user:pw@127.0.0.1:8080/simple/").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            host_of_url("http://[::1]:9000/x").as_deref(),
            Some("[::1]:9000")
        );
        assert_eq!(
            host_of_url("https://[2001:db8::1]/x").as_deref(),
            Some("[2001:db8::1]:443")
        );
        assert_eq!(host_of_url("file:///wheels"), None);
        assert_eq!(host_of_url("/wheels"), None);
        let operator = Requirement::parse("pkg @ https://files.corp.example/pkg-1.0.whl")
            .unwrap()
            .with_source(Source::Operator);
        let code = Requirement::parse("evil @ https://attacker.example/evil.whl")
            .unwrap()
            .with_source(Source::Script);
        let runpython_egress::Network::Policy(policy) =
            install_network(&InstallPolicy::default_sandbox().network, &[operator, code])
        else {
            panic!("an install's network is a policy");
        };
        let allowed: Vec<String> = policy.allow.iter().map(ToString::to_string).collect();
        assert!(
            allowed.contains(&"files.corp.example:443".to_owned()),
            "{allowed:?}"
        );
        assert!(
            !allowed.iter().any(|a| a.contains("attacker")),
            "{allowed:?}"
        );
        if std::env::var_os("UV_DEFAULT_INDEX").is_none()
            && std::env::var_os("UV_INDEX_URL").is_none()
            && std::env::var_os("PIP_INDEX_URL").is_none()
        {
            assert!(allowed.contains(&"pypi.org:443".to_owned()), "{allowed:?}");
            assert!(
                allowed.contains(&"files.pythonhosted.org:443".to_owned()),
                "{allowed:?}"
            );
        }
        // The host's network or none: as configured.
        assert_eq!(
            install_network(&runpython_egress::Network::Host, &[]),
            runpython_egress::Network::Host
        );
    }
}
