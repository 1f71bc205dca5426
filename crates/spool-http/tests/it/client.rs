//! A minimal HTTP/1.1 client over a raw socket, so the tests exercise the
//! real server without a client stack of their own; and a server harness.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use spool_http::{HttpChannel, Listener};
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::Runtime;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
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

/// One request on a fresh connection (`Connection: close`).
pub(crate) async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Reply {
    tokio::time::timeout(PATIENCE, async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(body) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        if let Some(body) = body {
            stream.write_all(body).await.unwrap();
        }
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        parse(&raw)
    })
    .await
    .expect("the server answers in time")
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked")
    {
        body = unchunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn unchunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&data[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[end + 2..end + 2 + size]);
        data = &data[end + 2 + size + 2..];
    }
}

/// An open NDJSON stream, read line by line as the server sends them.
pub(crate) struct Stream {
    reader: BufReader<TcpStream>,
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
}

impl Stream {
    pub(crate) async fn open(addr: &str, path: &str) -> Self {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).await.unwrap();
        let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).await.unwrap();
            if line.trim().is_empty() {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        Self {
            reader,
            status,
            headers,
        }
    }

    /// The next NDJSON line, parsed; `None` at the end.
    pub(crate) async fn next(&mut self) -> Option<Value> {
        self.next_text()
            .await
            .map(|text| serde_json::from_str(&text).unwrap())
    }

    /// The next NDJSON line as sent (chunked framing read through); `None`
    /// at the end.
    pub(crate) async fn next_text(&mut self) -> Option<String> {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let mut size = String::new();
                if self.reader.read_line(&mut size).await.unwrap() == 0 {
                    return None;
                }
                let size = usize::from_str_radix(size.trim(), 16).ok()?;
                if size == 0 {
                    return None;
                }
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).await.unwrap();
                let text = String::from_utf8_lossy(&chunk[..size]).trim().to_owned();
                if !text.is_empty() {
                    return Some(text);
                }
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
