//! Pinned encodings: every event kind decodes from its recorded bytes and
//! re-encodes to exactly those bytes, so logs written today stay
//! byte-identical for every later reader.

use spool_journal::Envelope;

const PINNED: &str = include_str!("pinned_events.jsonl");

/// JSON values inside events (messages, tool inputs and outputs) are written
/// with their keys sorted, as serde_json's map keeps them. Should a
/// dependency ever turn on serde_json's `preserve_order`, new logs would be
/// written differently, and this test says so.
#[test]
fn every_pinned_envelope_re_encodes_byte_for_byte() {
    for (number, line) in PINNED.lines().enumerate() {
        let envelope: Envelope =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", number + 1));
        assert_eq!(
            serde_json::to_string(&envelope).unwrap(),
            line,
            "line {} changed on re-encoding",
            number + 1
        );
    }
}

#[test]
fn the_pinned_log_covers_every_event_kind() {
    let kinds: std::collections::BTreeSet<String> = PINNED
        .lines()
        .map(|line| {
            serde_json::from_str::<Envelope>(line)
                .unwrap()
                .event
                .kind()
                .to_owned()
        })
        .collect();
    let all = [
        "run_created",
        "turn_started",
        "input_steered",
        "input_queued",
        "model_call_requested",
        "model_call_completed",
        "tool_call_requested",
        "tool_call_completed",
        "suspended",
        "resumed",
        "sleep_started",
        "sleep_completed",
        "cancel_requested",
        "turn_completed",
        "turn_failed",
        "turn_cancelled",
        "context_cleared",
        "compacted",
        "budget_exceeded",
        "address_bound",
        "address_unbound",
        "run_retired",
        "tool_call_resolved",
        "tool_call_abandoned",
        "schedule_fired",
        "schedule_delivered",
        "noted",
        "forked_from",
        "forked_into",
        "agent_changed",
    ];
    for kind in all {
        assert!(kinds.contains(kind), "no pinned envelope for {kind}");
    }
    assert_eq!(
        kinds.len(),
        all.len(),
        "a kind is pinned that the list above does not name"
    );
}

#[test]
fn an_unknown_kind_or_a_bad_id_does_not_decode() {
    let unknown = r#"{"run_id":"r","seq":0,"recorded_at":"2026-11-29T10:00:00Z","event":{"kind":"teleported","payload":{}}}"#;
    assert!(serde_json::from_str::<Envelope>(unknown).is_err());
    let bad_id = r#"{"run_id":"r 1","seq":0,"recorded_at":"2026-11-29T10:00:00Z","event":{"kind":"run_created","payload":{}}}"#;
    assert!(serde_json::from_str::<Envelope>(bad_id).is_err());
}
