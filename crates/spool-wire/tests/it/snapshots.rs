//! A snapshot of every message type as Spool writes it, so a change to any
//! wire shape shows up in review as a diff.

use insta::assert_json_snapshot;
use serde_json::json;
use spool_wire::{bus, http, pod, rpc, sentinel};
use time::macros::datetime;

#[test]
fn bus_messages() {
    assert_json_snapshot!(
        "bus_request",
        bus::BusRequest::new("reviewer", "Please verify this answer", 1)
    );
    assert_json_snapshot!(
        "bus_success",
        bus::BusResponse::success("worker", "Looks correct overall.", 241)
    );
    assert_json_snapshot!(
        "bus_failure",
        bus::BusResponse::failure(
            "worker",
            bus::ErrorCode::BudgetExhausted,
            "Budget exhausted.",
            12
        )
    );
}

#[test]
fn rpc_messages() {
    assert_json_snapshot!(
        "rpc_request",
        rpc::Envelope::request(1, "state.snapshot", None)
    );
    assert_json_snapshot!(
        "rpc_notification",
        rpc::Envelope::notification(
            "state.patch",
            Some(json!([{"op": "replace", "path": "/state", "value": "waiting"}]))
        )
    );
    assert_json_snapshot!(
        "rpc_result",
        rpc::Response::result(rpc::Id::from("a"), json!({"state": "running"}))
    );
    assert_json_snapshot!(
        "rpc_error",
        rpc::Response::error(
            rpc::Id::Null,
            rpc::ErrorObject::with_reason(rpc::codes::PARSE_ERROR, "expected value")
        )
    );
    let event = rpc::WireEvent::new(
        "turn:start",
        "run-1",
        1_767_225_600_000_000_000,
        "turn 1 started",
    )
    .with_span("turn-1")
    .with_attribute("spool.turn.id", "turn-1");
    assert_json_snapshot!("rpc_wire_event", event);
    assert_json_snapshot!("rpc_events_append", event.to_notification());
    assert_json_snapshot!(
        "rpc_version",
        rpc::VersionDocument::new("0.1.0", vec!["getRunState".into()])
    );
}

#[test]
fn pod_methods() {
    let methods = [
        pod::Method::Run {
            input: "What is the capital of France?".into(),
        },
        pod::Method::Resume { answer: None },
        pod::Method::Cancel,
        pod::Method::GetStatus,
        pod::Method::GetHistory,
    ];
    assert_json_snapshot!("pod_methods", methods);
}

#[test]
fn pod_events() {
    use pod::*;
    let events = vec![
        Event::TurnStart(TurnStart { turn: 1 }),
        Event::TurnEnd(TurnEnd {
            turn: 1,
            result: TurnResult::Finished,
        }),
        Event::TextDelta(TextData {
            text: "The capital".into(),
        }),
        Event::TextDone(TextData {
            text: "The capital of France is Paris.".into(),
        }),
        Event::ThinkingDelta(TextData {
            text: "Let me consider".into(),
        }),
        Event::ThinkingDone(TextData {
            text: "Paris.".into(),
        }),
        Event::ToolCallStart(ToolCallStart {
            id: "call_123".into(),
            name: "search".into(),
        }),
        Event::ToolCallArgsDelta(ToolCallArgsDelta {
            id: "call_123".into(),
            json: "{\"query\":".into(),
        }),
        Event::ToolCallDone(ToolCallDone {
            id: "call_123".into(),
            name: "search".into(),
            arguments: "{\"query\":\"Paris\"}".into(),
        }),
        Event::ToolResult(ToolResult {
            id: "call_123".into(),
            output: "Paris is the capital".into(),
            is_error: false,
        }),
        Event::Status(Status {
            state: PodState::Idle,
            session_id: "s-1".into(),
            pod_name: "hello-pod".into(),
        }),
        Event::History(History {
            items: vec![
                HistoryItem::Message {
                    id: None,
                    role: Role::User,
                    content: vec![ContentPart::Text { text: "Hi".into() }],
                    status: None,
                },
                HistoryItem::ToolCall {
                    id: None,
                    call_id: "c".into(),
                    name: "n".into(),
                    arguments: "{}".into(),
                    status: Some(ItemStatus::Completed),
                },
                HistoryItem::ToolResult {
                    id: Some("i".into()),
                    call_id: "c".into(),
                    output: "o".into(),
                },
                HistoryItem::Reasoning {
                    id: None,
                    text: "t".into(),
                    status: Some(ItemStatus::InProgress),
                },
            ],
        }),
        Event::Usage(pod::Usage {
            input_tokens: 25,
            output_tokens: 150,
        }),
        Event::error(ErrorCode::AlreadyRunning, "Pod is already executing a turn"),
        Event::RunEnd(RunEnd {
            result: TurnResult::LimitReached,
        }),
    ];
    assert_eq!(events.len(), Event::NAMES.len());
    assert_json_snapshot!("pod_events", events);
}

#[test]
fn sentinels() {
    use sentinel::*;
    assert_json_snapshot!(
        "sentinel_suspend",
        Sentinel::Suspend(Suspension::new("needs approval", json!({"type": "object"}))).encode()
    );
    assert_json_snapshot!(
        "sentinel_signal",
        Sentinel::Suspend(Suspension::new("webhook", json!({})).on_signal()).encode()
    );
    assert_json_snapshot!(
        "sentinel_sleep",
        Sentinel::Sleep(Sleep::until(datetime!(2026-08-14 11:00 +02:00))).encode()
    );
    assert_json_snapshot!(
        "sentinel_error",
        Sentinel::Failure(ToolFailure {
            kind: FailureKind::InvalidInput,
            message: "missing `city`".into(),
            attempts: 1
        })
        .encode()
    );
}

#[test]
fn http_messages() {
    use http::*;
    let principal = Principal {
        authenticator: "token".into(),
        kind: "token".into(),
        id: "ops".into(),
        attributes: Default::default(),
    };
    assert_json_snapshot!(
        "http_start",
        StartRun {
            text: "Summarize the deployment plan.".into(),
            address: Some("browser-42".into()),
            context: Some(vec!["Use staging only.".into()]),
            turn_policy: Some(TurnPolicy::Queue),
            auth: Some(principal.clone()),
            ..StartRun::default()
        }
    );
    assert_json_snapshot!(
        "http_message",
        MessageRun {
            text: "Review the plan.".into(),
            ..MessageRun::default()
        }
    );
    let suspend = Suspend {
        kind: SuspendKind::Question,
        prompt: "Which region?".into(),
        options: Some(vec!["eu-west-1".into(), "us-east-1".into()]),
        tool_call_id: Some("call_1".into()),
        turn_id: Some("turn_1".into()),
    };
    let reply = RunReply {
        run_id: "run_1".into(),
        state: RunState::Waiting,
        turn_id: Some("turn_1".into()),
        cursor: Some(7),
        response: None,
        suspend: Some(suspend),
        usage: Some(Usage {
            input_tokens: 120,
            output_tokens: 14,
        }),
    };
    assert_json_snapshot!("http_reply", reply);
    assert_json_snapshot!(
        "http_snapshot",
        SnapshotReply {
            run: reply,
            messages: vec![
                json!({"role": "user", "content": [{"type": "text", "text": "Deploy"}]})
            ]
        }
    );
    assert_json_snapshot!(
        "http_respond",
        Respond {
            responses: vec![Answer {
                text: "Use staging only.".into(),
                turn_id: Some("turn_1".into()),
                approved: Some(true)
            }]
        }
    );
    assert_json_snapshot!(
        "http_cancel",
        Cancel {
            turn_id: Some("turn_1".into())
        }
    );
    assert_json_snapshot!(
        "http_cancel_reply",
        CancelReply {
            status: CancelStatus::Requested,
            run_id: Some("run_1".into()),
            turn_id: Some("turn_1".into())
        }
    );
    assert_json_snapshot!(
        "http_reset",
        Reset {
            reason: Some("Start a separate task".into())
        }
    );
    assert_json_snapshot!(
        "http_address_reply",
        AddressReply {
            run_id: "run_1".into(),
            cursor: Some(0)
        }
    );
    assert_json_snapshot!(
        "http_event",
        StreamEvent {
            run_id: "run_1".into(),
            seq: 8,
            kind: StreamEventType::RunState,
            time: datetime!(2026-11-29 10:00:00.5 UTC),
            turn_id: Some("turn_1".into()),
            text: None,
            state: Some(RunState::Completed),
            data: None,
        }
    );
    assert_json_snapshot!(
        "http_error",
        ErrorBody::new(
            ErrorCode::RunWaiting,
            "the run is waiting for an answer; use /respond"
        )
    );
    assert_json_snapshot!("http_health", Health::ready());
    assert_json_snapshot!(
        "http_info",
        Info {
            agent: Some("reviewer".into()),
            version: "0.1.0".into(),
            channels: vec!["http".into()]
        }
    );
}
