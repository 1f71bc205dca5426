//! Spool's runs as OpenTelemetry traces, logs and metrics, exported over
//! OTLP/HTTP to any collector (Grafana, Honeycomb, Jaeger, Datadog).
//!
//! [`Telemetry::start`] reads the standard `OTEL_*` variables (or
//! `[telemetry]` in `spool.toml`, [`config::TelemetrySection`]) and is
//! `None` when nothing names an endpoint; [`Telemetry::observe`] wraps a
//! journal so every commit becomes spans (a turn, each model call, tool
//! call, suspension and sleep, with the GenAI semantic conventions'
//! attributes), LogRecords (the JSON-RPC `events.append` records, with the
//! same ids) and metrics. Nothing waits on the collector: records go
//! through bounded queues, dropped and counted when full, and
//! [`Telemetry::shutdown`] sends what is queued within a deadline. See
//! `docs/observability.md`.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod export;
pub mod http;
mod journal;
mod observe;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::LogExporter as _;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SpanExporter as _;
use spool_journal::Journal;
use tokio_util::sync::CancellationToken;

pub use config::{ConfigError, Settings, TelemetrySection};
pub use export::Counts;
pub use http::HttpSpans;
pub use journal::Observed;
pub use observe::Agent;

/// How long one export may take, connecting to answer.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the mapping task rests between batches of commits.
const MAPPING_PAUSE: Duration = Duration::from_millis(100);
/// How often metrics are sent.
const METRICS_INTERVAL: Duration = Duration::from_secs(30);

/// Telemetry running: the queues' tasks and the metrics reader.
#[derive(Debug)]
pub struct Telemetry {
    commits: Arc<export::Queue<(Vec<spool_journal::Envelope>, Duration)>>,
    /// Stops the mapping task, which drains what is committed first.
    close_mapping: CancellationToken,
    mapping: tokio::task::JoinHandle<()>,
    close: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    meters: Option<SdkMeterProvider>,
    /// The span queue, for the HTTP request spans.
    span_queue: Option<export::Queue<opentelemetry_sdk::trace::SpanData>>,
    /// Gauges read from a runtime, kept as long as telemetry runs.
    gauges: Vec<opentelemetry::metrics::ObservableGauge<u64>>,
    /// Spans sent and dropped.
    pub spans: Option<Arc<Counts>>,
    /// LogRecords sent and dropped.
    pub logs: Option<Arc<Counts>>,
}

impl Telemetry {
    /// Starts exporting what `settings` turn on, for `agent`. Call it on
    /// the Tokio runtime the exports should run on.
    ///
    /// # Errors
    ///
    /// An exporter that cannot be built (an endpoint variable that is not
    /// a URL).
    pub fn start(settings: &Settings, agent: Agent) -> Result<Self, ConfigError> {
        let failed = |e: &dyn std::fmt::Display| ConfigError(e.to_string());
        let client = client::Client::new(tokio::runtime::Handle::current(), EXPORT_TIMEOUT)
            .map_err(|e| failed(&e))?;
        // The builder's detectors read `OTEL_SERVICE_NAME` and
        // `OTEL_RESOURCE_ATTRIBUTES`; a name of the file's (or `spool`)
        // only when they name none.
        let mut resource = Resource::builder();
        if let Some(name) = &settings.service_name {
            resource = resource.with_service_name(name.clone());
        }
        let resource = resource.build();
        let headers: std::collections::HashMap<String, String> =
            settings.headers.clone().into_iter().collect();
        let close = CancellationToken::new();
        let mut tasks = Vec::new();
        let (mut span_counts, mut log_counts) = (None, None);
        let spans = match &settings.traces {
            Some(signal) => {
                let builder = http(
                    opentelemetry_otlp::SpanExporter::builder().with_http(),
                    &client,
                    signal,
                    &headers,
                );
                let mut exporter = builder.build().map_err(|e| failed(&e))?;
                exporter.set_resource(&resource);
                let exporter = Arc::new(exporter);
                let (queue, counts, task) = export::start(
                    "traces",
                    move |batch| {
                        let exporter = Arc::clone(&exporter);
                        async move { exporter.export(batch).await }
                    },
                    close.clone(),
                );
                tasks.push(task);
                span_counts = Some(counts);
                Some(queue)
            }
            None => None,
        };
        let logs = match &settings.logs {
            Some(signal) => {
                let builder = http(
                    opentelemetry_otlp::LogExporter::builder().with_http(),
                    &client,
                    signal,
                    &headers,
                );
                let mut exporter = builder.build().map_err(|e| failed(&e))?;
                exporter.set_resource(&resource);
                let exporter = Arc::new(exporter);
                let scope = opentelemetry::InstrumentationScope::builder("spool")
                    .with_version(env!("CARGO_PKG_VERSION"))
                    .build();
                let (queue, counts, task) = export::start(
                    "logs",
                    move |batch: Vec<opentelemetry_sdk::logs::SdkLogRecord>| {
                        let exporter = Arc::clone(&exporter);
                        let scope = scope.clone();
                        async move {
                            let pairs: Vec<_> =
                                batch.iter().map(|record| (record, &scope)).collect();
                            exporter
                                .export(opentelemetry_sdk::logs::LogBatch::new(&pairs))
                                .await
                        }
                    },
                    close.clone(),
                );
                tasks.push(task);
                log_counts = Some(counts);
                Some(queue)
            }
            None => None,
        };
        let meters = match &settings.metrics {
            Some(signal) => {
                let builder = http(
                    opentelemetry_otlp::MetricExporter::builder().with_http(),
                    &client,
                    signal,
                    &headers,
                );
                let exporter = builder.build().map_err(|e| failed(&e))?;
                let reader = PeriodicReader::builder(exporter)
                    .with_interval(METRICS_INTERVAL)
                    .build();
                Some(
                    SdkMeterProvider::builder()
                        .with_reader(reader)
                        .with_resource(resource.clone())
                        .build(),
                )
            }
            None => None,
        };
        let instruments = meters
            .as_ref()
            .map(|provider| observe::Instruments::new(&provider.meter("spool")));
        let span_queue = spans.clone();
        let observer =
            observe::Observer::new(agent, settings.capture_content, spans, logs, instruments);
        // Commits are mapped on a task of their own, off the turns' path.
        let (commits, mut committed, _) =
            export::Queue::<(Vec<spool_journal::Envelope>, Duration)>::bounded("commits");
        let close_mapping = CancellationToken::new();
        let closing = close_mapping.clone();
        let mapping = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(export::BATCH);
            loop {
                let more = tokio::select! {
                    more = committed.recv_many(&mut batch, export::BATCH) => more > 0,
                    () = closing.cancelled() => false,
                };
                if !more {
                    break;
                }
                for (envelopes, took) in batch.drain(..) {
                    observer.committed(&envelopes, took);
                }
                // Woken a few times a second, not once per commit: the
                // turns keep the processor meanwhile.
                tokio::select! {
                    () = tokio::time::sleep(MAPPING_PAUSE) => {}
                    () = closing.cancelled() => {}
                }
            }
            while let Ok((envelopes, took)) = committed.try_recv() {
                observer.committed(&envelopes, took);
            }
        });
        Ok(Self {
            commits: Arc::new(commits),
            close_mapping,
            mapping,
            close,
            tasks,
            meters,
            span_queue,
            gauges: Vec::new(),
            spans: span_counts,
            logs: log_counts,
        })
    }

    /// Sends the HTTP request spans `layer` makes, with the runs' spans.
    pub fn feed(&self, layer: &HttpSpans) {
        if let Some(queue) = &self.span_queue {
            layer.feed(
                queue.clone(),
                opentelemetry::InstrumentationScope::builder("spool")
                    .with_version(env!("CARGO_PKG_VERSION"))
                    .build(),
            );
        }
    }

    /// Reads `runtime`'s gauges at each metrics export:
    /// `spool.streams.open`.
    pub fn watch(&mut self, runtime: &spool_runtime::Runtime) {
        let Some(meters) = &self.meters else {
            return;
        };
        let runtime = runtime.clone();
        let gauge = meters
            .meter("spool")
            .u64_observable_gauge("spool.streams.open")
            .with_description("Subscriptions to runs open: every transport's streams, and the runtime's own readers.")
            .with_callback(move |observer| {
                observer.observe(u64::try_from(runtime.open_streams()).unwrap_or(u64::MAX), &[]);
            })
            .build();
        self.gauges.push(gauge);
    }

    /// `journal`, its commits observed.
    #[must_use]
    pub fn observe(&self, journal: Arc<dyn Journal>) -> Arc<dyn Journal> {
        Arc::new(Observed::new(journal, Arc::clone(&self.commits)))
    }

    /// Sends what is queued and stops, within `deadline`.
    pub async fn shutdown(self, deadline: Duration) {
        let until = tokio::time::Instant::now() + deadline;
        // What is committed is mapped first, then the queues close.
        self.close_mapping.cancel();
        let _ = tokio::time::timeout_at(until, self.mapping).await;
        self.close.cancel();
        let tasks = futures_join(self.tasks);
        let _ = tokio::time::timeout_at(until, tasks).await;
        if let Some(meters) = self.meters {
            // The reader's own thread sends the last metrics; it blocks,
            // so off the runtime's workers.
            let _ =
                tokio::task::spawn_blocking(move || meters.shutdown_with_timeout(deadline)).await;
        }
    }
}

/// An OTLP/HTTP exporter's builder set up for `signal`: Spool's client,
/// the encoding, the time limit, the file's headers and, when the file
/// names it, the endpoint (else the exporter reads the variables).
fn http<B>(
    builder: B,
    client: &client::Client,
    signal: &config::SignalSettings,
    headers: &std::collections::HashMap<String, String>,
) -> B
where
    B: opentelemetry_otlp::WithHttpConfig + opentelemetry_otlp::WithExportConfig,
{
    let builder = builder
        .with_http_client(client.clone())
        .with_protocol(match signal.protocol {
            config::Protocol::Protobuf => opentelemetry_otlp::Protocol::HttpBinary,
            config::Protocol::Json => opentelemetry_otlp::Protocol::HttpJson,
        })
        .with_timeout(EXPORT_TIMEOUT)
        .with_headers(headers.clone());
    match &signal.endpoint {
        Some(endpoint) => builder.with_endpoint(endpoint.clone()),
        None => builder,
    }
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        let _ = task.await;
    }
}
