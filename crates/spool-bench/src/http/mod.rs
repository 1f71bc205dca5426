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

mod fanout;

pub(crate) use fanout::*;

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
