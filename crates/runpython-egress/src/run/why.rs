//! Why a connect was refused, told to the run's runner without a tool call: on `EACCES` it asks its
//! own resolver a TXT question in a zone that exists nowhere else, `PORT.HEX.why.runpython.invalid`
//! (the host the code passed, hex-encoded; `.invalid` never resolves anywhere, RFC 6761), and the
//! resolver answers from the host's memory of the run's latest refusals ([`REMEMBERED`] of them).
//! A refusal so costs the run nothing of its tool-call budget and the host one bounded search;
//! the question is not logged as a lookup, and nothing leaves the host.
//!
//! The runner's side is `_network_messages` in runpython-core's `runpython_run.py`.

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::policy::effective_ip;

/// The zone of the questions.
pub(crate) const ZONE: &str = "why.runpython.invalid";

/// Refusals remembered for the runner.
pub(crate) const REMEMBERED: usize = 64;

/// The longest reason told (a TXT answer fits a 1232-byte UDP answer).
const MAX_REASON: usize = 900;

/// A refusal remembered for the runner's exception message.
#[derive(Debug)]
pub(crate) struct Remembered {
    /// The address refused, as [`effective_ip`] gives it.
    pub addr: String,
    /// The name that led to it, if any.
    pub name: Option<String>,
    pub port: u16,
    pub reason: String,
}

/// The host and port a question in [`ZONE`] asks about: `PORT.HEX[.HEX…].why.runpython.invalid`,
/// the labels after the port the host's bytes in hex (split to fit labels). `None` for any other
/// name.
pub(crate) fn question(name: &str) -> Option<(String, u16)> {
    let rest = name.strip_suffix(ZONE)?.strip_suffix('.')?;
    let (port, hex) = rest.split_once('.')?;
    let port = port.parse().ok()?;
    let hex: String = hex.split('.').collect();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((String::from_utf8(bytes).ok()?, port))
}

/// Why the latest connect to `host` (an address, or the name the code passed) and `port` was
/// refused: by address, else by name, else the latest refusal on that port.
pub(crate) fn find(reasons: &VecDeque<Remembered>, host: &str, port: u16) -> Option<String> {
    let host = host
        .parse::<IpAddr>()
        .map(|ip| effective_ip(ip).to_string())
        .unwrap_or_else(|_| host.trim_end_matches('.').to_ascii_lowercase());
    reasons
        .iter()
        .rev()
        .find(|r| r.addr == host && r.port == port)
        .or_else(|| {
            reasons
                .iter()
                .rev()
                .find(|r| r.name.as_deref() == Some(host.as_str()) && r.port == port)
        })
        .or_else(|| reasons.iter().rev().find(|r| r.port == port))
        .map(|r| r.reason.clone())
}

/// `reason` as TXT character-strings (at most 255 bytes each, cut on characters), at most
/// [`MAX_REASON`] bytes in all.
pub(crate) fn txt(reason: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut piece = String::new();
    let mut total = 0;
    for c in reason.chars() {
        total += c.len_utf8();
        if total > MAX_REASON {
            break;
        }
        if piece.len() + c.len_utf8() > 255 {
            out.push(std::mem::take(&mut piece));
        }
        piece.push(c);
    }
    if !piece.is_empty() {
        out.push(piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> String {
        text.bytes().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn questions_name_the_host_in_hex_and_the_port() {
        let name = format!("443.{}.{ZONE}", hex("api.test"));
        assert_eq!(question(&name), Some(("api.test".into(), 443)));
        let long = hex("a-rather-long-name.with.many.labels.example.test");
        let split = format!("80.{}.{}.{ZONE}", &long[..62], &long[62..]);
        assert_eq!(
            question(&split),
            Some((
                "a-rather-long-name.with.many.labels.example.test".into(),
                80
            ))
        );
        assert_eq!(
            question(&format!("80.{}.{ZONE}", hex("::1"))),
            Some(("::1".into(), 80))
        );
        for other in [
            "example.com",
            "why.runpython.invalid",
            "x.why.runpython.invalid",
            "99999.61.why.runpython.invalid",
            "80.6.why.runpython.invalid",
            "80.zz.why.runpython.invalid",
            "80.61.nowhy.runpython.invalid",
        ] {
            assert_eq!(question(other), None, "{other}");
        }
    }

    #[test]
    fn the_reason_is_found_by_address_then_name_then_port() {
        let remembered = |addr: &str, name: Option<&str>, port, reason: &str| Remembered {
            addr: addr.into(),
            name: name.map(Into::into),
            port,
            reason: reason.into(),
        };
        let reasons = VecDeque::from([
            remembered("10.0.0.1", None, 80, "private"),
            remembered("93.184.215.14", Some("api.test"), 443, "by name"),
            remembered("1.2.3.4", None, 8080, "latest on 8080"),
        ]);
        assert_eq!(
            find(&reasons, "::ffff:10.0.0.1", 80).as_deref(),
            Some("private")
        );
        assert_eq!(find(&reasons, "API.test.", 443).as_deref(), Some("by name"));
        assert_eq!(
            find(&reasons, "other.test", 8080).as_deref(),
            Some("latest on 8080")
        );
        assert_eq!(find(&reasons, "other.test", 9), None);
    }

    #[test]
    fn long_reasons_fit_txt_strings_and_an_answer() {
        let reason = "é".repeat(600);
        let pieces = txt(&reason);
        assert!(pieces.iter().all(|p| p.len() <= 255));
        assert_eq!(pieces.concat().len(), MAX_REASON);
        assert_eq!(txt("short"), ["short"]);
    }
}
