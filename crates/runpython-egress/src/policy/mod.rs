//! The egress policy: which TCP connects and which DNS answers a sandboxed run may have.
//!
//! Pure decision logic: nothing here touches the network ([`HostAddrs::current`] only lists the
//! host's interfaces). The supervisor asks [`NetworkPolicy::decide`] about every intercepted
//! connect, and the DNS stub asks [`NetworkPolicy::judge_lookup`] and
//! [`NetworkPolicy::judge_answer`] about every lookup.
//!
//! Two rules hold throughout:
//!
//! * An address is classified and matched as what it really reaches ([`effective_ip`]): an
//!   IPv4-mapped, IPv4-compatible, NAT64 or 6to4 spelling of `10.0.0.1` is `10.0.0.1`.
//! * A non-public address ([`special_range`], or one of the host's own) is allowed only by an IP
//!   or CIDR pattern that covers it, or by an exact name pattern. A wildcard never allows one, so
//!   a domain whose DNS the code controls cannot be pointed at the host or its network
//!   (DNS rebinding).
//!
//! ```
//! use std::net::IpAddr;
//! use runpython_egress::{HostAddrs, NetworkPolicy, Verdict};
//!
//! let policy = NetworkPolicy::allowing(["*.example.com:443"])?;
//! let host = HostAddrs::from_list(vec![]);
//! let ip: IpAddr = "93.184.215.14".parse()?;
//! assert!(policy.decide(ip, 443, &["www.example.com"], &host).is_allowed());
//! assert!(!policy.decide(ip, 80, &["www.example.com"], &host).is_allowed());
//! let private: IpAddr = "10.0.0.5".parse()?;
//! assert!(!policy.decide(private, 443, &["www.example.com"], &host).is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why this file is long: it is one job, the decision, and more than half of it is the tests of
//! its cases (every range, spelling, mode and pattern kind against each other).

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::Error;

mod pattern;
mod ranges;
mod secret_hosts;

pub use pattern::HostPattern;
use pattern::{bare_name, is_below, normalize_name, Host};
pub use ranges::{effective_ip, special_range};
pub use secret_hosts::Secret;

/// The flag that allows one host; refusals name it.
const ALLOW_HOST_FLAG: &str = "--allow-host";
/// The flag that allows the public internet; refusals name it.
const ALLOW_NETWORK_FLAG: &str = "--allow-network";

/// How a sandboxed process reaches the network, as its caller configures it (the sandbox's share is
/// [`Network::mechanism`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// No network: the run's namespace has loopback only.
    #[default]
    Off,
    /// Every connect and lookup goes through the host and is decided by the policy.
    Policy(NetworkPolicy),
    /// The host's network, unfiltered.
    Host,
}

impl Network {
    /// What the sandbox is asked for: no network, the host's, or one the host mediates (a policy).
    pub fn mechanism(&self) -> runpython_sandbox::Network {
        match self {
            Network::Off => runpython_sandbox::Network::Off,
            Network::Policy(_) => runpython_sandbox::Network::Mediated,
            Network::Host => runpython_sandbox::Network::Host,
        }
    }

    /// The policy the host decides with, when it mediates.
    pub fn policy(&self) -> Option<&NetworkPolicy> {
        match self {
            Network::Policy(policy) => Some(policy),
            _ => None,
        }
    }

    /// Names the policy in a sandbox's isolation report (its mode and rule count), where the sandbox
    /// put it in force; any other report is left as it is.
    pub fn describe(&self, isolation: &mut runpython_sandbox::Isolation) {
        if let Network::Policy(policy) = self {
            isolation.set_network_policy(policy.mode(), policy.rules());
        }
    }
}

/// A sandbox's layers and limits with the network as its caller configures it, a policy included:
/// what runpython-core and runpython-deps are given. The sandbox takes
/// `config.map_network(Network::mechanism)`.
pub type Sandbox = runpython_sandbox::Sandbox<Network>;

/// What a run may reach: the public internet or not, plus patterns and name pins.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetworkPolicy {
    /// Allow every public address, on any port.
    pub public: bool,
    /// Hosts allowed in addition (or, when not `public`, the only ones).
    pub allow: Vec<HostPattern>,
    /// Names answered with these addresses instead of asking the host's resolver. A pin only says
    /// what a name resolves to; it allows nothing by itself.
    pub resolve: Vec<(String, IpAddr)>,
    /// Credentials the code may use but never read: the run sees a placeholder, and the host puts
    /// the value into requests to the secret's hosts only ([`Secret`]). Never serialized.
    #[serde(skip)]
    pub secrets: Vec<Secret>,
    /// PEM bundles trusted, besides the host's roots, for the TLS the host makes to a secret's
    /// hosts (a private upstream, a test server). Never serialized.
    #[serde(skip)]
    pub upstream_cas: Vec<Vec<u8>>,
}

/// The answer to "may this happen?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed.
    Allow {
        /// The pattern (as text) that allowed it; `None` when the public internet did.
        rule: Option<String>,
    },
    /// Refused.
    Refuse {
        /// Why, naming the address or name and the flag that would allow it.
        reason: String,
    },
}

impl Verdict {
    /// Whether this is [`Verdict::Allow`].
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allow { .. })
    }
}

impl NetworkPolicy {
    /// The public internet, and nothing non-public.
    pub fn public_internet() -> Self {
        Self {
            public: true,
            ..Self::default()
        }
    }

    /// Only the hosts the patterns name (see [`HostPattern`] for their forms).
    pub fn allowing<I, S>(patterns: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let allow = patterns
            .into_iter()
            .map(|p| p.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allow,
            ..Self::default()
        })
    }

    /// How many rules the policy has: patterns plus pins.
    pub fn rules(&self) -> usize {
        self.allow.len() + self.resolve.len()
    }

    /// `"public"` when the public internet is allowed, else `"allowlist"`.
    pub fn mode(&self) -> &'static str {
        if self.public {
            "public"
        } else {
            "allowlist"
        }
    }

    /// Whether `name` may be looked up at all: see [`NetworkPolicy::judge_lookup`].
    pub fn may_resolve(&self, name: &str) -> bool {
        self.judge_lookup(name).is_allowed()
    }

    /// Whether `name` may be looked up: in public mode any valid host name, else only names that
    /// a name pattern (exact or wildcard, whatever its port) matches. IP patterns resolve nothing.
    pub fn judge_lookup(&self, name: &str) -> Verdict {
        let name = match normalize_name(name) {
            Ok(name) => name,
            Err(why) => {
                return Verdict::Refuse {
                    reason: format!("{name:?} {why}"),
                }
            }
        };
        if let Some(rule) = self.allow.iter().find(|p| p.matches_name(&name)) {
            return Verdict::Allow {
                rule: Some(rule.to_string()),
            };
        }
        if self.public {
            return Verdict::Allow { rule: None };
        }
        Verdict::Refuse {
            reason: format!(
                "{name} is not on the allowlist; {ALLOW_HOST_FLAG} {name} would allow it, \
                 {ALLOW_NETWORK_FLAG} allows the public internet"
            ),
        }
    }

    /// The addresses `name` is pinned to (case-insensitive, a trailing dot ignored), if any.
    pub fn pinned(&self, name: &str) -> Option<Vec<IpAddr>> {
        let name = bare_name(name);
        let ips: Vec<IpAddr> = self
            .resolve
            .iter()
            .filter(|(pin, _)| bare_name(pin).eq_ignore_ascii_case(name))
            .map(|(_, ip)| *ip)
            .collect();
        (!ips.is_empty()).then_some(ips)
    }

    /// Whether a DNS answer for `name` may carry `ip`: see [`NetworkPolicy::judge_answer`].
    pub fn answerable(&self, name: &str, ip: IpAddr, host: &HostAddrs) -> bool {
        self.judge_answer(name, ip, host).is_allowed()
    }

    /// Whether [`NetworkPolicy::decide`] could allow `ip`, on some port, when it was reached
    /// through `name`. The DNS stub keeps only such addresses in its answers.
    pub fn judge_answer(&self, name: &str, ip: IpAddr, host: &HostAddrs) -> Verdict {
        self.judge(ip, None, &[name], host)
    }

    /// Whether a TCP connect to `ip:port` is allowed; `names` are the names this run resolved to
    /// `ip` (through the DNS stub: `Resolved::names_of`).
    pub fn decide<S: AsRef<str>>(
        &self,
        ip: IpAddr,
        port: u16,
        names: &[S],
        host: &HostAddrs,
    ) -> Verdict {
        self.judge(ip, Some(port), names, host)
    }

    /// [`NetworkPolicy::decide`], where a port of `None` means "some port".
    fn judge<S: AsRef<str>>(
        &self,
        ip: IpAddr,
        port: Option<u16>,
        names: &[S],
        host: &HostAddrs,
    ) -> Verdict {
        let reached = effective_ip(ip);
        let special = special_range(reached).or_else(|| {
            host.contains(reached)
                .then_some("one of this host's own addresses")
        });
        let names: Vec<String> = names
            .iter()
            .filter_map(|n| normalize_name(n.as_ref()).ok())
            .collect();
        // A wildcard that matched but could not allow a non-public address, for the refusal.
        let mut wildcard_hit = None;
        for pattern in self.allow.iter().filter(|p| p.allows_port(port)) {
            let allowed = match &pattern.host {
                Host::Net(net) => net.contains(&reached),
                Host::Name(exact) => names.iter().any(|n| n == exact),
                Host::Subdomains(parent) => match names.iter().find(|n| is_below(n, parent)) {
                    Some(name) if special.is_some() => {
                        wildcard_hit.get_or_insert((pattern, name));
                        false
                    }
                    found => found.is_some(),
                },
            };
            if allowed {
                return Verdict::Allow {
                    rule: Some(pattern.to_string()),
                };
            }
        }
        if special.is_none() && self.public {
            return Verdict::Allow { rule: None };
        }

        let shown = describe(ip, reached, port, &names);
        let by_ip = HostPattern::new(Host::Net(IpNet::from(reached)), port);
        let reason = match (special, wildcard_hit) {
            (Some(range), Some((wildcard, name))) => {
                let exact = HostPattern::new(Host::Name(name.clone()), port);
                format!(
                    "{shown} is {range}, and a wildcard ({wildcard}) allows only public \
                     addresses; {ALLOW_HOST_FLAG} {exact} or {ALLOW_HOST_FLAG} {by_ip} would \
                     allow it"
                )
            }
            (Some(range), None) => {
                format!("{shown} is {range}; {ALLOW_HOST_FLAG} {by_ip} would allow it")
            }
            (None, _) => {
                let suggested = names.first().map_or(by_ip, |name| {
                    HostPattern::new(Host::Name(name.clone()), port)
                });
                format!(
                    "{shown} is not on the allowlist; {ALLOW_HOST_FLAG} {suggested} would allow \
                     it, {ALLOW_NETWORK_FLAG} allows the public internet"
                )
            }
        };
        Verdict::Refuse { reason }
    }
}

/// `ip[:port]`, the names it was reached through, and what it really reaches, for a refusal.
fn describe(ip: IpAddr, reached: IpAddr, port: Option<u16>, names: &[String]) -> String {
    let mut shown = match port {
        Some(port) => SocketAddr::new(ip, port).to_string(),
        None => ip.to_string(),
    };
    match names {
        [] => {}
        [a] => shown += &format!(" ({a})"),
        [a, b] => shown += &format!(" ({a}, {b})"),
        [a, b, rest @ ..] => shown += &format!(" ({a}, {b} and {} more)", rest.len()),
    }
    if reached != ip {
        shown += &format!(", which reaches {reached},");
    }
    shown
}

/// The host's own addresses (of every interface), which count as non-public: reaching them
/// reaches the host's services.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAddrs(Vec<IpAddr>);

impl HostAddrs {
    /// The addresses of this host's interfaces now. Interfaces change (DHCP, VPNs, containers),
    /// so take this per run rather than once per process.
    pub fn current() -> Result<Self, Error> {
        let interfaces =
            nix::ifaddrs::getifaddrs().map_err(|e| Error::HostAddrs(std::io::Error::from(e)))?;
        let ips = interfaces
            .filter_map(|interface| interface.address)
            .filter_map(|address| {
                if let Some(v4) = address.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                }
            })
            .collect();
        Ok(Self::from_list(ips))
    }

    /// These addresses.
    pub fn from_list(ips: Vec<IpAddr>) -> Self {
        let mut ips: Vec<IpAddr> = ips.into_iter().map(effective_ip).collect();
        ips.sort_unstable();
        ips.dedup();
        Self(ips)
    }

    /// Whether `ip` (in any spelling) is one of them.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.binary_search(&effective_ip(ip)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn pattern(text: &str) -> HostPattern {
        text.parse().unwrap()
    }

    const NO_NAMES: &[&str] = &[];

    fn no_host() -> HostAddrs {
        HostAddrs::from_list(vec![])
    }

    fn reason(verdict: Verdict) -> String {
        match verdict {
            Verdict::Refuse { reason } => reason,
            Verdict::Allow { rule } => panic!("allowed by {rule:?}"),
        }
    }

    fn rule(verdict: Verdict) -> Option<String> {
        match verdict {
            Verdict::Allow { rule } => rule,
            Verdict::Refuse { reason } => panic!("refused: {reason}"),
        }
    }

    #[test]
    fn mapped_special_addresses_are_refused_like_their_ipv4() {
        let policy = NetworkPolicy::public_internet();
        for addr in [
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "::ffff:169.254.169.254",
            "64:ff9b::169.254.169.254",
            "2002:a9fe:a9fe::",
            "::ffff:10.0.0.1",
        ] {
            let why = reason(policy.decide(ip(addr), 80, NO_NAMES, &no_host()));
            assert!(why.contains("which reaches"), "{addr}: {why}");
            let reached = effective_ip(ip(addr));
            assert!(
                why.contains(&format!("--allow-host {reached}:80 would allow it")),
                "{why}"
            );
        }
        let why = reason(policy.decide(ip("::ffff:10.0.0.1"), 80, NO_NAMES, &no_host()));
        assert_eq!(
            why,
            "[::ffff:10.0.0.1]:80, which reaches 10.0.0.1, is a private address (RFC 1918); \
             --allow-host 10.0.0.1:80 would allow it"
        );
    }

    #[test]
    fn a_cidr_covers_every_spelling_of_its_addresses() {
        let policy = NetworkPolicy::allowing(["10.0.0.0/8"]).unwrap();
        for addr in [
            "10.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
        ] {
            assert_eq!(
                rule(policy.decide(ip(addr), 5432, NO_NAMES, &no_host())).as_deref(),
                Some("10.0.0.0/8"),
                "{addr}"
            );
        }
        let mapped = NetworkPolicy::allowing(["::ffff:10.0.0.0/104"]).unwrap();
        assert!(mapped
            .decide(ip("10.1.2.3"), 1, NO_NAMES, &no_host())
            .is_allowed());
    }

    #[test]
    fn special_addresses_refusal_names_address_port_and_flag() {
        let policy = NetworkPolicy::public_internet();
        assert_eq!(
            reason(policy.decide(ip("10.0.0.5"), 80, NO_NAMES, &no_host())),
            "10.0.0.5:80 is a private address (RFC 1918); --allow-host 10.0.0.5:80 would allow it"
        );
        assert_eq!(
            reason(policy.decide(ip("fd00::5"), 5432, &["db.internal"], &no_host())),
            "[fd00::5]:5432 (db.internal) is a unique local address (IPv6, fc00::/7); \
             --allow-host [fd00::5]:5432 would allow it"
        );
        let metadata = reason(policy.decide(ip("169.254.169.254"), 80, NO_NAMES, &no_host()));
        assert!(metadata.contains("cloud metadata"), "{metadata}");
    }

    #[test]
    fn allowlist_refusal_suggests_the_name_and_the_public_internet() {
        let policy = NetworkPolicy::allowing(["api.example.com"]).unwrap();
        assert_eq!(
            reason(policy.decide(ip("93.184.215.14"), 443, &["example.org"], &no_host())),
            "93.184.215.14:443 (example.org) is not on the allowlist; --allow-host \
             example.org:443 would allow it, --allow-network allows the public internet"
        );
        assert_eq!(
            reason(policy.decide(ip("2606:4700::1"), 443, NO_NAMES, &no_host())),
            "[2606:4700::1]:443 is not on the allowlist; --allow-host [2606:4700::1]:443 would \
             allow it, --allow-network allows the public internet"
        );
        let many = reason(policy.decide(
            ip("1.1.1.1"),
            1,
            &["a.test", "b.test", "c.test", "d.test"],
            &no_host(),
        ));
        assert!(
            many.starts_with("1.1.1.1:1 (a.test, b.test and 2 more)"),
            "{many}"
        );
    }

    #[test]
    fn wildcards_allow_only_public_addresses() {
        let policy = NetworkPolicy::allowing(["*.example.com"]).unwrap();
        let public = ip("93.184.215.14");
        assert_eq!(
            rule(policy.decide(public, 443, &["www.example.com"], &no_host())).as_deref(),
            Some("*.example.com")
        );
        assert!(policy
            .decide(public, 443, &["a.b.c.example.com"], &no_host())
            .is_allowed());
        assert!(!policy
            .decide(public, 443, &["example.com"], &no_host())
            .is_allowed());
        assert!(!policy
            .decide(public, 443, &["badexample.com"], &no_host())
            .is_allowed());
        for private in [
            "10.0.0.5",
            "127.0.0.1",
            "169.254.169.254",
            "::ffff:127.0.0.1",
            "fd00::1",
        ] {
            let why = reason(policy.decide(ip(private), 443, &["evil.example.com"], &no_host()));
            assert!(
                why.contains("a wildcard (*.example.com) allows only public addresses"),
                "{why}"
            );
            assert!(
                why.contains("--allow-host evil.example.com:443 or --allow-host"),
                "{why}"
            );
        }
    }

    #[test]
    fn exact_names_allow_special_addresses() {
        let policy = NetworkPolicy::allowing(["db.example.com:5432", "*.example.com"]).unwrap();
        let private = ip("10.0.0.5");
        assert_eq!(
            rule(policy.decide(private, 5432, &["db.example.com"], &no_host())).as_deref(),
            Some("db.example.com:5432")
        );
        assert!(!policy
            .decide(private, 5433, &["db.example.com"], &no_host())
            .is_allowed());
        assert!(!policy
            .decide(private, 5432, &["other.example.com"], &no_host())
            .is_allowed());
        assert!(!policy
            .decide(private, 5432, NO_NAMES, &no_host())
            .is_allowed());
        // Names are compared normalized.
        assert!(policy
            .decide(private, 5432, &["DB.Example.COM."], &no_host())
            .is_allowed());
    }

    #[test]
    fn ports_must_match_when_the_pattern_has_one() {
        let policy =
            NetworkPolicy::allowing(["api.example.com:443", "1.2.3.4:22", "[2001:4860::/32]:53"])
                .unwrap();
        let host = no_host();
        let public = ip("93.184.215.14");
        assert!(policy
            .decide(public, 443, &["api.example.com"], &host)
            .is_allowed());
        assert!(!policy
            .decide(public, 80, &["api.example.com"], &host)
            .is_allowed());
        assert!(policy
            .decide(ip("1.2.3.4"), 22, NO_NAMES, &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("1.2.3.4"), 23, NO_NAMES, &host)
            .is_allowed());
        assert!(policy
            .decide(ip("2001:4860::8888"), 53, NO_NAMES, &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("2001:4860::8888"), 443, NO_NAMES, &host)
            .is_allowed());
        let any_port = NetworkPolicy::allowing(["api.example.com"]).unwrap();
        for port in [1, 80, 443, 65535] {
            assert!(any_port
                .decide(public, port, &["api.example.com"], &host)
                .is_allowed());
        }
    }

    #[test]
    fn public_mode_allows_public_addresses_on_any_port_and_adds_patterns() {
        let mut policy = NetworkPolicy::public_internet();
        policy.allow.push(pattern("db.internal:5432"));
        let host = no_host();
        assert_eq!(
            rule(policy.decide(ip("93.184.215.14"), 25, NO_NAMES, &host)),
            None
        );
        assert_eq!(
            rule(policy.decide(ip("2606:4700::1"), 8080, &["x.test"], &host)),
            None
        );
        assert!(policy
            .decide(ip("10.0.0.5"), 5432, &["db.internal"], &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("10.0.0.5"), 5432, NO_NAMES, &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("127.0.0.1"), 80, NO_NAMES, &host)
            .is_allowed());
    }

    #[test]
    fn allowlist_mode_allows_only_what_patterns_match() {
        let policy = NetworkPolicy::allowing(["api.example.com", "8.8.8.8:53"]).unwrap();
        let host = no_host();
        assert!(policy
            .decide(ip("93.184.215.14"), 443, &["api.example.com"], &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("93.184.215.14"), 443, NO_NAMES, &host)
            .is_allowed());
        assert!(policy
            .decide(ip("8.8.8.8"), 53, NO_NAMES, &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("8.8.4.4"), 53, NO_NAMES, &host)
            .is_allowed());
    }

    #[test]
    fn pins_allow_nothing_by_themselves() {
        let mut policy = NetworkPolicy::allowing(["api.example.com"]).unwrap();
        policy
            .resolve
            .push(("pinned.example.com".into(), ip("93.184.215.14")));
        policy
            .resolve
            .push(("API.example.com.".into(), ip("10.0.0.7")));
        policy
            .resolve
            .push(("api.example.com".into(), ip("10.0.0.8")));
        assert_eq!(policy.rules(), 4);
        assert!(!policy.may_resolve("pinned.example.com"));
        assert!(!policy
            .decide(
                ip("93.184.215.14"),
                443,
                &["pinned.example.com"],
                &no_host()
            )
            .is_allowed());
        assert_eq!(
            policy.pinned("pinned.example.com."),
            Some(vec![ip("93.184.215.14")])
        );
        assert_eq!(
            policy.pinned("Api.Example.Com"),
            Some(vec![ip("10.0.0.7"), ip("10.0.0.8")])
        );
        assert_eq!(policy.pinned("other.example.com"), None);
        assert!(policy.may_resolve("api.example.com"));
    }

    #[test]
    fn host_addresses_are_not_public() {
        let host = HostAddrs::from_list(vec![ip("203.0.114.7"), ip("2a01:4f8::7")]);
        assert!(host.contains(ip("::ffff:203.0.114.7")));
        assert!(!host.contains(ip("203.0.114.8")));
        let policy = NetworkPolicy::public_internet();
        let why = reason(policy.decide(ip("203.0.114.7"), 22, NO_NAMES, &host));
        assert_eq!(
            why,
            "203.0.114.7:22 is one of this host's own addresses; --allow-host 203.0.114.7:22 \
             would allow it"
        );
        assert!(!policy
            .decide(ip("::ffff:203.0.114.7"), 22, NO_NAMES, &host)
            .is_allowed());
        assert!(!policy
            .decide(ip("2a01:4f8::7"), 22, NO_NAMES, &host)
            .is_allowed());
        assert!(policy
            .decide(ip("203.0.114.8"), 22, NO_NAMES, &host)
            .is_allowed());
        let wildcard = NetworkPolicy::allowing(["*.example.com"]).unwrap();
        assert!(!wildcard
            .decide(ip("203.0.114.7"), 443, &["x.example.com"], &host)
            .is_allowed());
        let exact = NetworkPolicy::allowing(["203.0.114.7:22"]).unwrap();
        assert!(exact
            .decide(ip("203.0.114.7"), 22, NO_NAMES, &host)
            .is_allowed());
    }

    #[test]
    fn the_current_host_addresses_include_loopback() {
        let host = HostAddrs::current().unwrap();
        assert!(host.contains(ip("127.0.0.1")));
    }

    #[test]
    fn lookups_follow_the_mode() {
        let public = NetworkPolicy::public_internet();
        assert!(public.may_resolve("anything.example.net"));
        assert!(public.may_resolve("Anything.Example.NET."));
        assert!(!public.may_resolve("bad_name.example"));
        assert!(!public.may_resolve(""));
        assert!(!public.may_resolve("."));
        assert!(!public.may_resolve("bücher.example"));

        let policy =
            NetworkPolicy::allowing(["api.example.com:443", "*.cdn.example.net", "10.0.0.0/8"])
                .unwrap();
        assert_eq!(
            rule(policy.judge_lookup("API.example.com.")).as_deref(),
            Some("api.example.com:443")
        );
        assert!(policy.may_resolve("a.b.cdn.example.net"));
        assert!(!policy.may_resolve("cdn.example.net"));
        assert!(!policy.may_resolve("example.com"));
        assert!(!policy.may_resolve("10.0.0.1"));
        assert_eq!(
            reason(policy.judge_lookup("evil.test")),
            "evil.test is not on the allowlist; --allow-host evil.test would allow it, \
             --allow-network allows the public internet"
        );
        assert!(reason(policy.judge_lookup("a b")).starts_with("\"a b\" has ` `"));
    }

    #[test]
    fn answers_keep_what_some_port_could_reach() {
        let policy =
            NetworkPolicy::allowing(["*.example.com", "db.example.com:5432", "10.9.0.0/16"])
                .unwrap();
        let host = HostAddrs::from_list(vec![ip("203.0.114.7")]);
        assert!(policy.answerable("www.example.com", ip("93.184.215.14"), &host));
        assert!(!policy.answerable("www.example.com", ip("10.0.0.1"), &host));
        assert!(!policy.answerable("www.example.com", ip("203.0.114.7"), &host));
        assert!(policy.answerable("www.example.com", ip("10.9.1.1"), &host));
        assert!(policy.answerable("db.example.com", ip("10.0.0.1"), &host));
        assert!(policy.answerable("DB.example.com.", ip("::ffff:10.0.0.1"), &host));
        assert!(!policy.answerable("other.test", ip("93.184.215.14"), &host));
        let why = reason(policy.judge_answer("www.example.com", ip("10.0.0.1"), &host));
        assert_eq!(
            why,
            "10.0.0.1 (www.example.com) is a private address (RFC 1918), and a wildcard \
             (*.example.com) allows only public addresses; --allow-host www.example.com or \
             --allow-host 10.0.0.1 would allow it"
        );
        assert!(NetworkPolicy::public_internet().answerable("x.test", ip("1.1.1.1"), &host));
    }

    #[test]
    fn the_sandbox_is_asked_for_the_mechanism_and_the_report_names_the_policy() {
        use runpython_sandbox::Network as Mechanism;
        let policy = NetworkPolicy::allowing(["a.test", "b.test"]).unwrap();
        let network = Network::Policy(policy.clone());
        assert_eq!(network.mechanism(), Mechanism::Mediated);
        assert_eq!(network.policy(), Some(&policy));
        assert_eq!(Network::Off.mechanism(), Mechanism::Off);
        assert_eq!(Network::Host.mechanism(), Mechanism::Host);
        assert_eq!(Network::Host.policy(), None);
        let config = Sandbox {
            network: network.clone(),
            ..Sandbox::default()
        };
        assert_eq!(
            config.map_network(Network::mechanism).network,
            Mechanism::Mediated
        );
        let mut report = runpython_sandbox::report(
            &config.map_network(Network::mechanism),
            std::time::Duration::from_secs(1),
            false,
        )
        .unwrap();
        let mediated = report
            .missing
            .iter()
            .all(|m| !m.starts_with("network policy"));
        network.describe(&mut report);
        match mediated {
            true => assert_eq!(
                (report.network.as_str(), report.network_rules),
                ("allowlist", Some(2))
            ),
            // Without the kernel's help the run has no network, and the report keeps saying so.
            false => assert_eq!(
                (report.network.as_str(), report.network_rules),
                ("off", None)
            ),
        }
    }

    #[test]
    fn policy_basics() {
        assert_eq!(Network::default(), Network::Off);
        assert_eq!(NetworkPolicy::public_internet().mode(), "public");
        assert_eq!(NetworkPolicy::default().mode(), "allowlist");
        assert_eq!(
            NetworkPolicy::allowing(["a.test", "b.test"])
                .unwrap()
                .rules(),
            2
        );
        let err = NetworkPolicy::allowing(["a.test", "*.com"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"*.com\""), "{err}");
        assert!(pattern("*.example.com:1").is_wildcard());
        assert_eq!(pattern("*.example.com:1").port(), Some(1));
        assert_eq!(pattern("example.com").port(), None);
    }
}
