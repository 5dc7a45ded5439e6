//! Which addresses are not public: the special-purpose ranges, and the IPv4 address an IPv6
//! spelling reaches.

use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `ip` as what it really reaches: the IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, but not `::` or `::1`),
/// NAT64 (`64:ff9b::a.b.c.d`) or 6to4 (`2002:aabb:ccdd::`) address; any other address as it is.
/// Teredo addresses stay as they are (and are non-public).
pub fn effective_ip(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    let [.., a, b, c, d] = v6.octets();
    let low32 = IpAddr::V4(Ipv4Addr::new(a, b, c, d));
    match v6.segments() {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => low32,
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => low32,
        [0, 0, 0, 0, 0, 0, _, _] if v6 != Ipv6Addr::UNSPECIFIED && v6 != Ipv6Addr::LOCALHOST => {
            low32
        }
        [0x2002, high, low, ..] => {
            let [a, b] = high.to_be_bytes();
            let [c, d] = low.to_be_bytes();
            IpAddr::V4(Ipv4Addr::new(a, b, c, d))
        }
        _ => ip,
    }
}

/// Which special (non-public) range `ip` is in, if any, as a short phrase that completes
/// "… is " ("a loopback address", "a private address (RFC 1918)"). Embedded IPv4 addresses are
/// classified as what they reach ([`effective_ip`]). The host's own addresses are not known here;
/// see [`HostAddrs`].
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match effective_ip(ip) {
        IpAddr::V4(v4) => V4_SPECIAL
            .iter()
            .find(|(net, _)| net.contains(&v4))
            .map(|(_, what)| *what),
        IpAddr::V6(v6) => V6_SPECIAL
            .iter()
            .find(|(net, _)| net.contains(&v6))
            .map(|(_, what)| *what)
            .or_else(|| {
                (!GLOBAL_UNICAST.contains(&v6)).then_some(
                    "a reserved IPv6 address (outside 2000::/3, the global unicast range)",
                )
            }),
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(segments: [u16; 8], len: u8) -> Ipv6Net {
    let [a, b, c, d, e, f, g, h] = segments;
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len)
}

/// Non-public IPv4 ranges (IANA special-purpose registry, then the cloud platforms' own services
/// in public space), the first match naming it.
const V4_SPECIAL: [(Ipv4Net, &str); 19] = [
    (v4(0, 0, 0, 0, 8), "a \"this network\" address (0.0.0.0/8)"),
    (v4(10, 0, 0, 0, 8), "a private address (RFC 1918)"),
    (
        v4(100, 64, 0, 0, 10),
        "a carrier-grade NAT address (100.64.0.0/10)",
    ),
    (v4(127, 0, 0, 0, 8), "a loopback address"),
    (
        v4(169, 254, 0, 0, 16),
        "a link-local address (the cloud metadata address 169.254.169.254 among them)",
    ),
    (v4(172, 16, 0, 0, 12), "a private address (RFC 1918)"),
    (
        v4(192, 0, 0, 0, 24),
        "an IETF protocol assignment (192.0.0.0/24)",
    ),
    (
        v4(192, 0, 2, 0, 24),
        "a documentation address (192.0.2.0/24)",
    ),
    (
        v4(192, 88, 99, 0, 24),
        "a 6to4 relay address (192.88.99.0/24, deprecated)",
    ),
    (v4(192, 168, 0, 0, 16), "a private address (RFC 1918)"),
    (
        v4(198, 18, 0, 0, 15),
        "a benchmarking address (198.18.0.0/15)",
    ),
    (
        v4(198, 51, 100, 0, 24),
        "a documentation address (198.51.100.0/24)",
    ),
    (
        v4(203, 0, 113, 0, 24),
        "a documentation address (203.0.113.0/24)",
    ),
    (v4(224, 0, 0, 0, 4), "a multicast address"),
    (v4(255, 255, 255, 255, 32), "the broadcast address"),
    (v4(240, 0, 0, 0, 4), "a reserved address (240.0.0.0/4)"),
    // Public addresses that reach the cloud host's platform, not the internet (docs/cli.md names
    // each with where its cloud documents it); every other metadata address is link-local,
    // CGNAT, an IETF assignment or unique-local, refused above.
    (
        v4(168, 63, 129, 16, 32),
        "Azure's platform address (WireServer: its DNS, DHCP and VM agent)",
    ),
    (
        v4(161, 26, 0, 0, 16),
        "IBM Cloud's service network (its private DNS resolvers and NTP)",
    ),
    (
        v4(166, 8, 0, 0, 14),
        "IBM Cloud's service network (its private service endpoints)",
    ),
];

/// Non-public IPv6 ranges, the first match naming it; anything outside [`GLOBAL_UNICAST`] is
/// non-public too. (IPv4-embedding ranges never get here: [`effective_ip`] unwraps them.)
const V6_SPECIAL: [(Ipv6Net, &str); 14] = [
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "the unspecified address"),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "a loopback address"),
    (
        v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        "a discard-only address (100::/64)",
    ),
    (
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        "a local-use NAT64 address (64:ff9b:1::/48)",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        "a Teredo tunnel address (2001::/32)",
    ),
    (
        v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48),
        "a benchmarking address (2001:2::/48)",
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        "an IETF protocol assignment (2001::/23)",
    ),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        "a documentation address (2001:db8::/32)",
    ),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        "a documentation address (3fff::/20)",
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        "a unique local address (IPv6, fc00::/7)",
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        "a link-local address (IPv6)",
    ),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        "a site-local address (IPv6, deprecated)",
    ),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "a multicast address"),
    (
        v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),
        "a segment routing address (5f00::/16)",
    ),
];

/// The IPv6 global unicast range; every IPv6 address outside it is non-public.
const GLOBAL_UNICAST: Ipv6Net = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// Ranges of IPv6 addresses that carry an IPv4 address in their low 32 bits, every one of them
/// (so a range inside one converts exactly): IPv4-mapped, IPv4-translated and NAT64.
pub(super) const LOW32_EMBEDDING: [Ipv6Net; 3] = [
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
    v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
];

/// Every IPv6 range that [`effective_ip`] reads (mostly) as IPv4: the above, IPv4-compatible
/// (less `::` and `::1`) and 6to4.
pub(super) const EMBEDDING: [Ipv6Net; 5] = [
    LOW32_EMBEDDING[0],
    LOW32_EMBEDDING[1],
    LOW32_EMBEDDING[2],
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),
];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn every_special_range_is_named() {
        for (addr, says) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("::1", "loopback"),
            ("0.0.0.0", "this network"),
            ("0.1.2.3", "this network"),
            ("::", "unspecified"),
            ("10.1.2.3", "RFC 1918"),
            ("172.16.0.1", "RFC 1918"),
            ("172.31.255.255", "RFC 1918"),
            ("192.168.1.1", "RFC 1918"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.255", "carrier-grade NAT"),
            ("169.254.169.254", "metadata"),
            ("169.254.0.1", "link-local"),
            ("fe80::1", "link-local"),
            ("fc00::1", "unique local"),
            ("fd00:ec2::254", "unique local"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("ff02::1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
            ("192.0.0.8", "IETF protocol assignment"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.1", "documentation"),
            ("203.0.113.1", "documentation"),
            ("2001:db8::1", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("2001:2::1", "benchmarking"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("100::1", "discard-only"),
            ("64:ff9b:1::1", "local-use NAT64"),
            ("fec0::1", "site-local"),
            ("4000::1", "outside 2000::/3"),
            // The clouds' metadata and platform addresses (docs/cli.md lists where each is from).
            ("168.63.129.16", "Azure's platform address"),
            ("100.100.100.200", "carrier-grade NAT"),
            ("192.0.0.192", "IETF protocol assignment"),
            ("fd00:ec2::254", "unique local"),
            ("fd00:ec2::253", "unique local"),
            ("169.254.170.2", "link-local"),
            ("fe80::a9fe:a9fe", "link-local"),
            ("161.26.0.7", "IBM Cloud's service network"),
            ("166.9.12.1", "IBM Cloud's service network"),
            ("::ffff:168.63.129.16", "Azure"),
        ] {
            let found = special_range(ip(addr));
            assert!(found.is_some_and(|f| f.contains(says)), "{addr}: {found:?}");
        }
    }

    #[test]
    fn public_addresses_are_not_special() {
        for addr in [
            "93.184.215.14",
            "8.8.8.8",
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "192.169.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:82a::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "168.63.129.15",
            "168.63.129.17",
            "161.27.0.1",
            "166.12.0.1",
        ] {
            assert_eq!(special_range(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn embedded_ipv4_spellings_are_classified_as_what_they_reach() {
        for (addr, reaches) in [
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("::ffff:7f00:1", "127.0.0.1"),
            ("::127.0.0.1", "127.0.0.1"),
            ("::ffff:0:127.0.0.1", "127.0.0.1"),
            ("64:ff9b::127.0.0.1", "127.0.0.1"),
            ("2002:7f00:1::", "127.0.0.1"),
            ("2002:7f00:1:1234::5678", "127.0.0.1"),
            ("::ffff:169.254.169.254", "169.254.169.254"),
            ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
            ("2002:a9fe:a9fe::1", "169.254.169.254"),
            ("::169.254.169.254", "169.254.169.254"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
        ] {
            assert_eq!(effective_ip(ip(addr)), ip(reaches), "{addr}");
            assert_eq!(
                special_range(ip(addr)),
                special_range(ip(reaches)),
                "{addr}"
            );
        }
        assert_eq!(effective_ip(ip("::1")), ip("::1"));
        assert_eq!(effective_ip(ip("::")), ip("::"));
        assert_eq!(effective_ip(ip("2001:db8::1")), ip("2001:db8::1"));
    }
}
