//! Host patterns: what `--allow-host` reads, and what a pattern names.

use super::ranges::{effective_ip, EMBEDDING, LOW32_EMBEDDING};
use super::ALLOW_NETWORK_FLAG;
use crate::error::Error;
use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// One allowed host: a name, every name below a domain, or an IP range; each with an optional
/// port (without one, every port).
///
/// The text forms, as `FromStr` reads them and `Display` writes them back:
///
/// | form | examples |
/// | --- | --- |
/// | a name | `api.example.com`, `api.example.com:443` |
/// | every subdomain (at any depth, not the name itself) | `*.example.com`, `*.example.com:443` |
/// | an address | `1.2.3.4`, `1.2.3.4:443`, `2001:db8::1`, `[2001:db8::1]:443` |
/// | a CIDR range | `10.0.0.0/8`, `10.0.0.0/8:5432`, `fd00::/8`, `[fd00::/8]:5432` |
///
/// Names are ASCII (write internationalized names in their `xn--` form), matched
/// case-insensitively and without a trailing dot. A wildcard over a public suffix (`*.com`,
/// `*.co.uk`, `*.github.io`) is refused, and so is a CIDR range with host bits set (write the
/// network address). An IPv4-mapped or other IPv4-embedding IPv6 address is read as the IPv4
/// address it reaches (`::ffff:10.0.0.1` is `10.0.0.1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPattern {
    pub(super) host: Host,
    pub(super) port: Option<u16>,
}

/// What a [`HostPattern`] matches, before its port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Host {
    /// This name (normalized).
    Name(String),
    /// Every name strictly below this one (normalized).
    Subdomains(String),
    /// These addresses (a single address is a full-length prefix).
    Net(IpNet),
}

impl HostPattern {
    pub(super) fn new(host: Host, port: Option<u16>) -> Self {
        Self { host, port }
    }

    /// The port the pattern is limited to, if any.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether this is a `*.domain` pattern (which allows public addresses only).
    pub fn is_wildcard(&self) -> bool {
        matches!(self.host, Host::Subdomains(_))
    }

    /// Whether the pattern names `name` (already normalized), whatever the port.
    pub(super) fn matches_name(&self, name: &str) -> bool {
        match &self.host {
            Host::Name(exact) => exact == name,
            Host::Subdomains(parent) => is_below(name, parent),
            Host::Net(_) => false,
        }
    }

    /// Whether the pattern covers `host` (a name, or an address, bracketed or not) at `port`, as a
    /// secret's hosts are matched against the name a request is for.
    pub(crate) fn matches_host(&self, host: &str, port: u16) -> bool {
        if !self.allows_port(Some(port)) {
            return false;
        }
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return matches!(&self.host, Host::Net(net) if net.contains(&effective_ip(ip)));
        }
        normalize_name(host).is_ok_and(|name| self.matches_name(&name))
    }

    /// Whether the pattern allows `port`; `None` asks about some port.
    pub(super) fn allows_port(&self, port: Option<u16>) -> bool {
        match (self.port, port) {
            (Some(own), Some(port)) => own == port,
            _ => true,
        }
    }
}

impl FromStr for HostPattern {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        parse_pattern(text.trim()).map_err(|why| Error::InvalidPattern {
            text: text.to_owned(),
            why,
        })
    }
}

impl TryFrom<String> for HostPattern {
    type Error = Error;

    fn try_from(text: String) -> Result<Self, Error> {
        text.parse()
    }
}

impl From<HostPattern> for String {
    fn from(pattern: HostPattern) -> Self {
        pattern.to_string()
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (host, v6) = match &self.host {
            Host::Name(name) => (name.clone(), false),
            Host::Subdomains(parent) => (format!("*.{parent}"), false),
            Host::Net(net) if net.prefix_len() == net.max_prefix_len() => {
                (net.addr().to_string(), net.addr().is_ipv6())
            }
            Host::Net(net) => (net.to_string(), net.addr().is_ipv6()),
        };
        match self.port {
            None => f.write_str(&host),
            Some(port) if v6 => write!(f, "[{host}]:{port}"),
            Some(port) => write!(f, "{host}:{port}"),
        }
    }
}

/// The forms a pattern takes, for errors that cannot name a fix.
const FORMS: &str = "a pattern is a name (api.example.com), a wildcard (*.example.com), an \
                     address (1.2.3.4, [2001:db8::1]) or a CIDR range (10.0.0.0/8), each with an \
                     optional :PORT";

/// Reads a trimmed pattern; the error completes "host pattern "…" ".
fn parse_pattern(text: &str) -> Result<HostPattern, String> {
    if text.is_empty() {
        return Err(format!("is empty; {FORMS}"));
    }
    if text.contains("://") {
        return Err("is a URL; write only the host and port, e.g. example.com:443".into());
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest
            .split_once(']')
            .ok_or("has `[` without `]`; write [2001:db8::1]:443")?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(after.strip_prefix(':').ok_or(
                "has text after `]` that is not :PORT; write [2001:db8::1]:443",
            )?)?),
        };
        if inner.parse::<IpAddr>().is_err() && !inner.contains('/') {
            return Err(format!(
                "has brackets around something that is not an IPv6 address; {FORMS}"
            ));
        }
        (inner, port)
    } else if text.matches(':').count() > 1 {
        // Bare IPv6 (an address or range) has no port: ports need brackets.
        let addr = text.split_once('/').map_or(text, |(addr, _)| addr);
        if addr.parse::<Ipv6Addr>().is_err() {
            return Err(
                "has more than one `:` but is not an IPv6 address or range (zone ids like \
                 %eth0 are not supported); write an IPv6 address with a port as \
                 [2001:db8::1]:443"
                    .into(),
            );
        }
        (text, None)
    } else if let Some((host, port)) = text.split_once(':') {
        (host, Some(parse_port(port)?))
    } else {
        (text, None)
    };

    let host = if let Some((addr, prefix)) = host.split_once('/') {
        let Ok(addr) = addr.parse::<IpAddr>() else {
            return Err(
                "has a `/` after something that is not an IP address; write only a host \
                 name (no path), or a CIDR range like 10.0.0.0/8"
                    .into(),
            );
        };
        Host::Net(parse_cidr(addr, prefix)?)
    } else if let Ok(addr) = host.parse::<IpAddr>() {
        Host::Net(IpNet::from(effective_ip(addr)))
    } else if host == "*" {
        return Err(format!(
            "matches every host; {ALLOW_NETWORK_FLAG} allows the public internet"
        ));
    } else if let Some(parent) = host.strip_prefix("*.") {
        let parent = normalize_name(parent)?;
        if is_public_suffix(&parent) {
            return Err(format!(
                "would match every name under the public suffix `{parent}`; name a domain \
                 under it instead, e.g. *.example.{parent}"
            ));
        }
        Host::Subdomains(parent)
    } else if host.contains('*') {
        return Err("has a `*` that is not a leading `*.`; write e.g. *.example.com".into());
    } else {
        Host::Name(normalize_name(host)?)
    };
    Ok(HostPattern::new(host, port))
}

/// A port, 1 to 65535, in decimal digits only.
fn parse_port(text: &str) -> Result<u16, String> {
    text.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| text.parse::<u16>().ok())
        .flatten()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("has port `{text}`; a port is a number from 1 to 65535"))
}

/// An address range `addr/prefix`: host bits must be clear, and an IPv6 range of IPv4-embedding
/// addresses is read as the IPv4 range it reaches.
fn parse_cidr(addr: IpAddr, prefix: &str) -> Result<IpNet, String> {
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let net = prefix
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| prefix.parse::<u8>().ok())
        .flatten()
        .and_then(|len| IpNet::new(addr, len).ok())
        .ok_or_else(|| format!("has prefix `/{prefix}`; it must be a number from 0 to {max}"))?;
    if net.trunc() != net {
        return Err(format!(
            "has host bits set after the /{} prefix; write {} for the range, or {}/{max} for \
             the one address",
            net.prefix_len(),
            net.trunc(),
            net.addr()
        ));
    }
    let IpNet::V6(v6) = net else { return Ok(net) };
    if v6.prefix_len() == 128 {
        return Ok(IpNet::from(effective_ip(IpAddr::V6(v6.addr()))));
    }
    // Ranges whose addresses carry the IPv4 address in their low 32 bits convert exactly.
    if v6.prefix_len() >= 96 && LOW32_EMBEDDING.iter().any(|range| range.contains(&v6)) {
        let [.., a, b, c, d] = v6.addr().octets();
        return Ipv4Net::new(Ipv4Addr::new(a, b, c, d), v6.prefix_len() - 96)
            .map(IpNet::V4)
            .map_err(|e| format!("cannot be read as an IPv4 range ({e})"));
    }
    if EMBEDDING.iter().any(|range| range.contains(&v6)) {
        return Err(
            "is a range of IPv6 addresses that embed IPv4 ones (6to4, NAT64, mapped or \
                    compatible), which are matched as the IPv4 address they embed; write the \
                    IPv4 range instead"
                .into(),
        );
    }
    Ok(net)
}

/// `name` without one trailing dot.
pub(super) fn bare_name(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

/// A host name lowercased and without a trailing dot, or why it is not one (completing
/// "host pattern "…" " or a quoted name).
pub(super) fn normalize_name(name: &str) -> Result<String, String> {
    let name = bare_name(name);
    if !name.is_ascii() {
        return Err(
            "is not ASCII; write an internationalized name in its xn-- (punycode) form".into(),
        );
    }
    let name = name.to_ascii_lowercase();
    if name.is_empty() {
        return Err("has an empty host name".into());
    }
    if name.len() > 253 {
        return Err("is longer than the 253 characters a host name may have".into());
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("has an empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > 63 {
            return Err(format!(
                "has the label `{label}`, longer than the 63 characters a label may have"
            ));
        }
        if let Some(bad) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "has `{bad}`; a host name has only letters, digits, `-` and dots"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "has the label `{label}`, which starts or ends with `-`"
            ));
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("ends in a number, which no host name does (is it a mistyped address?)".into());
    }
    Ok(name)
}

/// Whether `name` lies strictly below `parent` (both normalized).
pub(super) fn is_below(name: &str, parent: &str) -> bool {
    name.strip_suffix(parent)
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

/// Whether `name` is on the public suffix list (`com`, `co.uk`, `github.io`).
fn is_public_suffix(name: &str) -> bool {
    psl::suffix(name.as_bytes()).is_some_and(|suffix| suffix.is_known() && suffix == name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::policy::{Network, NetworkPolicy};

    fn pattern(text: &str) -> HostPattern {
        text.parse().unwrap()
    }

    fn refusal(text: &str) -> String {
        match text.parse::<HostPattern>() {
            Ok(p) => panic!("{text:?} parsed as {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_pattern_form_parses_and_round_trips() {
        for text in [
            "api.example.com",
            "api.example.com:443",
            "*.example.com",
            "*.example.com:8443",
            "*.a.b.example.co.uk",
            "localhost",
            "db",
            "xn--bcher-kva.example",
            "1.2.3.4",
            "1.2.3.4:443",
            "2001:db8::1",
            "[2001:db8::1]:443",
            "10.0.0.0/8",
            "10.0.0.0/8:5432",
            "0.0.0.0/0",
            "fd00::/8",
            "[fd00::/8]:5432",
            "::/0",
            "::1",
            "[::1]:8080",
            "1.2.3.4:65535",
            "1.2.3.4:1",
        ] {
            let parsed = pattern(text);
            assert_eq!(parsed.to_string(), text, "{text} displays as itself");
            assert_eq!(pattern(&parsed.to_string()), parsed, "{text} round-trips");
        }
    }

    #[test]
    fn patterns_are_written_canonically() {
        for (text, canonical) in [
            ("API.Example.COM.", "api.example.com"),
            ("*.Example.com.:443", "*.example.com:443"),
            ("  example.com  ", "example.com"),
            ("[2001:DB8:0::1]", "2001:db8::1"),
            ("[1.2.3.4]:80", "1.2.3.4:80"),
            ("1.2.3.4/32", "1.2.3.4"),
            ("2001:db8::1/128", "2001:db8::1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("[::ffff:10.0.0.1]:5432", "10.0.0.1:5432"),
            ("64:ff9b::10.0.0.1", "10.0.0.1"),
            ("2002:a00:1::", "10.0.0.1"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("[64:ff9b::/96]:443", "0.0.0.0/0:443"),
        ] {
            assert_eq!(pattern(text).to_string(), canonical, "{text}");
        }
    }

    #[test]
    fn host_patterns_serialize_as_their_text() {
        let policy = NetworkPolicy::allowing(["*.example.com:443", "[fd00::/8]:5432"]).unwrap();
        let json = serde_json::to_string(&policy.allow).unwrap();
        assert_eq!(json, r#"["*.example.com:443","[fd00::/8]:5432"]"#);
        let back: Vec<HostPattern> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, policy.allow);
        let bad = serde_json::from_str::<Vec<HostPattern>>(r#"["*.com"]"#).unwrap_err();
        assert!(bad.to_string().contains("public suffix"), "{bad}");
        let network = Network::Policy(policy);
        let json = serde_json::to_string(&network).unwrap();
        assert_eq!(serde_json::from_str::<Network>(&json).unwrap(), network);
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        for (text, says) in [
            ("", "is empty"),
            ("   ", "is empty"),
            ("*", "matches every host; --allow-network"),
            ("*:443", "matches every host"),
            ("*.com", "public suffix `com`"),
            ("*.co.uk", "public suffix `co.uk`"),
            ("*.github.io", "public suffix `github.io`"),
            ("*.COM.", "public suffix `com`"),
            ("*.", "empty host name"),
            ("api.*.com", "not a leading `*.`"),
            ("*example.com", "not a leading `*.`"),
            ("**.example.com", "not a leading `*.`"),
            ("https://example.com", "is a URL"),
            (
                "example.com/path",
                "has a `/` after something that is not an IP",
            ),
            ("bücher.example", "xn-- (punycode)"),
            ("exa mple.com", "has ` `"),
            ("under_score.com", "has `_`"),
            ("-bad.example.com", "starts or ends with `-`"),
            ("bad-.example.com", "starts or ends with `-`"),
            ("a..example.com", "empty label"),
            (".example.com", "empty label"),
            ("1.2.3", "ends in a number"),
            ("example.com:0", "port `0`"),
            ("example.com:65536", "port `65536`"),
            ("example.com:", "port ``"),
            ("example.com:+80", "port `+80`"),
            ("example.com:http", "port `http`"),
            ("[2001:db8::1]443", "not :PORT"),
            ("[2001:db8::1", "without `]`"),
            ("[example.com]:443", "brackets"),
            ("10.0.0.0/33", "prefix `/33`"),
            ("fd00::/129", "prefix `/129`"),
            ("10.0.0.0/", "prefix `/`"),
            ("10.0.0.0/x", "prefix `/x`"),
            (
                "10.0.0.1/8",
                "host bits set after the /8 prefix; write 10.0.0.0/8",
            ),
            ("fd00::1/8", "write fd00::/8"),
            ("2002::/16", "matched as the IPv4 address they embed"),
            ("2002:a00::/24", "write the IPv4 range instead"),
            ("::/100", "write the IPv4 range instead"),
            ("fe80::1%eth0", "zone ids like %eth0 are not supported"),
            ("1.2.3.4:80:90", "more than one `:`"),
            ("2001:db8::1:443:x", "more than one `:`"),
        ] {
            let message = refusal(text);
            assert!(message.contains(says), "{text:?}: {message}");
            assert!(
                message.starts_with("invalid input: host pattern"),
                "{message}"
            );
        }
        let long_label = format!("{}.example.com", "a".repeat(64));
        assert!(refusal(&long_label).contains("longer than the 63"));
        let long_name = ["abcdefghij"; 26].join(".");
        assert!(refusal(&long_name).contains("253"));
        assert!(pattern(&["abcdefghi"; 25].join(".")).to_string().len() <= 253);
    }

    #[test]
    fn wildcards_under_registrable_domains_are_fine() {
        for text in [
            "*.example.com",
            "*.example.co.uk",
            "*.me.github.io",
            "*.internal",
            "*.svc.cluster.local",
        ] {
            assert!(text.parse::<HostPattern>().is_ok(), "{text}");
        }
    }
}
