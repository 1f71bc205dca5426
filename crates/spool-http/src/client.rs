//! A small client for the HTTP channel, over TCP or a Unix socket: what
//! `spool run --url` and `spool chat --url` speak, and what a Rust program
//! can use to drive a remote Spool without a client stack of its own.
//!
//! One HTTP/1.1 connection per request: a CLI and a stream reader do not
//! need pooling, and a stream holds its connection for as long as it reads.
//!
//! `https://` speaks TLS to a server behind a TLS-terminating proxy or
//! ingress, with the outbound trust policy every Spool client shares
//! (`spool_edge::outbound`): the public web roots plus the certificates in
//! the PEM file `SSL_CERT_FILE` names.

use std::path::PathBuf;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;
use spool_edge::outbound;
use spool_wire::http::{self as wire, ErrorBody, StreamEvent};
use spool_wire::line::{DEFAULT_MAX_LINE_BYTES, LineCodec};

use spool_wire::http::BASE_PATH;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The URL is neither `http://host:port`, `https://host[:port]` nor
    /// `unix:/path`.
    #[error("`{0}` is not a Spool URL: use http://HOST:PORT, https://HOST[:PORT] or unix:/PATH")]
    Url(String),
    /// TLS could not be set up (the roots in `SSL_CERT_FILE` unreadable),
    /// or the server's certificate was refused.
    #[error("TLS with {target}: {reason}")]
    Tls {
        /// Where.
        target: String,
        /// Why.
        reason: String,
    },
    /// The server could not be reached.
    #[error("connecting to {target}")]
    Connect {
        /// Where.
        target: String,
        /// Why.
        source: std::io::Error,
    },
    /// The connection broke.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// The server answered with an error reply.
    #[error("{message} ({status} {code})")]
    Reply {
        /// The HTTP status.
        status: u16,
        /// The stable code from the reply, or `unknown`.
        code: String,
        /// The reply's text.
        message: String,
    },
    /// A reply or stream line did not have the expected shape.
    #[error("unexpected reply: {0}")]
    Decode(String),
}

#[derive(Clone, Debug)]
enum Target {
    Tcp(String),
    /// TLS over TCP: the authority (`HOST:PORT`) and the host name the
    /// certificate must be for.
    Tls(String, String),
    Unix(PathBuf),
}

pub use spool_edge::outbound::{CONNECT_TIMEOUT, EXTRA_ROOTS_VARIABLE};

/// A client for one Spool server.
#[derive(Clone, Debug)]
pub struct Client {
    target: Target,
    token: Option<String>,
}

impl Client {
    /// A client for `url`: `http://HOST:PORT` (a path after it is
    /// ignored), `https://HOST[:PORT]` for a server behind TLS (port 443
    /// by default), or `unix:/PATH` for a server on a Unix socket.
    ///
    /// # Errors
    ///
    /// [`ClientError::Url`] for anything else.
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let target = if let Some(path) = url.strip_prefix("unix:") {
            Target::Unix(PathBuf::from(path))
        } else if let Some(rest) = url.strip_prefix("http://") {
            let authority = rest.split('/').next().unwrap_or_default();
            if authority.is_empty() {
                return Err(ClientError::Url(url.to_owned()));
            }
            Target::Tcp(authority.to_owned())
        } else if let Some(rest) = url.strip_prefix("https://") {
            let authority = rest.split('/').next().unwrap_or_default();
            let refused = || ClientError::Url(url.to_owned());
            // `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`; no user info.
            let (host, port) = match authority.strip_prefix('[') {
                Some(v6) => {
                    let (host, after) = v6.split_once(']').ok_or_else(refused)?;
                    (host, after.strip_prefix(':'))
                }
                None => match authority.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (authority, None),
                },
            };
            if host.is_empty() || host.contains('@') {
                return Err(refused());
            }
            let port: u16 = match port {
                Some(port) => port.parse().map_err(|_| refused())?,
                None => 443,
            };
            let authority = if authority.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            Target::Tls(authority, host.to_owned())
        } else {
            return Err(ClientError::Url(url.to_owned()));
        };
        Ok(Self {
            target,
            token: None,
        })
    }

    /// Sends `Authorization: Bearer TOKEN` with every request.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// `GET /spool/v1{path}`, decoded from JSON.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let response = self.send(Method::GET, path, None).await?;
        decode(response).await
    }

    /// `POST /spool/v1{path}` with a JSON body; the reply decoded from JSON
    /// (a 204 decodes as `null`).
    ///
    /// # Errors
    ///
    /// [`ClientError::Reply`] for a non-2xx reply, with its stable code;
    /// connection and decoding errors otherwise.
    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Decode(e.to_string()))?;
        let response = self.send(Method::POST, path, Some(bytes)).await?;
        decode(response).await
    }

    /// `POST /runs`: a new run, or a message through an address; the reply
    /// at the turn's boundary.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn start(&self, start: &wire::StartRun) -> Result<wire::RunReply, ClientError> {
        self.post("/runs", start).await
    }

    /// `POST /runs/{run}`: a message to an existing run.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn message(
        &self,
        run: &str,
        message: &wire::MessageRun,
    ) -> Result<wire::RunReply, ClientError> {
        self.post(&format!("/runs/{}", segment(run)), message).await
    }

    /// `POST /runs/{run}/respond`: answers a waiting run.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn respond(
        &self,
        run: &str,
        respond: &wire::Respond,
    ) -> Result<wire::RunReply, ClientError> {
        self.post(&format!("/runs/{}/respond", segment(run)), respond)
            .await
    }

    /// `POST /runs/{run}/cancel`.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn cancel(
        &self,
        run: &str,
        cancel: &wire::Cancel,
    ) -> Result<wire::CancelReply, ClientError> {
        self.post(&format!("/runs/{}/cancel", segment(run)), cancel)
            .await
    }

    /// `POST /runs/{run}/fork`: a new run holding the run's history
    /// through a turn or up to it; the fork's run reply.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn fork(&self, run: &str, fork: &wire::Fork) -> Result<wire::RunReply, ClientError> {
        self.post(&format!("/runs/{}/fork", segment(run)), fork)
            .await
    }

    /// `DELETE /runs/{run}[?force=true]`: deletes the run; the reply is
    /// its tombstone. `force` cancels a turn in progress first.
    ///
    /// # Errors
    ///
    /// As [`Client::post`]: `run_active` for a turn in progress without
    /// `force`, `run_deleted` (410) for a run deleted before.
    pub async fn delete(&self, run: &str, force: bool) -> Result<wire::Deleted, ClientError> {
        let query = if force { "?force=true" } else { "" };
        let response = self
            .send(
                Method::DELETE,
                &format!("/runs/{}{query}", segment(run)),
                None,
            )
            .await?;
        decode(response).await
    }

    /// `POST /agent/reload`: the server reads its agent definition again
    /// (an administrator's token only).
    ///
    /// # Errors
    ///
    /// As [`Client::post`]: `forbidden` without an administrator's token,
    /// `agent_invalid` (422) when the definition does not load (the
    /// server keeps the one it had).
    pub async fn reload_agent(&self) -> Result<wire::AgentReloaded, ClientError> {
        let response = self.send(Method::POST, "/agent/reload", None).await?;
        decode(response).await
    }

    /// `POST /runs/{run}/reset`: retires the run.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn reset(&self, run: &str, reset: &wire::Reset) -> Result<(), ClientError> {
        let _: Option<serde_json::Value> = self
            .post(&format!("/runs/{}/reset", segment(run)), reset)
            .await?;
        Ok(())
    }

    /// `POST /runs/{run}/clear`: drops the model's context.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn clear(&self, run: &str) -> Result<(), ClientError> {
        let _: Option<serde_json::Value> = self
            .post(
                &format!("/runs/{}/clear", segment(run)),
                &serde_json::json!({}),
            )
            .await?;
        Ok(())
    }

    /// `GET /runs/{run}`: the run's state and latest boundary result.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn run(&self, run: &str) -> Result<wire::RunReply, ClientError> {
        self.get(&format!("/runs/{}", segment(run))).await
    }

    /// `GET /runs/{run}/snapshot`.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn snapshot(&self, run: &str) -> Result<wire::SnapshotReply, ClientError> {
        self.get(&format!("/runs/{}/snapshot", segment(run))).await
    }

    /// `POST /addresses/{address}`: the address's run, made (pending, no
    /// turn) on first use.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn ensure(&self, address: &str) -> Result<wire::AddressReply, ClientError> {
        self.post(
            &format!("/addresses/{}", segment(address)),
            &serde_json::json!({}),
        )
        .await
    }

    /// `GET /addresses/{address}`: the address's run, without making one.
    ///
    /// # Errors
    ///
    /// As [`Client::post`]; `run_not_found` when no run holds it.
    pub async fn lookup(&self, address: &str) -> Result<wire::AddressReply, ClientError> {
        self.get(&format!("/addresses/{}", segment(address))).await
    }

    /// Opens a run's NDJSON stream after `cursor`.
    ///
    /// # Errors
    ///
    /// As [`Client::post`].
    pub async fn stream(&self, run: &str, cursor: Option<u64>) -> Result<Lines, ClientError> {
        let run = segment(run);
        let path = match cursor {
            Some(cursor) => format!("/runs/{run}/stream?cursor={cursor}"),
            None => format!("/runs/{run}/stream"),
        };
        let response = self.send(Method::GET, &path, None).await?;
        if !response.status().is_success() {
            return Err(decode::<serde_json::Value>(response)
                .await
                .err()
                .unwrap_or_else(|| {
                    ClientError::Decode("a stream refused without a reason".into())
                }));
        }
        Ok(Lines {
            body: response.into_body(),
            codec: LineCodec::new(DEFAULT_MAX_LINE_BYTES),
            ready: std::collections::VecDeque::new(),
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<http::Response<Incoming>, ClientError> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{BASE_PATH}{path}"));
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        self.send_request(request).await
    }

    /// Sends `request` as it is, on a connection of its own, with its
    /// `Host` set to this client's target: what a node forwarding a
    /// command sends.
    pub(crate) async fn send_request(
        &self,
        mut request: Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, ClientError> {
        let (mut sender, host) = match &self.target {
            Target::Tcp(authority) => {
                let stream = connect(
                    authority,
                    tokio::net::TcpStream::connect(authority.as_str()),
                )
                .await?;
                (outbound::handshake(stream).await?, authority.clone())
            }
            Target::Tls(authority, host) => {
                let stream = connect(
                    authority,
                    tokio::net::TcpStream::connect(authority.as_str()),
                )
                .await?;
                let tls_error = |reason: String| ClientError::Tls {
                    target: authority.clone(),
                    reason,
                };
                let config =
                    outbound::environment_config().map_err(|e| tls_error(e.to_string()))?;
                let stream = outbound::tls(stream, host, config)
                    .await
                    .map_err(|e| tls_error(e.to_string()))?;
                // The port is left out of `Host` when it is the default.
                let host = authority
                    .strip_suffix(":443")
                    .unwrap_or(authority)
                    .to_owned();
                (outbound::handshake(stream).await?, host)
            }
            Target::Unix(path) => {
                let stream = connect(
                    &path.display().to_string(),
                    tokio::net::UnixStream::connect(path),
                )
                .await?;
                (outbound::handshake(stream).await?, "localhost".to_owned())
            }
        };
        let host =
            http::HeaderValue::try_from(host).map_err(|e| ClientError::Decode(e.to_string()))?;
        request.headers_mut().insert(HOST, host);
        Ok(sender.send_request(request).await?)
    }
}

/// Opens a connection within the outbound deadline, naming `target` when
/// it fails.
async fn connect<S>(
    target: &str,
    connecting: impl std::future::Future<Output = std::io::Result<S>>,
) -> Result<S, ClientError> {
    outbound::connect(connecting)
        .await
        .map_err(|source| ClientError::Connect {
            target: target.to_owned(),
            source,
        })
}

pub(crate) async fn decode<T: DeserializeOwned>(
    response: http::Response<Incoming>,
) -> Result<T, ClientError> {
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(error) => (error.code.as_str().to_owned(), error.error),
            Err(_) => (
                "unknown".to_owned(),
                String::from_utf8_lossy(&bytes).into_owned(),
            ),
        };
        return Err(ClientError::Reply {
            status: status.as_u16(),
            code,
            message,
        });
    }
    let bytes: &[u8] = if status == StatusCode::NO_CONTENT || bytes.is_empty() {
        b"null"
    } else {
        &bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ClientError::Decode(e.to_string()))
}

/// A run's stream, line by line.
#[derive(Debug)]
pub struct Lines {
    body: Incoming,
    codec: LineCodec,
    ready: std::collections::VecDeque<spool_wire::line::Line>,
}

impl Lines {
    /// The next event; `None` when the server ends the stream.
    ///
    /// # Errors
    ///
    /// A broken connection, or a line that is not a stream event.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>, ClientError> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                let text = line.text.map_err(|e| ClientError::Decode(e.to_string()))?;
                return serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| ClientError::Decode(format!("stream line {}: {e}", line.number)));
            }
            match self.body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.ready.extend(self.codec.push(&data));
                    }
                }
                None => match self.codec.finish() {
                    Some(line) => self.ready.push_back(line),
                    None => return Ok(None),
                },
            }
        }
    }
}

/// One path segment whatever the caller passed (a `/` in an address
/// included); the server judges whether it is a valid run id or address.
fn segment(value: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
}
