//! The HTTP channel's bodies: each error code with its status, request
//! checks, the tri-state answer, cancel statuses and principal names.

use serde_json::{Value, json};
use spool_wire::http::{
    self, Answer, CancelStatus, ErrorBody, ErrorCode, MessageRun, Principal, Respond, RunReply,
    RunState, StartRun, StreamEvent, StreamEventType, SuspendKind, TurnPolicy,
};

#[test]
fn each_error_code_has_its_string_and_status() {
    let table = [
        ("bad_request", ErrorCode::BadRequest, 400),
        ("invalid_run_id", ErrorCode::InvalidRunId, 400),
        ("unknown_turn_policy", ErrorCode::UnknownTurnPolicy, 400),
        ("unauthenticated", ErrorCode::Unauthenticated, 401),
        ("run_not_found", ErrorCode::RunNotFound, 404),
        ("schedule_not_found", ErrorCode::ScheduleNotFound, 404),
        ("forbidden", ErrorCode::Forbidden, 403),
        ("method_not_allowed", ErrorCode::MethodNotAllowed, 405),
        ("run_waiting", ErrorCode::RunWaiting, 409),
        ("run_not_waiting", ErrorCode::RunNotWaiting, 409),
        ("run_active", ErrorCode::RunActive, 409),
        ("run_not_active", ErrorCode::RunNotActive, 409),
        ("run_retired", ErrorCode::RunRetired, 409),
        ("run_deleted", ErrorCode::RunDeleted, 410),
        ("run_too_large", ErrorCode::RunTooLarge, 409),
        ("agent_invalid", ErrorCode::AgentInvalid, 422),
        ("run_owned_elsewhere", ErrorCode::RunOwnedElsewhere, 409),
        ("conversation_corrupt", ErrorCode::ConversationCorrupt, 409),
        ("request_timeout", ErrorCode::RequestTimeout, 408),
        ("too_large", ErrorCode::TooLarge, 413),
        ("uri_too_long", ErrorCode::UriTooLong, 414),
        ("headers_too_large", ErrorCode::HeadersTooLarge, 431),
        ("client_closed", ErrorCode::ClientClosed, 499),
        ("files_unsupported", ErrorCode::FilesUnsupported, 501),
        (
            "compaction_unsupported",
            ErrorCode::CompactionUnsupported,
            501,
        ),
        ("engine_failed", ErrorCode::EngineFailed, 502),
        ("internal", ErrorCode::Internal, 500),
        ("node_unavailable", ErrorCode::NodeUnavailable, 503),
        ("journal_unavailable", ErrorCode::JournalUnavailable, 503),
        ("origin_not_allowed", ErrorCode::OriginNotAllowed, 403),
        ("host_not_allowed", ErrorCode::HostNotAllowed, 403),
        (
            "unsupported_media_type",
            ErrorCode::UnsupportedMediaType,
            415,
        ),
        ("address_too_long", ErrorCode::AddressTooLong, 400),
        ("title_too_long", ErrorCode::TitleTooLong, 400),
        ("operation_id_too_long", ErrorCode::OperationIdTooLong, 400),
        ("turn_not_found", ErrorCode::TurnNotFound, 409),
    ];
    assert_eq!(ErrorCode::KNOWN.len(), table.len());
    for (text, code, status) in table {
        assert_eq!(code.as_str(), text);
        assert_eq!(ErrorCode::parse(text), code);
        assert_eq!(code.status(), Some(status), "{text}");
    }
    assert_eq!(ErrorCode::parse("new_code").status(), None);
}

#[test]
fn the_seven_states_use_the_channels_strings_and_four_are_boundaries() {
    let names: Vec<&str> = RunState::KNOWN.iter().map(RunState::as_str).collect();
    assert_eq!(
        names,
        [
            "pending",
            "running",
            "waiting",
            "completed",
            "failed",
            "cancelled",
            "retired"
        ]
    );
    let boundaries: Vec<&str> = RunState::KNOWN
        .iter()
        .filter(|s| s.is_boundary())
        .map(RunState::as_str)
        .collect();
    assert_eq!(boundaries, ["waiting", "completed", "failed", "cancelled"]);
}

#[test]
fn suspend_kinds_cover_every_reason_a_run_waits() {
    let names: Vec<&str> = SuspendKind::KNOWN.iter().map(SuspendKind::as_str).collect();
    assert_eq!(
        names,
        [
            "question",
            "approval",
            "custom",
            "signal",
            "sleep",
            "budget",
            "reconciliation"
        ]
    );
}

#[test]
fn a_start_without_text_or_with_a_wrong_type_is_bad_request() {
    for body in [
        json!({}),
        json!({"text": 1}),
        json!({"text": "x", "context": "not a list"}),
        json!([1]),
    ] {
        assert_eq!(
            StartRun::decode(&body.to_string()).unwrap_err().code,
            ErrorCode::BadRequest,
            "{body}"
        );
    }
    assert_eq!(
        StartRun::decode("{").unwrap_err().code,
        ErrorCode::BadRequest
    );
}

#[test]
fn an_unknown_turn_policy_is_refused_with_its_own_code() {
    let refused = StartRun::decode(r#"{"text":"x","turn_policy":"interrupt"}"#).unwrap_err();
    assert_eq!(refused.code, ErrorCode::UnknownTurnPolicy);
    assert_eq!(
        MessageRun::decode(r#"{"text":"x","turn_policy":"later"}"#)
            .unwrap_err()
            .code,
        ErrorCode::UnknownTurnPolicy
    );
}

#[test]
fn the_turn_policy_defaults_to_steer() {
    assert_eq!(
        StartRun::decode(r#"{"text":"x"}"#).unwrap().turn_policy(),
        TurnPolicy::Steer
    );
    assert_eq!(
        MessageRun::decode(r#"{"text":"x","turn_policy":"queue"}"#)
            .unwrap()
            .turn_policy(),
        TurnPolicy::Queue
    );
}

#[test]
fn operation_id_together_with_address_is_bad_request() {
    let refused =
        StartRun::decode(r#"{"text":"x","address":"a","operation_id":"op"}"#).unwrap_err();
    assert_eq!(refused.code, ErrorCode::BadRequest);
    assert!(refused.message.contains("operation_id"));
}

#[test]
fn unknown_request_fields_are_tolerated_and_null_reads_as_absent() {
    let start =
        StartRun::decode(r#"{"text":"x","files":[1],"title":null,"future":{"a":1}}"#).unwrap();
    assert_eq!(start.title, None);
    assert_eq!(serde_json::to_value(&start).unwrap(), json!({"text": "x"}));
}

#[test]
fn approved_is_tri_state_absent_true_or_false() {
    let respond = Respond::decode(
        r#"{"responses":[{"text":"a"},{"text":"b","approved":true},{"text":"c","approved":false},{"text":"d","approved":null}]}"#,
    )
    .unwrap();
    let verdicts: Vec<Option<bool>> = respond.responses.iter().map(|a| a.approved).collect();
    assert_eq!(verdicts, [None, Some(true), Some(false), None]);
    assert_eq!(
        serde_json::to_value(&respond.responses[0]).unwrap(),
        json!({"text": "a"})
    );
    assert_eq!(
        serde_json::to_value(&respond.responses[2]).unwrap(),
        json!({"text": "c", "approved": false})
    );
}

#[test]
fn an_empty_respond_is_bad_request() {
    assert_eq!(
        Respond::decode(r#"{"responses":[]}"#).unwrap_err().code,
        ErrorCode::BadRequest
    );
    assert_eq!(
        Respond::decode("{}").unwrap_err().code,
        ErrorCode::BadRequest
    );
    let only_verdict = Respond::decode(r#"{"responses":[{"approved":true}]}"#).unwrap();
    assert_eq!(
        only_verdict.responses,
        [Answer {
            text: String::new(),
            turn_id: None,
            approved: Some(true)
        }]
    );
}

#[test]
fn requested_is_answered_202_and_the_no_op_outcomes_200() {
    assert_eq!(CancelStatus::Requested.status(), 202);
    assert_eq!(CancelStatus::NotActive.status(), 200);
    assert_eq!(CancelStatus::Stale.status(), 200);
    assert_eq!(
        CancelStatus::KNOWN
            .iter()
            .map(CancelStatus::as_str)
            .collect::<Vec<_>>(),
        ["requested", "not_active", "stale"]
    );
}

#[test]
fn an_empty_command_body_reads_as_an_empty_object() {
    let cancel: http::Cancel = http::decode_body("").unwrap();
    assert_eq!(cancel.turn_id, None);
    let reset: http::Reset = http::decode_body("  \n").unwrap();
    assert_eq!(reset.reason, None);
}

#[test]
fn a_principal_uses_capitalized_field_names_and_reads_lowercase_ones_too() {
    let principal = Principal {
        authenticator: "token".into(),
        kind: "token".into(),
        id: "ops".into(),
        attributes: [("team".to_owned(), "infra".to_owned())].into(),
    };
    assert_eq!(
        serde_json::to_value(&principal).unwrap(),
        json!({"Authenticator": "token", "Kind": "token", "ID": "ops", "Attributes": {"team": "infra"}})
    );
    let go_style: Principal = serde_json::from_value(
        json!({"Authenticator": "a", "Kind": "k", "ID": "i", "Attributes": null}),
    )
    .unwrap();
    assert!(go_style.attributes.is_empty());
    let lower: Principal =
        serde_json::from_value(json!({"authenticator": "a", "kind": "k", "id": "i"})).unwrap();
    assert_eq!(lower.id, "i");
}

#[test]
fn a_run_reply_omits_absent_fields_and_carries_suspend_and_usage() {
    let reply: RunReply = serde_json::from_value(json!({
        "run_id": "r1", "state": "waiting", "turn_id": "t1", "cursor": 12,
        "suspend": {"kind": "approval", "prompt": "Deploy?", "options": ["yes", "no"], "tool_call_id": "c1", "turn_id": "t1"},
        "usage": {"input_tokens": 10, "output_tokens": 3}
    }))
    .unwrap();
    assert_eq!(reply.suspend.as_ref().unwrap().kind, SuspendKind::Approval);
    let minimal = RunReply {
        run_id: "r".into(),
        state: RunState::Pending,
        turn_id: None,
        cursor: None,
        response: None,
        suspend: None,
        usage: None,
    };
    assert_eq!(
        serde_json::to_value(&minimal).unwrap(),
        json!({"run_id": "r", "state": "pending"})
    );
}

#[test]
fn a_stream_event_needs_an_rfc_3339_time_and_keeps_unknown_types() {
    let event: StreamEvent = serde_json::from_value(
        json!({"run_id": "r", "seq": 3, "type": "kit_step_finished", "time": "2026-11-29T10:00:00Z"}),
    )
    .unwrap();
    assert_eq!(
        event.kind,
        StreamEventType::Unknown("kit_step_finished".into())
    );
    assert!(
        serde_json::from_value::<StreamEvent>(
            json!({"run_id": "r", "seq": 3, "type": "run_state", "time": "yesterday"})
        )
        .is_err()
    );
    assert!(
        serde_json::from_value::<StreamEvent>(
            json!({"run_id": "r", "seq": -1, "type": "run_state", "time": "2026-11-29T10:00:00Z"})
        )
        .is_err()
    );
}

#[test]
fn a_rejection_becomes_the_channels_error_body() {
    let body: ErrorBody = StartRun::decode(r#"{"text":"x","turn_policy":"x"}"#)
        .unwrap_err()
        .into();
    let value: Value = serde_json::to_value(&body).unwrap();
    assert_eq!(value["code"], json!("unknown_turn_policy"));
    assert!(value["error"].as_str().unwrap().contains("steer"));
}

#[test]
fn the_channel_lives_under_spool_v1_with_a_1_mib_body_cap() {
    assert_eq!(http::BASE_PATH, "/spool/v1");
    assert_eq!(http::MAX_BODY_BYTES, 1_048_576);
    assert_eq!(http::NDJSON_CONTENT_TYPE, "application/x-ndjson");
}
