//! The replay cursor: recorded results come back, live work needs a permit,
//! a different request is a divergence, and dangling calls are classified
//! by effect.

use serde_json::json;
use spool_journal::cursor::{ModelStep, ReplayCursor, SleepStep, SuspendStep, ToolStep};
use spool_journal::event::*;
use spool_journal::{Event, Seq};
use spool_wire::run::SuspendKind;

use crate::support::*;

fn cursor(events: Vec<Event>) -> ReplayCursor {
    let n = events.len() as u64;
    ReplayCursor::new(log("r", 2, events), Seq(2 + n))
}

#[test]
fn a_recorded_turn_replays_every_result_without_a_permit() {
    let call = tool_call("c1", Effect::Write, Some("k"));
    let mut c = cursor(vec![
        model_requested("h1"),
        model_completed(json!({"tool": "deploy"}), 3),
        Event::ToolCallRequested(call.clone()),
        tool_done("c1", json!({"ok": true})),
        model_requested("h2"),
        model_completed(json!("Done."), 4),
    ]);
    assert!(
        matches!(c.model_call("h1").unwrap(), ModelStep::Replayed(done) if done.message == json!({"tool": "deploy"}).into())
    );
    assert_eq!(
        c.tool_call(&call).unwrap(),
        ToolStep::Replayed(json!({"ok": true})),
        "a recorded write is never run again"
    );
    assert!(matches!(
        c.model_call("h2").unwrap(),
        ModelStep::Replayed(_)
    ));
    assert!(c.is_exhausted());
    let ModelStep::Live(permit) = c.model_call("h3").unwrap() else {
        panic!("past the record, work is live")
    };
    assert!(!permit.intent_recorded());
}

#[test]
fn events_that_are_not_requests_are_passed_over() {
    let mut c = cursor(vec![
        Event::InputSteered(InputSteered {
            turn_id: turn("t1"),
            input: "also DNS".into(),
        }),
        Event::CancelRequested(CancelRequested::default()),
        model_requested("h1"),
        Event::AddressBound(AddressBinding {
            address: spool_journal::Address::new("pod", "p"),
        }),
        model_completed(json!("ok"), 1),
    ]);
    assert!(matches!(
        c.model_call("h1").unwrap(),
        ModelStep::Replayed(_)
    ));
}

#[test]
fn a_request_that_differs_from_the_record_is_a_divergence_naming_both_sides() {
    let mut c = cursor(vec![model_requested("h1"), model_completed(json!("x"), 1)]);
    let divergence = c.model_call("h-other").unwrap_err();
    assert_eq!(divergence.seq, Seq(2));
    assert!(
        divergence.recorded.contains("model_call_requested") && divergence.recorded.contains("h1"),
        "{divergence}"
    );
    assert!(divergence.requested.contains("h-other"));

    let recorded = tool_call("c1", Effect::Read, None);
    let mut c = cursor(vec![Event::ToolCallRequested(recorded.clone())]);
    let mut changed = recorded.clone();
    changed.input = json!({"env": "production"});
    assert!(c.tool_call(&changed).is_err(), "other arguments diverge");
    let mut c = cursor(vec![Event::ToolCallRequested(recorded.clone())]);
    assert!(
        c.model_call("h1").is_err(),
        "another kind of request diverges"
    );
}

#[test]
fn a_dangling_read_runs_again_under_its_recorded_intent() {
    let call = tool_call("c1", Effect::Read, None);
    let mut c = cursor(vec![Event::ToolCallRequested(call.clone())]);
    let ToolStep::Live(permit) = c.tool_call(&call).unwrap() else {
        panic!("a dangling read is run again")
    };
    assert!(
        permit.intent_recorded(),
        "its intent is already durable and must not be recorded twice"
    );
    assert_eq!(permit.intent_seq(), Some(Seq(2)));
}

#[test]
fn a_dangling_idempotent_call_retries_under_its_recorded_key() {
    let call = tool_call("c1", Effect::Idempotent, Some("order-7"));
    let mut c = cursor(vec![Event::ToolCallRequested(call.clone())]);
    let ToolStep::Retry { permit, key } = c.tool_call(&call).unwrap() else {
        panic!("a dangling idempotent call is retried")
    };
    assert_eq!(key.as_deref(), Some("order-7"));
    assert!(permit.intent_recorded());
}

#[test]
fn a_dangling_write_needs_reconciliation_with_the_evidence() {
    let call = tool_call("c1", Effect::Write, Some("deploy-1"));
    let mut c = cursor(vec![
        Event::ToolCallRequested(call.clone()),
        model_requested("unrelated-later"),
    ]);
    assert_eq!(
        c.tool_call(&call).unwrap(),
        ToolStep::NeedsReconciliation {
            seq: Seq(2),
            evidence: call,
            parked: false
        }
    );
}

#[test]
fn a_parked_write_stays_parked_until_resolved_and_then_replays_the_resolution() {
    let call = tool_call("c1", Effect::Write, None);
    let mut parked = suspended("t1", SuspendKind::Reconciliation, "Did the deploy happen?");
    parked.call_id = Some("c1".into());
    let mut c = cursor(vec![
        Event::ToolCallRequested(call.clone()),
        Event::Suspended(parked.clone()),
    ]);
    assert_eq!(
        c.tool_call(&call).unwrap(),
        ToolStep::NeedsReconciliation {
            seq: Seq(2),
            evidence: call.clone(),
            parked: true
        }
    );
    let mut c = cursor(vec![
        Event::ToolCallRequested(call.clone()),
        Event::Suspended(parked),
        Event::ToolCallResolved(ToolCallResolved {
            call_id: "c1".into(),
            output: json!("it ran").into(),
            operator: Some("ops".into()),
        }),
    ]);
    assert_eq!(
        c.tool_call(&call).unwrap(),
        ToolStep::Replayed(json!("it ran"))
    );
}

#[test]
fn a_recorded_suspension_can_be_read_before_it_is_replayed() {
    let ask = suspended("t1", SuspendKind::Question, "Which region?");
    let c = cursor(vec![model_requested("h"), Event::Suspended(ask.clone())]);
    assert_eq!(c.peek_suspension(), None, "the next action is a model call");
    let c = cursor(vec![
        Event::InputSteered(InputSteered {
            turn_id: turn("t1"),
            input: "x".into(),
        }),
        Event::Suspended(ask.clone()),
    ]);
    assert_eq!(c.peek_suspension(), Some(&ask));
}

#[test]
fn an_operators_resolution_replays_as_the_output_and_an_abandonment_as_such() {
    let call = tool_call("c1", Effect::Write, None);
    let mut c = cursor(vec![
        Event::ToolCallRequested(call.clone()),
        Event::ToolCallResolved(ToolCallResolved {
            call_id: "c1".into(),
            output: json!("it ran").into(),
            operator: None,
        }),
    ]);
    assert_eq!(
        c.tool_call(&call).unwrap(),
        ToolStep::Replayed(json!("it ran"))
    );
    let mut c = cursor(vec![
        Event::ToolCallRequested(call.clone()),
        Event::ToolCallAbandoned(ToolCallAbandoned {
            call_id: "c1".into(),
            reason: None,
            operator: None,
        }),
    ]);
    assert!(matches!(
        c.tool_call(&call).unwrap(),
        ToolStep::Abandoned(_)
    ));
}

#[test]
fn a_dangling_model_call_is_made_again() {
    let mut c = cursor(vec![model_requested("h1")]);
    let ModelStep::Live(permit) = c.model_call("h1").unwrap() else {
        panic!()
    };
    assert!(permit.intent_recorded());
}

#[test]
fn a_suspension_replays_its_answer_or_stays_parked() {
    let ask = suspended("t1", SuspendKind::Question, "Which region?");
    let answer = Resumed {
        turn_id: turn("t1"),
        answers: vec![Answer {
            text: "eu-west-1".into(),
            approved: None,
        }],
    };
    let mut c = cursor(vec![
        Event::Suspended(ask.clone()),
        Event::Resumed(answer.clone()),
    ]);
    assert_eq!(c.suspend(&ask).unwrap(), SuspendStep::Replayed(answer));
    let mut c = cursor(vec![Event::Suspended(ask.clone())]);
    assert_eq!(c.suspend(&ask).unwrap(), SuspendStep::Parked);
    let mut c = cursor(vec![Event::Suspended(ask.clone())]);
    let other = suspended("t1", SuspendKind::Approval, "Which region?");
    assert!(
        c.suspend(&other).is_err(),
        "another kind of suspension diverges"
    );
}

#[test]
fn a_sleep_replays_its_wake_up_or_keeps_sleeping() {
    let wake_at = time::macros::datetime!(2026-12-01 09:00 UTC);
    let sleep = SleepStarted {
        call_id: "c1".into(),
        wake_at,
    };
    let mut c = cursor(vec![
        Event::SleepStarted(sleep.clone()),
        Event::SleepCompleted(SleepCompleted {
            call_id: "c1".into(),
            woken_at: None,
        }),
    ]);
    assert_eq!(c.sleep("c1").unwrap(), SleepStep::Woke { early: None });
    // Woken before its time: the cursor says when.
    let early = wake_at - time::Duration::minutes(5);
    let mut c = cursor(vec![
        Event::SleepStarted(sleep.clone()),
        Event::SleepCompleted(SleepCompleted {
            call_id: "c1".into(),
            woken_at: Some(early),
        }),
    ]);
    assert_eq!(
        c.sleep("c1").unwrap(),
        SleepStep::Woke { early: Some(early) }
    );
    let mut c = cursor(vec![Event::SleepStarted(sleep.clone())]);
    assert_eq!(c.sleep("c1").unwrap(), SleepStep::Sleeping(sleep));
    let mut c = cursor(vec![]);
    assert!(matches!(c.sleep("c1").unwrap(), SleepStep::Live(_)));
}
