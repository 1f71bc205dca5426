//! `long-run`: whether a turn costs the same late in a long run as early in
//! it, and whether reading a run costs the same at 10,000 events as at 10.
//!
//! One run takes turn after turn of 200-character messages on the echo
//! engine and a durable SQLite journal, first through the `Runtime` API,
//! then through the HTTP channel on loopback. The figure is the median
//! latency of the last turns; the baseline, the median of the first ones
//! of the same run. Then `GET /runs/{id}` of a run with many events beside
//! one with a handful, on the same server. A ratio near 1 means the cost
//! does not grow with the run.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use spool_http::{Client, HttpChannel};
use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_runtime::{Accepted, MessageRequest, Runtime, StartRequest};
use tokio::sync::watch;

use crate::Scale;
use crate::http::{percentile, start, tokio};
use crate::report::Row;

/// How far a late turn may be from an early one, and a big run's read
/// from a small one's.
const TARGET: f64 = 1.2;

pub(crate) fn run(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let turns = scale.pick(2_000usize, 60);
    let window = scale.pick(50usize, 10);
    let events = scale.pick(10_000usize, 400);
    let reads = scale.pick(2_000usize, 100);
    let tokio = tokio()?;
    let mut rows = Vec::new();
    let text = "x".repeat(199) + "?";

    let dir = tempfile::tempdir()?;
    let direct = tokio.block_on(async {
        let runtime = durable(dir.path())?;
        let mut latencies = Vec::with_capacity(turns);
        let first = Instant::now();
        let Accepted::Started { run, turn } = runtime
            .start(StartRequest {
                text: text.clone(),
                ..StartRequest::default()
            })
            .await?
        else {
            anyhow::bail!("a fresh start was not a new run");
        };
        runtime.wait_for(&run, &turn).await?;
        latencies.push(first.elapsed().as_secs_f64());
        for _ in 1..turns {
            let sent = Instant::now();
            let message = MessageRequest {
                text: text.clone(),
                ..MessageRequest::default()
            };
            let Accepted::Started { turn, .. } = runtime.send(&run, message).await? else {
                anyhow::bail!("an idle run did not start a turn");
            };
            runtime.wait_for(&run, &turn).await?;
            latencies.push(sent.elapsed().as_secs_f64());
        }
        anyhow::Ok(latencies)
    })?;
    rows.push(late_against_early("runtime", &direct, window));

    let dir = tempfile::tempdir()?;
    let (over_http, (big, big_events), (small, small_events)) = tokio.block_on(async {
        let runtime = durable(dir.path())?;
        let (close, closing) = watch::channel(false);
        let (url, stop) = start(HttpChannel::new(runtime, closing).handler()).await?;
        let client = Client::new(&url)?;
        let body = json!({ "text": text });
        let mut latencies = Vec::with_capacity(turns);
        let first = Instant::now();
        let reply: Value = client.post("/runs", &body).await?;
        latencies.push(first.elapsed().as_secs_f64());
        let run = reply["run_id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no run id in {reply}"))?
            .to_owned();
        let path = format!("/runs/{run}");
        for _ in 1..turns {
            let sent = Instant::now();
            let reply: Value = client.post(&path, &body).await?;
            latencies.push(sent.elapsed().as_secs_f64());
            anyhow::ensure!(
                reply["state"] == "completed",
                "a turn did not complete: {reply}"
            );
        }
        // Grow the run to `events` (a turn records four), then read it
        // beside a run with one turn.
        let mut cursor = reply_cursor(&client.get(&path).await?)?;
        while cursor + 1 < events as u64 {
            let reply: Value = client.post(&path, &json!({"text": "more"})).await?;
            cursor = reply_cursor(&reply)?;
        }
        // Two turns: about ten events.
        let small_reply: Value = client.post("/runs", &json!({"text": "one"})).await?;
        let small_path = format!(
            "/runs/{}",
            small_reply["run_id"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("no run id in {small_reply}"))?
        );
        let small_reply: Value = client.post(&small_path, &json!({"text": "two"})).await?;
        let big = gets(&client, &path, reads).await?;
        let small = gets(&client, &small_path, reads).await?;
        close.send_replace(true);
        stop.send_replace(true);
        let sizes = (cursor + 1, reply_cursor(&small_reply)? + 1);
        anyhow::Ok((latencies, (big, sizes.0), (small, sizes.1)))
    })?;
    rows.push(late_against_early("http", &over_http, window));
    rows.push(
        Row::new(
            format!("long-run/GET run of {big_events} events p50"),
            percentile(&big, 0.5) * 1e3,
            "ms",
            format!("GET run of {small_events} events p50"),
            percentile(&small, 0.5) * 1e3,
        )
        .ratio_at_most(TARGET),
    );
    Ok(rows)
}

fn durable(dir: &std::path::Path) -> anyhow::Result<Runtime> {
    Ok(Runtime::builder(Arc::new(SqliteJournal::open(dir, Options::default())?)).build())
}

/// The median of the run's last `window` turns beside its first `window`.
fn late_against_early(path: &str, latencies: &[f64], window: usize) -> Row {
    let median = |slice: &[f64]| {
        let mut sorted = slice.to_vec();
        sorted.sort_by(f64::total_cmp);
        percentile(&sorted, 0.5) * 1e3
    };
    let turns = latencies.len();
    let window = window.min(turns / 2).max(1);
    Row::new(
        format!("long-run/{path} turns {}-{turns} p50", turns - window + 1),
        median(&latencies[turns - window..]),
        "ms",
        format!("turns 1-{window} p50"),
        median(&latencies[..window]),
    )
    .ratio_at_most(TARGET)
}

fn reply_cursor(reply: &Value) -> anyhow::Result<u64> {
    reply["cursor"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no cursor in {reply}"))
}

/// Latencies (seconds, sorted) of `count` reads of `path`, one at a time.
async fn gets(client: &Client, path: &str, count: usize) -> anyhow::Result<Vec<f64>> {
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let sent = Instant::now();
        let reply: Value = client.get(path).await?;
        latencies.push(sent.elapsed().as_secs_f64());
        std::hint::black_box(reply);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}
