//! The flags that say what the code may reach: `--allow-network`, `--allow-host`, `--resolve` and
//! `--network`, shared by every command that makes runs.

use clap::Args;
use runpython_core::{HostPattern, Network, NetworkPolicy};

/// What the code may reach.
#[derive(Debug, Args)]
pub(crate) struct NetworkArgs {
    /// The public internet only: never the host, its loopback, private networks (RFC 1918, CGNAT,
    /// link-local and the cloud metadata address, IPv6 unique-local), multicast or the host's own
    /// addresses, however spelled, unless an --allow-host names them. Every connection and lookup is
    /// decided on the host.
    #[arg(long)]
    allow_network: bool,
    /// Only these (repeatable): a name, `*.name`, an IP or a CIDR, each with or without a port.
    #[arg(
        long = "allow-host",
        value_name = "PATTERN",
        value_parser = parse_pattern,
        help = "Only these (repeatable): a name, *.name, an IP or a CIDR, each with or without :PORT \
                (IPv6 in brackets: [2001:db8::1]:443). With --allow-network, these add to the public \
                internet (a private database, say)."
    )]
    allow_hosts: Vec<HostPattern>,
    /// What NAME resolves to inside runs (repeatable, as curl's --resolve): the host's resolver is
    /// not asked for it. Allows nothing by itself.
    #[arg(long = "resolve", value_name = "NAME=IP", value_parser = parse_pin)]
    resolve: Vec<(String, std::net::IpAddr)>,
    /// off: no network (the default without --allow-network or --allow-host); host: share the host's
    /// network namespace, everything the host reaches (reported as network "host").
    #[arg(long, value_name = "MODE", value_parser = ["off", "host"],
          conflicts_with_all = ["allow_network", "allow_hosts"])]
    network: Option<String>,
}

fn parse_pattern(s: &str) -> Result<HostPattern, String> {
    s.parse()
        .map_err(|e: runpython_core::SandboxError| e.to_string())
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

impl NetworkArgs {
    /// The network these flags describe.
    pub(crate) fn network(&self) -> Network {
        match self.network.as_deref() {
            Some("host") => return Network::Host,
            Some(_) => return Network::Off,
            None => {}
        }
        if !self.allow_network && self.allow_hosts.is_empty() {
            return Network::Off;
        }
        Network::Policy(NetworkPolicy {
            public: self.allow_network,
            allow: self.allow_hosts.clone(),
            resolve: self.resolve.clone(),
        })
    }
}
