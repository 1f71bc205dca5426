//! The fold: states, the conversation after clears and compactions, usage,
//! and dangling intents.

use serde_json::json;
use spool_journal::event::*;
use spool_journal::fold::{ItemContent, Status, fold, transition};
use spool_journal::{Event, Seq};
use spool_wire::run::{RunState, SuspendKind};

use crate::support::*;

#[test]
fn a_run_moves_through_the_public_states_a_turn_at_a_time() {
    let events = vec![
        created(),
        started("t1", "deploy"),
        Event::Suspended(suspended("t1", SuspendKind::Approval, "Deploy?")),
        Event::Resumed(Resumed {
            turn_id: turn("t1"),
            answers: vec![Answer {
                text: "yes".into(),
                approved: Some(true),
            }],
        }),
        turn_done("t1", "Deployed."),
    ];
    let expected = [
        Status::Pending,
        Status::Running,
        Status::Waiting(SuspendKind::Approval),
        Status::Running,
        Status::Completed,
    ];
    let envelopes = log("r", 0, events);
    for (n, status) in expected.iter().enumerate() {
        assert_eq!(&fold(&envelopes[..=n]).status, status, "after event {n}");
    }
    let state = fold(&envelopes);
    assert_eq!(state.status.state(), RunState::Completed);
    assert_eq!(state.response.as_deref(), Some("Deployed."));
    assert_eq!(state.turn, Some(turn("t1")));
    assert_eq!(state.last_seq, Some(Seq(4)));
}

#[test]
fn sleep_budget_failure_and_cancellation_each_have_their_state() {
    let wake = time::macros::datetime!(2026-12-01 09:00 UTC);
    let cases: Vec<(Event, Status)> = vec![
        (
            Event::SleepStarted(SleepStarted {
                call_id: "c".into(),
                wake_at: wake,
            }),
            Status::Waiting(SuspendKind::Sleep),
        ),
        (
            Event::SleepCompleted(SleepCompleted {
                call_id: "c".into(),
                woken_at: None,
            }),
            Status::Running,
        ),
        (
            Event::BudgetExceeded(BudgetExceeded {
                budget: "tokens".into(),
                limit: 10,
                used: 11,
            }),
            Status::Waiting(SuspendKind::Budget),
        ),
        (
            Event::TurnFailed(TurnFailed {
                turn_id: turn("t1"),
                code: "provider_error".into(),
                message: "503".into(),
            }),
            Status::Failed,
        ),
        (started("t2", "again"), Status::Running),
        (
            Event::TurnCancelled(TurnCancelled {
                turn_id: turn("t2"),
            }),
            Status::Cancelled,
        ),
    ];
    let mut status = Status::Running;
    for (event, expected) in cases {
        status = transition(&status, &event);
        assert_eq!(status, expected, "after {}", event.kind());
    }
}

#[test]
fn retirement_is_permanent_whatever_follows() {
    let envelopes = log(
        "r",
        0,
        vec![
            created(),
            Event::RunRetired(RunRetired::default()),
            started("t1", "x"),
            turn_done("t1", "y"),
        ],
    );
    let state = fold(&envelopes);
    assert_eq!(state.status, Status::Retired);
    assert_eq!(state.last_seq, Some(Seq(3)), "bookkeeping still advances");
    assert!(
        state.conversation.is_empty(),
        "nothing after retirement enters the conversation"
    );
}

#[test]
fn clearing_empties_the_conversation_and_compaction_replaces_a_range_with_its_summary() {
    let envelopes = log(
        "r",
        0,
        vec![
            created(),                                  // 0
            started("t1", "one"),                       // 1
            model_completed(json!("first answer"), 5),  // 2
            turn_done("t1", "first answer"),            // 3
            started("t2", "two"),                       // 4
            model_completed(json!("second answer"), 7), // 5
            Event::Compacted(Compacted {
                summary: "they said one".into(),
                from: Seq(1),
                to: Seq(3),
            }), // 6
        ],
    );
    let state = fold(&envelopes);
    let contents: Vec<&ItemContent> = state.conversation.iter().map(|i| &i.content).collect();
    assert_eq!(
        contents,
        [
            &ItemContent::Summary("they said one".into()),
            &ItemContent::User("two".into()),
            &ItemContent::Assistant(json!("second answer").into()),
        ]
    );
    assert_eq!(
        state.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 2
        },
        "compaction does not undo usage"
    );
    let mut cleared = envelopes.clone();
    cleared.extend(log("r", 7, vec![Event::ContextCleared(ContextCleared {})]));
    assert!(fold(&cleared).conversation.is_empty());
}

#[test]
fn a_requested_call_without_completion_is_a_dangling_intent_until_settled() {
    let write = tool_call("c-write", Effect::Write, Some("k"));
    let read = tool_call("c-read", Effect::Read, None);
    let mut envelopes = log(
        "r",
        0,
        vec![
            created(),
            started("t1", "x"),
            Event::ToolCallRequested(write.clone()),
            Event::ToolCallRequested(read),
        ],
    );
    let state = fold(&envelopes);
    assert_eq!(state.open_calls.len(), 2);
    let dangling: Vec<&str> = state
        .dangling_writes()
        .map(|(_, c)| c.call_id.as_str())
        .collect();
    assert_eq!(dangling, ["c-write"], "only writes need an operator");
    envelopes.extend(log(
        "r",
        4,
        vec![
            Event::Suspended(suspended(
                "t1",
                SuspendKind::Reconciliation,
                "Did the deploy happen?",
            )),
            Event::ToolCallResolved(ToolCallResolved {
                call_id: "c-write".into(),
                output: json!("deployed").into(),
                operator: Some("ops".into()),
            }),
        ],
    ));
    let state = fold(&envelopes);
    assert_eq!(
        state.status,
        Status::Running,
        "resolving the write lets the run go on"
    );
    assert_eq!(state.dangling_writes().count(), 0);
    assert_eq!(state.suspension, None);
}

#[test]
fn statuses_encode_for_listings_and_decode_back() {
    let waiting = SuspendKind::KNOWN.iter().map(|kind| Status::Waiting(*kind));
    for status in [
        Status::Pending,
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
        Status::Retired,
    ]
    .into_iter()
    .chain(waiting)
    {
        assert_eq!(Status::decode(&status.encode()), Some(status), "{status:?}");
    }
    assert_eq!(Status::decode("waiting"), None, "waiting always says why");
    assert_eq!(Status::decode("bogus"), None);
    assert_eq!(
        Status::decode("waiting:quorum"),
        None,
        "a kind this version does not know is refused, not carried"
    );
}

#[test]
fn queued_input_waits_in_the_state_until_a_turn_takes_it() {
    let queued = |input: &str| {
        Event::InputQueued(InputQueued {
            input: input.into(),
            context: vec![],
            operation_id: None,
        })
    };
    let mut envelopes = log(
        "r",
        0,
        vec![
            created(),
            started("t1", "first"),
            queued("second"),
            queued("third"),
        ],
    );
    let state = fold(&envelopes);
    let waiting: Vec<(u64, &str)> = state
        .queued
        .iter()
        .map(|(s, q)| (s.0, q.input.as_str()))
        .collect();
    assert_eq!(
        waiting,
        [(2, "second"), (3, "third")],
        "queued input is kept in order, with its position"
    );
    envelopes.extend(log(
        "r",
        4,
        vec![
            turn_done("t1", "ok"),
            Event::TurnStarted(TurnStarted {
                turn_id: turn("t2"),
                input: "second".into(),
                context: vec![],
                policy: spool_wire::run::TurnPolicy::Queue,
                from_queue: Some(Seq(2)),
                operation_id: None,
            }),
        ],
    ));
    let state = fold(&envelopes);
    assert_eq!(
        state.queued.len(),
        1,
        "the turn took its input off the queue"
    );
    assert_eq!(state.queued[0].1.input, "third");
}

#[test]
fn an_abandoned_dangling_write_lets_the_turn_go_on_to_fail() {
    let mut parked = suspended("t1", SuspendKind::Reconciliation, "Did it run?");
    parked.call_id = Some("c1".into());
    let envelopes = log(
        "r",
        0,
        vec![
            created(),
            started("t1", "x"),
            Event::ToolCallRequested(tool_call("c1", Effect::Write, None)),
            Event::Suspended(parked),
            Event::ToolCallAbandoned(ToolCallAbandoned {
                call_id: "c1".into(),
                reason: None,
                operator: None,
            }),
        ],
    );
    let state = fold(&envelopes);
    assert_eq!(
        state.status,
        Status::Running,
        "the driver takes the turn up again, to fail it"
    );
    assert_eq!(state.suspension, None);
    assert!(state.open_calls.is_empty());
}

#[test]
fn a_replayed_conversation_shares_the_logs_messages_and_outputs_instead_of_copying_them() {
    let envelopes = log(
        "r",
        0,
        vec![
            created(),
            started("t1", "deploy"),
            model_requested("h1"),
            model_completed(json!({"role": "assistant", "content": "checking"}), 10),
            Event::ToolCallRequested(tool_call("c1", Effect::Read, None)),
            tool_done("c1", json!({"rows": [1, 2, 3]})),
        ],
    );
    let state = fold(&envelopes);
    let (Event::ModelCallCompleted(answer), Event::ToolCallCompleted(done)) =
        (&envelopes[3].event, &envelopes[5].event)
    else {
        panic!("the log holds an answer at 3 and a completion at 5");
    };
    let [
        _,
        ItemContent::Assistant(message),
        ItemContent::ToolResult { output, .. },
    ] = state
        .conversation
        .iter()
        .map(|item| &item.content)
        .collect::<Vec<_>>()[..]
    else {
        panic!("the conversation is input, answer, tool result");
    };
    assert!(std::sync::Arc::ptr_eq(message, &answer.message));
    assert!(std::sync::Arc::ptr_eq(output, &done.output));
}

#[test]
fn a_run_counts_its_turns_keeps_its_last_failure_and_the_call_a_suspension_parked() {
    let parked = Suspended {
        call_id: Some("c1".into()),
        ..suspended("t1", SuspendKind::Approval, "Deploy?")
    };
    let envelopes = log(
        "r",
        0,
        vec![
            created(),
            started("t1", "deploy"),
            Event::ToolCallRequested(tool_call("c1", Effect::Read, None)),
            // A suspension is recorded inside the call's completion.
            tool_done("c1", json!({"__spool_suspend": {"reason": "Deploy?"}})),
            Event::Suspended(parked),
            Event::Resumed(Resumed {
                turn_id: turn("t1"),
                answers: vec![],
            }),
            Event::TurnFailed(TurnFailed {
                turn_id: turn("t1"),
                code: "provider_error".into(),
                message: "503".into(),
            }),
            started("t2", "again"),
        ],
    );
    let waiting = fold(&envelopes[..5]);
    let call = waiting.parked_call.expect("the parked call is kept");
    assert_eq!(
        (call.call_id.as_str(), call.input.clone()),
        ("c1", json!({"env": "staging"}))
    );
    assert!(waiting.open_calls.is_empty(), "and no longer open");
    assert_eq!(
        fold(&envelopes[..6]).parked_call,
        None,
        "an answer lets it go"
    );
    let failed = fold(&envelopes[..7]);
    assert_eq!(failed.turns, 1);
    assert_eq!(
        failed.failure.map(|f| (f.code.to_string(), f.message)),
        Some(("provider_error".to_owned(), "503".to_owned()))
    );
    let again = fold(&envelopes);
    assert_eq!(again.turns, 2);
    assert_eq!(again.failure, None, "a new turn clears the last failure");
}
