//! The test harness: a server on a free port, requests and streams through
//! hyper's client, and a capture of the server's log.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use spool_http::{HttpChannel, Listener};
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::Runtime;
use tokio::net::TcpStream;
use tokio::sync::watch;

pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// A reply: status, headers (names lowercased) and body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A running server on a free loopback port.
pub(crate) struct Server {
    pub(crate) addr: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub(crate) async fn start(runtime: Runtime) -> Self {
        Self::start_with(runtime, |channel| channel).await
    }

    pub(crate) async fn start_with(
        runtime: Runtime,
        configure: impl FnOnce(HttpChannel) -> HttpChannel,
    ) -> Self {
        let listener = Listener::tcp("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, runtime, configure)
    }

    /// The echo channel on a Unix socket at `path`; `addr` is the path.
    pub(crate) fn start_unix(path: &std::path::Path) -> Self {
        let listener = Listener::unix(path).unwrap();
        Self::start_on(listener, echo_runtime(), |channel| channel)
    }

    fn start_on(
        listener: Listener,
        runtime: Runtime,
        configure: impl FnOnce(HttpChannel) -> HttpChannel,
    ) -> Self {
        let addr = listener.describe();
        let (stop, closing) = watch::channel(false);
        let channel = configure(HttpChannel::new(runtime, closing.clone()));
        let mut until = closing.clone();
        let task = tokio::spawn(spool_http::serve(listener, channel.handler(), async move {
            let _ = until.wait_for(|stop| *stop).await;
        }));
        Self { addr, stop, task }
    }

    pub(crate) async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server stops in time")
            .unwrap()
            .unwrap();
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        request(&self.addr, "GET", path, None, &[]).await
    }

    pub(crate) async fn post(&self, path: &str, body: &str) -> Reply {
        request(&self.addr, "POST", path, Some(body.as_bytes()), &[]).await
    }

    /// Starts a run with `POST /runs` and returns its id.
    pub(crate) async fn new_run(&self, body: &str) -> String {
        self.post("/spool/v1/runs", body).await.json()["run_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Asserts that a GET of each path is refused `400 bad_request`.
    pub(crate) async fn refuses_as_bad_requests(&self, paths: &[String]) {
        for path in paths {
            let reply = self.get(path).await;
            assert_eq!(
                (reply.status, reply.json()["code"].clone()),
                (400, serde_json::json!("bad_request")),
                "{path}"
            );
        }
    }

    /// A POST with `Authorization: Bearer <token>`.
    pub(crate) async fn post_as(&self, token: &str, path: &str, body: &str) -> Reply {
        let bearer = format!("Bearer {token}");
        request(
            &self.addr,
            "POST",
            path,
            Some(body.as_bytes()),
            &[("Authorization", &bearer)],
        )
        .await
    }
}

pub(crate) fn echo_runtime() -> Runtime {
    Runtime::builder(Arc::new(MemoryJournal::new())).build()
}

pub(crate) fn scripted_runtime(script: &str) -> Runtime {
    Runtime::builder(Arc::new(MemoryJournal::new()))
        .engine(Arc::new(
            spool_runtime::engines::ScriptedEngine::from_jsonl(script).unwrap(),
        ))
        .build()
}

/// One request on a fresh connection, sent and read by hyper's client.
pub(crate) async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Reply {
    tokio::time::timeout(PATIENCE, async {
        let response = send(addr, method, path, body, headers).await;
        let status = response.status().as_u16();
        let headers = header_list(response.headers());
        let body = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    })
    .await
    .expect("the server answers in time")
}

async fn send(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> http::Response<Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Host", addr);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if body.is_some()
        && !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
    {
        builder = builder.header("Content-Type", "application/json");
    }
    let body = Full::new(Bytes::copy_from_slice(body.unwrap_or_default()));
    sender
        .send_request(builder.body(body).unwrap())
        .await
        .unwrap()
}

/// Header names lowercased, as hyper gives them.
fn header_list(headers: &http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// An open NDJSON stream, read line by line as the server flushes them (a
/// frame may carry several lines).
pub(crate) struct Stream {
    body: Incoming,
    lines: std::collections::VecDeque<String>,
    /// The start of a line whose end has not arrived: the server writes
    /// whole lines, but a large write may reach the client in pieces.
    partial: Vec<u8>,
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
}

impl Stream {
    pub(crate) async fn open(addr: &str, path: &str) -> Self {
        let response = tokio::time::timeout(PATIENCE, send(addr, "GET", path, None, &[]))
            .await
            .expect("the stream's headers come at once");
        Self {
            status: response.status().as_u16(),
            headers: header_list(response.headers()),
            body: response.into_body(),
            lines: std::collections::VecDeque::new(),
            partial: Vec::new(),
        }
    }

    /// The next NDJSON line, parsed; `None` at the end. Every line read
    /// here must also decode as the wire's typed line, its `data` into its
    /// type's payload struct: every stream test checks the typed shapes.
    pub(crate) async fn next(&mut self) -> Option<Value> {
        let text = self.next_text().await?;
        let typed: spool_wire::http::StreamEvent = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not a stream line: {e}: {text}"));
        let payload = typed
            .payload()
            .unwrap_or_else(|e| panic!("a line's data does not fit its type: {e}: {text}"));
        assert!(
            !matches!(payload, spool_wire::http::data::LineData::Unknown(_)),
            "a line of a type the wire does not know: {text}"
        );
        Some(serde_json::from_str(&text).unwrap())
    }

    /// How many lines the next frame carries (they stay readable).
    pub(crate) async fn next_frame_lines(&mut self) -> usize {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let frame = self.body.frame().await.unwrap().unwrap();
                if let Ok(data) = frame.into_data() {
                    let text = String::from_utf8_lossy(&data).into_owned();
                    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
                    let count = lines.len();
                    self.lines.extend(lines);
                    return count;
                }
            }
        })
        .await
        .expect("the stream sends a frame in time")
    }

    /// The next NDJSON line as sent; `None` at the end.
    pub(crate) async fn next_text(&mut self) -> Option<String> {
        tokio::time::timeout(PATIENCE, async {
            loop {
                if let Some(line) = self.lines.pop_front() {
                    return Some(line);
                }
                let Some(frame) = self.body.frame().await else {
                    assert!(self.partial.is_empty(), "the stream ended mid-line");
                    return None;
                };
                let Ok(data) = frame.unwrap().into_data() else {
                    continue;
                };
                self.partial.extend_from_slice(&data);
                let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
                    continue;
                };
                let rest = self.partial.split_off(end + 1);
                let whole = std::mem::replace(&mut self.partial, rest);
                let text = String::from_utf8_lossy(&whole).into_owned();
                self.lines.extend(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned),
                );
            }
        })
        .await
        .expect("the stream sends its next line in time")
    }
}

/// What the server logged through `tracing` in this process, for tests of
/// the request log. Installed once per process (nextest runs each test in
/// its own).
pub(crate) struct Logs {
    text: std::sync::Mutex<String>,
    written: watch::Sender<u64>,
}

pub(crate) fn logs() -> &'static Logs {
    static LOGS: std::sync::OnceLock<&'static Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static Logs = Box::leak(Box::new(Logs {
            text: std::sync::Mutex::default(),
            written: watch::channel(0).0,
        }));
        let _ = tracing_subscriber::fmt()
            .with_writer(move || LogWriter(logs))
            .with_ansi(false)
            .try_init();
        logs
    })
}

impl Logs {
    /// Waits for a log line containing every one of `needles`.
    pub(crate) async fn line_with(&self, needles: &[&str]) -> String {
        let mut written = self.written.subscribe();
        tokio::time::timeout(PATIENCE, async {
            loop {
                let found = self
                    .text
                    .lock()
                    .unwrap()
                    .lines()
                    .find(|line| needles.iter().all(|n| line.contains(n)))
                    .map(str::to_owned);
                if let Some(line) = found {
                    return line;
                }
                written.changed().await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no log line with {needles:?} in:\n{}",
                self.text.lock().unwrap()
            )
        })
    }
}

struct LogWriter(&'static Logs);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .text
            .lock()
            .unwrap()
            .push_str(&String::from_utf8_lossy(bytes));
        self.0.written.send_modify(|n| *n += 1);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Asserts that every stream of a run saw the same lines of a turn, its
/// answer's deltas among them.
pub(crate) fn assert_same_lines_with_deltas(seen: &[Vec<String>]) {
    assert!(
        seen[0].iter().any(|line| line.contains("text_delta")),
        "{:?}",
        seen[0]
    );
    assert!(
        seen.iter().all(|lines| *lines == seen[0]),
        "every stream has the same lines: {seen:?}"
    );
}
