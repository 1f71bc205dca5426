//! Telemetry sent to an OTLP/HTTP receiver in the test, which decodes each
//! request with the `opentelemetry-proto` types (code nobody here wrote)
//! and checks the ids, the parent and child links, the GenAI attributes
//! and the LogRecords of a scripted run with a tool call and a question.

// Everything in this binary is test code: a helper that unwraps fails the
// test on the line that broke, which is what it is for.
#![allow(clippy::unwrap_used)]

mod activity;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};
use spool_journal::event::{Answer, Effect};
use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_otel::config::{Settings, TelemetrySection};
use spool_otel::{Agent, Telemetry};
use spool_runtime::engine::ToolSpec;
use spool_runtime::engines::ScriptedEngine;
use spool_runtime::{Accepted, BoxFuture, Runtime, StartRequest, Tool, ToolOutcome, Tools};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(20);

/// An OTLP/HTTP receiver: every request's path and body.
async fn receiver() -> (String, mpsc::UnboundedReceiver<(String, bytes::Bytes)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sender, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let sender = sender.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let sender = sender.clone();
                    async move {
                        let path = request.uri().path().to_owned();
                        let body = request.into_body().collect().await?.to_bytes();
                        let _ = sender.send((path, body));
                        Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::new(),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), received)
}

/// Adds two numbers.
struct Add;

impl Tool for Add {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "add".into(),
            description: "Add two numbers.".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    fn effect(&self) -> Effect {
        Effect::Read
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, ToolOutcome> {
        let sum = input["a"].as_i64().unwrap_or(0) + input["b"].as_i64().unwrap_or(0);
        Box::pin(async move { ToolOutcome::Output(json!(sum)) })
    }
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn text<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attribute(attributes, key) {
        Some(any_value::Value::StringValue(text)) => Some(text),
        _ => None,
    }
}

fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key) {
        Some(any_value::Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}

/// Telemetry sending to `endpoint` on the default settings.
fn telemetry_to(endpoint: String, agent: Agent) -> Telemetry {
    let section = TelemetrySection {
        endpoint: Some(endpoint),
        ..TelemetrySection::default()
    };
    let settings = Settings::resolve(Some(&section), &|_| None)
        .unwrap()
        .unwrap();
    Telemetry::start(&settings, agent).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_turn_model_calls_tool_calls_and_question_reach_a_collector_as_linked_spans_logs_and_metrics()
 {
    let (endpoint, mut received) = receiver().await;
    let telemetry = telemetry_to(
        endpoint,
        Agent::from_engine(Some("reviewer".into()), "scripted:script.jsonl"),
    );
    let script = [
        json!({"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}], "usage": {"input_tokens": 10, "output_tokens": 4}}),
        json!({"tool_calls": [{"id": "q1", "name": "ask_human", "arguments": {"prompt": "Deploy?"}}], "usage": {"input_tokens": 20, "output_tokens": 5}}),
        json!({"text": "deployed", "usage": {"input_tokens": 30, "output_tokens": 6}}),
    ]
    .map(|line| line.to_string())
    .join("\n");
    let mut tools = Tools::builtin();
    tools.add(Arc::new(Add)).unwrap();
    let runtime = Runtime::builder(telemetry.observe(Arc::new(MemoryJournal::new())))
        .engine(Arc::new(ScriptedEngine::from_jsonl(&script).unwrap()))
        .tools(tools)
        .build();
    let Accepted::Started { run, turn } = runtime
        .start(StartRequest {
            text: "deploy it".into(),
            ..StartRequest::default()
        })
        .await
        .unwrap()
    else {
        panic!("a fresh run")
    };
    let parked = tokio::time::timeout(PATIENCE, runtime.wait_for(&run, &turn))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(parked.status, Status::Waiting(_)), "{parked:?}");
    runtime
        .respond(
            &run,
            Some(&turn),
            vec![Answer {
                text: "yes".into(),
                approved: None,
            }],
        )
        .await
        .unwrap();
    let done = tokio::time::timeout(PATIENCE, runtime.wait_for(&run, &turn))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.response.as_deref(), Some("deployed"));
    // Shutting down sends what is queued, metrics included.
    tokio::time::timeout(PATIENCE, telemetry.shutdown(Duration::from_secs(10)))
        .await
        .expect("telemetry stops within its deadline");
    let mut spans: Vec<Span> = Vec::new();
    let mut logs = Vec::new();
    let mut metrics = Vec::new();
    let mut service = None;
    while let Ok((path, body)) = received.try_recv() {
        match path.as_str() {
            "/v1/traces" => {
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                for resource in request.resource_spans {
                    service = resource
                        .resource
                        .as_ref()
                        .and_then(|r| text(&r.attributes, "service.name").map(str::to_owned));
                    for scope in resource.scope_spans {
                        spans.extend(scope.spans);
                    }
                }
            }
            "/v1/logs" => {
                let request = ExportLogsServiceRequest::decode(body).unwrap();
                for resource in request.resource_logs {
                    for scope in resource.scope_logs {
                        logs.extend(scope.log_records);
                    }
                }
            }
            "/v1/metrics" => {
                let request = ExportMetricsServiceRequest::decode(body).unwrap();
                for resource in request.resource_metrics {
                    for scope in resource.scope_metrics {
                        metrics.extend(scope.metrics.into_iter().map(|m| m.name));
                    }
                }
            }
            other => panic!("an OTLP path: {other}"),
        }
    }
    assert_eq!(service.as_deref(), Some("spool"));
    // One trace: the run's, as its JSON-RPC events name it.
    let trace = spool_edge::records::trace_id(&run);
    assert!(spans.iter().all(|s| hex(&s.trace_id) == trace));
    let by_name: HashMap<&str, Vec<&Span>> = spans.iter().fold(HashMap::new(), |mut map, span| {
        map.entry(span.name.as_str()).or_default().push(span);
        map
    });
    let root = by_name["invoke_agent reviewer"][0];
    assert!(root.parent_span_id.is_empty(), "the turn is the root");
    assert_eq!(
        text(&root.attributes, "gen_ai.operation.name"),
        Some("invoke_agent")
    );
    assert_eq!(
        text(&root.attributes, "gen_ai.conversation.id"),
        Some(run.as_str())
    );
    let chats = &by_name["chat scripted"];
    assert_eq!(chats.len(), 3, "three model calls");
    for chat in chats {
        assert_eq!(
            chat.parent_span_id, root.span_id,
            "a model call is the turn's child"
        );
        assert_eq!(
            text(&chat.attributes, "gen_ai.provider.name"),
            Some("spool")
        );
        assert_eq!(
            text(&chat.attributes, "gen_ai.request.model"),
            Some("scripted")
        );
        assert!(chat.end_time_unix_nano >= chat.start_time_unix_nano);
    }
    let inputs: Vec<i64> = chats
        .iter()
        .filter_map(|c| int(&c.attributes, "gen_ai.usage.input_tokens"))
        .collect();
    assert_eq!(
        {
            let mut sorted = inputs;
            sorted.sort_unstable();
            sorted
        },
        vec![10, 20, 30]
    );
    let add = by_name["execute_tool add"][0];
    assert_eq!(add.parent_span_id, root.span_id);
    assert_eq!(text(&add.attributes, "gen_ai.tool.call.id"), Some("c1"));
    assert_eq!(
        text(&add.attributes, "gen_ai.operation.name"),
        Some("execute_tool")
    );
    assert_eq!(
        text(&add.attributes, "gen_ai.tool.call.arguments"),
        None,
        "no content unless capture_content"
    );
    assert_eq!(
        hex(&add.span_id),
        spool_edge::records::span_id(&run, "tool:c1")
    );
    let asked = by_name["execute_tool ask_human"][0];
    assert_eq!(text(&asked.attributes, "gen_ai.tool.call.id"), Some("q1"));
    assert_eq!(asked.parent_span_id, root.span_id);
    // A question's wait is part of the tool call that asked it: the call's
    // span lasts until the answer.
    let question = by_name["suspended question"][0];
    assert_eq!(question.parent_span_id, asked.span_id);
    assert!(asked.end_time_unix_nano >= question.end_time_unix_nano);
    assert_eq!(
        text(&asked.attributes, "spool.tool.outcome"),
        Some("answered")
    );
    // The LogRecords are the JSON-RPC events: the run's trace, and a tool
    // call's records on the tool call's span.
    assert!(!logs.is_empty());
    assert!(logs.iter().all(|l| hex(&l.trace_id) == trace));
    let kinds: Vec<&str> = logs
        .iter()
        .filter_map(|l| text(&l.attributes, "spool.kind"))
        .collect();
    for kind in ["run:start", "task:start", "task:complete", "run:end"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    assert!(
        logs.iter().any(|l| l.span_id == add.span_id
            && text(&l.attributes, "spool.kind") == Some("task:complete")),
        "the add call's completion is logged on its span"
    );
    for name in [
        "spool.runs.started",
        "spool.turns",
        "gen_ai.client.operation.duration",
        "gen_ai.client.token.usage",
        "spool.journal.append.duration",
    ] {
        assert!(metrics.iter().any(|m| m == name), "{name} in {metrics:?}");
    }
}
