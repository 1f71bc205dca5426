//! The exporters' HTTP client: Spool's one outbound path
//! (`spool_edge::outbound`: its connect deadline and its trust policy, the
//! web roots plus `SSL_CERT_FILE`'s), not a second HTTP stack. Each request
//! runs on the Tokio runtime the client was made on, so a caller off it
//! (the metrics reader's thread) can await it too. One connection per
//! export: exports are seconds apart.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry_http::{HttpClient, HttpError};
use spool_edge::outbound::{self, TrustError};
use tokio::net::TcpStream;

/// The most of a collector's answer read: it says accepted or why not.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// An HTTP/1.1 client on a Tokio runtime.
#[derive(Clone, Debug)]
pub struct Client {
    handle: tokio::runtime::Handle,
    tls: Arc<rustls::ClientConfig>,
    timeout: Duration,
}

impl Client {
    /// A client whose requests run on `handle`, each given `timeout` from
    /// connecting to the answer's last byte.
    ///
    /// # Errors
    ///
    /// When TLS cannot be set up: the file `SSL_CERT_FILE` names cannot
    /// be read or holds no certificate.
    pub fn new(handle: tokio::runtime::Handle, timeout: Duration) -> Result<Self, TrustError> {
        Ok(Self {
            handle,
            tls: outbound::environment_config()?,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.clone();
        let timeout = self.timeout;
        let exchange = self.handle.spawn(async move {
            tokio::time::timeout(timeout, client.exchange(request))
                .await
                .map_err(|_| HttpError::from(format!("no answer within {timeout:?}")))?
        });
        exchange
            .await
            .map_err(|e| HttpError::from(format!("the export task ended: {e}")))?
    }
}

impl Client {
    async fn exchange(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let uri = request.uri().clone();
        let host = uri
            .host()
            .ok_or("the endpoint names no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("the endpoint's scheme must be http or https".into()),
        };
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let tcp = outbound::connect(TcpStream::connect((host.as_str(), port))).await?;
        let (mut parts, body) = request.into_parts();
        // HTTP/1.1 sends the path, with the authority in `Host`.
        if let Some(authority) = uri.authority() {
            parts.headers.insert(
                http::header::HOST,
                http::HeaderValue::from_str(authority.as_str())?,
            );
        }
        parts.uri = uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
        let request = Request::from_parts(parts, Full::new(body));
        let mut sender = if tls {
            let stream = outbound::tls(tcp, &host, Arc::clone(&self.tls)).await?;
            outbound::handshake(stream).await?
        } else {
            outbound::handshake(tcp).await?
        };
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await?
            .to_bytes();
        Ok(Response::from_parts(parts, body))
    }
}
