//! One HTTP/1.1 request to a provider: TCP, TLS through rustls with the
//! webpki roots for `https`, hyper's client connection. One connection per
//! call: a model call lasts seconds, so a pool would save little and would
//! add stale-connection failures to classify.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where a provider's API lives: a base URL and a path under it.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    uri: Uri,
    host: String,
    port: u16,
    tls: bool,
}

/// Why a request did not get a response; all of them may be retried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("could not connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS with {0} failed: {1}")]
    Tls(String, std::io::Error),
    #[error("HTTP exchange with {0} failed: {1}")]
    Http(String, hyper::Error),
}

impl Endpoint {
    /// `base` (an `http://` or `https://` URL) joined with `path`.
    pub(crate) fn parse(base: &str, path: &str) -> Result<Self, String> {
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
        let host = uri.host().ok_or("the URL names no host")?;
        // `[::1]` connects as `::1`.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Self {
            uri,
            host,
            port,
            tls,
        })
    }

    pub(crate) fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The request target: an HTTP/1.1 client sends the path, not the URL.
    pub(crate) fn target(&self) -> &str {
        self.uri.path_and_query().map_or("/", |p| p.as_str())
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
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| SendError::Connect(self.authority().to_owned(), e))?;
        // Model answers stream in small pieces; Nagle would hold the request.
        let _ = tcp.set_nodelay(true);
        if self.tls {
            let name = rustls::pki_types::ServerName::try_from(self.host.clone()).map_err(|e| {
                SendError::Tls(
                    self.authority().to_owned(),
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                )
            })?;
            let stream = tokio_rustls::TlsConnector::from(tls_config())
                .connect(name, tcp)
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
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        // The connection task ends when the response body is read or dropped.
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(target: "spool::engine", %error, "provider connection closed");
            }
        });
        sender.send_request(request).await.map_err(http)
    }
}

/// One TLS client configuration for the process: ring for crypto, the
/// webpki roots for trust, HTTP/1.1 by ALPN.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots =
                rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Arc::new(config)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_join_paths_and_default_ports() {
        let e = Endpoint::parse("https://api.openai.com/v1/", "/chat/completions").unwrap();
        assert_eq!(
            e.uri().to_string(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            (e.host.as_str(), e.port, e.tls),
            ("api.openai.com", 443, true)
        );
        let e = Endpoint::parse("http://[::1]:8080", "v1/messages").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.tls), ("::1", 8080, false));
        assert_eq!(e.authority(), "[::1]:8080");
        assert!(Endpoint::parse("ftp://example.com", "x").is_err());
        assert!(Endpoint::parse("localhost:8080", "x").is_err());
    }

    #[test]
    fn the_tls_configuration_builds_with_the_webpki_roots() {
        let config = tls_config();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
