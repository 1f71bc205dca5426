//! An A2A client for Spool's own use: fetch an agent's card, send it a
//! message over its JSON-RPC interface (its HTTP+JSON one when it offers
//! no other), read the task it answers. Connections go through the edge's
//! outbound path, so peers are reached under the same connect deadline
//! and trust policy (the web roots, `SPOOL_EXTRA_CA_CERTS`) as model
//! providers.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use spool_edge::outbound;
use spool_wire::a2a::{self, AgentCard, ErrorKind, SendMessageRequest, SendMessageResponse, Task};
use tokio::net::TcpStream;

/// The largest answer read from a peer.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// What went wrong reaching a peer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A URL that is not `http://` or `https://` with a host.
    #[error("`{0}` is not an http:// or https:// URL with a host")]
    Url(String),
    /// It could not be reached, or did not answer in time.
    #[error("{0}: {1}")]
    Unreachable(String, String),
    /// It answered with something that is not A2A.
    #[error("{0} answered outside the protocol: {1}")]
    Invalid(String, String),
    /// Its address is one the request may not reach.
    #[error(
        "{url}: {host} resolves to {ip}, a private or local address ([a2a] push_private_networks allows them)"
    )]
    Private {
        /// The URL.
        url: String,
        /// Its host.
        host: String,
        /// The address refused.
        ip: std::net::IpAddr,
    },
    /// It answered with an A2A error.
    #[error("{url} answered {reason} ({code}): {message}")]
    Refused {
        /// The URL asked.
        url: String,
        /// The JSON-RPC code (or HTTP status).
        code: i64,
        /// The error's kind, when the code is one of the specification's.
        reason: String,
        /// What it said.
        message: String,
    },
}

impl ClientError {
    /// Whether asking again may succeed: the peer was unreachable or
    /// failed inside, not refused.
    #[must_use]
    pub fn retryable(&self) -> bool {
        match self {
            Self::Unreachable(..) => true,
            Self::Refused { code, .. } => {
                ErrorKind::from_code(*code).is_none_or(|kind| kind == ErrorKind::Internal)
            }
            _ => false,
        }
    }
}

/// Whether an address is one a push notification may not reach unless
/// the operator allows private networks: loopback, private, link-local
/// (cloud metadata among them), shared, unspecified, multicast.
#[must_use]
pub fn is_private(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || (a == 100 && (64..128).contains(&b))
                || a == 0
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

/// Where a request may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Anywhere the URL names (a peer the operator configured).
    Any,
    /// Public addresses only (a URL a client gave): every address the
    /// name resolves to is checked, and the connection goes to a checked
    /// one, so a name that resolves differently later cannot slip by.
    Public,
}

/// The parts of an `http(s)://` URL a connection needs.
struct Target {
    uri: Uri,
    tls: bool,
    host: String,
    port: u16,
}

fn target(url: &str) -> Result<Target, ClientError> {
    let uri: Uri = url.parse().map_err(|_| ClientError::Url(url.to_owned()))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(ClientError::Url(url.to_owned())),
    };
    let host = uri
        .host()
        .ok_or_else(|| ClientError::Url(url.to_owned()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Ok(Target {
        uri,
        tls,
        host,
        port,
    })
}

/// Checks that `url` is `http(s)://` and, under [`Reach::Public`], that
/// its host resolves to public addresses only.
///
/// # Errors
///
/// The URL's fault, or the address it reaches.
pub async fn check(url: &str, reach: Reach) -> Result<(), ClientError> {
    let target = target(url)?;
    if reach == Reach::Public {
        resolve(&target, reach, url).await?;
    }
    Ok(())
}

async fn resolve(
    target: &Target,
    reach: Reach,
    url: &str,
) -> Result<Vec<std::net::SocketAddr>, ClientError> {
    let addrs: Vec<std::net::SocketAddr> =
        tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .map_err(|e| ClientError::Unreachable(url.to_owned(), e.to_string()))?
            .collect();
    if reach == Reach::Public
        && let Some(private) = addrs.iter().find(|addr| is_private(addr.ip()))
    {
        return Err(ClientError::Private {
            url: url.to_owned(),
            host: target.host.clone(),
            ip: private.ip(),
        });
    }
    Ok(addrs)
}

/// Sends `request` to `target` on a new connection (TLS for `https`), to
/// an address `reach` allows.
async fn send_request(
    target: &Target,
    reach: Reach,
    url: &str,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
    let unreachable =
        |e: &dyn std::fmt::Display| ClientError::Unreachable(url.to_owned(), e.to_string());
    let addrs = resolve(target, reach, url).await?;
    let tcp = outbound::connect(TcpStream::connect(addrs.as_slice()))
        .await
        .map_err(|e| unreachable(&e))?;
    let _ = tcp.set_nodelay(true);
    if target.tls {
        let config = outbound::environment_config().map_err(|e| unreachable(&e))?;
        let stream = outbound::tls(tcp, &target.host, config)
            .await
            .map_err(|e| unreachable(&e))?;
        exchange_on(stream, request)
            .await
            .map_err(|e| unreachable(&e))
    } else {
        exchange_on(tcp, request).await.map_err(|e| unreachable(&e))
    }
}

/// One request on a new HTTP/1.1 connection over `stream`.
async fn exchange_on<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let mut sender = outbound::handshake(stream).await?;
    sender.send_request(request).await
}

/// POSTs `body` to `url` with `headers`, and returns the status.
///
/// # Errors
///
/// When the URL's address is refused under `reach`, or it cannot be
/// reached in `timeout`.
pub async fn post(
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    reach: Reach,
    timeout: Duration,
) -> Result<u16, ClientError> {
    let target = target(url)?;
    let unreachable =
        |e: &dyn std::fmt::Display| ClientError::Unreachable(url.to_owned(), e.to_string());
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(target.uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            header::HOST,
            target.uri.authority().map_or("", |a| a.as_str()),
        )
        .header(header::CONTENT_TYPE, a2a::MEDIA_TYPE);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| ClientError::Url(format!("{url}: {e}")))?;
    let sent = async {
        let response = send_request(&target, reach, url, request).await?;
        let status = response.status().as_u16();
        // The body is read (and dropped) so the connection ends cleanly.
        let _ = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await;
        Ok(status)
    };
    tokio::time::timeout(timeout, sent)
        .await
        .map_err(|_| unreachable(&format!("no answer within {} s", timeout.as_secs())))?
}

/// One HTTP exchange with a peer: the status and the body as JSON.
async fn exchange(
    method: Method,
    url: &str,
    token: Option<&str>,
    body: Option<&Value>,
    timeout: Duration,
) -> Result<(u16, Value), ClientError> {
    let target = target(url)?;
    let unreachable =
        |e: &dyn std::fmt::Display| ClientError::Unreachable(url.to_owned(), e.to_string());
    let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let mut request = Request::builder()
        .method(method)
        .uri(target.uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            header::HOST,
            target.uri.authority().map_or("", |a| a.as_str()),
        )
        .header(a2a::VERSION_HEADER, a2a::PROTOCOL_VERSION)
        .header(header::ACCEPT, "application/json");
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(bytes))
        .map_err(|e| ClientError::Url(format!("{url}: {e}")))?;
    let exchange = async {
        let response = send_request(&target, Reach::Any, url, request).await?;
        let status = response.status().as_u16();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        let value = serde_json::from_slice(&body).map_err(|e| {
            ClientError::Invalid(
                url.to_owned(),
                format!("status {status}, a body that is not JSON: {e}"),
            )
        })?;
        Ok((status, value))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| unreachable(&format!("no answer within {} s", timeout.as_secs())))?
}

/// Fetches the agent card under `base` (`https://host[:port]`).
///
/// # Errors
///
/// When the card cannot be fetched or is not a card.
pub async fn card(
    base: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<AgentCard, ClientError> {
    let url = format!("{}{}", base.trim_end_matches('/'), a2a::CARD_PATH);
    let (status, value) = exchange(Method::GET, &url, token, None, timeout).await?;
    if status != 200 {
        return Err(ClientError::Invalid(
            url,
            format!("status {status}: {value}"),
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| ClientError::Invalid(url, format!("not an agent card: {e}")))
}

/// Sends `request` to the agent `card` describes and returns the task it
/// answers (blocking: at the task's terminal or interrupted state).
///
/// # Errors
///
/// When the agent cannot be reached, refuses, or answers outside the
/// protocol (a direct message instead of a task is answered as a
/// completed task holding it).
pub async fn send(
    card: &AgentCard,
    token: Option<&str>,
    request: &SendMessageRequest,
    timeout: Duration,
) -> Result<Task, ClientError> {
    let params = serde_json::to_value(request).expect("A2A types are plain JSON");
    let answer = if let Some(interface) = card.interface("JSONRPC") {
        let url = interface.url.clone();
        let envelope =
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params});
        let (_, reply) = exchange(Method::POST, &url, token, Some(&envelope), timeout).await?;
        if let Some(error) = reply.get("error") {
            let code = error["code"].as_i64().unwrap_or(0);
            return Err(ClientError::Refused {
                url,
                code,
                reason: ErrorKind::from_code(code)
                    .map_or("an error", ErrorKind::reason)
                    .to_owned(),
                message: error["message"].as_str().unwrap_or_default().to_owned(),
            });
        }
        (url, reply.get("result").cloned().unwrap_or(Value::Null))
    } else if let Some(interface) = card.interface("HTTP+JSON") {
        let url = format!("{}/message:send", interface.url.trim_end_matches('/'));
        let (status, reply) = exchange(Method::POST, &url, token, Some(&params), timeout).await?;
        if status != 200 {
            let error = &reply["error"];
            let reason = error["details"][0]["reason"]
                .as_str()
                .unwrap_or("an error")
                .to_owned();
            return Err(ClientError::Refused {
                url,
                code: i64::from(status),
                reason,
                message: error["message"].as_str().unwrap_or_default().to_owned(),
            });
        }
        (url, reply)
    } else {
        return Err(ClientError::Invalid(
            card.name.clone(),
            "its card offers neither a JSONRPC nor an HTTP+JSON interface".into(),
        ));
    };
    let (url, result) = answer;
    match serde_json::from_value::<SendMessageResponse>(result) {
        Ok(SendMessageResponse::Task(task)) => Ok(task),
        Ok(SendMessageResponse::Message(message)) => Ok(Task {
            id: String::new(),
            context_id: message.context_id.clone().unwrap_or_default(),
            status: a2a::TaskStatus {
                state: a2a::TaskState::Completed,
                message: None,
                timestamp: None,
            },
            artifacts: Some(vec![a2a::Artifact {
                artifact_id: "message".into(),
                name: None,
                description: None,
                parts: message.parts,
                metadata: None,
            }]),
            history: None,
            metadata: None,
        }),
        Err(e) => Err(ClientError::Invalid(
            url,
            format!("not a SendMessage answer: {e}"),
        )),
    }
}
