//! The recorded sentinels: round trips, UTC normalization, and every near
//! miss of the seed's tests read as ordinary output.

use serde_json::{Value, json};
use spool_wire::sentinel::{
    ERROR_KEY, FailureKind, SLEEP_KEY, SUSPEND_KEY, Sentinel, Sleep, Suspension, ToolFailure,
};
use time::macros::datetime;

#[test]
fn the_reserved_keys_carry_spools_name() {
    assert_eq!(SUSPEND_KEY, "__spool_suspend");
    assert_eq!(SLEEP_KEY, "__spool_sleep");
    assert_eq!(ERROR_KEY, "__spool_error");
}

#[test]
fn every_sentinel_survives_an_encode_decode_round_trip() {
    let cases = [
        Sentinel::Suspend(Suspension::new(
            "needs approval",
            json!({"type": "object", "required": ["approved"]}),
        )),
        Sentinel::Suspend(Suspension::new("webhook", json!(true)).on_signal()),
        Sentinel::Sleep(Sleep::until(datetime!(2026-08-14 09:00:00 UTC))),
        Sentinel::Failure(ToolFailure {
            kind: FailureKind::Handler,
            message: "tool `x` failed: connection reset".into(),
            attempts: 3,
        }),
    ];
    for case in cases {
        assert_eq!(
            Sentinel::decode(&case.encode()).unwrap(),
            Some(case.clone()),
            "{case:?}"
        );
    }
}

#[test]
fn a_gate_suspension_records_no_kind_key_and_a_signal_records_one() {
    let gate = Sentinel::Suspend(Suspension::new("r", json!({}))).encode();
    assert_eq!(
        gate,
        json!({SUSPEND_KEY: {"reason": "r", "input_schema": {}}})
    );
    let signal = Sentinel::Suspend(Suspension::new("r", json!({})).on_signal()).encode();
    assert_eq!(signal[SUSPEND_KEY]["kind"], json!("signal"));
}

#[test]
fn a_null_suspension_kind_reads_as_a_gate() {
    let decoded =
        Sentinel::decode(&json!({SUSPEND_KEY: {"reason": "r", "input_schema": {}, "kind": null}}))
            .unwrap();
    assert_eq!(
        decoded,
        Some(Sentinel::Suspend(Suspension::new("r", json!({}))))
    );
}

#[test]
fn an_unknown_suspension_kind_is_malformed_not_a_wait_it_cannot_keep() {
    // The seed: a kind this version does not know is not a suspension it
    // may replay. It is malformed (a failed call everywhere), never a wait
    // for something unknown, never ordinary output.
    let value = json!({SUSPEND_KEY: {"reason": "r", "input_schema": {}, "kind": "quorum"}});
    let error = Sentinel::decode(&value).unwrap_err();
    assert!(
        error.to_string().contains("`kind` must be `signal`"),
        "{error}"
    );
}

#[test]
fn a_wake_instant_in_another_offset_records_as_the_same_instant_in_utc() {
    let sleep = Sleep::until(datetime!(2026-08-14 11:00:00 +02:00));
    assert_eq!(
        Sentinel::Sleep(sleep).encode(),
        json!({SLEEP_KEY: {"wake_at": "2026-08-14T09:00:00Z"}})
    );
    let decoded =
        Sentinel::decode(&json!({SLEEP_KEY: {"wake_at": "2026-08-14T11:00:00+02:00"}})).unwrap();
    assert_eq!(
        decoded,
        Some(Sentinel::Sleep(Sleep {
            wake_at: datetime!(2026-08-14 09:00:00 UTC)
        }))
    );
}

#[test]
fn near_misses_are_ordinary_output_not_sentinels() {
    let near_misses = [
        json!({"result": 1}),
        json!({SUSPEND_KEY: {}, "other": 1}),
        json!({"nested": {ERROR_KEY: {}}}),
        json!(ERROR_KEY),
        json!({"wake_at": "2026-08-14T09:00:00Z"}),
        json!([{SLEEP_KEY: {"wake_at": "2026-08-14T09:00:00Z"}}]),
        json!({"__salvor_sleep": {"wake_at": "2026-08-14T09:00:00Z"}}),
        json!({"__spool_suspend ": {"reason": "r", "input_schema": {}}}),
        json!({}),
        json!(null),
    ];
    for value in near_misses {
        assert_eq!(Sentinel::decode(&value), Ok(None), "{value}");
        assert!(!Sentinel::is_reserved(&value), "{value}");
    }
}

#[test]
fn a_reserved_key_alone_with_a_bad_body_is_malformed_not_ordinary_output() {
    let malformed = [
        json!({SLEEP_KEY: {"wake_at": "tomorrow"}}),
        json!({SLEEP_KEY: {}}),
        json!({SUSPEND_KEY: {"input_schema": {}}}),
        json!({SUSPEND_KEY: {"reason": "r"}}),
        json!({SUSPEND_KEY: "later"}),
        json!({ERROR_KEY: {"is_error": false, "kind": "handler", "message": "m", "attempts": 1}}),
        json!({ERROR_KEY: {"is_error": true, "kind": "handler", "message": "m", "attempts": -1}}),
        json!({ERROR_KEY: {"is_error": true, "kind": "handler", "message": "m", "attempts": 4_294_967_296_u64}}),
        json!({ERROR_KEY: {"is_error": true, "kind": "handler", "attempts": 1}}),
    ];
    for value in malformed {
        assert!(Sentinel::is_reserved(&value), "{value}");
        let error = Sentinel::decode(&value).unwrap_err();
        assert!(
            error.to_string().starts_with("malformed __spool_"),
            "{error}"
        );
    }
}

#[test]
fn each_failure_kind_has_its_recorded_string() {
    assert_eq!(FailureKind::InvalidInput.as_str(), "invalid_input");
    assert_eq!(FailureKind::Handler.as_str(), "handler");
    assert_eq!(
        FailureKind::OutputSerialization.as_str(),
        "output_serialization"
    );
    assert_eq!(FailureKind::KNOWN.len(), 3);
}

#[test]
fn a_failure_from_an_error_records_its_whole_chain() {
    #[derive(Debug, thiserror::Error)]
    #[error("tool `fetch` failed")]
    struct Outer(#[source] std::io::Error);
    let failure = ToolFailure::from_error(
        FailureKind::Handler,
        &Outer(std::io::Error::other("connection reset")),
        2,
    );
    assert_eq!(failure.message, "tool `fetch` failed: connection reset");
    assert_eq!(
        Sentinel::Failure(failure).encode(),
        json!({ERROR_KEY: {"is_error": true, "kind": "handler", "message": "tool `fetch` failed: connection reset", "attempts": 2}})
    );
}

#[test]
fn content_string_renders_strings_bare_and_everything_else_canonically() {
    use spool_wire::sentinel::content_string;
    assert_eq!(content_string(&json!("plain")), "plain");
    let value: Value = serde_json::from_str(r#"{"b": 1, "a": [2.0, "x"]}"#).unwrap();
    assert_eq!(content_string(&value), r#"{"a":[2,"x"],"b":1}"#);
}

#[test]
fn a_completion_read_from_text_that_is_not_json_is_refused_as_not_json() {
    for text in ["", "{\"__spool_sleep\":", "tomorrow", "{\"a\":1} trailing"] {
        assert!(
            matches!(
                spool_wire::sentinel::Recorded::decode(text),
                Err(spool_wire::sentinel::RecordedError::NotJson(_))
            ),
            "{text:?}"
        );
    }
}
