//! Every stream line type decodes into its payload struct, and the struct
//! re-encodes to the same `data`: the pinned lines hold the shape of each
//! type's payload.

use std::collections::BTreeSet;

use spool_wire::http::data::{LineData, RunStateData, RunSuspendData, to_data};
use spool_wire::http::{StreamEvent, StreamEventType};

const PINNED: &str = include_str!("stream_lines.jsonl");

fn lines() -> Vec<(String, StreamEvent)> {
    PINNED
        .lines()
        .map(|line| (line.to_owned(), serde_json::from_str(line).unwrap()))
        .collect()
}

/// The payload as `data` again.
fn encoded(payload: &LineData) -> Option<serde_json::Value> {
    match payload {
        LineData::RunCreated(d) => Some(to_data(d)),
        LineData::RunTurn(d) => Some(to_data(d)),
        LineData::RunInput(d) => Some(to_data(d)),
        LineData::ToolCall(d) => Some(to_data(d)),
        LineData::ToolResult(d) => Some(to_data(d)),
        LineData::RunSuspend(d) => Some(to_data(d)),
        LineData::RunResume(d) => Some(to_data(d)),
        LineData::RunResponse(d) => Some(to_data(d)),
        LineData::RunContext(d) => Some(to_data(d)),
        LineData::RunAddress(d) => Some(to_data(d)),
        LineData::RunState(d) => Some(to_data(d)),
        LineData::ToolCallStart(d) => Some(to_data(d)),
        LineData::ToolCallArgsDelta(d) => Some(to_data(d)),
        LineData::ToolCallDone(d) => Some(to_data(d)),
        LineData::ToolProgress(d) => Some(to_data(d)),
        LineData::None => None,
        LineData::Unknown(data) => data.clone(),
    }
}

#[test]
fn every_pinned_line_decodes_to_its_payload_and_re_encodes_to_the_same_data() {
    for (text, line) in lines() {
        let payload = line.payload().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(!matches!(payload, LineData::Unknown(_)), "{text}");
        assert_eq!(encoded(&payload), line.data, "{text}");
    }
}

#[test]
fn the_pinned_lines_cover_every_line_type_and_both_shapes_of_the_shared_ones() {
    let lines = lines();
    let types: BTreeSet<&str> = lines.iter().map(|(_, l)| l.kind.as_str()).collect();
    let known: BTreeSet<&str> = StreamEventType::KNOWN.iter().map(|t| t.as_str()).collect();
    assert_eq!(types, known);
    let payloads: Vec<LineData> = lines.iter().map(|(_, l)| l.payload().unwrap()).collect();
    let has = |f: &dyn Fn(&LineData) -> bool| payloads.iter().any(f);
    assert!(has(&|p| matches!(
        p,
        LineData::RunSuspend(RunSuspendData::Suspended(_))
    )));
    assert!(has(&|p| matches!(
        p,
        LineData::RunSuspend(RunSuspendData::Budget(_))
    )));
    assert!(has(&|p| matches!(
        p,
        LineData::RunState(RunStateData::Failed(_))
    )));
    assert!(has(&|p| matches!(
        p,
        LineData::RunState(RunStateData::Sleeping(_))
    )));
    assert!(has(&|p| matches!(
        p,
        LineData::RunState(RunStateData::Retired(_))
    )));
}

#[test]
fn a_line_whose_data_lacks_its_types_fields_does_not_decode() {
    let line: StreamEvent = serde_json::from_str(
        r#"{"run_id":"r","seq":1,"type":"tool_call","time":"2026-11-30T07:00:00Z","data":{"name":"x"}}"#,
    )
    .unwrap();
    assert!(line.payload().is_err());
    let unknown: StreamEvent = serde_json::from_str(
        r#"{"run_id":"r","seq":1,"type":"from_the_future","time":"2026-11-30T07:00:00Z","data":{"a":1}}"#,
    )
    .unwrap();
    assert_eq!(
        unknown.payload().unwrap(),
        LineData::Unknown(Some(serde_json::json!({"a": 1})))
    );
}
