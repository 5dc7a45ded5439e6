//! The host's side of an allowed connection: straight to the destination, or through the host's
//! `HTTPS_PROXY` (an HTTP proxy, `CONNECT`), as a corporate network requires.
//!
//! Either way it reaches the address the policy decided on, never a name: a tunnel is
//! `CONNECT ip:port`. A proxy asked for a name resolves it again, and a name whose DNS the code
//! controls can answer the proxy differently than it answered the run (rebinding to the proxy's
//! loopback or its private network), so the tunnel would reach what nobody decided. A name is
//! still what `NO_PROXY` is matched against (a bypass connects to the same address directly).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a destination (or the proxy and the destination behind it) may take to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest proxy response head read.
const MAX_PROXY_HEAD: usize = 16 << 10;

/// How the host reaches destinations.
#[derive(Debug, Clone, Default)]
pub(crate) struct Upstream {
    proxy: Option<Proxy>,
}

#[derive(Debug, Clone)]
struct Proxy {
    /// `host:port` of the proxy.
    addr: String,
    /// `Proxy-Authorization` value, from the URL's user information.
    auth: Option<String>,
    /// Destinations reached directly (`NO_PROXY`: names, `.suffix`, addresses, `*`).
    bypass: Vec<String>,
}

impl Upstream {
    /// From the host's environment: `HTTPS_PROXY` (or `https_proxy`, then `ALL_PROXY`), an
    /// `http://[user:password@]host:port` proxy, and `NO_PROXY`.
    pub(crate) fn from_env() -> Self {
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
        };
        let Some(url) = var(&["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]) else {
            return Self::default();
        };
        let bypass = var(&["NO_PROXY", "no_proxy"])
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            proxy: Proxy::parse(&url, bypass),
        }
    }

    /// Whether a connection to `dest` (reached as `name`) goes through the host's proxy.
    pub(crate) fn proxies(&self, dest: SocketAddr, name: Option<&str>) -> bool {
        self.proxy.as_ref().is_some_and(|p| p.applies(dest, name))
    }

    /// Connects to `dest` (reached as `name` when a lookup led to it).
    pub(crate) async fn connect(
        &self,
        dest: SocketAddr,
        name: Option<&str>,
    ) -> io::Result<TcpStream> {
        let connecting = async {
            let stream = match &self.proxy {
                Some(proxy) if proxy.applies(dest, name) => proxy.tunnel(dest).await?,
                _ => TcpStream::connect(dest).await?,
            };
            stream.set_nodelay(true)?;
            Ok(stream)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::from_raw_os_error(libc::ETIMEDOUT)),
        }
    }
}

impl Proxy {
    fn parse(url: &str, bypass: Vec<String>) -> Option<Proxy> {
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some(_) => return None, // only plain-HTTP proxies carry CONNECT here
            None => url,
        };
        let authority = rest.split('/').next().unwrap_or(rest);
        let (auth, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        if hostport.is_empty() {
            return None;
        }
        let addr = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !hostport.ends_with(']')
        {
            hostport.to_owned()
        } else {
            format!("{hostport}:80")
        };
        let auth = auth.map(|userinfo| {
            use base64::Engine;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(percent_decode(userinfo))
            )
        });
        Some(Proxy { addr, auth, bypass })
    }

    /// Whether a connection to `dest` goes through the proxy: unless `NO_PROXY` names it (as curl
    /// reads it: names, `.suffix`, addresses, `*`).
    fn applies(&self, dest: SocketAddr, name: Option<&str>) -> bool {
        let ip = dest.ip().to_string();
        !self.bypass.iter().any(|rule| {
            rule == "*"
                || *rule == ip
                || name.is_some_and(|n| {
                    let n = n.to_ascii_lowercase();
                    let rule = rule.trim_start_matches('.');
                    n == rule || n.ends_with(&format!(".{rule}"))
                })
        })
    }

    /// A `CONNECT` tunnel to `dest`, by its address: the one decided.
    async fn tunnel(&self, dest: SocketAddr) -> io::Result<TcpStream> {
        let mut stream = TcpStream::connect(&self.addr).await?;
        let target = tunnel_target(dest);
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.auth {
            request.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await?;
        // The response head, byte by byte: nothing past it may be consumed (it is the destination's).
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= MAX_PROXY_HEAD {
                return Err(io::Error::other("the proxy's response head is too long"));
            }
            let byte = stream.read_u8().await?;
            head.push(byte);
        }
        let status = head
            .split(|&b| b == b' ')
            .nth(1)
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok());
        match status {
            Some(200..=299) => Ok(stream),
            Some(code) => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "the proxy {} refused CONNECT {target}: HTTP {code}",
                    self.addr
                ),
            )),
            None => Err(io::Error::other(format!(
                "the proxy {} did not answer CONNECT with HTTP",
                self.addr
            ))),
        }
    }
}

/// What a `CONNECT` names: the address and port (IPv6 in brackets).
fn tunnel_target(dest: SocketAddr) -> String {
    match dest {
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        SocketAddr::V4(v4) => v4.to_string(),
    }
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn proxy_urls_and_no_proxy_rules_are_read_as_curl_reads_them() {
        let p = Proxy::parse("http://u%40x:p@proxy.corp:3128/", vec![".internal".into()]).unwrap();
        assert_eq!(p.addr, "proxy.corp:3128");
        assert_eq!(p.auth.as_deref(), Some("Basic dUB4OnA="));
        let dest: SocketAddr = "93.184.215.14:443".parse().unwrap();
        assert!(p.applies(dest, Some("example.org")));
        assert!(!p.applies(dest, Some("db.internal")));
        let local = Proxy::parse("proxy:3128", vec!["127.0.0.1".into()]).unwrap();
        assert!(!local.applies("127.0.0.1:80".parse().unwrap(), None));
        assert_eq!(
            Proxy::parse("proxy:8080", vec![]).unwrap().addr,
            "proxy:8080"
        );
        assert_eq!(
            Proxy::parse("http://proxy", vec![]).unwrap().addr,
            "proxy:80"
        );
        assert!(Proxy::parse("https://proxy:443", vec![]).is_none());
    }

    #[test]
    fn a_tunnel_names_the_decided_address_never_a_name() {
        assert_eq!(
            tunnel_target("93.184.215.14:443".parse().unwrap()),
            "93.184.215.14:443"
        );
        assert_eq!(
            tunnel_target("[2606:2800:220:1::]:8080".parse().unwrap()),
            "[2606:2800:220:1::]:8080"
        );
    }
}
