//! An HTTP proxy between Spool and a provider, as `HTTPS_PROXY`,
//! `HTTP_PROXY` and `NO_PROXY` name it (the variables curl and the official
//! SDKs read): `https` calls tunnel through it with `CONNECT`, `http` calls
//! go to it in absolute form. Loopback hosts are never proxied: a model on
//! this machine is not behind the network's proxy.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most of a `CONNECT` reply's head that is read.
const MAX_REPLY_HEAD: usize = 16 * 1024;

/// A parsed `http://[user:password@]host:port` proxy.
#[derive(Clone, Debug)]
pub(crate) struct Proxy {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `Proxy-Authorization`'s value, when the URL carries credentials.
    authorization: Option<String>,
}

/// Why a proxy refused to open the tunnel.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TunnelError {
    #[error("the proxy could not be reached: {0}")]
    Io(#[from] std::io::Error),
    #[error("the proxy answered `{0}` to CONNECT")]
    Refused(String),
}

impl TunnelError {
    /// `Some(status)` when the proxy answered with one.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Io(_) => None,
            Self::Refused(line) => line.split_whitespace().nth(1)?.parse().ok(),
        }
    }
}

impl Proxy {
    /// Parses a proxy URL; only `http://` proxies are spoken to.
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("proxy `{url}`: not a URL ({e})"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("proxy `{url}`: only http:// proxies are supported"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("proxy `{url}` names no host"))?;
        let (credentials, _) = match authority.as_str().rsplit_once('@') {
            Some((credentials, host)) => (Some(credentials), host),
            None => (None, authority.as_str()),
        };
        Ok(Self {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authorization: credentials.map(|c| {
                use base64::Engine as _;
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(c)
                )
            }),
        })
    }

    /// The `Proxy-Authorization` header's value, if any.
    pub(crate) fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    /// A TCP connection to the proxy.
    pub(crate) async fn connect(&self) -> std::io::Result<TcpStream> {
        TcpStream::connect((self.host.as_str(), self.port)).await
    }

    /// Opens a tunnel to `authority` (`host:port`) over `stream`, a
    /// connection to this proxy.
    pub(crate) async fn tunnel(
        &self,
        stream: &mut TcpStream,
        authority: &str,
    ) -> Result<(), TunnelError> {
        let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
        if let Some(authorization) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        // Read byte by byte up to the blank line: nothing of the tunnel's
        // own traffic may be consumed here.
        let mut reply = Vec::new();
        while !reply.ends_with(b"\r\n\r\n") {
            if reply.len() >= MAX_REPLY_HEAD {
                return Err(TunnelError::Refused("an endless reply".into()));
            }
            let byte = stream.read_u8().await?;
            reply.push(byte);
        }
        let text = String::from_utf8_lossy(&reply);
        let status_line = text.lines().next().unwrap_or_default().trim().to_owned();
        let ok = status_line
            .split_whitespace()
            .nth(1)
            .is_some_and(|code| code.starts_with('2'));
        if ok {
            Ok(())
        } else {
            Err(TunnelError::Refused(status_line))
        }
    }
}

/// The proxy a call to `base_url` goes through, from the environment:
/// `HTTPS_PROXY` for `https`, `HTTP_PROXY` for `http` (either case), unless
/// `NO_PROXY` names the host or the host is this machine.
pub(crate) fn from_env(base_url: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let uri: http::Uri = base_url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let names: &[&str] = match uri.scheme_str()? {
        "https" => &["HTTPS_PROXY", "https_proxy"],
        "http" => &["HTTP_PROXY", "http_proxy"],
        _ => return None,
    };
    let get = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let proxy = names.iter().find_map(|name| get(name))?;
    if is_loopback(host) {
        return None;
    }
    let no_proxy = get("NO_PROXY")
        .or_else(|| get("no_proxy"))
        .unwrap_or_default();
    let excluded = no_proxy.split(',').map(str::trim).any(|entry| {
        let entry = entry.trim_start_matches('.');
        entry == "*"
            || (!entry.is_empty()
                && (host.eq_ignore_ascii_case(entry)
                    || host
                        .to_ascii_lowercase()
                        .ends_with(&format!(".{}", entry.to_ascii_lowercase()))))
    });
    (!excluded).then_some(proxy)
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_proxy_is_chosen_by_scheme_and_skipped_for_no_proxy_and_loopback() {
        let vars = env(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("http_proxy", "http://plain:8080"),
            ("NO_PROXY", "internal.example, .corp"),
        ]);
        let via = |url| from_env(url, &vars);
        assert_eq!(
            via("https://api.openai.com/v1").as_deref(),
            Some("http://proxy:3128")
        );
        assert_eq!(
            via("http://models.example:8000/v1").as_deref(),
            Some("http://plain:8080")
        );
        assert_eq!(via("https://internal.example"), None);
        assert_eq!(via("https://api.internal.example"), None);
        assert_eq!(via("https://llm.corp/v1"), None);
        assert_eq!(
            via("https://notcorp/v1").as_deref(),
            Some("http://proxy:3128")
        );
        assert_eq!(via("http://127.0.0.1:8080/v1"), None);
        assert_eq!(via("http://localhost:11434/v1"), None);
        assert_eq!(via("http://[::1]:8080"), None);
        assert_eq!(from_env("https://api.openai.com", &env(&[])), None);
        let everything = env(&[("HTTPS_PROXY", "http://proxy:3128"), ("no_proxy", "*")]);
        assert_eq!(from_env("https://api.openai.com", &everything), None);
    }

    #[test]
    fn proxy_urls_parse_with_their_credentials_as_basic_authorization() {
        let proxy = Proxy::parse("http://alice:s3cret@proxy.example:3128").unwrap();
        assert_eq!((proxy.host.as_str(), proxy.port), ("proxy.example", 3128));
        assert_eq!(proxy.authorization(), Some("Basic YWxpY2U6czNjcmV0"));
        let proxy = Proxy::parse("http://proxy.example").unwrap();
        assert_eq!((proxy.port, proxy.authorization()), (80, None));
        assert!(Proxy::parse("https://proxy.example").is_err());
        assert!(Proxy::parse("socks5://proxy.example:1080").is_err());
    }
}
