//! `http-runs`, `soak` and `parked-runs`: runs driven over the HTTP
//! channel on loopback, the memory a server keeps after serving many, and
//! the memory a run costs while it waits for a person.
//!
//! Both run the server in this process on a durable SQLite journal: the
//! same `spool_http::serve`, `HttpChannel` and `Runtime` that `spool serve`
//! starts, without a second binary to build and find.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use spool_http::{Client, HttpChannel, Listener};
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{Accepted, Runtime, StartRequest};
use tokio::sync::watch;

use crate::Scale;
use crate::report::Row;

/// One model call that answers at once: a one-turn run costs the channel,
/// the runtime and the journal, not a model.
pub(crate) const ONE_TURN: &str = r#"{"text": "done"}"#;

/// A model call that asks for approval, so the run parks in `waiting`.
const PARKS: &str = r#"{"tool_calls": [{"id": "c1", "name": "request_approval", "arguments": {"prompt": "Deploy?"}}]}"#;

pub(crate) fn tokio() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")
}

/// A server on a free loopback port; stops when the sender is dropped.
pub(crate) async fn start(
    handler: spool_http::server::Handler,
) -> anyhow::Result<(String, watch::Sender<bool>)> {
    let listener = Listener::tcp("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.describe());
    let (stop, mut stopped) = watch::channel(false);
    tokio::spawn(spool_http::serve(listener, handler, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    Ok((url, stop))
}

fn durable_runtime(dir: &std::path::Path, script: &str) -> anyhow::Result<Runtime> {
    let journal = SqliteJournal::open(dir, Options::default())?;
    Ok(Runtime::builder(Arc::new(journal))
        .engine(Arc::new(ScriptedEngine::from_jsonl(script)?))
        .build())
}

/// Requests per second and latencies (seconds, sorted) of `clients`
/// concurrent clients posting `body` to `path` for `duration`.
pub(crate) async fn load(
    url: &str,
    path: &str,
    body: Value,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = Client::new(url)?;
        let (path, body) = (path.to_owned(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while started.elapsed() < duration {
                let sent = Instant::now();
                let reply: Value = client.post(&path, &body).await?;
                latencies.push(sent.elapsed().as_secs_f64());
                std::hint::black_box(reply);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    Ok((latencies.len() as f64 / elapsed, latencies))
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// One-turn runs per second over HTTP, each `POST /runs` answered at the
/// turn's boundary, against a hyper server that answers a fixed JSON body
/// through the same server plumbing and the same client.
pub(crate) fn runs(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let duration = scale.pick(Duration::from_secs(5), Duration::from_millis(300));
    let tokio = tokio()?;
    let mut rows = Vec::new();
    for clients in [16usize, 64] {
        let dir = tempfile::tempdir()?;
        let (spool, hello) = tokio.block_on(async {
            let runtime = durable_runtime(dir.path(), ONE_TURN)?;
            let (stop_spool, closing) = watch::channel(false);
            let channel = HttpChannel::new(runtime, closing);
            let (url, stop) = start(channel.handler()).await?;
            let spool = load(&url, "/runs", json!({"text": "go"}), clients, duration).await?;
            stop_spool.send_replace(true);
            stop.send_replace(true);

            let hello: spool_http::server::Handler = Arc::new(|_request| {
                Box::pin(async {
                    spool_http::body::json(http::StatusCode::OK, &json!({"hello": "world"}))
                })
            });
            let (url, stop) = start(hello).await?;
            let hello = load(&url, "/", json!({"text": "go"}), clients, duration).await?;
            stop.send_replace(true);
            anyhow::Ok((spool, hello))
        })?;
        let (rate, latencies) = spool;
        let (hello_rate, hello_latencies) = hello;
        rows.push(Row::new(
            format!("http-runs/{clients} clients"),
            rate,
            "runs/s",
            "hyper hello req/s",
            hello_rate,
        ));
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(
                Row::new(
                    format!("http-runs/{clients} clients {label}"),
                    percentile(&latencies, p) * 1e3,
                    "ms",
                    format!("hyper hello {label}"),
                    percentile(&hello_latencies, p) * 1e3,
                )
                .lower_is_better(),
            );
        }
    }
    Ok(rows)
}

/// Resident memory of a server that has served many one-turn runs over
/// HTTP, against the same server idle: memory must follow live work, not
/// every run ever served. The server and its 16 clients share this
/// process, as in `http-runs`; the clients' memory is fixed.
pub(crate) fn soak(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let total = scale.pick(50_000usize, 2_000);
    let early = total / 5;
    let dir = tempfile::tempdir()?;
    let tokio = tokio()?;
    let (idle, after_early, after_all) = tokio.block_on(async {
        let runtime = durable_runtime(dir.path(), ONE_TURN)?;
        let (stop_spool, closing) = watch::channel(false);
        let channel = HttpChannel::new(runtime, closing);
        let (url, stop) = start(channel.handler()).await?;
        let idle = resident_bytes()?;
        serve_runs(&url, early, 16).await?;
        let after_early = resident_bytes()?;
        serve_runs(&url, total - early, 16).await?;
        let after_all = resident_bytes()?;
        stop_spool.send_replace(true);
        stop.send_replace(true);
        anyhow::Ok((idle, after_early, after_all))
    })?;
    let mb = |bytes: u64| bytes as f64 / 1e6;
    let growth = |after: u64| mb(after.saturating_sub(idle));
    Ok(vec![
        Row::new(
            format!("soak/{total} one-turn runs, RSS growth"),
            growth(after_all),
            "MB",
            "RSS idle",
            mb(idle),
        )
        .lower_is_better()
        .figure_at_most(20.0),
        Row::new(
            format!("soak/runs {early}-{total}, RSS growth"),
            mb(after_all.saturating_sub(after_early)),
            "MB",
            format!("growth over runs 1-{early}"),
            growth(after_early),
        ),
    ])
}

/// Serves `count` one-turn runs from `clients` concurrent clients.
async fn serve_runs(url: &str, count: usize, clients: usize) -> anyhow::Result<()> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = Client::new(url)?;
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < count {
                let reply: Value = client.post("/runs", &json!({"text": "go"})).await?;
                anyhow::ensure!(
                    reply["state"] == "completed",
                    "a run did not complete: {reply}"
                );
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Resident memory per run parked in `waiting`, after parking many: parked
/// runs live in the journal, not in memory. The baseline is the journal's
/// own bytes per parked run, so the ratio reads "times smaller in memory
/// than on disk" (above 1) or "larger" (below 1).
pub(crate) fn parked(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let runs = scale.pick(10_000usize, 300);
    let warmup = scale.pick(500usize, 50);
    let mut rows = vec![parked_row(runs, warmup, None)?];
    // The same with every run kept in the runtime's cache: what a parked
    // run costs while it is cached, beside the average above (the cache
    // holds the most recently used runs, the rest live on disk only).
    let cached = scale.pick(3_000usize, 100);
    rows.push(parked_row(cached, warmup, Some(cached + warmup))?);
    Ok(rows)
}

/// Resident bytes per run after parking `runs` (beyond `warmup`), with the
/// runtime's cache at its default size or at `cached` runs.
fn parked_row(runs: usize, warmup: usize, cached: Option<usize>) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir()?;
    let tokio = tokio()?;
    let (before, after) = tokio.block_on(async {
        let journal = SqliteJournal::open(dir.path(), Options::default())?;
        let mut builder = Runtime::builder(Arc::new(journal))
            .engine(Arc::new(ScriptedEngine::from_jsonl(PARKS)?));
        if let Some(cached) = cached {
            builder = builder.cached_runs(cached);
        }
        let runtime = builder.build();
        // The allocator's and SQLite's first pages are not the runs' cost.
        park(&runtime, warmup).await?;
        let before = resident_bytes()?;
        park(&runtime, runs).await?;
        let after = resident_bytes()?;
        anyhow::Ok((before, after))
    })?;
    let per_run = after.saturating_sub(before) as f64 / runs as f64;
    let on_disk = journal_bytes(dir.path())? as f64 / (runs + warmup) as f64;
    let row = Row::new(
        match cached {
            None => format!("parked-runs/{runs} waiting"),
            Some(_) => format!("parked-runs/{runs} waiting, all cached"),
        },
        per_run,
        "B/run",
        "journal bytes/run",
        on_disk,
    )
    .lower_is_better();
    Ok(if cached.is_none() {
        row.figure_at_most(4096.0)
    } else {
        row
    })
}

/// Starts `count` runs, 32 at a time, and waits until each is parked.
async fn park(runtime: &Runtime, count: usize) -> anyhow::Result<()> {
    let mut started = 0;
    while started < count {
        let batch = (count - started).min(32);
        let mut tasks = Vec::with_capacity(batch);
        for _ in 0..batch {
            let runtime = runtime.clone();
            tasks.push(tokio::spawn(async move {
                let request = StartRequest {
                    text: "deploy".into(),
                    ..StartRequest::default()
                };
                let Accepted::Started { run, turn } = runtime.start(request).await? else {
                    anyhow::bail!("a fresh start was not a new run");
                };
                let view = runtime.wait_for(&run, &turn).await?;
                anyhow::ensure!(view.suspend.is_some(), "run {run} did not park");
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        started += batch;
    }
    Ok(())
}

/// This process's resident set, from `/proc/self/statm`.
pub(crate) fn resident_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .context("statm has a resident field")?
        .parse()?;
    // The page size is 4 KiB on the machines Spool targets (x86-64 and
    // aarch64 Linux defaults); statm counts pages.
    Ok(pages * 4096)
}

fn journal_bytes(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("journal.db")
        {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// `stream-fanout`: many NDJSON subscribers on one run, held by a second
/// process (this binary, as `spool-bench subscribe`), so the server's work
/// and memory are measured apart from its clients'. The latency of each
/// line is its arrival time minus the time the journal recorded its event
/// (or, for a live delta, the time it was sent), measured at every
/// subscriber. Each turn is sent once every subscriber has the last one's
/// answer, so a figure is one turn's fan-out, not a queue of turns. The
/// baseline is the floor of the machine: a turn's seven lines, all ready
/// at once, written by one task as one HTTP/1.1 chunk in one write to each
/// of as many plain loopback sockets, read and decoded in a second process
/// by the same stream client (`Floor::ATurn`): the readers share the
/// machine's two cores with the server, so the floor's readers must do
/// the same work as the subscribers'. One bare line a round
/// (`Floor::OneLine`), the floor of the first figures, is measured beside
/// it. Then the server's resident memory per open stream, beside the
/// server's side of a bare loopback TCP connection held open.
pub(crate) fn fanout(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let subscribers = scale.pick(1_000usize, 50);
    let turns = scale.pick(20usize, 3);
    let held = scale.pick(10_000usize, 200);
    let tokio = tokio()?;
    let dir = tempfile::tempdir()?;
    tokio.block_on(async {
        let runtime = Runtime::builder(Arc::new(SqliteJournal::open(
            dir.path(),
            Options::default(),
        )?))
        .build();
        let (close_streams, closing) = watch::channel(false);
        let (url, stop) = start(HttpChannel::new(runtime, closing).handler()).await?;
        let client = Client::new(&url)?;
        let (many, turn_times, cpu) =
            latencies(&client, &url, "fanout-many", subscribers, turns).await?;
        let (mut rows, bare, bare_cpu) = beside_floors(
            &format!("stream-fanout/{subscribers} subscribers"),
            &many,
            subscribers,
            turns,
        )
        .await?;
        rows.push(turn_row(subscribers, &turn_times, &bare));
        rows.push(cpu_row(subscribers, cpu, bare_cpu));
        rows.push(open_streams(&client, &url, held).await?);
        // The latencies at the scale the memory row holds, over fewer
        // turns (each is ten times the lines), measured after it: the
        // memory they leave to the allocator would read as less memory
        // per stream.
        let turns_held = scale.pick(5usize, 2);
        let (most, turn_times, cpu) =
            latencies(&client, &url, "fanout-most", held, turns_held).await?;
        let (most_rows, bare, bare_cpu) = beside_floors(
            &format!("stream-fanout/{held} subscribers"),
            &most,
            held,
            turns_held,
        )
        .await?;
        rows.extend(most_rows);
        rows.push(turn_row(held, &turn_times, &bare));
        rows.push(cpu_row(held, cpu, bare_cpu));
        close_streams.send_replace(true);
        stop.send_replace(true);
        anyhow::Ok(rows)
    })
}

/// A fan-out's latency rows beside the floor of a turn's lines, with the
/// targets, and beside the floor of one line a round, which the fan-out
/// was measured against until 2026-12-02 and is kept to compare with
/// those figures; and the first floor's latencies (seconds, sorted) and
/// CPU per socket per round (microseconds).
async fn beside_floors(
    prefix: &str,
    many: &[f64],
    subscribers: usize,
    turns: usize,
) -> anyhow::Result<(Vec<Row>, Vec<f64>, f64)> {
    let (bare, bare_cpu) = bare_fanout(subscribers, turns, Floor::ATurn).await?;
    let (bare_line, _) = bare_fanout(subscribers, turns, Floor::OneLine).await?;
    let mut rows = latency_rows(
        prefix,
        many,
        &bare,
        "bare sockets, a turn as one chunk",
        FanoutTarget::NearTheFloor,
    );
    rows.extend(latency_rows(
        &format!("{prefix}, against one line a round,"),
        many,
        &bare_line,
        "bare sockets, one line",
        FanoutTarget::Beside,
    ));
    Ok((rows, bare, bare_cpu))
}

/// A turn's median time from its message to every subscriber having its
/// answer, beside the floor's slowest line (the time its last reader got
/// a round's line): what a person waiting on the slowest stream sees,
/// whatever each line's own latency, which counts from when its event was
/// recorded.
fn turn_row(subscribers: usize, turn_times: &[f64], bare: &[f64]) -> Row {
    Row::new(
        format!("stream-fanout/{subscribers} subscribers, message to every answer p50"),
        percentile(turn_times, 0.5) * 1e3,
        "ms",
        "bare sockets max",
        percentile(bare, 1.0) * 1e3,
    )
    .lower_is_better()
}

/// The server's CPU time per stream per turn, beside the floor's per
/// socket per round: with the readers on the same two cores, the slowest
/// line waits for about all of it, so this is what the p99 follows.
fn cpu_row(subscribers: usize, cpu: f64, bare_cpu: f64) -> Row {
    Row::new(
        format!("stream-fanout/{subscribers} subscribers, server CPU per stream per turn"),
        cpu,
        "us",
        "bare sockets per socket per round",
        bare_cpu,
    )
    .lower_is_better()
}

/// This process's CPU time so far (user and system), in milliseconds.
fn own_cpu_ms() -> anyhow::Result<f64> {
    crate::oneshot::cpu_ms("self", 14)
}

/// How close to the floor a fan-out's latencies must stay.
#[derive(Clone, Copy)]
pub(crate) enum FanoutTarget {
    /// p99 ≤ 2 ms, whatever the floor (the first fan-out target).
    P99Within2Ms,
    /// p50 ≤ 1.1 × and p99 ≤ 1.2 × the floor's (the streams' second
    /// pass).
    NearTheFloor,
    /// None: a second floor, beside the one the target is on.
    Beside,
}

/// A fan-out's p50, p99 and max latencies (seconds, sorted) beside the
/// bare-socket floor's (`FLOOR p50` and so on), named `PREFIX p50` and so
/// on, with `target`.
pub(crate) fn latency_rows(
    prefix: &str,
    many: &[f64],
    bare: &[f64],
    floor: &str,
    target: FanoutTarget,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (label, p) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
        let row = Row::new(
            format!("{prefix} {label}"),
            percentile(many, p) * 1e3,
            "ms",
            format!("{floor} {label}"),
            percentile(bare, p) * 1e3,
        )
        .lower_is_better();
        rows.push(match (target, label) {
            (FanoutTarget::P99Within2Ms, "p99") => row.figure_at_most(2.0),
            (FanoutTarget::NearTheFloor, "p50") => row.at_most_times_baseline(1.1),
            (FanoutTarget::NearTheFloor, "p99") => row.at_most_times_baseline(1.2),
            _ => row,
        });
    }
    rows
}

/// Sends `turns` messages to `run`, each once `peer` says its
/// subscribers have the last one's answer; returns each turn's time from
/// sending its message to every subscriber having its answer (seconds,
/// sorted).
pub(crate) async fn drive_turns(
    client: &Client,
    run: &str,
    turns: usize,
    peer: &mut Peer,
) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(turns);
    for turn in 0..turns {
        let sent = Instant::now();
        let _: Value = client
            .post(
                &format!("/runs/{run}"),
                &json!({"text": format!("turn {turn}")}),
            )
            .await?;
        anyhow::ensure!(peer.line().await? == "turn", "the subscribers lost a turn");
        times.push(sent.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// A child process of this binary that holds connections to the server.
pub(crate) struct Peer {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Peer {
    /// Starts `spool-bench ARGS` and waits until it says `ready`.
    pub(crate) async fn start(args: &[String]) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the client process")?;
        let stdout = child.stdout.take().context("the client has a stdout")?;
        let mut peer = Self {
            child,
            stdout: tokio::io::BufReader::new(stdout).lines(),
        };
        anyhow::ensure!(
            peer.line().await? == "ready",
            "the client process did not get ready"
        );
        Ok(peer)
    }

    pub(crate) async fn line(&mut self) -> anyhow::Result<String> {
        self.stdout
            .next_line()
            .await?
            .context("the client process ended early (see its error above)")
    }

    /// Closes its stdin (the signal to let go) and waits for it.
    pub(crate) async fn finish(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let status = self.child.wait().await?;
        anyhow::ensure!(status.success(), "the client process failed ({status})");
        Ok(())
    }
}

/// Opens `subscribers` streams on a fresh run from another process, sends
/// `turns` messages, each once every subscriber has the last one's answer,
/// and returns every line's latency (seconds, sorted) at every subscriber,
/// each turn's time from its message to every subscriber's answer, and
/// this process's CPU time over the turns per subscriber per turn
/// (microseconds): the server's, with the few requests that send them.
async fn latencies(
    client: &Client,
    url: &str,
    address: &str,
    subscribers: usize,
    turns: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, f64)> {
    let ensured: spool_wire::http::AddressReply = client
        .post(&format!("/addresses/{address}"), &json!({}))
        .await?;
    let cursor = ensured.cursor.map_or(-1, |c| c as i64);
    let mut peer = Peer::start(&[
        "subscribe".into(),
        url.into(),
        ensured.run_id.clone(),
        cursor.to_string(),
        subscribers.to_string(),
        turns.to_string(),
    ])
    .await?;
    let cpu_before = own_cpu_ms()?;
    let times = drive_turns(client, &ensured.run_id, turns, &mut peer).await?;
    let cpu = (own_cpu_ms()? - cpu_before) * 1e3 / (subscribers * turns) as f64;
    let mut all: Vec<f64> = serde_json::from_str(&peer.line().await?)?;
    peer.finish().await?;
    all.sort_by(f64::total_cmp);
    Ok((all, times, cpu))
}

/// What the floor writes to each socket each round, and who reads it.
#[derive(Clone, Copy)]
pub(crate) enum Floor {
    /// One answer line, read as bare lines (`spool-bench lines`): the
    /// floor the fan-outs were first measured against. (It is the turn's
    /// `run_response` line with its `data` and real-sized ids: about 330
    /// bytes, where the first floor's line was about 150.)
    OneLine,
    /// The seven lines a stream reads for one echo turn (its start and
    /// state, three deltas, its answer and state), all ready at once, as
    /// one HTTP/1.1 chunk of an NDJSON response, read by the same stream
    /// client the fan-out's subscribers use (`spool-bench subscribe`):
    /// the least the machine does to give those readers a turn.
    ATurn,
}

impl Floor {
    /// The round's lines, each stamped now.
    fn lines(self, round: usize) -> Vec<spool_wire::http::StreamEvent> {
        use spool_wire::http::{RunState, StreamEvent, StreamEventType as Kind};
        let now = time::OffsetDateTime::now_utc();
        let turn_id = Some(format!("turn_01a23764fee8000001{round:010}"));
        let line = |seq: u64, kind, text: Option<&str>, state, data| StreamEvent {
            run_id: "run_01a23764fc6b00000068ad3c31".into(),
            seq,
            kind,
            time: now,
            turn_id: turn_id.clone(),
            text: text.map(str::to_owned),
            state,
            data,
        };
        let seq = 4 * round as u64;
        let text = format!("turn {round}");
        let answer = format!("echo: {text}");
        let response = line(
            seq + 4,
            Kind::RunResponse,
            Some(&answer),
            Some(RunState::Completed),
            Some(json!({
                "response": answer,
                "turn_id": turn_id,
                "usage": {"input_tokens": 2, "output_tokens": 3},
            })),
        );
        match self {
            Self::OneLine => vec![response],
            Self::ATurn => vec![
                line(
                    seq + 1,
                    Kind::RunTurn,
                    Some(&text),
                    Some(RunState::Running),
                    Some(json!({"policy": "steer"})),
                ),
                line(seq + 1, Kind::RunState, None, Some(RunState::Running), None),
                line(seq + 2, Kind::TextDelta, Some("echo: "), None, None),
                line(seq + 2, Kind::TextDelta, Some("turn "), None, None),
                line(
                    seq + 2,
                    Kind::TextDelta,
                    Some(&round.to_string()),
                    None,
                    None,
                ),
                response,
                line(
                    seq + 4,
                    Kind::RunState,
                    None,
                    Some(RunState::Completed),
                    None,
                ),
            ],
        }
    }

    /// The round's bytes for one socket.
    fn bytes(self, round: usize) -> anyhow::Result<Vec<u8>> {
        let mut lines = Vec::new();
        for line in self.lines(round) {
            serde_json::to_writer(&mut lines, &line)?;
            lines.push(b'\n');
        }
        Ok(match self {
            Self::OneLine => lines,
            Self::ATurn => {
                let mut chunk = format!("{:X}\r\n", lines.len()).into_bytes();
                chunk.extend_from_slice(&lines);
                chunk.extend_from_slice(b"\r\n");
                chunk
            }
        })
    }
}

/// The floor of a fan-out on this machine: one task writes a round's
/// bytes (its lines stamped as they are made, in one write) to
/// `subscribers` plain loopback sockets in turn, `rounds` times, each once
/// the reader process has every line of the last; returns every line's
/// latency (seconds, sorted) at every reader, and this process's CPU time
/// over the rounds per socket per round (microseconds).
pub(crate) async fn bare_fanout(
    subscribers: usize,
    rounds: usize,
    floor: Floor,
) -> anyhow::Result<(Vec<f64>, f64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let accepting = tokio::spawn(async move {
        let mut sockets = Vec::with_capacity(subscribers);
        for _ in 0..subscribers {
            let (mut socket, _) = listener.accept().await?;
            socket.set_nodelay(true)?;
            if let Floor::ATurn = floor {
                // The client's `GET`, answered as the server answers a
                // stream: a chunked NDJSON response, whose chunks follow.
                // (A `GET` has no body: the head is all it sends.)
                let mut head = Vec::with_capacity(512);
                while !head.ends_with(b"\r\n\r\n") {
                    anyhow::ensure!(head.len() < 8192, "a request head without its end");
                    anyhow::ensure!(
                        socket.read_buf(&mut head).await? > 0,
                        "a client closed before its request's end"
                    );
                }
                socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n\
                          transfer-encoding: chunked\r\n\r\n",
                    )
                    .await?;
            }
            sockets.push(socket);
        }
        anyhow::Ok(sockets)
    });
    let reader: Vec<String> = match floor {
        Floor::OneLine => vec!["lines".into(), addr],
        Floor::ATurn => vec![
            "subscribe".into(),
            format!("http://{addr}"),
            "run-bare".into(),
            "-1".into(),
        ],
    };
    let mut peer =
        Peer::start(&[reader, vec![subscribers.to_string(), rounds.to_string()]].concat()).await?;
    let mut sockets = accepting.await??;
    let cpu_before = own_cpu_ms()?;
    for round in 0..rounds {
        let bytes = floor.bytes(round)?;
        for socket in &mut sockets {
            socket.write_all(&bytes).await?;
        }
        anyhow::ensure!(peer.line().await? == "turn", "the readers lost a line");
    }
    let cpu = (own_cpu_ms()? - cpu_before) * 1e3 / (subscribers * rounds) as f64;
    let mut all: Vec<f64> = serde_json::from_str(&peer.line().await?)?;
    peer.finish().await?;
    all.sort_by(f64::total_cmp);
    Ok((all, cpu))
}

/// The server's resident bytes per open stream, beside the server's side
/// of a bare loopback connection.
async fn open_streams(client: &Client, url: &str, count: usize) -> anyhow::Result<Row> {
    // The bare connections first, then dropped, so both figures start from
    // a process that has already had that many sockets.
    let bare = bare_connection_bytes(count).await?;
    let ensured: spool_wire::http::AddressReply =
        client.post("/addresses/fanout-held", &json!({})).await?;
    let cursor = ensured.cursor.map_or(-1, |c| c as i64);
    let before = resident_bytes()?;
    let peer = Peer::start(&[
        "subscribe".into(),
        url.into(),
        ensured.run_id.clone(),
        cursor.to_string(),
        count.to_string(),
        "0".into(),
    ])
    .await?;
    let per_stream = resident_bytes()?.saturating_sub(before) as f64 / count as f64;
    peer.finish().await?;
    Ok(Row::new(
        format!("stream-fanout/{count} open streams, server"),
        per_stream,
        "B/stream",
        "bare TCP, server side",
        bare,
    )
    .lower_is_better()
    // 10 k streams in 200 MiB.
    .figure_at_most(200.0 * 1024.0 * 1024.0 / 10_000.0))
}

/// This process's resident bytes per bare loopback TCP connection it
/// accepts, `count` of them held open by another process.
pub(crate) async fn bare_connection_bytes(count: usize) -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let before = resident_bytes()?;
    let accepting = tokio::spawn(async move {
        let mut held = Vec::with_capacity(count);
        for _ in 0..count {
            held.push(listener.accept().await?.0);
        }
        anyhow::Ok(held)
    });
    let peer = Peer::start(&["connect".into(), addr, count.to_string()]).await?;
    let held = accepting.await??;
    let bare = resident_bytes()?.saturating_sub(before) as f64 / count as f64;
    peer.finish().await?;
    drop(held);
    Ok(bare)
}

/// `spool-bench subscribe URL RUN CURSOR COUNT RESPONSES`: opens COUNT
/// streams on RUN from CURSOR (-1: none), says `ready`, then either holds
/// them until stdin closes (RESPONSES = 0) or reads each until it has seen
/// RESPONSES answers and prints every line's latency as one JSON array.
pub(crate) fn subscribe(args: &[String]) -> anyhow::Result<()> {
    let [url, run, cursor, count, responses] = args else {
        anyhow::bail!("usage: spool-bench subscribe URL RUN CURSOR COUNT RESPONSES");
    };
    let cursor: i64 = cursor.parse()?;
    let cursor = u64::try_from(cursor).ok();
    let count: usize = count.parse()?;
    let responses: usize = responses.parse()?;
    tokio()?.block_on(async {
        let client = Client::new(url)?;
        let mut streams = Vec::with_capacity(count);
        for i in 0..count {
            streams.push(client.stream(run, cursor).await.with_context(|| {
                format!("opening stream {i} of {count} (each is an open file: `ulimit -n` must allow {count} and more)")
            })?);
        }
        say("ready")?;
        if responses == 0 {
            let mut stdin = tokio::io::stdin();
            tokio::io::copy(&mut stdin, &mut tokio::io::sink()).await?;
            return anyhow::Ok(());
        }
        let (answered, answers) = tokio::sync::mpsc::unbounded_channel();
        let mut readers = Vec::with_capacity(count);
        for mut lines in streams {
            let answered = answered.clone();
            readers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut answers = 0;
                while answers < responses {
                    let Some(line) = lines.next().await? else {
                        anyhow::bail!("a stream ended early");
                    };
                    answers += usize::from(arrived(&line, &mut seen, &answered));
                }
                anyhow::Ok((seen, lines))
            }));
        }
        drop(answered);
        collect(readers, answers, count, responses).await
    })
}

/// Notes a line's latency, as it arrives, in `seen`; for an answer, tells
/// `answered` too. Whether it was an answer.
fn arrived(
    line: &spool_wire::http::StreamEvent,
    seen: &mut Vec<f64>,
    answered: &tokio::sync::mpsc::UnboundedSender<()>,
) -> bool {
    seen.push((time::OffsetDateTime::now_utc() - line.time).as_seconds_f64());
    let answer = line.kind == spool_wire::http::StreamEventType::RunResponse;
    if answer {
        let _ = answered.send(());
    }
    answer
}

/// A reader's task: the latencies it saw, and its connection.
pub(crate) type Reader<C> = tokio::task::JoinHandle<anyhow::Result<(Vec<f64>, C)>>;

/// Says `turn` each time all `count` readers have had one more answer,
/// then every latency the readers saw, as one JSON array. Each reader
/// hands back its connection with its latencies, and the connections are
/// closed only after the last turn: a reader that closed as soon as it had
/// its last answer would load the last turn's fan-out, still writing to
/// the others, with thousands of closes.
pub(crate) async fn collect<C: Send + 'static>(
    readers: Vec<Reader<C>>,
    mut answers: tokio::sync::mpsc::UnboundedReceiver<()>,
    count: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    for _ in 0..rounds {
        for _ in 0..count {
            answers
                .recv()
                .await
                .context("a reader ended before its last answer")?;
        }
        say("turn")?;
    }
    let mut all = Vec::new();
    let mut connections = Vec::with_capacity(readers.len());
    for reader in readers {
        let (seen, connection) = reader.await??;
        all.extend(seen);
        connections.push(connection);
    }
    say(&serde_json::to_string(&all)?)?;
    drop(connections);
    Ok(())
}

/// `spool-bench lines ADDR COUNT ROUNDS`: opens COUNT plain TCP
/// connections to ADDR, says `ready`, reads stream lines from each until
/// it has had ROUNDS answers (saying `turn` after each round), and prints
/// every line's latency as one JSON array: the bare fan-out
/// `stream-fanout` is measured beside.
pub(crate) fn lines(args: &[String]) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt;
    let [addr, count, rounds] = args else {
        anyhow::bail!("usage: spool-bench lines ADDR COUNT ROUNDS");
    };
    let count: usize = count.parse()?;
    let rounds: usize = rounds.parse()?;
    tokio()?.block_on(async {
        let sockets = connect_all(addr, count).await?;
        say("ready")?;
        let (answered, answers) = tokio::sync::mpsc::unbounded_channel();
        let mut readers = Vec::with_capacity(count);
        for socket in sockets {
            let answered = answered.clone();
            readers.push(tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(socket).lines();
                let mut seen = Vec::with_capacity(rounds);
                let mut answers = 0;
                while answers < rounds {
                    let line = lines.next_line().await?.context("a socket closed early")?;
                    let event: spool_wire::http::StreamEvent = serde_json::from_str(&line)?;
                    answers += usize::from(arrived(&event, &mut seen, &answered));
                }
                anyhow::Ok((seen, lines))
            }));
        }
        drop(answered);
        collect(readers, answers, count, rounds).await
    })
}

/// `spool-bench connect ADDR COUNT`: opens COUNT bare TCP connections to
/// ADDR, says `ready`, and holds them until stdin closes.
pub(crate) fn connect(args: &[String]) -> anyhow::Result<()> {
    let [addr, count] = args else {
        anyhow::bail!("usage: spool-bench connect ADDR COUNT");
    };
    let count: usize = count.parse()?;
    tokio()?.block_on(async {
        let held = connect_all(addr, count).await?;
        say("ready")?;
        tokio::io::copy(&mut tokio::io::stdin(), &mut tokio::io::sink()).await?;
        drop(held);
        anyhow::Ok(())
    })
}

/// `count` plain TCP connections to `addr`.
async fn connect_all(addr: &str, count: usize) -> std::io::Result<Vec<tokio::net::TcpStream>> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        sockets.push(tokio::net::TcpStream::connect(addr).await?);
    }
    Ok(sockets)
}

/// One line to the parent process.
pub(crate) fn say(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Seconds from opening the journal in `dir` to the first answered
/// request: what `spool serve` does before it accepts requests (open,
/// recover, which hands each interrupted run to a driver of its own, bind),
/// then `GET /health` answered while those drivers start.
pub(crate) fn until_serving(dir: &std::path::Path) -> anyhow::Result<f64> {
    let tokio = tokio()?;
    tokio.block_on(async {
        let started = Instant::now();
        let journal = SqliteJournal::open(dir, Options::default())?;
        let runtime = Runtime::builder(Arc::new(journal)).build();
        let recovery = runtime.recover().await?;
        anyhow::ensure!(recovery.unreadable.is_empty(), "every run reads back");
        let (close_streams, closing) = watch::channel(false);
        let (url, stop) = start(HttpChannel::new(runtime, closing).handler()).await?;
        let health: Value = Client::new(&url)?.get("/health").await?;
        let elapsed = started.elapsed().as_secs_f64();
        anyhow::ensure!(health["status"] == "ready", "the server is ready");
        close_streams.send_replace(true);
        stop.send_replace(true);
        anyhow::Ok(elapsed)
    })
}
