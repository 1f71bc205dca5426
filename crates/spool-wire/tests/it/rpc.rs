//! JSON-RPC 2.0: the specification's decoding rules, the codes, framing,
//! WireEvent validation and the legacy adapter.

use serde_json::{Value, json};
use spool_wire::rpc::{
    self, Envelope, ErrorObject, Frame, Id, Response, Severity, SseFrame, VersionDocument,
    WireEvent, codes,
};

fn error_code(result: Result<Frame, Response>) -> i64 {
    result.unwrap_err().error_object().unwrap().code
}

#[test]
fn each_error_code_has_its_number() {
    assert_eq!(codes::PARSE_ERROR, -32700);
    assert_eq!(codes::INVALID_REQUEST, -32600);
    assert_eq!(codes::METHOD_NOT_FOUND, -32601);
    assert_eq!(codes::INVALID_PARAMS, -32602);
    assert_eq!(codes::INTERNAL_ERROR, -32603);
    assert_eq!(codes::USER_ERROR, -32000);
    assert_eq!(codes::UNKNOWN_HASH, -32001);
    assert_eq!(codes::RUN_NOT_FOUND, -32002);
    assert_eq!(codes::UNAUTHORIZED, -32003);
    assert_eq!(codes::RATE_LIMITED, -32004);
    assert_eq!(codes::message(-32601), Some("Method not found"));
    for code in [
        codes::USER_ERROR,
        codes::UNKNOWN_HASH,
        codes::RUN_NOT_FOUND,
        codes::UNAUTHORIZED,
        codes::RATE_LIMITED,
    ] {
        assert!(
            codes::is_server_error(code),
            "{code} is in the implementation-defined range"
        );
    }
    assert!(!codes::is_server_error(codes::INTERNAL_ERROR));
}

#[test]
fn channel_names_protocol_version_and_methods_carry_spools_name() {
    assert_eq!(
        rpc::CHANNELS,
        ["spool:events", "spool:state", "spool:rpc", "spool:submit"]
    );
    assert_eq!(rpc::WIRE_PROTOCOL_VERSION, "1.0");
    assert_eq!(rpc::METHOD_EVENTS_APPEND, "events.append");
    assert_eq!(rpc::METHOD_SUBMIT_RUN, "submit.run");
    let doc = VersionDocument::new("0.1.0", vec!["getRunState".into()]);
    assert_eq!(
        serde_json::to_value(&doc).unwrap(),
        json!({"protocol": "1.0", "spool": "0.1.0", "channels": rpc::CHANNELS, "rpc": ["getRunState"]})
    );
}

#[test]
fn text_that_is_not_json_is_a_parse_error_with_a_null_id() {
    let response =
        rpc::decode(r#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#).unwrap_err();
    assert_eq!(response.id, Id::Null);
    assert_eq!(response.error_object().unwrap().code, codes::PARSE_ERROR);
    assert_eq!(response.error_object().unwrap().message, "Parse error");
}

#[test]
fn json_that_is_not_a_request_object_is_invalid_request() {
    for text in [
        r#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#,
        r#"{"jsonrpc": "1.0", "method": "x"}"#,
        r#"{"method": "x"}"#,
        r#"{"jsonrpc": "2.0", "method": "x", "params": "bar"}"#,
        r#"{"jsonrpc": "2.0", "method": "x", "id": {"a": 1}}"#,
        r#"{"jsonrpc": "2.0", "id": 1}"#,
        r#"{"jsonrpc": "2.0", "id": 1, "result": 1, "error": {"code": 1, "message": "m"}}"#,
        r#"{"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": "m"}}"#,
        r#"{"jsonrpc": "2.0", "method": "x", "result": 1}"#,
        "1",
        "\"text\"",
    ] {
        assert_eq!(
            error_code(rpc::decode(text)),
            codes::INVALID_REQUEST,
            "{text}"
        );
    }
}

#[test]
fn an_invalid_request_with_a_readable_id_is_answered_with_that_id() {
    let response =
        rpc::decode(r#"{"jsonrpc": "2.0", "id": 7, "method": "x", "params": 3}"#).unwrap_err();
    assert_eq!(response.id, Id::from(7));
}

#[test]
fn an_empty_batch_is_one_invalid_request() {
    let response = rpc::decode("[]").unwrap_err();
    assert_eq!(
        response.error_object().unwrap().code,
        codes::INVALID_REQUEST
    );
    assert_eq!(response.id, Id::Null);
}

#[test]
fn a_batch_decodes_entry_by_entry_and_invalid_entries_become_their_error_responses() {
    let Frame::Batch(entries) = rpc::decode(r#"[1, {"jsonrpc":"2.0","method":"notify"}, {"jsonrpc":"2.0","id":"a","method":"m","params":[1]}]"#).unwrap() else {
        panic!("a batch")
    };
    assert_eq!(entries.len(), 3);
    assert_eq!(
        entries[0]
            .as_ref()
            .unwrap_err()
            .error_object()
            .unwrap()
            .code,
        codes::INVALID_REQUEST
    );
    assert!(matches!(entries[1], Ok(Envelope::Notification(_))));
    assert!(matches!(&entries[2], Ok(Envelope::Request(r)) if r.id == Id::from("a")));
}

#[test]
fn a_batch_reply_leaves_out_notifications_and_is_nothing_when_all_were_notifications() {
    let answer = Response::result(Id::from(1), json!(19));
    assert_eq!(
        rpc::batch_reply([None, Some(answer.clone()), None]),
        Some(vec![answer])
    );
    assert_eq!(rpc::batch_reply([None, None]), None);
}

#[test]
fn ids_may_be_numbers_strings_or_null_and_are_echoed_exactly() {
    for (text, id) in [
        (r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#, Id::from(1)),
        (
            r#"{"jsonrpc":"2.0","id":"abc","method":"m"}"#,
            Id::from("abc"),
        ),
        (r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#, Id::Null),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#,
            Id::Number(serde_json::Number::from_f64(1.5).unwrap()),
        ),
    ] {
        let Frame::Single(Envelope::Request(request)) = rpc::decode(text).unwrap() else {
            panic!("{text}")
        };
        assert_eq!(request.id, id);
        assert_eq!(rpc::encode_ws(&Envelope::Request(request)), text);
    }
}

#[test]
fn a_message_without_an_id_is_a_notification() {
    let frame = rpc::decode(r#"{"jsonrpc":"2.0","method":"events.append","params":{}}"#).unwrap();
    assert!(matches!(frame, Frame::Single(Envelope::Notification(_))));
}

#[test]
fn responses_decode_with_a_result_or_an_error_and_error_data_is_optional() {
    let Frame::Single(Envelope::Response(ok)) =
        rpc::decode(r#"{"jsonrpc":"2.0","id":1,"result":null}"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(ok, Response::result(Id::from(1), Value::Null));
    let text = r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32002,"message":"Run not found","data":{"runId":"r1"}}}"#;
    let Frame::Single(envelope) = rpc::decode(text).unwrap() else {
        panic!()
    };
    assert_eq!(rpc::encode_ws(&envelope), text);
}

#[test]
fn builders_leave_out_params_and_data_when_absent() {
    assert_eq!(
        rpc::encode_ws(&Envelope::notification("state.patch", None)),
        r#"{"jsonrpc":"2.0","method":"state.patch"}"#
    );
    let error = Response::error(
        Id::from(1),
        ErrorObject {
            code: -32601,
            message: "Method not found".into(),
            data: None,
        },
    );
    assert_eq!(
        serde_json::to_string(&error).unwrap(),
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#
    );
}

#[test]
fn the_three_framings_are_byte_exact() {
    let envelope = Envelope::notification("events.append", Some(json!({"a": 1})));
    let json = r#"{"jsonrpc":"2.0","method":"events.append","params":{"a":1}}"#;
    assert_eq!(rpc::encode_ws(&envelope), json);
    assert_eq!(rpc::encode_ndjson(&envelope), format!("{json}\n"));
    assert_eq!(
        rpc::encode_sse(&envelope, None),
        format!("data: {json}\n\n")
    );
    assert_eq!(
        rpc::encode_sse(&envelope, Some(42)),
        format!("id: 42\ndata: {json}\n\n")
    );
}

#[test]
fn an_sse_frame_reads_back_to_the_same_envelope() {
    let envelope = Envelope::request(5, "submit.run", Some(json!({"text": "line one\nline two"})));
    let frame = SseFrame::parse(&rpc::encode_sse(&envelope, Some(9)));
    assert_eq!(frame.id.as_deref(), Some("9"));
    assert_eq!(rpc::decode(&frame.data).unwrap(), Frame::Single(envelope));
    let multi = SseFrame::parse(": comment\nevent: x\ndata: a\ndata: b\n\n");
    assert_eq!(multi.data, "a\nb");
    assert_eq!(multi.event.as_deref(), Some("x"));
}

#[test]
fn a_wire_event_needs_a_decimal_string_time_and_a_severity_from_1_to_24() {
    let base = json!({"timeUnixNano": "1", "severityNumber": 9, "body": "b", "attributes": {}, "traceId": "t", "spool.kind": "run:start"});
    assert!(WireEvent::from_value(base.clone()).is_ok());
    let broken = [
        ("timeUnixNano", json!(1)),
        ("timeUnixNano", json!("-1")),
        ("timeUnixNano", json!("1e9")),
        ("timeUnixNano", json!("")),
        ("timeUnixNano", json!("99999999999999999999999")),
        ("severityNumber", json!(0)),
        ("severityNumber", json!(25)),
        ("severityNumber", json!(-3)),
        ("attributes", json!([])),
        ("traceId", json!(null)),
        ("spool.kind", json!(7)),
    ];
    for (field, value) in broken {
        let mut event = base.clone();
        event[field] = value.clone();
        let error = WireEvent::from_value(event).unwrap_err();
        assert_eq!(error.code, codes::INVALID_PARAMS, "{field} = {value}");
    }
    for field in [
        "body",
        "attributes",
        "traceId",
        "spool.kind",
        "timeUnixNano",
        "severityNumber",
    ] {
        let mut event = base.clone();
        event.as_object_mut().unwrap().remove(field);
        assert!(WireEvent::from_value(event).is_err(), "{field} is required");
    }
}

#[test]
fn severity_labels_follow_the_otel_ranges() {
    assert_eq!(Severity::INFO.number(), 9);
    assert_eq!(Severity::ERROR.number(), 17);
    assert_eq!(Severity::new(12).unwrap().label(), "info");
    assert_eq!(Severity::new(13).unwrap().label(), "warn");
    assert_eq!(Severity::new(24).unwrap().label(), "fatal");
    assert_eq!(Severity::new(0), None);
    assert_eq!(Severity::new(25), None);
}

#[test]
fn a_wire_event_rides_in_an_events_append_notification() {
    let event = WireEvent::new("run:end", "run-1", 5, "done")
        .with_severity(Severity::ERROR)
        .with_span("turn-2");
    let Envelope::Notification(notification) = event.to_notification() else {
        panic!()
    };
    assert_eq!(notification.method, "events.append");
    let params = notification.params.unwrap();
    assert_eq!(params["severityText"], json!("error"));
    assert_eq!(params["spanId"], json!("turn-2"));
    assert_eq!(WireEvent::from_value(params).unwrap(), event);
}

#[test]
fn a_legacy_run_message_maps_to_submit_run_and_back() {
    let frame = rpc::decode_client(r#"{"t":"run","tasks":["build"],"concurrency":2}"#).unwrap();
    let Frame::Single(envelope) = frame else {
        panic!()
    };
    assert_eq!(
        envelope.to_value(),
        json!({"jsonrpc": "2.0", "id": rpc::LEGACY_REQUEST_ID, "method": "submit.run", "params": {"tasks": ["build"], "concurrency": 2}})
    );
    assert_eq!(
        rpc::envelope_to_legacy(&envelope),
        Some(json!({"t": "run", "tasks": ["build"], "concurrency": 2}))
    );
}

#[test]
fn the_client_decoder_reads_envelopes_too_and_refuses_unknown_legacy_types() {
    assert!(matches!(
        rpc::decode_client(r#"{"jsonrpc":"2.0","id":3,"method":"submit.run","params":{}}"#),
        Ok(Frame::Single(Envelope::Request(_)))
    ));
    assert_eq!(
        error_code(rpc::decode_client(r#"{"t":"dance"}"#)),
        codes::INVALID_REQUEST
    );
    assert_eq!(
        rpc::envelope_to_legacy(&Envelope::request(1, "state.snapshot", None)),
        None
    );
}
