//! Which name a connection that may be for a secret's host is really for, read before anything is
//! forwarded: the TLS ClientHello's server name, or a plaintext request's `Host`, peeked (the bytes
//! stay in the socket for whichever path takes it). Many names share an address (a CDN's), so the
//! address alone cannot say; a connection for another name passes through untouched.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::rustls::server::Acceptor;

use super::rewrite::normalize_host;
use super::RunSecrets;

/// How long the code may take to send its first bytes before the connection is taken as one for
/// no secret (a protocol where the server speaks first).
const FIRST_BYTES: Duration = Duration::from_secs(2);

/// The most of a connection's start read to find its name.
const MAX_PEEK: usize = 16 << 10;

impl RunSecrets {
    /// The name `child` claims (its TLS server name or its first request's `Host`), and whether
    /// to intercept it as that name: when a secret is for it at `port` and the run resolved it to
    /// this address (`names`; so a value never goes to an address the code chose by claiming a
    /// name). Not intercepted: it passes through.
    pub(crate) async fn classify(
        &self,
        child: &TcpStream,
        names: &[String],
        port: u16,
    ) -> (Option<String>, bool) {
        let Some(name) = tokio::time::timeout(FIRST_BYTES, claimed_name(child))
            .await
            .ok()
            .flatten()
        else {
            return (None, false);
        };
        let resolved = names.iter().any(|n| normalize_host(n) == name);
        let wanted = self
            .secrets
            .iter()
            .any(|secret| secret.matches_host(&name, port));
        (Some(name), resolved && wanted)
    }
}

/// The name the connection's first bytes claim, normalized; `None` when they claim none.
async fn claimed_name(child: &TcpStream) -> Option<String> {
    let mut buf = vec![0u8; MAX_PEEK];
    let mut seen = 0;
    loop {
        let n = child.peek(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        if n > seen {
            seen = n;
            let head = &buf[..n];
            let found = if head[0] == 0x16 {
                server_name(head)
            } else {
                host_header(head)
            };
            match found {
                Found::Name(name) => return Some(normalize_host(&name)),
                Found::None => return None,
                Found::More if n >= MAX_PEEK => return None,
                Found::More => {}
            }
        }
        // More of the start is on its way: peek again shortly.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

enum Found {
    Name(String),
    None,
    More,
}

/// The server name of a ClientHello that starts `head`.
fn server_name(head: &[u8]) -> Found {
    let mut acceptor = Acceptor::default();
    let mut reader = head;
    if acceptor.read_tls(&mut reader).is_err() {
        return Found::None;
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => match accepted.client_hello().server_name() {
            Some(name) => Found::Name(name.to_owned()),
            None => Found::None,
        },
        Ok(None) => Found::More,
        Err(_) => Found::None,
    }
}

/// The `Host` of a plaintext request head that starts `head`.
fn host_header(head: &[u8]) -> Found {
    let Some(end) = memchr::memmem::find(head, b"\r\n\r\n") else {
        return Found::More;
    };
    let text = String::from_utf8_lossy(&head[..end]);
    let host = text.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim())
    });
    match host {
        // `host:port` (a bracketed IPv6 address keeps its brackets until normalized).
        Some(host) => {
            let bare = match host.rfind(':') {
                Some(i) if !host[i..].contains(']') => &host[..i],
                _ => host,
            };
            Found::Name(bare.to_owned())
        }
        None => Found::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plaintext_request_names_its_host() {
        let head = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nHost: API.test:8080\r\n\r\n";
        assert!(matches!(host_header(head), Found::Name(n) if n == "API.test"));
        assert!(matches!(
            host_header(b"GET / HTTP/1.1\r\nHost: a"),
            Found::More
        ));
        assert!(matches!(
            host_header(b"GET / HTTP/1.1\r\n\r\n"),
            Found::None
        ));
        assert!(matches!(
            host_header(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Found::Name(n) if n == "[::1]"
        ));
    }

    #[test]
    fn bytes_that_are_not_a_client_hello_name_nothing() {
        assert!(matches!(
            server_name(&[0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0]),
            Found::None | Found::More
        ));
        assert!(matches!(server_name(&[0x16, 3, 1]), Found::More));
    }
}
