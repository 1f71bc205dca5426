//! From committed journal events to spans, LogRecords and metrics: the
//! OpenTelemetry table over [`spool_runtime::activity`] (the LogRecords
//! are the JSON-RPC events, `spool_edge::records`).
//!
//! A tool call's span lasts until its result is known: a question's wait
//! and a sleep are child spans of the call that asked or slept.
//!
//! Every id comes from the run, as the JSON-RPC events' do
//! (`spool_edge::records`): the trace is the run, a model call's span is
//! `model:<seq of its request>`, a tool call's `tool:<call id>`, and a
//! turn's `turn:<turn id>`, so a span and the LogRecords of its task carry
//! the same ids on every server and after a restart. A span is made when
//! its end is committed, from the start this process saw (a span whose
//! start came before a restart begins where this process first saw it,
//! marked `spool.resumed`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::logs::{SdkLogRecord, SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use serde_json::Value;
use spool_edge::records::{Mapper, span_id, trace_id};
use spool_journal::event::ModelCallCompleted;
use spool_journal::{Envelope, RunId};
use spool_runtime::activity::{Activity, Reader, ToolOutcome, TurnOutcome};

use crate::export::Queue;

/// The agent the spans describe.
#[derive(Clone, Debug, Default)]
pub struct Agent {
    /// `gen_ai.agent.name`.
    pub name: Option<String>,
    /// `gen_ai.provider.name`: `openai`, `anthropic`, or `spool` for the
    /// built-in engines.
    pub provider: String,
    /// `gen_ai.request.model`.
    pub model: String,
}

impl Agent {
    /// The provider and model an engine spec names (`openai/gpt-4o`,
    /// `anthropic/claude-…`, `echo`, `scripted:…`, `command:…`).
    #[must_use]
    pub fn from_engine(name: Option<String>, engine: &str) -> Self {
        let (provider, model) = match engine.split_once('/') {
            Some((provider, model)) if !provider.contains(':') => {
                (provider.to_owned(), model.to_owned())
            }
            _ => {
                let kind = engine.split(':').next().unwrap_or(engine);
                ("spool".to_owned(), kind.to_owned())
            }
        };
        Self {
            name,
            provider,
            model,
        }
    }
}

/// What one run has open.
#[derive(Debug)]
struct Track {
    /// The log records' table, fed the facts `reader` reads.
    mapper: Mapper,
    /// The run's activity, read once for the spans and the log records.
    reader: Reader,
    /// The run's trace id, computed once.
    trace: TraceId,
    /// The current turn's span id, computed once per turn.
    turn_span: SpanId,
    turn: Option<(String, SystemTime)>,
    /// The model call in progress: its request's position and time.
    model: Option<(u64, SystemTime)>,
    /// Tool calls in progress: start, tool, input.
    tools: HashMap<String, (SystemTime, String, Value)>,
    /// A suspension in progress: start, kind, call id.
    suspended: Option<(SystemTime, String, Option<String>)>,
    /// Sleeps in progress, by call id.
    sleeps: HashMap<String, SystemTime>,
    /// Counted in `spool.runs.parked`.
    parked: bool,
}

impl Track {
    fn new(run: &RunId) -> Self {
        Self {
            mapper: Mapper::new(run),
            reader: Reader::new(),
            trace: TraceId::from_hex(&trace_id(run)).unwrap_or(TraceId::INVALID),
            turn_span: SpanId::INVALID,
            turn: None,
            model: None,
            tools: HashMap::new(),
            suspended: None,
            sleeps: HashMap::new(),
            parked: false,
        }
    }

    fn idle(&self) -> bool {
        self.turn.is_none() && !self.parked && self.tools.is_empty() && self.sleeps.is_empty()
    }
}

/// The metrics instruments.
#[derive(Debug)]
pub(crate) struct Instruments {
    runs_started: Counter<u64>,
    turns: Counter<u64>,
    turn_duration: Histogram<f64>,
    model_duration: Histogram<f64>,
    tokens: Histogram<u64>,
    tool_duration: Histogram<f64>,
    append_duration: Histogram<f64>,
    append_events: Histogram<u64>,
    parked: UpDownCounter<i64>,
}

impl Instruments {
    pub(crate) fn new(meter: &Meter) -> Self {
        Self {
            runs_started: meter
                .u64_counter("spool.runs.started")
                .with_description("Runs created.")
                .build(),
            turns: meter
                .u64_counter("spool.turns")
                .with_description("Turns ended, by `spool.turn.outcome`.")
                .build(),
            turn_duration: meter
                .f64_histogram("spool.turn.duration")
                .with_unit("s")
                .with_description("A turn's time from its start to its end.")
                .build(),
            model_duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("A model call's time.")
                .build(),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens a model call used, by `gen_ai.token.type`.")
                .build(),
            tool_duration: meter
                .f64_histogram("spool.tool.duration")
                .with_unit("s")
                .with_description("A tool call's time.")
                .build(),
            append_duration: meter
                .f64_histogram("spool.journal.append.duration")
                .with_unit("s")
                .with_description("A journal commit's time, its fsync included.")
                .build(),
            append_events: meter
                .u64_histogram("spool.journal.append.events")
                .with_unit("{event}")
                .with_description("Events per journal commit.")
                .build(),
            parked: meter
                .i64_up_down_counter("spool.runs.parked")
                .with_description("Runs waiting for an answer, a timer or a budget, seen parking by this process.")
                .build(),
        }
    }
}

/// What the observer makes; queued outside its lock.
#[derive(Default)]
struct Made {
    spans: Vec<SpanData>,
    logs: Vec<SdkLogRecord>,
}

/// Turns committed events into telemetry.
pub(crate) struct Observer {
    agent: Agent,
    /// The model calls' metric attributes, and with each token type.
    model: Vec<KeyValue>,
    tokens: [Vec<KeyValue>; 2],
    capture_content: bool,
    scope: InstrumentationScope,
    spans: Option<Queue<SpanData>>,
    logs: Option<(Queue<SdkLogRecord>, SdkLogger)>,
    metrics: Option<Instruments>,
    runs: Mutex<HashMap<RunId, Track>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl Observer {
    pub(crate) fn new(
        agent: Agent,
        capture_content: bool,
        spans: Option<Queue<SpanData>>,
        logs: Option<Queue<SdkLogRecord>>,
        metrics: Option<Instruments>,
    ) -> Self {
        // A provider with no processor: it only makes records, which the
        // queue sends.
        let logs = logs.map(|queue| (queue, SdkLoggerProvider::builder().build().logger("spool")));
        let model = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", agent.provider.clone()),
            KeyValue::new("gen_ai.request.model", agent.model.clone()),
        ];
        let tokens = ["input", "output"].map(|kind| {
            let mut with = model.clone();
            with.push(KeyValue::new("gen_ai.token.type", kind));
            with
        });
        Self {
            agent,
            model,
            tokens,
            capture_content,
            scope: InstrumentationScope::builder("spool")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            spans,
            logs,
            metrics,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// One commit: `envelopes` appended in `took`.
    pub(crate) fn committed(&self, envelopes: &[Envelope], took: Duration) {
        if let Some(metrics) = &self.metrics {
            metrics.append_duration.record(took.as_secs_f64(), &[]);
            metrics.append_events.record(envelopes.len() as u64, &[]);
        }
        let Some(first) = envelopes.first() else {
            return;
        };
        let mut made = Made::default();
        {
            let mut runs = self
                .runs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Only runs with something open are kept (a turn, a call, a
            // sleep, a wait): the map follows live work.
            let track = runs
                .entry(first.run_id.clone())
                .or_insert_with(|| Track::new(&first.run_id));
            for envelope in envelopes {
                self.follow(track, envelope, &mut made);
            }
            if track.idle() {
                runs.remove(&first.run_id);
            }
        }
        if let Some(queue) = &self.spans {
            for span in made.spans {
                queue.push(span);
            }
        }
        if let Some((queue, _)) = &self.logs {
            for record in made.logs {
                queue.push(record);
            }
        }
    }

    fn follow(&self, track: &mut Track, envelope: &Envelope, made: &mut Made) {
        // The event is read once, for the log records and the spans both.
        let facts: Vec<Activity<'_>> = track.reader.envelope(envelope).collect();
        if let Some((_, logger)) = &self.logs {
            for event in track.mapper.facts(envelope, &facts) {
                made.logs.push(log_record(logger, &event));
            }
        }
        let at = SystemTime::from(envelope.recorded_at);
        let run = &envelope.run_id;
        let metrics = self.metrics.as_ref();
        let park = |track: &mut Track, on: bool| {
            if track.parked != on {
                track.parked = on;
                if let Some(metrics) = metrics {
                    metrics.parked.add(if on { 1 } else { -1 }, &[]);
                }
            }
        };
        for fact in facts {
            match fact {
                Activity::Created(_) => {
                    if let Some(metrics) = metrics {
                        metrics.runs_started.add(1, &[]);
                    }
                }
                Activity::TurnStarted { started, .. } => {
                    park(track, false);
                    track.turn_span = span(run, &format!("turn:{}", started.turn_id));
                    track.turn = Some((started.turn_id.as_str().to_owned(), at));
                }
                Activity::ModelCallStarted { call } => track.model = Some((call.0, at)),
                Activity::ModelCallEnded { call, done } => {
                    let seq = call.map_or(envelope.seq.0.saturating_sub(1), |call| call.0);
                    self.model_span(track, run, seq, at, Some(done), made);
                }
                Activity::ModelCallInterrupted { call } => {
                    self.model_span(track, run, call.0, at, None, made);
                }
                Activity::ToolCallStarted(requested) => {
                    track.tools.insert(
                        requested.call_id.clone(),
                        (at, requested.tool.clone(), requested.input.clone()),
                    );
                }
                Activity::ToolCallEnded {
                    call_id, outcome, ..
                } => {
                    if let ToolOutcome::Woke { early, .. } = outcome {
                        park(track, false);
                        self.sleep_span(track, run, &call_id, at, early, made);
                    }
                    let status = if outcome.is_error() {
                        Status::error(outcome.text())
                    } else {
                        Status::Unset
                    };
                    let output = match &outcome {
                        ToolOutcome::Output(output) => Some(Cow::Borrowed(*output)),
                        ToolOutcome::Resolved(resolved) => Some(Cow::Borrowed(&*resolved.output)),
                        ToolOutcome::Abandoned(_) | ToolOutcome::Interrupted => None,
                        other => Some(Cow::Owned(Value::String(other.text()))),
                    };
                    self.tool_span(
                        track,
                        run,
                        (&call_id, outcome.name()),
                        at,
                        output.as_deref(),
                        status,
                        made,
                    );
                }
                Activity::Suspended(suspended) => {
                    park(track, true);
                    track.suspended = Some((
                        at,
                        suspended.kind.as_str().to_owned(),
                        suspended.call_id.clone(),
                    ));
                }
                Activity::BudgetStopped(_) => park(track, true),
                Activity::Resumed { .. } => {
                    park(track, false);
                    if let Some((start, kind, call)) = track.suspended.take() {
                        let mut attributes =
                            vec![KeyValue::new("spool.suspend.kind", kind.clone())];
                        // A question's wait is part of its tool call.
                        let parent = match &call {
                            Some(call) => {
                                attributes.push(KeyValue::new("gen_ai.tool.call.id", call.clone()));
                                span(run, &format!("tool:{call}"))
                            }
                            None => track.turn_span,
                        };
                        made.spans.push(self.span(
                            (track.trace, parent),
                            span(run, &format!("suspend:{}", envelope.seq.0)),
                            format!("suspended {kind}"),
                            SpanKind::Internal,
                            (start, at, false),
                            attributes,
                            Status::Unset,
                        ));
                    }
                }
                Activity::SleepStarted(sleep) => {
                    park(track, true);
                    track.sleeps.insert(sleep.call_id.clone(), at);
                }
                Activity::TurnEnded(outcome) => {
                    let (name, status) = match outcome {
                        TurnOutcome::Completed(_) => ("completed", Status::Ok),
                        TurnOutcome::Failed(failed) => (
                            "failed",
                            Status::error(format!("{}: {}", failed.code.as_str(), failed.message)),
                        ),
                        TurnOutcome::Cancelled(_) => ("cancelled", Status::Unset),
                    };
                    // A turn that ends while parked is no longer parked.
                    park(track, false);
                    track.suspended = None;
                    track.sleeps.clear();
                    self.turn_span(track, run, outcome.turn().as_str(), at, name, status, made);
                }
                _ => {}
            }
        }
    }

    /// A model call's span: answered (`done`) or interrupted by its turn's
    /// end.
    fn model_span(
        &self,
        track: &mut Track,
        run: &RunId,
        seq: u64,
        at: SystemTime,
        done: Option<&ModelCallCompleted>,
        made: &mut Made,
    ) {
        let (start, resumed) = match track.model.take() {
            Some((_, start)) => (start, false),
            None => (at, true),
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", self.agent.provider.clone()),
            KeyValue::new("gen_ai.request.model", self.agent.model.clone()),
            KeyValue::new("gen_ai.response.model", self.agent.model.clone()),
            KeyValue::new("gen_ai.conversation.id", run.as_str().to_owned()),
        ];
        let mut status = Status::Unset;
        match done {
            Some(done) => {
                if let Some(usage) = done.usage {
                    attributes.push(KeyValue::new(
                        "gen_ai.usage.input_tokens",
                        i64::try_from(usage.input_tokens).unwrap_or(i64::MAX),
                    ));
                    attributes.push(KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        i64::try_from(usage.output_tokens).unwrap_or(i64::MAX),
                    ));
                    if let Some(metrics) = &self.metrics {
                        metrics.tokens.record(usage.input_tokens, &self.tokens[0]);
                        metrics.tokens.record(usage.output_tokens, &self.tokens[1]);
                    }
                }
                if let Some(reason) = &done.finish_reason {
                    attributes.push(KeyValue::new(
                        "gen_ai.response.finish_reasons",
                        opentelemetry::Value::Array(
                            vec![opentelemetry::StringValue::from(reason.clone())].into(),
                        ),
                    ));
                }
            }
            None => {
                status = Status::error("the turn ended before the model's answer");
            }
        }
        if let Some(metrics) = &self.metrics {
            metrics
                .model_duration
                .record(seconds(start, at), &self.model);
        }
        made.spans.push(self.span(
            (track.trace, track.turn_span),
            span(run, &format!("model:{seq}")),
            format!("chat {}", self.agent.model),
            SpanKind::Client,
            (start, at, resumed),
            attributes,
            status,
        ));
    }

    /// A sleep's span, a child of the tool call that slept.
    fn sleep_span(
        &self,
        track: &mut Track,
        run: &RunId,
        call_id: &str,
        at: SystemTime,
        early: bool,
        made: &mut Made,
    ) {
        let (start, resumed) = match track.sleeps.remove(call_id) {
            Some(start) => (start, false),
            None => (at, true),
        };
        made.spans.push(self.span(
            (track.trace, span(run, &format!("tool:{call_id}"))),
            span(run, &format!("sleep:{call_id}")),
            "sleep".into(),
            SpanKind::Internal,
            (start, at, resumed),
            vec![
                KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()),
                KeyValue::new("spool.sleep.early", early),
            ],
            Status::Unset,
        ));
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one span's parts, named at each call"
    )]
    fn tool_span(
        &self,
        track: &mut Track,
        run: &RunId,
        (call_id, outcome): (&str, &'static str),
        at: SystemTime,
        output: Option<&Value>,
        status: Status,
        made: &mut Made,
    ) {
        let (start, tool, input, resumed) = match track.tools.remove(call_id) {
            Some((start, tool, input)) => (start, tool, Some(input), false),
            None => (at, String::new(), None, true),
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", tool.clone()),
            KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()),
            KeyValue::new("gen_ai.tool.type", "function"),
            KeyValue::new("spool.tool.outcome", outcome),
        ];
        if self.capture_content {
            if let Some(input) = input {
                attributes.push(KeyValue::new(
                    "gen_ai.tool.call.arguments",
                    input.to_string(),
                ));
            }
            if let Some(output) = output {
                attributes.push(KeyValue::new("gen_ai.tool.call.result", output.to_string()));
            }
        }
        if let Some(metrics) = &self.metrics {
            metrics.tool_duration.record(
                seconds(start, at),
                &[KeyValue::new("gen_ai.tool.name", tool.clone())],
            );
        }
        made.spans.push(self.span(
            (track.trace, track.turn_span),
            span(run, &format!("tool:{call_id}")),
            format!("execute_tool {tool}"),
            SpanKind::Internal,
            (start, at, resumed),
            attributes,
            status,
        ));
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one span's parts, named at each call"
    )]
    fn turn_span(
        &self,
        track: &mut Track,
        run: &RunId,
        turn: &str,
        at: SystemTime,
        outcome: &'static str,
        status: Status,
        made: &mut Made,
    ) {
        let (start, resumed) = match track.turn.take() {
            Some((_, start)) => (start, false),
            None => (at, true),
        };
        track.model = None;
        if let Some(metrics) = &self.metrics {
            let outcome = [KeyValue::new("spool.turn.outcome", outcome)];
            metrics.turns.add(1, &outcome);
            metrics.turn_duration.record(seconds(start, at), &outcome);
        }
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_agent"),
            KeyValue::new("gen_ai.conversation.id", run.as_str().to_owned()),
            KeyValue::new("spool.run.id", run.as_str().to_owned()),
            KeyValue::new("spool.turn.id", turn.to_owned()),
            KeyValue::new("spool.turn.outcome", outcome),
        ];
        let name = match &self.agent.name {
            Some(agent) => {
                attributes.push(KeyValue::new("gen_ai.agent.name", agent.clone()));
                format!("invoke_agent {agent}")
            }
            None => "invoke_agent".to_owned(),
        };
        made.spans.push(self.span(
            (track.trace, SpanId::INVALID),
            span(run, &format!("turn:{turn}")),
            name,
            SpanKind::Internal,
            (start, at, resumed),
            attributes,
            status,
        ));
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one span's parts, named at each call"
    )]
    fn span(
        &self,
        (trace, parent): (TraceId, SpanId),
        span: SpanId,
        name: String,
        kind: SpanKind,
        (start, end, resumed): (SystemTime, SystemTime, bool),
        mut attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        if resumed {
            attributes.push(KeyValue::new("spool.resumed", true));
        }
        SpanData {
            span_context: SpanContext::new(
                trace,
                span,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: kind,
            name: Cow::Owned(name),
            start_time: start,
            end_time: end.max(start),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// The span id of `run`'s `task`: the JSON-RPC events' own.
fn span(run: &RunId, task: &str) -> SpanId {
    SpanId::from_hex(&span_id(run, task)).unwrap_or(SpanId::INVALID)
}

fn seconds(start: SystemTime, end: SystemTime) -> f64 {
    end.duration_since(start).unwrap_or_default().as_secs_f64()
}

/// A JSON-RPC event as an OTLP LogRecord: the same body, severity,
/// attributes and ids.
fn log_record(logger: &SdkLogger, event: &spool_wire::rpc::WireEvent) -> SdkLogRecord {
    let mut record = logger.create_log_record();
    record.set_timestamp(SystemTime::UNIX_EPOCH + Duration::from_nanos(event.time_unix_nano));
    record.set_observed_timestamp(SystemTime::now());
    let (number, text) = match event.severity_number.number() {
        0..=4 => (Severity::Trace, "TRACE"),
        5..=8 => (Severity::Debug, "DEBUG"),
        9..=12 => (Severity::Info, "INFO"),
        13..=16 => (Severity::Warn, "WARN"),
        17..=20 => (Severity::Error, "ERROR"),
        _ => (Severity::Fatal, "FATAL"),
    };
    record.set_severity_number(number);
    record.set_severity_text(text);
    record.set_body(AnyValue::String(event.body.clone().into()));
    record.add_attribute("spool.kind", event.kind.clone());
    for (key, value) in &event.attributes {
        record.add_attribute(key.clone(), any_value(value));
    }
    let trace = TraceId::from_hex(&event.trace_id).unwrap_or(TraceId::INVALID);
    let span = event
        .span_id
        .as_deref()
        .and_then(|span| SpanId::from_hex(span).ok())
        .unwrap_or(SpanId::INVALID);
    record.set_trace_context(trace, span, Some(TraceFlags::SAMPLED));
    record
}

fn any_value(value: &Value) -> AnyValue {
    match value {
        Value::String(text) => AnyValue::String(text.clone().into()),
        Value::Bool(flag) => AnyValue::Boolean(*flag),
        Value::Number(number) => number
            .as_i64()
            .map(AnyValue::Int)
            .or_else(|| number.as_f64().map(AnyValue::Double))
            .unwrap_or_else(|| AnyValue::String(number.to_string().into())),
        other => AnyValue::String(other.to_string().into()),
    }
}
