//! A local HTTP server that answers each connection with the next scripted
//! reply (a recorded transcript, a refusal, a stream cut short) and keeps
//! every request it was sent, so a test can assert both sides.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_runtime::engine::{
    CallContext, Delta, Engine, EngineError, Message, ModelRequest, ModelResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long a test waits for anything before failing.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// One scripted reply.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    /// The body goes out in pieces of this many bytes, each flushed, so
    /// events and lines arrive split as a real network splits them.
    pub(crate) piece: usize,
    /// Close the connection after this many body bytes, without ending the
    /// chunked body: a connection cut mid-answer.
    pub(crate) cut_after: Option<usize>,
    /// Send the head, then nothing until the client leaves.
    pub(crate) stall: bool,
}

impl Reply {
    /// A 200 event stream with `body`, sent in small pieces.
    pub(crate) fn stream(body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: body.into(),
            piece: 7,
            cut_after: None,
            stall: false,
        }
    }

    /// A recorded transcript from `tests/transcripts/`.
    pub(crate) fn transcript(name: &str) -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/transcripts")
            .join(name);
        Self::stream(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    /// A JSON refusal.
    pub(crate) fn refusal(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
            piece: usize::MAX,
            cut_after: None,
            stall: false,
        }
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(crate) fn cut_after(mut self, bytes: usize) -> Self {
        self.cut_after = Some(bytes);
        self
    }

    pub(crate) fn stalled() -> Self {
        Self {
            stall: true,
            ..Self::stream(Vec::new())
        }
    }
}

/// A request the server received.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub(crate) head: String,
    pub(crate) body: serde_json::Value,
}

impl Received {
    /// A header's value, by lowercase name.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    }

    pub(crate) fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or_default()
    }
}

/// The server.
pub(crate) struct Replay {
    pub(crate) url: String,
    received: Arc<Mutex<Vec<Received>>>,
    count: tokio::sync::watch::Receiver<usize>,
}

impl Replay {
    /// Starts a server answering connections with `replies`, in order.
    pub(crate) async fn start(replies: Vec<Reply>) -> Self {
        Self::serve(replies, None).await
    }

    /// The same over TLS with `tls`'s certificate; its URL names
    /// `localhost`, the name the certificate is for.
    pub(crate) async fn start_tls(replies: Vec<Reply>, tls: Arc<rustls::ServerConfig>) -> Self {
        Self::serve(replies, Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn serve(replies: Vec<Reply>, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = match tls {
            Some(_) => format!("https://localhost:{port}"),
            None => format!("http://127.0.0.1:{port}"),
        };
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let (counter, count) = tokio::sync::watch::channel(0);
        let mut replies = VecDeque::from(replies);
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let reply = replies
                    .pop_front()
                    .expect("the test scripted too few replies");
                let mut socket: Box<dyn Socket> = match &tls {
                    Some(acceptor) => match acceptor.accept(socket).await {
                        Ok(stream) => Box::new(stream),
                        // A client that refused the certificate.
                        Err(_) => continue,
                    },
                    None => Box::new(socket),
                };
                let Some(request) = read_request(&mut socket).await else {
                    continue;
                };
                log.lock().unwrap().push(request);
                counter.send_modify(|n| *n += 1);
                tokio::spawn(async move { answer(socket, reply).await });
            }
        });
        Self {
            url,
            received,
            count,
        }
    }

    /// Waits until `n` requests have arrived.
    pub(crate) async fn wait_for_requests(&self, n: usize) {
        let mut count = self.count.clone();
        tokio::time::timeout(PATIENCE, count.wait_for(|&seen| seen >= n))
            .await
            .expect("the requests arrived in time")
            .expect("the server is running");
    }

    /// Every request so far.
    pub(crate) fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A plain or TLS connection.
trait Socket: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Socket for S {}

async fn read_request(socket: &mut Box<dyn Socket>) -> Option<Received> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(bytes[..end].to_vec()).ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = bytes[end + 4..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Received {
        head,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    })
}

async fn answer(mut socket: Box<dyn Socket>, reply: Reply) {
    let mut head = format!("HTTP/1.1 {} Scripted\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("transfer-encoding: chunked\r\n\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    if reply.stall {
        // Hold the connection open until the client gives up on it.
        let _ = socket.read(&mut [0u8; 1]).await;
        return;
    }
    let limit = reply
        .cut_after
        .unwrap_or(reply.body.len())
        .min(reply.body.len());
    for piece in reply.body[..limit].chunks(reply.piece.max(1)) {
        let mut frame = format!("{:x}\r\n", piece.len()).into_bytes();
        frame.extend_from_slice(piece);
        frame.extend_from_slice(b"\r\n");
        if socket.write_all(&frame).await.is_err() || socket.flush().await.is_err() {
            return;
        }
    }
    if reply.cut_after.is_none() {
        let _ = socket.write_all(b"0\r\n\r\n").await;
    }
    let _ = socket.shutdown().await;
}

/// The request most tests send: a system prompt and a greeting.
pub(crate) fn hello() -> ModelRequest {
    ModelRequest::new(
        vec![
            Message::System {
                content: "You are terse.".into(),
            },
            Message::User {
                content: "Say hello.".into(),
            },
        ],
        vec![],
    )
}

/// One call's outcome: the deltas in order and the result.
pub(crate) struct Outcome {
    pub(crate) deltas: Vec<Delta>,
    pub(crate) result: Result<ModelResponse, EngineError>,
}

/// Calls `engine` once as run `run`, collecting its deltas.
pub(crate) async fn call(engine: &dyn Engine, run: &str, request: &ModelRequest) -> Outcome {
    call_with(engine, run, request, &CancellationToken::new()).await
}

pub(crate) async fn call_with(
    engine: &dyn Engine,
    run: &str,
    request: &ModelRequest,
    cancel: &CancellationToken,
) -> Outcome {
    let deltas = Mutex::new(Vec::new());
    let context = CallContext {
        run: spool_journal::RunId::new(run).unwrap(),
        ordinal: 0,
    };
    let push = |delta| deltas.lock().unwrap().push(delta);
    let result = tokio::time::timeout(PATIENCE, engine.call(&context, request, &push, cancel))
        .await
        .expect("the engine answered in time");
    Outcome {
        deltas: deltas.into_inner().unwrap(),
        result,
    }
}

/// The text deltas of `deltas`, joined.
pub(crate) fn text_of(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// Every log line the process wrote so far that mentions `needle`.
pub(crate) fn log_lines(needle: &str) -> Vec<String> {
    logs()
        .lock()
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// All the process's log text.
pub(crate) fn all_logs() -> String {
    logs().lock().unwrap().clone()
}

fn logs() -> &'static Mutex<String> {
    static LOGS: std::sync::OnceLock<&'static Mutex<String>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Mutex<String> = Box::leak(Box::new(Mutex::new(String::new())));
        let _ = tracing_subscriber::fmt()
            .with_writer(move || Writer(logs))
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .try_init();
        logs
    })
}

/// Starts capturing logs (call before the code under test logs).
pub(crate) fn capture_logs() {
    let _ = logs();
}

struct Writer(&'static Mutex<String>);

impl std::io::Write for Writer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap()
            .push_str(&String::from_utf8_lossy(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An HTTP proxy: tunnels `CONNECT`, forwards absolute-form requests, or
/// refuses every request with `refusal`; it keeps each request's head.
pub(crate) struct TestProxy {
    pub(crate) url: String,
    heads: Arc<Mutex<Vec<String>>>,
}

impl TestProxy {
    pub(crate) async fn start(credentials: &str, refusal: Option<&'static str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{credentials}{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let Ok(byte) = client.read_u8().await else {
                            return;
                        };
                        head.push(byte);
                    }
                    let text = String::from_utf8_lossy(&head).into_owned();
                    kept.lock().unwrap().push(text.clone());
                    if let Some(refusal) = refusal {
                        let _ = client.write_all(refusal.as_bytes()).await;
                        return;
                    }
                    let target = text
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    let connect = text.starts_with("CONNECT ");
                    let authority = if connect {
                        target
                    } else {
                        let uri: http::Uri = target.parse().unwrap();
                        uri.authority().unwrap().to_string()
                    };
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(authority).await else {
                        return;
                    };
                    if connect {
                        let _ = client
                            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                            .await;
                    } else {
                        let _ = upstream.write_all(&head).await;
                    }
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        Self { url, heads }
    }

    /// Every request head the proxy received.
    pub(crate) fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}
