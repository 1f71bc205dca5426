//! `first-token`: what Spool adds between a model's tokens and a reader.
//! The benchmark's stand-in model ([`crate::model`]) streams an answer
//! word by word at a fixed pace; a reader of a run's NDJSON stream on
//! `spool serve` (the binary, measured from outside) times the first
//! `text_delta` from the moment it sent the message, and the gaps between
//! the deltas after it. The baseline is a client asking the stand-in
//! directly for the same answer, timing its first chunk and the gaps, in
//! the same process, alternating with the runs through Spool: one run at a
//! time on an idle server, then one at a time while 1 000 other runs
//! stream their answers (10 words a second each) to readers of their own.
//! A burst of 1 000 messages sent at once is measured too, without a
//! target: there the machine's two cores are the bound. The one-at-a-time
//! cases are measured for a JSON-RPC client too (`submit.run` on a
//! WebSocket, timing the first `events.append` delta, `task:stdout`) and
//! for an A2A client (`SendStreamingMessage`, timing the first
//! `artifactUpdate`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use spool_http::Client;
use spool_http::client::Lines;
use spool_wire::http::StreamEventType;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Scale;
use crate::http::percentile;
use crate::model::{self, Asked, Reply};
use crate::report::Row;
use crate::serve::{Conn, Server};

/// Words in the streamed answer, and the model's pace between them.
const WORDS: usize = 12;
const GAP: Duration = Duration::from_millis(10);

/// The other runs' answers: long enough to outlast the measured ones.
const LONG_WORDS: usize = 400;
const LONG_GAP: Duration = Duration::from_millis(100);

/// First-token times and the gaps between tokens, in milliseconds.
#[derive(Default)]
struct Timings {
    first: Vec<f64>,
    gaps: Vec<f64>,
}

impl Timings {
    fn add(&mut self, other: Self) {
        self.first.extend(other.first);
        self.gaps.extend(other.gaps);
    }

    fn sorted(mut self) -> Self {
        self.first.sort_by(f64::total_cmp);
        self.gaps.sort_by(f64::total_cmp);
        self
    }
}

/// One reader's clock over one answer: the first token's time from the
/// moment its request was sent, then the gaps between tokens.
struct Tokens {
    sent: Instant,
    last: Option<Instant>,
    timings: Timings,
}

impl Tokens {
    /// A clock started now, as the request goes out.
    fn start() -> Self {
        Self {
            sent: Instant::now(),
            last: None,
            timings: Timings::default(),
        }
    }

    /// A token arrived now.
    fn token(&mut self) {
        match self.last {
            None => self.timings.first.push(ms(self.sent)),
            Some(previous) => self.timings.gaps.push(ms(previous)),
        }
        self.last = Some(Instant::now());
    }

    /// The timings, once every word of the answer arrived as a token of
    /// its own (`how` says as what, for the error).
    fn every_word(self, how: &str) -> anyhow::Result<Timings> {
        anyhow::ensure!(
            self.timings.gaps.len() == WORDS - 1,
            "{} of {WORDS} words arrived {how}",
            self.timings.gaps.len() + self.timings.first.len().min(1)
        );
        Ok(self.timings)
    }
}

/// The time since `since` in milliseconds.
fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let Some(spool) = crate::oneshot::spool_bin("first-token")? else {
        return Ok(Vec::new());
    };
    let tokio = crate::http::tokio()?;
    tokio.block_on(async {
        let url = model::start(Arc::new(|asked: &Asked| match asked.text.as_str() {
            "stream" => Reply::Text {
                words: (0..WORDS).map(|i| format!(" w{i}")).collect(),
                gap: GAP,
            },
            "long" => Reply::Text {
                words: (0..LONG_WORDS).map(|i| format!(" l{i}")).collect(),
                gap: LONG_GAP,
            },
            _ => Reply::text("ready"),
        }))
        .await?;
        let server = Server::start_with(&spool, &[("spool.toml", &model::definition(&url))])?;
        let probes = scale.pick(60, 5);
        let mut rows = Vec::new();

        rows.extend(
            one_at_a_time(&url, &server.addr, probes)
                .await?
                .rows("1 run"),
        );

        let streaming = scale.pick(1_000, 20);
        let background = Background::start(&server.addr, streaming).await?;
        let surfaces = one_at_a_time(&url, &server.addr, probes).await?;
        background.still_streaming()?;
        drop(background);
        rows.extend(surfaces.rows(&format!("1 run while {streaming} stream")));

        let burst = scale.pick(1_000, 20);
        let direct = directly(&url, burst).await?.sorted();
        let spooled = through_spool(&server.addr, prepare(&server.addr, burst).await?)
            .await?
            .sorted();
        let at = format!("{burst} sent at once");
        rows.extend(first_token_rows(HTTP, &at, &direct, &spooled, false));
        Ok(rows)
    })
}

/// The surfaces a reader follows a turn on, as the rows name them.
const HTTP: &str = "HTTP stream";
const RPC: &str = "JSON-RPC WebSocket";
const A2A: &str = "A2A stream";
const RPC_SUBSCRIBED: &str = "JSON-RPC subscriber";

/// `probes` turns, one at a time, each read directly, then through the
/// HTTP stream, a JSON-RPC WebSocket and an A2A stream: the direct timings
/// and Spool's on each surface.
async fn one_at_a_time(url: &str, addr: &str, probes: usize) -> anyhow::Result<Surfaces> {
    let mut taken = Surfaces::default();
    for _ in 0..probes {
        taken.direct.add(directly(url, 1).await?);
        taken
            .http
            .add(through_spool(addr, prepare(addr, 1).await?).await?);
        taken.rpc.add(through_rpc(addr).await?);
        taken
            .rpc_subscribed
            .add(through_rpc_subscribed(addr).await?);
        taken.a2a.add(through_a2a(addr).await?);
    }
    Ok(Surfaces {
        direct: taken.direct.sorted(),
        http: taken.http.sorted(),
        rpc: taken.rpc.sorted(),
        rpc_subscribed: taken.rpc_subscribed.sorted(),
        a2a: taken.a2a.sorted(),
    })
}

/// The same turns read directly and on each of Spool's surfaces.
#[derive(Default)]
struct Surfaces {
    direct: Timings,
    http: Timings,
    rpc: Timings,
    /// A JSON-RPC client subscribed before the message, sent over HTTP:
    /// told apart from `submit.run`, which subscribes once the message is
    /// recorded.
    rpc_subscribed: Timings,
    a2a: Timings,
}

impl Surfaces {
    /// The rows of every surface at `at`, with the targets.
    fn rows(&self, at: &str) -> Vec<Row> {
        [
            (HTTP, &self.http),
            (RPC, &self.rpc),
            (RPC_SUBSCRIBED, &self.rpc_subscribed),
            (A2A, &self.a2a),
        ]
        .into_iter()
        .flat_map(|(surface, spooled)| first_token_rows(surface, at, &self.direct, spooled, true))
        .collect()
    }
}

/// The rows for one load on one surface: the first token's p50 and p99
/// added, and the p99 gap between tokens; with the targets when
/// `targets`.
fn first_token_rows(
    surface: &str,
    at: &str,
    direct: &Timings,
    spooled: &Timings,
    targets: bool,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (p, name, most) in [(0.5, "p50", 1.0), (0.99, "p99", 5.0)] {
        let (through, floor) = (percentile(&spooled.first, p), percentile(&direct.first, p));
        let row = Row::new(
            format!("first-token/{surface}, {at}: {name} added"),
            through - floor,
            "ms",
            format!("{name} first token, read directly"),
            floor,
        );
        rows.push(if targets {
            row.figure_at_most(most)
        } else {
            row
        });
    }
    let (through, floor) = (
        percentile(&spooled.gaps, 0.99),
        percentile(&direct.gaps, 0.99),
    );
    let row = Row::new(
        format!("first-token/{surface}, {at}: p99 gap between tokens"),
        through,
        "ms",
        "p99 gap, read directly",
        floor,
    )
    .lower_is_better();
    rows.push(if targets {
        row.figure_at_most(floor + 2.0)
    } else {
        row
    });
    rows
}

/// Runs streaming long answers to readers of their own, for as long as
/// the measured turns take.
struct Background {
    readers: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Background {
    /// Starts `runs` long answers and returns once each has streamed a
    /// word.
    async fn start(addr: &str, runs: usize) -> anyhow::Result<Self> {
        let (started, mut starts) = tokio::sync::mpsc::channel(runs.max(1));
        let mut readers = Vec::with_capacity(runs);
        for (run, mut lines) in prepare(addr, runs).await? {
            let addr = addr.to_owned();
            let started = started.clone();
            readers.push(tokio::spawn(async move {
                send(&addr, &run, b"{\"text\":\"long\"}").await?;
                let mut first = true;
                loop {
                    let Some(line) = lines.next().await? else {
                        bail!("the stream of {run} ended mid-answer");
                    };
                    match line.kind {
                        StreamEventType::TextDelta if first => {
                            first = false;
                            let _ = started.send(()).await;
                        }
                        StreamEventType::RunResponse => {
                            bail!("a background answer ended before the measured turns")
                        }
                        _ => {}
                    }
                }
            }));
        }
        for _ in 0..runs {
            tokio::time::timeout(Duration::from_secs(120), starts.recv())
                .await
                .context("the background runs did not all start streaming within 120 s")?
                .context("a background run failed before it streamed")?;
        }
        Ok(Self { readers })
    }

    /// Fails when a background run stopped streaming before now.
    fn still_streaming(&self) -> anyhow::Result<()> {
        let ended = self.readers.iter().filter(|r| r.is_finished()).count();
        anyhow::ensure!(
            ended == 0,
            "{ended} background runs stopped streaming before the measured turns ended"
        );
        Ok(())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.abort();
        }
    }
}

/// `runs` clients at once, each asking the stand-in for the answer on a
/// connection of its own.
async fn directly(url: &str, runs: usize) -> anyhow::Result<Timings> {
    let addr = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .context("the stand-in's URL")?
        .to_owned();
    let body = json!({"model": "stand-in", "stream": true,
        "messages": [{"role": "user", "content": "stream"}]})
    .to_string();
    let mut clients = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (addr, body) = (addr.clone(), body.clone());
        clients.push(tokio::spawn(async move {
            let mut tokens = Tokens::start();
            let mut stream = TcpStream::connect(&addr).await?;
            stream.set_nodelay(true)?;
            stream
                .write_all(
                    format!(
                        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await?;
            let mut lines = BufReader::new(stream).lines();
            while let Some(line) = lines.next_line().await? {
                if line.contains("\"content\"") {
                    tokens.token();
                }
            }
            tokens.every_word("as chunks from the stand-in")
        }));
    }
    let mut all = Timings::default();
    for client in clients {
        all.add(client.await??);
    }
    Ok(all)
}

/// `runs` runs made, each with its stream opened after its first turn.
async fn prepare(addr: &str, runs: usize) -> anyhow::Result<Vec<(String, Lines)>> {
    let client = Client::new(&format!("http://{addr}"))?;
    let mut conn = Conn::open(addr).await?;
    let mut streams = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (run, cursor) = new_run(&mut conn).await?;
        let lines = client.stream(&run, Some(cursor)).await?;
        streams.push((run, lines));
    }
    Ok(streams)
}

/// A new run, its first turn taken: its id and its cursor.
async fn new_run(conn: &mut Conn) -> anyhow::Result<(String, u64)> {
    let (status, reply) = conn
        .request("POST /spool/v1/runs", b"{\"text\":\"hello\"}")
        .await?;
    anyhow::ensure!(status == 200, "a run answered {status}");
    let reply: Value = serde_json::from_slice(&reply)?;
    let run = reply["run_id"].as_str().context("a run_id")?.to_owned();
    let cursor = reply["cursor"].as_u64().context("a cursor")?;
    Ok((run, cursor))
}

/// Sends `body` to `run`, answered at once (`Prefer: respond-async`).
async fn send(addr: &str, run: &str, body: &[u8]) -> anyhow::Result<()> {
    let mut conn = Conn::open(addr).await?;
    let (status, reply) = conn
        .request_with(
            &format!("POST /spool/v1/runs/{run}"),
            "Prefer: respond-async\r\n",
            body,
        )
        .await?;
    if status != 202 {
        bail!(
            "the message answered {status}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    Ok(())
}

/// Sends each prepared run, all at once, the message whose answer
/// streams: the time from sending it to the first `text_delta`, and the
/// gaps between deltas.
async fn through_spool(addr: &str, prepared: Vec<(String, Lines)>) -> anyhow::Result<Timings> {
    let mut readers = Vec::with_capacity(prepared.len());
    for (run, mut lines) in prepared {
        let addr = addr.to_owned();
        readers.push(tokio::spawn(async move {
            let mut tokens = Tokens::start();
            send(&addr, &run, b"{\"text\":\"stream\"}").await?;
            loop {
                let Some(line) = lines.next().await? else {
                    bail!("the stream of {run} ended before the answer");
                };
                match line.kind {
                    StreamEventType::TextDelta => tokens.token(),
                    StreamEventType::RunResponse => break,
                    _ => {}
                }
            }
            tokens.every_word("as deltas on the HTTP stream")
        }));
    }
    let mut all = Timings::default();
    for reader in readers {
        all.add(reader.await??);
    }
    Ok(all)
}

/// One turn through an A2A client: a run made over HTTP (every run is an
/// A2A context), then `SendStreamingMessage` on the HTTP+JSON binding
/// (`POST /a2a/message:stream`) with its `contextId`, answered as Server-Sent
/// Events: the time from sending it to the first `artifactUpdate` (a piece
/// of the answer as the model writes it), and the gaps between pieces. The
/// last update, the whole answer again with `lastChunk`, is not a token.
async fn through_a2a(addr: &str) -> anyhow::Result<Timings> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (run, _) = new_run(&mut Conn::open(addr).await?).await?;
    let body = json!({"message": {
        "messageId": format!("first-token-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        "role": "ROLE_USER", "contextId": run, "parts": [{"text": "stream"}]}})
    .to_string();
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let request = format!(
        "POST /a2a/message:stream HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut tokens = Tokens::start();
    stream.write_all(request.as_bytes()).await?;
    // Each event is one chunk of the chunked body, so an event's `data:`
    // line arrives whole between the chunks' size lines; a line that did
    // not would fail to parse and stop the benchmark, not skew it. The
    // connection closes with the response (`Connection: close`), so a
    // stream that ends without the answer ends the read too.
    let mut lines = BufReader::new(stream).lines();
    loop {
        let line = lines
            .next_line()
            .await?
            .context("the A2A stream ended before the answer")?;
        let Some(data) = line.strip_prefix("data:") else {
            anyhow::ensure!(
                !line.starts_with("HTTP/1.1 ") || line.starts_with("HTTP/1.1 200"),
                "message:stream answered {line}"
            );
            continue;
        };
        let event: Value = serde_json::from_str(data.trim())?;
        let Some(update) = event.get("artifactUpdate") else {
            continue;
        };
        if update["lastChunk"] == true {
            break;
        }
        tokens.token();
    }
    tokens.every_word("as pieces of the A2A artifact")
}

/// One turn for a JSON-RPC client that watches a run: a run made over
/// HTTP, a WebSocket to `/ws` subscribed to it from its cursor, then the
/// message sent over HTTP as the HTTP stream's probe sends it: the time
/// from sending it to the first `events.append` delta, and the gaps
/// between deltas, until the turn's `run:end`. The reader is in place
/// before the message, as the HTTP stream's is.
async fn through_rpc_subscribed(addr: &str) -> anyhow::Result<Timings> {
    let (run, cursor) = new_run(&mut Conn::open(addr).await?).await?;
    let mut socket = crate::rpc::subscribed(addr, &run, Some(cursor)).await?;
    // The clock runs from before the send; a delta that comes while the
    // send waits for its answer waits in the socket and is counted when
    // read, as the HTTP probe's are.
    let mut tokens = Tokens::start();
    send(addr, &run, b"{\"text\":\"stream\"}").await?;
    loop {
        let envelope = crate::rpc::envelope(&mut socket).await?;
        match envelope["params"]["spool.kind"].as_str() {
            Some("task:stdout") if envelope["method"] == "events.append" => tokens.token(),
            Some("run:end") => break,
            _ => {}
        }
    }
    tokens.every_word("as deltas to a JSON-RPC subscriber")
}

/// One turn through a JSON-RPC client: a run made over HTTP, then, on a
/// WebSocket opened to `/ws` beforehand, `submit.run` with its `run_id`,
/// which streams the turn's `events.append` notifications before its
/// answer: the time from sending it to the first delta (`task:stdout`),
/// and the gaps between deltas.
async fn through_rpc(addr: &str) -> anyhow::Result<Timings> {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let (run, _) = new_run(&mut Conn::open(addr).await?).await?;
    let mut socket = crate::rpc::websocket(addr).await?;
    let submit = json!({"jsonrpc": "2.0", "id": 1, "method": "submit.run",
        "params": {"text": "stream", "run_id": run}})
    .to_string();
    let mut tokens = Tokens::start();
    socket.send(Message::text(submit)).await?;
    loop {
        let envelope = crate::rpc::envelope(&mut socket).await?;
        if envelope["id"] == 1 {
            anyhow::ensure!(
                envelope.get("error").is_none(),
                "submit.run failed: {envelope}"
            );
            break;
        }
        if envelope["method"] == "events.append"
            && envelope["params"]["spool.kind"] == "task:stdout"
        {
            tokens.token();
        }
    }
    tokens.every_word("as deltas over JSON-RPC")
}
