//! The flags that say what the code may reach: `--allow-network`, `--allow-host`, `--resolve` and
//! `--network`, and the secrets it may use there (`--secret`, `--upstream-ca`), shared by every
//! command that makes runs.

use clap::Args;
use runpython_core::{HostPattern, Secret};

/// What the code may reach.
#[derive(Debug, Args)]
pub(crate) struct NetworkArgs {
    /// The public internet only: never the host, its loopback, private networks (RFC 1918, CGNAT,
    /// link-local and the cloud metadata address, IPv6 unique-local), multicast or the host's own
    /// addresses, however spelled, unless an --allow-host names them. Every connection and lookup is
    /// decided on the host.
    #[arg(long)]
    pub(crate) allow_network: bool,
    /// Only these (repeatable): a name, `*.name`, an IP or a CIDR, each with or without a port.
    #[arg(
        long = "allow-host",
        value_name = "PATTERN",
        value_parser = parse_pattern,
        help = "Only these (repeatable): a name, *.name, an IP or a CIDR, each with or without :PORT \
                (IPv6 in brackets: [2001:db8::1]:443). With --allow-network, these add to the public \
                internet (a private database, say)."
    )]
    pub(crate) allow_hosts: Vec<HostPattern>,
    /// What NAME resolves to inside runs (repeatable, as curl's --resolve): the host's resolver is
    /// not asked for it. Allows nothing by itself.
    #[arg(long = "resolve", value_name = "NAME=IP", value_parser = parse_pin)]
    pub(crate) resolve: Vec<(String, std::net::IpAddr)>,
    /// off: no network (the default without --allow-network or --allow-host); host: share the host's
    /// network namespace, everything the host reaches (reported as network "host").
    #[arg(long, value_name = "MODE", value_parser = ["off", "host"],
          conflicts_with_all = ["allow_network", "allow_hosts"])]
    pub(crate) network: Option<String>,
    /// A credential the code may use but never read (repeatable): NAME:HOST[,HOST...] takes the
    /// value from the host's variable NAME, NAME=VAR:HOSTS from VAR. The code's NAME holds a
    /// placeholder; the host puts the value into request headers (Basic auth included) to those
    /// hosts only, over HTTPS whose certificate verifies for the host, intercepting it with a CA of
    /// the run's own. Each host must be allowed (--allow-host or --allow-network).
    #[arg(long = "secret", value_name = "NAME[=VAR]:HOSTS", value_parser = parse_secret)]
    pub(crate) secrets: Vec<Secret>,
    /// Also put secret NAME's value into request query strings (repeatable; off by default).
    #[arg(long = "secret-in-query", value_name = "NAME")]
    pub(crate) secret_in_query: Vec<String>,
    /// Also put secret NAME's value into request bodies of up to 1 MiB (repeatable; off by
    /// default; a larger body to its hosts is refused).
    #[arg(long = "secret-in-body", value_name = "NAME")]
    pub(crate) secret_in_body: Vec<String>,
    /// Also put secret NAME's value into plain-HTTP requests to its hosts (repeatable; off by
    /// default). Anyone on the path reads it, and whoever answers for the host's address gets it
    /// with no certificate checked: only for hosts reached over a network you trust.
    #[arg(long = "secret-over-http", value_name = "NAME")]
    pub(crate) secret_over_http: Vec<String>,
    /// A PEM bundle trusted, besides the host's roots, for the host's TLS to a secret's hosts
    /// (repeatable): a private upstream's CA.
    #[arg(long = "upstream-ca", value_name = "FILE")]
    pub(crate) upstream_cas: Vec<std::path::PathBuf>,
}

/// `NAME:HOSTS` or `NAME=VAR:HOSTS`, the value read from the host's environment now. An error
/// never holds the value.
fn parse_secret(s: &str) -> Result<Secret, String> {
    let (head, hosts) = s.split_once(':').ok_or_else(|| {
        format!("{s:?} is not NAME:HOST[,HOST...] (e.g. ANTHROPIC_API_KEY:api.anthropic.com)")
    })?;
    let (name, var) = match head.split_once('=') {
        Some((name, var)) => (name.trim(), var.trim()),
        None => (head.trim(), head.trim()),
    };
    let value = std::env::var(var).map_err(|_| {
        format!("secret {name}: the host's environment has no {var}; export it, or name another variable as {name}=VAR:HOSTS")
    })?;
    let hosts = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| {
            h.parse::<HostPattern>()
                .map_err(|e| format!("secret {name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Secret::new(name, value, hosts))
}

fn parse_pattern(s: &str) -> Result<HostPattern, String> {
    s.parse()
        .map_err(|e: runpython_core::EgressError| e.to_string())
}

fn parse_pin(s: &str) -> Result<(String, std::net::IpAddr), String> {
    let (name, ip) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=IP (e.g. api.internal=10.0.0.5)"))?;
    let ip = ip
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("{ip:?} in {s:?} is not an IP address"))?;
    Ok((name.trim().to_ascii_lowercase(), ip))
}
