//! Telemetry for the commands that run turns (`serve`, `run`, `chat`,
//! `rpc --stdio`, `pod serve`): started when the journal opens, if the
//! `OTEL_*` variables or `[telemetry]` name an endpoint, and flushed by
//! [`finish`] before the command returns.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_journal::Journal;
use spool_otel::{Agent, HttpSpans, Settings, Telemetry, TelemetrySection};
use spool_runtime::agent::Loaded;

/// How long a command waits, at its end, for queued telemetry to go.
const FLUSH: Duration = Duration::from_secs(5);

/// This process's telemetry, once started.
static RUNNING: Mutex<Option<Telemetry>> = Mutex::new(None);

/// The `tracing` layer making the HTTP channel's request lines spans; it
/// sends nothing until telemetry starts.
static HTTP_SPANS: std::sync::OnceLock<HttpSpans> = std::sync::OnceLock::new();

/// The layer to install with the process's `tracing` subscriber.
pub(crate) fn http_spans() -> HttpSpans {
    HTTP_SPANS.get_or_init(HttpSpans::new).clone()
}

/// Lets telemetry read `runtime`'s gauges (open streams).
pub(crate) fn watch(runtime: &spool_runtime::Runtime) {
    if let Some(telemetry) = RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_mut()
    {
        telemetry.watch(runtime);
    }
}

/// `journal`, observed when telemetry is on for `loaded`'s agent.
///
/// # Errors
///
/// A `[telemetry]` key or an `OTEL_*` value that is wrong.
pub(crate) fn observe(
    loaded: &Loaded,
    journal: Arc<dyn Journal>,
) -> anyhow::Result<Arc<dyn Journal>> {
    let section = TelemetrySection::from_definition(&loaded.definition)?;
    let Some(settings) = Settings::resolve(section.as_ref(), &|name| std::env::var(name).ok())?
    else {
        return Ok(journal);
    };
    let definition = &loaded.definition;
    let agent = Agent::from_engine(definition.agent.name.clone(), &definition.agent.engine);
    let telemetry = Telemetry::start(&settings, agent)?;
    let observed = telemetry.observe(journal);
    telemetry.feed(&http_spans());
    let signals: Vec<&str> = [
        (settings.traces.is_some(), "traces"),
        (settings.logs.is_some(), "logs"),
        (settings.metrics.is_some(), "metrics"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    crate::serve::say(&format!(
        "spool: telemetry on: {} over OTLP/HTTP",
        signals.join(", ")
    ));
    *RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(telemetry);
    Ok(observed)
}

/// Runs a command that may run turns on a multi-threaded runtime, and
/// sends what its telemetry queued before the process ends.
///
/// # Errors
///
/// The command's, or a runtime that does not start.
pub(crate) fn block_on(
    command: impl std::future::Future<Output = anyhow::Result<std::process::ExitCode>>,
) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(async move {
            let outcome = command.await;
            finish().await;
            outcome
        })
}

/// Sends what telemetry has queued, within a few seconds.
async fn finish() {
    let running = RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(telemetry) = running {
        telemetry.shutdown(FLUSH).await;
    }
}
