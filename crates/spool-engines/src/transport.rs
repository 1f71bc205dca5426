//! One HTTP/1.1 request to a provider, on Spool's one outbound path
//! (`spool_edge::outbound`: the connect deadline, the trust policy of web
//! roots plus the configured extra roots, hyper's client connection), with
//! a proxy's tunnel in between when one is set. One connection per call: a
//! model call lasts seconds, so a pool would save little and would add
//! stale-connection failures to classify.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use spool_edge::outbound;
use tokio::net::TcpStream;

/// Where a provider's API lives: a base URL and a path under it.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    uri: Uri,
    host: String,
    port: u16,
    /// The TLS client configuration, for `https`.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The proxy in between, if any.
    proxy: Option<crate::proxy::Proxy>,
}

/// Why a request did not get a response.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("could not connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS with {0} failed: {1}")]
    Tls(String, std::io::Error),
    #[error("HTTP exchange with {0} failed: {1}")]
    Http(String, hyper::Error),
    #[error("the proxy refused a tunnel to {0}: {1}")]
    Proxy(String, crate::proxy::TunnelError),
}

impl SendError {
    /// The status a proxy refused the tunnel with, if that is what failed.
    pub(crate) fn proxy_status(&self) -> Option<u16> {
        match self {
            Self::Proxy(_, error) => error.status(),
            _ => None,
        }
    }

    /// Whether another attempt may go better: a refused or reset
    /// connection may, a certificate that does not verify will not.
    pub(crate) fn retryable(&self) -> bool {
        match self {
            Self::Connect(..) | Self::Http(..) => true,
            // A proxy that wants credentials, or forbids the host, will
            // again; one that failed or timed out may not.
            Self::Proxy(_, error) => !matches!(error.status(), Some(400..=499)),
            Self::Tls(_, error) => !matches!(
                error.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            ),
        }
    }
}

impl Endpoint {
    /// `base` (an `http://` or `https://` URL) joined with `path`, reached
    /// through `proxy` when one is given; for `https`, TLS trusting the
    /// webpki roots and the certificates in `ca_file`.
    ///
    /// # Errors
    ///
    /// What is wrong with the URL or the proxy, or with `ca_file`
    /// (prefixed `TLS: `).
    pub(crate) fn parse(
        base: &str,
        path: &str,
        ca_file: Option<&Path>,
        proxy: Option<&str>,
    ) -> Result<Self, String> {
        let proxy = proxy.map(crate::proxy::Proxy::parse).transpose()?;
        let joined = format!(
            "{}/{}",
            base.trim_end_matches('/'),
            path.trim_start_matches('/')
        );
        let uri: Uri = joined.parse().map_err(|e| format!("not a URL ({e})"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("the scheme must be http or https".into()),
        };
        let tls = if tls {
            Some(tls_config(ca_file).map_err(|e| format!("TLS: {e}"))?)
        } else {
            None
        };
        let host = uri.host().ok_or("the URL names no host")?;
        // `[::1]` connects as `::1`.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        Ok(Self {
            uri,
            host,
            port,
            tls,
            proxy,
        })
    }

    pub(crate) fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The request target: the path, or the whole URL when a proxy
    /// carries a plain `http` request.
    pub(crate) fn target(&self) -> String {
        match (&self.proxy, &self.tls) {
            (Some(_), None) => self.uri.to_string(),
            _ => self
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned(),
        }
    }

    /// `Proxy-Authorization` for a plain `http` request through a proxy.
    pub(crate) fn proxy_authorization(&self) -> Option<&str> {
        match (&self.proxy, &self.tls) {
            (Some(proxy), None) => proxy.authorization(),
            _ => None,
        }
    }

    /// The `Host` header's value.
    pub(crate) fn authority(&self) -> &str {
        self.uri.authority().map_or("", |a| a.as_str())
    }

    /// Sends `request` on a new connection and returns the response head;
    /// the body streams as it is read.
    pub(crate) async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, SendError> {
        let mut tcp = match &self.proxy {
            Some(proxy) => proxy.connect().await.map_err(|e| {
                SendError::Connect(format!("the proxy {}:{}", proxy.host, proxy.port), e)
            })?,
            None => outbound::connect(TcpStream::connect((self.host.as_str(), self.port)))
                .await
                .map_err(|e| SendError::Connect(self.authority().to_owned(), e))?,
        };
        // Model answers stream in small pieces; Nagle would hold the request.
        let _ = tcp.set_nodelay(true);
        if let Some(config) = &self.tls {
            if let Some(proxy) = &self.proxy {
                let authority = format!("{}:{}", self.uri.host().unwrap_or_default(), self.port);
                proxy
                    .tunnel(&mut tcp, &authority)
                    .await
                    .map_err(|e| SendError::Proxy(authority.clone(), e))?;
            }
            let stream = outbound::tls(tcp, &self.host, Arc::clone(config))
                .await
                .map_err(|e| SendError::Tls(self.authority().to_owned(), e))?;
            self.exchange(stream, request).await
        } else {
            self.exchange(tcp, request).await
        }
    }

    async fn exchange<S>(
        &self,
        stream: S,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, SendError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let http = |e| SendError::Http(self.authority().to_owned(), e);
        // The connection's task ends when the response body is read or
        // dropped.
        let mut sender = outbound::handshake(stream).await.map_err(http)?;
        sender.send_request(request).await.map_err(http)
    }
}

/// The variable naming extra trusted certificates (PEM), for a network
/// whose proxy signs with its own authority.
pub(crate) use spool_edge::outbound::EXTRA_ROOTS_VARIABLE;

/// The outbound trust policy's TLS configuration, with the certificates in
/// `ca_file` trusted beside the web roots.
pub(crate) fn tls_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    outbound::client_config(ca_file).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_join_paths_and_default_ports() {
        let e = Endpoint::parse(
            "https://api.openai.com/v1/",
            "/chat/completions",
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            e.uri().to_string(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            (e.host.as_str(), e.port, e.tls.is_some()),
            ("api.openai.com", 443, true)
        );
        let e = Endpoint::parse("http://[::1]:8080", "v1/messages", None, None).unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.tls.is_some()),
            ("::1", 8080, false)
        );
        assert_eq!(e.authority(), "[::1]:8080");
        assert!(Endpoint::parse("ftp://example.com", "x", None, None).is_err());
        assert!(Endpoint::parse("localhost:8080", "x", None, None).is_err());
        let missing = Endpoint::parse("https://h", "x", Some(Path::new("/nonexistent.pem")), None);
        assert!(missing.unwrap_err().starts_with("TLS: "));
    }

    #[test]
    fn the_tls_configuration_builds_with_the_webpki_roots() {
        let config = tls_config(None).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
