//! The Pod protocol: methods, all fifteen events, history items and codes.

use serde_json::{Value, json};
use spool_wire::pod::{ErrorCode, Event, HistoryItem, Method, PodState, TurnResult};

#[test]
fn unit_methods_may_omit_params_or_send_null_or_an_object() {
    for text in [
        r#"{"method":"cancel"}"#,
        r#"{"method":"cancel","params":null}"#,
        r#"{"method":"cancel","params":{}}"#,
    ] {
        assert_eq!(Method::decode(text).unwrap(), Method::Cancel, "{text}");
    }
    assert_eq!(Method::Cancel.encode_line(), "{\"method\":\"cancel\"}\n");
}

#[test]
fn a_line_that_is_not_a_method_is_invalid_request() {
    for text in [
        "not json",
        "[]",
        r#"{"params":{}}"#,
        r#"{"method":"dance"}"#,
        r#"{"method":"run"}"#,
        r#"{"method":"run","params":{"input":5}}"#,
        r#"{"method":"resume","params":"now"}"#,
    ] {
        assert_eq!(
            Method::decode(text).unwrap_err().code,
            ErrorCode::InvalidRequest,
            "{text}"
        );
    }
}

#[test]
fn each_error_code_has_its_string() {
    let table = [
        ("already_running", ErrorCode::AlreadyRunning),
        ("not_running", ErrorCode::NotRunning),
        ("not_paused", ErrorCode::NotPaused),
        ("provider_error", ErrorCode::ProviderError),
        ("tool_error", ErrorCode::ToolError),
        ("internal", ErrorCode::Internal),
        ("invalid_request", ErrorCode::InvalidRequest),
    ];
    assert_eq!(ErrorCode::KNOWN.len(), table.len());
    for (text, code) in table {
        assert_eq!(code.as_str(), text);
        assert_eq!(ErrorCode::parse(text), code);
    }
    assert_eq!(
        ErrorCode::parse("lagged"),
        ErrorCode::Unknown("lagged".into())
    );
}

#[test]
fn there_are_fifteen_events_and_each_round_trips() {
    let samples = [
        json!({"event": "turn_start", "data": {"turn": 1}}),
        json!({"event": "turn_end", "data": {"turn": 2, "result": "paused"}}),
        json!({"event": "text_delta", "data": {"text": "a"}}),
        json!({"event": "text_done", "data": {"text": "ab"}}),
        json!({"event": "thinking_delta", "data": {"text": "t"}}),
        json!({"event": "thinking_done", "data": {"text": "tt"}}),
        json!({"event": "tool_call_start", "data": {"id": "c", "name": "n"}}),
        json!({"event": "tool_call_args_delta", "data": {"id": "c", "json": "{"}}),
        json!({"event": "tool_call_done", "data": {"id": "c", "name": "n", "arguments": "{}"}}),
        json!({"event": "tool_result", "data": {"id": "c", "output": "o", "is_error": true}}),
        json!({"event": "status", "data": {"state": "running", "session_id": "s", "pod_name": "p"}}),
        json!({"event": "history", "data": {"items": []}}),
        json!({"event": "usage", "data": {"input_tokens": 1, "output_tokens": 2}}),
        json!({"event": "error", "data": {"code": "not_paused", "message": "m"}}),
        json!({"event": "run_end", "data": {"result": "limit_reached"}}),
    ];
    assert_eq!(Event::NAMES.len(), 15);
    for (sample, name) in samples.iter().zip(Event::NAMES) {
        let event = Event::from_value(sample.clone()).unwrap();
        assert_eq!(event.name(), *name);
        assert!(!matches!(event, Event::Unknown { .. }), "{name} is known");
        let line = event.encode_line();
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap(), *sample);
    }
}

#[test]
fn an_unknown_event_is_kept_so_a_listener_can_skip_it() {
    let event = Event::decode(r#"{"event":"llm_retry","data":{"failed_attempt":1}}"#).unwrap();
    assert_eq!(
        event,
        Event::Unknown {
            event: "llm_retry".into(),
            data: json!({"failed_attempt": 1})
        }
    );
    assert_eq!(
        event.encode_line(),
        "{\"event\":\"llm_retry\",\"data\":{\"failed_attempt\":1}}\n"
    );
}

#[test]
fn a_known_event_with_the_wrong_data_is_invalid_request_naming_the_event() {
    for text in [
        r#"{"event":"turn_start","data":{"turn":"one"}}"#,
        r#"{"event":"usage"}"#,
        r#"{"event":3}"#,
    ] {
        let error = Event::decode(text).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidRequest, "{text}");
    }
    assert!(
        Event::decode(r#"{"event":"turn_start","data":{}}"#)
            .unwrap_err()
            .message
            .contains("turn_start")
    );
}

#[test]
fn tool_result_is_error_defaults_to_false() {
    let Event::ToolResult(result) =
        Event::decode(r#"{"event":"tool_result","data":{"id":"c","output":"o"}}"#).unwrap()
    else {
        panic!()
    };
    assert!(!result.is_error);
}

#[test]
fn states_and_results_use_the_protocols_strings() {
    assert_eq!(
        PodState::KNOWN
            .iter()
            .map(PodState::as_str)
            .collect::<Vec<_>>(),
        ["idle", "running", "paused"]
    );
    assert_eq!(
        TurnResult::KNOWN
            .iter()
            .map(TurnResult::as_str)
            .collect::<Vec<_>>(),
        ["finished", "paused", "limit_reached"]
    );
}

#[test]
fn history_items_are_tagged_by_type_and_omit_absent_ids() {
    let item: HistoryItem =
        serde_json::from_value(json!({"type": "tool_result", "call_id": "c1", "output": "ok"}))
            .unwrap();
    assert_eq!(
        item,
        HistoryItem::ToolResult {
            id: None,
            call_id: "c1".into(),
            output: "ok".into()
        }
    );
    assert_eq!(
        serde_json::to_value(&item).unwrap(),
        json!({"type": "tool_result", "call_id": "c1", "output": "ok"})
    );
}

#[test]
fn a_history_with_items_and_parts_of_unknown_kinds_decodes_whole_and_keeps_them() {
    let line = r#"{"event":"history","data":{"items":[{"type":"message","role":"user","content":[{"type":"text","text":"look"},{"type":"image","url":"x.png"}]},{"type":"web_search","query":"paris"},{"type":"tool_result","call_id":"c1","output":"ok"}]}}"#;
    let Event::History(history) = Event::decode(line).unwrap() else {
        panic!("a history");
    };
    assert_eq!(history.items.len(), 3);
    let HistoryItem::Message { content, .. } = &history.items[0] else {
        panic!("a message: {:?}", history.items[0]);
    };
    assert_eq!(
        content[1],
        spool_wire::pod::ContentPart::Other(json!({"type": "image", "url": "x.png"}))
    );
    assert_eq!(
        history.items[1],
        HistoryItem::Other(json!({"type": "web_search", "query": "paris"}))
    );
    assert!(matches!(history.items[2], HistoryItem::ToolResult { .. }));
    // Kept as they came: the line encodes back to the same JSON.
    let again: serde_json::Value =
        serde_json::from_str(Event::History(history).encode_line().trim()).unwrap();
    let original: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(again, original);
}
