//! The transports' HTTP requests as server spans. The HTTP channel logs
//! each request when it ends (`spool::http`: method, path, status,
//! milliseconds); [`HttpSpans`], a `tracing` layer, turns that line into
//! a span named for the route (`POST /spool/v1/runs/{run_id}`). A request
//! about a run joins the run's trace as a root span of its own, so a
//! viewer shows the request beside the turn it started.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use spool_journal::RunId;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

use crate::export::Queue;

/// The `tracing` target of the HTTP channel's request lines.
const TARGET: &str = "spool::http";

/// A `tracing` layer making a server span of each HTTP request line, once
/// telemetry feeds it ([`crate::Telemetry::feed`]); until then it does
/// nothing.
#[derive(Clone, Debug, Default)]
pub struct HttpSpans {
    sink: Arc<OnceLock<(Queue<SpanData>, InstrumentationScope)>>,
}

impl HttpSpans {
    /// A layer with nowhere to send yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn feed(&self, queue: Queue<SpanData>, scope: InstrumentationScope) {
        let _ = self.sink.set((queue, scope));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for HttpSpans {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let Some((queue, scope)) = self.sink.get() else {
            return;
        };
        let mut line = Line::default();
        event.record(&mut line);
        let (Some(method), Some(path), Some(status), Some(millis)) =
            (line.method, line.path, line.status, line.millis)
        else {
            return;
        };
        let end = SystemTime::now();
        let start = end
            .checked_sub(Duration::from_millis(millis))
            .unwrap_or(end);
        let (route, run) = route(&path);
        let trace = run
            .as_ref()
            .and_then(|run| TraceId::from_hex(&spool_edge::records::trace_id(run)).ok())
            .unwrap_or_else(|| TraceId::from(fastrand::u128(1..)));
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.clone()),
            KeyValue::new("http.route", route.clone()),
            KeyValue::new("url.path", path),
            KeyValue::new(
                "http.response.status_code",
                i64::try_from(status).unwrap_or(0),
            ),
        ];
        if let Some(run) = &run {
            attributes.push(KeyValue::new("spool.run.id", run.as_str().to_owned()));
        }
        queue.push(SpanData {
            span_context: SpanContext::new(
                trace,
                SpanId::from(fastrand::u64(1..)),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: Cow::Owned(format!("{method} {route}")),
            start_time: start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            // Server spans are errors for 5xx only, as HTTP's conventions say.
            status: if status >= 500 {
                Status::error(format!("HTTP {status}"))
            } else {
                Status::Unset
            },
            instrumentation_scope: scope.clone(),
        });
    }
}

/// The fields of one request line.
#[derive(Default)]
struct Line {
    method: Option<String>,
    path: Option<String>,
    status: Option<u64>,
    millis: Option<u64>,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "path" {
            self.path = Some(value.to_owned());
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "status" => self.status = Some(value),
            "millis" => self.millis = Some(value),
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record_u64(field, u64::try_from(value).unwrap_or(0));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "method" {
            self.method = Some(format!("{value:?}"));
        }
    }
}

/// The route of `path`, its ids replaced by their names (few span names,
/// as a viewer wants), and the run it is about.
fn route(path: &str) -> (String, Option<RunId>) {
    let mut run = None;
    let mut segments: Vec<&str> = Vec::new();
    let mut previous = "";
    for segment in path.split('/') {
        let named = match previous {
            "runs" => {
                run = RunId::new(segment).ok();
                "{run_id}"
            }
            "addresses" => "{address}",
            "schedules" => "{name}",
            _ => segment,
        };
        segments.push(named);
        previous = segment;
    }
    (segments.join("/"), run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routes_ids_are_named_and_its_run_found() {
        let (route, run) = route("/spool/v1/runs/run_abc/cancel");
        assert_eq!(route, "/spool/v1/runs/{run_id}/cancel");
        assert_eq!(run.unwrap().as_str(), "run_abc");
        assert_eq!(
            route_of("/spool/v1/addresses/job"),
            "/spool/v1/addresses/{address}"
        );
        assert_eq!(route_of("/spool/v1/runs"), "/spool/v1/runs");
    }

    fn route_of(path: &str) -> String {
        route(path).0
    }
}
