//! Bus v1: validation, the legacy shapes, capabilities, and every error
//! code with its retry default and status.

use serde_json::json;
use spool_wire::bus::{BusRequest, BusResponse, Capability, ErrorCode, MAX_REQUEST_BYTES};

fn request(value: serde_json::Value) -> Result<BusRequest, spool_wire::bus::BusRejection> {
    BusRequest::decode(&value.to_string())
}

#[test]
fn each_error_code_has_the_seeds_string_and_retryable_default() {
    let table = [
        ("invalid_request", ErrorCode::InvalidRequest, false),
        ("request_too_large", ErrorCode::RequestTooLarge, false),
        ("bus_disabled", ErrorCode::BusDisabled, false),
        ("auth_failed", ErrorCode::AuthFailed, false),
        ("peer_not_allowed", ErrorCode::PeerNotAllowed, false),
        ("max_depth_exceeded", ErrorCode::MaxDepthExceeded, false),
        (
            "invalid_handler_response",
            ErrorCode::InvalidHandlerResponse,
            true,
        ),
        ("internal_error", ErrorCode::InternalError, true),
        ("instance_unavailable", ErrorCode::InstanceUnavailable, true),
        ("invalid_response", ErrorCode::InvalidResponse, true),
        ("timeout", ErrorCode::Timeout, true),
        ("budget_exhausted", ErrorCode::BudgetExhausted, false),
        ("auth", ErrorCode::Auth, false),
        ("write_permission", ErrorCode::WritePermission, false),
        ("telegram_conflict", ErrorCode::TelegramConflict, true),
        ("telegram_delivery", ErrorCode::TelegramDelivery, true),
        ("engine_cli", ErrorCode::EngineCli, true),
        ("file_workflow", ErrorCode::FileWorkflow, false),
        ("workflow_state", ErrorCode::WorkflowState, false),
        ("session_state", ErrorCode::SessionState, false),
        ("unknown", ErrorCode::Unclassified, true),
        // Spool's additions: the refusals of a browser's requests.
        ("origin_not_allowed", ErrorCode::OriginNotAllowed, false),
        ("host_not_allowed", ErrorCode::HostNotAllowed, false),
        (
            "unsupported_media_type",
            ErrorCode::UnsupportedMediaType,
            false,
        ),
    ];
    assert_eq!(table.len(), 24);
    assert_eq!(
        ErrorCode::KNOWN.len(),
        24,
        "every known code is in the table above"
    );
    for (text, code, retryable) in table {
        assert_eq!(code.as_str(), text);
        assert_eq!(ErrorCode::parse(text), code, "{text} parses to its variant");
        assert_eq!(code.retryable(), retryable, "{text} retryable default");
    }
}

#[test]
fn an_unrecognized_code_survives_a_round_trip_and_is_not_retried_by_default() {
    let code = ErrorCode::parse("quota_frozen");
    assert_eq!(code, ErrorCode::Unknown("quota_frozen".into()));
    assert_eq!(serde_json::to_value(&code).unwrap(), json!("quota_frozen"));
    assert!(!code.retryable());
}

#[test]
fn pre_handler_refusals_carry_the_seeds_http_statuses() {
    assert_eq!(ErrorCode::RequestTooLarge.http_status(), Some(413));
    assert_eq!(ErrorCode::InvalidRequest.http_status(), Some(400));
    assert_eq!(ErrorCode::BusDisabled.http_status(), Some(403));
    assert_eq!(ErrorCode::AuthFailed.http_status(), Some(401));
    assert_eq!(ErrorCode::PeerNotAllowed.http_status(), Some(403));
    assert_eq!(ErrorCode::MaxDepthExceeded.http_status(), Some(429));
    assert_eq!(ErrorCode::InvalidHandlerResponse.http_status(), Some(500));
    assert_eq!(ErrorCode::InternalError.http_status(), Some(500));
    // Handler-level failures come back as 200 with success:false.
    assert_eq!(ErrorCode::BudgetExhausted.http_status(), None);
    assert_eq!(MAX_REQUEST_BYTES, 262_144);
}

#[test]
fn a_request_without_protocol_version_is_read_as_version_1() {
    let legacy = request(json!({"fromInstance": "a", "prompt": "p", "depth": 0})).unwrap();
    assert_eq!(legacy.protocol_version, None);
    assert_eq!(legacy.version(), 1);
}

#[test]
fn a_request_with_protocol_version_99_is_invalid_request() {
    let refused =
        request(json!({"fromInstance": "a", "prompt": "p", "depth": 0, "protocolVersion": 99}))
            .unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidRequest);
    assert!(refused.message.contains("99"), "{}", refused.message);
}

#[test]
fn a_negative_or_fractional_depth_is_invalid_request() {
    for depth in [json!(-1), json!(1.5), json!("1"), json!(null)] {
        let refused =
            request(json!({"fromInstance": "a", "prompt": "p", "depth": depth})).unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidRequest, "depth {depth}");
    }
}

#[test]
fn an_empty_from_instance_is_invalid_but_an_empty_prompt_is_fine() {
    assert_eq!(
        request(json!({"fromInstance": "", "prompt": "p", "depth": 0}))
            .unwrap_err()
            .code,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        request(json!({"fromInstance": "a", "prompt": "", "depth": 0}))
            .unwrap()
            .prompt,
        ""
    );
}

#[test]
fn ext_is_accepted_but_a_stray_top_level_key_is_invalid_request() {
    let with_ext = request(
        json!({"fromInstance": "a", "prompt": "p", "depth": 0, "ext": {"traceparent": "00-abc"}}),
    )
    .unwrap();
    assert_eq!(with_ext.ext.unwrap()["traceparent"], json!("00-abc"));
    let stray = request(json!({"fromInstance": "a", "prompt": "p", "depth": 0, "surprise": true}))
        .unwrap_err();
    assert_eq!(stray.code, ErrorCode::InvalidRequest);
    assert!(stray.message.contains("surprise"), "{}", stray.message);
}

#[test]
fn an_unknown_capability_is_kept_and_ignored_never_rejected() {
    let req = request(json!({"fromInstance": "a", "prompt": "p", "depth": 0, "capabilities": ["structured-errors", "streaming-v2"]})).unwrap();
    assert!(req.has_capability(&Capability::StructuredErrors));
    assert!(!req.has_capability(&Capability::RetryableErrors));
    assert_eq!(
        serde_json::to_value(&req).unwrap()["capabilities"],
        json!(["structured-errors", "streaming-v2"])
    );
    let reply =
        BusResponse::decode(r#"{"success":true,"text":"ok","capabilities":["future-flag"]}"#)
            .unwrap();
    assert_eq!(
        reply.capabilities,
        Some(vec![Capability::Unknown("future-flag".into())])
    );
}

#[test]
fn legacy_responses_without_version_or_with_only_success_and_error_are_accepted() {
    let success =
        BusResponse::decode(r#"{"success":true,"text":"done","fromInstance":"w"}"#).unwrap();
    assert_eq!(success.text(), "done");
    assert_eq!(success.code(), None);
    let failure = BusResponse::decode(r#"{"success":false,"error":"boom"}"#).unwrap();
    assert_eq!(failure.text(), "");
    assert_eq!(failure.code(), Some(ErrorCode::Unclassified));
    assert!(
        failure.is_retryable(),
        "a legacy failure is `unknown`, which the table retries"
    );
}

#[test]
fn an_explicit_retryable_wins_over_the_codes_default() {
    let reply = BusResponse::decode(
        r#"{"success":false,"error":"x","errorCode":"timeout","retryable":false}"#,
    )
    .unwrap();
    assert!(ErrorCode::Timeout.retryable());
    assert!(!reply.is_retryable());
    let reply = BusResponse::decode(
        r#"{"success":false,"error":"x","errorCode":"budget_exhausted","retryable":true}"#,
    )
    .unwrap();
    assert!(reply.is_retryable());
}

#[test]
fn unknown_response_keys_pass_through_unchanged() {
    let text = r#"{"success":true,"text":"ok","traceId":"t-1","extra":{"a":[1]}}"#;
    let reply = BusResponse::decode(text).unwrap();
    assert_eq!(reply.extra["traceId"], json!("t-1"));
    let back: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&reply).unwrap()).unwrap();
    assert_eq!(
        back,
        serde_json::from_str::<serde_json::Value>(text).unwrap()
    );
}

#[test]
fn a_response_that_is_not_an_envelope_is_invalid_response() {
    for text in [
        "<html>502 Bad Gateway</html>",
        "[]",
        r#"{"text":"no success flag"}"#,
        r#"{"success":"yes"}"#,
    ] {
        assert_eq!(
            BusResponse::decode(text).unwrap_err().code,
            ErrorCode::InvalidResponse,
            "{text}"
        );
    }
}

#[test]
fn builders_stamp_version_1_and_both_capabilities_on_every_response() {
    for reply in [
        BusResponse::success("worker", "fine", 5),
        BusResponse::failure("worker", ErrorCode::PeerNotAllowed, "not a peer", 1),
    ] {
        assert_eq!(reply.protocol_version, Some(1));
        assert_eq!(
            reply.capabilities,
            Some(vec![
                Capability::StructuredErrors,
                Capability::RetryableErrors
            ])
        );
    }
    let failure = BusResponse::failure("worker", ErrorCode::Timeout, "slow", 60_000);
    assert_eq!(failure.retryable, Some(true));
    assert_eq!(failure.text(), "");
    let request = BusRequest::new("reviewer", "check", 1);
    assert_eq!(request.protocol_version, Some(1));
}
