//! The reader's meanings, one case each.

use std::sync::Arc;

use serde_json::json;
use spool_journal::event::{
    Effect, ModelCallRequested, Resumed, SleepCompleted, SleepStarted, Suspended,
    ToolCallCompleted, ToolCallRequested, TurnCancelled, TurnStarted,
};
use spool_journal::{Envelope, Event, RunId, Seq, TurnId};
use spool_wire::run::{SuspendKind, TurnPolicy};
use time::OffsetDateTime;

use super::{Activity, Parked, Reader, ToolOutcome};

fn log(events: Vec<Event>) -> Vec<Envelope> {
    events
        .into_iter()
        .enumerate()
        .map(|(seq, event)| Envelope {
            run_id: RunId::new("r").unwrap(),
            seq: Seq(seq as u64),
            recorded_at: OffsetDateTime::UNIX_EPOCH,
            event,
        })
        .collect()
}

fn turn() -> TurnId {
    TurnId::new("t1").unwrap()
}

fn started() -> Event {
    Event::TurnStarted(TurnStarted {
        turn_id: turn(),
        input: "hi".into(),
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
        input: json!({}),
        effect: Effect::Read,
        idempotency_key: None,
    })
}

fn completed(id: &str, output: serde_json::Value) -> Event {
    Event::ToolCallCompleted(ToolCallCompleted {
        call_id: id.into(),
        output: Arc::new(output),
    })
}

/// Every fact of a log, as `(kind, call, tool, outcome)` lines.
fn read(reader: &mut Reader, log: &[Envelope]) -> Vec<String> {
    let mut lines = Vec::new();
    for envelope in log {
        for fact in reader.envelope(envelope) {
            lines.push(match fact {
                Activity::ToolCallEnded {
                    call_id,
                    tool,
                    outcome,
                } => format!("ended {call_id} {tool:?} {}", outcome.name()),
                Activity::ToolCallParked { call_id, tool, .. } => {
                    format!("parked {call_id} {tool:?}")
                }
                Activity::ToolCallStarted(call) => format!("started {}", call.call_id),
                Activity::StateChanged(status) => format!("state {}", status.encode()),
                Activity::TurnEnded(_) => "turn ended".into(),
                Activity::TurnStarted { number, .. } => format!("turn {number}"),
                Activity::Suspended(_) => "suspended".into(),
                Activity::Resumed { .. } => "resumed".into(),
                Activity::SleepStarted(_) => "sleep".into(),
                Activity::ModelCallStarted { call } => format!("model {}", call.0),
                Activity::ModelCallInterrupted { call } => format!("model {} interrupted", call.0),
                other => format!("{other:?}"),
            });
        }
    }
    lines
}

#[test]
fn a_completion_names_the_tool_its_call_started_and_a_stateless_reader_does_not() {
    let log = log(vec![
        started(),
        call("c1", "lookup"),
        completed("c1", json!("found")),
    ]);
    let lines = read(&mut Reader::new(), &log);
    assert_eq!(lines[3], "ended c1 Some(\"lookup\") ok");
    let lines = read(&mut Reader::stateless(), &log);
    assert_eq!(lines[3], "ended c1 None ok");
}

#[test]
fn a_malformed_sentinel_is_a_failed_call_and_never_an_output() {
    let log = log(vec![
        started(),
        call("c1", "lookup"),
        completed("c1", json!({"__spool_suspend": "not an object"})),
    ]);
    let mut reader = Reader::new();
    let facts: Vec<_> = reader.envelope(&log[2]).collect();
    let mut reader = Reader::new();
    reader.envelope(&log[0]).for_each(drop);
    reader.envelope(&log[1]).for_each(drop);
    let facts_after_start: Vec<_> = reader.envelope(&log[2]).collect();
    for facts in [facts, facts_after_start] {
        let [Activity::ToolCallEnded { outcome, .. }] = facts.as_slice() else {
            panic!("one end: {facts:?}");
        };
        assert!(matches!(outcome, ToolOutcome::Malformed(_)), "{outcome:?}");
        assert!(outcome.is_error());
        assert!(
            outcome.text().starts_with("error: malformed"),
            "{}",
            outcome.text()
        );
    }
}

#[test]
fn a_suspended_call_parks_and_ends_with_the_answer_after_the_resume() {
    let log = log(vec![
        started(),
        call("c1", "ask_human"),
        completed(
            "c1",
            json!({"__spool_suspend": {"reason": "why?", "input_schema": {}}}),
        ),
        Event::Suspended(Suspended {
            turn_id: turn(),
            kind: SuspendKind::Question,
            prompt: "why?".into(),
            call_id: Some("c1".into()),
            input_schema: None,
            options: None,
        }),
        Event::Resumed(Resumed {
            turn_id: turn(),
            answers: vec![spool_journal::event::Answer {
                text: "because".into(),
                approved: None,
            }],
        }),
    ]);
    let lines = read(&mut Reader::new(), &log);
    assert_eq!(
        lines,
        [
            "turn 1",
            "state running",
            "started c1",
            "parked c1 Some(\"ask_human\")",
            "suspended",
            "state waiting:question",
            "resumed",
            "ended c1 Some(\"ask_human\") answered",
            "state running",
        ]
    );
}

#[test]
fn a_sleeping_call_ends_when_it_wakes_with_the_time_it_slept_until() {
    let wake_at = OffsetDateTime::UNIX_EPOCH + time::Duration::hours(1);
    let log = log(vec![
        started(),
        call("c1", "sleep"),
        completed(
            "c1",
            json!({"__spool_sleep": {"wake_at": "1970-01-01T01:00:00Z"}}),
        ),
        Event::SleepStarted(SleepStarted {
            call_id: "c1".into(),
            wake_at,
        }),
        Event::SleepCompleted(SleepCompleted {
            call_id: "c1".into(),
            woken_at: None,
        }),
    ]);
    let mut reader = Reader::new();
    let mut last = None;
    for envelope in &log {
        for fact in reader.envelope(envelope) {
            if let Activity::ToolCallParked { parked, .. } = &fact {
                assert!(matches!(parked, Parked::Slept(_)), "{parked:?}");
            }
            if let Activity::ToolCallEnded { outcome, .. } = fact {
                last = Some(outcome);
            }
        }
    }
    let outcome = last.expect("the call ended");
    assert_eq!(
        outcome,
        ToolOutcome::Woke {
            at: Some(wake_at),
            early: false
        }
    );
    assert!(
        outcome.text().contains("1970-01-01T01:00:00Z"),
        "{}",
        outcome.text()
    );
}

#[test]
fn a_turn_cancelled_mid_calls_ends_them_interrupted_before_the_turn_ends() {
    let log = log(vec![
        started(),
        call("c1", "lookup"),
        call("c2", "write"),
        completed("c1", json!("ok")),
        Event::ModelCallRequested(ModelCallRequested {
            request_hash: "sha256:aa".into(),
            new_messages: Vec::new(),
        }),
        Event::TurnCancelled(TurnCancelled { turn_id: turn() }),
    ]);
    let lines = read(&mut Reader::new(), &log);
    assert_eq!(
        &lines[6..],
        [
            "model 4 interrupted",
            "ended c2 Some(\"write\") interrupted",
            "turn ended",
            "state cancelled",
        ]
    );
}

#[test]
fn a_call_requested_again_after_a_restart_is_one_open_call() {
    let log = log(vec![
        started(),
        call("c1", "lookup"),
        call("c1", "lookup"),
        completed("c1", json!("ok")),
        Event::TurnCancelled(TurnCancelled { turn_id: turn() }),
    ]);
    let lines = read(&mut Reader::new(), &log);
    assert!(
        !lines.iter().any(|l| l.contains("interrupted")),
        "{lines:?}"
    );
}

/// How many allocations `f` makes on this thread (the crate installs its
/// counting allocator in this test binary).
fn allocations(f: impl FnOnce()) -> u64 {
    allocation_counter::measure(f).count_total
}

#[test]
fn reading_events_allocates_nothing_but_the_memory_of_an_open_tool_call() {
    let wake_at = OffsetDateTime::UNIX_EPOCH + time::Duration::hours(1);
    let log = log(vec![
        started(),
        Event::ModelCallRequested(ModelCallRequested {
            request_hash: "sha256:aa".into(),
            new_messages: Vec::new(),
        }),
        Event::ModelCallCompleted(spool_journal::event::ModelCallCompleted {
            message: Arc::new(json!({"text": "ok"})),
            usage: None,
            finish_reason: None,
        }),
        call("c1", "lookup"),
        completed("c1", json!({"rows": [1, 2]})),
        Event::SleepStarted(SleepStarted {
            call_id: "c9".into(),
            wake_at,
        }),
        Event::TurnCancelled(TurnCancelled { turn_id: turn() }),
    ]);
    // Each event read on its own, as the HTTP stream's shared lines are.
    let stateless = allocations(|| {
        for envelope in &log {
            Reader::stateless().envelope(envelope).for_each(drop);
        }
    });
    assert_eq!(stateless, 0, "a stateless reading allocates nothing");
    // A reader following the run: the open call's id and tool, once.
    let mut reader = Reader::new();
    let mut per_event = Vec::new();
    for envelope in &log {
        per_event.push(allocations(|| {
            reader.envelope(envelope).for_each(drop);
        }));
    }
    assert_eq!(
        per_event,
        [0, 0, 0, 3, 0, 0, 0],
        "the call's request remembers it"
    );
}
