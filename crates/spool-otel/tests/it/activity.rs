//! One scripted run read by every surface: the HTTP stream's lines, the
//! JSON-RPC events, the Pod events and history, the conversation view and
//! the OpenTelemetry spans each report the same tool results and turn ends
//! in the same order (tools, a failure, a question, an approval, a sleep,
//! an operator's resolution and abandonment, a malformed record, a cancel).

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode};
use prost::Message;
use serde_json::{Value, json};
use spool_journal::event::{
    Answer, CancelRequested, Effect, ModelCallCompleted, ModelCallRequested, Resumed, RunCreated,
    SleepCompleted, SleepStarted, Suspended, ToolCallAbandoned, ToolCallCompleted,
    ToolCallRequested, ToolCallResolved, TurnCancelled, TurnCompleted, TurnFailed, TurnStarted,
};
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Envelope, Event, RunId, Seq, TurnId};
use spool_otel::Agent;
use spool_runtime::engine::Delta;
use spool_runtime::hub::{LiveDelta, StreamItem};
use spool_runtime::view::Document;
use spool_wire::http::StreamEventType;
use spool_wire::pod::{Event as Pod, HistoryItem, TurnResult};
use spool_wire::run::{FailureCode, SuspendKind, TurnPolicy};

use crate::{PATIENCE, receiver, telemetry_to, text};

fn turn(id: &str) -> TurnId {
    TurnId::new(id).unwrap()
}

fn started(id: &str) -> Event {
    Event::TurnStarted(TurnStarted {
        turn_id: turn(id),
        input: format!("input of {id}"),
        context: Vec::new(),
        policy: TurnPolicy::Queue,
        from_queue: None,
        operation_id: None,
    })
}

fn call(id: &str, tool: &str) -> Event {
    Event::ToolCallRequested(ToolCallRequested {
        call_id: id.into(),
        tool: tool.into(),
        input: json!({"x": 1}),
        effect: Effect::Write,
        idempotency_key: None,
    })
}

fn completed(id: &str, output: Value) -> Event {
    Event::ToolCallCompleted(ToolCallCompleted {
        call_id: id.into(),
        output: Arc::new(output),
    })
}

fn suspended(turn_id: &str, call: &str, kind: SuspendKind) -> Event {
    Event::Suspended(Suspended {
        turn_id: turn(turn_id),
        kind,
        prompt: "may I?".into(),
        call_id: Some(call.into()),
        input_schema: None,
        options: None,
    })
}

fn resumed(turn_id: &str, text: &str, approved: Option<bool>) -> Event {
    Event::Resumed(Resumed {
        turn_id: turn(turn_id),
        answers: vec![Answer {
            text: text.into(),
            approved,
        }],
    })
}

/// The run: three turns. The first completes after a tool's output, a
/// failure, a question, an approval and a sleep; the second fails after an
/// operator's resolution and abandonment and a malformed record; the third
/// is cancelled with a tool call running and a question parked.
fn script() -> Vec<Event> {
    let wake_at = time::OffsetDateTime::UNIX_EPOCH + time::Duration::hours(1);
    vec![
        Event::RunCreated(RunCreated::default()),
        started("t1"),
        Event::InputSteered(spool_journal::event::InputSteered {
            turn_id: turn("t1"),
            input: "and be quick".into(),
        }),
        Event::ModelCallRequested(ModelCallRequested {
            request_hash: "sha256:aa".into(),
            new_messages: Vec::new(),
        }),
        Event::ModelCallCompleted(ModelCallCompleted {
            message: Arc::new(json!({"text": "let me look", "tool_calls": []})),
            usage: None,
            finish_reason: None,
        }),
        call("c1", "lookup"),
        completed("c1", json!("found it")),
        call("c2", "flaky"),
        completed(
            "c2",
            json!({"__spool_error": {"is_error": true, "kind": "handler", "message": "it broke", "attempts": 1}}),
        ),
        call("q1", "ask_human"),
        completed(
            "q1",
            json!({"__spool_suspend": {"reason": "which?", "input_schema": {}}}),
        ),
        suspended("t1", "q1", SuspendKind::Question),
        resumed("t1", "the blue one", None),
        call("a1", "request_approval"),
        completed(
            "a1",
            json!({"__spool_suspend": {"reason": "deploy?", "input_schema": {}}}),
        ),
        suspended("t1", "a1", SuspendKind::Approval),
        resumed("t1", "not today", Some(false)),
        call("s1", "sleep"),
        completed(
            "s1",
            json!({"__spool_sleep": {"wake_at": "1970-01-01T01:00:00Z"}}),
        ),
        Event::SleepStarted(SleepStarted {
            call_id: "s1".into(),
            wake_at,
        }),
        Event::SleepCompleted(SleepCompleted {
            call_id: "s1".into(),
            woken_at: None,
        }),
        Event::TurnCompleted(TurnCompleted {
            turn_id: turn("t1"),
            response: Some("done".into()),
            usage: None,
        }),
        started("t2"),
        call("r1", "deploy"),
        Event::ToolCallResolved(ToolCallResolved {
            call_id: "r1".into(),
            output: Arc::new(json!("deployed by hand")),
            operator: Some("ops".into()),
        }),
        call("x1", "migrate"),
        Event::ToolCallAbandoned(ToolCallAbandoned {
            call_id: "x1".into(),
            reason: None,
            operator: Some("ops".into()),
        }),
        call("m1", "legacy"),
        completed("m1", json!({"__spool_suspend": "not a suspension"})),
        Event::TurnFailed(TurnFailed {
            turn_id: turn("t2"),
            code: FailureCode::Internal,
            message: "the journal cannot be replayed".into(),
        }),
        started("t3"),
        call("w1", "write_file"),
        call("q2", "ask_human"),
        completed(
            "q2",
            json!({"__spool_suspend": {"reason": "sure?", "input_schema": {}}}),
        ),
        suspended("t3", "q2", SuspendKind::Question),
        Event::CancelRequested(CancelRequested {
            turn_id: Some(turn("t3")),
        }),
        Event::TurnCancelled(TurnCancelled {
            turn_id: turn("t3"),
        }),
    ]
}

/// What every surface says, in order: a tool call's result (`ok` or
/// `error`) and a turn's end.
fn expected() -> Vec<String> {
    [
        "result c1 ok",
        "result c2 error",
        "result q1 ok",
        "result a1 ok",
        "result s1 ok",
        "end t1 completed",
        "result r1 ok",
        "result x1 error",
        "result m1 error",
        "end t2 failed",
        "result w1 error",
        "result q2 error",
        "end t3 cancelled",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The calls whose turn ended before their result.
const INTERRUPTED: [&str; 2] = ["w1", "q2"];

fn result(call: &str, error: bool) -> String {
    format!("result {call} {}", if error { "error" } else { "ok" })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_surface_reports_the_same_tool_results_and_turn_ends_in_the_same_order() {
    let (endpoint, mut received) = receiver().await;
    let telemetry = telemetry_to(endpoint, Agent::from_engine(None, "echo"));
    let journal = telemetry.observe(Arc::new(MemoryJournal::new()));
    let run = RunId::new("run_activity").unwrap();
    let mut log: Vec<Envelope> = Vec::new();
    for (seq, event) in script().into_iter().enumerate() {
        log.extend(
            journal
                .append(&run, Seq(seq as u64), vec![event])
                .await
                .unwrap(),
        );
    }
    // A live delta of the first model call, between its request and its
    // answer.
    let delta = LiveDelta {
        turn: turn("t1"),
        after: Seq(4),
        n: 1,
        delta: Delta::Text("let me".into()),
    };
    let event = |envelope: &Envelope| StreamItem::Event(Arc::new(envelope.clone()));
    let items: Vec<StreamItem> = log[..4]
        .iter()
        .map(event)
        .chain([StreamItem::Delta(delta)])
        .chain(log[4..].iter().map(event))
        .collect();

    // The HTTP stream. A line says what its event says: an answer is the
    // `run_resume` of the call its `run_suspend` named, a sleep's end the
    // `run_state` after its `sleeping` one; it does not list the calls a
    // turn's end interrupts.
    let mut http = Vec::new();
    let mut http_text = String::new();
    let mut last = None;
    let mut asked: Option<String> = None;
    let mut sleeping: Option<String> = None;
    for item in &items {
        for line in spool_http::stream_lines(&run, &mut last, item) {
            let data = line.data.clone().unwrap_or_default();
            match line.kind {
                StreamEventType::TextDelta => http_text.push_str(line.text.as_deref().unwrap()),
                StreamEventType::ToolResult => http.push(result(
                    data["call_id"].as_str().unwrap(),
                    data.get("error").is_some() || data.get("abandoned").is_some(),
                )),
                StreamEventType::RunSuspend => {
                    asked = data["call_id"].as_str().map(str::to_owned);
                }
                StreamEventType::RunResume => {
                    http.push(result(
                        &asked.take().expect("a question named its call"),
                        false,
                    ));
                }
                StreamEventType::RunState => {
                    if let Some(call) = data["call_id"].as_str() {
                        sleeping = Some(call.to_owned());
                    } else if let Some(call) = sleeping.take() {
                        http.push(result(&call, false));
                    }
                    let state = serde_json::to_value(&line.state).unwrap();
                    let state = state.as_str().unwrap();
                    if ["completed", "failed", "cancelled"].contains(&state) {
                        http.push(format!("end {} {state}", line.turn_id.unwrap()));
                    }
                }
                _ => {}
            }
        }
    }
    let not_interrupted: Vec<String> = expected()
        .into_iter()
        .filter(|fact| !INTERRUPTED.iter().any(|call| *fact == result(call, true)))
        .collect();
    assert_eq!(http, not_interrupted, "the HTTP stream");
    assert_eq!(http_text, "let me");

    // The JSON-RPC events (and the OTLP log records, which are they).
    let mut mapper = spool_edge::records::Mapper::new(&run);
    let mut rpc = Vec::new();
    let mut rpc_text = String::new();
    for item in &items {
        let events = match item {
            StreamItem::Event(envelope) => mapper.envelope(envelope),
            StreamItem::Delta(delta) => mapper.delta(delta, 0).into_iter().collect(),
            StreamItem::Lagged { .. } => unreachable!("no lag here"),
        };
        for event in events {
            // Every kind is in the seed's closed `RunEventKind` set.
            assert!(
                [
                    "run:start",
                    "task:start",
                    "task:stdout",
                    "task:stderr",
                    "task:complete",
                    "run:status",
                    "run:end"
                ]
                .contains(&event.kind.as_str()),
                "{event:?}"
            );
            let attribute = |key: &str| event.attributes.get(key).and_then(Value::as_str);
            match event.kind.as_str() {
                "task:stdout" if attribute("spool.stream") == Some("text") => {
                    rpc_text.push_str(&event.body);
                }
                "task:complete" => {
                    let task = attribute("spool.task.id").expect("a task names itself");
                    if let Some(call) = task.strip_prefix("tool:") {
                        assert_ne!(
                            attribute("cicd.pipeline.task.name"),
                            Some("tool"),
                            "{event:?}"
                        );
                        let result_key = attribute("cicd.pipeline.task.run.result");
                        rpc.push(result(call, result_key != Some("success")));
                    }
                }
                "run:end" => {
                    let state = match attribute("cicd.pipeline.result") {
                        Some("success") => "completed",
                        Some("failure") => "failed",
                        Some("cancellation") => "cancelled",
                        other => panic!("a turn's result: {other:?}"),
                    };
                    rpc.push(format!(
                        "end {} {state}",
                        attribute("spool.turn_id").unwrap()
                    ));
                }
                _ => {}
            }
        }
    }
    assert_eq!(rpc, expected(), "the JSON-RPC events");
    assert_eq!(rpc_text, "let me");

    // The Pod events: a turn ends `finished` whether it completed or was
    // cancelled, after an `error` when it failed.
    let pod_expected: Vec<String> = expected()
        .into_iter()
        .map(|fact| {
            fact.replace(" completed", " finished")
                .replace(" cancelled", " finished")
        })
        .collect();
    let mut translator = spool_pod::events::Translator::new("pod", "session");
    let mut pod = Vec::new();
    let mut pod_text = String::new();
    let mut failed = false;
    for item in &items {
        let events = match item {
            StreamItem::Event(envelope) => translator.journal(envelope),
            StreamItem::Delta(delta) => translator.delta(&delta.delta).into_iter().collect(),
            StreamItem::Lagged { .. } => unreachable!("no lag here"),
        };
        for event in events {
            match event {
                Pod::TextDelta(data) => pod_text.push_str(&data.text),
                Pod::ToolResult(tool) => pod.push(result(&tool.id, tool.is_error)),
                Pod::Error(_) => failed = true,
                Pod::TurnEnd(end) if end.result == TurnResult::Finished => {
                    let outcome = if std::mem::take(&mut failed) {
                        "failed"
                    } else {
                        "finished"
                    };
                    pod.push(format!("end t{} {outcome}", end.turn));
                }
                _ => {}
            }
        }
    }
    assert_eq!(pod, pod_expected, "the Pod events");
    assert_eq!(pod_text, "let me");

    // The conversation view, and Pod's history made from it: each result
    // as a tool result (an answer as the person's message on the call it
    // answered), a turn's end as the run's state.
    let mut document = Document::new(&run);
    let mut view = Vec::new();
    let mut shown = 0;
    for envelope in &log {
        document.apply(envelope);
        let messages = document.conversation().messages();
        for message in &messages[shown..] {
            if let Some(call) = message["tool_call_id"].as_str() {
                view.push(result(call, false));
            }
            for part in message["content"].as_array().unwrap() {
                if part["type"] == "tool_result" {
                    view.push(result(
                        part["tool_call_id"].as_str().unwrap(),
                        part["is_error"] == true,
                    ));
                }
            }
        }
        shown = messages.len();
        let state = document.view().status.state();
        if matches!(
            envelope.event,
            Event::TurnCompleted(_) | Event::TurnFailed(_) | Event::TurnCancelled(_)
        ) {
            let turn = document.view().turn_id.unwrap();
            view.push(format!("end {turn} {}", state.as_str()));
        }
    }
    assert_eq!(view, expected(), "the conversation view");
    let history: Vec<String> = spool_pod::history::items(&document.conversation().messages())
        .into_iter()
        .filter_map(|item| match item {
            HistoryItem::ToolResult { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    let results: Vec<String> = expected()
        .iter()
        .filter_map(|fact| {
            fact.strip_prefix("result ")?
                .split(' ')
                .next()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(history, results, "Pod's history");

    // The OpenTelemetry spans, in the order they ended.
    tokio::time::timeout(PATIENCE, telemetry.shutdown(Duration::from_secs(10)))
        .await
        .expect("telemetry stops within its deadline");
    let mut spans: Vec<Span> = Vec::new();
    while let Ok((path, body)) = received.try_recv() {
        if path == "/v1/traces" {
            let request = ExportTraceServiceRequest::decode(body).unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
        }
    }
    let mut otel = Vec::new();
    for span in &spans {
        let error = span.status.as_ref().map(|s| s.code) == Some(StatusCode::Error as i32);
        match text(&span.attributes, "gen_ai.operation.name") {
            Some("execute_tool") => otel.push(result(
                text(&span.attributes, "gen_ai.tool.call.id").unwrap(),
                error,
            )),
            Some("invoke_agent") => otel.push(format!(
                "end {} {}",
                text(&span.attributes, "spool.turn.id").unwrap(),
                text(&span.attributes, "spool.turn.outcome").unwrap(),
            )),
            _ => {}
        }
    }
    assert_eq!(otel, expected(), "the OpenTelemetry spans");
}
