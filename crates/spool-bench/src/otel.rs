//! `otel-dead-collector`: whether a collector that is down slows a turn.
//! Two runs on durable SQLite journals take turns one after the other,
//! alternately first: one with nothing exported (the baseline), one
//! exporting traces, logs and metrics to a loopback port nobody listens
//! on, so every export fails and is retried while turns go on. The figure
//! is the exporting run's median turn; the target, within 5 % of the
//! baseline's.

use std::sync::Arc;
use std::time::Instant;

use spool_journal::store::sqlite::{Options, SqliteJournal};
use spool_otel::config::{Settings, TelemetrySection};
use spool_otel::{Agent, Telemetry};
use spool_runtime::{Accepted, MessageRequest, Runtime, StartRequest};

use crate::Scale;
use crate::http::{percentile, tokio};
use crate::report::Row;

/// How much slower an exporting turn may be.
const TARGET: f64 = 1.05;

pub(crate) fn dead_collector(scale: Scale) -> anyhow::Result<Vec<Row>> {
    let turns = scale.pick(2_000usize, 60);
    let tokio = tokio()?;
    let (plain_dir, observed_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (plain, observed, dropped) = tokio.block_on(async {
        // Bound, then closed: connections to it are refused.
        let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let section = TelemetrySection {
            endpoint: Some(format!("http://{dead}")),
            ..TelemetrySection::default()
        };
        let settings = Settings::resolve(Some(&section), &|_| None)?
            .ok_or_else(|| anyhow::anyhow!("telemetry is on with an endpoint"))?;
        let telemetry = Telemetry::start(&settings, Agent::from_engine(None, "echo"))?;
        let plain = Runtime::builder(Arc::new(SqliteJournal::open(
            plain_dir.path(),
            Options::default(),
        )?))
        .build();
        let observed = Runtime::builder(telemetry.observe(Arc::new(SqliteJournal::open(
            observed_dir.path(),
            Options::default(),
        )?)))
        .build();
        let mut plain_run = Turns::start(&plain).await?;
        let mut observed_run = Turns::start(&observed).await?;
        for turn in 0..turns {
            if turn % 2 == 0 {
                plain_run.next().await?;
                observed_run.next().await?;
            } else {
                observed_run.next().await?;
                plain_run.next().await?;
            }
        }
        // A batch is dropped once its last attempt fails, about 1.5 s after
        // its first (`spool-otel`'s backoff): turns may end sooner than
        // that, so the proof waits for it, up to a deadline.
        let dropped = || {
            telemetry
                .spans
                .as_ref()
                .map_or(0, |c| c.dropped.load(std::sync::atomic::Ordering::Relaxed))
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while dropped() == 0 && !scale.quick && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let dropped = dropped();
        drop(telemetry);
        anyhow::Ok((plain_run.latencies, observed_run.latencies, dropped))
    })?;
    let median = |latencies: &[f64]| {
        let mut sorted = latencies.to_vec();
        sorted.sort_by(f64::total_cmp);
        percentile(&sorted, 0.5) * 1e3
    };
    // The spans the dead collector never took: proof the exports failed.
    anyhow::ensure!(
        dropped > 0 || scale.quick,
        "no span was dropped: was the collector reached?"
    );
    Ok(vec![
        Row::new(
            "otel-dead-collector/turn p50 exporting to a dead endpoint",
            median(&observed),
            "ms",
            "turn p50, nothing exported",
            median(&plain),
        )
        .ratio_at_most(TARGET),
    ])
}

/// One run's turns, timed.
struct Turns<'a> {
    runtime: &'a Runtime,
    run: spool_journal::RunId,
    latencies: Vec<f64>,
}

impl<'a> Turns<'a> {
    async fn start(runtime: &'a Runtime) -> anyhow::Result<Self> {
        let Accepted::Started { run, turn } = runtime
            .start(StartRequest {
                text: "start".into(),
                ..StartRequest::default()
            })
            .await?
        else {
            anyhow::bail!("a fresh start was not a new run");
        };
        runtime.wait_for(&run, &turn).await?;
        Ok(Self {
            runtime,
            run,
            latencies: Vec::new(),
        })
    }

    async fn next(&mut self) -> anyhow::Result<()> {
        let sent = Instant::now();
        let message = MessageRequest {
            text: "x".repeat(199) + "?",
            ..MessageRequest::default()
        };
        let Accepted::Started { turn, .. } = self.runtime.send(&self.run, message).await? else {
            anyhow::bail!("an idle run did not start a turn");
        };
        self.runtime.wait_for(&self.run, &turn).await?;
        self.latencies.push(sent.elapsed().as_secs_f64());
        Ok(())
    }
}
